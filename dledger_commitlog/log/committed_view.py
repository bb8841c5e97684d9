"""The committed view of the entry log: what readers and dispatch may see.

Owns `CommittedView`: the committed index and position over an `EntryStore`, the
listeners told when they move, and the reads bounded by them (a message by
commit-log offset, a range of messages, and the dispatcher's `CommittedLog`:
`min_pos`, `read_committed`, `read_message`). `DLedgerCommitLog` (commitlog.py)
is this view plus the put path; a view on its own takes no puts (offline tools,
rebuilds: verify.py).

Invariants:
- Readers see entries up to `committed_index` / `committed_pos` only; these move
  forward only (as committed entries are applied in order), except when the log
  restarts from a leader's snapshot (`_restart_view`).
- Every read serves bytes checked against their entry's body CRC: a damaged
  entry (recovery does not rescan below the entry checkpoint) fails its read with
  CorruptEntry and is never served. Dispatch reads entries this process appended
  (still in the entry store's memory) from memory: the very bytes whose CRCs it
  computed, not read back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from dledger_commitlog.log.entry_store import EntryStore
from raft.types import EntryKind
from store.entry_format import HEADER_SIZE
from store.errors import CorruptEntry, OffsetOutOfRange
from store.message import StoredMessage, decode_message

_DISPATCH_BATCH = 4096  # entries per read_committed call
REPAIR = "restore this node's data from a replica (docs/disk-faults.md)"


class CommittedView:
    """The committed prefix of `store`, and reads of it (see the module doc)."""

    def __init__(self, store: EntryStore) -> None:
        self.store = store
        self.committed_index = 0
        self.committed_pos = 0
        self._commit_listeners: list[Callable[[], None]] = []
        self._read_cursor = (-1, 0)  # (pos, index) where the last read_committed stopped

    def start_at(self, committed_index: int) -> None:
        """The committed position at start, before dispatch recovery reads up to it."""
        self._set_committed(committed_index, notify=False)

    def add_commit_listener(self, listener: Callable[[], None]) -> None:
        self._commit_listeners.append(listener)

    def remove_commit_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._commit_listeners.remove(listener)

    def _set_committed(self, index: int, notify: bool = True) -> None:
        if index <= self.committed_index:
            return
        self.committed_index = index
        pos, size = self.store.locate(index)
        self.committed_pos = pos + size
        if notify:
            for listener in list(self._commit_listeners):
                listener()

    def _restart_view(self, index: int) -> None:
        """The log restarts after entry `index` (a leader's snapshot): committed there."""
        self.committed_index = 0
        self._set_committed(index, notify=False)
        self._read_cursor = (-1, 0)

    # -- reads ------------------------------------------------------------------------

    def get_by_offset(self, commitlog_offset: int) -> tuple[StoredMessage, int]:
        """The committed message at a commit-log offset, and its encoded size."""
        pos = commitlog_offset - HEADER_SIZE
        if commitlog_offset < self.store.data_queue.min_offset + HEADER_SIZE:
            raise OffsetOutOfRange(
                commitlog_offset, self.min_offset, self.committed_pos, "commit-log offset"
            )
        if pos >= self.committed_pos:
            raise OffsetOutOfRange(
                commitlog_offset,
                self.min_offset,
                self.committed_pos,
                "commit-log offset (not committed)",
            )
        try:
            entry = self.store.get_by_pos(pos)
        except IndexError:
            raise KeyError(f"no message starts at commit-log offset {commitlog_offset}") from None
        if entry.channel != EntryKind.NORMAL or not entry.body:
            raise KeyError(f"no message at commit-log offset {commitlog_offset}")
        return decode_message(entry.body), len(entry.body)

    @property
    def min_offset(self) -> int:
        return self.store.data_queue.min_offset + HEADER_SIZE

    def read_range(
        self, from_offset: int, max_messages: int, max_bytes: int
    ) -> tuple[list[bytes], int]:
        """Encoded committed messages from `from_offset` on, and the offset after them."""
        store = self.store
        if from_offset < self.min_offset:
            index = store.first_index()
        elif from_offset - HEADER_SIZE >= self.committed_pos:
            return [], max(from_offset, self.committed_pos + HEADER_SIZE)
        else:
            pos = store.next_entry_pos(from_offset - HEADER_SIZE)
            if pos >= self.committed_pos:
                return [], pos + HEADER_SIZE
            try:
                index = store.get_by_pos(pos).index
            except IndexError:
                raise KeyError(f"no message starts at commit-log offset {from_offset}") from None
        hi = min(self.committed_index + 1, index + max(1, max_messages))
        if index >= hi:
            return [], from_offset
        batch = store.stored_entries(index, hi, max_bytes)
        out = [e.body for e in batch if e.channel == EntryKind.NORMAL and e.body]
        nxt = batch[-1].pos + batch[-1].size + HEADER_SIZE
        return out, nxt

    # -- the dispatcher's view (dispatch.CommittedLog) -------------------------------------

    @property
    def min_pos(self) -> int:
        """Position of the first retained entry."""
        store = self.store
        if store.last_index() >= store.first_index():
            return store.pos_of(store.first_index())
        return store.end_pos

    def read_committed(
        self, from_pos: int, max_bytes: int
    ) -> tuple[list[tuple[int, bytes]], int, int]:
        """Committed messages from the entry at `from_pos` on (see dispatch.CommittedLog)."""
        committed, store = self.committed_pos, self.store
        if from_pos >= committed:
            return [], from_pos, committed
        pos = store.next_entry_pos(max(from_pos, self.min_pos))
        if pos >= committed:
            return [], from_pos, committed
        cursor = self._read_cursor
        try:
            index = cursor[1] if cursor[0] == pos else store.get_by_pos(pos).index
            hi = min(self.committed_index + 1, index + _DISPATCH_BATCH)
            cached = store.cached_entries(index, hi, max_bytes)
            if cached is not None:  # what this process appended: no read, no decode
                entries, positions = cached
                out = [
                    (p + HEADER_SIZE, e.data)
                    for e, p in zip(entries, positions, strict=True)
                    if e.kind == EntryKind.NORMAL and e.data
                ]
                nxt = positions[-1] + HEADER_SIZE + len(entries[-1].data)
                self._read_cursor = (nxt, entries[-1].index + 1)
                return out, nxt, committed
            batch = store.stored_entries(index, hi, max_bytes)
        except CorruptEntry as exc:  # dispatch goes in log order: it cannot skip one
            why = f"{exc.reason}; the consume queues and the key index cannot be built past it"
            raise CorruptEntry(exc.file, exc.offset, f"{why}: {REPAIR}") from None
        out = [
            (e.pos + HEADER_SIZE, e.body) for e in batch if e.channel == EntryKind.NORMAL and e.body
        ]
        nxt = batch[-1].pos + batch[-1].size
        self._read_cursor = (nxt, batch[-1].index + 1)
        return out, nxt, committed

    def read_message(self, commitlog_offset: int, size: int = 0) -> bytes:
        """The first `size` bytes (0: all) of the committed message at `commitlog_offset`.

        Checked against its entry's body CRC (CorruptEntry, never damaged bytes): a
        byte flipped below the entry checkpoint is not found at start.
        """
        if commitlog_offset + max(size, 1) > self.committed_pos:
            raise OffsetOutOfRange(
                commitlog_offset,
                self.min_offset,
                self.committed_pos,
                "commit-log offset (not committed)",
            )
        body = self.store.body_at(commitlog_offset - HEADER_SIZE, size)
        if not size:
            return body
        if size > len(body):
            raise CorruptEntry(
                None,
                commitlog_offset,
                f"{size} bytes asked of a message of "
                f"{len(body)} at commit-log offset {commitlog_offset}",
            )
        return body if size == len(body) else body[:size]
