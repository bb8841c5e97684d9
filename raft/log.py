"""The core's view of the Raft log: the stable storage plus an unstable tail.

Owns: `RaftLog`, which combines the driver's `LogStorage` (entries already
handed to the driver for persistence) with `unstable`, the entries appended
since the last `Ready`, and tracks the commit and apply positions. After a
follower accepts a snapshot, `snapshot` hides the storage entirely until the
driver has restored it (`advance` of the Ready carrying it).

Invariants:
- unstable[k].index == offset + k; where unstable is non-empty it overrides
  any storage entries at index >= offset (the driver's append will truncate them).
- with `snapshot` set the log is (snapshot.index, snapshot.term) followed by
  `unstable` (offset == snapshot.index + 1); the storage is not read at all.
- everything below first_index() is committed (storage only drops a committed
  prefix, a snapshot only covers committed entries).
- terms are non-decreasing along the log, so "largest index with term <= t"
  is a binary search.
- applied <= applying <= committed <= last_index(); committed never decreases.
- `confs` holds the configuration entries of the log above its base
  (raft/membership.py): every append and restore passes through here and keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence

from raft.errors import Compacted, Unavailable
from raft.membership import ConfLog, Membership
from raft.storage import LogStorage, data_size
from raft.types import Entry, EntryKind, SnapshotMeta

_SCAN_BYTES = 8 << 20  # entry bytes read at a time when looking for configurations


class RaftLog:
    __slots__ = (
        "applied",
        "applying",
        "committed",
        "confs",
        "offset",
        "persisted",
        "snapshot",
        "storage",
        "unstable",
    )

    def __init__(
        self,
        storage: LogStorage,
        committed: int,
        applied: int,
        conf_base: tuple[int, Membership, bytes],
    ) -> None:
        """`conf_base`: the configuration (index, membership, encoding) the hard state
        recorded; the configuration entries between it (or `applied`, below which
        every one is covered by it) and the log's end are read from the storage."""
        last = storage.last_index()
        assert committed <= last, f"commit {committed} beyond the stored log ({last})"
        # A compacted or restored prefix is committed even if the durable commit
        # index lags (a crash between the driver's restore and its hard state).
        committed = max(committed, storage.first_index() - 1)
        assert applied <= committed, f"applied {applied} beyond commit {committed}"
        self.storage = storage
        self.unstable: list[Entry] = []
        self.offset = last + 1
        self.snapshot: SnapshotMeta | None = None  # accepted, storage not yet restored
        self.committed = committed
        self.applying = max(applied, storage.first_index() - 1)
        self.applied = self.applying
        # The last index the driver reported durable (async storage writes): what the
        # storage holds at start is what survived, so it counts as durable.
        self.persisted = last
        self.confs = ConfLog(*conf_base)
        lo = max(conf_base[0], applied, storage.first_index() - 1) + 1
        while lo <= last:
            batch = storage.entries(lo, last + 1, _SCAN_BYTES)
            configs = [e for e in batch if e.kind is EntryKind.CONFIG]
            if configs:
                self.confs.appended(configs)
            lo += len(batch)

    # --- reading ---

    def first_index(self) -> int:
        if self.snapshot is not None:
            return self.snapshot.index + 1
        return self.storage.first_index()

    def last_index(self) -> int:
        if self.unstable:
            return self.offset + len(self.unstable) - 1
        if self.snapshot is not None:
            return self.snapshot.index
        return self.storage.last_index()

    def last_term(self) -> int:
        return self.term(self.last_index())

    def stable_index(self) -> int:
        """The last index the driver has been handed and acknowledged (via advance)."""
        if self.snapshot is not None:
            # Only leaders ask, and a node with a pending snapshot does not campaign.
            return self.snapshot.index
        if self.unstable:
            return min(self.offset - 1, self.storage.last_index())
        return self.storage.last_index()

    def term(self, index: int) -> int:
        """Term at `index`; first_index() - 1 <= index <= last_index()."""
        if index >= self.offset and self.unstable:
            assert index <= self.last_index(), (index, self.last_index())
            return self.unstable[index - self.offset].term
        if self.snapshot is not None:
            if index == self.snapshot.index:
                return self.snapshot.term
            if index < self.snapshot.index:
                raise Compacted(index, self.snapshot.index + 1)
            raise Unavailable(index, self.last_index())
        return self.storage.term(index)

    def match_term(self, index: int, term: int) -> bool:
        if index > self.last_index() or index < self.first_index() - 1:
            return False
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) is at least as up to date."""
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest j <= index with term(j) <= term, and term(j) (binary search)."""
        lo = self.first_index() - 1
        if index < lo:
            return index, 0
        if self.term(index) <= term:
            return index, self.term(index)
        if self.term(lo) > term:
            return lo, 0
        # term(lo) <= term < term(index)
        hi = index
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.term(mid) <= term:
                lo = mid
            else:
                hi = mid
        return lo, self.term(lo)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi) up to `max_bytes` of data (at least one if lo < hi)."""
        if lo >= hi:
            return []
        assert hi <= self.last_index() + 1, (hi, self.last_index())
        if self.snapshot is not None and lo < self.offset:
            raise Compacted(lo, self.offset)
        out: list[Entry] = []
        if lo < self.offset or not self.unstable:
            out = self.storage.entries(lo, min(hi, self.offset), max_bytes)
            if lo + len(out) < min(hi, self.offset) or hi <= self.offset:
                return out
            max_bytes -= data_size(out)
            if max_bytes <= 0:
                return out
            lo = self.offset
        tail = self.unstable[lo - self.offset : hi - self.offset]
        if data_size(tail) > max_bytes:
            tail = _limit_size(tail, max_bytes, at_least_one=not out)
        if out:
            out.extend(tail)
            return out
        return tail

    def next_committed(self, limit: int | None = None) -> list[Entry]:
        """Committed entries not yet handed out for applying (up to `limit`, if given)."""
        hi = self.committed if limit is None else min(self.committed, limit)
        if hi <= self.applying:
            return []
        return self.entries(self.applying + 1, hi + 1, 1 << 62)

    def has_next_committed(self, limit: int | None = None) -> bool:
        hi = self.committed if limit is None else min(self.committed, limit)
        return hi > self.applying

    # --- writing ---

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries continuing or truncating the log (never below commit)."""
        first = entries[0].index
        assert first > self.committed, f"truncating committed entry {first} <= {self.committed}"
        assert first <= self.last_index() + 1, (first, self.last_index())
        self.persisted = min(self.persisted, first - 1)  # a replaced suffix is not durable
        self.confs.appended(entries)
        if self.unstable and first == self.offset + len(self.unstable):
            self.unstable.extend(entries)
        elif first <= self.offset or not self.unstable:
            self.offset = first
            self.unstable = list(entries)
        else:
            del self.unstable[first - self.offset :]
            self.unstable.extend(entries)

    def maybe_append(self, prev_index: int, prev_term: int, entries: Sequence[Entry]) -> int | None:
        """Follower side of AppendEntries: None if (prev_index, prev_term) does not
        match, else the last index now known to match the leader's log."""
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        if entries:
            k = self._first_conflict(entries)
            if k < len(entries):
                self.append(entries[k:])
        return last_new

    def committed_conflict(self, entries: Sequence[Entry]) -> int | None:
        """The index of the first of `entries` at or below the commit index whose term
        differs from ours (None: they agree). `entries` must continue an index at
        which our log matches the sender's."""
        if not entries or entries[0].index > self.committed:
            return None
        upto = entries[: self.committed - entries[0].index + 1]
        k = self._first_conflict(upto)
        return upto[k].index if k < len(upto) else None

    def _first_conflict(self, entries: Sequence[Entry]) -> int:
        """Position of the first entry not already in the log with the same term.
        Matching is prefix-closed (log matching), so this is a binary search."""
        first = entries[0].index
        overlap_end = min(self.last_index(), entries[-1].index)
        if overlap_end < first:
            return 0
        if self.term(overlap_end) == entries[overlap_end - first].term:
            return overlap_end - first + 1
        lo, hi = 0, overlap_end - first  # entries[hi] conflicts
        if self.term(first) != entries[0].term:
            return 0
        while hi - lo > 1:  # entries[lo] matches, entries[hi] conflicts
            mid = (lo + hi) // 2
            if self.term(first + mid) == entries[mid].term:
                lo = mid
            else:
                hi = mid
        return hi

    def restore(self, snap: SnapshotMeta) -> None:
        """Follower: the log becomes empty after `snap.index` (term `snap.term`),
        committed up to it. Nothing up to `snap.index` is handed out for applying;
        `applied` follows once the driver has restored the storage."""
        assert snap.index > self.committed, (snap.index, self.committed)
        self.snapshot = snap
        if snap.conf:  # else (an older leader's snapshot) the membership stays as it is
            self.confs.reset(snap.conf_index, Membership.decode(snap.conf), snap.conf)
        else:
            self.confs.truncate(snap.index + 1)
        self.unstable = []
        self.offset = snap.index + 1
        self.committed = snap.index
        self.applying = snap.index
        self.persisted = snap.index  # nothing above it is held; the restore comes first

    def snapshot_persisted(self, snap: SnapshotMeta) -> None:
        """The driver restored its storage to `snap` (a Ready's snapshot)."""
        if self.snapshot is snap:
            self.snapshot = None
        self.applied = max(self.applied, snap.index)

    def commit_to(self, index: int) -> bool:
        if index <= self.committed:
            return False
        assert index <= self.last_index(), f"commit {index} beyond last {self.last_index()}"
        self.committed = index
        return True

    def stable_to(self, handed: Sequence[Entry]) -> bool:
        """The driver persisted `handed` (a Ready's entries). Entries still in
        the unstable tail with the same term become stable; a suffix replaced
        meanwhile (a conflicting append) stays unstable. Matching is
        prefix-closed, so only a replaced suffix is walked."""
        if not self.unstable or not handed or self.snapshot is not None:
            # With a snapshot pending, `handed` predates it: the restore wipes it.
            return False
        first = handed[0].index
        low = max(first, self.offset)
        j = min(handed[-1].index, self.last_index())
        while j >= low and self.unstable[j - self.offset].term != handed[j - first].term:
            j -= 1
        if j < low:
            return False
        del self.unstable[: j + 1 - self.offset]
        self.offset = j + 1
        return True

    def applied_to(self, index: int) -> None:
        assert index <= self.committed, (index, self.committed)
        self.applied = max(self.applied, index)  # a snapshot may have jumped ahead
        self.applying = max(self.applying, index)


def _limit_size(entries: list[Entry], max_bytes: int, at_least_one: bool) -> list[Entry]:
    total = 0
    for k, e in enumerate(entries):
        total += len(e.data)
        if total > max_bytes:
            return entries[: max(k, 1 if at_least_one else 0)]
    return entries
