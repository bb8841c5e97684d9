"""IndexFile: one memory-mapped index file (layout: `store.index_format`).

Invariants: entries are appended in commit-log order, so `phyOffset` grows along
entry numbers and `endPhyOffset` is the last message indexed. `endTimestamp` is
the largest store timestamp seen (RocketMQ keeps the last; under clock skew the
max is what makes the per-file time filter safe). Queries compare hashes only:
callers check the keys (and exact timestamps) of the messages they read back.

Dispatch indexes a batch at once (`IndexFile.put_many`): keys come as their
hashes, slots and chains are worked out for the whole run of entries, the
entries are written with one copy and the header once; the file is byte for byte
what `put` of each key writes.

After a crash, `truncate` cuts a file in place back to exactly the bytes a fresh
build of the kept messages writes, whatever a torn write left behind, and
`repair_slots` rebuilds a slot table that names entries past the header.
`flush` (fdatasync) may run in a worker thread beside the writer: it holds no
lock and not the GIL while the disk works.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from store.arrays import I64s
from store.errors import CorruptEntry, StoreError
from store.index_format import (
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    HEADER,
    HEADER_SIZE,
    I32_MAX,
    INVALID_INDEX,
    SLOT,
    SLOT_SIZE,
    SWAP,
    entry_column,
    first_zero_entry,
    index_key_hash,
    time_diff_s,
    time_diffs_s,
)

__all__ = ["IndexFile"]

_CHUNK_ENTRIES = 1 << 16  # entries per read when scanning a column
_VALIDATE_ENTRIES = 1 << 18  # a crash loses at most the entries written since a flush
_FEW_ENTRIES = 24  # fewer keys than this are put in Python (numpy costs per call)
_UNDO_COST = 4  # undoing one put costs about as much as re-putting this many slots
_ZERO_CHUNK = 1 << 20
_ZERO_WINDOW = 16 << 20  # past this many bytes beyond the header's count, stop at zeros


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
        if head <= INVALID_INDEX or head >= count:
            head = INVALID_INDEX
        if count == 1:
            self.begin_timestamp_ms = store_timestamp_ms
            self.begin_phy_offset = phy_offset
        diff_s = time_diff_s(store_timestamp_ms, self.begin_timestamp_ms)
        ENTRY.pack_into(
            mm, self._entries_at + count * ENTRY_SIZE, key_hash, phy_offset, diff_s, head
        )
        SLOT.pack_into(mm, slot_at, count)
        if head == INVALID_INDEX:
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
            if head <= INVALID_INDEX or head >= count:
                head = INVALID_INDEX
                self.hash_slot_count += 1
            ENTRY.pack_into(mm, at, key_hash, phy, time_diff_s(ts, begin), head)
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
            head[(head <= INVALID_INDEX) | (head >= numbers[first_at])] = INVALID_INDEX
            prev[first_at] = head
            slots[slot[last_at]] = numbers[last_at]
        finally:
            del slots  # a live view would keep the mapping from closing
        entries = np.empty(m, ENTRY_DTYPE)
        entries["key_hash"] = hashes
        entries["phy_offset"] = phys
        entries["time_diff"] = time_diffs_s(times, self.begin_timestamp_ms)
        entries["prev_index"] = prev
        at = self._entries_at + count * ENTRY_SIZE
        self._mm[at : at + m * ENTRY_SIZE] = entries.tobytes()
        self.hash_slot_count += int(np.count_nonzero(prev == INVALID_INDEX))

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
        return entry_column(self._mm[self._at(first) : self._at(end)], at, code)

    def _read_slots(self) -> array[int]:
        slots = array("i", self._mm[HEADER_SIZE : self._entries_at])
        if SWAP:
            slots.byteswap()
        return slots

    def _write_slots(self, slots: array[int]) -> None:
        if SWAP:
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
            zero = first_zero_entry(raw)
            phys = entry_column(raw, 4, "q")[:zero].tolist()
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
            used = len(slots) - slots.count(INVALID_INDEX)
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
        self.hash_slot_count = len(slots) - slots.count(INVALID_INDEX)

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
        bound = time_diff_s(self.end_timestamp_ms, begin)
        if any(bound in self._column(n, end, 12) for n, end in self._holding(bound, ranges)):
            max_diff = bound
        else:
            max_diff = max(max(self._column(n, end, 12)) for n, end in ranges)
        certain = {self.end_timestamp_ms}  # the max over a superset of the kept entries
        if max_diff < I32_MAX:
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
                if time_diff_s(ts, begin) != max_diff:
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
        while INVALID_INDEX < number < count and seen < count:
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
        """Make the file's bytes durable (blocking: call it off the event loop; any thread).

        An fdatasync of the file, not an msync of the mapping: Python's
        `mmap.flush` holds the GIL for as long as msync takes (a full file is
        hundreds of MB), which would stall the event loop even from a worker
        thread, while `os.fdatasync` lets it go. On Linux a shared mapping writes
        straight into the file's page cache, so syncing the file covers it. The
        descriptor is this call's own, so `close` or `destroy` on the writer's
        thread meanwhile is harmless; a file already deleted needs no flush.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
