"""The log storage interface the core reads, and an in-memory reference.

Owns: `LogStorage` (what the core needs from the stable log) and
`MemoryStorage` (a list-backed implementation for tests, the simulator and
benchmarks).

Invariants kept by `MemoryStorage`: `_ents[0]` is a dummy entry at
first_index() - 1 carrying that index's term (the sentinel index 0 with term 0
on a fresh log); `_ents[k].index == _offset + k`; `_cum[k]` is the total data
size of `_ents[1..k]`, so byte-limited reads are a bisect, not a loop.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import attrgetter
from typing import Protocol

from raft.errors import Compacted, Unavailable
from raft.types import Entry

_data = attrgetter("data")


def data_size(entries: Sequence[Entry]) -> int:
    """Total payload bytes of `entries` (the unit of all byte limits)."""
    return sum(map(len, map(_data, entries)))


class LogStorage(Protocol):
    """What the core reads. Index 0 is a sentinel with term 0; a fresh log has
    first_index() == 1, last_index() == 0."""

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def term(self, index: int) -> int:
        """Valid for first_index() - 1 <= index <= last_index(); raises
        `Compacted` below and `Unavailable` above."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi); at least one entry if lo < hi even if it exceeds max_bytes."""
        ...

    def append(self, entries: Sequence[Entry]) -> None:
        """entries[0].index <= last_index() + 1; stored entries at index >=
        entries[0].index are removed first. Not necessarily durable until synced."""
        ...

    def snapshot_data(self) -> bytes:
        """Leader side of a snapshot: an opaque description of where the retained
        log starts (just after first_index() - 1), sent to a follower that is
        behind it and handed back to that follower's `restore`. Read by the core
        together with first_index() and term(first_index() - 1)."""
        ...

    def restore(self, index: int, term: int, data: bytes) -> None:
        """Follower side (called by the driver for `Ready.snapshot`, never by the
        core): drop every entry, so that afterwards first_index() == index + 1,
        last_index() == index and term(index) == term. `data` is the leader's
        `snapshot_data()`. Must be durable before the Ready's messages are sent."""
        ...


class MemoryStorage:
    """A list-backed `LogStorage`."""

    __slots__ = ("_cum", "_ents", "_offset")

    def __init__(self, entries: Sequence[Entry] = ()) -> None:
        self._ents: list[Entry] = [Entry(0, 0)]
        self._cum: list[int] = [0]
        self._offset = 0
        if entries:
            self.append(entries)

    def first_index(self) -> int:
        return self._offset + 1

    def last_index(self) -> int:
        return self._offset + len(self._ents) - 1

    def term(self, index: int) -> int:
        k = index - self._offset
        if k < 0:
            raise Compacted(index, self._offset + 1)
        if k >= len(self._ents):
            raise Unavailable(index, self.last_index())
        return self._ents[k].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo >= hi:
            return []
        if lo <= self._offset:
            raise Compacted(lo, self._offset + 1)
        if hi > self.last_index() + 1:
            raise Unavailable(hi - 1, self.last_index())
        i0, i1 = lo - self._offset, hi - self._offset
        cum = self._cum
        end = bisect_right(cum, cum[i0 - 1] + max_bytes, i0, i1)
        return self._ents[i0 : max(end, i0 + 1)]

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        assert self._offset < first <= self.last_index() + 1, (first, self.last_index())
        k = first - self._offset
        del self._ents[k:]
        del self._cum[k:]
        self._ents.extend(entries)
        sizes = accumulate(map(len, map(_data, entries)), initial=self._cum[-1])
        next(sizes)
        self._cum.extend(sizes)
        assert self._ents[-1].index == self.last_index()

    def snapshot_data(self) -> bytes:
        return b""

    def restore(self, index: int, term: int, data: bytes) -> None:
        self._ents = [Entry(index, term)]
        self._cum = [0]
        self._offset = index

    # --- extras for tests and the simulator (not part of LogStorage) ---

    def all_entries(self) -> list[Entry]:
        """Every stored entry, first_index() .. last_index()."""
        return self._ents[1:]

    def copy(self) -> MemoryStorage:
        clone = MemoryStorage()
        clone._ents = list(self._ents)
        clone._cum = list(self._cum)
        clone._offset = self._offset
        return clone

    def compact(self, index: int) -> None:
        """Delete the prefix up to and including `index` (keeps its term as the dummy)."""
        assert self._offset <= index <= self.last_index()
        k = index - self._offset
        dummy = Entry(index, self._ents[k].term)
        base = self._cum[k]
        self._ents = [dummy, *self._ents[k + 1 :]]
        self._cum = [c - base for c in self._cum[k:]]
        self._offset = index
