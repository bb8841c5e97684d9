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
- The index is buffered and fsynced only by `write_checkpoint` (and `roll_back_to`).
  Opening the store recovers it (entry_recovery: a torn or corrupt tail is cut,
  the index rebuilt from the data where they disagree; a damaged checkpointed
  entry raises CorruptEntry). Entries below the checkpoint are not rescanned;
  every read checks the body CRC, so a damaged one fails its reads (CorruptEntry
  naming file and position) and is never served. A cut below the caller's
  `committed_index` is reported: see `tail_cut` and `missing_through`.
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
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path

from dledger_commitlog.log.entry_append import encode_entries
from dledger_commitlog.log.entry_cache import EntryCache
from dledger_commitlog.log.entry_records import (
    BASE_FILE,
    CHECKPOINT_FILE,
    Record,
    pack_base,
    read_record,
    segment_file,
    snapshot_base,
    start_slot,
    write_record,
)
from dledger_commitlog.log.entry_recovery import TailCut, recover_log
from dledger_commitlog.log.entry_runs import RUN_MIN, decode_run
from raft.errors import Compacted, Unavailable
from raft.types import KINDS, Entry, EntryKind
from store.entry_format import (
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
from store.fileio import fsync_dir
from store.mapped_file import MappedFileQueue

log = logging.getLogger(__name__)

DEFAULT_DATA_SEGMENT_BYTES = 1 << 30
DEFAULT_INDEX_SEGMENT_BYTES = INDEX_UNIT_SIZE * (1 << 20)
_INDEX_BUFFER_BYTES = 1 << 20


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
        self._checkpoint_path = self.directory / CHECKPOINT_FILE
        # Where the log restarts after retention or a restore: the entry before the
        # first (index, term, end position, chainCrc). None: the log starts at index 1.
        self._base_path = self.directory / BASE_FILE
        self._base: Record | None = read_record(self._base_path)
        # Application state sent along with a snapshot (the node sets it).
        self.snapshot_extra: Callable[[], bytes] = bytes
        self._patch = patch_physical_offset
        self._cache = EntryCache(cache_bytes)  # the newest entries, as appended
        self._recovered_committed = committed_index
        # Called after every successful fsync of the data files with the flushed position
        # (tests trace it to simulate a power loss); runs on the flushing thread.
        self.on_data_flushed: Callable[[int], None] | None = None
        found = recover_log(
            self.directory,
            self._data,
            self._index,
            self._base,
            read_record(self._checkpoint_path),
            committed_index,
        )
        # The tail: (last index, its term, its chainCrc); first index.
        self._first_index = found.first_index
        self._last_index, self._last_term, self._last_chain = found.last
        self._checkpoint_index = found.checkpoint_index  # committed entries, never truncated
        # The bad entry recovery cut the tail at (None: a clean end).
        self.tail_cut: TailCut | None = found.tail_cut
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
        cached = self._cache.term(index)
        if cached is not None:
            return cached
        if not self._first_index - 1 <= index <= self._last_index:
            raise IndexError(f"index {index} outside [{self._first_index - 1}, {self._last_index}]")
        return self._slot(index)[3]

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < hi <= self._last_index + 1:
            cached = self._cache.slice(lo, hi, max_bytes)
            if cached is not None:
                return cached
            if hi - lo >= RUN_MIN and lo >= self._first_index:  # numpy over the headers
                raw = self._index.read(lo * INDEX_UNIT_SIZE, (hi - lo) * INDEX_UNIT_SIZE)
                run = decode_run(raw, self._data.read, max_bytes)
                if run is not None:
                    return run
        kinds = KINDS
        return [
            Entry(
                e.index,
                e.term,
                e.body,
                kinds[e.channel] if e.channel in kinds else EntryKind(e.channel),
            )
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
        data = self._data
        run = encode_entries(
            entries,
            pos=data.write_position,
            left=data.space_left_in_segment(),
            segment_size=data.segment_size,
            tail=(self._last_index, self._last_term, self._last_chain),
            patch=self._patch,
        )
        data.append_across(run.data)
        self._index.append_across(run.units)
        self._last_index, self._last_term, self._last_chain = run.last
        self._cache.append(run.stored, run.body_bytes, run.positions)
        return run.positions

    def truncate_suffix(self, index: int) -> None:
        """Remove entries `index..last_index` (Raft conflict resolution)."""
        if index > self._last_index:
            return
        if index <= self._first_index - 1 or index < 1:
            raise ValueError(f"cannot truncate at {index}: first index is {self._first_index}")
        if index <= self._checkpoint_index:
            raise ValueError(
                f"cannot truncate at {index}: entries up to {self._checkpoint_index} are committed"
            )
        _, pos, _, _ = self._slot(index)
        self._data.truncate(pos)
        self._index.truncate(index * INDEX_UNIT_SIZE)
        self._cache.drop_from(index)
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
        record = read_record(self._checkpoint_path)
        if record is not None and record[0] > index:
            if index >= self._first_index:
                entry = self.get(index)
                write_record(
                    self._checkpoint_path, (entry.index, entry.term, entry.pos, entry.chain_crc)
                )
            else:
                self._checkpoint_path.unlink(missing_ok=True)
                fsync_dir(self.directory)
        self._checkpoint_index = min(self._checkpoint_index, index)
        if index < self._last_index:
            log.warning(
                "entry log %s: rolling back entries %d..%d (the cluster lost them)",
                self.directory,
                index + 1,
                self._last_index,
            )
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
        self._cache.drop_before(first)
        # Keep the slot of first-1: Raft needs its term.
        keep_from = (first - 1) * INDEX_UNIT_SIZE
        self._index.delete_before(keep_from - keep_from % self._index.segment_size)
        return first

    @property
    def base(self) -> Record | None:
        """(index, term, end pos, chainCrc) of the entry before the first, once compacted."""
        return self._base

    def snapshot_data(self) -> bytes:
        """Where this log restarts (for a follower behind the first retained entry)."""
        return pack_base(self._base or (0, 0, 0, 0)) + self.snapshot_extra()

    def restore(self, index: int, term: int, data: bytes) -> None:
        """Empty the log so that it restarts after entry `index` (a leader's snapshot)."""
        _, _, pos, chain = snapshot_base(index, term, data)  # ValueError, nothing changed
        self._set_base((index, term, pos, chain))
        self._checkpoint_path.unlink(missing_ok=True)
        self._data.reset(pos)
        self._start_index_at_base()
        self._cache.reset(index + 1)
        self._first_index, self._last_index = index + 1, index
        self._last_term, self._last_chain = term, chain
        self._checkpoint_index = index
        log.info(
            "entry log %s restarts after entry %d (term %d) at %d", self.directory, index, term, pos
        )

    def _set_base(self, base: Record) -> None:
        write_record(self._base_path, base)
        self._base = base

    def _start_index_at_base(self) -> None:
        assert self._base is not None
        self._index.reset(self._base[0] * INDEX_UNIT_SIZE)
        self._index.append(start_slot(self._base))

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

    def cached_entries(
        self, lo: int, hi: int, max_bytes: int
    ) -> tuple[list[Entry], list[int]] | None:
        """Entries [lo, hi) and the position of each, cut by size as `stored_entries`
        cuts them, if entry `lo` is still in memory as this process appended it (None
        otherwise): no file read and no CRC check, the bytes being those whose CRCs the
        append computed."""
        if not lo < hi <= self._last_index + 1:
            return None
        run = self._cache.run(lo, hi, max_bytes)
        if run is None:
            return None
        entries, positions = run
        # stored_entries' cut: entries while pos + size - start <= max_bytes (one at least).
        # Ends grow with positions, so only the last entry starting in bounds may overrun.
        limit = positions[0] + max_bytes
        n = max(1, bisect_right(positions, limit - HEADER_SIZE))
        if n > 1 and positions[n - 1] + HEADER_SIZE + len(entries[n - 1].data) > limit:
            n -= 1
        return entries[:n], positions[:n]

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
        cached = self._cache.position(index)
        return cached if cached is not None else self._slot(index)[1]

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
        write_record(self._checkpoint_path, (entry.index, entry.term, entry.pos, entry.chain_crc))
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
            raise CorruptEntry(
                str(self._index.directory),
                index * INDEX_UNIT_SIZE,
                f"bad index unit for entry {index}",
            )
        return magic, pos, size, term

    def _decode_at(self, pos: int, size: int) -> StoredEntry:
        if size < HEADER_SIZE or size > self._data.segment_size:
            raise CorruptEntry(self._where(pos), pos, f"implausible entry size {size}")
        return decode_entry(self._data.read(pos, size), 0, pos, where=self._where)

    def _where(self, pos: int) -> str:
        return segment_file(self._data, pos)

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
