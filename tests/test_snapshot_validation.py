"""A peer's Snapshot is checked before it touches the store (issue 22, item 2).

A tester holding the cluster secret, posing as the leader, sent one Snapshot (index
and commit 2^61, 64 random bytes as its description): the stream answered OK and the
follower stopped in `EntryStore.restore`. The end-to-end tests replay that on a real
cluster and show that a genuine snapshot (a follower behind the leader's retained
log) still restores, consumer offsets included; the unit tests take
`log.snapshot_check` through each of its rules.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import MessageSpec, NodeStatus
from dledger_commitlog.log.entry_records import BASE_SIZE, pack_base
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.snapshot_check import check_snapshot
from dledger_commitlog.log.snapshot_extra import (
    MAX_EXTRA_BYTES,
    SnapshotExtra,
    decode_extra,
    encode_extra,
)
from proto import dledger_pb2 as pb
from raft import Entry, Snapshot
from raft.validate import InvalidPeerMessage, check_peer_message
from tests.conftest import CONVERGE_S, get_at, node_stubs, wait_converged
from tests.test_security import member_token, metric, raft_call

FORGED_INDEX = 1 << 61


@pytest.mark.slow
def test_the_forged_snapshot_of_the_issue_is_refused_and_the_node_serves_on(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("forged-snapshot")
    leader = cluster.wait_for_leader(timeout_s=10.0)
    with cluster.client() as client:
        client.put("orders", b"before")
    rejected = 'dledger_peer_rejected_total{reason="invalid"}'
    for spec in cluster:
        if spec.id == leader:
            continue
        st = cluster.statuses()[spec.id]
        assert isinstance(st, NodeStatus), st
        before = metric(cluster, spec.id, rejected)
        data = random.Random(22).randbytes(64)
        forged = Snapshot(leader, spec.id, st.term, FORGED_INDEX, st.term, FORGED_INDEX, data)
        meta = member_token(cluster, leader, spec.id)
        assert raft_call(spec.raft, [forged], metadata=meta) == grpc.StatusCode.INVALID_ARGUMENT
        assert metric(cluster, spec.id, rejected) == before + 1
        assert "refused a raft stream" in cluster.log_tail(spec.id, 200)
    with cluster.client() as client:
        after = client.put("orders", b"after")
    statuses = wait_converged(cluster, CONVERGE_S)
    assert all(s.last_index < FORGED_INDEX for s in statuses.values()), statuses
    with node_stubs(cluster) as stubs:
        for i, stub in stubs.items():
            assert cluster.is_running(i)
            assert get_at(stub, after.commitlog_offset).body == b"after"


@pytest.mark.slow
def test_a_follower_behind_the_retained_log_is_restored_with_queues_and_offsets(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A genuine snapshot passes the check: the lagging follower restores from it, with
    the group offsets and the next queue offsets the leader's extra carried."""
    # One append in flight per follower: the appends queued for the stopped follower
    # cannot cover the gap, which only a snapshot then closes.
    cluster = make_cluster(
        "lagging", data_segment_bytes=128 * 1024, max_message_bytes=16 * 1024, max_inflight_msgs=1
    )
    leader = cluster.wait_for_leader(timeout_s=10.0)
    lagging = next(s.id for s in cluster if s.id != leader)
    body = b"x" * 4000
    with cluster.client() as client:
        client.put("orders", body, queue_id=0)
        wait_converged(cluster, CONVERGE_S)
        cluster.stop(lagging)
        # What only the snapshot's extra tells: every entry of queue 0 and the offset
        # commit lie in segments that retention deletes (4 x 160 KB), the retained
        # tail holds entries of queue 1 alone (160 KB, more than a segment).
        client.commit_offset("billing", "orders", 0, 11)
        for _ in range(4):
            last0 = client.put_batch([MessageSpec("orders", body, queue_id=0)] * 40)[-1]
        client.put_batch([MessageSpec("orders", body, queue_id=1)] * 40)
        last = client.put("orders", b"last", queue_id=1)
        for spec in cluster:
            if spec.id != lagging:
                assert client.clean_now(spec.client, force=True).deleted_segments > 0
        assert client.status(cluster.specs[leader].client).first_index > 2
        cluster.start(lagging)
        statuses = wait_converged(cluster, CONVERGE_S)
        assert statuses[lagging].first_index > 2, "restored from the leader's snapshot"
        assert "restarted after entry" in cluster.log_tail(lagging, 200)
        with node_stubs(cluster) as stubs:
            got = stubs[lagging].FetchOffset(
                pb.FetchOffsetRequest(group="billing", topic="orders", queue_id=0), timeout=5.0
            )
            assert {o.queue_id: o.offset for o in got.offsets} == {0: 11}
            assert get_at(stubs[lagging], last.commitlog_offset).body == b"last"
        # Leading, it numbers queue 0 on from the leader's count, not from 0.
        assert client.transfer_leadership(lagging) == lagging
        assert client.put("orders", b"next", queue_id=0).queue_offset == last0.queue_offset + 1
    assert cluster.is_running(lagging)


# -- the check, rule by rule ---------------------------------------------------------

SEG = 4096


def retained_log(path: Path) -> EntryStore:
    """A leader's store whose retention dropped its first segments, with an extra."""
    store = EntryStore(path, data_segment_bytes=SEG, index_segment_bytes=32 * 64)
    store.append([Entry(i, 1, b"e%d" % i * 100) for i in range(1, 41)])
    store.snapshot_extra = lambda: encode_extra(QUEUE_NEXT, OFFSETS)
    assert store.delete_prefix(30) > 1
    return store


QUEUE_NEXT = {("orders", 0): 7, ("%SYS%SCHEDULE", 3): 2}
OFFSETS = {("billing", "orders", 0): 5}


def snapshot_of(store: EntryStore, *, term: int = 2, commit_ahead: int = 3) -> Snapshot:
    index = store.first_index() - 1
    data = store.snapshot_data()
    return Snapshot(1, 2, term, index, store.term(index), index + commit_ahead, data)


def test_a_genuine_snapshot_passes_and_restores_a_fresh_store(tmp_path: Path) -> None:
    leader = retained_log(tmp_path / "leader")
    snap = snapshot_of(leader)
    check_peer_message(snap, me=2, peers={1, 2, 3}, term=2, max_entry_bytes=1 << 20)
    check_snapshot(snap)
    assert decode_extra(snap.data[BASE_SIZE:]) == SnapshotExtra(QUEUE_NEXT, OFFSETS)
    follower = EntryStore(
        tmp_path / "follower", data_segment_bytes=SEG, index_segment_bytes=32 * 64
    )
    follower.restore(snap.index, snap.log_term, snap.data)
    assert (follower.first_index(), follower.last_index()) == (snap.index + 1, snap.index)
    following = leader.stored_entries(snap.index + 1, leader.last_index() + 1, 1 << 20)
    follower.append([Entry(e.index, e.term, e.body) for e in following])
    assert follower.stored_entries(snap.index + 1, leader.last_index() + 1, 1 << 20) == following
    assert follower.last_chain_crc == leader.last_chain_crc
    leader.close()
    follower.close()


def test_the_snapshot_of_the_issue_passes_the_bounds_but_not_the_check() -> None:
    data = random.Random(22).randbytes(64)
    forged = Snapshot(1, 2, 1, FORGED_INDEX, 1, FORGED_INDEX, data)
    check_peer_message(forged, me=2, peers={1, 2, 3}, term=1, max_entry_bytes=1 << 20)
    with pytest.raises(InvalidPeerMessage, match="snapshot from node 1: snapshot of entry"):
        check_snapshot(forged)


def _with_base(snap: Snapshot, index: int, term: int, pos: int) -> Snapshot:
    return replace(snap, data=pack_base((index, term, pos, 0)) + snap.data[BASE_SIZE:])


def _with_extra(snap: Snapshot, extra: object) -> Snapshot:
    raw = extra if isinstance(extra, bytes) else json.dumps(extra).encode()
    return replace(snap, data=snap.data[:BASE_SIZE] + raw)


def _items(queue_next: Sequence[object] = (), offsets: Sequence[object] = ()) -> dict[str, object]:
    return {"queue_next": list(queue_next), "offsets": list(offsets)}


BAD: dict[str, tuple[Callable[[Snapshot], Snapshot], str]] = {
    "short data": (lambda s: replace(s, data=s.data[:20]), "20 bytes, expected >= 28"),
    "no data": (lambda s: replace(s, data=b""), "0 bytes, expected >= 28"),
    "another index": (lambda s: replace(s, index=s.index + 1), r"describes \d+/1"),
    "another term": (lambda s: replace(s, log_term=2), r"\(term 2\) describes \d+/1"),
    "a position below the entries before": (
        lambda s: _with_base(s, s.index, s.log_term, s.index * 48 - 1),
        "ends at position",
    ),
    "a negative position": (
        lambda s: _with_base(s, s.index, s.log_term, -1),
        "ends at position -1",
    ),
    "a position past the bound": (
        lambda s: _with_base(s, s.index, s.log_term, 1 << 62),
        "ends at position",
    ),
    "commit below the index": (lambda s: replace(s, commit=s.index - 1), "commit .* below"),
    "no JSON": (lambda s: _with_extra(s, b"{not json"), "extra is no JSON"),
    "no extra": (lambda s: _with_extra(s, b""), "extra is no JSON"),
    "nested too deep": (lambda s: _with_extra(s, b"[" * 100_000), "extra is no JSON"),
    "a list": (lambda s: _with_extra(s, []), "exactly"),
    "a key missing": (lambda s: _with_extra(s, {"queue_next": []}), "exactly"),
    "a key too many": (lambda s: _with_extra(s, {**_items(), "x": 1}), "exactly"),
    "items no list": (lambda s: _with_extra(s, {"queue_next": {}, "offsets": []}), "no list"),
    "an item too short": (lambda s: _with_extra(s, _items([["orders", 0]])), "not a list of 3"),
    "an item no list": (lambda s: _with_extra(s, _items(offsets=["billing"])), "not a list of 4"),
    "a topic no string": (lambda s: _with_extra(s, _items([[1, 0, 5]])), "topic must be"),
    "an empty topic": (lambda s: _with_extra(s, _items([["", 0, 5]])), "topic must be"),
    "a topic of spaces": (lambda s: _with_extra(s, _items([["a b", 0, 5]])), "may only contain"),
    "a topic too long": (lambda s: _with_extra(s, _items([["t" * 128, 0, 5]])), "at most 127"),
    "a queue id as text": (lambda s: _with_extra(s, _items([["orders", "0", 5]])), "queue id"),
    "a negative queue id": (lambda s: _with_extra(s, _items([["orders", -1, 5]])), "queue id"),
    "a queue id past i32": (lambda s: _with_extra(s, _items([["orders", 1 << 31, 5]])), "queue id"),
    "a negative count": (lambda s: _with_extra(s, _items([["orders", 0, -1]])), "offset not in"),
    "a float count": (lambda s: _with_extra(s, _items([["orders", 0, 1.5]])), "offset not in"),
    "a bool count": (lambda s: _with_extra(s, _items([["orders", 0, True]])), "offset not in"),
    "a count past i64": (lambda s: _with_extra(s, _items([["orders", 0, 1 << 63]])), "offset"),
    "a queue twice": (
        lambda s: _with_extra(s, _items([["orders", 0, 5], ["orders", 0, 6]])),
        "twice",
    ),
    "a group no string": (
        lambda s: _with_extra(s, _items(offsets=[[None, "orders", 0, 1]])),
        "group must be",
    ),
    "a negative group offset": (
        lambda s: _with_extra(s, _items(offsets=[["g", "orders", 0, -5]])),
        "offset not in",
    ),
    "a group offset twice": (
        lambda s: _with_extra(s, _items(offsets=[["g", "t", 0, 1], ["g", "t", 0, 2]])),
        "twice",
    ),
    "an extra too large": (lambda s: _with_extra(s, b" " * (MAX_EXTRA_BYTES + 1)), "over"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_each_rule_refuses_a_snapshot_naming_it(tmp_path: Path, case: str) -> None:
    leader = retained_log(tmp_path)
    genuine = snapshot_of(leader)
    leader.close()
    check_snapshot(genuine)
    spoil, reason = BAD[case]
    bad = spoil(genuine)
    with pytest.raises(InvalidPeerMessage, match=reason) as err:
        check_snapshot(bad)
    assert err.value.reason.startswith("snapshot from node 1: ")
    assert not err.value.membership


def test_restore_keeps_the_rules_of_the_base_and_touches_nothing_when_they_fail(
    tmp_path: Path,
) -> None:
    """Past the check, a restore that still fails is a fault (the ready loop stops):
    restore runs the same rules before it changes anything."""
    leader = retained_log(tmp_path / "leader")
    snap = snapshot_of(leader)
    leader.close()
    store = EntryStore(tmp_path / "f", data_segment_bytes=SEG, index_segment_bytes=32 * 64)
    store.append([Entry(i, 1, b"mine") for i in range(1, 4)])
    for index, data in [
        (snap.index + 1, snap.data),
        (snap.index, snap.data[:27]),
        (snap.index, pack_base((snap.index, 1, 5, 0))),
    ]:
        with pytest.raises(ValueError, match="snapshot"):
            store.restore(index, snap.log_term, data)
    assert (store.first_index(), store.last_index(), store.get(3).body) == (1, 3, b"mine")
    store.restore(snap.index, snap.log_term, snap.data)
    assert store.first_index() == snap.index + 1
    store.close()
