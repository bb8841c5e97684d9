"""A consumer-group fetch on the leader: plan on the loop, read in the read pool, record; and
the long poll, woken by what can give the member something to read.

Owns `Fetcher` (one per coordinator, `groups.GroupService`) and what a fetch
hands out (`Delivered`, `Fetched`). A fetch goes in three steps:

1. On the loop: the plan (`GroupState.plan_fetch`), given each queue's dispatched
   end, so the fetch is shared out among the queues that have something past the
   cursor or redeliveries due, and only what is new is read; the snapshots to read
   with (`SystemLog.queue_view`, `log_view`); what retention removed is skipped.
2. In the read pool: each queue's run read as stored and filtered (`group_reads`).
3. On the loop: each run recorded (`GroupState.record`, and `on_delivered`: the
   coordinator's recent deliveries, `deliveries.DeliveryLog`). What changed meanwhile
   wins: a run whose lease moved (`record` drops it) or whose cursor moved (an
   operator's reset) is dropped, and so is a redelivery that was acked, or handed
   out again by a concurrent fetch, meanwhile.

The long poll. A fetch that found nothing waits, and wakes when a queue its member
may read has been dispatched past its cursor (one task watches dispatch while any
fetch waits), when something else may give it a read (`poke`: its group
rebalanced, an ack ended an orderly run or freed a full queue, a nack, a reset,
this node stopped leading), at the first in-flight deadline, suspension or end of
the grace period that may make a redelivery due, or at its deadline. Other
commits and acks (offset commits, other topics, the acks of a concurrent group)
do not wake it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from dledger_commitlog.log import reads
from dledger_commitlog.messaging.filters import MessageFilter
from dledger_commitlog.messaging.group_lease import Lease, QueueRef
from dledger_commitlog.messaging.group_reads import Batch, QueueRead, read_batches
from dledger_commitlog.messaging.group_state import (
    MAX_IN_FLIGHT_PER_QUEUE,
    RETRY_PREFIX,
    GroupState,
    Read,
)
from dledger_commitlog.messaging.system_log import SystemLog

MAX_FETCH = 256  # messages per fetch
MAX_FETCH_BYTES = 8 << 20  # of messages per fetch, about (one at least): one gRPC answer
DEFAULT_FETCH = 32
WATCH_IDLE_S = 1.0  # the dispatch watch ends after this long without waiting fetches
INLINE_READ_MAX = 64  # a fetch of at most this many messages reads them on the loop
# (group, member, topic, queue, offsets, delivery counts) of each run handed out
OnDelivered = Callable[[str, str, str, int, Sequence[int], Sequence[int]], None]


@dataclass(frozen=True, slots=True)
class Delivered:
    """One queue's messages a fetch hands out, as stored, queue offsets rising."""

    topic: str
    queue_id: int
    epoch: int
    messages: list[bytes]
    counts: list[int]  # deliveries of each to the group
    retries: list[int]  # in-place retries of each (orderly), -1: its RECONSUME_TIMES; [] all -1


@dataclass(frozen=True, slots=True)
class Fetched:
    """A fetch's answer: the runs delivered, the member's leases, the group's generation."""

    runs: list[Delivered]
    leases: list[Lease]
    generation: int


@dataclass(eq=False, slots=True)
class _Waiter:
    state: GroupState
    member_id: str
    woken: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def wake(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


class Fetcher:
    """The fetches of one coordinator (see the module docstring)."""

    def __init__(
        self,
        log: SystemLog,
        filter_of: Callable[[str, str], MessageFilter],
        on_delivered: OnDelivered = lambda *_: None,
    ) -> None:
        self._log = log
        self._filter_of = filter_of
        self._on_delivered = on_delivered
        self._waiting: set[_Waiter] = set()
        self._watch: asyncio.Task[None] | None = None
        self._pokes: dict[str, int] = {}  # per group, pokes so far

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def poke(self, group: str | None = None) -> None:
        """Something changed that may give the waiting fetches of `group` (None: of every
        group) something to read: they plan again."""
        if group is not None:
            self._pokes[group] = self._pokes.get(group, 0) + 1
        for waiter in list(self._waiting):
            if group is None or waiter.state.group == group:
                waiter.wake()

    def seen(self, state: GroupState, now_ms: int) -> None:
        """A member whose fetch waits is not silent: its session goes on (as a fetch's
        plan says of its member)."""
        for waiter in self._waiting:
            member = state.members.get(waiter.member_id)
            if waiter.state is state and member is not None:
                member.last_seen_ms = max(member.last_seen_ms, now_ms)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    async def fetch(
        self,
        state_of: Callable[[], Awaitable[GroupState]],
        member_id: str,
        max_messages: int,
        wait_s: float,
        pool: Executor | None,
    ) -> Fetched:
        """Messages of the member's queues, waiting up to `wait_s` for some; `state_of`
        gives the group's state now (NotLeader, StaleLease), `pool` runs the reads."""
        max_messages = max(1, min(max_messages or DEFAULT_FETCH, MAX_FETCH))
        deadline = time.monotonic() + wait_s
        while True:
            state = await state_of()
            mark = (self._log.dispatched_pos, self._pokes.get(state.group, 0))
            out, moved = await self._once(state, member_id, max_messages, pool)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return Fetched(out, state.leases_of(member_id), state.generation)
            if moved or mark != (self._log.dispatched_pos, self._pokes.get(state.group, 0)):
                await asyncio.sleep(0)  # others run between the passes of a long scan
                continue  # the filter dropped what was read, or news came meanwhile
            await self._wait(state, member_id, remaining)

    # -- one pass ----------------------------------------------------------------------

    async def _once(
        self, state: GroupState, member_id: str, max_messages: int, pool: Executor | None
    ) -> tuple[list[Delivered], bool]:
        """Plan, read, record: the runs delivered, and whether a cursor moved."""
        views: dict[QueueRef, reads.QueueView | None] = {}

        def end(topic: str, queue_id: int) -> int:
            view = views[(topic, queue_id)] = self._log.queue_view(topic, queue_id)
            return 0 if view is None else view.max_offset

        planned_ms = _now_ms()
        plan = state.plan_fetch(member_id, max_messages, planned_ms, end)
        if not plan:
            return [], False
        parts = []  # (job, the lease's cursor now, redeliveries that retention removed)
        for read in plan:
            job, lost = self._job(state, member_id, read, views[(read.topic, read.queue_id)])
            parts.append((job, state.leases[(read.topic, read.queue_id)].cursor, lost))
        turn = (state.generation + planned_ms) % len(parts)  # whose run comes first: the
        parts = parts[turn:] + parts[:turn]  # byte bound may end the fetch in a later one
        jobs = [job for job, _cursor, _lost in parts]
        view = self._log.log_view()
        if pool is None or sum(len(r.redeliver) + r.count for r in plan) <= INLINE_READ_MAX:
            batches = read_batches(view, jobs, MAX_FETCH_BYTES)
        else:
            loop = asyncio.get_running_loop()
            batches = await loop.run_in_executor(pool, read_batches, view, jobs, MAX_FETCH_BYTES)
        out: list[Delivered] = []
        moved = False
        now = _now_ms()
        for (job, cursor, lost), batch in zip(parts, batches, strict=True):
            read = job.read
            lease = state.leases.get((read.topic, read.queue_id))
            if lease is None or lease.cursor != cursor:
                continue  # reset meanwhile: the next plan reads from where it is now
            offsets, messages = _still_due(lease, cursor, planned_ms, batch)
            counts = state.record(
                member_id, read, offsets, [*lost, *batch.skipped], batch.next_offset, now
            )
            if counts is None:
                continue
            moved = moved or bool(lost or batch.skipped) or lease.cursor != cursor
            if offsets:
                self._on_delivered(
                    state.group, member_id, read.topic, read.queue_id, offsets, counts
                )
                retries = [lease.attempts.get(o, -1) for o in offsets] if lease.attempts else []
                out.append(
                    Delivered(read.topic, read.queue_id, read.epoch, messages, counts, retries)
                )
        return out, moved

    def _job(
        self, state: GroupState, member_id: str, read: Read, queue: reads.QueueView | None
    ) -> tuple[QueueRead, list[int]]:
        """What the read pool reads of one planned queue, and the plan's redeliveries that
        retention removed (they count as acked)."""
        low = 0 if queue is None else queue.min_offset
        start = max(read.start, low)
        if start > read.start:
            state.leases[(read.topic, read.queue_id)].skip_below(start)
        flt = None
        if not read.topic.startswith(RETRY_PREFIX):
            member = state.members[member_id]
            kind, expression = member.subscriptions.get(read.topic, ("TAG", "*"))
            flt = self._filter_of(kind, expression)
            if flt.accepts_all:
                flt = None  # "*": no per-message work
        kept = tuple(o for o in read.redeliver if o >= low)
        lost = [o for o in read.redeliver if o < low]
        return QueueRead(read, queue, start, kept, flt), lost

    # -- the long poll -------------------------------------------------------------------

    async def _wait(self, state: GroupState, member_id: str, timeout_s: float) -> None:
        now = _now_ms()
        due = _next_due_ms(state, member_id, now)
        if due is not None:
            timeout_s = min(timeout_s, (due - now) / 1000)
        waiter = _Waiter(state, member_id)
        self._waiting.add(waiter)
        if self._watch is None or self._watch.done():
            loop = asyncio.get_running_loop()
            self._watch = loop.create_task(self._watch_dispatch(), name="group-fetch-watch")
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await waiter.woken
        except TimeoutError:
            pass
        finally:
            self._waiting.discard(waiter)

    async def _watch_dispatch(self) -> None:
        """While fetches wait: after each dispatched batch, wake those it gave news."""
        while self._waiting:
            await self._log.next_dispatch(WATCH_IDLE_S)
            now = _now_ms()
            for waiter in list(self._waiting):
                if _has_news(waiter.state, waiter.member_id, self._log.queue_end, now):
                    waiter.wake()


def _still_due(
    lease: Lease, cursor: int, planned_ms: int, batch: Batch
) -> tuple[list[int], list[bytes]]:
    """The batch's deliveries less the redeliveries (below `cursor`) that are not due any
    more: acked meanwhile, or handed out again by a concurrent fetch."""
    offsets, messages = batch.offsets, batch.messages
    if not offsets or offsets[0] >= cursor:
        return offsets, messages
    keep = [
        i
        for i, o in enumerate(offsets)
        if o >= cursor or lease.in_flight.get(o, planned_ms + 1) <= planned_ms
    ]
    if len(keep) == len(offsets):
        return offsets, messages
    return [offsets[i] for i in keep], [messages[i] for i in keep]


def _has_news(state: GroupState, member_id: str, end: Callable[[str, int], int], now: int) -> bool:
    """Whether a queue `member_id` may read now has been dispatched past its cursor."""
    if now < state.grace_until_ms:
        return False
    orderly = state.settings.orderly
    for lease in state.leases.values():
        if lease.owner != member_id or lease.target is not None:
            continue
        if lease.suspended_until_ms > now or len(lease.in_flight) >= MAX_IN_FLIGHT_PER_QUEUE:
            continue
        if orderly and lease.in_flight:
            continue
        if end(lease.topic, lease.queue_id) > lease.cursor:
            return True
    return False


def _next_due_ms(state: GroupState, member_id: str, now: int) -> int | None:
    """The first time after `now` that may make something of the member's due without a
    dispatch or a poke: a deadline of a delivery in flight, a suspension's end, the
    end of the grace period."""
    due = [state.grace_until_ms] if now < state.grace_until_ms else []
    for lease in state.leases.values():
        if lease.owner != member_id:
            continue
        if lease.suspended_until_ms > now:
            due.append(lease.suspended_until_ms)
        later = [d for d in lease.in_flight.values() if d > now]
        if later:
            due.append(min(later))
    return min(due, default=None)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
