"""Delayed messages: delay levels and deliver-at timers over the replicated log.

RocketMQ's ScheduleMessageService, on Raft. A put with a delay level (1..N of
the configured levels, default "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m
20m 30m 1h 2h") or a deliver-at time (ms since the epoch, second precision,
RocketMQ 5's timer messages) is stored in the system topic `%SYS%SCHEDULE`
(RocketMQ's SCHEDULE_TOPIC_XXXX): queue L-1 for level L, queue N for deliver-at
times. The real topic and queue go in properties (REAL_TOPIC, REAL_QID) with
DELAY or TIMER_DELIVER_MS; the stored copy's UNIQ_KEY is "sched:" + the
producer's, so that a producer's retry of the delayed put is deduplicated, and
the delivered message gets the producer's own UNIQ_KEY.

`ScheduleService` runs on every node and acts only while its node leads. Per
level queue (ordered by store time, so due times are ordered too) it delivers
every message whose store timestamp + level delay has passed; for the deliver-at
queue it keeps a heap of due times of the messages past its progress. A delivery
is a put of the original message to its real topic; then the queue's progress
is recorded as an offset of the group `%SYS%SCHEDULE`, through Raft like any
group offset. Exactly once across failover: a new leader first settles its view
(system_log.SystemLog.settle) and puts a due message only if its UNIQ_KEY is not
already in the real topic (the key index), so a delivery the old leader
committed but did not record progress for is not repeated.

Never early: the due time is computed from the store timestamp the storing
leader wrote and compared with the delivering leader's clock; with clocks
apart by S, a message can be delivered up to S early (or late). Delivery lag is
at most the service's poll interval (50 ms) after the due time when the leader
keeps up.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dledger_commitlog.log.commitlog import PutSpec
from dledger_commitlog.messaging.system_log import SystemLog, run_passes
from dledger_commitlog.node.config import describe_level
from store.errors import InvalidMessage
from store.message import PROPERTY_UNIQ_KEY, StoredMessage

SCHEDULE_TOPIC = "%SYS%SCHEDULE"
SCHEDULE_GROUP = "%SYS%SCHEDULE"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_DELAY = "DELAY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
SCHEDULED_KEY_PREFIX = "sched:"
_POLL_S = 0.05
_BATCH = 256
WAITING_SCAN = 2_000  # deliver-at messages `waiting` reads at most
_SCHEDULE_PROPS = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QID,
    PROPERTY_DELAY,
    PROPERTY_TIMER_DELIVER_MS,
)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """Where a delayed put is stored instead of its topic."""

    queue_id: int
    properties: dict[str, str]
    uniq_key: str


def schedule(
    topic: str,
    queue_id: int | None,
    uniq_key: str,
    *,
    delay_level: int,
    deliver_at_ms: int,
    levels: Sequence[int],
    max_timer_delay_s: int,
    now_ms: int,
) -> Scheduled:
    """The schedule-topic placement of a delayed put; InvalidMessage for bad input."""
    if delay_level and deliver_at_ms:
        raise InvalidMessage("give a delay level or a deliver-at time, not both")
    props = {PROPERTY_REAL_TOPIC: topic}
    if queue_id is not None:
        props[PROPERTY_REAL_QID] = str(queue_id)
    if delay_level:
        if not 1 <= delay_level <= len(levels):
            raise InvalidMessage(
                f"unknown delay level {delay_level}: the levels are 1..{len(levels)} "
                f"({', '.join(describe_level(ms) for ms in levels)})"
            )
        props[PROPERTY_DELAY] = str(delay_level)
        return Scheduled(delay_level - 1, props, SCHEDULED_KEY_PREFIX + uniq_key)
    if deliver_at_ms <= now_ms:
        raise InvalidMessage(
            f"deliver-at {deliver_at_ms} ms is not in the future (now is {now_ms} ms)"
        )
    if deliver_at_ms > now_ms + max_timer_delay_s * 1000:
        raise InvalidMessage(
            f"deliver-at {deliver_at_ms} ms is more than {max_timer_delay_s} s ahead "
            f"(schedule.max_timer_delay_s)"
        )
    props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_at_ms)
    return Scheduled(len(levels), props, SCHEDULED_KEY_PREFIX + uniq_key)


def scheduled_properties(properties: dict[str, str], placed: Scheduled) -> dict[str, str]:
    """A delayed put's properties as stored: the producer's plus the placement's."""
    clash = sorted(set(properties) & set(_SCHEDULE_PROPS))
    if clash:
        raise InvalidMessage(f"properties {clash} are reserved for delayed messages")
    return {**properties, **placed.properties}


def delivery_of(msg: StoredMessage) -> tuple[str, int | None, dict[str, str], str]:
    """(real topic, real queue or None, properties, UNIQ_KEY) a stored delayed message
    is delivered with: the schedule properties stripped, the producer's UNIQ_KEY."""
    props = dict(msg.properties)
    topic = props[PROPERTY_REAL_TOPIC]
    qid_text = props.get(PROPERTY_REAL_QID)
    for name in _SCHEDULE_PROPS:
        props.pop(name, None)
    stored_key = msg.uniq_key or ""
    uniq = stored_key.removeprefix(SCHEDULED_KEY_PREFIX)
    props[PROPERTY_UNIQ_KEY] = uniq
    return topic, int(qid_text) if qid_text else None, props, uniq


def due_ms(msg: StoredMessage, levels: Sequence[int]) -> int:
    """When a stored delayed message is due (ms since the epoch)."""
    at = msg.properties.get(PROPERTY_TIMER_DELIVER_MS)
    if at is not None:
        return int(at)
    level = int(msg.properties.get(PROPERTY_DELAY, "1"))
    return msg.store_timestamp_ms + levels[min(max(level, 1), len(levels)) - 1]


class ScheduleService:
    """Delivers due delayed messages while this node leads (see the module docstring)."""

    def __init__(
        self,
        log_view: SystemLog,
        levels: Sequence[int],
        *,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        timeout_s: float = 5.0,
    ) -> None:
        self._log = log_view
        self._levels = tuple(levels)
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s
        self._term: int | None = None  # the leadership our state belongs to
        self._next: dict[int, int] = {}  # queue -> next offset to look at
        self._timer: list[tuple[int, int]] = []  # (due ms, queue offset) past progress
        self._timer_pending: set[int] = set()
        self._timer_scanned = 0
        self.delivered = 0
        self.on_delivered: Callable[[int], None] = lambda n: None  # a metrics counter
        self.wakeup = asyncio.Event()

    @property
    def levels(self) -> tuple[int, ...]:
        return self._levels

    @property
    def timer_queue(self) -> int:
        return len(self._levels)

    def waiting(self) -> list[tuple[int, int, int]]:
        """Per queue of the schedule topic (level L at L-1, deliver-at times last): the
        delayed messages stored and not yet delivered, and the store time of the oldest
        (0: none), as this node's log says (the committed progress; past it, a message
        of the deliver-at queue whose copy is in its real topic already is delivered).
        At most WAITING_SCAN messages of the deliver-at queue are looked at."""
        out = []
        for q in range(len(self._levels) + 1):
            low, end = self._log.queue_bounds(SCHEDULE_TOPIC, q)
            start = max(low, self._log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, q))
            if start >= end:
                out.append((0, 0))
                continue
            if q < len(self._levels):  # a level's queue is delivered in store order
                first = self._log.units(SCHEDULE_TOPIC, q, start, 1)
                oldest = self._log.message(first[0]).store_timestamp_ms if first else 0
                out.append((end - start, oldest))
                continue
            count, oldest = 0, 0
            for unit in self._log.units(SCHEDULE_TOPIC, q, start, WAITING_SCAN):
                msg = self._log.message(unit)
                topic, _qid, _props, uniq = delivery_of(msg)
                if self._log.find(topic, uniq) is None:
                    count += 1
                    oldest = oldest or msg.store_timestamp_ms
            out.append((count + max(0, end - start - WAITING_SCAN), oldest))
        return [(q, n, oldest) for q, (n, oldest) in enumerate(out)]

    def backlog(self) -> int:
        """Stored delayed messages not yet delivered (as this node sees the log)."""
        total = 0
        for q in range(len(self._levels) + 1):
            end = self._log.queue_end(SCHEDULE_TOPIC, q)
            total += max(0, end - self._log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, q))
        return total

    async def run(self) -> None:
        await run_passes(
            "schedule",
            self._log.node_id,
            self.pass_once,
            self.wakeup,
            _POLL_S,
            self._resettle,
            self.busy,
            self._log.next_commit,
        )

    def busy(self) -> bool:
        """Whether a pass may have work: this node leads and its state is not loaded
        yet, or a stored delayed message is not delivered (or not read) yet."""
        term = self._log.leading_term()
        if term is None:
            return False
        if term != self._term or self._timer:
            return True
        end = self._log.queue_end
        timer = self.timer_queue
        if end(SCHEDULE_TOPIC, timer) > self._timer_scanned:
            return True
        return any(end(SCHEDULE_TOPIC, q) > self._next[q] for q in range(timer))

    def _resettle(self) -> None:
        self._term = None

    async def pass_once(self) -> int:
        """Deliver what is due now; returns how many messages were delivered."""
        term = self._log.leading_term()
        if term is None:
            self._term = None
            return 0
        if term != self._term:
            await self._log.settle(self._timeout_s)
            self._next = {
                q: self._log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, q)
                for q in range(len(self._levels) + 1)
            }
            self._timer, self._timer_pending = [], set()
            self._timer_scanned = self._next[self.timer_queue]
            self._term = term
        delivered = 0
        for q in range(len(self._levels)):
            delivered += await self._level_pass(q)
        delivered += await self._timer_pass()
        self.delivered += delivered
        if delivered:
            self.on_delivered(delivered)
        return delivered

    async def _level_pass(self, q: int) -> int:
        now = self._clock_ms()
        start = self._next[q]
        due: list[StoredMessage] = []
        for unit in self._log.units(SCHEDULE_TOPIC, q, start, _BATCH):
            msg = self._log.message(unit)
            if due_ms(msg, self._levels) > now:
                break
            due.append(msg)
        if not due:
            return 0
        count = await self._deliver(due)
        self._next[q] = start + len(due)
        await self._log.put(
            [self._log.offset_commit(SCHEDULE_GROUP, SCHEDULE_TOPIC, q, self._next[q])],
            self._timeout_s,
        )
        return count

    async def _timer_pass(self) -> int:
        q = self.timer_queue
        while True:  # load what was stored since the last pass
            units = self._log.units(SCHEDULE_TOPIC, q, self._timer_scanned, _BATCH)
            for unit in units:
                msg = self._log.message(unit)
                heapq.heappush(self._timer, (due_ms(msg, self._levels), self._timer_scanned))
                self._timer_pending.add(self._timer_scanned)
                self._timer_scanned += 1
            if len(units) < _BATCH:
                break
        now = self._clock_ms()
        offsets: list[int] = []
        while self._timer and self._timer[0][0] <= now and len(offsets) < _BATCH:
            offsets.append(heapq.heappop(self._timer)[1])
        if not offsets:
            return 0
        msgs = [self._log.message(self._log.units(SCHEDULE_TOPIC, q, o, 1)[0]) for o in offsets]
        count = await self._deliver(msgs)
        self._timer_pending.difference_update(offsets)
        progress = min(self._timer_pending, default=self._timer_scanned)
        if progress > self._next[q]:
            self._next[q] = progress
            await self._log.put(
                [self._log.offset_commit(SCHEDULE_GROUP, SCHEDULE_TOPIC, q, progress)],
                self._timeout_s,
            )
        return count

    async def _deliver(self, msgs: Sequence[StoredMessage]) -> int:
        """Put each message to its real topic unless it is there already."""
        specs: list[PutSpec] = []
        for msg in msgs:
            topic, qid, props, uniq = delivery_of(msg)
            if self._log.find(topic, uniq) is not None:
                continue  # delivered before a failover, progress not yet recorded
            spec = self._log.prepare(
                topic,
                msg.body,
                props,
                uniq_key=uniq,
                queue_id=qid,
                born_timestamp_ms=msg.born_timestamp_ms,
                flag=msg.flag,
                born_host=msg.born_host,
            )
            specs.append(spec)
        if specs:
            await self._log.put(specs, self._timeout_s)
        return len(specs)
