"""Dispatch: committed commit-log entries -> consume queues, the key index, group offsets.

The dispatcher tails the commit log **strictly below the committed position**
(it asks the log, through `CommittedLog`, for committed messages only) and, for
each message in log order, appends its consume-queue unit (commit-log offset,
size, tag hash) at the queue offset the leader assigned, indexes each KEYS word
and the UNIQ_KEY as `topic#key`, and applies consumer-group offset commits (a
system topic, so they are replicated through Raft like any message).

Invariants:
- `dispatched_pos` only moves forward while running, and every unit or index
  entry written points below the committed position the log reported for the
  batch that wrote it (checked, not assumed: a batch reaching past it raises).
- Consume queues and the index are a pure function of the committed log: a
  replay of any suffix is idempotent (identical units are no-ops, the index
  skips offsets it holds), so recovery may start a little early.
- `snapshot()` (on the writer's thread) then `persist()` (any thread) records a
  dispatched position that everything flushed covers: queues and index are
  flushed before the checkpoint that names the position is written. The index
  files that filled since the last persist are flushed there too, not when they
  fill (`IndexService.flush_plan`): a full file is hundreds of MB, and the writer
  is the event loop.

A batch is dispatched as columns (numpy), not message by message: one pass decodes
the fixed fields, topics, tag codes and key hashes of all its messages
(`store.message_batch.peek_headers`); the units of each queue are one structured array
written with one copy (`ConsumeQueue.append_units`); the keys go to the index in
one call (`IndexService.put_batch`). Every message's layout and the committed
bound are checked before anything of the batch is written. The files are byte for
byte those of dispatching each message on its own (tests/test_dispatch_vectorized.py
runs both).

Recovery (`recover`): queues and index are cut back to the checkpoint's
dispatched position (never beyond the recovered log's end) and dispatch
resumes there; missing directories are rebuilt from the start of the log.
Not thread-safe: one writer (the node's event loop); `persist` may run in a
worker thread beside it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import shutil
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from dispatch.names import OFFSETS_TOPIC as OFFSETS_TOPIC
from dispatch.names import SYSTEM_TOPIC_PREFIX as SYSTEM_TOPIC_PREFIX
from store.arrays import I64s
from store.checkpoint import AbortMarker, StoreCheckpoint
from store.consume_queue import UNIT_DTYPE, ConsumeQueue, discover_queues
from store.errors import InvalidMessage
from store.fileio import write_atomically
from store.index_format import topic_key_hashes
from store.index_service import IndexFlush, IndexService
from store.message import decode_message, peek_header
from store.message_batch import HeaderBatch, peek_headers

log = logging.getLogger(__name__)

_OFFSETS_FILE = "consumer_offsets.json"
_CHECKPOINT_FILE = "checkpoint"
_ABORT_FILE = "abort"
# Batches this small skip the arrays: paced puts commit a few messages at a time, where
# numpy's per-call cost rules (measured, CPU per message, one by one / numpy: 1 message
# 61 / 212 us, 4: 43 / 75, 8: 36 / 51, 12: 39 / 43, 16-24 even, 32: 37 / 34).
ONE_BY_ONE_MAX = 12
_I32 = struct.Struct(">i")

GroupKey = tuple[str, str, int]  # (group, topic, queue id)


class CommittedLog(Protocol):
    """What dispatch needs from the commit log (it never imports the service)."""

    @property
    def committed_pos(self) -> int:
        """End of the committed prefix: bytes below it never change."""
        ...

    @property
    def min_pos(self) -> int:
        """Position of the first retained entry."""
        ...

    def read_committed(
        self, from_pos: int, max_bytes: int
    ) -> tuple[list[tuple[int, bytes]], int, int]:
        """Committed messages of the entries from `from_pos` on: [(commit-log offset,
        encoded message)], the position after the last entry read, and the committed
        position the read was bounded by."""
        ...

    def read_message(self, commitlog_offset: int, size: int) -> bytes:
        """The encoded message at a commit-log offset (below the committed position)."""
        ...


def encode_offset_commit(group: str, topic: str, queue_id: int, offset: int) -> bytes:
    """The body of a consumer-group offset commit (a message on OFFSETS_TOPIC)."""
    return json.dumps([group, topic, queue_id, offset], separators=(",", ":")).encode()


def decode_offset_commit(body: bytes) -> tuple[GroupKey, int] | None:
    try:
        group, topic, queue_id, offset = json.loads(body)
    except (ValueError, TypeError):
        return None
    if not (isinstance(group, str) and isinstance(topic, str)):
        return None
    if not (isinstance(queue_id, int) and isinstance(offset, int)):
        return None
    return (group, topic, queue_id), offset


def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """`*` or empty -> None (everything); `TagA || TagB` -> {TagA, TagB}."""
    text = expression.strip()
    if text in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in text.split("||"))
    if "" in tags or any(" " in t or "*" in t for t in tags):
        raise InvalidMessage(f"bad tag expression {expression!r}: use '*' or 'TagA || TagB'")
    return tags


@dataclass(frozen=True, slots=True)
class DispatchSnapshot:
    """What `persist` writes: taken on the writer's thread, written on any."""

    dispatched_pos: int
    offsets: dict[GroupKey, int]
    last_store_timestamp_ms: int
    queues: tuple[ConsumeQueue, ...]
    index: IndexFlush  # the index files written below dispatched_pos and not yet flushed


@dataclass(slots=True)
class RecoveryReport:
    crashed: bool
    rebuilt: bool
    resume_pos: int
    log_end_pos: int
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


class Dispatcher:
    def __init__(
        self,
        root: str | Path,
        log_: CommittedLog,
        *,
        units_per_file: int,
        index_slots: int,
        index_entries: int,
        batch_bytes: int = 4 << 20,
    ) -> None:
        self.root = Path(root)
        self.log = log_
        self._units_per_file = units_per_file
        self._index_slots = index_slots
        self._index_entries = index_entries
        self._batch_bytes = batch_bytes
        self.checkpoint = StoreCheckpoint(self.root / _CHECKPOINT_FILE)
        self.abort_marker = AbortMarker(self.root / _ABORT_FILE)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.index = self._open_index()
        self.offsets: dict[GroupKey, int] = {}
        self.dispatched_pos = 0
        self.last_store_timestamp_ms = 0
        self.messages_dispatched = 0
        self._listeners: list[Callable[[], None]] = []
        # What the last `persist` recorded: an idle node does not rewrite (and fsync)
        # the same offsets file and checkpoint once a second.
        self._persisted: tuple[int, dict[GroupKey, int], int] | None = None
        # The commit-log position below which dispatch survives a crash without the log
        # (queues, index and group offsets recorded durably): retention deletes nothing
        # at or past it, or a restart would find offset commits neither in the offsets
        # file nor in the log.
        self.persisted_pos = 0

    # -- opening and recovery ------------------------------------------------------

    def _open_index(self) -> IndexService:
        return IndexService(
            self.root, slot_count=self._index_slots, entry_count=self._index_entries
        )

    def _open_queues(self) -> None:
        for topic, queue_id in discover_queues(self.root):
            self.queues[(topic, queue_id)] = ConsumeQueue(
                self.root, topic, queue_id, units_per_file=self._units_per_file
            )

    def recover(self, log_end_pos: int) -> RecoveryReport:
        """Reconcile queues and index with the recovered log; resume dispatch position.

        `log_end_pos` is the end of the recovered log (nothing is dispatched at or
        beyond it). Marks the store as running (abort marker) until `close`.
        """
        started = time.perf_counter()
        crashed = self.abort_marker.create()
        cp = self.checkpoint.current
        offsets_pos, offsets = self._load_offsets()
        log_min = self.log.min_pos
        report = RecoveryReport(crashed, False, 0, log_end_pos)
        missing = []
        if cp.dispatched_position > log_min:
            if not (self.root / "consumequeue").is_dir():
                missing.append("consumequeue/")
            if not any(self.index.directory.iterdir()):
                missing.append("index/")
            if offsets_pos is None:
                missing.append(_OFFSETS_FILE)
        if missing:
            report.rebuilt = True
            report.notes.append(f"missing {', '.join(missing)}: rebuilding from the log")
            self._wipe()
            resume = log_min
            offsets = {}
        else:
            resume = min(max(cp.dispatched_position, log_min), log_end_pos)
            if resume < cp.dispatched_position:
                report.notes.append(
                    f"checkpoint says dispatched to {cp.dispatched_position}, the log ends at "
                    f"{log_end_pos}: cutting queues and index back"
                )
        self._open_queues()
        for cq in self.queues.values():
            cq.truncate_to_commitlog_offset(resume)
        self.index.truncate_to_commitlog_offset(resume, self._store_timestamp_of)
        self.offsets = offsets
        # The offsets file may be ahead of the queues (written first): replaying the
        # commits between is idempotent, as each sets a value in log order.
        if offsets_pos is not None:
            resume = min(resume, max(offsets_pos, log_min))
        self.dispatched_pos = self.persisted_pos = resume
        self.last_store_timestamp_ms = cp.logics_msg_timestamp_ms
        report.resume_pos = resume
        report.seconds = time.perf_counter() - started
        return report

    def reset(self, pos: int, offsets: dict[GroupKey, int]) -> None:
        """The log restarts at `pos` (restored from a leader): start queues and index over."""
        self._wipe()
        self.dispatched_pos = self.persisted_pos = pos  # the log starts there
        self.offsets = dict(offsets)

    def _store_timestamp_of(self, commitlog_offset: int) -> int:
        head = self.log.read_message(commitlog_offset, 4)
        (size,) = _I32.unpack(head)
        return peek_header(self.log.read_message(commitlog_offset, size)).store_timestamp_ms

    def _wipe(self) -> None:
        self._persisted = None
        for cq in self.queues.values():
            cq.close()
        self.queues.clear()
        self.index.close()
        shutil.rmtree(self.root / "consumequeue", ignore_errors=True)
        shutil.rmtree(self.index.directory, ignore_errors=True)
        (self.root / _OFFSETS_FILE).unlink(missing_ok=True)
        self.index = self._open_index()

    def _load_offsets(self) -> tuple[int | None, dict[GroupKey, int]]:
        path = self.root / _OFFSETS_FILE
        try:
            doc = json.loads(path.read_bytes())
            offsets = {(g, t, int(q)): int(o) for g, t, q, o in doc["offsets"]}
            return int(doc["position"]), offsets
        except FileNotFoundError:
            return None, {}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s is unreadable (%s): rebuilding group offsets from the log", path, exc)
            return None, {}

    # -- dispatching -----------------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called after every batch that dispatched something."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def dispatch_batch(self) -> int:
        """Dispatch one batch of committed messages; returns how many (0: caught up)."""
        if self.dispatched_pos >= self.log.committed_pos:
            return 0
        messages, next_pos, committed = self.log.read_committed(
            self.dispatched_pos, self._batch_bytes
        )
        if next_pos > committed:
            raise AssertionError(
                f"dispatch read to {next_pos}, beyond the committed position {committed}"
            )
        self._apply(messages, committed)
        self.dispatched_pos = next_pos
        if messages:
            self.messages_dispatched += len(messages)
            for listener in list(self._listeners):
                listener()
        return len(messages)

    def catch_up(self) -> int:
        """Dispatch until the committed position (blocking; start-up and tools)."""
        total = 0
        while self.dispatched_pos < self.log.committed_pos:
            before = self.dispatched_pos
            total += self.dispatch_batch()
            if self.dispatched_pos == before:
                break
        return total

    def _apply(self, messages: Sequence[tuple[int, bytes]], committed: int) -> None:
        n = len(messages)
        if not n:
            return
        if n <= ONE_BY_ONE_MAX:
            for offset, data in messages:
                self._apply_one(offset, data, committed)
            return
        batch = peek_headers([data for _, data in messages])
        offsets = np.fromiter([offset for offset, _ in messages], np.int64, n)
        past = offsets + batch.total_size > committed
        if past.any():
            i = int(np.argmax(past))
            raise AssertionError(f"message at {messages[i][0]} reaches past committed {committed}")
        self._append_units(batch, offsets)
        if len(batch.key_message):
            hashes = topic_key_hashes(
                batch.topics, batch.topic_index[batch.key_message], batch.key_hash, batch.key_units
            )
            counts = np.bincount(batch.key_message, minlength=n).astype(np.int64)
            self.index.put_batch(offsets, batch.store_timestamp_ms, counts, hashes)
        if OFFSETS_TOPIC in batch.topics:  # in log order: each sets a value
            commits = batch.topic_index == batch.topics.index(OFFSETS_TOPIC)
            for i in np.flatnonzero(commits).tolist():
                self._apply_offset_commit(messages[i][1], int(batch.total_size[i]))
        self.last_store_timestamp_ms = max(
            self.last_store_timestamp_ms, int(batch.store_timestamp_ms.max())
        )

    def _apply_one(self, offset: int, data: bytes, committed: int) -> None:
        """`_apply` of one message, written the way `put_batch` and `append_units` are
        checked against: the same files, without the arrays."""
        hdr = peek_header(data)
        if offset + hdr.total_size > committed:
            raise AssertionError(f"message at {offset} reaches past committed {committed}")
        self._queue(hdr.topic, hdr.queue_id).append(
            hdr.queue_offset, offset, hdr.total_size, hdr.tags_code
        )
        keys = [*hdr.keys, hdr.uniq_key] if hdr.uniq_key else hdr.keys
        if keys:
            self.index.put_message(hdr.topic, keys, offset, hdr.store_timestamp_ms)
        if hdr.topic == OFFSETS_TOPIC:
            self._apply_offset_commit(data, hdr.total_size)
        self.last_store_timestamp_ms = max(self.last_store_timestamp_ms, hdr.store_timestamp_ms)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, units_per_file=self._units_per_file)
            self.queues[(topic, queue_id)] = cq
        return cq

    def _append_units(self, batch: HeaderBatch, offsets: I64s) -> None:
        """Every queue's units of the batch, in log order, each run of consecutive queue
        offsets with one append (a run breaks where the leader's offsets jump)."""
        n = len(offsets)
        queue = (batch.topic_index << 32) | (batch.queue_id & 0xFFFFFFFF)
        order = np.argsort(queue, kind="stable")
        units = np.empty(n, UNIT_DTYPE)
        units["commitlog_offset"] = offsets[order]
        units["size"] = batch.total_size[order]
        units["tags_code"] = batch.tags_code[order]
        queue, queue_offset = queue[order], batch.queue_offset[order]
        breaks = (queue[1:] != queue[:-1]) | (queue_offset[1:] != queue_offset[:-1] + 1)
        bounds = [0, *(np.flatnonzero(breaks) + 1).tolist(), n]
        heads = order[bounds[:-1]]
        topics = batch.topics
        runs = zip(
            batch.topic_index[heads].tolist(),
            batch.queue_id[heads].tolist(),
            queue_offset[bounds[:-1]].tolist(),
            itertools.pairwise(bounds),
            strict=True,
        )
        for topic, queue_id, first, (lo, hi) in runs:
            self._queue(topics[topic], queue_id).append_units(first, units[lo:hi])

    def _apply_offset_commit(self, data: bytes, size: int) -> None:
        parsed = decode_offset_commit(decode_message(data[:size]).body)
        if parsed is not None:
            self.offsets[parsed[0]] = parsed[1]

    # -- durability ------------------------------------------------------------------

    def snapshot(self) -> DispatchSnapshot:
        """The state to persist, taken on the writer's thread."""
        return DispatchSnapshot(
            self.dispatched_pos,
            dict(self.offsets),
            self.last_store_timestamp_ms,
            tuple(self.queues.values()),
            self.index.flush_plan(),
        )

    def persist(self, snap: DispatchSnapshot) -> None:
        """Flush queues and index, then record `snap` durably (blocking; any thread)."""
        for cq in snap.queues:
            cq.flush()
        self.index.flush(snap.index)
        record = (snap.dispatched_pos, snap.offsets, snap.last_store_timestamp_ms)
        if record == self._persisted:
            return  # recorded already (persisted_pos with it)
        doc = {
            "position": snap.dispatched_pos,
            "offsets": [[g, t, q, o] for (g, t, q), o in sorted(snap.offsets.items())],
        }
        path = self.root / _OFFSETS_FILE
        write_atomically(path, json.dumps(doc, separators=(",", ":")).encode())
        self.checkpoint.update(
            dispatched_position=snap.dispatched_pos,
            logics_msg_timestamp_ms=snap.last_store_timestamp_ms,
            index_msg_timestamp_ms=snap.last_store_timestamp_ms,
        )
        self.checkpoint.flush()
        self._persisted = record
        self.persisted_pos = max(self.persisted_pos, snap.dispatched_pos)

    def close(self, clean: bool) -> None:
        """Close the files; `clean` (after a final persist) removes the abort marker."""
        for cq in self.queues.values():
            cq.close()
        self.index.close()
        if clean:
            self.abort_marker.remove()

    # -- retention -------------------------------------------------------------------

    def delete_below(self, commitlog_offset: int) -> None:
        """Drop queue and index files that refer only to offsets below `commitlog_offset`."""
        for cq in self.queues.values():
            cq.delete_below_commitlog_offset(commitlog_offset)
        self.index.delete_below_commitlog_offset(commitlog_offset)

    # -- reads -----------------------------------------------------------------------

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def queue_offsets(self, topic: str = "") -> list[tuple[str, int, int, int]]:
        """(topic, queue id, min, max) of every queue (of `topic`), user topics only."""
        return sorted(
            (t, q, cq.min_offset, cq.max_offset)
            for (t, q), cq in self.queues.items()
            if (t == topic if topic else not t.startswith(SYSTEM_TOPIC_PREFIX))
        )

    def max_offsets(self) -> dict[tuple[str, int], int]:
        return {key: cq.max_offset for key, cq in self.queues.items()}

    def query_offsets(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]:
        return self.index.query(topic, key, begin_ms, end_ms, max_count)
