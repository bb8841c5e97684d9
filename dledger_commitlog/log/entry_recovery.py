"""Recovery of the entry store at open: find where the log ends, rebuild its index.

Owns the scan `EntryStore` runs when it opens (`recover_log`), and what it
reports (`Recovered`, `TailCut`). Invariants:

- The index is buffered and fsynced only with the entry checkpoint, so after a
  power loss only its slots up to the checkpointed entry are known to be on disk.
  Recovery scans from the checkpointed entry to the end, rebuilding the index
  from it, and trusts the index below it (spot-checked at both ends of that
  range). Without a checkpoint in the retained log (a young log, retention beyond
  the checkpoint, a restore), or when that spot check fails, it scans from the
  log's first entry and rebuilds the whole index from the data (comparing and
  rewriting only from the first slot that differs: `_IndexRebuild`).
- The first entry chains from the base (or from 0), like every entry after it;
  it lies at the base's end, or after the filler there, or at the start of the
  first data file when retention deleted the file holding the base's end.
- A torn or corrupt tail is cut at the first bad entry (its bytes and all after
  it zeroed) with a warning naming file, position and index. A bad checkpointed
  entry raises CorruptEntry instead: it is the recovery anchor, and entries up to
  it may already have been dispatched and retained elsewhere, so only an
  operator (restoring the node's data from a replica) repairs them. Entries below
  it are not rescanned (every read checks the body CRC). A cut below the
  caller's committed index is allowed but reported (`TailCut.seen_through`, the
  store's `missing_through`): the node must get those entries back from the
  leader before it takes part in elections again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dledger_commitlog.log.entry_records import (
    Record,
    segment_file,
    start_slot,
    start_slot_ok,
)
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
from store.mapped_file import MappedFileQueue

log = logging.getLogger(__name__)

_SCAN_CHUNK = 4 << 20


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


@dataclass(frozen=True, slots=True)
class Recovered:
    """Where the recovered log starts and ends."""

    first_index: int
    last: tuple[int, int, int]  # (index, term, chainCrc) of the last entry (or the base)
    checkpoint_index: int  # entries up to here are committed: never truncated
    tail_cut: TailCut | None  # the bad entry the tail was cut at (None: a clean end)


def recover_log(
    directory: Path,
    data: MappedFileQueue,
    index: MappedFileQueue,
    base: Record | None,
    checkpoint: Record | None,
    committed_index: int,
) -> Recovered:
    """Scan the log in `data` (cutting a bad tail) and make `index` agree with it.

    `base` and `checkpoint` are the store's records (entry_records); `committed_index`
    is what the caller knew to be committed (raft.state's commit): a cut below it is
    reported. CorruptEntry if the checkpointed entry, or one below it, is damaged.
    """
    return _Scan(directory, data, index, base, committed_index).run(checkpoint)


class _Scan:
    def __init__(
        self,
        directory: Path,
        data: MappedFileQueue,
        index: MappedFileQueue,
        base: Record | None,
        committed_index: int,
    ) -> None:
        self.directory = directory
        self._data = data
        self._index = index
        self._base = base
        self._committed = committed_index
        self._first_index = 1
        self._tail_cut: TailCut | None = None
        self._result: Recovered | None = None

    def run(self, checkpoint: Record | None) -> Recovered:
        self._recover(checkpoint)
        assert self._result is not None
        return self._result

    def _where(self, pos: int) -> str:
        return segment_file(self._data, pos)

    def _recover(self, checkpoint: Record | None) -> None:
        data = self._data
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
                log.warning(
                    "entry index %s does not hold entries %d..%d below the checkpointed "
                    "entry: rebuilding it from the data",
                    self._index.directory,
                    prev[0],
                    anchor.index - 1,
                )
        rebuild = _IndexRebuild(self._index, prev[0], quiet=not data.segments())
        have = self._index.read_unchecked(prev[0] * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE)
        rebuild.feed(have if start_slot_ok(self._base, have) else start_slot(self._base))
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
                raise CorruptEntry(
                    self._where(data.min_offset),
                    data.min_offset,
                    f"the data files start at {data.min_offset}, but the log "
                    f"restarts at {end} (entries.base): restore this node's "
                    "data from a replica",
                )
            end = start
        return (index, term, chain), end

    def _checkpointed_entry(
        self, checkpoint: Record, prev: tuple[int, int, int] | None
    ) -> StoredEntry:
        """The checkpointed entry, checked against the record (and, if it is the first
        entry, its chain link to `prev`); CorruptEntry if it is not there."""
        index, term, pos, chain = checkpoint
        prev_chain = prev[2] if prev is not None and index == prev[0] + 1 else None
        anchor = self._scan_one(pos, prev_chain)
        if anchor is None or (anchor.index, anchor.term, anchor.chain_crc) != (index, term, chain):
            raise CorruptEntry(
                self._where(pos),
                pos,
                f"checkpointed entry {index} is not there "
                "(entries.checkpoint): restore this node's data from a replica",
            )
        return anchor

    def _index_holds(self, prev_index: int, anchor: StoredEntry) -> bool:
        """Whether the index holds slots `prev_index..anchor.index - 1` (fsynced by the
        checkpoint that names `anchor`): checked at both ends of that range only."""
        idx, unit = self._index, INDEX_UNIT_SIZE
        lo, hi = prev_index * unit, anchor.index * unit
        if not idx.segments() or lo < idx.min_offset or hi > idx.write_position:
            return False
        if not start_slot_ok(self._base, idx.read_unchecked(lo, unit)):
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

    def _recover_legacy(self, checkpoint: Record | None) -> None:
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
        rebuild.feed(
            INDEX_UNIT.pack(ENTRY_MAGIC, anchor.pos, anchor.size, anchor.index, anchor.term)
        )
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
            return decode_entry(self._data.read_unchecked(pos, size), 0, pos, prev_chain=prev_chain)
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
            buf = data.read_unchecked(
                pos, min(data_end, pos - pos % seg_size + seg_size, pos + _SCAN_CHUNK) - pos
            )
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
                    entry = decode_entry(buf, off, pos + off, where=self._where, prev_chain=p_chain)
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
                self._where(pos),
                pos,
                f"{why} at entry {p_index + 1}; entries up to {must_be_valid} are below the "
                "entry checkpoint (entries.checkpoint) and cannot be cut: restore this node's "
                "data from a replica",
            )
        if bad not in (None, "end"):
            self._note_cut(pos, p_index + 1, bad or "", self._committed)
        elif p_index < self._committed:
            log.warning(
                "entry log %s ends at entry %d (position %d), short of the committed "
                "index %d: the missing entries must come back from the leader",
                self.directory,
                p_index,
                pos,
                self._committed,
            )
        data.truncate(pos)
        rebuild.finish()
        self._result = Recovered(
            self._first_index, (p_index, p_term, p_chain), must_be_valid, self._tail_cut
        )

    def _note_cut(self, pos: int, index: int, reason: str, committed: int) -> None:
        """Record (and log) a tail cut at `pos`, where entry `index` should have been."""
        seen = self._skim_past(pos)
        self._tail_cut = TailCut(self._where(pos), pos, index, reason, seen)
        lost = max(committed, seen)
        log.warning(
            "entry log %s: corrupt or torn entry %d at position %d of %s (%s): cutting the "
            "log there%s",
            self.directory,
            index,
            pos,
            self._where(pos),
            reason,
            f"; entries {index}..{lost} that may be committed are missing until the leader "
            "replicates them again"
            if lost >= index
            else "",
        )

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
                log.warning(
                    "entry index %s does not reach entry %d: rebuilding it", index.directory, first
                )
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
            log.warning(
                "entry index %s disagrees with the data from entry %d: rebuilding it",
                idx.directory,
                self._at // unit,
            )
            idx.truncate(self._at)
        idx.append_across(units)
        self._at += len(units)

    def finish(self) -> None:
        """The scan ended: drop whatever the index holds beyond it."""
        if self._agrees:
            self._index.truncate(self._at)
