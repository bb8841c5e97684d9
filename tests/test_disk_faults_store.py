"""Disk faults on an EntryStore alone (chaos.disk on a store directory).

A byte flipped above the entry checkpoint cuts the log at the damaged entry and
reports what is missing; at or below the checkpoint the store refuses to open or
the read of the damaged entry fails; a power loss drops what was not flushed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.disk import flip_byte, power_loss, read_trace
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.verify import write_layout
from dledger_commitlog.node.recovery import FlushTrace
from raft.types import Entry
from store.entry_format import HEADER_SIZE
from store.errors import CorruptEntry
from tests.disk_fault_helpers import ISEG

SEG = 4096


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
    r = EntryStore(
        tmp_path / "commitlog", data_segment_bytes=SEG, index_segment_bytes=ISEG, committed_index=55
    )
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
    r = EntryStore(
        tmp_path / "commitlog", data_segment_bytes=SEG, index_segment_bytes=ISEG, committed_index=40
    )
    try:
        assert r.last_index() == 30 and r.end_pos == flushed
        assert r.tail_cut is None and r.missing_through == 40
        assert [e.index for e in r.stored_entries(1, 31, 1 << 20)] == list(range(1, 31))
    finally:
        r.close()
