"""`OfflineStore`: the committed messages of a node's data directory, read without modifying it.

Consume-queue files (20-byte units, only ever written for committed messages,
the data ending at the first unit with size <= 0) give each message's commit-log
offset X and size, and the message is `segment[X - start : X - start + size]` of
the data segment holding X, memory-mapped read-only (one mapping per segment and
piece, so each page is faulted in once). A stopped node (or a copy) is read up
to the end of its queues.

A *live* node on the same host is read the same way, but only below the bounds
that node reported (`LiveBounds`, from its QueueOffsets answer: dispatched queue
ends, and the commit-log position below which its data files hold everything),
so nothing uncommitted or half-written is ever read; a read beyond them raises
`NotHere` before it reads any message (the caller reads through the servers
instead). `LocalFiles` is such a replica's offer: where its files are (boot id,
directory by device and inode) and its bounds; `LocalFiles.open` gives their
store only on that host.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from analytics.codec import COLUMNS, Int64s, decode
from analytics.errors import SourceError
from analytics.rows import Rows, Units, batch_slices, npt_units, span_from_ends
from analytics.sources import SYSTEM_TOPIC_PREFIX, LogPiece, QueueInfo, Slice
from store.consume_queue import UNIT_DTYPE, UNIT_SIZE
from store.errors import CorruptEntry
from store.message import STORE_TIMESTAMP_POS

_UNITS_PER_READ = 1 << 18
npt_ints = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class LiveBounds:
    """What a live node (read through its files) reported as committed."""

    queues: dict[tuple[str, int], QueueInfo]
    log_file_end: int  # commit-log bytes below this are in its data files


@dataclass(frozen=True, slots=True)
class LocalFiles:
    """Where a replica keeps its files, and what it reported as committed: a planner
    hands this to the partitions, which read those files when they run on that host."""

    data_dir: str
    boot_id: str
    dir_device: int
    dir_inode: int
    bounds: LiveBounds

    @classmethod
    def of(cls, response: Any) -> LocalFiles | None:
        """From a QueueOffsets answer (None: it offers no files)."""
        lf = response.local_files
        if not lf.data_dir:
            return None
        queues = {
            (q.topic, q.queue_id): QueueInfo(q.topic, q.queue_id, q.min_offset, q.max_offset)
            for q in response.queues
        }
        return cls(
            lf.data_dir,
            lf.boot_id,
            lf.dir_device,
            lf.dir_inode,
            LiveBounds(queues, lf.log_file_end),
        )

    def open(self, need: Sequence[Slice]) -> OfflineStore | None:
        """The store of these files if they are on this host and hold `need`; else None."""
        if self.boot_id != this_boot_id():
            return None
        try:
            st = os.stat(self.data_dir)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != (self.dir_device, self.dir_inode):
            return None
        queues = self.bounds.queues
        for s in need:
            q = queues.get((s.topic, s.queue_id))
            if s.start < s.end and (q is None or q.max_offset < s.end):
                return None
        try:
            return OfflineStore(self.data_dir, self.bounds)
        except (OSError, SourceError):
            return None


class NotHere(Exception):
    """A live replica's files cannot serve this read (yet): read it through the RPCs."""


class OfflineStore:
    """Reads a node's data directory (see the module doc); never writes to it."""

    def __init__(self, path: str | os.PathLike[str], live: LiveBounds | None = None) -> None:
        self.root = Path(path)
        self.live = live
        self._data = self.root / "commitlog" / "data"
        if not self._data.is_dir():
            raise SourceError(
                f"{self.root} is not a dledger data directory (no commitlog/data/ in it)"
            )
        self._list_segments()
        self._maps: dict[int, pa.Buffer] = {}
        self._qfiles: dict[tuple[str, int], list[tuple[int, Path, int]]] = {}
        self._fds: dict[Path, int] = {}

    def _list_segments(self) -> None:
        self._segments = sorted(
            (int(p.name), p) for p in self._data.iterdir() if p.name.isdigit() and len(p.name) == 20
        )
        self._starts = np.asarray([s for s, _ in self._segments], np.int64)
        self.segment_bytes = self._segments[0][1].stat().st_size if self._segments else None

    def close(self) -> None:
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    # -- queues ------------------------------------------------------------------

    def _queue_files(
        self, topic: str, queue_id: int, fresh: bool = False
    ) -> list[tuple[int, Path, int]]:
        """(first unit, path, units) of each file of the queue, oldest first (listed once,
        again when `fresh`)."""
        key = (topic, queue_id)
        if not fresh and key in self._qfiles:
            return self._qfiles[key]
        directory = self.root / "consumequeue" / topic / str(queue_id)
        files = []
        for p in directory.iterdir() if directory.is_dir() else ():
            if p.name.isdigit() and len(p.name) == 20:
                start = int(p.name)
                if start % UNIT_SIZE:
                    raise CorruptEntry(str(p), start, "file name is not a multiple of 20")
                files.append((start // UNIT_SIZE, p, p.stat().st_size // UNIT_SIZE))
        self._qfiles[key] = sorted(files)
        return self._qfiles[key]

    def queues(self, topic: str = "") -> list[QueueInfo]:
        if self.live is not None:
            return sorted(
                (
                    q
                    for (t, _), q in self.live.queues.items()
                    if (t == topic if topic else not t.startswith(SYSTEM_TOPIC_PREFIX))
                ),
                key=lambda q: (q.topic, q.queue_id),
            )
        base = self.root / "consumequeue"
        out = []
        topics = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        for t in topics:
            if (t != topic) if topic else t.startswith(SYSTEM_TOPIC_PREFIX):
                continue
            ids = sorted(int(p.name) for p in (base / t).iterdir() if p.name.isdigit())
            for q in ids:
                info = self._bounds(t, q)
                if info is not None:
                    out.append(info)
        return out

    def _bounds(self, topic: str, queue_id: int) -> QueueInfo | None:
        files = self._queue_files(topic, queue_id, fresh=True)
        if not files:
            return None
        end = files[0][0]
        for first, path, count in reversed(files):
            units = _read_units(path, 0, count)
            valid = _count_valid(units)
            if valid:
                end = first + valid
                break
        lo = files[0][0]
        if len(self._starts) and lo < end:
            # Units whose messages retention deleted do not count.
            floor = int(self._starts[0])
            first_units = self._units(topic, queue_id, lo, min(end, files[0][0] + files[0][2]))
            lo += int(np.searchsorted(first_units["commitlog_offset"].astype(np.int64), floor))
        return QueueInfo(topic, queue_id, min(lo, end), end)

    def _units(self, topic: str, queue_id: int, start: int, end: int) -> npt_units:
        files = self._queue_files(topic, queue_id)
        if not files or files[-1][0] + files[-1][2] < end or files[0][0] > start:
            files = self._queue_files(topic, queue_id, fresh=True)  # a live queue grew
        parts = []
        for first, path, count in files:
            lo, hi = max(start, first), min(end, first + count)
            if lo < hi:
                parts.append(_read_units(path, lo - first, hi - lo))
        if not parts:
            units = np.zeros(0, UNIT_DTYPE)
        else:
            units = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if len(units) != end - start:
            raise CorruptEntry(
                f"consumequeue/{topic}/{queue_id}", start * UNIT_SIZE, "queue files have a gap"
            )
        return units

    def _checked_units(self, topic: str, queue_id: int, start: int, end: int) -> npt_units:
        """Units [start, end), which must all be data (below the queue's end)."""
        self._check_live(topic, queue_id, end)
        units = self._units(topic, queue_id, start, end)
        valid = _count_valid(units)
        if valid < len(units):
            raise SourceError(
                f"consumequeue/{topic}/{queue_id}: queue offset {start + valid} is beyond "
                "the end of the queue's data"
            )
        return units

    def _check_live(self, topic: str, queue_id: int, end: int) -> None:
        if self.live is not None:
            q = self.live.queues.get((topic, queue_id))
            if q is None or q.max_offset < end:
                raise NotHere(f"{topic}/{queue_id}: this replica has not dispatched {end} yet")

    def _unit_offset(self, topic: str, queue_id: int, q: int) -> int:
        """The commit-log offset of unit `q` (one pread: binary searches call it often)."""
        for first, path, count in self._queue_files(topic, queue_id):
            if first <= q < first + count:
                fd = self._fds.get(path)
                if fd is None:
                    fd = self._fds[path] = os.open(path, os.O_RDONLY)
                raw = os.pread(fd, 8, (q - first) * UNIT_SIZE)
                if len(raw) == 8:
                    return int.from_bytes(raw, "big", signed=True)
        units = self._units(topic, queue_id, q, q + 1)  # a queue that grew
        return int(units["commitlog_offset"][0])

    def _first_at(self, topic: str, queue_id: int, lo: int, hi: int, phy: int) -> int:
        """The first queue offset in [lo, hi) whose message lies at >= phy (hi if none)."""
        return _first_where(lo, hi, lambda q: self._unit_offset(topic, queue_id, q) >= phy)

    def unit_span(self, slices: Sequence[Slice]) -> tuple[int, int, int] | None:
        """(first message offset, end of the last message, bytes of the slices' messages,
        estimated from the sizes at their ends) of `slices`; None if they are empty."""
        return span_from_ends(
            (
                s,
                self._checked_units(s.topic, s.queue_id, s.start, s.start + 1),
                self._checked_units(s.topic, s.queue_id, s.end - 1, s.end),
            )
            for s in slices
            if s.start < s.end
        )

    # -- messages ----------------------------------------------------------------

    def _segment(self, index: int) -> pa.Buffer:
        buf = self._maps.get(index)
        if buf is None:
            with pa.memory_map(str(self._segments[index][1]), "r") as mm:
                buf = mm.read_buffer()
            self._maps = {index: buf}  # keep one segment mapped at a time
        return buf

    def _segment_index(self, offsets: Int64s) -> npt_ints:
        if not len(self._starts) or offsets.min() < self._starts[0]:
            bad = int(offsets.min())
            raise SourceError(
                f"commit-log offset {bad} was deleted by retention (the log starts at "
                f"{int(self._starts[0]) if len(self._starts) else 'nothing'})"
            )
        lo, hi = np.searchsorted(self._starts, [offsets.min(), offsets.max()], side="right") - 1
        if lo == hi and (
            not self.segment_bytes or offsets.max() - self._starts[lo] < self.segment_bytes
        ):
            return np.full(len(offsets), lo)  # all in one segment (the usual case)
        seg = np.searchsorted(self._starts, offsets, side="right") - 1
        # A live log grows: a segment newer than the listing means list again.
        if (
            self.live is not None
            and self.segment_bytes
            and ((offsets - self._starts[seg] >= self.segment_bytes).any())
        ):
            self._list_segments()
            self._maps.clear()
            seg = np.searchsorted(self._starts, offsets, side="right") - 1
        return seg

    def _check_file_end(self, ends: Int64s) -> None:
        if self.live is not None and len(ends) and int(ends.max()) > self.live.log_file_end:
            raise NotHere(
                f"commit-log bytes up to {int(ends.max())} are not all in the files yet "
                f"(flushed: {self.live.log_file_end})"
            )

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = COLUMNS,
    ) -> Iterator[pa.RecordBatch]:
        """One queue's messages [start, end), a chunk of units at a time. A live replica's
        bounds are checked at once (`NotHere`), before anything is read."""
        if self.live is not None and start < end:
            self._check_live(topic, queue_id, end)
            last = self._units(topic, queue_id, end - 1, end)
            self._check_file_end(last["commitlog_offset"].astype(np.int64) + last["size"])
        return self._read(topic, queue_id, start, end, columns)

    def _read(
        self, topic: str, queue_id: int, start: int, end: int, columns: Sequence[str]
    ) -> Iterator[pa.RecordBatch]:
        where = f"consumequeue/{topic}/{queue_id}"
        for q in range(start, end, _UNITS_PER_READ):
            units = Units([topic])
            hi = min(end, q + _UNITS_PER_READ)
            units.add(topic, queue_id, q, self._checked_units(topic, queue_id, q, hi))
            rows = Rows.of(units, order="queue")
            floor = int(self._starts[0]) if len(self._starts) else None
            if floor is None or int(rows.offsets[0]) < floor:
                raise SourceError(
                    f"{where}: queue offset {q} points at commit-log offset "
                    f"{int(rows.offsets[0])}, which retention deleted"
                )
            self._check_file_end(rows.offsets + rows.sizes)
            yield from self.read_rows(rows, columns)

    def piece_rows(self, piece: LogPiece) -> Rows:
        """The units of `piece`: its queues' units whose messages lie in its range."""
        units = Units(sorted({s.topic for s in piece.queues}))
        for s in piece.queues:
            if s.start >= s.end:
                continue
            self._check_live(s.topic, s.queue_id, s.end)
            a = self._first_at(s.topic, s.queue_id, s.start, s.end, piece.start)
            b = self._first_at(s.topic, s.queue_id, a, s.end, piece.end)
            for q in range(a, b, _UNITS_PER_READ):
                hi = min(b, q + _UNITS_PER_READ)
                units.add(s.topic, s.queue_id, q, self._checked_units(s.topic, s.queue_id, q, hi))
        rows = Rows.of(units, order="queue")
        self._check_file_end(rows.offsets + rows.sizes)
        return rows

    def read_piece(self, piece: LogPiece, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        return self.read_rows(self.piece_rows(piece), columns)

    def read_rows(self, rows: Rows, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Rows sharded by data segment (each mapped once), in batches of about BATCH_ROWS."""
        if not len(rows):
            return
        seg = self._segment_index(rows.offsets)
        shards: list[tuple[int, Int64s | slice]]
        if seg[0] == seg[-1] and (seg == seg[0]).all():
            shards = [(int(seg[0]), slice(0, len(rows)))]
        else:
            perm = np.argsort(seg, kind="stable")
            cuts = [0, *(np.flatnonzero(np.diff(seg[perm])) + 1).tolist(), len(rows)]
            shards = [(int(seg[perm[a]]), perm[a:b]) for a, b in itertools.pairwise(cuts)]
        for index, take in shards:
            base = int(self._starts[index])
            buf = self._segment(index)
            where = str(self._segments[index][1])
            offsets = rows.offsets[take]
            whole_group = isinstance(take, slice)
            exp = rows.expected if whole_group else rows.expected.take(take)
            for part in batch_slices(len(offsets)):
                whole = part == slice(0, len(offsets))
                yield decode(
                    buf,
                    (offsets if whole else offsets[part]) - base,
                    columns,
                    exp if whole else exp.take(part),
                    where=where,
                )

    def offsets_for_times(self, queries: Sequence[tuple[str, int, int]]) -> list[int]:
        """Per (topic, queue, timestamp ms): the first offset stored at or after it."""
        out = []
        for topic, queue_id, ts in queries:
            # This queue's bounds only (queues() would re-read every queue of the topic).
            if self.live is not None:
                info = self.live.queues.get((topic, queue_id))
            else:
                info = self._bounds(topic, queue_id)
            if info is None:
                out.append(0)
                continue
            out.append(
                _first_where(
                    info.min_offset,
                    info.max_offset,
                    lambda q: self._timestamp(topic, queue_id, q) >= ts,  # noqa: B023
                )
            )
        return out

    def _timestamp(self, topic: str, queue_id: int, q: int) -> int:
        phy = self._unit_offset(topic, queue_id, q)
        index = int(self._segment_index(np.asarray([phy], np.int64))[0])
        at = phy - int(self._starts[index]) + STORE_TIMESTAMP_POS
        return int(np.frombuffer(self._segment(index), ">i8", 1, at)[0])


def _first_where(lo: int, hi: int, reached: Callable[[int], bool]) -> int:
    """The first q in [lo, hi) where `reached(q)` holds (hi if none); `reached` must be
    monotone (false, then true)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if reached(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _read_units(path: Path, first: int, count: int) -> npt_units:
    with path.open("rb") as f:
        f.seek(first * UNIT_SIZE)
        data = f.read(count * UNIT_SIZE)
    return np.frombuffer(data[: len(data) - len(data) % UNIT_SIZE], UNIT_DTYPE)


def _count_valid(units: npt_units) -> int:
    """Units before the first that ends the data (size <= 0, or a negative offset)."""
    bad = (units["size"] <= 0) | (units["commitlog_offset"] < 0)
    return int(np.argmax(bad)) if bad.any() else len(units)


def this_boot_id() -> str | None:
    """This host's boot id (None where the kernel gives none): what `LocalFiles` match."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None
