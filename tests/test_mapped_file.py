"""MappedFileQueue: segments, spanning reads, truncation, retention, flush."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from store.mapped_file import MappedFileQueue, segment_name
from tests.conftest import small_filesystem

SEG = 64


def test_segments_are_named_by_their_start_offset(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG, preallocate=False)
    q.append(b"a" * SEG)
    q.append(b"b" * 10)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [segment_name(0), segment_name(SEG)]
    assert segment_name(SEG) == "00000000000000000064"
    assert all((tmp_path / n).stat().st_size == SEG for n in names)
    q.close()


def test_append_refuses_to_straddle_a_segment(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG, preallocate=False)
    q.append(b"x" * 60)
    with pytest.raises(ValueError, match="do not fit"):
        q.append(b"y" * 5)
    assert q.write_position == 60
    q.close()


def test_reads_span_segments_and_append_across_splits_at_boundaries(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG)
    payload = bytes(range(200))
    assert q.append_across(payload) == 0
    assert q.write_position == 200
    assert q.read(0, 200) == payload
    assert q.read(50, 100) == payload[50:150]
    with pytest.raises(IndexError):
        q.read(150, 51)
    q.close()


def test_reopen_keeps_bytes_and_positions_start_at_file_end(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG)
    q.append_across(b"z" * 100)
    q.flush()
    q.close()
    r = MappedFileQueue(tmp_path, SEG)
    # Until the owner's recovery scan sets it, every byte of the files counts.
    assert r.write_position == 2 * SEG
    assert r.read(0, 100) == b"z" * 100
    r.set_write_position(100)
    assert r.write_position == 100
    r.close()


def test_truncate_zeroes_the_tail_and_deletes_later_segments(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG, preallocate=False)
    q.append_across(b"q" * 150)
    q.truncate(70)
    assert q.write_position == 70
    assert [s for s, _ in q.segments()] == [0, SEG]
    assert q.read_unchecked(70, 58) == bytes(58)
    q.append(b"n" * 4)
    assert q.read(66, 8) == b"qqqqnnnn"
    q.truncate(SEG)
    assert [s for s, _ in q.segments()] == [0]
    q.close()


def test_delete_before_drops_whole_segments_only(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG, preallocate=False)
    q.append_across(b"d" * (3 * SEG + 5))
    assert q.delete_before(SEG + 10) == SEG
    assert q.min_offset == SEG
    with pytest.raises(IndexError):
        q.read(0, 1)
    assert q.read(SEG, 5) == b"ddddd"
    assert q.delete_before(10 * SEG) == 3 * SEG  # the segment being written stays
    q.close()


def test_flush_reports_what_was_written_before_it(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG)
    assert q.flushed_position == 0
    q.append_across(b"f" * 130)
    assert q.flushed_position == 0
    assert q.flush() == 130
    q.close()


def test_flush_in_a_thread_races_appends_and_deletions_safely(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, 4096)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        while not stop.is_set():
            try:
                q.flush()
            except BaseException as exc:
                errors.append(exc)
                return

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(300):
            q.append_across(bytes([i % 251]) * 1000)
            if i % 50 == 49:
                q.delete_before(q.write_position - 8192)
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert q.flush() == q.write_position
    assert q.read(q.write_position - 1000, 1000) == bytes([299 % 251]) * 1000
    q.close()


def test_preallocation_creates_the_next_segment_ahead(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG)
    q.append(b"p")
    q._spare_thread.join() if q._spare_thread else None
    assert (tmp_path / segment_name(SEG)).exists()
    q.close()
    # A spare is only zeros: closing removes it rather than leaving a phantom segment.
    assert not (tmp_path / segment_name(SEG)).exists()


def test_bad_segment_size_and_gaps_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        MappedFileQueue(tmp_path, 0)
    (tmp_path / segment_name(0)).write_bytes(bytes(SEG))
    (tmp_path / segment_name(2 * SEG)).write_bytes(bytes(SEG))
    with pytest.raises(ValueError, match="not contiguous"):
        MappedFileQueue(tmp_path, SEG)
    assert os.listdir(tmp_path)


def test_write_buffer_serves_reads_and_reaches_the_files_on_flush(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG, write_buffer_bytes=1 << 20)
    q.append_across(bytes(range(100)))
    assert q.segments() == []  # nothing written to files yet
    assert q.read(10, 80) == bytes(range(10, 90))
    q.truncate(90)
    q.append(b"\xff" * 5)
    assert q.read(85, 10) == bytes(range(85, 90)) + b"\xff" * 5
    assert q.flush() == 95
    assert [s for s, _ in q.segments()] == [0, SEG]
    q.truncate(50)  # now in the files: zeroed there
    assert q.read_unchecked(50, 14) == bytes(14)
    q.append(b"e" * 3)
    q.close()  # a clean close commits the buffer
    r = MappedFileQueue(tmp_path, SEG)
    assert r.read(45, 8) == bytes(range(45, 50)) + b"eee"
    r.close()


def test_write_buffer_commits_itself_when_full(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG, write_buffer_bytes=100)
    q.append(b"a" * 60)
    assert q.segments() == []
    q.append(b"b" * 4)
    q.append_across(b"c" * 40)  # the buffer now crosses a segment end: two files
    assert [s for s, _ in q.segments()] == [0, SEG]
    assert q.read(0, 104) == b"a" * 60 + b"b" * 4 + b"c" * 40
    q.close()


def test_a_full_disk_fails_the_roll_over_clearly_and_keeps_what_was_written(
    tmp_path: Path,
) -> None:
    """A real 1 MiB filesystem: the third 512 KiB segment does not fit."""
    fs = tmp_path / "fs"
    with small_filesystem(fs, 1):
        seg = 512 * 1024
        q = MappedFileQueue(fs, seg, preallocate=False)
        q.append(b"a" * seg)
        q.append(b"b" * 1000)  # the second segment: the filesystem is now full
        q.flush()
        q.append(b"c" * (seg - 1000))  # fills the second segment
        with pytest.raises(OSError) as err:
            q.append(b"d")  # a third one cannot be allocated
        assert err.value.errno == errno.ENOSPC
        assert f"cannot allocate segment {fs / segment_name(2 * seg)}" in str(err.value)
        assert not (fs / segment_name(2 * seg)).exists(), "no half-allocated segment is left"
        q.flush()
        q.close()
        again = MappedFileQueue(fs, seg, preallocate=False)
        assert again.read(0, 1) == b"a" and again.read(2 * seg - 1, 1) == b"c"
        again.close()


def test_a_failed_fdatasync_fails_every_later_flush_and_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After EIO from fdatasync the kernel may have dropped the dirty pages: a later
    fdatasync that succeeds proves nothing, so nothing is ever reported flushed again."""
    q = MappedFileQueue(tmp_path, SEG, preallocate=False)
    q.append(b"a" * 10)
    assert q.flush() == 10

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    q.append(b"b" * 10)
    with monkeypatch.context() as m:
        m.setattr(os, "fdatasync", eio)
        with pytest.raises(OSError) as first:
            q.flush()
    assert first.value.errno == errno.EIO
    assert q.flushed_position == 10
    with pytest.raises(OSError, match="an earlier fdatasync failed") as again:
        q.flush()  # fdatasync works again, and must not be believed
    assert again.value.errno == errno.EIO
    assert q.flushed_position == 10
    q.close()
