"""IndexService: the index files of a store, under `<root>/index/`, oldest first.

The index is a pure function of the committed log: a file is named by the store
timestamp of the first message put into it (`yyyyMMddHHmmssSSS` in UTC, at least
one millisecond after the previous file's name, so names strictly increase even
when store timestamps do not), all keys of one message go to one file (the
service rolls before a message that does not fit), so a file's `endPhyOffset`
covers whole messages, and truncation cuts files back to exactly the bytes a
fresh build of the kept messages writes. Deleting the index and rebuilding it
from the same log prefix gives the same names and bytes. The newest file takes
the writes.

Dispatch indexes a batch at once (`put_batch`): keys come as their hashes
(`index_format.topic_key_hashes`, from the message batch's key columns) and the
messages that fit the current file go into it with one `IndexFile.put_many`.
The files are byte for byte those `put_message` of each message writes.

Durability. A file that fills is sealed (it takes no more writes) and left for
the next `flush` rather than flushed on the writer's thread (the event loop):
`flush_plan()`, taken on the writer's thread, names the sealed files not
flushed yet and the newest file, and `flush(plan)`, run in any thread (the
node's checkpoint), fdatasyncs them, GIL released. The dispatcher takes the
plan with the dispatched position it checkpoints and writes the checkpoint only
after the flush, so every index entry below a checkpointed position is durable:
after a crash only files written since the last checkpoint can be torn, and
recovery (`truncate_to_commitlog_offset` to that position) deletes those that
begin at or after it and cuts the one that straddles it, whatever a torn write
left there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np

from store.arrays import I64s
from store.errors import StoreError
from store.fileio import fsync_dir, mkdir_durably
from store.index_file import IndexFile
from store.index_format import DEFAULT_ENTRY_COUNT, DEFAULT_SLOT_COUNT, build_key

__all__ = ["IndexFlush", "IndexService"]

_NAME_LEN = 17  # yyyyMMddHHmmssSSS
_MAX_NAME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: names keep 17 digits


class IndexFlush(NamedTuple):
    """What a `flush` must make durable for everything written before `flush_plan`."""

    sealed: tuple[IndexFile, ...]  # full files not flushed since they filled
    newest: IndexFile | None  # the file taking writes


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
        # Sealed, not flushed yet: appended by the writer, removed by a flush (any thread).
        self._sealed: list[IndexFile] = []
        self._sealed_lock = threading.Lock()
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
            with self._sealed_lock:  # takes no more writes; the next flush makes it durable
                self._sealed.append(last)
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
        commit log); without it a straddling file is deleted whole. Returns
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
            self._drop(self.files.pop())
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
            self._drop(self.files.pop(0))
            gone += 1
        if gone:
            fsync_dir(self.directory)
        return gone

    # -- lifecycle -------------------------------------------------------------

    def _drop(self, f: IndexFile) -> None:
        with self._sealed_lock:
            if f in self._sealed:
                self._sealed.remove(f)
        f.destroy()

    # -- durability ------------------------------------------------------------

    def flush_plan(self) -> IndexFlush:
        """What to flush for everything written so far (on the writer's thread)."""
        with self._sealed_lock:
            sealed = tuple(self._sealed)
        return IndexFlush(sealed, self.files[-1] if self.files else None)

    def flush(self, plan: IndexFlush | None = None) -> None:
        """Make durable what was written before `plan` was taken: its sealed files, then
        its newest file (blocking, GIL released: any thread). Without a plan, one taken
        now: call that on the writer's thread."""
        plan = self.flush_plan() if plan is None else plan
        for f in plan.sealed:
            f.flush()
        if plan.newest is not None:
            plan.newest.flush()
        if plan.sealed:  # a sealed file takes no more writes: flushed for good
            with self._sealed_lock:
                self._sealed = [f for f in self._sealed if f not in plan.sealed]

    def close(self) -> None:
        for f in self.files:
            f.close()
