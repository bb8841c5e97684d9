"""DLedgerCommitLog: messages in, Raft entries out, results back once committed.

Owns the put path above Raft: validation and encoding (once, at the request),
queue assignment at proposal time, batching of concurrent puts into one
proposal, idempotency by UNIQ_KEY, and the tables these need (queue ends, recent
UNIQ_KEYs), kept as committed entries are applied. It is a `CommittedView`
(committed_view.py), which owns the committed position and the reads bounded by
it; message_layout.py reads and writes the fields the put path needs.

Invariants:
- Queue offsets are a function of log order: the leader assigns them from a
  table of the committed prefix plus its own uncommitted tail (scanned when it
  becomes leader), so every replica's queues come out byte-identical.
- A put's future resolves only when the entry at its index commits: success if
  that entry has the term it was proposed in, a definite failure if another
  entry took the index; if neither happens before the deadline the outcome is
  unknown (the client retries with the same UNIQ_KEY and gets the original).
- A committed entry found damaged at start (recovery does not rescan below the
  entry checkpoint) is reported once, in one line, and left out of the
  idempotency window (docs/disk-faults.md); its reads fail (committed_view.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.log.committed_view import REPAIR, CommittedView
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.message_layout import (
    Placement,
    msg_id_of,
    placement_of,
    stamp,
    store_host_bytes,
    uniq_of,
)

# The put path's outcomes, from where its callers import them.
from dledger_commitlog.log.submission import OutcomeUnknown as OutcomeUnknown
from dledger_commitlog.log.submission import Overloaded as Overloaded
from dledger_commitlog.log.submission import PutFailed as PutFailed
from dledger_commitlog.log.submission import Submission, Waiter
from raft import RaftCore
from raft.errors import NotLeader
from raft.types import Entry, EntryKind
from store.entry_format import HEADER_SIZE
from store.errors import CorruptEntry, InvalidMessage
from store.message import encode_fields, make_properties

log = logging.getLogger(__name__)

_ONE_BY_ONE = 64  # entries read singly after a batch read met a damaged one
_NAMED_BAD = 3  # damaged entries named in the start-up warning
_SYSTEM_PREFIX = "%SYS%"
_SYSTEM_QUEUES = 65  # config.MAX_DELAY_LEVELS, plus the deliver-at queue


@dataclass(frozen=True, slots=True)
class Draft:
    """A message to put, as its producer gave it: what `prepare` checks and encodes."""

    topic: str
    body: bytes
    uniq_key: str  # required: clients generate one per message (idempotent retries)
    keys: Sequence[str] = ()
    tags: str | None = None
    properties: Mapping[str, str] | None = None
    queue_id: int | None = None
    born_timestamp_ms: int = 0
    flag: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)


@dataclass(frozen=True, slots=True)
class PutSpec:
    """A validated put, encoded once; queue fields are patched at proposal time."""

    topic: str
    encoded: bytes
    uniq_key: str
    queue_id: int | None


class DLedgerCommitLog(CommittedView):
    """The replicated commit log's put path and committed view on one node."""

    def __init__(
        self,
        store: EntryStore,
        *,
        store_host: tuple[str, int],
        queues_per_topic: int,
        max_message_bytes: int,
        max_pending: int,
        idempotency_window: int,
        core: RaftCore | None = None,
        on_proposed: Callable[[int], None] = lambda count: None,
    ) -> None:
        super().__init__(store)
        self._store_host = store_host
        self._queues = queues_per_topic
        self._max_body = max_message_bytes
        self._max_pending = max_pending
        self._core = core  # the Raft core puts are proposed to (None: an offline view)
        self._on_proposed = on_proposed  # a batch of `count` entries was proposed
        # The committed tables.
        self._queue_next: dict[tuple[str, int], int] = {}
        self._recent: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._window = idempotency_window
        # The leader's assignment state.
        self._lead_term = 0
        self._assign_next: dict[tuple[str, int], int] = {}
        self._round_robin: dict[str, int] = {}
        self._tail_uniq: dict[str, int] = {}  # uncommitted tail: uniq key -> index
        self._waiters: dict[int, list[Waiter]] = {}
        # index -> (term, route) of the entries this node proposed, until applied: apply
        # need not read back what the leader stamped (an entry of another term is read)
        self._proposed: dict[int, tuple[int, Placement]] = {}
        self._pending = 0
        self._queued: list[tuple[PutSpec, Submission, int]] = []
        self._flush_scheduled = False
        self.damaged: list[int] = []  # committed entries found damaged at start

    # -- building the committed tables at start --------------------------------------

    def load_committed(
        self, upto_index: int, queue_next: dict[tuple[str, int], int], batch_bytes: int = 8 << 20
    ) -> None:
        """Seed the tables: queue ends from dispatch, idempotency keys from the log's tail.

        Only the last `idempotency_window` entries are read, so start-up does not
        grow with the log. These lie below the entry checkpoint, which recovery does
        not rescan: an entry that fails its check here (a byte flipped on disk) is
        skipped and reported in one warning naming file and offset. Its reads fail
        (it is never served) and its UNIQ_KEY is missing from the window.
        """
        self._queue_next = dict(queue_next)
        index = max(self.store.first_index(), upto_index - self._window + 1)
        recent = self._recent
        bad: list[tuple[int, CorruptEntry]] = []
        while index <= upto_index:
            try:
                batch = self.store.stored_entries(index, upto_index + 1, batch_bytes)
                nxt = batch[-1].index + 1
            except CorruptEntry:  # one damaged entry fails the whole read: go singly
                nxt = min(upto_index + 1, index + _ONE_BY_ONE)
                batch = []
                for i in range(index, nxt):
                    try:
                        batch.append(self.store.get(i))
                    except CorruptEntry as exc:
                        bad.append((i, exc))
            for e in batch:
                # Properties end the message: the last UNIQ_KEY name is the property.
                uniq = uniq_of(e.body) if e.channel == EntryKind.NORMAL else None
                if uniq is not None:
                    recent[uniq] = e.index
            index = nxt
        while len(recent) > self._window:
            recent.popitem(last=False)
        self.damaged = [i for i, _ in bad]
        if bad:
            self._report_damaged(bad)
        self._set_committed(upto_index)

    def _report_damaged(self, bad: list[tuple[int, CorruptEntry]]) -> None:
        """One warning line for the committed entries the start-up read found damaged."""
        named = "; ".join(f"entry {i}: {exc}" for i, exc in bad[:_NAMED_BAD])
        more = f"; {len(bad) - _NAMED_BAD} more" if len(bad) > _NAMED_BAD else ""
        log.warning(
            "commit log %s: %d damaged committed %s below the entry checkpoint (%s%s). "
            "Serving the rest: a read of a damaged entry fails, it is never served, and its "
            "UNIQ_KEY is not in the idempotency window. The other replicas hold the data: %s",
            self.store.directory,
            len(bad),
            "entry" if len(bad) == 1 else "entries",
            named,
            more,
            REPAIR,
        )

    def restart_at(self, index: int, queue_next: dict[tuple[str, int], int]) -> None:
        """The log was restored from a leader's snapshot after entry `index`.

        Queue ends come with the snapshot; the idempotency window restarts empty
        (a retry of a put committed before the snapshot may be stored again).
        """
        self._restart_view(index)
        self._queue_next = dict(queue_next)
        self._recent.clear()
        self._tail_uniq.clear()
        self._proposed.clear()

    @property
    def queue_next(self) -> dict[tuple[str, int], int]:
        """(topic, queue id) -> the queue offset of its next committed message."""
        return self._queue_next

    # -- put path --------------------------------------------------------------------

    def prepare(self, d: Draft) -> PutSpec:
        """`d` checked and encoded; raises InvalidMessage with the reason."""
        # System topics (the schedule's queue per delay level) have queues of their own.
        limit = _SYSTEM_QUEUES if d.topic.startswith(_SYSTEM_PREFIX) else self._queues
        if d.queue_id is not None and not 0 <= d.queue_id < limit:
            raise InvalidMessage(f"queue id {d.queue_id} outside [0, {limit})")
        if not d.uniq_key:
            raise InvalidMessage("uniq_key is required (clients generate one per message)")
        props = make_properties(
            keys=d.keys, tags=d.tags or None, uniq_key=d.uniq_key, extra=d.properties
        )
        encoded = encode_fields(
            d.topic,
            d.body,
            props,
            max_body_bytes=self._max_body,
            flag=d.flag,
            born_timestamp_ms=d.born_timestamp_ms,
            born_host=d.born_host,
            store_host=self._store_host,
        )
        return PutSpec(d.topic, encoded, d.uniq_key, d.queue_id)

    async def put(self, specs: Sequence[PutSpec], timeout_s: float) -> list[PutResult]:
        """Propose `specs` (batched with concurrent puts) and wait for their commit."""
        done: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        self.submit(specs, timeout_s, done)
        return await done

    def submit(
        self, specs: Sequence[PutSpec], timeout_s: float, done: asyncio.Future[list[PutResult]]
    ) -> None:
        """Propose `specs` (batched with the puts of this loop pass); `done` gets their
        results once all committed, or the first failure (NotLeader, PutFailed), or
        OutcomeUnknown after `timeout_s`. Overloaded is raised at once."""
        if self._pending + len(specs) > self._max_pending:
            raise Overloaded(f"{self._pending} puts in flight (limit {self._max_pending})")
        self._pending += len(specs)
        sub = Submission(len(specs), done, timeout_s, self._settled)
        queued = self._queued
        for slot, spec in enumerate(specs):
            if not self._duplicate(spec.uniq_key, sub, slot):
                queued.append((spec, sub, slot))
        if queued and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_queued)

    def _settled(self, count: int) -> None:
        self._pending -= count

    def _duplicate(self, uniq_key: str, sub: Submission, slot: int) -> bool:
        """Whether the key is in the log already, committed (then `slot` is answered with
        that entry) or in the uncommitted tail (then it waits for that entry)."""
        index = self._recent.get(uniq_key) or self._tail_uniq.get(uniq_key)
        if index is None:
            return False
        if index <= self.committed_index:
            entry = self.store.get(index)
            sub.set(slot, self._result(index, entry.body, placement_of(entry.body), True))
        else:
            term = self.store.term(index) if index <= self.store.last_index() else 0
            self._waiters.setdefault(index, []).append(Waiter(term, sub, slot, True))
        return True

    def _flush_queued(self) -> None:
        """Encode the queued puts' queue fields and propose them as one batch."""
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        if not queued:
            return
        # Check again: a put queued in the same loop pass may carry the same key, and
        # the tables (with a new leadership's uncommitted tail, where a retried put's
        # first attempt may sit) may have changed since submit() looked. Same key twice
        # here: one entry.
        fresh: list[tuple[PutSpec, Submission, int]] = []
        again: dict[str, list[tuple[Submission, int]]] = {}
        for spec, sub, slot in queued:
            if sub.done.done():
                continue  # its caller stopped waiting before it left: never proposed
            if spec.uniq_key in again:
                again[spec.uniq_key].append((sub, slot))
            elif not self._duplicate(spec.uniq_key, sub, slot):
                again[spec.uniq_key] = []
                fresh.append((spec, sub, slot))
        queued = fresh
        if not queued:
            return  # every one answered by an entry already in the log
        now_ms = int(time.time() * 1000)
        host = store_host_bytes(self._store_host)  # the leader stores it
        datas: list[bytes] = []
        keys: list[tuple[str, int]] = []
        offsets: list[int] = []
        assigned: dict[tuple[str, int], int] = {}  # queue ends after this batch
        for spec, _, _ in queued:
            qid = spec.queue_id
            if qid is None:
                qid = self._round_robin.get(spec.topic, 0)
                self._round_robin[spec.topic] = (qid + 1) % self._queues
            key = (spec.topic, qid)
            qoff = assigned.get(key)
            if qoff is None:
                qoff = self._assign_next.get(key, 0)
            assigned[key] = qoff + 1
            keys.append(key)
            offsets.append(qoff)
            datas.append(stamp(spec.encoded, qid, qoff, now_ms, host))
        try:
            if self._core is None:
                raise NotLeader(None)  # an offline view leads nothing
            first, _last = self._core.propose(datas)
        except NotLeader as exc:
            for spec, sub, _ in queued:
                sub.fail(NotLeader(exc.leader_hint))
                for other, _ in again[spec.uniq_key]:
                    other.fail(NotLeader(exc.leader_hint))
            return
        term = self._core.term
        self._on_proposed(len(datas))
        # In the log now: advance the assignment table.
        self._assign_next.update(assigned)
        placed = self._proposed
        for k, (spec, sub, slot) in enumerate(queued):
            index = first + k
            self._tail_uniq[spec.uniq_key] = index
            waiters = self._waiters.setdefault(index, [])
            waiters.append(Waiter(term, sub, slot))
            waiters.extend(Waiter(term, s, n, True) for s, n in again[spec.uniq_key])
            topic, qid = keys[k]
            placed[index] = (term, Placement(topic, qid, offsets[k], now_ms, spec.uniq_key))

    def become_leader(self, term: int, tail: Sequence[Entry]) -> None:
        """Start assigning: the committed tables plus the uncommitted `tail` of our log."""
        self._lead_term = term
        self._assign_next = dict(self._queue_next)
        self._tail_uniq = {}
        self._round_robin = {}
        for e in tail:
            if e.kind != EntryKind.NORMAL or not e.data:
                continue
            hdr = placement_of(e.data)
            key = (hdr.topic, hdr.queue_id)
            self._assign_next[key] = max(self._assign_next.get(key, 0), hdr.queue_offset + 1)
            if hdr.uniq_key:
                self._tail_uniq[hdr.uniq_key] = e.index

    # -- applying committed entries ---------------------------------------------------

    def apply(self, entries: Sequence[Entry]) -> None:
        """Committed entries, in log order, each once."""
        if not entries:
            return
        headers = self._apply_to_tables(entries)
        waiters = self._waiters
        if waiters:
            for e, hdr in zip(entries, headers, strict=True):
                ws = waiters.pop(e.index, None)
                if ws:
                    self._resolve(e, hdr, ws)
        self._set_committed(entries[-1].index)

    def _apply_to_tables(self, entries: Sequence[Entry]) -> list[Placement | None]:
        headers: list[Placement | None] = []
        recent, queue_next, tail = self._recent, self._queue_next, self._tail_uniq
        proposed = self._proposed
        for e in entries:
            known = proposed.pop(e.index, None) if proposed else None
            if e.kind != EntryKind.NORMAL or not e.data:
                headers.append(None)
                continue
            # What this leader stamped, if the entry is the one it proposed (same term).
            hdr = known[1] if known is not None and known[0] == e.term else placement_of(e.data)
            headers.append(hdr)
            key = (hdr.topic, hdr.queue_id)
            queue_next[key] = max(queue_next.get(key, 0), hdr.queue_offset + 1)
            if hdr.uniq_key:
                recent[hdr.uniq_key] = e.index
                tail.pop(hdr.uniq_key, None)
        while len(recent) > self._window:
            recent.popitem(last=False)
        return headers

    def _resolve(self, e: Entry, hdr: Placement | None, ws: list[Waiter]) -> None:
        for w in ws:
            sub = w.submission
            if sub.done.done():
                continue
            if e.term == w.term and hdr is not None:
                sub.set(w.slot, self._result(e.index, e.data, hdr, w.duplicate))
            else:
                sub.fail(PutFailed(f"entry {e.index} was replaced by a newer leader's; retry"))

    def _result(self, index: int, data: bytes, hdr: Placement, duplicate: bool) -> PutResult:
        offset = self.store.pos_of(index) + HEADER_SIZE
        return PutResult(
            msg_id_of(data, offset),
            offset,
            hdr.queue_id,
            hdr.queue_offset,
            hdr.store_timestamp_ms,
            duplicate,
        )
