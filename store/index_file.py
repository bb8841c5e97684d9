"""IndexFile and IndexService: RocketMQ's on-disk hash index from `topic#key` to offsets.

An index file is a big-endian, memory-mapped, sparse file:

    header (40 bytes): beginTimestamp i64 | endTimestamp i64 | beginPhyOffset i64
                       | endPhyOffset i64 | hashSlotCount i32 | indexCount i32
    slot_count slots (4 bytes): the newest entry number whose key hashes there
    entry_count entries (20 bytes): keyHash i32 | phyOffset i64
                       | timeDiff i32 (seconds since beginTimestamp) | prevIndex i32

Entry numbers start at 1 (entry 0 is never used, 0 means "none"), so, as in
RocketMQ, a file of `entry_count` entries holds `entry_count - 1` keys; `indexCount`
is one more than the number of entries, `hashSlotCount` counts used slots. A key
hashes as `abs(java hashCode("topic#key"))` and lives in slot `hash % slot_count`;
each entry links to the previous entry of its slot, so a chain is newest first.

Invariants: entries are appended in commit-log order, so `phyOffset` grows along
entry numbers and `endPhyOffset` is the last message indexed; all keys of one
message go to one file (the service rolls before a message that does not fit),
so a file's `endPhyOffset` covers whole messages. `endTimestamp` is the largest
store timestamp seen (RocketMQ keeps the last; under clock skew the max is what
makes the per-file time filter safe). Queries compare hashes only: callers check
the keys (and exact timestamps) of the messages they read back.

The index is a pure function of the committed log: IndexService names a file by
the store timestamp of the first message put into it (`yyyyMMddHHmmssSSS` in UTC,
at least one millisecond after the previous file's name, so names strictly
increase even when store timestamps do not), and truncation cuts a file in place
back to exactly the bytes a fresh build of the kept messages writes. Deleting the
index and rebuilding it from the same log prefix gives the same names and bytes.
The newest file takes the writes.

Dispatch indexes a batch at once (`IndexService.put_batch`, `IndexFile.put_many`):
keys come as their hashes (`topic_key_hashes`, from the message batch's key
columns), slots and chains are worked out for the whole run of entries that goes
to one file, the entries are written with one copy and the header once. The
files are byte for byte those `put_message` of each message writes.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from store.errors import CorruptEntry, StoreError
from store.fileio import fsync_dir, mkdir_durably
from store.message import java_string_hash
from store.message_batch import POW31_U32

__all__ = [
    "DEFAULT_ENTRY_COUNT",
    "DEFAULT_SLOT_COUNT",
    "ENTRY_SIZE",
    "HEADER_SIZE",
    "IndexFile",
    "IndexService",
    "build_key",
    "index_key_hash",
    "topic_key_hashes",
]

HEADER = struct.Struct(">qqqqii")
SLOT = struct.Struct(">i")
ENTRY = struct.Struct(">iqii")
ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"),
                        ("prev_index", ">i4")])  # fmt: skip
I64s = npt.NDArray[np.int64]
HEADER_SIZE = HEADER.size
SLOT_SIZE = SLOT.size
ENTRY_SIZE = ENTRY.size
assert (HEADER_SIZE, SLOT_SIZE, ENTRY_SIZE) == (40, 4, 20) == (40, 4, ENTRY_DTYPE.itemsize)

DEFAULT_SLOT_COUNT = 5_000_000
DEFAULT_ENTRY_COUNT = 20_000_000
_INVALID_INDEX = 0
_I32_MAX = 0x7FFFFFFF
_NAME_LEN = 17  # yyyyMMddHHmmssSSS
_MAX_NAME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: names keep 17 digits
_SWAP = sys.byteorder == "little"  # array() is host order, the file big-endian
_CHUNK_ENTRIES = 1 << 16  # entries per read when scanning a column
_VALIDATE_ENTRIES = 1 << 18  # a crash loses at most the entries written since a flush
_FEW_ENTRIES = 24  # fewer keys than this are put in Python (numpy costs per call)
_UNDO_COST = 4  # undoing one put costs about as much as re-putting this many slots
_ZERO_CHUNK = 1 << 20
_ZERO_WINDOW = 16 << 20  # past this many bytes beyond the header's count, stop at zeros


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def index_key_hash(key: str) -> int:
    """RocketMQ's indexKeyHashMethod: `Math.abs(key.hashCode())`, 0 for Integer.MIN_VALUE."""
    h = java_string_hash(key)
    return 0 if h == -0x80000000 else abs(h)


def topic_key_hashes(
    topics: Sequence[str], topic_index: I64s, key_hash: I64s, key_units: I64s
) -> I64s:
    """`index_key_hash(build_key(topics[t], key))` for keys given by the topic they go
    with, their Java hashCode (unsigned 32-bit) and their length in UTF-16 units:
    hashCode(a + b) = hashCode(a) * 31^len(b) + hashCode(b), mod 2^32."""
    prefix = np.array([java_string_hash(build_key(t, "")) & 0xFFFFFFFF for t in topics], np.uint32)
    whole = prefix[topic_index] * POW31_U32[key_units] + key_hash.astype(np.uint32)
    signed = whole.view(np.int32).astype(np.int64)
    hashes: I64s = np.where(signed == -(1 << 31), 0, np.abs(signed))
    return hashes


class IndexFile:
    """One memory-mapped index file; not thread-safe (one dispatcher writes it)."""

    def __init__(
        self, path: str | os.PathLike[str], slot_count: int, entry_count: int, *, create: bool
    ) -> None:
        if slot_count <= 0 or entry_count <= 1:
            raise ValueError("slot_count must be positive and entry_count above 1")
        self.path = Path(path)
        self.slot_count = slot_count
        self.entry_count = entry_count
        self._entries_at = HEADER_SIZE + slot_count * SLOT_SIZE
        size = self._entries_at + entry_count * ENTRY_SIZE
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o644)
        try:
            if create:
                os.ftruncate(fd, size)  # sparse: blocks are allocated as slots and entries fill
            elif os.fstat(fd).st_size != size:
                raise StoreError(
                    f"{self.path}: {os.fstat(fd).st_size} bytes, expected {size} for "
                    f"{slot_count} slots and {entry_count} entries"
                )
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        fields: tuple[int, int, int, int, int, int] = HEADER.unpack_from(self._mm, 0)
        self.begin_timestamp_ms: int = fields[0]
        self.end_timestamp_ms: int = fields[1]
        self.begin_phy_offset: int = fields[2]
        self.end_phy_offset: int = fields[3]
        self.hash_slot_count: int = fields[4]
        self.index_count: int = fields[5]
        if self.index_count <= 0:
            self.index_count = 1
        if self.index_count > entry_count or not 0 <= self.hash_slot_count <= slot_count:
            raise CorruptEntry(str(self.path), 0, f"header out of range: {self.header()}")

    # -- state -----------------------------------------------------------------

    def header(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.begin_timestamp_ms,
            self.end_timestamp_ms,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    @property
    def entries(self) -> int:
        """Number of entries stored."""
        return self.index_count - 1

    @property
    def room(self) -> int:
        """Number of entries that still fit."""
        return self.entry_count - self.index_count

    def is_full(self) -> bool:
        return self.index_count >= self.entry_count

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether [begin_ms, end_ms] overlaps this file's time span (seconds granularity)."""
        if self.entries == 0:
            return False
        return begin_ms <= self.end_timestamp_ms + 999 and end_ms >= self.begin_timestamp_ms

    # -- writing ---------------------------------------------------------------

    def put(self, key: str, phy_offset: int, store_timestamp_ms: int) -> bool:
        """Add `key` -> `phy_offset`; False (and nothing written) when the file is full."""
        count = self.index_count
        if count >= self.entry_count:
            return False
        mm = self._mm
        key_hash = index_key_hash(key)
        slot_at = HEADER_SIZE + (key_hash % self.slot_count) * SLOT_SIZE
        (head,) = SLOT.unpack_from(mm, slot_at)
        if head <= _INVALID_INDEX or head >= count:
            head = _INVALID_INDEX
        if count == 1:
            self.begin_timestamp_ms = store_timestamp_ms
            self.begin_phy_offset = phy_offset
        diff_s = _time_diff_s(store_timestamp_ms, self.begin_timestamp_ms)
        ENTRY.pack_into(
            mm, self._entries_at + count * ENTRY_SIZE, key_hash, phy_offset, diff_s, head
        )
        SLOT.pack_into(mm, slot_at, count)
        if head == _INVALID_INDEX:
            self.hash_slot_count += 1
        self.index_count = count + 1
        self.end_phy_offset = phy_offset
        self.end_timestamp_ms = max(self.end_timestamp_ms, store_timestamp_ms)
        HEADER.pack_into(mm, 0, *self.header())
        return True

    def put_many(self, key_hashes: I64s, phy_offsets: I64s, store_timestamps_ms: I64s) -> int:
        """`put` of each key (given by its `index_key_hash`), in order, while there is
        room; returns how many went in. Writes exactly what those puts write.

        Each entry links to the newest entry of its slot before it: the previous key
        of the batch in that slot, else the slot's head (if it names an entry below
        the count at that point, as `put` checks); each used slot ends up naming its
        last entry of the batch. Entries go in with one copy, the header once.
        """
        count = self.index_count
        m = min(len(key_hashes), self.entry_count - count)
        if m <= 0:
            return 0
        hashes, phys, times = key_hashes[:m], phy_offsets[:m], store_timestamps_ms[:m]
        if count == 1:
            self.begin_timestamp_ms = int(times[0])
            self.begin_phy_offset = int(phys[0])
        if m < _FEW_ENTRIES:
            self._put_few(hashes.tolist(), phys.tolist(), times.tolist())
        else:
            self._put_run(hashes, phys, times)
        self.index_count = count + m
        self.end_phy_offset = int(phys[-1])
        self.end_timestamp_ms = max(self.end_timestamp_ms, int(times.max()))
        HEADER.pack_into(self._mm, 0, *self.header())
        return m

    def _put_few(self, hashes: list[int], phys: list[int], times: list[int]) -> None:
        """Entries and slots of a few keys from the count on, as `put` writes them."""
        mm, count, slot_count = self._mm, self.index_count, self.slot_count
        at, begin = self._entries_at + count * ENTRY_SIZE, self.begin_timestamp_ms
        for key_hash, phy, ts in zip(hashes, phys, times, strict=True):
            slot_at = HEADER_SIZE + (key_hash % slot_count) * SLOT_SIZE
            (head,) = SLOT.unpack_from(mm, slot_at)
            if head <= _INVALID_INDEX or head >= count:
                head = _INVALID_INDEX
                self.hash_slot_count += 1
            ENTRY.pack_into(mm, at, key_hash, phy, _time_diff_s(ts, begin), head)
            SLOT.pack_into(mm, slot_at, count)
            count += 1
            at += ENTRY_SIZE

    def _put_run(self, hashes: I64s, phys: I64s, times: I64s) -> None:
        """`_put_few` with array operations: each entry's previous one in its slot is the
        batch's previous key there, else the slot's head (if below the count then)."""
        m, count = len(hashes), self.index_count
        numbers = np.arange(count, count + m, dtype=np.int64)
        slot = hashes % self.slot_count
        order = np.argsort(slot, kind="stable")
        sorted_slot = slot[order]
        again = sorted_slot[1:] == sorted_slot[:-1]  # order[k + 1] follows order[k] in a slot
        prev = np.empty(m, np.int64)
        prev[order[1:][again]] = numbers[order[:-1][again]]
        first = np.ones(m, np.bool_)
        first[order[1:][again]] = False
        first_at = np.flatnonzero(first)
        last_at = order[np.append(~again, True)]
        slots = np.frombuffer(self._mm, ">i4", self.slot_count, HEADER_SIZE)
        try:
            head = slots[slot[first_at]].astype(np.int64)
            head[(head <= _INVALID_INDEX) | (head >= numbers[first_at])] = _INVALID_INDEX
            prev[first_at] = head
            slots[slot[last_at]] = numbers[last_at]
        finally:
            del slots  # a live view would keep the mapping from closing
        entries = np.empty(m, ENTRY_DTYPE)
        entries["key_hash"] = hashes
        entries["phy_offset"] = phys
        entries["time_diff"] = _time_diffs_s(times, self.begin_timestamp_ms)
        entries["prev_index"] = prev
        at = self._entries_at + count * ENTRY_SIZE
        self._mm[at : at + m * ENTRY_SIZE] = entries.tobytes()
        self.hash_slot_count += int(np.count_nonzero(prev == _INVALID_INDEX))

    def repair_slots(self) -> bool:
        """After a crash: rebuild the slot table from the entries if it points past them.

        Writes after the last flush may have reached the disk in any order, so a
        slot can name an entry the header does not count (its chain would be cut
        off). Entries below `indexCount` were flushed with the header and are
        trusted. Returns whether it rebuilt anything.
        """
        slots = self._read_slots()
        if max(slots) < self.index_count and min(slots) >= 0:
            return False
        self._rebuild_slots(self.index_count)
        HEADER.pack_into(self._mm, 0, *self.header())
        return True

    def truncate(self, phy_offset: int, store_timestamp_of: Callable[[int], int]) -> bool:
        """Cut the file in place back to its messages below `phy_offset`; returns whether
        it changed anything.

        Afterwards the file is byte for byte what putting only the kept messages into
        a fresh file writes: every slot that names a removed entry goes back down its
        chain to the newest kept entry (undoing the puts newest first), removed
        entries are zeroed and the header is recomputed. `begin*` fields stay (the
        first entry is kept unless nothing is, and then the header is all zeros);
        `endTimestamp` is the largest store timestamp of the kept messages, read back
        through `store_timestamp_of(phy_offset)` for the few whose stored time diff
        is the largest (`CorruptEntry`, before anything is written, if one does not
        match its entry).

        Robust to a torn file. Entries beyond the header's `indexCount` are dropped
        (the caller puts their messages again) and zeroed; an entry the header counts
        but a crash lost (all zeros, or a phyOffset below its predecessor's; checked
        over the last `_VALIDATE_ENTRIES` kept) cuts the file before its message.
        Slots naming a dropped entry are walked back through `prevIndex` links; when
        a link does not hold up the slot table is rebuilt from the kept entries.

        Cost: a binary search, one read of the slot table, work proportional to the
        entries dropped (or, when most go, to those kept), and for `endTimestamp`
        usually one chunk of the diff column, else one pass over it.
        """
        count = self.index_count
        keep = self._first_entry_to_drop(phy_offset, count)
        end_timestamp_ms = self.end_timestamp_ms
        if 1 < keep < count:
            end_timestamp_ms = self._max_store_timestamp(keep, store_timestamp_of)
        changed = self._undo_slots(keep, count)
        changed |= self._zero_entries(keep, count)
        if keep == count and not changed:
            return False
        if keep <= 1:
            self.begin_timestamp_ms = self.end_timestamp_ms = 0
            self.begin_phy_offset = self.end_phy_offset = 0
            self.hash_slot_count = 0
            self.index_count = 1
            self._mm[:HEADER_SIZE] = bytes(HEADER_SIZE)  # as a fresh file
            return True
        self.end_timestamp_ms = end_timestamp_ms
        self.end_phy_offset = self._entry(keep - 1)[1]
        self.index_count = keep
        HEADER.pack_into(self._mm, 0, *self.header())
        return True

    # -- truncation helpers ------------------------------------------------------

    def _entry(self, number: int) -> tuple[int, int, int, int]:
        fields: tuple[int, int, int, int] = ENTRY.unpack_from(
            self._mm, self._entries_at + number * ENTRY_SIZE
        )
        return fields

    def _at(self, number: int) -> int:
        """Byte position of entry `number`."""
        return self._entries_at + number * ENTRY_SIZE

    def _column(self, first: int, end: int, at: int, code: str = "i") -> array[int]:
        """The field at byte `at` of entries [first, end), as host-order ints."""
        return _column(self._mm[self._at(first) : self._at(end)], at, code)

    def _read_slots(self) -> array[int]:
        slots = array("i", self._mm[HEADER_SIZE : self._entries_at])
        if _SWAP:
            slots.byteswap()
        return slots

    def _write_slots(self, slots: array[int]) -> None:
        if _SWAP:
            slots = array("i", slots)
            slots.byteswap()
        self._mm[HEADER_SIZE : self._entries_at] = slots.tobytes()

    def _first_entry_to_drop(self, phy_offset: int, count: int) -> int:
        """The first entry number in [1, count) to drop: phyOffset >= phy_offset, or lost
        in a crash, or after a lost one; count if none.

        Entries are in phyOffset order, so a binary search finds the cut. A crash can
        only have lost entries written since the last flush, so the last
        `_VALIDATE_ENTRIES` entries before the cut are checked: an all-zero entry or
        a phyOffset below its predecessor's is lost, and since it may have been a key
        of the message before it, the cut moves back to that message.
        """
        low, high = 1, count
        while low < high:
            mid = (low + high) // 2
            if self._entry(mid)[1] >= phy_offset:
                high = mid
            else:
                low = mid + 1
        lost = self._first_lost(max(1, low - _VALIDATE_ENTRIES), low)
        if lost is None:
            return low
        if lost == 1:
            return 1
        return self._first_entry_to_drop(self._entry(lost - 1)[1], lost)

    def _first_lost(self, first: int, end: int) -> int | None:
        """The first entry in [first, end) that is all zeros or breaks phyOffset order."""
        previous = self.begin_phy_offset if first == 1 else self._entry(first - 1)[1]
        for n in range(first, end, _CHUNK_ENTRIES):
            stop = min(end, n + _CHUNK_ENTRIES)
            raw = self._mm[self._at(n) : self._at(stop)]
            zero = _first_zero_entry(raw)
            phys = _column(raw, 4, "q")[:zero].tolist()
            if phys and (phys[0] < previous or phys != sorted(phys)):
                return n + next(
                    i for i, phy in enumerate(phys) if phy < (phys[i - 1] if i else previous)
                )
            if zero < stop - n:
                return n + zero
            previous = phys[-1]
        return None

    def _undo_slots(self, keep: int, count: int) -> bool:
        """Point every slot that names an entry >= `keep` at the newest kept entry of its
        chain and recount the used slots; returns whether a slot changed."""
        if (count - keep) * _UNDO_COST > keep:  # rebuilding from what is kept is cheaper
            self._rebuild_slots(keep)
            return True
        slots = self._read_slots()
        slot_count = self.slot_count
        changed: set[int] = set()
        for n in reversed(range(keep, count, _CHUNK_ENTRIES)):  # newest first, as put
            end = min(count, n + _CHUNK_ENTRIES)
            hashes = self._column(n, end, 0)[::-1]
            prevs = self._column(n, end, 16)[::-1]
            for number, key_hash, prev in zip(
                range(end - 1, n - 1, -1), hashes, prevs, strict=True
            ):
                slot = key_hash % slot_count
                if slots[slot] != number or not 0 <= prev < number:
                    continue  # not the head (a torn slot), or a torn entry: walked below
                if prev == 0 and key_hash == 0 and self._entry(number) == (0, 0, 0, 0):
                    continue
                slots[slot] = prev
                changed.add(slot)
        used = self.hash_slot_count - sum(1 for slot in changed if slots[slot] == 0)
        if max(slots) >= keep or min(slots) < 0:  # torn: slots name entries past the header
            used = -1  # the header's count no longer describes these slots: recount
            for slot, head in enumerate(slots):
                if not 0 <= head < keep:
                    resolved = self._walk_back(slot, head, keep)
                    if resolved is None:
                        self._rebuild_slots(keep)
                        return True
                    slots[slot] = resolved
                    changed.add(slot)
        for slot in changed:
            SLOT.pack_into(self._mm, HEADER_SIZE + slot * SLOT_SIZE, slots[slot])
        if used < 0:
            used = len(slots) - slots.count(_INVALID_INDEX)
        moved = bool(changed) or used != self.hash_slot_count
        self.hash_slot_count = used
        return moved

    def _walk_back(self, slot: int, head: int, keep: int) -> int | None:
        """Follow `prevIndex` from `head` to the first entry below `keep`; None when a
        link does not hold up (an entry out of range, lost, or of another slot)."""
        while head >= keep:  # prevIndex strictly decreases, so this ends
            if head >= self.entry_count:
                return None
            entry = self._entry(head)
            key_hash, prev = entry[0], entry[3]
            if entry == (0, 0, 0, 0) or key_hash < 0 or key_hash % self.slot_count != slot:
                return None
            if not 0 <= prev < head:
                return None
            head = prev
        return head if head >= 0 else None

    def _rebuild_slots(self, count: int) -> None:
        """Rebuild the slot table and `hashSlotCount` from entries [1, count)."""
        slots = array("i", bytes(self._entries_at - HEADER_SIZE))
        slot_count = self.slot_count
        for first in range(1, count, _CHUNK_ENTRIES):
            hashes = self._column(first, min(count, first + _CHUNK_ENTRIES), 0)
            for number, key_hash in enumerate(hashes, start=first):
                slots[key_hash % slot_count] = number
        self._write_slots(slots)
        self.hash_slot_count = len(slots) - slots.count(_INVALID_INDEX)

    def _zero_entries(self, keep: int, count: int) -> bool:
        """Zero entries from `keep` on: all up to `count`, and whatever a torn write left
        past it, up to the first all-zero chunk beyond a bounded window (the area past
        the header's count only ever receives writes made since it was flushed)."""
        mm = self._mm
        pos = self._at(keep)
        window_end = self._at(count) + _ZERO_WINDOW
        end = len(mm)
        changed = False
        while pos < end:
            n = min(_ZERO_CHUNK, end - pos)
            if mm[pos : pos + n].count(0) != n:
                mm[pos : pos + n] = bytes(n)
                changed = True
            elif pos >= window_end:
                break
            pos += n
        return changed

    def _max_store_timestamp(self, keep: int, store_timestamp_of: Callable[[int], int]) -> int:
        """The largest store timestamp among entries [1, keep).

        A stored time diff grows with the timestamp, so the largest timestamp is among
        the entries with the largest diff. That diff is usually the one of the old
        `endTimestamp` (an upper bound); otherwise one pass over the diff column finds
        it. Only the messages with that diff are read back, newest first, until the
        answer is certain (it is the old `endTimestamp`, or the top of its second).
        Chunks whose bytes do not even contain the diff are skipped unread.
        """
        begin = self.begin_timestamp_ms
        ranges = [(n, min(keep, n + _CHUNK_ENTRIES)) for n in range(1, keep, _CHUNK_ENTRIES)]
        ranges.reverse()
        bound = _time_diff_s(self.end_timestamp_ms, begin)
        if any(bound in self._column(n, end, 12) for n, end in self._holding(bound, ranges)):
            max_diff = bound
        else:
            max_diff = max(max(self._column(n, end, 12)) for n, end in ranges)
        certain = {self.end_timestamp_ms}  # the max over a superset of the kept entries
        if max_diff < _I32_MAX:
            certain.add(begin + max_diff * 1000 + 999)
        best = -(1 << 63)
        seen: set[int] = set()
        for n, end in self._holding(max_diff, ranges):
            diffs = self._column(n, end, 12)
            for i in range(len(diffs) - 1, -1, -1):
                if diffs[i] != max_diff:
                    continue
                phy = self._entry(n + i)[1]
                if phy in seen:
                    continue
                seen.add(phy)
                ts = store_timestamp_of(phy)
                if _time_diff_s(ts, begin) != max_diff:
                    raise CorruptEntry(
                        str(self.path),
                        n + i,
                        f"store timestamp {ts} of the message at {phy} does not give the "
                        f"entry's time diff, {max_diff} s after {begin}",
                    )
                best = max(best, ts)
                if best in certain:
                    return best
        return best

    def _holding(self, diff: int, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """The ranges whose bytes contain `diff` as a big-endian i32 somewhere."""
        pattern = SLOT.pack(diff)
        for n, end in ranges:
            if self._mm.find(pattern, self._at(n), self._at(end)) >= 0:
                yield n, end

    # -- reading ---------------------------------------------------------------

    def query(self, key: str, begin_ms: int, end_ms: int, max_count: int) -> list[int]:
        """Physical offsets whose key hash matches `key` and time may lie in range, newest first.

        An entry's time is known to the second, so it matches when
        [t, t + 999] overlaps [begin_ms, end_ms].
        """
        found: list[int] = []
        count = self.index_count
        if count <= 1 or max_count <= 0:
            return found
        mm = self._mm
        key_hash = index_key_hash(key)
        (number,) = SLOT.unpack_from(mm, HEADER_SIZE + (key_hash % self.slot_count) * SLOT_SIZE)
        begin_ts = self.begin_timestamp_ms
        seen = 0
        while _INVALID_INDEX < number < count and seen < count:
            seen += 1  # a corrupt chain can loop; it cannot be longer than the file
            read_hash, phy, diff_s, prev = ENTRY.unpack_from(
                mm, self._entries_at + number * ENTRY_SIZE
            )
            t = begin_ts + diff_s * 1000
            if read_hash == key_hash and begin_ms <= t + 999 and t <= end_ms:
                found.append(phy)
                if len(found) >= max_count:
                    break
            if prev >= number:
                break
            number = prev
        return found

    # -- lifecycle -------------------------------------------------------------

    def flush(self) -> None:
        """msync the whole mapping (blocking; call it off the event loop)."""
        self._mm.flush()

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def _time_diff_s(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    """An entry's timeDiff: whole seconds after the file's begin, clamped to [0, i32 max]."""
    return min(max((store_timestamp_ms - begin_timestamp_ms) // 1000, 0), _I32_MAX)


def _time_diffs_s(store_timestamps_ms: I64s, begin_timestamp_ms: int) -> I64s:
    """`_time_diff_s` of each timestamp (in Python ints where int64 could overflow)."""
    limit = 1 << 61
    low, high = int(store_timestamps_ms.min()), int(store_timestamps_ms.max())
    if max(abs(begin_timestamp_ms), abs(low), abs(high)) >= limit:
        return np.array([_time_diff_s(t, begin_timestamp_ms)
                         for t in store_timestamps_ms.tolist()], np.int64)  # fmt: skip
    diffs: I64s = np.minimum(np.maximum((store_timestamps_ms - begin_timestamp_ms) // 1000, 0),
                             _I32_MAX)  # fmt: skip
    return diffs


def _column(raw: bytes, at: int, code: str = "i") -> array[int]:
    """The big-endian field at byte `at` of every 20-byte entry in `raw`, in host order:
    `code` "i" for an i32, "q" for an i64."""
    n = len(raw) // ENTRY_SIZE
    width = 8 if code == "q" else 4
    col = bytearray(width * n)
    for j in range(width):
        col[j::width] = raw[at + j :: ENTRY_SIZE][:n]
    values = array(code, col)
    if _SWAP:
        values.byteswap()
    return values


def _first_zero_entry(raw: bytes) -> int:
    """Index of the first all-zero entry in `raw` (lost in a crash), else the count."""
    zero = bytes(ENTRY_SIZE)
    at = raw.find(zero)
    while at >= 0:
        if at % ENTRY_SIZE == 0:
            return at // ENTRY_SIZE
        at = raw.find(zero, at + ENTRY_SIZE - at % ENTRY_SIZE)
    return len(raw) // ENTRY_SIZE


def _name_for(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, UTC)
    return stamp.strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"


def _ms_of(name: str) -> int:
    stamp = datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    return int(stamp.timestamp()) * 1000 + int(name[14:])


def _no_timestamps(phy_offset: int) -> int:
    raise StoreError(f"cutting an index file needs the store timestamp of {phy_offset}")


class IndexService:
    """The index files under `<root>/index/`, oldest first; the last one takes writes."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        slot_count: int = DEFAULT_SLOT_COUNT,
        entry_count: int = DEFAULT_ENTRY_COUNT,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        """`clock_ms` is accepted for compatibility and unused: file names come from
        store timestamps, which keeps the index a pure function of the log."""
        del clock_ms
        self.directory = Path(root) / "index"
        mkdir_durably(self.directory)
        self.slot_count = slot_count
        self.entry_count = entry_count
        self.files: list[IndexFile] = []
        for path in sorted(self.directory.iterdir()):
            if len(path.name) == _NAME_LEN and path.name.isdigit():
                self.files.append(IndexFile(path, slot_count, entry_count, create=False))

    # -- state -----------------------------------------------------------------

    @property
    def end_phy_offset(self) -> int:
        """The physical offset of the last message indexed, -1 when nothing is."""
        for f in reversed(self.files):
            if f.entries:
                return f.end_phy_offset
        return -1

    @property
    def end_timestamp_ms(self) -> int:
        for f in reversed(self.files):
            if f.entries:
                return f.end_timestamp_ms
        return 0

    # -- writing ---------------------------------------------------------------

    def put_message(
        self, topic: str, keys: Sequence[str], phy_offset: int, store_timestamp_ms: int
    ) -> bool:
        """Index every key of one message; False if the message was indexed already.

        A message at or below `end_phy_offset` is skipped, which makes replay after
        recovery idempotent. Keys go to one file unless there are more than a file holds.
        """
        keys = [k for k in keys if k]
        if not keys or phy_offset <= self.end_phy_offset:
            return False
        current = self._writable(len(keys), store_timestamp_ms)
        for key in keys:
            if not current.put(build_key(topic, key), phy_offset, store_timestamp_ms):
                current = self._writable(1, store_timestamp_ms)
                current.put(build_key(topic, key), phy_offset, store_timestamp_ms)
        return True

    def put_batch(
        self, phy_offsets: I64s, store_timestamps_ms: I64s, key_counts: I64s, key_hashes: I64s
    ) -> int:
        """`put_message` of each message of a batch, in log order: message i has
        `key_counts[i]` keys, the next ones of `key_hashes` (their `index_key_hash`,
        see `topic_key_hashes`); returns how many messages were indexed.

        The same files, byte for byte: a message is skipped when it has no keys or its
        offset is not above the last one indexed, and the messages that fit the
        current file go into it with one `IndexFile.put_many`.
        """
        n = len(phy_offsets)
        if not n or not len(key_hashes):
            return 0
        has = key_counts > 0
        # The last offset indexed before each message: put_message's replay check.
        seen = np.maximum.accumulate(np.where(has, phy_offsets, -1))
        before = np.empty(n, np.int64)
        before[0] = -1
        before[1:] = seen[:-1]
        keep = has & (phy_offsets > np.maximum(before, self.end_phy_offset))
        if not keep.any():
            return 0
        owner = np.repeat(np.arange(n, dtype=np.int64), key_counts)
        kept = keep[owner]
        hashes, owner = key_hashes[kept], owner[kept]
        phys, times = phy_offsets[owner], store_timestamps_ms[owner]
        counts = key_counts[keep]
        ends = np.cumsum(counts)
        i = pos = 0
        while i < len(counts):
            need, ts = int(counts[i]), int(times[pos])
            current = self._writable(need, ts)
            if need <= current.room:  # the messages that fit go in together
                j = int(np.searchsorted(ends, pos + current.room, "right"))
                end = int(ends[j - 1])
                current.put_many(hashes[pos:end], phys[pos:end], times[pos:end])
                i, pos = j, end
                continue
            end = pos + need  # more keys than a file holds: they spill over, as put_message
            pos += current.put_many(hashes[pos:end], phys[pos:end], times[pos:end])
            while pos < end:
                current = self._writable(1, ts)
                pos += current.put_many(hashes[pos:end], phys[pos:end], times[pos:end])
            i += 1
        return len(counts)

    def _writable(self, needed: int, store_timestamp_ms: int) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is not None and last.entries == 0:
            # Created but never written (a crash in between): its name may come from a
            # message that is gone, so it is made again for this one.
            self.files.pop().destroy()
            last = self.files[-1] if self.files else None
        if last is not None and last.room >= needed:
            return last
        if last is not None:
            last.flush()  # a full file is sealed durably before its successor takes writes
        return self._create(store_timestamp_ms)

    def _create(self, store_timestamp_ms: int) -> IndexFile:
        """A new file named by the store timestamp of its first message."""
        ms = min(max(store_timestamp_ms, 0), _MAX_NAME_MS)
        if self.files:
            ms = max(ms, _ms_of(self.files[-1].path.name) + 1)
        f = IndexFile(
            self.directory / _name_for(ms), self.slot_count, self.entry_count, create=True
        )
        self.files.append(f)
        fsync_dir(self.directory)
        return f

    # -- reading ---------------------------------------------------------------

    def query(self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int) -> list[int]:
        """Candidate physical offsets for `topic#key` in [begin_ms, end_ms], newest first."""
        full_key = build_key(topic, key)
        found: list[int] = []
        for f in reversed(self.files):
            if len(found) >= max_count:
                break
            if f.is_time_matched(begin_ms, end_ms):
                found.extend(f.query(full_key, begin_ms, end_ms, max_count - len(found)))
        return found

    # -- recovery and retention --------------------------------------------------

    def truncate_to_commitlog_offset(
        self, phy_offset: int, store_timestamp_of: Callable[[int], int] | None = None
    ) -> int:
        """Drop index data for messages at or after `phy_offset`; returns where to re-index from.

        Files that begin at or after `phy_offset` (and files a crash left empty) are
        deleted; the file that straddles it is cut in place (`IndexFile.truncate`),
        which also repairs a file torn by the crash. `store_timestamp_of(phy)` gives
        the store timestamp of the message at `phy` (the caller reads it from the
        commit log); without it a straddling file is deleted whole, as before. Returns
        the smallest physical offset whose messages must be put again (`end_phy_offset
        + 1` of what is kept, 0 if nothing); `put_message` skips messages already
        indexed, so replaying from an earlier offset is harmless.
        """
        changed = False
        while self.files:
            last = self.files[-1]
            cut = store_timestamp_of is not None or last.end_phy_offset < phy_offset
            if last.entries and last.begin_phy_offset < phy_offset and cut:
                begin = last.begin_phy_offset
                changed |= last.truncate(phy_offset, store_timestamp_of or _no_timestamps)
                if last.entries:
                    break
                # Emptied by a torn first entry: the message it began with may have
                # started in the previous file (more keys than a file holds).
                phy_offset = begin
            self.files.pop().destroy()
        if changed and self.files:
            self.files[-1].flush()
        fsync_dir(self.directory)
        return self.end_phy_offset + 1

    def delete_below_commitlog_offset(self, phy_offset: int) -> int:
        """Delete files holding only messages below `phy_offset`; returns how many went."""
        gone = 0
        while self.files and self.files[0].entries and self.files[0].end_phy_offset < phy_offset:
            if len(self.files) == 1:
                break  # keep the newest file: it carries end_phy_offset for replay
            self.files.pop(0).destroy()
            gone += 1
        if gone:
            fsync_dir(self.directory)
        return gone

    # -- lifecycle -------------------------------------------------------------

    def flush(self) -> None:
        """msync the newest file (older ones were flushed when sealed); blocking."""
        if self.files:
            self.files[-1].flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
