"""Where the analytics read committed messages: a cluster (gRPC) or a node's files.

Every store answers the same questions:

- `queues(topic)`: every (topic, queue id) with its [min, max) queue offsets, where
  max is the committed (dispatched) end on the replica or directory asked;
- `read(topic, queue_id, start, end, columns)`: the messages at queue offsets
  [start, end) of one queue, as Arrow record batches (`analytics.codec`);
- `read_piece(piece, columns)`: the messages of several queues (each with its
  own offset range) that lie in one commit-log range [piece.start, piece.end):
  how a read of most of the log goes, one pass over the bytes, in log order;
- `unit_span(slices)`: the commit-log range the messages of `slices` occupy
  (for cutting the log into pieces);
- `offsets_for_times(queries)`: per (topic, queue, timestamp), the first queue
  offset stored at or after it (binary search on store timestamps).

Every message is checked against what it was read for (size, commit-log offset,
topic, queue id, queue offset, layout: `analytics.codec`) before it becomes a
row; anything else raises `CorruptEntry`.

`OfflineStore` reads a node's data directory without modifying it: consume-queue
files (20-byte units, only ever written for committed messages, the data ending
at the first unit with size <= 0) give each message's commit-log offset X and
size, and the message is `segment[X - start : X - start + size]` of the data
segment holding X, memory-mapped read-only (one mapping per segment and piece,
so each page is faulted in once). A stopped node (or a copy) is read up to the
end of its queues. A *live* node on the same host is read the same way, but only
below the bounds that node reported (`LiveBounds`, from its QueueOffsets answer:
dispatched queue ends, and the commit-log position below which its data files
hold everything), so nothing uncommitted or half-written is ever read.

`ServerStore` uses the DLedgerClient service directly (its own stubs: no leader
discovery is needed, since every replica serves its committed prefix). Planning
asks `QueueOffsets`. A piece is read with `ReadUnits` (the units of its queues
within the piece's range) then `ReadLog` (the raw entries, streamed in 4 MiB
chunks, decoded here); a one-queue read uses `Pull(raw=True)`. When a replica
runs on this host and the caller may read its files (the answer to QueueOffsets
says where they are, `LocalFiles`; same boot id, same directory by device and
inode), its files are read directly instead, below the bounds that replica
reported; the planner hands the files it was offered to the partitions, which
ask the servers only when those are not on their host or not far enough.
Replicas answer only below their committed position; one that is behind the
planned end is waited for (committed data reaches every replica) and an
unreachable one is failed over. Queue offsets and commit-log positions are the
same on every replica, so a read resumes on another server where it stopped.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import pyarrow as pa

from analytics.codec import COLUMNS, Expected, Int64s, Ints, decode, empty_batch, walk
from analytics.errors import SourceError
from store.consume_queue import UNIT_DTYPE, UNIT_SIZE
from store.entry_format import HEADER_SIZE
from store.errors import CorruptEntry
from store.message import STORE_TIMESTAMP_POS

if TYPE_CHECKING:
    from dledger_commitlog.client import Access

SYSTEM_TOPIC_PREFIX = "%SYS%"  # dispatch's system topics (consumer offsets): not user data
_UNITS_PER_READ = 1 << 18
_PULL_BYTES = 8 << 20
_PULL_MESSAGES = 65_536
BATCH_ROWS: Final = 262_144  # rows per record batch: Spark ingests big batches faster
_LOG_CHUNK = 4 << 20
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_RETRIED_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED"})
_FLUSH_WAIT_S = 3.0  # a local replica's files lag its committed end by about a flush interval
npt_units = np.ndarray[Any, Any]  # a structured array of store.consume_queue.UNIT_DTYPE
npt_ints = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int  # one past the last committed message


@dataclass(frozen=True, slots=True)
class GroupOffset:
    topic: str
    queue_id: int
    offset: int  # the next offset the group will consume; -1: nothing committed


@dataclass(frozen=True, slots=True)
class Slice:
    """Queue offsets [start, end) of one queue."""

    topic: str
    queue_id: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class LogPiece:
    """The messages of `queues` (each within its offsets) at commit-log offsets
    [start, end): what one Spark partition reads when the log is cut by range."""

    start: int
    end: int
    queues: tuple[Slice, ...]


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
        return cls(lf.data_dir, lf.boot_id, lf.dir_device, lf.dir_inode,
                   LiveBounds(queues, lf.log_file_end))  # fmt: skip

    def open(self, need: Sequence[Slice]) -> OfflineStore | None:
        """The store of these files if they are on this host and hold `need`; else None."""
        if self.boot_id != _boot_id():
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


class MessageStore(Protocol):
    def queues(self, topic: str = "") -> list[QueueInfo]: ...

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = COLUMNS,
    ) -> Iterator[pa.RecordBatch]: ...

    def close(self) -> None: ...


def open_store(
    servers: Sequence[str] = (),
    path: str | None = None,
    timeout_s: float = 30.0,
    prefer: int = 0,
    access: Access | None = None,
    local_reads: bool = True,
) -> ServerStore | OfflineStore:
    if path:
        return OfflineStore(path)
    return ServerStore(
        servers, timeout_s=timeout_s, prefer=prefer, access=access, local_reads=local_reads
    )


class _Units:
    """Consume-queue units of several queues, one row per message, with what each row
    is expected to be (queue, offset, topic)."""

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = tuple(topics)
        self._code = {t: i for i, t in enumerate(self.topics)}
        self._parts: list[tuple[int, int, int, npt_units]] = []

    def add(self, topic: str, queue_id: int, first: int, units: npt_units) -> None:
        if len(units):
            self._parts.append((self._code[topic], queue_id, first, units))

    def arrays(self) -> tuple[Int64s, Ints, Ints, Ints, Int64s]:
        """offsets, sizes, topic codes, queue ids, queue offsets (in the order added)."""
        if not self._parts:
            z64, z32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
            return z64, z32, z32, z32, z64
        offsets = np.concatenate([u["commitlog_offset"] for *_, u in self._parts]).astype(np.int64)
        sizes = np.concatenate([u["size"] for *_, u in self._parts]).astype(np.int32)
        codes = np.concatenate([np.full(len(u), c, np.int32) for c, _, _, u in self._parts])
        qids = np.concatenate([np.full(len(u), q, np.int32) for _, q, _, u in self._parts])
        qoffs = np.concatenate(
            [np.arange(f, f + len(u), dtype=np.int64) for _, _, f, u in self._parts]
        )
        return offsets, sizes, codes, qids, qoffs


@dataclass(slots=True)
class _Rows:
    """Rows to decode, in the order they will be read."""

    offsets: Int64s
    sizes: Ints
    expected: Expected = field(repr=False)

    @classmethod
    def of(cls, units: _Units, order: str = "log") -> _Rows:
        offsets, sizes, codes, qids, qoffs = units.arrays()
        if order == "log" and len(offsets):
            perm = np.argsort(offsets, kind="stable")
            offsets, sizes, codes, qids, qoffs = (
                offsets[perm],
                sizes[perm],
                codes[perm],
                qids[perm],
                qoffs[perm],
            )
        exp = Expected(
            sizes=sizes,
            commitlog_offsets=offsets,
            topics=units.topics,
            topic_codes=codes,
            queue_ids=qids,
            queue_offsets=qoffs,
        )
        return cls(offsets, sizes, exp)

    def __len__(self) -> int:
        return len(self.offsets)


def _batches(n: int, rows: int = BATCH_ROWS) -> Iterator[slice]:
    """Row ranges of about `rows` (a short tail joins the batch before it)."""
    lo = 0
    while lo < n:
        hi = n if n - lo < rows + rows // 2 else lo + rows
        yield slice(lo, hi)
        lo = hi


# ---------------------------------------------------------------- files


class _NotHere(Exception):
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
                raise _NotHere(f"{topic}/{queue_id}: this replica has not dispatched {end} yet")

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
        return _span(
            (s, self._checked_units(s.topic, s.queue_id, s.start, s.start + 1),
             self._checked_units(s.topic, s.queue_id, s.end - 1, s.end))
            for s in slices
            if s.start < s.end
        )  # fmt: skip

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
            raise _NotHere(
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
        bounds are checked at once (`_NotHere`), before anything is read."""
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
            units = _Units([topic])
            hi = min(end, q + _UNITS_PER_READ)
            units.add(topic, queue_id, q, self._checked_units(topic, queue_id, q, hi))
            rows = _Rows.of(units, order="queue")
            floor = int(self._starts[0]) if len(self._starts) else None
            if floor is None or int(rows.offsets[0]) < floor:
                raise SourceError(
                    f"{where}: queue offset {q} points at commit-log offset "
                    f"{int(rows.offsets[0])}, which retention deleted"
                )
            self._check_file_end(rows.offsets + rows.sizes)
            yield from self._decode(rows, columns)

    def piece_rows(self, piece: LogPiece) -> _Rows:
        """The units of `piece`: its queues' units whose messages lie in its range."""
        units = _Units(sorted({s.topic for s in piece.queues}))
        for s in piece.queues:
            if s.start >= s.end:
                continue
            self._check_live(s.topic, s.queue_id, s.end)
            a = self._first_at(s.topic, s.queue_id, s.start, s.end, piece.start)
            b = self._first_at(s.topic, s.queue_id, a, s.end, piece.end)
            for q in range(a, b, _UNITS_PER_READ):
                hi = min(b, q + _UNITS_PER_READ)
                units.add(s.topic, s.queue_id, q, self._checked_units(s.topic, s.queue_id, q, hi))
        rows = _Rows.of(units, order="queue")
        self._check_file_end(rows.offsets + rows.sizes)
        return rows

    def read_piece(self, piece: LogPiece, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        return self._decode(self.piece_rows(piece), columns)

    def _decode(self, rows: _Rows, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Rows grouped by data segment (each mapped once), in batches of about BATCH_ROWS."""
        if not len(rows):
            return
        seg = self._segment_index(rows.offsets)
        groups: list[tuple[int, Int64s | slice]]
        if seg[0] == seg[-1] and (seg == seg[0]).all():
            groups = [(int(seg[0]), slice(0, len(rows)))]
        else:
            perm = np.argsort(seg, kind="stable")
            cuts = [0, *(np.flatnonzero(np.diff(seg[perm])) + 1).tolist(), len(rows)]
            groups = [(int(seg[perm[a]]), perm[a:b]) for a, b in itertools.pairwise(cuts)]
        for index, take in groups:
            base = int(self._starts[index])
            buf = self._segment(index)
            where = str(self._segments[index][1])
            offsets = rows.offsets[take]
            whole_group = isinstance(take, slice)
            exp = rows.expected if whole_group else rows.expected.take(take)
            for part in _batches(len(offsets)):
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
                _first_where(info.min_offset, info.max_offset,
                             lambda q: self._timestamp(topic, queue_id, q) >= ts)  # noqa: B023
            )  # fmt: skip
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


def _span(ends: Any) -> tuple[int, int, int] | None:
    """(lowest offset, highest end, estimated bytes) over (slice, first unit, last unit)."""
    lo, hi, size = None, None, 0
    for s, first, last in ends:
        a = int(first["commitlog_offset"][0])
        b = int(last["commitlog_offset"][0]) + int(last["size"][0])
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
        mean = (int(first["size"][0]) + int(last["size"][0])) / 2 + HEADER_SIZE
        size += int((s.end - s.start) * mean)
    return None if lo is None or hi is None else (lo, hi, size)


# ---------------------------------------------------------------- servers


class ServerStore:
    """Reads committed messages from the servers (any replica; see the module doc)."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        timeout_s: float = 30.0,
        prefer: int = 0,
        pull_bytes: int = _PULL_BYTES,
        access: Access | None = None,
        local_reads: bool = True,
    ) -> None:
        """`access`: TLS and credentials of a secured cluster (default: neither);
        `local_reads`: read a replica on this host from its files (default)."""
        from dledger_commitlog.client import Access  # lazily: grpc only when reading servers

        self.access = access or Access()
        self.servers = [s.strip() for s in servers if s.strip()]
        if not self.servers:
            raise SourceError("no servers: give the `servers` option (host:port,...) or a path")
        self.timeout_s = timeout_s
        self.pull_bytes = pull_bytes
        self.local_reads = local_reads
        self._first = prefer % len(self.servers)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}
        self.last_path = ""  # how the last piece was read: "files", "rpc" or "pull"
        self.offered: LocalFiles | None = None  # by the last QueueOffsets of every queue

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            from proto import dledger_pb2_grpc as pb_grpc

            channel = self.access.channel(address, _CHANNEL_OPTIONS)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.DLedgerClientStub(channel)
        return stub

    def _call(self, method: str, request: Any, what: str, attempt_s: float = 10.0) -> Any:
        """One RPC on the preferred server, failing over to the others until the deadline."""
        return self._attempts(
            lambda stub, timeout: getattr(stub, method)(
                request, timeout=timeout, metadata=self.access.metadata(method)
            ),
            what,
            attempt_s,
        )

    def _attempts(self, call: Callable[[Any, float], Any], what: str, attempt_s: float) -> Any:
        import grpc

        deadline = time.monotonic() + self.timeout_s
        errors: dict[str, str] = {}
        backoff = 0.05
        while True:
            for k in range(len(self.servers)):
                address = self.servers[(self._first + k) % len(self.servers)]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    response = call(self._stub(address), min(attempt_s, remaining))
                except grpc.RpcError as exc:
                    code = getattr(exc.code(), "name", str(exc.code()))
                    details = exc.details() or code
                    if code not in _RETRIED_CODES:
                        why = f"{what}: {address} answered {code}: {details}"
                        raise _RpcFailed(why, code) from None
                    errors[address] = f"{code}: {details}"
                    continue
                self._first = (self._first + k) % len(self.servers)  # stick to what works
                return response
            if time.monotonic() + backoff >= deadline:
                tried = "; ".join(f"{a}: {e}" for a, e in errors.items()) or "no attempt"
                raise SourceError(f"{what}: no server answered in {self.timeout_s:g}s ({tried})")
            time.sleep(backoff + random.uniform(0, backoff))
            backoff = min(backoff * 2, 1.0)

    def queues(self, topic: str = "") -> list[QueueInfo]:
        from proto import dledger_pb2 as pb

        response = self._call("QueueOffsets", pb.QueueOffsetsRequest(topic=topic), "QueueOffsets")
        if not topic:
            self.offered = LocalFiles.of(response)
        found = [
            QueueInfo(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in response.queues
        ]
        return sorted(found, key=lambda q: (q.topic, q.queue_id))

    def group_offsets(self, group: str, topic: str) -> list[GroupOffset]:
        from proto import dledger_pb2 as pb

        request = pb.FetchOffsetRequest(group=group, topic=topic, queue_id=-1)
        response = self._call("FetchOffset", request, f"FetchOffset {group} {topic}")
        return [GroupOffset(o.topic, o.queue_id, o.offset) for o in response.offsets]

    def offsets_for_times(self, queries: Sequence[tuple[str, int, int]]) -> list[int]:
        from proto import dledger_pb2 as pb

        if not queries:
            return []
        request = pb.OffsetsForTimesRequest(
            queries=[pb.TimeQuery(topic=t, queue_id=q, timestamp_ms=ts) for t, q, ts in queries]
        )
        return list(self._call("OffsetsForTimes", request, "OffsetsForTimes").offsets)

    # -- local replicas ---------------------------------------------------------------

    def local_replica(
        self, need: Sequence[Slice] = (), hint: LocalFiles | None = None
    ) -> OfflineStore | None:
        """The files of a replica on this host that has dispatched `need`, if the caller
        may read them (see the module doc); None: read through the RPCs. `hint`: the
        files the planner was offered (tried first, without asking any server)."""
        if not self.local_reads or _boot_id() is None:
            return None
        if hint is not None:
            local = hint.open(need)
            if local is not None:
                return local
        import grpc

        from proto import dledger_pb2 as pb

        for k in range(len(self.servers)):
            address = self.servers[(self._first + k) % len(self.servers)]
            try:
                response = self._stub(address).QueueOffsets(
                    pb.QueueOffsetsRequest(),
                    timeout=5,
                    metadata=self.access.metadata("QueueOffsets"),
                )
            except grpc.RpcError:  # not this one
                continue
            offered = LocalFiles.of(response)
            local = offered.open(need) if offered is not None else None
            if local is not None:
                return local
        return None

    def _local_rows(
        self, piece: LogPiece, hint: LocalFiles | None
    ) -> tuple[OfflineStore, _Rows] | None:
        """A local replica and the rows of `piece` its files hold now (waiting briefly for
        its flush to reach them), or None."""
        deadline = time.monotonic() + _FLUSH_WAIT_S
        while True:
            local = self.local_replica(piece.queues, hint)
            if local is None:
                return None
            try:
                return local, local.piece_rows(piece)
            except (_NotHere, OSError):
                local.close()
                if time.monotonic() >= deadline:
                    return None
            hint = None  # ask the servers for fresher bounds
            time.sleep(0.05)

    # -- reading ----------------------------------------------------------------------

    def read_piece(
        self, piece: LogPiece, columns: Sequence[str], hint: LocalFiles | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The messages of a log piece: from a local replica's files, else ReadUnits +
        ReadLog, else (a caller who may not read every topic) Pull per queue."""
        found = self._local_rows(piece, hint)
        if found is not None:
            local, rows = found
            self.last_path = "files"
            try:
                yield from local._decode(rows, columns)
            finally:
                local.close()
            return
        rows = self._piece_rows(piece)
        try:
            self.last_path = "rpc"
            yield from self._read_rows(rows, columns)
        except _RpcFailed as exc:
            if exc.code != "PERMISSION_DENIED":
                raise SourceError(str(exc)) from None
            self.last_path = "pull"  # no right to the raw log: one queue at a time
            for s, a, b in _queue_ranges(rows, piece):
                yield from self.read(s.topic, s.queue_id, a, b, columns)

    def _piece_rows(self, piece: LogPiece) -> _Rows:
        """The units of `piece` (ReadUnits), from a replica that has dispatched its queues'
        planned ends (waiting for a lagging one)."""
        from proto import dledger_pb2 as pb

        wanted = [s for s in piece.queues if s.start < s.end]
        request = pb.ReadUnitsRequest(
            queues=[pb.QueueRange(topic=s.topic, queue_id=s.queue_id, start_offset=s.start,
                                  end_offset=s.end) for s in wanted],
            from_pos=piece.start,
            to_pos=piece.end,
        )  # fmt: skip
        by_key = {(s.topic, s.queue_id): s for s in wanted}
        deadline = time.monotonic() + self.timeout_s
        while True:
            answers = self._attempts(
                lambda stub, timeout: list(
                    stub.ReadUnits(
                        request, timeout=timeout, metadata=self.access.metadata("ReadUnits")
                    )
                ),
                f"ReadUnits for commit-log range [{piece.start}, {piece.end})",
                attempt_s=30.0,
            )
            units = _Units(sorted({s.topic for s in wanted}))
            behind = None
            for a in answers:
                s = by_key[(a.topic, a.queue_id)]
                if a.max_offset < s.end:
                    behind = f"{a.topic}/{a.queue_id} ends at {a.max_offset}, planned {s.end}"
                    break
                if a.min_offset > s.start:
                    raise SourceError(
                        f"{a.topic}/{a.queue_id}: offsets {s.start}..{a.min_offset - 1} were "
                        "deleted by retention before this query read them"
                    )
                units.add(a.topic, a.queue_id, a.first_offset,
                          np.frombuffer(a.units, UNIT_DTYPE))  # fmt: skip
            if behind is None:
                return _Rows.of(units, order="log")
            if time.monotonic() > deadline:
                raise SourceError(f"no replica reached the planned end in {self.timeout_s:g}s "
                                  f"({behind})")  # fmt: skip
            self._first = (self._first + 1) % len(self.servers)
            time.sleep(0.1)

    def _read_rows(self, rows: _Rows, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Rows in log order, their bytes streamed by ReadLog into one buffer per batch."""
        if not len(rows):
            return
        stream = _LogStream(self, int(rows.offsets[0]) - HEADER_SIZE,
                            int(rows.offsets[-1] + rows.sizes[-1]))  # fmt: skip
        try:
            for part in _batches(len(rows)):
                offsets = rows.offsets[part]
                first = int(offsets[0]) - HEADER_SIZE
                end = int(offsets[-1] + rows.sizes[part][-1])
                data = stream.fill(first, end)
                exp = rows.expected if part == slice(0, len(rows)) else rows.expected.take(part)
                yield decode(data, offsets - first, columns, exp, where=f"ReadLog from {first}")
        finally:
            stream.close()

    def _pull_request(
        self, topic: str, queue_id: int, start: int, end: int, wait_ms: int = 0
    ) -> Any:
        from proto import dledger_pb2 as pb

        return pb.PullRequest(
            topic=topic,
            queue_id=queue_id,
            queue_offset=start,
            max_messages=min(end - start, _PULL_MESSAGES),
            tag_expression="*",
            wait_ms=wait_ms,
            raw=True,
            max_bytes=self.pull_bytes,
            end_offset=end,
        )

    def _send_pull(self, request: Any) -> Callable[[], Any]:
        """Send a Pull now; the function returned waits for its answer (failing over if need be).

        Reads keep one Pull in flight while they decode the previous answer.
        """
        import grpc

        what = f"Pull {request.topic}/{request.queue_id} at {request.queue_offset}"
        attempt_s = 10.0 + request.wait_ms / 1000
        address = self.servers[self._first]
        try:
            future = self._stub(address).Pull.future(
                request, timeout=attempt_s, metadata=self.access.metadata("Pull")
            )
        except grpc.RpcError:
            future = None

        def answer() -> Any:
            if future is not None:
                try:
                    return future.result()
                except grpc.RpcError as exc:
                    code = getattr(exc.code(), "name", str(exc.code()))
                    if code not in _RETRIED_CODES:
                        details = exc.details() or code
                        raise SourceError(f"{what}: {address} answered {code}: {details}") from None
                    self._first = (self._first + 1) % len(self.servers)
            return self._call("Pull", request, what, attempt_s=attempt_s)

        return answer

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = COLUMNS,
        hint: LocalFiles | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """One queue's messages [start, end): a local replica's files, else Pull."""
        if start >= end:
            return
        local = self.local_replica([Slice(topic, queue_id, start, end)], hint)
        if local is not None:
            try:
                batches = local.read(topic, queue_id, start, end, columns)
            except (_NotHere, OSError):  # its files do not hold it all yet: the servers
                batches = None
            if batches is not None:
                self.last_path = "files"
                try:
                    yield from batches
                finally:
                    local.close()
                return
            local.close()
        self.last_path = "pull"
        yield from self._pull(topic, queue_id, start, end, columns)

    def _pull(
        self, topic: str, queue_id: int, start: int, end: int, columns: Sequence[str]
    ) -> Iterator[pa.RecordBatch]:
        q = start
        waited_since: float | None = None
        held: list[tuple[bytes, Int64s]] = []  # answers not yet decoded: one batch of several
        held_rows = 0
        pending = self._send_pull(self._pull_request(topic, queue_id, q, end))
        while q < end:
            response = pending()
            raw = response.raw_messages
            if not raw:
                # This replica has not committed (dispatched) up to `end` yet: the
                # planner saw a replica further ahead. Long-poll, then try another.
                now = time.monotonic()
                if waited_since is None:
                    waited_since = now
                elif now - waited_since > self.timeout_s:
                    raise SourceError(
                        f"{topic}/{queue_id}: no replica served queue offset {q} within "
                        f"{self.timeout_s:g}s, though it was planned as committed"
                    )
                self._first = (self._first + 1) % len(self.servers)
                pending = self._send_pull(self._pull_request(topic, queue_id, q, end, 500))
                continue
            if q < response.next_offset < end:  # the next answer travels while this decodes
                nxt = response.next_offset
                pending = self._send_pull(self._pull_request(topic, queue_id, nxt, end))
            waited_since = None
            where = f"Pull {topic}/{queue_id} at {q}"
            starts = walk(raw, where)
            if len(starts) > end - q:  # a server that ignored end_offset
                starts = starts[: end - q]
            if response.next_offset != q + len(starts) and len(starts) < end - q:
                raise SourceError(
                    f"{where}: {len(starts)} messages but next offset {response.next_offset}"
                )
            held.append((raw, starts))
            held_rows += len(starts)
            q += len(starts)
            if held_rows >= BATCH_ROWS or q >= end:
                yield _decode_held(held, topic, queue_id, q - held_rows, columns)
                held, held_rows = [], 0

    def unit_span(self, slices: Sequence[Slice]) -> tuple[int, int, int] | None:
        """As OfflineStore.unit_span, from the units at the ends of each slice (ReadUnits)."""
        from proto import dledger_pb2 as pb

        wanted = [s for s in slices if s.start < s.end]
        if not wanted:
            return None
        ranges = []
        for s in wanted:
            ranges.append(
                pb.QueueRange(
                    topic=s.topic, queue_id=s.queue_id, start_offset=s.start, end_offset=s.start + 1
                )
            )
            ranges.append(pb.QueueRange(topic=s.topic, queue_id=s.queue_id,
                                        start_offset=s.end - 1, end_offset=s.end))  # fmt: skip
        request = pb.ReadUnitsRequest(queues=ranges)
        answers = self._attempts(
            lambda stub, timeout: list(
                stub.ReadUnits(request, timeout=timeout, metadata=self.access.metadata("ReadUnits"))
            ),
            "ReadUnits (planning)",
            attempt_s=30.0,
        )
        got = [np.frombuffer(a.units, UNIT_DTYPE) for a in answers if a.units]
        if len(got) != len(ranges):  # a replica behind the planner, or retention
            return None
        return _span((s, got[2 * k], got[2 * k + 1]) for k, s in enumerate(wanted))


class _RpcFailed(SourceError):
    """A server refused a call (not a failure worth another server)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class _LogStream:
    """ReadLog from `start` to `end`, delivered into the byte ranges `fill` asks for.

    Chunks are taken off the wire undecoded (`_chunk_fields` finds the bytes in
    the message) and copied once, into a buffer reused from batch to batch (what
    `decode` builds never points into it). A broken stream is resumed on another
    server at the first entry of the range being filled; a replica whose
    committed end is short of `end` (it lags the planner) is waited for, then
    another is tried.
    """

    def __init__(self, store: ServerStore, start: int, end: int) -> None:
        self.store = store
        self.end = end
        self._pos = start  # next byte the stream will deliver
        self._chunk: tuple[int, memoryview] | None = None  # received, not all consumed
        self._it: Iterator[bytes] | None = None
        self._call: Any = None
        self._waited_since: float | None = None
        self._buf = np.empty(0, np.uint8)

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._call = self._it = None

    def _open(self, pos: int) -> None:
        from proto import dledger_pb2 as pb

        self.close()
        store = self.store
        address = store.servers[store._first]
        store._stub(address)  # opens the channel
        call = store._channels[address].unary_stream(
            "/dledger.v1.DLedgerClient/ReadLog",
            request_serializer=pb.ReadLogRequest.SerializeToString,
            response_deserializer=None,  # raw bytes: `_chunk_fields` reads them
        )
        request = pb.ReadLogRequest(from_pos=pos, end_pos=self.end, chunk_bytes=_LOG_CHUNK)
        self._call = call(
            request, timeout=max(60.0, store.timeout_s), metadata=store.access.metadata("ReadLog")
        )
        self._it = iter(self._call)
        self._pos = pos

    def _next(self, resume: int) -> tuple[int, memoryview]:
        """The next chunk; on a failure, resume at `resume` (an entry start)."""
        import grpc

        while True:
            if self._it is None:
                self._open(resume)
            assert self._it is not None
            try:
                raw = next(self._it)
            except StopIteration:
                # This replica's committed end came first: it lags. Wait, then another.
                self._lagging(f"ReadLog stopped at {self._pos} before {self.end}")
                self.close()
                continue
            except grpc.RpcError as exc:
                code = getattr(exc.code(), "name", str(exc.code()))
                address = self.store.servers[self.store._first]
                if code not in _RETRIED_CODES:
                    raise _RpcFailed(f"ReadLog: {address} answered {code}: "
                                     f"{exc.details() or code}", code) from None  # fmt: skip
                self._lagging(f"ReadLog: {address}: {code}")
                self.close()
                continue
            self._waited_since = None
            pos, data = _chunk_fields(raw)
            self._pos = pos + len(data)
            return pos, data

    def _lagging(self, why: str) -> None:
        now = time.monotonic()
        if self._waited_since is None:
            self._waited_since = now
        elif now - self._waited_since > self.store.timeout_s:
            raise SourceError(f"{why}; no replica served it within {self.store.timeout_s:g}s")
        self.store._first = (self.store._first + 1) % len(self.store.servers)
        time.sleep(0.1)

    def fill(self, first: int, end: int) -> pa.Buffer:
        """Bytes [first, end) of the log (`first`: where an entry starts, at or after
        everything asked before), valid until the next call."""
        size = end - first
        if len(self._buf) < size:
            self._buf = np.empty(max(size, 2 * len(self._buf)), np.uint8)
        buf = self._buf
        at = first  # [first, at) is filled
        while at < end:
            if self._chunk is None:
                self._chunk = self._next(resume=first)
            pos, data = self._chunk
            if pos > at:
                raise AssertionError(f"ReadLog delivered {pos} where {at} was due")
            if pos + len(data) <= at:  # before what is needed (a gap between batches)
                self._chunk = None
                continue
            n = min(end, pos + len(data)) - at
            buf[at - first : at - first + n] = np.frombuffer(data, np.uint8, n, at - pos)
            at += n
            if pos + len(data) <= end:
                self._chunk = None
        return pa.py_buffer(buf[:size])


def _varint(raw: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = raw[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _chunk_fields(raw: bytes) -> tuple[int, memoryview]:
    """`pos` and `data` of a serialized ReadLogChunk, the bytes not copied."""
    pos, data, i = 0, memoryview(raw)[0:0], 0
    while i < len(raw):
        key, i = _varint(raw, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(raw, i)
            if field == 1:
                pos = value
        elif wire == 2:
            n, i = _varint(raw, i)
            if field == 2:
                data = memoryview(raw)[i : i + n]
            i += n
        else:
            raise SourceError(f"ReadLog answered a field of wire type {wire}: not ReadLogChunk")
    return pos, data


def _queue_ranges(rows: _Rows, piece: LogPiece) -> Iterator[tuple[Slice, int, int]]:
    """Per queue of the piece, the queue offsets [a, b) its rows cover."""
    exp = rows.expected
    assert exp.topics is not None and exp.topic_codes is not None
    assert exp.queue_ids is not None and exp.queue_offsets is not None
    for s in piece.queues:
        code = exp.topics.index(s.topic) if s.topic in exp.topics else -1
        mine = (exp.topic_codes == code) & (exp.queue_ids == s.queue_id)
        if mine.any():
            offs = exp.queue_offsets[mine]
            yield s, int(offs.min()), int(offs.max()) + 1


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _decode_held(
    held: list[tuple[bytes, Int64s]], topic: str, queue_id: int, first: int, columns: Sequence[str]
) -> pa.RecordBatch:
    """Several Pull answers (consecutive in the queue) as one record batch."""
    where = f"Pull {topic}/{queue_id} from {first}"
    expected = Expected(topic=topic, queue_id=queue_id, first_queue_offset=first)
    if len(held) == 1:
        raw, starts = held[0]
        return decode(raw, starts, columns, expected, where)
    shifted, base = [], 0
    for raw, starts in held:
        shifted.append(starts + base)
        base += len(raw)
    return decode(b"".join(r for r, _ in held), np.concatenate(shifted), columns, expected, where)


__all__ = [
    "BATCH_ROWS",
    "SYSTEM_TOPIC_PREFIX",
    "GroupOffset",
    "LiveBounds",
    "LocalFiles",
    "LogPiece",
    "MessageStore",
    "OfflineStore",
    "QueueInfo",
    "ServerStore",
    "Slice",
    "empty_batch",
    "open_store",
]
