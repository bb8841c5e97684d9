"""A one-node store that must stop or refuse to start: a failed flush, a changed
layout, a data directory another node holds, an unreadable layout file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from pathlib import Path

import pytest

from dledger_commitlog.log.commitlog import Draft, OutcomeUnknown
from dledger_commitlog.log.entry_records import read_record
from dledger_commitlog.log.verify import verify_store
from dledger_commitlog.node.config import ConfigError
from raft.messages import Heartbeat
from store.errors import DirectoryInUse
from tests.disk_fault_helpers import ISEG, NODE_SEG, lead, put_some, single_node

# ---------------------------------------------------------------- a failed flush


def test_a_failed_flush_stops_the_node_and_its_close_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async flush, fdatasync fails with EIO: the node stops on its own (no retry,
    no Raft message taken, no checkpoint past the failure, the abort marker stays)
    and the next start recovers as after a crash."""
    asyncio.run(put_some(single_node(tmp_path), 10, "ok"))
    node = single_node(tmp_path)

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def main() -> int:
        stopped = asyncio.Event()
        node.on_fatal = stopped.set
        await node.start()
        try:
            await lead(node)
            async with asyncio.timeout(10):
                monkeypatch.setattr(os, "fdatasync", eio)
                first_late = node.store.last_index() + 1
                for i in range(5):  # async flush: acknowledged before any fsync
                    if stopped.is_set():
                        break  # the periodic flush failed first (a slow machine): enough
                    spec = node.commitlog.prepare(Draft("rb", b"late-%d" % i, f"late{i}"))
                    with contextlib.suppress(OutcomeUnknown):  # stopped while it waited
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
    again = single_node(tmp_path)
    try:
        assert again.recovery.crashed
    finally:
        asyncio.run(again.close())
    report = verify_store(tmp_path)
    assert report.ok, report.problems


# ---------------------------------------------------------------- a changed layout


@pytest.mark.parametrize(
    "setting, value",
    [
        ("cq_units_per_file", 32),
        ("index_slots", 128),
        ("index_entries", 512),
        ("data_segment_bytes", 2 * NODE_SEG),
        ("index_segment_bytes", 2 * ISEG),
    ],
)
def test_a_changed_store_layout_is_refused_before_anything_is_opened(
    tmp_path: Path, setting: str, value: int
) -> None:
    """Consume-queue units per file, key-index slots and entries, and segment sizes
    fix where every record lies; reopened with other values the node would write
    queues and index at the wrong places (verify then finds conflicting units)."""
    asyncio.run(put_some(single_node(tmp_path), 100, "kept"))  # spans queue files
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=rf"store.{setting} is {value} but .* written with"):
        single_node(tmp_path, settings={setting: value})
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, "nothing was opened, written or removed"
    asyncio.run(put_some(single_node(tmp_path), 5, "more"))  # the old settings still work
    report = verify_store(tmp_path)
    assert report.ok, report.problems


def test_a_data_directory_takes_one_node_at_a_time(tmp_path: Path) -> None:
    first = single_node(tmp_path)
    held = rf"{tmp_path} is in use by another process \(pid {os.getpid()}\)"
    try:
        with pytest.raises(DirectoryInUse, match=held):
            single_node(tmp_path)
    finally:
        asyncio.run(first.close())
    asyncio.run(put_some(single_node(tmp_path), 3, "after"))  # closing released it


def test_an_unreadable_layout_file_is_refused_naming_it(tmp_path: Path) -> None:
    asyncio.run(put_some(single_node(tmp_path), 3, "x"))
    (tmp_path / "layout.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"layout\.json is unreadable"):
        single_node(tmp_path)
