"""A queue of fixed-size segment files: RocketMQ's MappedFileQueue, with plain fds.

Owns one directory of segments, each named by its 20-digit zero-padded start
offset and exactly `segment_size` bytes long, so logical offset `o` lives in
segment `o - o % segment_size`. Invariants:

- Data is `[min_offset, write_position)`; appends land at `write_position` and
  never straddle a segment (callers that need it write their own filler).
- `flushed_position <= write_position`; everything below `flushed_position` has
  been fdatasync'ed. `flush()` may run in a worker thread while the owner thread
  appends: the two meet only under `_lock`, and a segment retired while a flush
  holds its fd is closed by that flush, never under its feet.
- Truncation zeroes the dropped bytes of the surviving segment (so a later scan
  never mistakes stale records for live ones) and deletes later segments.
- The segment after the current one is preallocated by a background thread
  (posix_fallocate), so rolling over does not stall a writer on block allocation.
- With `write_buffer_bytes > 0` (RocketMQ's transient store pool) appends go to
  an in-memory buffer and reach the files on `commit()`, which `flush()` calls
  from its worker thread: the event loop then makes no syscall per append. Reads
  see buffered bytes. Buffered bytes die with the process, so use it only where
  that is harmless: a rebuildable file, or sync flush, where nothing is
  acknowledged before its fsync. `_commit_lock` orders commits against
  truncation and retention; `_lock` guards positions, buffers and segment lists.

We use pwrite/pread and fdatasync rather than mmap: Python's mmap cannot msync
a sub-range cheaply and a write through a slice is no faster than one pwrite of
a whole batch, which is how every writer here calls us.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

from store.fileio import fsync_dir, mkdir_durably

log = logging.getLogger(__name__)

NAME_DIGITS = 20
# posix_fallocate's answers for "this filesystem cannot preallocate": a sparse
# file is still correct there. Anything else (ENOSPC above all) is an error.
_NO_FALLOCATE = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
_ZERO_CHUNK = 1 << 20
_ZERO_WINDOW = 64 << 20


def segment_name(start_offset: int) -> str:
    return f"{start_offset:0{NAME_DIGITS}d}"


class _Segment:
    """One open segment file; `busy` counts flushes that hold its fd."""

    __slots__ = ("busy", "fd", "path", "retired", "start")

    def __init__(self, start: int, path: Path, fd: int) -> None:
        self.start = start
        self.path = path
        self.fd = fd
        self.busy = 0
        self.retired = False


class MappedFileQueue:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        segment_size: int,
        *,
        preallocate: bool = True,
        write_buffer_bytes: int = 0,
    ) -> None:
        if segment_size <= 0:
            raise ValueError(f"segment_size must be positive, got {segment_size}")
        self.directory = Path(directory)
        mkdir_durably(self.directory)
        self.segment_size = segment_size
        self._preallocate = preallocate
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._buffer_limit = write_buffer_bytes
        self._pending = bytearray()
        self._committing: tuple[int, bytearray] | None = None
        self._epoch = 0  # bumped by every truncation: a flush racing one claims nothing
        self._segments: list[_Segment] = []
        self._dirty: dict[int, _Segment] = {}
        self._spare: _Segment | None = None
        self._spare_thread: threading.Thread | None = None
        self._closed = False
        self._flush_error: OSError | None = None  # a failed fdatasync: sticky
        for path in sorted(self.directory.iterdir()):
            if len(path.name) == NAME_DIGITS and path.name.isdigit():
                self._segments.append(self._open(int(path.name), path))
        for prev, nxt in zip(self._segments, self._segments[1:], strict=False):
            if nxt.start != prev.start + segment_size:
                raise ValueError(f"{self.directory}: segments are not contiguous at {nxt.path}")
        # Until the owner's recovery scan says otherwise, all bytes in files are data.
        end = self._segments[-1].start + segment_size if self._segments else 0
        self._write_pos = end
        self._pending_start = end  # == write position whenever nothing is buffered
        self._empty_start = end  # min_offset while there is no segment
        self._flushed_pos = end

    # -- positions ---------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self._segments[0].start if self._segments else self._empty_start

    @property
    def write_position(self) -> int:
        return self._write_pos

    @property
    def flushed_position(self) -> int:
        return self._flushed_pos

    def space_left_in_segment(self) -> int:
        return self.segment_size - self._write_pos % self.segment_size

    def segments(self) -> list[tuple[int, str]]:
        return [(s.start, str(s.path)) for s in self._segments]

    def set_write_position(self, pos: int) -> None:
        """Declare the valid end found by a recovery scan; later segments are deleted."""
        self._check_offset(pos)
        with self._commit_lock, self._lock:
            assert not self._pending, "set_write_position is for recovery, before any append"
            self._drop_segments_from(self._seg_start_for_end(pos))
            self._write_pos = self._pending_start = pos
            self._flushed_pos = min(self._flushed_pos, pos)
            if not self._segments:
                self._empty_start = pos

    # -- writing -----------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview) -> int:
        size = len(data)
        pos = self._write_pos
        if size > self.segment_size - pos % self.segment_size or not size:
            if not size:
                return pos
            raise ValueError(
                f"{size} bytes do not fit the {self.space_left_in_segment()} left in the segment"
            )
        if self._buffer_limit:
            with self._lock:
                self._pending += data
                self._write_pos = pos + size
            if len(self._pending) >= self._buffer_limit:
                self.commit()
            return pos
        self._write_file(pos, data)
        with self._lock:
            self._write_pos = self._pending_start = pos + size
        return pos

    def _write_file(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """pwrite bytes that lie within one segment (creating it if needed)."""
        seg = self._segment_for_write(pos)
        written = os.pwrite(seg.fd, data, pos - seg.start)
        if written != len(data):  # pragma: no cover - a short local write is an I/O error
            raise OSError(f"short write to {seg.path}: {written} of {len(data)}")
        with self._lock:
            self._dirty[seg.start] = seg

    def commit(self) -> int:
        """Move buffered bytes to the files; returns the position they now reach."""
        with self._commit_lock:
            with self._lock:
                chunk, start = self._pending, self._pending_start
                if not chunk:
                    return start
                self._committing = (start, chunk)
                self._pending = bytearray()
                self._pending_start = start + len(chunk)
            view = memoryview(chunk)
            pos = start
            while view:
                n = min(len(view), self.segment_size - pos % self.segment_size)
                self._write_file(pos, view[:n])
                view = view[n:]
                pos += n
            view.release()
            with self._lock:
                self._committing = None
            return pos

    def append_across(self, data: bytes | bytearray | memoryview) -> int:
        """Append bytes laid out by the caller so that every segment boundary they
        cross falls where a segment must end (after a filler, or between fixed-size
        units); returns the offset of the first byte."""
        start = self._write_pos
        if len(data) <= self.segment_size - start % self.segment_size:
            self.append(data)
            return start
        view = memoryview(data)
        while view:
            n = min(len(view), self.space_left_in_segment())
            self.append(view[:n])
            view = view[n:]
        return start

    def _segment_for_write(self, pos: int) -> _Segment:
        start = pos - pos % self.segment_size
        if self._segments and self._segments[-1].start == start:
            return self._segments[-1]
        assert not self._segments or self._segments[-1].start + self.segment_size == start
        seg = self._take_spare(start)
        with self._lock:
            self._segments.append(seg)
        self._start_preallocation(start + self.segment_size)
        return seg

    def _take_spare(self, start: int) -> _Segment:
        if self._spare_thread is not None:
            self._spare_thread.join()
            self._spare_thread = None
        spare, self._spare = self._spare, None
        if spare is not None and spare.start == start:
            return spare
        if spare is not None:
            os.close(spare.fd)
            spare.path.unlink(missing_ok=True)
        return self._create(start)

    def _start_preallocation(self, start: int) -> None:
        if not self._preallocate or self._closed:
            return

        def work() -> None:
            try:
                self._spare = self._create(start)
            except OSError as exc:  # the roll-over creates it again and reports the error
                log.warning("preallocating the next segment failed: %s", exc)

        self._spare_thread = threading.Thread(target=work, name="segment-prealloc", daemon=True)
        self._spare_thread.start()

    def _create(self, start: int) -> _Segment:
        """A new segment with all its blocks allocated, or OSError and no file.

        Allocating up front turns a full disk into one clear error at roll-over,
        instead of a write failing somewhere inside a segment.
        """
        path = self.directory / segment_name(start)
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                os.posix_fallocate(fd, 0, self.segment_size)
            except OSError as exc:
                if exc.errno not in _NO_FALLOCATE:
                    raise
                os.ftruncate(fd, self.segment_size)
            # fdatasync of the segment does not make its name durable: without
            # this a power loss could drop a young segment with fsynced data.
            fsync_dir(self.directory)
        except OSError as exc:
            os.close(fd)
            if not existed:
                path.unlink(missing_ok=True)
            raise OSError(
                exc.errno,
                f"cannot allocate segment {path} ({self.segment_size} bytes): {exc.strerror}",
            ) from exc
        return _Segment(start, path, fd)

    def _open(self, start: int, path: Path) -> _Segment:
        fd = os.open(path, os.O_RDWR)
        if os.fstat(fd).st_size != self.segment_size:
            os.ftruncate(fd, self.segment_size)
        return _Segment(start, path, fd)

    # -- reading -----------------------------------------------------------------

    def read(self, offset: int, size: int) -> bytes:
        if offset < self.min_offset or offset + size > self._write_pos or size < 0:
            raise IndexError(
                f"read [{offset}, {offset + size}) outside [{self.min_offset}, {self._write_pos})"
            )
        return self.read_unchecked(offset, size)

    def read_unchecked(self, offset: int, size: int) -> bytes:
        """Read bytes of existing segments, also beyond write_position (recovery scans)."""
        end = offset + size
        with self._lock:
            mem_start = self._committing[0] if self._committing else self._pending_start
            write_pos = self._write_pos
            mem = b""
            if end > mem_start and offset < write_pos:
                mem = self._buffered(max(offset, mem_start), min(end, write_pos))
            segments = self._segments
        head = self._pread(segments, offset, min(end, mem_start)) if offset < mem_start else b""
        tail = self._pread(segments, max(offset, write_pos), end) if end > write_pos else b""
        return head + mem + tail if mem or tail else head

    def _buffered(self, begin: int, end: int) -> bytes:
        """Bytes [begin, end) of the buffers; caller holds _lock."""
        parts = []
        if self._committing is not None:
            cstart, chunk = self._committing
            if begin < cstart + len(chunk):
                parts.append(bytes(chunk[begin - cstart : min(end, cstart + len(chunk)) - cstart]))
        pstart = self._pending_start
        if end > pstart:
            parts.append(bytes(self._pending[max(begin, pstart) - pstart : end - pstart]))
        return b"".join(parts)

    def _pread(self, segments: list[_Segment], offset: int, end: int) -> bytes:
        parts: list[bytes] = []
        first = segments[0].start if segments else 0
        while offset < end:
            i = (offset - first) // self.segment_size
            if offset < first or i >= len(segments):
                break
            seg = segments[i]
            n = min(end - offset, seg.start + self.segment_size - offset)
            parts.append(os.pread(seg.fd, n, offset - seg.start))
            offset += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    # -- truncation and retention ------------------------------------------------

    def reset(self, offset: int) -> None:
        """Delete every segment and start over empty at `offset` (rebuilding a lost file)."""
        with self._commit_lock, self._lock:
            self._drop_segments_from(-1)
            self._pending = bytearray()
            self._write_pos = self._flushed_pos = self._pending_start = offset
            self._empty_start = offset
            self._epoch += 1

    def truncate(self, offset: int) -> None:
        """Remove everything at and after `offset`; the caller flushes when it matters."""
        self._check_offset(offset)
        with self._commit_lock:
            with self._lock:
                file_end = self._pending_start  # bytes beyond never reached the files
                if offset >= file_end:
                    del self._pending[offset - file_end :]
                else:
                    self._pending = bytearray()
                    self._pending_start = offset
                had_segments = bool(self._segments)
                self._drop_segments_from(self._seg_start_for_end(offset))
                self._write_pos = offset
                self._flushed_pos = min(self._flushed_pos, offset)
                if had_segments and not self._segments:
                    self._empty_start = offset
                self._epoch += 1
                seg = None
                if offset < file_end and offset % self.segment_size and self._segments:
                    seg = self._segments[-1]
                    self._dirty[seg.start] = seg
            if seg is not None:
                self._zero(seg, offset - seg.start, min(file_end, seg.start + self.segment_size))

    def _zero(self, seg: _Segment, begin: int, end_offset: int) -> None:
        """Zero what is not zero in [begin, end_offset) of `seg`.

        Past the first `_ZERO_WINDOW` bytes it stops at the first all-zero chunk:
        beyond a torn last write (bounded by a write batch) a recovered file holds
        only zeros, and reading a whole preallocated 1 GiB tail would make every
        restart pay for it.
        """
        end = end_offset - seg.start
        limit = begin + _ZERO_WINDOW
        zeros = bytes(_ZERO_CHUNK)
        while begin < end:
            n = min(_ZERO_CHUNK, end - begin)
            if os.pread(seg.fd, n, begin).count(0) != n:
                os.pwrite(seg.fd, zeros[:n], begin)
            elif begin >= limit:
                return
            begin += n

    def delete_before(self, offset: int) -> int:
        """Delete whole segments that end at or before `offset`; returns the new min_offset."""
        self.commit()
        with self._commit_lock, self._lock:
            keep = [s for s in self._segments if s.start + self.segment_size > offset]
            gone = self._segments[: len(self._segments) - len(keep)]
            # Never delete the segment being written: the write position must stay inside.
            if not keep and gone and self._write_pos % self.segment_size:
                keep, gone = [gone[-1]], gone[:-1]
            self._segments = keep
            for seg in gone:
                self._retire(seg)
            if not keep:
                self._flushed_pos = self._empty_start = self._write_pos
        return self.min_offset

    def _seg_start_for_end(self, end: int) -> int:
        """First segment start not needed to hold data ending at `end`."""
        rem = end % self.segment_size
        return end - rem + self.segment_size if rem else end

    def _drop_segments_from(self, start: int) -> None:
        keep = [s for s in self._segments if s.start < start]
        for seg in self._segments[len(keep) :]:
            self._retire(seg)
        self._segments = keep

    def _retire(self, seg: _Segment) -> None:
        """Unlink now; close the fd now unless a flush holds it (then the flush closes it)."""
        self._dirty.pop(seg.start, None)
        seg.path.unlink(missing_ok=True)
        seg.retired = True
        if seg.busy == 0:
            os.close(seg.fd)

    def _check_offset(self, offset: int) -> None:
        if not self.min_offset <= offset <= max(self._write_pos, self.min_offset):
            raise IndexError(f"offset {offset} outside [{self.min_offset}, {self._write_pos}]")

    # -- durability --------------------------------------------------------------

    def flush(self) -> int:
        """Commit buffered bytes and fdatasync every segment written since the last flush.

        Returns the flushed position. Safe to call from a worker thread while the
        owner appends: bytes appended before this call started are covered.

        A failed fdatasync fails this and every later flush, and the flushed
        position stays where it was: the kernel may have dropped the dirty pages,
        so a later call that "succeeds" would prove nothing ("fsyncgate").
        """
        if self._flush_error is not None:
            err = self._flush_error
            raise OSError(
                err.errno,
                f"{self.directory}: an earlier fdatasync failed "
                f"({err.strerror}); nothing is flushed since",
            )
        target = self.commit()
        with self._lock:
            epoch = self._epoch
            dirty = list(self._dirty.values())
            self._dirty.clear()
            for seg in dirty:
                seg.busy += 1
        synced = False
        try:
            for seg in dirty:
                if not seg.retired:
                    os.fdatasync(seg.fd)
            synced = True
        except OSError as exc:
            self._flush_error = exc
            raise
        finally:
            with self._lock:
                for seg in dirty:
                    seg.busy -= 1
                    if seg.retired and seg.busy == 0:
                        os.close(seg.fd)
                if synced and epoch == self._epoch:
                    self._flushed_pos = max(self._flushed_pos, min(target, self._write_pos))
        return self._flushed_pos

    def sync_all(self) -> None:
        """fdatasync every segment, whatever `flushed_position` says: on open the files
        count as flushed, yet after a process crash what they hold may still be only in
        the page cache (a power loss would take it)."""
        self.commit()
        with self._lock:
            segments = [seg for seg in self._segments if not seg.retired]
        for seg in segments:
            os.fdatasync(seg.fd)

    def close(self) -> None:
        """Commit what is buffered (not fsynced: flush first for that) and close."""
        self.commit()
        self._closed = True
        if self._spare_thread is not None:
            self._spare_thread.join()
            self._spare_thread = None
        with self._lock:
            segments, self._segments = self._segments, []
            spare, self._spare = self._spare, None
        for seg in segments:
            if seg.busy == 0:
                os.close(seg.fd)
            else:
                seg.retired = True
        if spare is not None:  # a spare holds only zeros: remove it, no phantom segment
            os.close(spare.fd)
            spare.path.unlink(missing_ok=True)
