"""The entry store: DLedger's data + index files, serving as Raft's log and the commit log.

Owns `<dir>/data/` (entries, see entry_format) and `<dir>/index/` (32 bytes per
Raft index), plus `<dir>/entries.checkpoint`, a small record naming a committed,
flushed entry (index, term, pos, chainCrc) from which recovery scans. Invariants:

- Indexes are dense: entries `first_index()..last_index()` are stored; slot 0 of a
  fresh index is a zero sentinel so that `term(0) == 0`.
- Every entry's chainCrc links it to the one before; the data files are the truth
  and the index is rebuilt from them whenever the two disagree.
- `append` truncates a conflicting suffix first (Raft's log-matching repair); a
  truncated entry's bytes are zeroed, so nothing truncated reappears on reopen.
  Entries at or below the entry checkpoint are never truncated, with one
  exception: `roll_back_to`, for a node whose committed tail the cluster lost
  (async flush, see RaftNode's rollback marker), moves the checkpoint down first.
- The log starts after entry `first_index() - 1`: the zero sentinel (a log from
  index 1, at position 0) or `entries.base` (after a restore or retention: that
  entry's index, term, end position and chainCrc). Its first entry lies at the
  base's end, or after the filler there, or at the start of the first data file
  when retention deleted the file holding the base's end; it must chain from the
  base (or from 0), like every entry after it. The index slot of `first_index() - 1`
  is the sentinel, the real slot of the base entry, or one rebuilt from the base
  (position = its end, size 0): only its term is ever read.
- The index is buffered and fsynced only by `write_checkpoint` (and `roll_back_to`),
  so after a power loss only its slots up to the checkpointed entry are known to
  be on disk. Recovery scans from the checkpointed entry to the end, rebuilding
  the index from it, and trusts the index below it (spot-checked at both ends of
  that range). Without a checkpoint in the retained log (a young log, retention
  beyond the checkpoint, a restore), or when that spot check fails, it scans from
  the log's first entry and rebuilds the whole index from the data (comparing
  and rewriting only from the first slot that differs).
- A torn or corrupt tail is cut at the first bad entry (its bytes and all after
  it zeroed, as `truncate` does) with a warning naming file, position and index.
  A bad checkpointed entry raises CorruptEntry instead: it is the recovery
  anchor, and entries up to it may already have been dispatched and retained
  elsewhere, so only an operator (restoring the node's data from a replica)
  repairs them. Entries below it are not rescanned; every read checks the body
  CRC, so a damaged one fails its reads (CorruptEntry naming file and position)
  and is never served. A cut below the caller's committed index
  (`committed_index`, e.g. raft.state's commit) is allowed but reported: see
  `tail_cut` and `missing_through`; the node must then get those entries back
  from the leader before it takes part in elections again.
- With `write_buffer_bytes`, appended data waits in memory until a flush (or the
  buffer fills): meant for sync flush, where nothing is acknowledged unflushed.
- NORMAL entries whose body is a RocketMQ message get the message's
  physicalOffset field set to `pos + 48` as they are appended, on the leader and
  on followers alike, so replica files are byte-identical.

Writes happen on the caller's thread (page cache only); `flush()` and
`write_checkpoint()` block on fsync and belong in a worker thread.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from raft.errors import Compacted, Unavailable
from raft.types import Entry, EntryKind
from store.entry_format import (
    CHAIN_FIELDS,
    ENTRY_MAGIC,
    FILLER,
    FILLER_MAGIC,
    FILLER_MIN,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    StoredEntry,
    decode_entry,
)
from store.errors import CorruptEntry
from store.fileio import fsync_dir, write_atomically
from store.mapped_file import MappedFileQueue
from store.message import MESSAGE_MAGIC_CODE, PHYSICAL_OFFSET_POS

log = logging.getLogger(__name__)

DEFAULT_DATA_SEGMENT_BYTES = 1 << 30
DEFAULT_INDEX_SEGMENT_BYTES = INDEX_UNIT_SIZE * (1 << 20)
_CHECKPOINT = struct.Struct(">qqqII")  # index, term, pos, chainCrc, crc of the rest
BASE_SIZE = _CHECKPOINT.size - 4
_MSG_MAGIC = struct.pack(">i", MESSAGE_MAGIC_CODE)
_PHY = struct.Struct(">q")
_SCAN_CHUNK = 4 << 20
_INDEX_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class TailCut:
    """What recovery cut off: the first bad entry and why.

    `seen_through` is the last index of intact entries found *after* the bad one
    (0: none). Intact entries behind a bad one mean the bad bytes are not a torn
    last write but damage to data that had reached the disk, so those entries may
    have been acknowledged (in sync flush mode an entry is acknowledged only once
    fsynced); a bad last entry followed by nothing is indistinguishable from a
    torn write.
    """

    file: str
    pos: int
    index: int  # the index the first bad entry should have had (last good + 1)
    reason: str
    seen_through: int = 0


class EntryStore:
    """Raft log storage (raft.storage.LogStorage) on DLedger's file formats."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        data_segment_bytes: int = DEFAULT_DATA_SEGMENT_BYTES,
        index_segment_bytes: int = DEFAULT_INDEX_SEGMENT_BYTES,
        patch_physical_offset: bool = True,
        committed_index: int = 0,
        preallocate: bool = True,
        write_buffer_bytes: int = 0,
        cache_bytes: int = 32 << 20,
    ) -> None:
        if index_segment_bytes % INDEX_UNIT_SIZE:
            raise ValueError(f"index_segment_bytes must be a multiple of {INDEX_UNIT_SIZE}")
        if data_segment_bytes < 4 * HEADER_SIZE:
            raise ValueError("data_segment_bytes is too small to hold an entry")
        self.directory = Path(directory)
        # Data: write-through unless the caller (sync flush) buffers; the index is
        # always buffered, since recovery rebuilds it from the data.
        self._data = MappedFileQueue(
            self.directory / "data",
            data_segment_bytes,
            preallocate=preallocate,
            write_buffer_bytes=write_buffer_bytes,
        )
        self._index = MappedFileQueue(
            self.directory / "index",
            index_segment_bytes,
            preallocate=preallocate,
            write_buffer_bytes=_INDEX_BUFFER_BYTES,
        )
        self._checkpoint_path = self.directory / "entries.checkpoint"
        # Where the log restarts after retention or a restore: the entry before the
        # first (index, term, end position, chainCrc). None: the log starts at index 1.
        self._base_path = self.directory / "entries.base"
        self._base: tuple[int, int, int, int] | None = self._read_record(self._base_path)
        # Application state sent along with a snapshot (the node sets it).
        self.snapshot_extra: Callable[[], bytes] = bytes
        self._patch = patch_physical_offset
        # The tail: (last index, its term, its chainCrc); first index.
        self._last_index = 0
        self._last_term = 0
        self._last_chain = 0
        self._first_index = 1
        self._checkpoint_index = 0  # committed entries, never truncated
        # The newest entries as appended (bodies as stored): replication and apply
        # read them from memory. Covers [_cache_first, last_index] when not empty.
        self._cache: list[Entry] = []
        self._cache_first = 1
        self._cache_size = 0
        self._cache_limit = cache_bytes
        # Set by recovery: the bad entry it cut the tail at (None: a clean end).
        self.tail_cut: TailCut | None = None
        self._recovered_committed = committed_index
        # Called after every successful fsync of the data files with the flushed position
        # (tests trace it to simulate a power loss); runs on the flushing thread.
        self.on_data_flushed: Callable[[int], None] | None = None
        self._recover(committed_index)
        # What recovery found counts as durable from here on (the driver acknowledges it),
        # but after a process crash it may still be only in the page cache: make it so.
        self._data.sync_all()

    # -- LogStorage --------------------------------------------------------------

    def first_index(self) -> int:
        return self._first_index

    def last_index(self) -> int:
        return self._last_index

    def term(self, index: int) -> int:
        if index == self._last_index:
            return self._last_term
        k = index - self._cache_first
        if 0 <= k < len(self._cache):
            return self._cache[k].term
        if not self._first_index - 1 <= index <= self._last_index:
            raise IndexError(f"index {index} outside [{self._first_index - 1}, {self._last_index}]")
        return self._slot(index)[3]

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        cache = self._cache
        k = lo - self._cache_first
        if cache and k >= 0 and lo < hi <= self._last_index + 1:
            out = cache[k : hi - self._cache_first]
            size = 0
            for n, e in enumerate(out):
                size += len(e.data)
                if size > max_bytes and n:
                    return out[:n]
            return out
        return [
            Entry(e.index, e.term, e.body, EntryKind(e.channel))
            for e in self.stored_entries(lo, hi, max_bytes)
        ]

    def append(self, entries: Sequence[Entry]) -> None:
        self.append_entries(entries)

    # -- writing -----------------------------------------------------------------

    def append_entries(self, entries: Sequence[Entry]) -> list[int]:
        """Append (truncating any conflicting suffix first); returns each entry's pos."""
        if not entries:
            return []
        first = entries[0].index
        if first <= self._last_index:
            self.truncate_suffix(first)
        if first != self._last_index + 1:
            raise ValueError(f"append at {first} leaves a gap after {self._last_index}")
        data, seg_size = self._data, self._data.segment_size
        pos = data.write_position
        left = data.space_left_in_segment()
        buf = bytearray()
        units = bytearray()
        chain, prev_index, term = self._last_chain, self._last_index, self._last_term
        positions: list[int] = []
        cached: list[Entry] = []
        cached_size = 0
        patch = self._patch
        normal = EntryKind.NORMAL
        crc32, chain_pack, head_pack = zlib.crc32, CHAIN_FIELDS.pack, HEADER.pack
        unit_pack, phy_pack = INDEX_UNIT.pack, _PHY.pack
        for e in entries:
            index, eterm, body, kind = e.index, e.term, e.data, e.kind
            stored = e
            if index != prev_index + 1 or eterm < term:
                raise ValueError(f"entry {index} (term {eterm}) does not follow {prev_index}")
            blen = len(body)
            size = HEADER_SIZE + blen
            if size + FILLER_MIN > left:
                if size + FILLER_MIN > seg_size:
                    raise ValueError(f"entry of {size} bytes exceeds the segment size {seg_size}")
                buf += FILLER.pack(FILLER_MAGIC, left)
                buf += bytes(left - FILLER_MIN)
                pos += left
                left = seg_size
            if patch and kind == normal and body.startswith(_MSG_MAGIC, 4):
                body = b"".join((body[:PHYSICAL_OFFSET_POS], phy_pack(pos + HEADER_SIZE),
                                 body[PHYSICAL_OFFSET_POS + 8 :]))  # fmt: skip
                stored = Entry(index, eterm, body, kind)
            # entry_format.encode_entry, inlined: this loop is the append hot path (the
            # one decoder, decode_entry, verifies these bytes on every read and recovery).
            body_crc = crc32(body)
            chain = crc32(
                chain_pack(ENTRY_MAGIC, size, index, eterm, pos, kind, body_crc, blen), chain
            )
            buf += head_pack(ENTRY_MAGIC, size, index, eterm, pos, kind, chain, body_crc, blen)
            buf += body
            units += unit_pack(ENTRY_MAGIC, pos, size, index, eterm)
            cached.append(stored)
            cached_size += blen
            positions.append(pos)
            pos += size
            left -= size
            prev_index, term = index, eterm
        self._data.append_across(buf)
        self._index.append_across(units)
        self._last_index, self._last_term, self._last_chain = prev_index, term, chain
        self._cache_append(cached, cached_size)
        return positions

    def _cache_append(self, entries: list[Entry], size: int) -> None:
        if not self._cache:
            self._cache_first = entries[0].index
        self._cache.extend(entries)
        self._cache_size += size
        if self._cache_size > self._cache_limit:  # drop the older half
            k = len(self._cache) // 2
            self._cache_size -= sum(len(e.data) for e in self._cache[:k])
            del self._cache[:k]
            self._cache_first += k

    def truncate_suffix(self, index: int) -> None:
        """Remove entries `index..last_index` (Raft conflict resolution)."""
        if index > self._last_index:
            return
        if index <= self._first_index - 1 or index < 1:
            raise ValueError(f"cannot truncate at {index}: first index is {self._first_index}")
        if index <= self._checkpoint_index:
            raise ValueError(f"cannot truncate at {index}: entries up to "
                             f"{self._checkpoint_index} are committed")  # fmt: skip
        _, pos, _, _ = self._slot(index)
        self._data.truncate(pos)
        self._index.truncate(index * INDEX_UNIT_SIZE)
        k = max(0, index - self._cache_first)
        self._cache_size -= sum(len(e.data) for e in self._cache[k:])
        del self._cache[k:]
        self._last_index = index - 1
        self._set_tail_from_index(index - 1)

    def roll_back_to(self, index: int) -> None:
        """Cut the log after entry `index` even below the entry checkpoint, durably (blocking).

        Only for a node whose committed tail the cluster no longer has (async flush,
        a power loss of a majority: see RaftNode's rollback marker). The checkpoint
        moves down to `index` first (or is removed when `index` is below the first
        retained entry, the base then anchoring recovery), then the entries after
        `index` are cut, and both are fsynced: a crash in between leaves a log that a
        repeated call finishes. A log that starts after `index` (retention) cannot
        be rolled back: ValueError.
        """
        if index < self._first_index - 1:
            raise ValueError(
                f"cannot roll back to entry {index}: the log starts after entry "
                f"{self._first_index - 1} (retention); restore this node's data from a replica"
            )
        record = self._read_record(self._checkpoint_path)
        if record is not None and record[0] > index:
            if index >= self._first_index:
                entry = self.get(index)
                body = struct.pack(">qqqI", entry.index, entry.term, entry.pos, entry.chain_crc)
                write_atomically(self._checkpoint_path, body + struct.pack(">I", zlib.crc32(body)))
            else:
                self._checkpoint_path.unlink(missing_ok=True)
                fsync_dir(self.directory)
        self._checkpoint_index = min(self._checkpoint_index, index)
        if index < self._last_index:
            log.warning("entry log %s: rolling back entries %d..%d (the cluster lost them)",
                        self.directory, index + 1, self._last_index)  # fmt: skip
            self.truncate_suffix(index + 1)
        self._index.flush()
        self.flush()
        for d in (self._data.directory, self._index.directory):
            fsync_dir(d)  # segments deleted by the cut

    def delete_prefix(self, index: int) -> int:
        """Retention: drop whole data segments holding only entries below `index`.

        Returns the new first index. The last entry is never deleted. The entry
        before the new first one is recorded durably (the base) first: Raft needs
        its term, a follower restored from this log needs its position and chainCrc.
        """
        index = min(index, self._last_index)
        if index <= self._first_index:
            return self._first_index
        _, pos, _, _ = self._slot(index)
        keep_start = pos - pos % self._data.segment_size
        if keep_start <= self._data.min_offset:
            return self._first_index
        first = self._first_in_segment(keep_start)
        if first <= self._first_index:
            # The segments before hold no entry of the log (only the filler after a
            # base near a segment's end): nothing to drop, and the base stays.
            return self._first_index
        before = self.get(first - 1)
        self._set_base((before.index, before.term, before.pos + before.size, before.chain_crc))
        self._data.delete_before(pos)
        self._first_index = first
        if self._cache_first < first:
            k = min(len(self._cache), first - self._cache_first)
            self._cache_size -= sum(len(e.data) for e in self._cache[:k])
            del self._cache[:k]
            self._cache_first += k
        # Keep the slot of first-1: Raft needs its term.
        keep_from = (first - 1) * INDEX_UNIT_SIZE
        self._index.delete_before(keep_from - keep_from % self._index.segment_size)
        return first

    @property
    def base(self) -> tuple[int, int, int, int] | None:
        """(index, term, end pos, chainCrc) of the entry before the first, once compacted."""
        return self._base

    def snapshot_data(self) -> bytes:
        """Where this log restarts (for a follower behind the first retained entry)."""
        base = self._base or (0, 0, 0, 0)
        return _CHECKPOINT.pack(*base, 0)[:-4] + self.snapshot_extra()

    def restore(self, index: int, term: int, data: bytes) -> None:
        """Empty the log so that it restarts after entry `index` (a leader's snapshot)."""
        if len(data) < BASE_SIZE:
            raise ValueError(f"snapshot data of {len(data)} bytes, expected >= {BASE_SIZE}")
        b_index, b_term, pos, chain, _ = _CHECKPOINT.unpack(data[:BASE_SIZE] + bytes(4))
        if (b_index, b_term) != (index, term):
            raise ValueError(
                f"snapshot of entry {index} (term {term}) describes {b_index}/{b_term}"
            )
        self._set_base((index, term, pos, chain))
        self._checkpoint_path.unlink(missing_ok=True)
        self._data.reset(pos)
        self._start_index_at_base()
        self._cache.clear()
        self._cache_first, self._cache_size = index + 1, 0
        self._first_index, self._last_index = index + 1, index
        self._last_term, self._last_chain = term, chain
        self._checkpoint_index = index
        log.info("entry log %s restarts after entry %d (term %d) at %d", self.directory,
                 index, term, pos)  # fmt: skip

    def _set_base(self, base: tuple[int, int, int, int]) -> None:
        body = _CHECKPOINT.pack(*base, 0)[:-4]
        write_atomically(self._base_path, body + struct.pack(">I", zlib.crc32(body)))
        self._base = base

    def _start_index_at_base(self) -> None:
        assert self._base is not None
        self._index.reset(self._base[0] * INDEX_UNIT_SIZE)
        self._index.append(self._start_slot())

    # -- reading -----------------------------------------------------------------

    def get(self, index: int) -> StoredEntry:
        if not self._first_index <= index <= self._last_index:
            raise IndexError(f"index {index} outside [{self._first_index}, {self._last_index}]")
        _, pos, size, _ = self._slot(index)
        entry = self._decode_at(pos, size)
        if entry.index != index:
            raise CorruptEntry(
                self._where(pos), pos, f"index says {index}, entry says {entry.index}"
            )
        return entry

    def get_by_pos(self, pos: int) -> StoredEntry:
        """The entry starting exactly at `pos`; IndexError if none does."""
        if not self._data.min_offset <= pos < self._data.write_position:
            raise IndexError(f"position {pos} outside the log")
        head = self._data.read(pos, min(HEADER_SIZE, self._data.write_position - pos))
        if len(head) < HEADER_SIZE or HEADER.unpack_from(head)[0] != ENTRY_MAGIC:
            raise IndexError(f"no entry starts at position {pos}")
        entry = self._decode_at(pos, HEADER.unpack_from(head)[1])
        if self._slot(entry.index)[1] != pos:
            raise IndexError(f"no entry starts at position {pos}")
        return entry

    def stored_entries(self, lo: int, hi: int, max_bytes: int) -> list[StoredEntry]:
        """Entries [lo, hi), at least one, at most about max_bytes; one read per call."""
        if lo >= hi:
            return []
        if lo < self._first_index:
            raise Compacted(lo, self._first_index)
        if hi > self._last_index + 1:
            raise Unavailable(hi - 1, self._last_index)
        raw = self._index.read(lo * INDEX_UNIT_SIZE, (hi - lo) * INDEX_UNIT_SIZE)
        slots = list(INDEX_UNIT.iter_unpack(raw))
        start = slots[0][1]
        count, end = 0, start
        for _, pos, size, _, _ in slots:
            if count and pos + size - start > max_bytes:
                break
            count, end = count + 1, pos + size
        buf = self._data.read(start, end - start)
        out = []
        for k in range(count):
            _, pos, _, idx, _ = slots[k]
            entry = decode_entry(buf, pos - start, pos, where=self._where)
            if entry.index != idx:
                raise CorruptEntry(
                    self._where(pos), pos, f"index says {idx}, entry says {entry.index}"
                )
            out.append(entry)
        return out

    def body_at(self, pos: int, body_len: int = 0) -> bytes:
        """The body of the entry that starts at `pos`, checked against its CRC.

        CorruptEntry if no whole, intact entry starts there. `body_len` is the
        expected body length: one read when it is right, two otherwise.
        """
        data = self._data
        buf = data.read(pos, min(HEADER_SIZE + max(0, body_len), data.write_position - pos))
        if len(buf) < HEADER_SIZE or HEADER.unpack_from(buf)[0] != ENTRY_MAGIC:
            raise CorruptEntry(self._where(pos), pos, "no entry starts here")
        size = HEADER.unpack_from(buf)[1]
        if size != len(buf):
            if not HEADER_SIZE <= size <= data.segment_size - pos % data.segment_size or (
                pos + size > data.write_position
            ):
                raise CorruptEntry(self._where(pos), pos, f"implausible entry size {size}")
            buf = data.read(pos, size)
        return decode_entry(buf, 0, pos, where=self._where).body

    def read_raw(self, pos: int, size: int) -> bytes:
        """Raw bytes of the data files (replication, verification, tools)."""
        return self._data.read(pos, size)

    def pos_of(self, index: int) -> int:
        return self._slot(index)[1]

    def locate(self, index: int) -> tuple[int, int]:
        """(pos, size) of entry `index`, from the index alone."""
        _, pos, size, _ = self._slot(index)
        return pos, size

    def next_entry_pos(self, pos: int) -> int:
        """`pos` itself, or the next segment's start if a filler lies at `pos`."""
        if pos < self._data.write_position:
            magic, size = FILLER.unpack(self._data.read(pos, FILLER_MIN))
            if (
                magic == FILLER_MAGIC
                and size == self._data.segment_size - pos % self._data.segment_size
            ):
                return pos + int(size)
        return pos

    @property
    def end_pos(self) -> int:
        """Where the next entry (or filler) will be written."""
        return self._data.write_position

    @property
    def write_position(self) -> int:
        return self._data.write_position

    @property
    def flushed_position(self) -> int:
        return self._data.flushed_position

    @property
    def last_chain_crc(self) -> int:
        return self._last_chain

    @property
    def data_queue(self) -> MappedFileQueue:
        return self._data

    # -- durability --------------------------------------------------------------

    def flush(self) -> int:
        """fsync the data files (what acknowledgements depend on); returns the flushed pos."""
        flushed = self._data.flush()
        if self.on_data_flushed is not None:
            self.on_data_flushed(flushed)
        return flushed

    @property
    def missing_through(self) -> int:
        """The highest index this log held, or was told was committed, before recovery,
        when recovery cut it short of that (0: nothing known to be missing).

        max(the caller's `committed_index`, `tail_cut.seen_through`) if above the
        recovered last index. Entries up to it may be committed with this node's vote
        or acknowledgement: they must come back from the leader before this node
        votes or campaigns (RaftCore's `catch_up_to`).
        """
        seen = self.tail_cut.seen_through if self.tail_cut is not None else 0
        lost = max(self._recovered_committed, seen)
        return lost if lost > self._last_index else 0

    def write_checkpoint(self, committed_index: int) -> None:
        """Flush everything and record entry `committed_index` as a verified starting point.

        Only committed entries may be checkpointed: they are never truncated.
        """
        index = min(committed_index, self._last_index)
        if index < self._first_index:
            return
        entry = self.get(index)
        self._index.flush()
        flushed = self._data.flush()
        if self.on_data_flushed is not None:
            self.on_data_flushed(flushed)
        body = struct.pack(">qqqI", entry.index, entry.term, entry.pos, entry.chain_crc)
        record = body + struct.pack(">I", zlib.crc32(body))
        write_atomically(self._checkpoint_path, record)
        self._checkpoint_index = max(self._checkpoint_index, entry.index)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        self._data.close()
        self._index.close()

    # -- internals ---------------------------------------------------------------

    def _slot(self, index: int) -> tuple[int, int, int, int]:
        """The index unit of `index` as (magic, pos, size, term); slot 0 is the sentinel."""
        raw = self._index.read(index * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE)
        magic, pos, size, idx, term = INDEX_UNIT.unpack(raw)
        if index and (magic != ENTRY_MAGIC or idx != index):
            raise CorruptEntry(str(self._index.directory), index * INDEX_UNIT_SIZE,
                               f"bad index unit for entry {index}")  # fmt: skip
        return magic, pos, size, term

    def _decode_at(self, pos: int, size: int) -> StoredEntry:
        if size < HEADER_SIZE or size > self._data.segment_size:
            raise CorruptEntry(self._where(pos), pos, f"implausible entry size {size}")
        return decode_entry(self._data.read(pos, size), 0, pos, where=self._where)

    def _where(self, pos: int) -> str:
        start = pos - pos % self._data.segment_size
        return str(self._data.directory / f"{start:020d}")

    def _set_tail_from_index(self, index: int) -> None:
        if index < self._first_index:
            self._last_term = self._slot(index)[3] if index else 0
            self._last_chain = self._base[3] if self._base and self._base[0] == index else 0
            return
        entry = self.get(index)
        self._last_term, self._last_chain = entry.term, entry.chain_crc

    def _first_in_segment(self, start: int) -> int:
        head = self._data.read(start, HEADER_SIZE)
        return int(HEADER.unpack(head)[2])

    # -- recovery ----------------------------------------------------------------

    @staticmethod
    def _read_record(path: Path) -> tuple[int, int, int, int] | None:
        """A checkpoint or base record: (index, term, pos, chainCrc), CRC-checked."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != _CHECKPOINT.size:
            raise CorruptEntry(str(path), 0, f"record of {len(raw)} bytes")
        index, term, pos, chain, crc = _CHECKPOINT.unpack(raw)
        if zlib.crc32(raw[:-4]) != crc:
            raise CorruptEntry(str(path), 0, "record CRC mismatch")
        return index, term, pos, chain

    def _recover(self, committed_index: int) -> None:
        data = self._data
        checkpoint = self._read_record(self._checkpoint_path)
        start = self._log_start()
        if start is None:
            self._recover_legacy(checkpoint)
            return
        prev, pos = start
        self._first_index = prev[0] + 1
        must_be_valid = 0
        if checkpoint is not None and checkpoint[0] > prev[0]:
            must_be_valid = checkpoint[0]
            if pos <= checkpoint[2] < data.write_position:
                anchor = self._checkpointed_entry(checkpoint, prev)
                if self._index_holds(prev[0], anchor):
                    self._scan_from_anchor(anchor, must_be_valid)
                    return
                log.warning("entry index %s does not hold entries %d..%d below the checkpointed "
                            "entry: rebuilding it from the data", self._index.directory,
                            prev[0], anchor.index - 1)  # fmt: skip
        rebuild = _IndexRebuild(self._index, prev[0], quiet=not data.segments())
        idx = self._index
        have = idx.read_unchecked(prev[0] * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE)
        rebuild.feed(have if self._start_slot_ok(have) else self._start_slot())
        self._scan_from(prev, pos, must_be_valid, rebuild)

    def _log_start(self) -> tuple[tuple[int, int, int], int] | None:
        """(index, term, chainCrc) of the entry before the first, and where the first
        entry (or the filler before it) lies; None for a log from before entries.base
        whose start retention deleted."""
        data, seg = self._data, self._data.segment_size
        if self._base is None:
            if data.segments() and data.min_offset > 0:
                return None
            return (0, 0, 0), 0
        index, term, end, chain = self._base
        if not data.segments():
            data.reset(end)
        elif end < data.min_offset:
            # Retention deleted the file holding the base's end (and the filler after it).
            start = end - end % seg + seg
            if data.min_offset != start:
                raise CorruptEntry(self._where(data.min_offset), data.min_offset,
                                   f"the data files start at {data.min_offset}, but the log "
                                   f"restarts at {end} (entries.base): restore this node's "
                                   "data from a replica")  # fmt: skip
            end = start
        return (index, term, chain), end

    def _start_slot(self) -> bytes:
        """The index slot of the entry before the first: the sentinel or the base's."""
        if self._base is None:
            return bytes(INDEX_UNIT_SIZE)
        index, term, pos, _ = self._base
        return INDEX_UNIT.pack(ENTRY_MAGIC, pos, 0, index, term)

    def _start_slot_ok(self, raw: bytes) -> bool:
        """Whether `raw` serves as the slot of the entry before the first: the sentinel,
        or the base entry's own slot (ending at the base's end) or one rebuilt from it."""
        if self._base is None or (self._base[0] == 0 and raw == bytes(INDEX_UNIT_SIZE)):
            return raw == bytes(INDEX_UNIT_SIZE)
        if len(raw) != INDEX_UNIT_SIZE:
            return False
        magic, pos, size, index, term = INDEX_UNIT.unpack(raw)
        b_index, b_term, b_end, _ = self._base
        return magic == ENTRY_MAGIC and (index, term, pos + size) == (b_index, b_term, b_end)

    def _checkpointed_entry(
        self, checkpoint: tuple[int, int, int, int], prev: tuple[int, int, int] | None
    ) -> StoredEntry:
        """The checkpointed entry, checked against the record (and, if it is the first
        entry, its chain link to `prev`); CorruptEntry if it is not there."""
        index, term, pos, chain = checkpoint
        prev_chain = prev[2] if prev is not None and index == prev[0] + 1 else None
        anchor = self._scan_one(pos, prev_chain)
        if anchor is None or (anchor.index, anchor.term, anchor.chain_crc) != (index, term, chain):
            raise CorruptEntry(
                self._where(pos), pos, f"checkpointed entry {index} is not there "
                "(entries.checkpoint): restore this node's data from a replica"
            )  # fmt: skip
        return anchor

    def _index_holds(self, prev_index: int, anchor: StoredEntry) -> bool:
        """Whether the index holds slots `prev_index..anchor.index - 1` (fsynced by the
        checkpoint that names `anchor`): checked at both ends of that range only."""
        idx, unit = self._index, INDEX_UNIT_SIZE
        lo, hi = prev_index * unit, anchor.index * unit
        if not idx.segments() or lo < idx.min_offset or hi > idx.write_position:
            return False
        if not self._start_slot_ok(idx.read_unchecked(lo, unit)):
            return False
        if anchor.index - 1 == prev_index:
            return True
        magic, pos, size, index, term = INDEX_UNIT.unpack(idx.read_unchecked(hi - unit, unit))
        end, at, seg = pos + size, anchor.pos, self._data.segment_size
        after_filler = at % seg == 0 and at - seg < end < at
        return (
            magic == ENTRY_MAGIC
            and index == anchor.index - 1
            and term <= anchor.term
            and (end == at or after_filler)
        )

    def _recover_legacy(self, checkpoint: tuple[int, int, int, int] | None) -> None:
        """A log from before entries.base existed whose start retention deleted: the
        first entry of the first data file opens it; the chainCrc and index slot of
        the entry before it are unknown (the slot is kept as it is)."""
        start = self._data.min_offset
        anchor = self._scan_one(start)
        if anchor is None:
            raise CorruptEntry(self._where(start), start, "no valid entry opens the log")
        self._first_index = anchor.index
        must_be_valid = 0
        if checkpoint is not None and checkpoint[0] >= anchor.index:
            must_be_valid = checkpoint[0]
            if start <= checkpoint[2] < self._data.write_position:
                anchor = self._checkpointed_entry(checkpoint, None)
        self._scan_from_anchor(anchor, must_be_valid)

    def _scan_from_anchor(self, anchor: StoredEntry, must_be_valid: int) -> None:
        rebuild = _IndexRebuild(self._index, anchor.index)
        rebuild.feed(INDEX_UNIT.pack(ENTRY_MAGIC, anchor.pos, anchor.size, anchor.index,
                                     anchor.term))  # fmt: skip
        prev = (anchor.index, anchor.term, anchor.chain_crc)
        self._scan_from(prev, anchor.pos + anchor.size, must_be_valid, rebuild)

    def _scan_one(self, pos: int, prev_chain: int | None = None) -> StoredEntry | None:
        """The entry at `pos` if it is whole and its body CRC (and, given `prev_chain`,
        its chain link) holds."""
        head = self._data.read_unchecked(pos, HEADER_SIZE)
        if len(head) < HEADER_SIZE or HEADER.unpack_from(head)[0] != ENTRY_MAGIC:
            return None
        size = HEADER.unpack_from(head)[1]
        if not HEADER_SIZE <= size <= self._data.segment_size - pos % self._data.segment_size:
            return None
        try:
            return decode_entry(self._data.read_unchecked(pos, size), 0, pos,
                                prev_chain=prev_chain)  # fmt: skip
        except CorruptEntry:
            return None

    def _scan_from(
        self, prev: tuple[int, int, int], pos: int, must_be_valid: int, rebuild: _IndexRebuild
    ) -> None:
        """Verify the entries from `pos` to the end, the first one chaining from `prev`
        (index, term, chainCrc), feeding their slots to `rebuild`; cut the tail at the
        first bad one (a filler is skipped wherever one may lie)."""
        data = self._data
        seg_size = data.segment_size
        data_end = data.write_position  # until now: the end of the last file
        p_index, p_term, p_chain = prev
        unit_pack = INDEX_UNIT.pack
        units = bytearray()
        bad: str | None = None
        while pos < data_end and bad is None:
            buf = data.read_unchecked(pos, min(data_end, pos - pos % seg_size + seg_size,
                                               pos + _SCAN_CHUNK) - pos)  # fmt: skip
            off = 0
            while off + FILLER_MIN <= len(buf):
                magic, size = FILLER.unpack_from(buf, off)
                left = seg_size - (pos + off) % seg_size
                if magic == FILLER_MAGIC and size == left:
                    off += left
                    break
                if magic == 0 and size == 0:
                    bad = "end"
                    break
                if magic != ENTRY_MAGIC or not HEADER_SIZE <= size <= left - FILLER_MIN:
                    bad = f"bad header (magic {magic:#x}, size {size})"
                    break
                if off + size > len(buf):
                    if off == 0:  # an entry larger than a chunk: read it whole
                        buf = data.read_unchecked(pos, size)
                        if len(buf) < size:
                            bad = "torn entry"
                            break
                        continue
                    break
                try:
                    entry = decode_entry(buf, off, pos + off, where=self._where,
                                         prev_chain=p_chain)  # fmt: skip
                except CorruptEntry as exc:
                    bad = exc.reason
                    break
                if entry.index != p_index + 1 or entry.term < p_term:
                    bad = f"entry {entry.index} (term {entry.term}) after {p_index}"
                    break
                units += unit_pack(ENTRY_MAGIC, entry.pos, entry.size, entry.index, entry.term)
                p_index, p_term, p_chain = entry.index, entry.term, entry.chain_crc
                off += size
            pos += off
            rebuild.feed(bytes(units))
            units.clear()
            if off == 0 and bad is None:
                bad = "torn header"
        if p_index < must_be_valid:
            why = bad if bad not in (None, "end") else "the log ends early"
            raise CorruptEntry(
                self._where(pos), pos,
                f"{why} at entry {p_index + 1}; entries up to {must_be_valid} are below the "
                "entry checkpoint (entries.checkpoint) and cannot be cut: restore this node's "
                "data from a replica",
            )  # fmt: skip
        if bad not in (None, "end"):
            self._note_cut(pos, p_index + 1, bad or "", self._recovered_committed)
        elif p_index < self._recovered_committed:
            log.warning("entry log %s ends at entry %d (position %d), short of the committed "
                        "index %d: the missing entries must come back from the leader",
                        self.directory, p_index, pos, self._recovered_committed)  # fmt: skip
        data.truncate(pos)
        rebuild.finish()
        self._last_index, self._last_term, self._last_chain = p_index, p_term, p_chain
        self._checkpoint_index = must_be_valid

    def _note_cut(self, pos: int, index: int, reason: str, committed: int) -> None:
        """Record (and log) a tail cut at `pos`, where entry `index` should have been."""
        seen = self._skim_past(pos)
        self.tail_cut = TailCut(self._where(pos), pos, index, reason, seen)
        lost = max(committed, seen)
        log.warning(
            "entry log %s: corrupt or torn entry %d at position %d of %s (%s): cutting the "
            "log there%s", self.directory, index, pos, self._where(pos), reason,
            f"; entries {index}..{lost} that may be committed are missing until the leader "
            "replicates them again" if lost >= index else "",
        )  # fmt: skip

    def _skim_past(self, pos: int) -> int:
        """The last index of intact entries right after the bad entry at `pos` (0: none)."""
        data, seg = self._data, self._data.segment_size
        end = data.write_position
        head = data.read_unchecked(pos, HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            return 0
        magic, size, last = HEADER.unpack_from(head)[:3]
        if magic != ENTRY_MAGIC or not HEADER_SIZE <= size <= seg - pos % seg:
            return 0
        seen, at = 0, pos + size
        while at < end:
            magic, fill = FILLER.unpack(
                data.read_unchecked(at, FILLER_MIN).ljust(FILLER_MIN, b"\0")
            )
            if magic == FILLER_MAGIC and fill == seg - at % seg:
                at += fill
                continue
            entry = self._scan_one(at)
            if entry is None or entry.index != last + 1:
                break
            seen = last = entry.index
            at += entry.size
        return seen


class _IndexRebuild:
    """Makes the index agree with the slots a recovery scan finds, fed in order from
    slot `first` on: compares them with what the index holds and rewrites it from
    the first slot that differs (while they agree, nothing is written)."""

    def __init__(self, index: MappedFileQueue, first: int, *, quiet: bool = False) -> None:
        self._index = index
        self._at = first * INDEX_UNIT_SIZE
        self._agrees = bool(index.segments()) and index.min_offset <= self._at <= (
            index.write_position
        )
        if not self._agrees:
            if not quiet:
                log.warning("entry index %s does not reach entry %d: rebuilding it",
                            index.directory, first)  # fmt: skip
            index.reset(self._at)

    def feed(self, units: bytes) -> None:
        if not units:
            return
        idx, unit = self._index, INDEX_UNIT_SIZE
        if self._agrees:
            have = idx.read_unchecked(self._at, len(units))
            if have == units:
                self._at += len(units)
                return
            k = 0
            while have[k : k + unit] == units[k : k + unit]:
                k += unit
            self._at += k
            units = units[k:]
            self._agrees = False
            log.warning("entry index %s disagrees with the data from entry %d: rebuilding it",
                        idx.directory, self._at // unit)  # fmt: skip
            idx.truncate(self._at)
        idx.append_across(units)
        self._at += len(units)

    def finish(self) -> None:
        """The scan ended: drop whatever the index holds beyond it."""
        if self._agrees:
            self._index.truncate(self._at)
