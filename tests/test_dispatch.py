"""The dispatcher on a real entry store: committed-only dispatch, queue and index
contents, group offsets, recovery reconciliation, rebuilds and `dledger verify`.

Messages go through the real put path (`DLedgerCommitLog.prepare/put`) on a
single-replica log whose "Raft" commits when the test says so, so that the
committed position can be held behind the written end (`LocalLog`, in
tests/dispatch_helpers.py). The put path itself on that log (idempotency, timeouts,
new leaderships) is tested in tests/test_dispatch_puts.py.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.dispatcher import (
    OFFSETS_TOPIC,
    CommittedLog,
    Dispatcher,
    encode_offset_commit,
    parse_tag_expression,
)
from dledger_commitlog.cli.main import main as cli_main
from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.log.commitlog import DLedgerCommitLog
from dledger_commitlog.log.verify import verify_store
from store.errors import InvalidMessage, OffsetOutOfRange
from store.message import decode_message
from tests.dispatch_helpers import LAYOUT, LocalLog, files_of, messages


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LocalLog]:
    lg = LocalLog(tmp_path / "node")
    yield lg
    lg.close()


def test_dispatch_fills_queues_and_index_from_committed_messages(log: LocalLog) -> None:
    results = log.put(messages(120, seed=1))
    d = log.dispatcher()
    d.recover(log.cl.committed_pos)
    assert d.catch_up() == 120
    assert d.dispatched_pos == log.cl.committed_pos
    by_queue: dict[tuple[str, int], list[PutResult]] = {}
    for m, r in zip(messages(120, seed=1), results, strict=True):
        by_queue.setdefault((str(m["topic"]), r.queue_id), []).append(r)
    for (topic, qid), rs in by_queue.items():
        found = log.pull(d, topic, qid, 0, 1000, None)
        got = [decode_message(m) for m in found.messages]
        assert [m.physical_offset for m in got] == [r.commitlog_offset for r in rs]
        assert [m.queue_offset for m in got] == [r.queue_offset for r in rs]
        assert found.sizes == [len(m) for m in found.messages]
        assert [r.queue_offset for r in rs] == list(range(len(rs)))
        assert found.next_offset == len(rs)
    checked = 0
    for topic in ("t0", "t1", "t2"):
        hits = d.query_offsets(topic, "user3", 0, 2**62, 100)
        want = {
            r.commitlog_offset
            for m, r in zip(messages(120, seed=1), results, strict=True)
            if m["topic"] == topic and "user3" in m["keys"]  # type: ignore[operator]
        }
        assert set(hits) >= want  # candidates may add hash collisions
        checked += len(want)
    assert checked > 0


def test_nothing_at_or_beyond_the_committed_position_is_dispatched(log: LocalLog) -> None:
    log.put(messages(30, seed=2))
    log.put(messages(20, seed=3), commit=False)
    d = log.dispatcher()
    d.recover(log.store.end_pos)
    assert d.catch_up() == 30
    assert d.dispatched_pos == log.cl.committed_pos < log.store.end_pos
    for cq in d.queues.values():
        for unit in cq.get_range(cq.min_offset, 10_000):
            assert unit.commitlog_offset + unit.size <= log.cl.committed_pos
    log.commit(log.store.last_index() - 5)
    assert d.catch_up() == 15
    log.commit()
    assert d.catch_up() == 5


class LyingLog:
    """A log that hands out one message more than its committed position covers."""

    def __init__(self, real: DLedgerCommitLog, committed: int) -> None:
        self.real, self.committed = real, committed

    @property
    def committed_pos(self) -> int:
        return self.committed

    @property
    def min_pos(self) -> int:
        return self.real.min_pos

    def read_committed(
        self, from_pos: int, max_bytes: int
    ) -> tuple[list[tuple[int, bytes]], int, int]:
        msgs, nxt, _ = self.real.read_committed(from_pos, max_bytes)
        return msgs, nxt, self.committed

    def read_message(self, commitlog_offset: int, size: int) -> bytes:
        return self.real.read_message(commitlog_offset, size)


def test_the_committed_bound_is_checked_not_assumed(log: LocalLog, tmp_path: Path) -> None:
    log.put(messages(10, seed=4))
    lying: CommittedLog = LyingLog(log.cl, log.cl.committed_pos - 1)
    d = Dispatcher(tmp_path / "other", lying, units_per_file=50, index_slots=64, index_entries=150)
    d.recover(log.store.end_pos)
    with pytest.raises(AssertionError, match="beyond the committed position"):
        d.catch_up()


def test_group_offsets_come_from_the_system_topic(log: LocalLog) -> None:
    commits = [("g1", "orders", 0, 5), ("g1", "orders", 0, 9), ("g2", "orders", 3, 1)]
    log.put(
        [
            {
                "topic": OFFSETS_TOPIC,
                "body": encode_offset_commit(*c),
                "uniq_key": f"o{i}",
                "queue_id": 0,
            }
            for i, c in enumerate(commits)
        ]
    )
    d = log.dispatcher()
    d.recover(log.cl.committed_pos)
    d.catch_up()
    assert d.offsets == {("g1", "orders", 0): 9, ("g2", "orders", 3): 1}
    assert d.queue_offsets() == []  # system topics are not listed


def test_tag_expressions() -> None:
    assert parse_tag_expression("*") is None
    assert parse_tag_expression("") is None
    assert parse_tag_expression("TagA || TagB") == frozenset({"TagA", "TagB"})
    for bad in ("TagA ||", "|| B", "A B", "A || *"):
        with pytest.raises(InvalidMessage):
            parse_tag_expression(bad)


def test_pull_filters_by_tag_and_bounds_offsets(log: LocalLog) -> None:
    log.put(
        [
            {
                "topic": "t",
                "body": b"x",
                "uniq_key": f"u{i}",
                "queue_id": 1,
                "tags": ("A", "B", None)[i % 3],
            }
            for i in range(9)
        ]
    )
    d = log.dispatcher()
    d.recover(log.cl.committed_pos)
    d.catch_up()
    found = log.pull(d, "t", 1, 0, 100, frozenset({"A"}))
    assert found.messages and found.next_offset == 9
    assert all(decode_message(m).tags == "A" for m in found.messages)
    assert len(found.messages) == len(found.sizes) == 3
    found = log.pull(d, "t", 1, 2, 2, None)
    assert len(found.messages) == 2 and found.next_offset == 4
    assert [decode_message(m).queue_offset for m in found.messages] == [2, 3]
    found = log.pull(d, "t", 1, 0, 100, None, end_offset=5)
    assert len(found.messages) == 5 and found.next_offset == 5
    with pytest.raises(OffsetOutOfRange):
        log.pull(d, "t", 1, 10, 1, None)
    with pytest.raises(OffsetOutOfRange):
        log.pull(d, "never", 0, 3, 1, None)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_recovery_after_a_crash_equals_a_rebuild(tmp_path: Path, seed: int) -> None:
    """Dispatch past the last checkpoint, "crash", recover: the files equal a fresh build."""
    rng = random.Random(seed)
    log = LocalLog(tmp_path / "node")
    try:
        d = log.dispatcher()
        d.recover(log.cl.committed_pos)
        for round_ in range(4):
            log.put(messages(rng.randrange(20, 60), seed=seed * 10 + round_))
            d.catch_up()
            if rng.random() < 0.6:
                d.persist(d.snapshot())
        log.put(messages(40, seed=seed * 10 + 9))
        d.catch_up()  # dispatched beyond the checkpoint, then the process dies:
        for cq in d.queues.values():
            cq.flush()
        d.index.flush()
        again = log.dispatcher()
        report = again.recover(log.cl.committed_pos)
        assert report.crashed, f"seed {seed}: the abort marker was not seen"
        again.catch_up()
        again.persist(again.snapshot())
        again.close(clean=True)
        live = files_of(log.root)
        rebuilt_root = tmp_path / "rebuilt"
        shutil.copytree(
            log.root,
            rebuilt_root,
            ignore=shutil.ignore_patterns(
                "consumequeue", "index", "checkpoint", "consumer_offsets.json", "abort"
            ),
        )
        fresh = Dispatcher(
            rebuilt_root, log.cl, units_per_file=50, index_slots=64, index_entries=150
        )
        fresh.recover(log.cl.committed_pos)
        fresh.catch_up()
        fresh.persist(fresh.snapshot())
        fresh.close(clean=True)
        assert files_of(rebuilt_root) == live, f"seed {seed}"
    finally:
        log.close()


def test_recovery_cuts_queues_back_to_a_shorter_log(log: LocalLog) -> None:
    first = log.put(messages(20, seed=5))
    d = log.dispatcher()
    d.recover(log.cl.committed_pos)
    d.catch_up()
    d.persist(d.snapshot())
    cut = first[10].commitlog_offset - 48  # the log lost everything from message 10 on
    again = log.dispatcher()
    report = again.recover(cut)
    assert report.resume_pos == cut and any("cutting" in n for n in report.notes)
    total = sum(cq.max_offset for cq in again.queues.values())
    assert total == 10


def test_verify_passes_then_finds_damage(log: LocalLog, capsys: pytest.CaptureFixture[str]) -> None:
    log.put(messages(150, seed=6))
    d = log.dispatcher()
    d.recover(log.cl.committed_pos)
    d.catch_up()
    d.persist(d.snapshot())
    d.close(clean=True)
    log.store.flush()
    report = verify_store(log.root)
    assert report.ok, report.problems
    assert report.entries_checked == 150 and report.queues_checked >= 3
    assert cli_main(["verify", "--data-dir", str(log.root), "--no-progress"]) == 0
    # A consume-queue unit that points elsewhere:
    qfile = next(p for p in (log.root / "consumequeue").rglob("*") if p.is_file())
    raw = bytearray(qfile.read_bytes())
    raw[7] ^= 0x10
    qfile.write_bytes(bytes(raw))
    report = verify_store(log.root)
    assert not report.ok and "differ" in " ".join(report.problems)
    assert cli_main(["verify", "--data-dir", str(log.root), "--no-progress"]) == 1
    assert "problems" in capsys.readouterr().out
    assert cli_main(["verify", "--data-dir", str(log.root / "nope")]) == 2
    qfile.write_bytes(bytes(raw[:7]) + bytes([raw[7] ^ 0x10]) + bytes(raw[8:]))  # mended
    assert verify_store(log.root).ok
    # A byte of the (sparse) index file, far past what it holds:
    index = sorted((log.root / "index").iterdir())[-1]
    with open(index, "r+b") as f:
        f.seek(index.stat().st_size - 100)
        f.write(b"\x01")
    report = verify_store(log.root)
    assert report.problems == [f"index file {index.name} differs from a rebuild"]


def test_persist_rewrites_its_records_only_when_they_changed(log: LocalLog) -> None:
    """An idle node persists every second: with nothing new it writes (and fsyncs)
    nothing; the next message makes it write again."""
    log.put(messages(5, seed=7))
    d = log.dispatcher()
    d.recover(log.cl.committed_pos)
    d.catch_up()
    d.persist(d.snapshot())
    offsets, checkpoint = log.root / "consumer_offsets.json", log.root / "checkpoint"

    def stamps() -> tuple[int, int]:
        return offsets.stat().st_ino, checkpoint.stat().st_mtime_ns

    first = stamps()
    d.persist(d.snapshot())
    assert stamps() == first
    log.put(messages(1, seed=8))
    d.catch_up()
    d.persist(d.snapshot())
    assert stamps()[0] != first[0]
    assert json.loads(offsets.read_bytes())["position"] == d.dispatched_pos


def _read_all(view: CommittedLog, max_bytes: int) -> list[tuple[list[tuple[int, bytes]], int]]:
    """Every read_committed answer from the first entry to the committed position."""
    out, pos = [], view.min_pos
    while pos < view.committed_pos:
        msgs, pos, _ = view.read_committed(pos, max_bytes)
        out.append((msgs, pos))
    return out


def test_dispatch_reads_what_this_process_appended_from_memory_as_from_the_files(
    log: LocalLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries still in the entry store's memory are read without the files (no read,
    no decode) and give the same answers as the files do once nothing is in memory,
    across segment ends (fillers) and with reads cut by size."""
    for seed in range(9):
        log.put(messages(1000, seed=seed))
    assert log.store.end_pos > 2 * LAYOUT["data_segment_bytes"], "crosses segment ends"

    def no_file_reads(*_args: object) -> None:
        raise AssertionError("read from the files")

    with monkeypatch.context() as m:
        m.setattr(log.store, "stored_entries", no_file_reads)
        from_memory = _read_all(log.cl, 48 << 10)
    log.close()
    reopened = LocalLog(log.root)  # a new process: nothing in memory
    try:
        from_files = _read_all(reopened.cl, 48 << 10)
    finally:
        reopened.close()
    assert from_memory == from_files
    assert sum(len(msgs) for msgs, _ in from_memory) == 9000
