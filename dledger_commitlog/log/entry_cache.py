"""The entry store's memory of its newest entries, so replication and apply need no read.

Owns `EntryCache`: the entries as last appended (bodies as stored, with the
physical offset patched) and the position each lies at in the data files, so that
dispatch reads what this process just wrote without a file read. Invariants: it
holds one contiguous run of indexes,
`first..first + len - 1`, which ends at the log's last index whenever it is not
empty (the store drops what it truncates and what retention deletes); the bodies
it holds add up to at most about `limit_bytes` (past that, the older half goes).
"""

from __future__ import annotations

from collections.abc import Sequence

from raft.types import Entry


class EntryCache:
    def __init__(self, limit_bytes: int) -> None:
        self._entries: list[Entry] = []
        self._positions: list[int] = []  # _positions[k]: where _entries[k] lies
        self._first = 1  # index of _entries[0]
        self._size_bytes = 0
        self._limit_bytes = limit_bytes

    def term(self, index: int) -> int | None:
        """The term of entry `index`, None if it is not cached."""
        k = index - self._first
        if 0 <= k < len(self._entries):
            return self._entries[k].term
        return None

    def position(self, index: int) -> int | None:
        """Where entry `index` lies in the data files, None if it is not cached."""
        k = index - self._first
        if 0 <= k < len(self._positions):
            return self._positions[k]
        return None

    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry] | None:
        """Entries [lo, hi) (hi at most the log's last index + 1): at least one, at most
        about `max_bytes` of bodies; None unless entry `lo` is cached."""
        k = lo - self._first
        if not 0 <= k < len(self._entries):
            return None
        out = self._entries[k : hi - self._first]
        size = 0
        for n, e in enumerate(out):
            size += len(e.data)
            if size > max_bytes and n:
                return out[:n]
        return out

    def run(self, lo: int, hi: int, max_bytes: int) -> tuple[list[Entry], list[int]] | None:
        """`slice`, and the position of each entry it returns."""
        out = self.slice(lo, hi, max_bytes)
        if out is None:
            return None
        k = lo - self._first
        return out, self._positions[k : k + len(out)]

    def append(self, entries: Sequence[Entry], size_bytes: int, positions: Sequence[int]) -> None:
        """Entries just appended after the last one (`size_bytes`: their bodies), at
        `positions`."""
        if not self._entries:
            self._first = entries[0].index
        self._entries.extend(entries)
        self._positions.extend(positions)
        self._size_bytes += size_bytes
        if self._size_bytes > self._limit_bytes:  # drop the older half
            self._drop_first(len(self._entries) // 2)

    def drop_from(self, index: int) -> None:
        """Forget entries `index` and after (a truncated suffix)."""
        k = max(0, index - self._first)
        self._size_bytes -= sum(len(e.data) for e in self._entries[k:])
        del self._entries[k:]
        del self._positions[k:]

    def drop_before(self, index: int) -> None:
        """Forget entries before `index` (retention)."""
        if self._first < index:
            self._drop_first(min(len(self._entries), index - self._first))

    def reset(self, first: int) -> None:
        """Empty, the next entry appended being `first` (a restore)."""
        self._entries.clear()
        self._positions.clear()
        self._first, self._size_bytes = first, 0

    def _drop_first(self, k: int) -> None:
        self._size_bytes -= sum(len(e.data) for e in self._entries[:k])
        del self._entries[:k]
        del self._positions[:k]
        self._first += k
