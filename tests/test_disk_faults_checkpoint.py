"""A byte flipped in a committed message below the entry checkpoint.

Recovery does not rescan below the checkpoint: the start-up read of the idempotency
window meets the damaged entry and warns once, and the node serves every other
message and never the damaged one; a damaged entry that dispatch must read again
refuses the start in one line; a cluster node so damaged is rebuilt from its peers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.launcher import LocalCluster, node_toml
from dledger_commitlog.client import NodeStatus
from dledger_commitlog.log import reads
from dledger_commitlog.log.commitlog import Draft
from dledger_commitlog.log.entry_records import read_record
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.verify import read_layout, verify_store
from dledger_commitlog.node.node import RaftNode
from store.entry_format import ENTRY_MAGIC, HEADER, HEADER_SIZE
from store.errors import CorruptEntry
from store.message import QUEUE_OFFSET_POS, decode_message
from tests.conftest import CONVERGE_S, get_at, node_stubs, wait_converged, wait_until
from tests.disk_fault_helpers import ISEG, NODE_SEG, lead, put_some, single_config, single_node
from tests.workload import Acked, check_acked, leader_and_follower, read_all


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
    asyncio.run(put_some(single_node(root), 20, "k"))
    offset = _offset_of(root, "k7")
    file, entry_pos, index = _flip_in_message(root, offset, at)
    return file, entry_pos, index, offset


def _pull_one(node: RaftNode, topic: str, queue_id: int, offset: int) -> reads.Found:
    """A Pull of one message at a queue offset, as the node serves it."""
    return reads.pull_scan(
        node.committed.queue_view(topic, queue_id),
        node.committed.log_view(),
        offset,
        1,
        None,
        max_bytes=4 << 20,
    )


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
    node = single_node(tmp_path)
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
            await lead(node)
            cl = node.commitlog
            async with asyncio.timeout(10):
                (again,) = await cl.put([cl.prepare(Draft("rb", b"retried", "k3"))], 5.0)
                assert again.duplicate and again.commitlog_offset == served[b"k-3-" * 100]
                (new,) = await cl.put([cl.prepare(Draft("rb", b"new", "new"))], 5.0)
                assert not new.duplicate and new.commitlog_offset > offset
        finally:
            await node.close()

    asyncio.run(puts_go_on(single_node(tmp_path)))


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
            single_node(tmp_path)
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
    toml.write_text(node_toml(single_config(data)))
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
    wait_until(
        lambda: cluster.statuses()[victim],
        20.0,
        f"node {victim} to answer again",
        ok=lambda s: isinstance(s, NodeStatus),
    )
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
