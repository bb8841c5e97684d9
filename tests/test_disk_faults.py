"""Disk faults: a byte flipped in a log tail, and a power loss in async flush mode.

Unit tests on an EntryStore first (chaos.disk on a store directory), then real
three-node clusters (slow): a flipped byte in a follower's and in a leader's
tail is cut at recovery, never served, and repaired from the peers; a power
loss of all three nodes in async mode loses at most the puts acknowledged in
the last flush interval (plus a stated slack); kill -9 of all three in sync
mode loses nothing. Random choices are seeded: the seed is printed (set
DLEDGER_TEST_SEED to replay it); kill timing is not under the seed's control.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from chaos.disk import FlipReport, flip_byte, power_loss, read_trace
from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.launcher import LocalCluster, converged, node_toml
from dledger_commitlog.client import NodeStatus
from dledger_commitlog.log import reads
from dledger_commitlog.log.entry_records import read_record
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.verify import read_layout, verify_store, write_layout
from dledger_commitlog.node.config import ConfigError, NodeConfig, Peer
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.node.recovery import (
    FLUSH_TRACE_ENV,
    ROLLBACK_FILE,
    FlushTrace,
    read_rollback_marker,
)
from raft import LogDiverged, Role
from raft.messages import Heartbeat
from raft.types import Entry, EntryKind
from raftio.hard_state import RaftStateFile
from store.entry_format import ENTRY_MAGIC, HEADER, HEADER_SIZE
from store.errors import CorruptEntry, DirectoryInUse
from store.message import QUEUE_OFFSET_POS, Message, decode_message
from tests.conftest import CONVERGE_S, get_at, node_stubs, wait_converged, wait_until
from tests.workload import Acked, Writers, check_acked, leader_and_follower, read_all

SEG = 4096
ISEG = 32 * 64
# A node's segments must hold its largest message (NodeConfig checks): 34 KiB
# holds a 1 KiB body with the most properties a message may carry.
NODE_SEG = 34 * 1024
NODE_MAX_MESSAGE = 1024
FLUSH_INTERVAL_MS = 200
# How late after the flush interval an acknowledged put may still be unflushed: the
# fsync itself (slow on a busy shared disk) and the trace write after it.
POWER_LOSS_SLACK_S = 1.0


def _seed() -> int:
    seed = int(os.environ.get("DLEDGER_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (DLEDGER_TEST_SEED={seed} replays it)")
    return seed


# ---------------------------------------------------------------- store level


def _store(root: Path) -> EntryStore:
    write_layout(root, {"data_segment_bytes": SEG, "index_segment_bytes": ISEG})
    return EntryStore(root / "commitlog", data_segment_bytes=SEG, index_segment_bytes=ISEG)


def _fill(store: EntryStore, n: int) -> None:
    first = store.last_index() + 1
    store.append([Entry(i, 1, b"body-%d-" % i * 20) for i in range(first, first + n)])


@pytest.mark.parametrize("seed", range(8))
def test_a_flip_above_the_checkpoint_cuts_the_log_and_reports_what_is_missing(
    tmp_path: Path, seed: int
) -> None:
    s = _store(tmp_path)
    _fill(s, 60)
    s.write_checkpoint(30)
    s.flush()
    s.close()
    flip = flip_byte(tmp_path, random.Random(seed))
    assert 40 < flip.index <= 60 and flip.checkpoint_index == 30
    assert flip.entry_pos + HEADER_SIZE <= flip.pos
    r = EntryStore(tmp_path / "commitlog", data_segment_bytes=SEG, index_segment_bytes=ISEG,
                   committed_index=55)  # fmt: skip
    try:
        assert r.last_index() == flip.index - 1
        assert r.tail_cut is not None and r.tail_cut.pos == flip.entry_pos
        assert r.tail_cut.index == flip.index and r.tail_cut.file == flip.file
        # Intact entries followed the bad one: they had reached the disk, so they count.
        assert r.tail_cut.seen_through == (60 if flip.index < 60 else 0)
        assert r.missing_through == (60 if flip.index < 60 else 55 if flip.index <= 55 else 0)
        assert r.end_pos == flip.entry_pos
        if flip.entry_pos % SEG:  # else the whole segment is gone
            raw = Path(flip.file).read_bytes()
            assert raw[flip.entry_pos % SEG :] == bytes(SEG - flip.entry_pos % SEG), "not zeroed"
        else:
            assert not Path(flip.file).exists()
        _fill(r, 3)  # and the log takes entries again
        assert r.get(flip.index + 2).index == flip.index + 2
    finally:
        r.close()


def test_a_flip_at_or_below_the_checkpoint_is_refused_or_caught_on_read(tmp_path: Path) -> None:
    """The checkpointed entry anchors recovery: damaged, the node refuses to start.
    Older entries are not rescanned at start; a damaged one fails its read instead."""
    s = _store(tmp_path)
    _fill(s, 30)
    s.write_checkpoint(30)
    s.close()
    with pytest.raises(ValueError, match="above the checkpointed entry 30"):
        flip_byte(tmp_path, random.Random(1))
    older = flip_byte(tmp_path, random.Random(2), last_entries=10, above_checkpoint=False)
    assert 20 < older.index <= 30
    if older.index < 30:
        r = EntryStore(tmp_path / "commitlog", data_segment_bytes=SEG, index_segment_bytes=ISEG)
        try:
            assert r.last_index() == 30
            with pytest.raises(CorruptEntry, match="body CRC"):
                r.get(older.index)
        finally:
            r.close()
    flip_byte(tmp_path, random.Random(3), last_entries=1, above_checkpoint=False)
    with pytest.raises(CorruptEntry, match=r"entries\.checkpoint") as info:
        EntryStore(tmp_path / "commitlog", data_segment_bytes=SEG, index_segment_bytes=ISEG)
    assert info.value.file is not None and "commitlog/data/" in info.value.file


def test_power_loss_drops_what_was_not_flushed(tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.on_data_flushed = trace = FlushTrace(tmp_path / "flush.trace", s)
    _fill(s, 20)
    s.write_checkpoint(10)
    _fill(s, 10)
    flushed = s.flush()
    _fill(s, 15)  # never flushed
    end = s.end_pos
    s.close()
    trace.close()
    assert read_trace(tmp_path)[-1] == flushed < end
    report = power_loss(tmp_path)
    assert report.trace_pos == flushed and report.zeroed_bytes > 0
    r = EntryStore(tmp_path / "commitlog", data_segment_bytes=SEG, index_segment_bytes=ISEG,
                   committed_index=40)  # fmt: skip
    try:
        assert r.last_index() == 30 and r.end_pos == flushed
        assert r.tail_cut is None and r.missing_through == 40
        assert [e.index for e in r.stored_entries(1, 31, 1 << 20)] == list(range(1, 31))
    finally:
        r.close()


# ---------------------------------------------------------------- clusters


class _TimedAcks(list[Acked]):
    """Writers.acked that also records when each put was acknowledged (wall clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Acked) -> None:
        self.times.append(time.time())  # under the Writers' lock, like the append
        super().append(item)


def _timed_writers(cluster: LocalCluster, topic: str, threads: int) -> tuple[Writers, _TimedAcks]:
    writers = Writers(cluster, topic, threads=threads)
    acks = _TimedAcks()
    writers.acked = acks
    return writers.start(), acks


def _more_acks(writers: Writers, n: int, timeout_s: float = 20.0) -> None:
    target = writers.count() + n
    wait_until(writers.count, timeout_s, f"{n} more acknowledged puts",
               ok=lambda c: c >= target)  # fmt: skip


def _kill_all_at_once(cluster: LocalCluster) -> float:
    """SIGKILL every node's process group in one go; returns the wall time of the kill."""
    pids = {s.id: cluster.pid(s.id) for s in cluster}
    killed_at = time.time()
    for pid in pids.values():
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
    for i in pids:
        cluster.kill(i)  # waits until it is gone
    return killed_at


def _flip_repaired(
    cluster: LocalCluster, victim: int, seed: int, acked: list[Acked], flip: FlipReport
) -> None:
    """The victim holds the same committed messages as every other node, byte for
    byte; the entry that was hit is there with the leader's bytes; verify passes."""
    where = f"seed {seed}, node {victim}, {flip}"
    wait_converged(cluster, CONVERGE_S)
    log = Path(cluster.specs[victim].log_path).read_text(errors="replace")
    assert "cutting the log there" in log, f"{where}: recovery did not report the cut"
    with node_stubs(cluster) as stubs:
        views: dict[int, dict[int, Message]] = {s.id: read_all(stubs[s.id]) for s in cluster}
    mine = views[victim]
    for i, theirs in views.items():
        assert mine == theirs, f"{where}: node {i} serves other committed messages"
    hit = flip.entry_pos + HEADER_SIZE
    assert hit in mine, f"{where}: the entry that was hit is gone"
    check_acked(acked, mine, where)
    cluster.stop(victim)
    report = verify_store(Path(cluster.specs[victim].data_dir))
    assert report.ok, f"{where}: {report.problems}"


def _served_before_repair(cluster: LocalCluster, victim: int, flip: FlipReport) -> object:
    """What the restarted victim serves at the hit offset right away (None: nothing yet)."""
    with node_stubs(cluster) as stubs:
        try:
            return get_at(stubs[victim], flip.entry_pos + HEADER_SIZE)
        except Exception:  # not replicated back yet, or the node is still starting
            return None


def _check_flip(cluster: LocalCluster, victim: int, seed: int, topic: str) -> None:
    rng = random.Random(seed)
    writers, _ = _timed_writers(cluster, topic, threads=4)
    try:
        _more_acks(writers, 150)
        cluster.kill(victim)
        flip = flip_byte(cluster.specs[victim].data_dir, rng)
        print(f"flipped {flip}")
        cluster.start(victim)
        early = _served_before_repair(cluster, victim, flip)
        _more_acks(writers, 100)
    finally:
        acked = writers.join(stop=True)
    with cluster.client() as client:  # the cluster accepts puts
        client.put(topic, b"after the flip")
    if early is not None:  # served right after the restart: then the leader's bytes
        with node_stubs(cluster) as stubs:
            leader = cluster.wait_for_leader(timeout_s=10.0)
            want = get_at(stubs[leader], flip.entry_pos + HEADER_SIZE)
        assert early == want, f"seed {seed}: node {victim} served damaged bytes"
    _flip_repaired(cluster, victim, seed, acked, flip)


@pytest.mark.slow
def test_a_flipped_byte_in_a_follower_tail_is_repaired_from_the_leader(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    seed = _seed()
    cluster = make_cluster("flipf")
    _, follower = leader_and_follower(cluster)
    _check_flip(cluster, follower, seed, "ff")


@pytest.mark.slow
def test_a_flipped_byte_in_the_leader_tail_is_repaired_after_failover(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    seed = _seed()
    cluster = make_cluster("flipl")
    leader, _ = leader_and_follower(cluster)
    _check_flip(cluster, leader, seed, "fl")


def _messages_everywhere(cluster: LocalCluster) -> dict[int, dict[int, Message]]:
    with node_stubs(cluster) as stubs:
        return {s.id: read_all(stubs[s.id]) for s in cluster}


def _crash_all_under_load(
    cluster: LocalCluster, topic: str, between: Callable[[], Any] | None = None
) -> tuple[list[Acked], list[float], float]:
    writers, acks = _timed_writers(cluster, topic, threads=4)
    started = time.time()
    try:
        _more_acks(writers, 300)
        wait_until(time.time, 10, "2.5 s of load", ok=lambda t: t - started >= 2.5)
        writers._stop.set()  # no new puts; those in flight fail or land after the restart
        killed_at = _kill_all_at_once(cluster)
        if between is not None:
            between()
        for spec in cluster:
            cluster.start(spec.id)
        cluster.wait_for_leader(timeout_s=20.0)
    finally:
        acked = writers.join(stop=True)
    return acked, list(acks.times), killed_at


def _restart_rolled_back_until_converged(cluster: LocalCluster, timeout_s: float) -> list[int]:
    """The chaos harness as an operator's supervisor: a node that stopped because
    the cluster lost entries it held as committed (LogDiverged, async flush) left a
    rollback marker; start it again (it rolls back and rejoins). Returns the nodes
    restarted so, once all nodes hold the same committed log."""
    restarted: list[int] = []
    deadline = time.monotonic() + timeout_s
    statuses: object = None
    while time.monotonic() < deadline:
        for spec in cluster:
            if cluster.is_running(spec.id):
                continue
            marker = Path(spec.data_dir) / ROLLBACK_FILE
            assert marker.exists(), (
                f"node {spec.id} stopped without a rollback marker:\n{cluster.log_tail(spec.id)}"
            )
            log = Path(spec.log_path).read_text(errors="replace")
            assert "LOST COMMITTED ENTRIES" in log, f"node {spec.id}: no loud error logged"
            print(f"node {spec.id} stopped on lost committed entries: {marker.read_text()}")
            cluster.start(spec.id)
            restarted.append(spec.id)
        statuses = cluster.statuses(timeout_s=1.0)
        if converged(statuses) and all(cluster.is_running(s.id) for s in cluster):
            for spec in cluster:
                assert not (Path(spec.data_dir) / ROLLBACK_FILE).exists(), spec.id
            return restarted
        time.sleep(0.2)
    raise AssertionError(f"no convergence within {timeout_s}s: {statuses}")


@pytest.mark.slow
def test_async_power_loss_loses_at_most_the_last_flush_interval(
    make_cluster: Callable[..., LocalCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FLUSH_TRACE_ENV, "1")
    cluster = make_cluster("power", flush_mode="async", flush_interval_ms=FLUSH_INTERVAL_MS)
    reports = {}

    def lose_power() -> None:
        for spec in cluster:
            reports[spec.id] = power_loss(spec.data_dir)

    acked, times, killed_at = _crash_all_under_load(cluster, "pw", lose_power)
    print(f"power loss: {reports}")
    assert all(r.trace_pos > 0 for r in reports.values()), "nothing was ever traced"
    with cluster.client() as client:
        client.put("pw", b"after the power loss")
    rolled_back = _restart_rolled_back_until_converged(cluster, 2 * CONVERGE_S)
    print(f"restarted after a rollback marker: {rolled_back or 'none'}")
    cutoff = killed_at - FLUSH_INTERVAL_MS / 1000 - POWER_LOSS_SLACK_S
    safe = [a for a, t in zip(acked, times, strict=True) if t < cutoff]
    window = [a for a, t in zip(acked, times, strict=True) if t >= cutoff]
    assert len(safe) > 100, f"only {len(safe)} puts were acknowledged before {cutoff}"
    views = _messages_everywhere(cluster)
    for i, messages in views.items():
        check_acked(safe, messages, f"node {i} (acknowledged before the loss window)")
    first = next(iter(views.values()))
    for i, messages in views.items():
        assert messages == first, f"node {i} serves other committed messages than the others"
    lost = [a for a in window if getattr(first.get(a.result.commitlog_offset), "body", None)
            != a.body]  # fmt: skip
    print(f"{len(safe)} puts acknowledged before the window kept; {len(lost)} of "
          f"{len(window)} acknowledged within the last "
          f"{FLUSH_INTERVAL_MS / 1000 + POWER_LOSS_SLACK_S:.1f} s lost (allowed)")  # fmt: skip


@pytest.mark.slow
def test_sync_mode_loses_nothing_when_every_node_is_killed_at_once(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("killall")
    acked, _, _ = _crash_all_under_load(cluster, "ka")
    with cluster.client() as client:
        client.put("ka", b"after the crash")
    wait_converged(cluster, CONVERGE_S)
    for i, messages in _messages_everywhere(cluster).items():
        check_acked(acked, messages, f"node {i}")


# ---------------------------------------------------------------- rollback marker


def _single_config(
    root: Path, flush_mode: str = "async", settings: dict[str, Any] | None = None
) -> NodeConfig:
    return NodeConfig(**{
        "node_id": 1, "data_dir": str(root), "peers": (Peer(1, "127.0.0.1:1", "127.0.0.1:2"),),
        "flush_mode": flush_mode, "tick_ms": 5, "data_segment_bytes": NODE_SEG,
        "index_segment_bytes": ISEG, "max_message_bytes": NODE_MAX_MESSAGE,
        "cq_units_per_file": 64, "index_slots": 64, "index_entries": 256, **(settings or {}),
    })  # fmt: skip


def _single_node(
    root: Path, flush_mode: str = "async", settings: dict[str, Any] | None = None
) -> RaftNode:
    return RaftNode(_single_config(root, flush_mode, settings))


async def _lead(node: RaftNode) -> None:
    """Wait (10 s at most) until a lone voter has elected itself, a few ticks."""
    async with asyncio.timeout(10):
        for _ in range(1000):
            if node.core.role is Role.LEADER:
                return
            await asyncio.sleep(0.01)


async def _put_some(node: RaftNode, n: int, tag: str) -> None:
    await node.start()
    try:
        await _lead(node)
        async with asyncio.timeout(10):
            for i in range(n):
                body = b"%s-%d-" % (tag.encode(), i) * 100  # about 1 KiB an entry
                spec = node.commitlog.prepare("rb", body, uniq_key=f"{tag}{i}")
                await node.commitlog.put([spec], 5.0)
            await node.wait_dispatched(node.commitlog.committed_pos, 5.0)
    finally:
        await node.close()


def test_a_rollback_marker_cuts_the_log_below_its_checkpoint_and_dispatch_with_it(
    tmp_path: Path,
) -> None:
    """What a node does at start after it stopped on LogDiverged (async flush):
    the log, raft.state's commit, the entry checkpoint and the consume queues all
    go back to the marker's index; the marker goes; verify passes; puts go on."""
    asyncio.run(_put_some(_single_node(tmp_path), 60, "old"))  # two segments
    store = EntryStore(
        tmp_path / "commitlog", data_segment_bytes=NODE_SEG, index_segment_bytes=ISEG
    )
    last = store.last_index()
    keep = last - 25
    end_of_keep = sum(store.locate(keep))
    assert end_of_keep // NODE_SEG < store.locate(last)[0] // NODE_SEG, "crosses a segment"
    kept = sum(1 for e in store.entries(1, keep + 1, 1 << 30) if e.kind is EntryKind.NORMAL)
    store.close()
    assert RaftStateFile(tmp_path / "raft.state").saved.commit == last
    assert read_record(tmp_path / "commitlog" / "entries.checkpoint")[0] == last  # type: ignore[index]
    (tmp_path / ROLLBACK_FILE).write_text(json.dumps({"roll_back_to": keep}))
    node = _single_node(tmp_path)
    try:
        assert node.store.last_index() == keep
        assert node.commitlog.committed_index == keep
        assert node.dispatcher.dispatched_pos == end_of_keep
        assert sum(node.dispatcher.max_offsets().values()) == kept < 60
        assert RaftStateFile(tmp_path / "raft.state").saved.commit == keep
        assert read_record(tmp_path / "commitlog" / "entries.checkpoint")[0] == keep  # type: ignore[index]
        assert not (tmp_path / ROLLBACK_FILE).exists()
    finally:
        asyncio.run(node.close())
    report = verify_store(tmp_path)
    assert report.ok, report.problems
    asyncio.run(_put_some(_single_node(tmp_path), 5, "new"))  # it goes on from there
    report = verify_store(tmp_path)
    assert report.ok, report.problems


def test_the_node_writes_a_marker_and_stops_on_a_diverged_leader_in_async_mode(
    tmp_path: Path,
) -> None:
    node = _single_node(tmp_path)
    stopped: list[bool] = []
    node.on_fatal = lambda: stopped.append(True)
    exc = LogDiverged(index=7, agree=6, committed=9, leader=2, term=5)
    node._on_diverged(exc)
    assert stopped and node.fatal is exc
    assert json.loads((tmp_path / ROLLBACK_FILE).read_text())["roll_back_to"] == 6
    node.diverged = None
    node._on_diverged(LogDiverged(index=9, agree=8, committed=9, leader=2, term=6))
    assert read_rollback_marker(tmp_path / ROLLBACK_FILE) == 6, "never moves up"
    asyncio.run(node.close())


def test_a_diverged_leader_in_sync_mode_is_fatal_without_a_marker(tmp_path: Path) -> None:
    node = _single_node(tmp_path, flush_mode="sync")
    stopped: list[bool] = []
    node.on_fatal = lambda: stopped.append(True)
    node._on_diverged(LogDiverged(index=7, agree=6, committed=9, leader=2, term=5))
    assert stopped and isinstance(node.fatal, LogDiverged)
    assert not (tmp_path / ROLLBACK_FILE).exists()
    asyncio.run(node.close())


# ---------------------------------------------------------------- a flip below the checkpoint


def _flip_in_message(data_dir: str | Path, offset: int, at: int | bytes) -> tuple[str, int, int]:
    """Flip one byte of the committed message at commit-log `offset` of a stopped node:
    byte `at` of the message, or the last byte of the first occurrence of `at` in it.
    The entry must lie below the entry checkpoint (recovery does not rescan it).
    Returns (segment file, entry position, entry index)."""
    root = Path(data_dir)
    seg = read_layout(root)["data_segment_bytes"]
    entry_pos = offset - HEADER_SIZE
    path = root / "commitlog" / "data" / f"{entry_pos - entry_pos % seg:020d}"
    checkpoint = read_record(root / "commitlog" / "entries.checkpoint")
    fd = os.open(path, os.O_RDWR)
    try:
        head = os.pread(fd, HEADER_SIZE, entry_pos % seg)
        magic, size, index = HEADER.unpack(head)[:3]
        assert magic == ENTRY_MAGIC, f"no entry at {entry_pos}"
        assert checkpoint is not None and index < checkpoint[0], "not below the checkpoint"
        message = os.pread(fd, size - HEADER_SIZE, offset % seg)
        k = at if isinstance(at, int) else message.index(at) + len(at) - 1
        os.pwrite(fd, bytes([message[k] ^ 0x20]), offset % seg + k)
        os.fsync(fd)
    finally:
        os.close(fd)
    return str(path), entry_pos, index


def _offset_of(root: Path, uniq_key: str) -> int:
    """The commit-log offset of the message put with `uniq_key` (node stopped)."""
    store = EntryStore(root / "commitlog", data_segment_bytes=NODE_SEG, index_segment_bytes=ISEG)
    try:
        entries = store.stored_entries(store.first_index(), store.last_index() + 1, 1 << 30)
    finally:
        store.close()
    name = b"UNIQ_KEY\x01" + uniq_key.encode()
    (entry,) = [e for e in entries if name + b"\x02" in e.body or e.body.endswith(name)]
    return entry.pos + HEADER_SIZE


def _put_twenty_and_damage_k7(root: Path, at: int | bytes) -> tuple[str, int, int, int]:
    """A one-node store with messages k0..k19 (bodies `k-I-` * 100), closed cleanly (so
    checkpointed at its last entry), then one byte of k7 flipped. Returns (segment file,
    entry position, entry index, commit-log offset) of k7."""
    asyncio.run(_put_some(_single_node(root), 20, "k"))
    offset = _offset_of(root, "k7")
    file, entry_pos, index = _flip_in_message(root, offset, at)
    return file, entry_pos, index, offset


def _pull_one(node: RaftNode, topic: str, queue_id: int, offset: int) -> reads.Found:
    """A Pull of one message at a queue offset, as the node serves it."""
    return reads.pull_scan(node.queue_view(topic, queue_id), node.log_view(), offset, 1, None,
                           max_bytes=4 << 20)  # fmt: skip


_DAMAGE: dict[str, int | bytes] = {
    "uniq_key": b"UNIQ_KEY\x01k7",  # what the idempotency window reads at start
    "body": b"k-7-k-7-",
    "queue_offset": QUEUE_OFFSET_POS + 7,  # a raw read would serve another queue offset
}


@pytest.mark.parametrize("where", sorted(_DAMAGE))
def test_a_flip_below_the_checkpoint_is_one_warning_and_the_node_serves_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """The start-up read of the idempotency window meets the damaged entry: one
    warning naming file and offset (no exception), the damaged message is never
    served (Get, Pull, ReadRange, a raw message read), every other one is, nothing
    is cut, puts and retries go on, and verify reports the damage."""
    file, entry_pos, index, offset = _put_twenty_and_damage_k7(tmp_path, _DAMAGE[where])
    caplog.set_level(logging.WARNING)
    node = _single_node(tmp_path)
    try:
        lines = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
        assert len(lines) == 1, lines
        (line,) = lines
        assert "\n" not in line
        assert f"entry {index}: corrupt entry at {file} offset {entry_pos}: body CRC" in line
        assert "restore this node's data from a replica" in line
        assert node.store.last_index() == node.commitlog.committed_index == 21  # NOOP + 20
        cl = node.commitlog
        with pytest.raises(CorruptEntry, match=f"offset {entry_pos}: body CRC"):
            cl.get_by_offset(offset)
        with pytest.raises(CorruptEntry, match=f"offset {entry_pos}: body CRC"):
            cl.read_message(offset, 4)
        with pytest.raises(CorruptEntry, match=f"offset {entry_pos}: body CRC"):
            cl.read_range(offset, 1, 1 << 20)
        served: dict[bytes, int] = {}
        for (topic, qid), cq in node.dispatcher.queues.items():
            for qoff, unit in enumerate(cq.get_range(cq.min_offset, cq.max_offset)):
                at = cq.min_offset + qoff
                if unit.commitlog_offset == offset:  # a Pull that reaches it fails
                    with pytest.raises(CorruptEntry, match=f"offset {entry_pos}: body CRC"):
                        _pull_one(node, topic, qid, at)
                    continue
                found = _pull_one(node, topic, qid, at)
                (data,) = found.messages  # exactly the unit's message
                assert found.sizes == [unit.size] and found.next_offset == at + 1
                msg = decode_message(data)
                assert msg.queue_offset == at
                assert msg.physical_offset == unit.commitlog_offset
                served[msg.body] = unit.commitlog_offset
                assert cl.get_by_offset(unit.commitlog_offset)[0].body == msg.body
        assert set(served) == {b"k-%d-" % i * 100 for i in range(20) if i != 7}
    finally:
        asyncio.run(node.close())
    report = verify_store(tmp_path)
    assert not report.ok and any(f"offset {entry_pos}: body CRC" in p for p in report.problems)

    async def puts_go_on(node: RaftNode) -> None:
        await node.start()
        try:
            await _lead(node)
            cl = node.commitlog
            async with asyncio.timeout(10):
                (again,) = await cl.put([cl.prepare("rb", b"retried", uniq_key="k3")], 5.0)
                assert again.duplicate and again.commitlog_offset == served[b"k-3-" * 100]
                (new,) = await cl.put([cl.prepare("rb", b"new", uniq_key="new")], 5.0)
                assert not new.duplicate and new.commitlog_offset > offset
        finally:
            await node.close()

    asyncio.run(puts_go_on(_single_node(tmp_path)))


def _damage_what_dispatch_must_read(root: Path) -> tuple[str, int, int]:
    """A damaged k7 that dispatch has to read again at start: the consume queues and
    the key index are gone, so the node rebuilds them from the log."""
    file, entry_pos, index, _ = _put_twenty_and_damage_k7(root, _DAMAGE["body"])
    shutil.rmtree(root / "consumequeue")
    shutil.rmtree(root / "index")
    return file, entry_pos, index


def test_a_flip_below_the_checkpoint_that_dispatch_must_read_refuses_the_start(
    tmp_path: Path,
) -> None:
    """Dispatch goes in log order and cannot skip a message: the start fails with
    one CorruptEntry line naming file, offset and the repair; nothing is changed."""
    file, entry_pos, index = _damage_what_dispatch_must_read(tmp_path)
    log_before = {p: p.read_bytes() for p in (tmp_path / "commitlog").rglob("*") if p.is_file()}
    for _ in range(2):  # the directory lock is released: the same answer again
        with pytest.raises(CorruptEntry) as info:
            _single_node(tmp_path)
        text = str(info.value)
        assert "\n" not in text
        assert text.startswith(
            f"corrupt entry at {file} offset {entry_pos}: body CRC mismatch in entry {index}; "
            "the consume queues and the key index cannot be built past it: restore this "
            "node's data from a replica"
        ), text
    log_after = {p: p.read_bytes() for p in (tmp_path / "commitlog").rglob("*") if p.is_file()}
    assert log_after == log_before, "the commit log was changed"


def test_dledger_serve_refuses_a_damaged_store_in_one_line_with_exit_code_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    file, entry_pos, _ = _damage_what_dispatch_must_read(data)
    toml = tmp_path / "node.toml"
    toml.write_text(node_toml(_single_config(data)))
    code = cli.main(["serve", "--config", str(toml)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"dledger: corrupt entry at {file} offset {entry_pos}: body CRC")
    assert err.count("\n") == 1, err


def _since_last_start(log_path: Path) -> str:
    """The part of a node's log written since LocalCluster last started it."""
    text = log_path.read_text(errors="replace")
    return text[text.rindex("=== ") :]


@pytest.mark.slow
def test_a_node_with_a_flip_below_its_checkpoint_serves_the_rest_and_is_rebuilt_from_peers(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Real processes: a follower stopped cleanly (checkpointed), one byte flipped in
    a message below its checkpoint (in its UNIQ_KEY, which the start-up scan reads).
    Restarted, it logs one line naming file and offset, serves every other message
    and never the damaged one, and replicates new puts. The repair the doc gives
    (everything but raft.state removed) gets it back from its peers, byte for byte."""
    cluster = make_cluster("flipcp")
    leader, victim = leader_and_follower(cluster)
    with cluster.client() as client:
        acked = [
            Acked(body, client.put("cp", body, uniq_key=f"cp-{i}"))
            for i, body in enumerate(b"cp-%d-" % i * 50 for i in range(30))
        ]
    wait_converged(cluster, CONVERGE_S)
    cluster.stop(victim)
    hit = acked[12].result.commitlog_offset
    file, entry_pos, index = _flip_in_message(cluster.specs[victim].data_dir, hit, b"cp-12")
    cluster.start(victim)
    wait_until(lambda: cluster.statuses()[victim], 20.0, f"node {victim} to answer again",
               ok=lambda s: isinstance(s, NodeStatus))  # fmt: skip
    log = _since_last_start(cluster.specs[victim].log_path)
    lines = [x for x in log.splitlines() if "damaged committed entry" in x]
    assert len(lines) == 1, log
    assert f"entry {index}: corrupt entry at {file} offset {entry_pos}: body CRC" in lines[0]
    assert "Traceback" not in log, log
    with node_stubs(cluster) as stubs:
        for a in acked:
            if a.result.commitlog_offset != hit:
                assert get_at(stubs[victim], a.result.commitlog_offset).body == a.body
        with pytest.raises(grpc.RpcError):
            get_at(stubs[victim], hit)
        assert get_at(stubs[leader], hit).body == acked[12].body
    with cluster.client() as client:
        acked += [Acked(b"after", client.put("cp", b"after", uniq_key="after"))]
    wait_converged(cluster, CONVERGE_S)
    # The repair: keep raft.state (term, vote, commit index), remove the rest.
    cluster.stop(victim)
    data = Path(cluster.specs[victim].data_dir)
    for path in data.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name != "raft.state":
            path.unlink()
    cluster.start(victim)
    statuses = wait_converged(cluster, CONVERGE_S)
    assert statuses[victim].last_index >= index
    with node_stubs(cluster) as stubs:
        mine, theirs = read_all(stubs[victim]), read_all(stubs[leader])
    assert mine == theirs, "the rebuilt node serves other committed messages"
    check_acked(acked, mine, f"node {victim} rebuilt")
    cluster.stop(victim)
    report = verify_store(data)
    assert report.ok, report.problems


# ---------------------------------------------------------------- a failed flush


def test_a_failed_flush_stops_the_node_and_its_close_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async flush, fdatasync fails with EIO: the node stops on its own (no retry,
    no Raft message taken, no checkpoint past the failure, the abort marker stays)
    and the next start recovers as after a crash."""
    asyncio.run(_put_some(_single_node(tmp_path), 10, "ok"))
    node = _single_node(tmp_path)

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def main() -> int:
        stopped = asyncio.Event()
        node.on_fatal = stopped.set
        await node.start()
        try:
            await _lead(node)
            async with asyncio.timeout(10):
                monkeypatch.setattr(os, "fdatasync", eio)
                first_late = node.store.last_index() + 1
                for i in range(5):  # async flush: acknowledged before any fsync
                    spec = node.commitlog.prepare("rb", b"late-%d" % i, uniq_key=f"late{i}")
                    await node.commitlog.put([spec], 5.0)
                await stopped.wait()  # the periodic flush fails within its interval
            assert node.failed and node.stopping
            assert isinstance(node.fatal, OSError) and node.fatal.errno == errno.EIO
            term = node.core.term
            node.deliver(Heartbeat(src=2, dst=1, term=term + 1, commit=0))
            assert node.core.term == term, "a stopping node takes no Raft message"
        finally:
            await node.close()
            monkeypatch.undo()
        return first_late

    first_late = asyncio.run(main())
    assert (tmp_path / "abort").exists(), "the abort marker stays after a failure"
    checkpoint = read_record(tmp_path / "commitlog" / "entries.checkpoint")
    assert checkpoint is not None and checkpoint[0] < first_late
    again = _single_node(tmp_path)
    try:
        assert again.recovery.crashed
    finally:
        asyncio.run(again.close())
    report = verify_store(tmp_path)
    assert report.ok, report.problems


# ---------------------------------------------------------------- a changed layout


@pytest.mark.parametrize(
    "setting, value",
    [("cq_units_per_file", 32), ("index_slots", 128), ("index_entries", 512),
     ("data_segment_bytes", 2 * NODE_SEG), ("index_segment_bytes", 2 * ISEG)],
)  # fmt: skip
def test_a_changed_store_layout_is_refused_before_anything_is_opened(
    tmp_path: Path, setting: str, value: int
) -> None:
    """Consume-queue units per file, key-index slots and entries, and segment sizes
    fix where every record lies; reopened with other values the node would write
    queues and index at the wrong places (verify then finds conflicting units)."""
    asyncio.run(_put_some(_single_node(tmp_path), 100, "kept"))  # spans queue files
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=rf"store.{setting} is {value} but .* written with"):
        _single_node(tmp_path, settings={setting: value})
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, "nothing was opened, written or removed"
    asyncio.run(_put_some(_single_node(tmp_path), 5, "more"))  # the old settings still work
    report = verify_store(tmp_path)
    assert report.ok, report.problems


def test_a_data_directory_takes_one_node_at_a_time(tmp_path: Path) -> None:
    first = _single_node(tmp_path)
    held = rf"{tmp_path} is in use by another process \(pid {os.getpid()}\)"
    try:
        with pytest.raises(DirectoryInUse, match=held):
            _single_node(tmp_path)
    finally:
        asyncio.run(first.close())
    asyncio.run(_put_some(_single_node(tmp_path), 3, "after"))  # closing released it


def test_an_unreadable_layout_file_is_refused_naming_it(tmp_path: Path) -> None:
    asyncio.run(_put_some(_single_node(tmp_path), 3, "x"))
    (tmp_path / "layout.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"layout\.json is unreadable"):
        _single_node(tmp_path)
