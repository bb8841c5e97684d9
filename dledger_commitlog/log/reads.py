"""Read-side disk work of the client service, done in worker threads, off the event loop.

The node's asyncio loop runs Raft (heartbeats, elections with a 500 ms timeout),
so the reads that touch many messages (Pull, and the analytics reads ReadLog,
ReadUnits and OffsetsForTimes) never run their disk reads or per-message work
there. The loop takes a *snapshot* of what a read may see (`LogView`,
`QueueView`: positions, bounds, file names; `log_view` and `queue_view`, from the
commit log and the dispatcher), which is cheap and consistent,
and a worker thread does the rest with it. What a snapshot lets through is
committed: the committed position bounds every commit-log read, the dispatched
queue ends (`max_offset`, written only for committed messages) bound every
consume-queue read.

Thread safety. The threads never call into the dispatcher or the consume
queues, which have one writer (the loop). They read files through descriptors
(and read-only maps) of their own, opened by name for one call (`Files`): a
segment that retention deletes meanwhile stays readable through an open
descriptor or fails to open (reported as deleted), and a descriptor the loop
closes can never be one a thread reads. Segment files are preallocated and never
shrink, so a map cannot fault past a file's end. Commit-log bytes not yet in
the files (sync flush buffers appends until the flush thread writes them) are
read through the entry store's `MappedFileQueue.read`, which is thread-safe,
above the flushed position only.

Checks (`store.entry_format`'s, which every reader of entries runs). Every
message Pull serves is checked against its entry (magic, position, size, body
CRC). ReadLog serves raw entries: each is checked once per process (magic,
position, size, body CRC), and the ranges checked are remembered
(`VerifiedRanges`): committed bytes never change, so a second read of them is
served without a second CRC pass. A damaged entry raises `CorruptEntry` and is
never served.

Allocation. Pull handles its units as numpy arrays rather than an object each:
a thread that allocates many objects sets off garbage collections, which hold
the GIL, and with it the loop, for tens of milliseconds.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from store.consume_queue import UNIT_DTYPE, UNIT_SIZE
from store.entry_format import (
    ENTRY_MAGIC,
    FILLER,
    FILLER_MIN,
    HEADER,
    HEADER_SIZE,
    body_fault,
    entry_headers,
    header_fault,
    header_faults,
    is_filler,
)
from store.errors import CorruptEntry, InvalidMessage, OffsetOutOfRange
from store.mapped_file import segment_name
from store.message import STORE_TIMESTAMP_POS, decode_message, tags_hash_code

if TYPE_CHECKING:
    from dispatch.dispatcher import Dispatcher
    from dledger_commitlog.log.committed_view import CommittedView
    from store.mapped_file import MappedFileQueue

MAX_SCAN: Final = 16_384  # units one Pull looks at
READ_EACH_MAX: Final = 16  # read_messages reads at most this many one by one
MAX_UNITS_ANSWER: Final = 200_000  # units per ReadUnits answer (4 MB)
_I64: Final = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class LogView:
    """What a commit-log read may see, taken on the loop."""

    committed: int  # end of the committed prefix: nothing at or beyond it is read
    min_pos: int  # first retained byte
    file_end: int  # bytes below this are in the data files (flushed)
    segment_size: int
    segments: tuple[tuple[int, str], ...]  # (start, path), oldest first
    data: MappedFileQueue  # for bytes above file_end (thread-safe reads)

    def where(self, pos: int) -> str:
        start = pos - pos % self.segment_size
        return str(Path(self.segments[0][1]).parent / segment_name(start)) if self.segments else ""


@dataclass(frozen=True, slots=True)
class QueueView:
    """One consume queue's readable units, taken on the loop."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int  # dispatched (committed) end
    directory: str
    file_bytes: int
    files: tuple[int, ...]  # byte offsets (names) of its files, oldest first


def log_view(log: CommittedView) -> LogView:
    """The committed log's bounds and files now (on the loop)."""
    data = log.store.data_queue
    committed = log.committed_pos
    return LogView(
        committed=committed,
        min_pos=data.min_offset,
        file_end=min(log.store.flushed_position, committed),
        segment_size=data.segment_size,
        segments=tuple(data.segments()),
        data=data,
    )


def queue_view(
    dispatcher: Dispatcher, topic: str, queue_id: int, units_per_file: int
) -> QueueView | None:
    """One consume queue's bounds and files now (on the loop); None: no such queue."""
    cq = dispatcher.queue(topic, queue_id)
    if cq is None:
        return None
    return QueueView(
        topic=topic,
        queue_id=queue_id,
        min_offset=cq.min_offset,
        max_offset=cq.max_offset,
        directory=str(cq.directory),
        file_bytes=units_per_file * UNIT_SIZE,
        files=tuple(cq.file_starts()),
    )


class Files:
    """Descriptors (and read-only maps) of this call's own, opened by name, closed when
    the call ends. Segment files never shrink, so a map cannot fault past their end."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._maps: dict[str, mmap.mmap] = {}

    def __enter__(self) -> Files:
        return self

    def __exit__(self, *exc: object) -> None:
        for m in self._maps.values():
            with contextlib.suppress(BufferError):  # still viewed: closed when collected
                m.close()
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _fd(self, path: str, what: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                why = f"{what}: {path} was deleted (retention) before it was read"
                raise _Deleted(why) from None
            self._fds[path] = fd
        return fd

    def map(self, path: str, what: str) -> mmap.mmap:
        m = self._maps.get(path)
        if m is None:
            m = self._maps[path] = mmap.mmap(self._fd(path, what), 0, prot=mmap.PROT_READ)
        return m

    def pread(self, path: str, offset: int, size: int, what: str) -> bytes:
        fd = self._fd(path, what)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise CorruptEntry(path, offset, f"short read: {len(data)} of {size} bytes")
        return data


class _Deleted(OffsetOutOfRange):
    """A file of the snapshot that retention deleted before this read opened it."""

    def __init__(self, message: str) -> None:
        super().__init__(-1, 0, 0, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


# ---------------------------------------------------------------- commit log


def read_log(view: LogView, files: Files, pos: int, end: int) -> bytes:
    """Bytes [pos, end) of the commit log (end <= committed), from the files and,
    above the flushed position, from the store's buffers."""
    if pos < view.min_pos:
        raise OffsetOutOfRange(pos, view.min_pos, view.committed, "commit-log position")
    if end > view.committed:
        raise AssertionError(f"a read to {end} beyond the committed position {view.committed}")
    parts: list[bytes] = []
    first = view.segments[0][0] if view.segments else 0
    size = view.segment_size
    at = pos
    while at < min(end, view.file_end):
        i = (at - first) // size
        if not 0 <= i < len(view.segments) or view.segments[i][0] != at - at % size:
            raise OffsetOutOfRange(at, view.min_pos, view.committed, "commit-log position")
        start, path = view.segments[i]
        n = min(end, view.file_end, start + size) - at
        parts.append(files.pread(path, at - start, n, "commit log"))
        at += n
    if at < end:  # not flushed yet: the store's buffers (sync flush) or its files
        parts.append(view.data.read(at, end - at))
    return parts[0] if len(parts) == 1 else b"".join(parts)


class VerifiedRanges:
    """Commit-log ranges [a, b) whose entries this process has checked, entry-aligned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._ends: list[int] = []

    def covering(self, pos: int) -> int:
        """The end of the checked range holding `pos` (pos itself if none does)."""
        with self._lock:
            i = bisect.bisect_right(self._starts, pos) - 1
            if i >= 0 and self._ends[i] > pos:
                return self._ends[i]
            return pos

    def next_start(self, pos: int) -> int | None:
        """The start of the first checked range after `pos`."""
        with self._lock:
            i = bisect.bisect_right(self._starts, pos)
            return self._starts[i] if i < len(self._starts) else None

    def add(self, a: int, b: int) -> None:
        if a >= b:
            return
        with self._lock:
            i = bisect.bisect_left(self._ends, a)  # first range that ends at or after a
            j = bisect.bisect_right(self._starts, b)  # ranges from i to j-1 touch [a, b)
            if i < j:
                a = min(a, self._starts[i])
                b = max(b, self._ends[j - 1])
            self._starts[i:j] = [a]
            self._ends[i:j] = [b]


def read_log_checked(
    view: LogView, verified: VerifiedRanges, pos: int, want: int, end: int
) -> bytes:
    """About `want` raw bytes of the log from `pos` (pos < end <= committed), every entry
    in them checked, now or earlier by this process (`verified`).

    Bytes not checked before are read whole entries at a time: there `pos` must
    be where an entry starts (InvalidMessage otherwise), and the answer ends
    where an entry ends, past `pos + want` (or `end`) if an entry reaches beyond,
    never past the committed position. Bytes checked before are cut anywhere.
    """
    with Files() as files:
        stop = min(pos + want, end)
        known = verified.covering(pos)  # [pos, known) was checked before
        if known >= stop:
            return read_log(view, files, pos, stop)
        # `known` is where an entry starts: the end of a checked range, or `pos`.
        nxt = verified.next_start(known)
        limit = stop if nxt is None else min(stop, nxt)
        head = read_log(view, files, pos, known) if known > pos else b""
        body, upto = _check_entries(view, files, known, limit, asked=known == pos)
        verified.add(known, upto)
        return head + body


def _check_entries(
    view: LogView, files: Files, pos: int, limit: int, asked: bool
) -> tuple[bytes, int]:
    """Read and check whole entries from `pos` until one ends at or after `limit`.

    `asked`: `pos` is the caller's; no entry starting there is its mistake
    (InvalidMessage), not damage."""
    seg = view.segment_size
    # One read for the bulk; the last entry may need a second.
    end = min(view.committed, max(limit, pos + HEADER_SIZE))
    buf = read_log(view, files, pos, end)
    at = pos
    while at < limit:
        off = at - pos
        if off + HEADER_SIZE > len(buf):
            more = min(view.committed, at + HEADER_SIZE)
            if more - pos > len(buf):
                buf += read_log(view, files, pos + len(buf), more)
        if off + FILLER_MIN > len(buf):
            raise CorruptEntry(view.where(at), at, "the committed log ends inside an entry")
        magic, size = FILLER.unpack_from(buf, off)
        if is_filler(magic, size, at, seg):
            if at + size > len(buf) + pos:  # the filler's zeros: no need to read them
                buf += read_log(view, files, pos + len(buf), min(view.committed, at + size))
            at += size
            continue
        # At the caller's position, no entry's magic or position there is their mistake.
        theirs = at == pos and asked
        if off + HEADER_SIZE > len(buf):
            if theirs and magic != ENTRY_MAGIC:
                raise InvalidMessage(f"no entry starts at commit-log position {at}")
            raise CorruptEntry(view.where(at), at, "the committed log ends inside an entry")
        _, size, index, _term, epos, _kind, _chain, body_crc, body_len = HEADER.unpack_from(
            buf, off
        )
        fault = header_fault(magic, size, epos, body_len, at)
        if fault is not None:
            if theirs and (magic != ENTRY_MAGIC or epos != at):
                raise InvalidMessage(f"no entry starts at commit-log position {at}")
            raise CorruptEntry(view.where(at), at, fault)
        if at + size > view.committed:
            raise CorruptEntry(
                view.where(at),
                at,
                f"entry of {size} bytes reaches past the committed position {view.committed}",
            )
        if off + size > len(buf):
            buf += read_log(view, files, pos + len(buf), at + size)
        fault = body_fault(memoryview(buf)[off + HEADER_SIZE : off + size], body_crc, index)
        if fault is not None:
            raise CorruptEntry(view.where(at), at, fault)
        at += size
    return (buf if at - pos == len(buf) else buf[: at - pos]), at


# ---------------------------------------------------------------- consume queues


def read_units(q: QueueView, files: Files, start: int, end: int) -> bytes:
    """Raw units [start, end) of the queue (min_offset <= start <= end <= max_offset)."""
    if not q.min_offset <= start <= end <= q.max_offset:
        raise OffsetOutOfRange(start, q.min_offset, q.max_offset, "consume queue offset")
    parts = []
    at = start * UNIT_SIZE
    stop = end * UNIT_SIZE
    while at < stop:
        file_start = at - at % q.file_bytes
        if file_start not in q.files:
            raise _Deleted(
                f"consume queue {q.topic}/{q.queue_id}: the file holding offset "
                f"{at // UNIT_SIZE} is gone (retention)"
            )
        n = min(stop, file_start + q.file_bytes) - at
        path = os.path.join(q.directory, segment_name(file_start))
        parts.append(files.pread(path, at - file_start, n, f"consume queue {q.topic}"))
        at += n
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _unit_offset(q: QueueView, files: Files, offset: int) -> int:
    return int(_I64.unpack(read_units(q, files, offset, offset + 1)[:8])[0])


def _first_unit_at(q: QueueView, files: Files, lo: int, hi: int, phy: int) -> int:
    """The first queue offset in [lo, hi) whose message lies at >= `phy` (hi if none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if _unit_offset(q, files, mid) >= phy:
            hi = mid
        else:
            lo = mid + 1
    return lo


def units_between(
    q: QueueView, start: int, end: int, from_pos: int, to_pos: int
) -> tuple[int, int]:
    """The queue offsets [a, b) within [start, end) whose messages lie in [from_pos, to_pos)
    (to_pos 0: no bound); binary searches on the units (offsets rise along a queue)."""
    with Files() as files:
        a = _first_unit_at(q, files, start, end, from_pos) if from_pos > 0 else start
        b = _first_unit_at(q, files, a, end, to_pos) if to_pos > 0 else end
        return a, b


def units_chunk(q: QueueView, start: int, end: int) -> bytes:
    """Units [start, end) of one answer (the caller keeps it to MAX_UNITS_ANSWER):
    an answer is read only when the one before it has gone out."""
    with Files() as files:
        return read_units(q, files, start, end)


def offset_for_time(q: QueueView, view: LogView, timestamp_ms: int) -> int:
    """The first queue offset whose message's store timestamp is >= `timestamp_ms`, by
    binary search (the queue's end when none is)."""
    with Files() as files:
        lo, hi = q.min_offset, q.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            phy = _unit_offset(q, files, mid)
            at = phy + STORE_TIMESTAMP_POS
            if phy < view.min_pos or at + 8 > view.committed:
                raise OffsetOutOfRange(phy, view.min_pos, view.committed, "commit-log offset")
            stamp = _I64.unpack(read_log(view, files, at, at + 8))[0]
            if stamp >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo


# ---------------------------------------------------------------- Pull


@dataclass(frozen=True, slots=True)
class Found:
    """What a Pull found: messages (with their units' sizes) and where the next starts."""

    sizes: list[int]
    messages: list[bytes]
    next_offset: int


def pull_scan(
    q: QueueView | None,
    view: LogView,
    offset: int,
    max_messages: int,
    tags: frozenset[str] | None,
    *,
    max_bytes: int,
    end_offset: int = 0,
    max_scan: int = MAX_SCAN,
) -> Found:
    """Messages of one queue from `offset`, and the offset the next Pull starts at.

    Units whose tag hash does not match are skipped without reading the message,
    matches are compared exactly; at most `max_messages`, about `max_bytes` (at
    least one), at most `max_scan` units looked at, none at or beyond `end_offset`
    (when > 0). OffsetOutOfRange outside [min, max] of the queue. Units are handled as numpy
    arrays, not an object each: a thread that allocates many objects sets off
    garbage collections, which hold the GIL, and so the loop, for tens of ms.
    """
    if q is None:
        if offset != 0:
            raise OffsetOutOfRange(offset, 0, 0, "offset of an empty queue")
        return Found([], [], 0)
    if offset < q.min_offset or offset > q.max_offset:
        raise OffsetOutOfRange(
            offset, q.min_offset, q.max_offset, f"queue offset in {q.topic}/{q.queue_id}"
        )
    hi = q.max_offset if end_offset <= 0 else min(q.max_offset, end_offset)
    hi = min(hi, offset + max_scan)
    if hi <= offset or max_messages <= 0:
        return Found([], [], offset)
    with Files() as files:
        units = np.frombuffer(read_units(q, files, offset, hi), UNIT_DTYPE)
        offsets = units["commitlog_offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        if tags is None:
            # Every unit until max_messages, or max_bytes (at least one) is reached.
            fits = int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right"))
            k = min(max(1, fits), max_messages, len(units))
            chosen = np.arange(k)
            nxt = offset + k
        else:
            chosen, nxt = _by_tags(view, files, offset, units, tags, max_messages, max_bytes)
        offsets, sizes = offsets[chosen], sizes[chosen]
        if len(offsets) and int((offsets + sizes).max()) > view.committed:
            raise AssertionError(
                f"a queue unit of {q.topic}/{q.queue_id} points beyond committed {view.committed}"
            )
        return Found(sizes.tolist(), read_messages(view, files, offsets, sizes), nxt)


def _by_tags(
    view: LogView,
    files: Files,
    offset: int,
    units: npt.NDArray[np.void],
    tags: frozenset[str],
    max_messages: int,
    max_bytes: int,
) -> tuple[npt.NDArray[np.int64], int]:
    """The units whose message has one of `tags` (hash first, then exactly): indexes, next."""
    codes = np.asarray(sorted({tags_hash_code(t) for t in tags}), np.int64)
    hashed = np.isin(units["tags_code"].astype(np.int64), codes)
    sizes = units["size"].astype(np.int64).tolist()
    offsets = units["commitlog_offset"].astype(np.int64).tolist()
    chosen: list[int] = []
    total = 0
    nxt = offset
    for i in range(len(sizes)):
        if len(chosen) >= max_messages or (chosen and total + sizes[i] > max_bytes):
            break
        nxt += 1
        if not hashed[i]:
            continue
        one = read_messages(view, files, np.asarray([offsets[i]]), np.asarray([sizes[i]]))
        if decode_message(one[0]).tags not in tags:
            continue
        chosen.append(i)
        total += sizes[i]
    return np.asarray(chosen, np.int64), nxt


def read_messages(
    view: LogView, files: Files, offsets: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> list[bytes]:
    """The messages at `offsets` (rising), each checked against its entry (magic,
    position, size, body CRC). Those in the data files come from one read-only map
    per segment (only the pages they lie on are touched; a queue's messages are
    spread over everyone's), their entry headers checked in one numpy pass; those
    above the flushed position from the store's buffers. A few (READ_EACH_MAX) are
    read one by one instead: numpy's and a map's fixed cost outweigh theirs."""
    out: list[bytes] = []
    if not len(offsets):
        return out
    starts = offsets - HEADER_SIZE
    ends = offsets + sizes
    if int(starts.min()) < view.min_pos:
        raise OffsetOutOfRange(
            int(offsets.min()), view.min_pos + HEADER_SIZE, view.committed, "commit-log offset"
        )
    if len(offsets) <= READ_EACH_MAX:
        each = zip(starts.tolist(), sizes.tolist(), strict=True)
        return [_read_one(view, files, at, n) for at, n in each]
    first = view.segments[0][0] if view.segments else 0
    group = (starts - first) // view.segment_size
    group[ends > view.file_end] = -1  # not all in the files yet
    cuts = (np.flatnonzero(np.diff(group)) + 1).tolist()
    for a, b in itertools.pairwise([0, *cuts, len(offsets)]):
        index = int(group[a])
        if index >= 0:
            if index >= len(view.segments):
                raise OffsetOutOfRange(
                    int(starts[a]), view.min_pos, view.committed, "commit-log position"
                )
            base, path = view.segments[index]
            data: bytes | mmap.mmap = files.map(path, "commit log")
        else:
            base = int(starts[a])
            data = read_log(view, files, base, int(ends[b - 1]))
        rel = starts[a:b] - base
        head = entry_headers(data, rel)
        bad = header_faults(head, starts[a:b], sizes[a:b])
        if bad.any():
            i = int(np.argmax(bad))
            at = int(starts[a + i])
            raise CorruptEntry(
                view.where(at),
                at,
                f"no entry of {int(sizes[a + i])} bytes "
                "starts here, though a consume-queue unit points at it",
            )
        for o, n, want, index, at in zip(
            (rel + HEADER_SIZE).tolist(),
            sizes[a:b].tolist(),
            head["body_crc"].tolist(),
            head["index"].tolist(),
            starts[a:b].tolist(),
            strict=True,
        ):
            body = data[o : o + n]
            fault = body_fault(body, want, index)
            if fault is not None:
                raise CorruptEntry(view.where(at), at, fault)
            out.append(body)
    return out


def _read_one(view: LogView, files: Files, at: int, size: int) -> bytes:
    """The message of `size` bytes in the entry at `at`, checked as `read_messages` checks."""
    entry = read_log(view, files, at, at + HEADER_SIZE + size)
    magic, length, index, _term, pos, _kind, _chain, body_crc, body_len = HEADER.unpack_from(entry)
    if header_fault(magic, length, pos, body_len, at) is not None or body_len != size:
        raise CorruptEntry(
            view.where(at),
            at,
            f"no entry of {size} bytes starts here, though a consume-queue unit points at it",
        )
    body = entry[HEADER_SIZE:]
    fault = body_fault(body, body_crc, index)
    if fault is not None:
        raise CorruptEntry(view.where(at), at, fault)
    return body
