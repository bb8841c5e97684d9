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

IndexService names files by creation time, `yyyyMMddHHmmssSSS` in UTC, strictly
increasing even if the clock is not; the newest file takes the writes.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from array import array
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from store.errors import CorruptEntry, StoreError
from store.fileio import fsync_dir
from store.message import java_string_hash

__all__ = [
    "DEFAULT_ENTRY_COUNT",
    "DEFAULT_SLOT_COUNT",
    "ENTRY_SIZE",
    "HEADER_SIZE",
    "IndexFile",
    "IndexService",
    "build_key",
    "index_key_hash",
]

HEADER = struct.Struct(">qqqqii")
SLOT = struct.Struct(">i")
ENTRY = struct.Struct(">iqii")
HEADER_SIZE = HEADER.size
SLOT_SIZE = SLOT.size
ENTRY_SIZE = ENTRY.size
assert (HEADER_SIZE, SLOT_SIZE, ENTRY_SIZE) == (40, 4, 20)

DEFAULT_SLOT_COUNT = 5_000_000
DEFAULT_ENTRY_COUNT = 20_000_000
_INVALID_INDEX = 0
_I32_MAX = 0x7FFFFFFF
_NAME_LEN = 17  # yyyyMMddHHmmssSSS


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def index_key_hash(key: str) -> int:
    """RocketMQ's indexKeyHashMethod: `Math.abs(key.hashCode())`, 0 for Integer.MIN_VALUE."""
    h = java_string_hash(key)
    return 0 if h == -0x80000000 else abs(h)


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
        diff_s = (store_timestamp_ms - self.begin_timestamp_ms) // 1000
        diff_s = min(max(diff_s, 0), _I32_MAX)
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

    def repair_slots(self) -> bool:
        """After a crash: rebuild the slot table from the entries if it points past them.

        Writes after the last flush may have reached the disk in any order, so a
        slot can name an entry the header does not count (its chain would be cut
        off). Entries below `indexCount` were flushed with the header and are
        trusted. Returns whether it rebuilt anything.
        """
        slots = array("i", self._mm[HEADER_SIZE : self._entries_at])
        if SLOT.pack(1) != array("i", [1]).tobytes():
            slots.byteswap()
        if max(slots) < self.index_count and min(slots) >= 0:
            return False
        self._mm[HEADER_SIZE : self._entries_at] = bytes(self._entries_at - HEADER_SIZE)
        used = 0
        raw = self._mm[
            self._entries_at + ENTRY_SIZE : self._entries_at + self.index_count * ENTRY_SIZE
        ]
        for number, (key_hash, _, _, _) in enumerate(ENTRY.iter_unpack(raw), start=1):
            slot_at = HEADER_SIZE + (key_hash % self.slot_count) * SLOT_SIZE
            if SLOT.unpack_from(self._mm, slot_at)[0] == _INVALID_INDEX:
                used += 1
            SLOT.pack_into(self._mm, slot_at, number)
        self.hash_slot_count = used
        HEADER.pack_into(self._mm, 0, *self.header())
        return True

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


def _name_for(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, UTC)
    return stamp.strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"


def _ms_of(name: str) -> int:
    stamp = datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    return int(stamp.timestamp()) * 1000 + int(name[14:])


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class IndexService:
    """The index files under `<root>/index/`, oldest first; the last one takes writes."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        slot_count: int = DEFAULT_SLOT_COUNT,
        entry_count: int = DEFAULT_ENTRY_COUNT,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.directory = Path(root) / "index"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.slot_count = slot_count
        self.entry_count = entry_count
        self._clock_ms = clock_ms
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
        current = self._writable(len(keys))
        for key in keys:
            if not current.put(build_key(topic, key), phy_offset, store_timestamp_ms):
                current = self._writable(1)
                current.put(build_key(topic, key), phy_offset, store_timestamp_ms)
        return True

    def _writable(self, needed: int) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is not None and (last.room >= needed or (last.entries == 0 and last.room > 0)):
            return last
        if last is not None:
            last.flush()  # a full file is sealed durably before its successor takes writes
        return self._create()

    def _create(self) -> IndexFile:
        ms = self._clock_ms()
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

    def truncate_to_commitlog_offset(self, phy_offset: int) -> int:
        """Drop index data for messages at or after `phy_offset`; returns where to re-index from.

        Deletes every file whose `endPhyOffset >= phy_offset` (whole files: an index
        cannot be cut inside) and repairs the slot table of the new last file if the
        crash left it inconsistent. Returns the smallest physical offset whose
        messages must be put again (`end_phy_offset + 1` of what is kept, 0 if
        nothing); `put_message` skips messages that are already indexed.
        """
        while self.files and self.files[-1].entries and self.files[-1].end_phy_offset >= phy_offset:
            self.files.pop().destroy()
        while self.files and self.files[-1].entries == 0:
            self.files.pop().destroy()
        if self.files and self.files[-1].repair_slots():
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
