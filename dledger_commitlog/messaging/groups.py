"""Consumer groups: the leader's coordinator over the replicated log.

Owns `GroupService`, the I/O around `group_state.GroupState`: one state per group,
rebuilt by every new leader (after `SystemLog.settle`, so the committed offsets it
starts from are complete), its fetches (`group_fetch.Fetcher`: planned and
recorded on the loop, read with the subscription's filter, `filters.compile_filter`,
on the server in the read pool; the long polls woken by what it does here: a
rebalance, an ack that ends an orderly run, a nack, a reset), the puts a nack
makes (to the group's retry topic `%RETRY%<group>` through the schedule topic on a
delay level, or to its dead-letter topic `%DLQ%<group>` after the maximum), and
the offset commits of acked messages (batched every FLUSH_INTERVAL_S through the
Raft log, as the OFFSETS system topic, so a new leader resumes from them).

Every change a consumer can observe after a failover is in the log: offsets,
retries (messages), dead letters (messages); leases and deliveries in flight are
the leader's memory, rebuilt from the members' heartbeats (see group_state). The
recent deliveries, acks and nacks with their member and time (`deliveries`, for a
message's trace) are memory only, and start afresh with each leadership.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from dispatch.names import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.protocol import PROPERTY_DLQ_REASON as PROPERTY_DLQ_REASON
from dledger_commitlog.common.protocol import PROPERTY_RECONSUME_TIMES as PROPERTY_RECONSUME_TIMES
from dledger_commitlog.common.protocol import PROPERTY_RETRY_TOPIC as PROPERTY_RETRY_TOPIC
from dledger_commitlog.common.protocol import reconsume_times
from dledger_commitlog.log.commitlog import PutSpec
from dledger_commitlog.messaging.deliveries import DeliveryLog
from dledger_commitlog.messaging.filters import MessageFilter, compile_filter
from dledger_commitlog.messaging.group_fetch import Fetched, Fetcher
from dledger_commitlog.messaging.group_lease import Lease
from dledger_commitlog.messaging.group_state import (
    DLQ_PREFIX,
    MAX_IN_FLIGHT_PER_QUEUE,
    RETRY_PREFIX,
    Claim,
    Epochs,
    GroupError,
    GroupState,
    QueueSource,
    Settings,
    StaleLease,
    UnknownMessage,
    dlq_topic,
    retry_topic,
)
from dledger_commitlog.messaging.schedule import SCHEDULE_TOPIC, schedule, scheduled_properties
from dledger_commitlog.messaging.system_log import SystemLog
from raft import NotLeader
from store.errors import InvalidMessage
from store.message import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, StoredMessage, check_name

log = logging.getLogger(__name__)

PROPERTY_ORIGIN_MSG_ID = "ORIGIN_MESSAGE_ID"
FLUSH_INTERVAL_S = 0.05
TICK_INTERVAL_S = 0.1
SETTLE_TIMEOUT_S = 10.0
_PUT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class NackOutcome:
    outcome: str  # "retry", "in-place" or "dead-letter"
    reconsume_times: int
    delay_ms: int
    delay_level: int = 0  # the level it is retried on (0: none, a dead letter)


def sharding_queue(key: str, queues: int) -> int:
    """The queue of a sharding key: the same key, the same queue (its order kept)."""
    return zlib.crc32(key.encode()) % queues


def reserved_topic(topic: str) -> bool:
    """A topic only the server puts to (system, retry and dead-letter topics)."""
    return topic.startswith((SYSTEM_TOPIC_PREFIX, RETRY_PREFIX, DLQ_PREFIX))


class GroupService:
    """The consumer-group coordinator of one node; acts while the node leads."""

    def __init__(
        self,
        system_log: SystemLog,
        levels: Sequence[int],
        *,
        queues_per_topic: int,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        max_timer_delay_s: int,
    ) -> None:
        self._log = system_log
        self._levels = tuple(levels)
        self.queues_per_topic = queues_per_topic
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._max_timer_delay_s = max_timer_delay_s
        self._term: int | None = None
        self._led_since: tuple[int, int] | None = None  # (term, ms) this node leads since
        self._groups: dict[str, GroupState] = {}
        self._filters: dict[tuple[str, str], MessageFilter] = {}
        self._epochs = Epochs(0)
        self._ready: asyncio.Future[None] | None = None
        self._changed = asyncio.Event()  # acks to commit, leases that moved
        self._source = QueueSource(self.queue_count, self._start_offset)
        self.deliveries = DeliveryLog()  # recent deliveries, acks and nacks (this term's)
        self._fetcher = Fetcher(system_log, self._filter, self.deliveries.delivered)

    # -- the state of this term ----------------------------------------------------------

    @property
    def log(self) -> SystemLog:
        return self._log

    @property
    def levels(self) -> tuple[int, ...]:
        return self._levels

    def live_states(self) -> dict[str, GroupState]:
        """The groups of the term this node leads now ({} when it does not)."""
        return self._groups if self._term == self._log.leading_term() else {}

    async def states(self) -> dict[str, GroupState]:
        return await self._states()

    async def _states(self) -> dict[str, GroupState]:
        """This leader's groups (NotLeader otherwise); a new term starts them afresh."""
        term = self._log.leading_term()
        if term is None:
            raise NotLeader(None)
        if term != self._term:
            self._term = term
            self._groups = {}
            self._epochs = Epochs(term)
            # nothing was delivered here in this term before its first group call
            self.deliveries.reset(int(time.time() * 1000) - (_now_ms() - self._led_since_ms()))
            self._ready = asyncio.get_running_loop().create_task(self._settle(term))
        assert self._ready is not None
        await asyncio.shield(self._ready)
        if self._log.leading_term() != term:
            raise NotLeader(None)
        return self._groups

    async def _settle(self, term: int) -> None:
        try:
            await self._log.settle(SETTLE_TIMEOUT_S)
        except (NotLeader, TimeoutError):
            if self._term == term:
                self._term = None  # the next call tries again
            raise NotLeader(None) from None

    async def _group(self, group: str, create: bool = False) -> GroupState:
        states = await self._states()
        state = states.get(group)
        if state is None:
            if not create:
                raise StaleLease(
                    f"group {group!r} has no live members on this leader: "
                    "heartbeat (again) to join it"
                )
            state = states[group] = GroupState(
                group,
                self._source,
                self._epochs,
                session_timeout_ms=self.session_timeout_ms,
                grace_until_ms=self._led_since_ms() + self.session_timeout_ms,
            )
        return state

    def _led_since_ms(self) -> int:
        """When this node's leadership began (as the loop saw it): the grace period for
        the old leader's leases runs from there, as the members' own session does."""
        term = self._log.leading_term()
        if self._led_since is None or self._led_since[0] != term:
            self._led_since = (term or 0, _now_ms())
        return self._led_since[1]

    def queue_count(self, topic: str) -> int:
        return 1 if reserved_topic(topic) else self.queues_per_topic

    def _start_offset(self, group: str, topic: str, queue_id: int) -> int:
        committed = self._log.group_offset(group, topic, queue_id)
        low, _high = self._log.queue_bounds(topic, queue_id)
        return max(committed, low)

    @staticmethod
    def now_ms() -> int:
        return _now_ms()

    def queue_end(self, topic: str, queue_id: int) -> int:
        return self._log.queue_bounds(topic, queue_id)[1]

    # -- members ---------------------------------------------------------------------

    async def heartbeat(
        self,
        group: str,
        member_id: str,
        client: str,
        subscriptions: Mapping[str, tuple[str, str]],
        settings: Settings,
        claims: Sequence[Claim],
    ) -> tuple[list[Lease], int]:
        """Register or refresh a member: its leases and the group's generation.
        InvalidMessage for bad input (a filter that does not parse), GroupConflict."""
        check_name(group, "group")
        if not member_id:
            raise InvalidMessage("member_id must not be empty")
        if not subscriptions:
            raise InvalidMessage("a member subscribes to at least one topic")
        for topic, (kind, expression) in subscriptions.items():
            check_name(topic)
            if reserved_topic(topic):
                raise InvalidMessage(f"topic {topic!r} is reserved: subscribe to user topics")
            self._filter(kind, expression)
        if not 1 <= settings.max_reconsume <= 1000:
            raise InvalidMessage(f"max_reconsume {settings.max_reconsume} outside [1, 1000]")
        if not 1 <= settings.first_retry_level <= len(self._levels):
            raise InvalidMessage(
                f"first_retry_level {settings.first_retry_level} outside [1, {len(self._levels)}]"
            )
        if settings.ack_wait_ms < 100:
            raise InvalidMessage(f"ack_wait_ms {settings.ack_wait_ms} is under 100 ms")
        state = await self._group(group, create=True)
        generation = state.generation
        leases = state.heartbeat(member_id, client, subscriptions, settings, claims, _now_ms())
        if state.generation != generation:
            self._changed.set()
            self._fetcher.poke(group)
        return leases, state.generation

    async def leave(self, group: str, member_id: str) -> None:
        states = await self._states()
        state = states.get(group)
        if state is not None:
            state.leave(member_id, _now_ms())
            self._changed.set()
            self._fetcher.poke(group)

    def _filter(self, kind: str, expression: str) -> MessageFilter:
        key = (kind.upper(), expression)
        flt = self._filters.get(key)
        if flt is None:
            flt = compile_filter(kind, expression)  # FilterError: an InvalidMessage
            if len(self._filters) > 4096:
                self._filters.clear()
            self._filters[key] = flt
        return flt

    # -- fetch -----------------------------------------------------------------------

    async def fetch(
        self,
        group: str,
        member_id: str,
        max_messages: int,
        wait_s: float,
        pool: Executor | None = None,
    ) -> Fetched:
        """Messages of the member's queues (waiting up to `wait_s` for some), its leases
        and the group's generation (`group_fetch`); the reads run in `pool` (None: here).
        StaleLease if it is not a live member."""
        return await self._fetcher.fetch(
            lambda: self._group(group), member_id, max_messages, wait_s, pool
        )

    def poke(self, group: str) -> None:
        """The fetches of `group` that wait plan again (its leases changed)."""
        self._fetcher.poke(group)

    # -- acks and nacks --------------------------------------------------------------

    async def ack(
        self, group: str, member_id: str, handles: Sequence[tuple[str, int, int, int, int]]
    ) -> int:
        """Ack (topic, queue, offset, epoch, end) handles: how many were news."""
        state = await self._group(group)
        acked = 0
        refused: GroupError | None = None
        now = _now_ms()
        touched: list[tuple[Lease, int]] = []  # and what it had in flight before
        try:
            for topic, queue_id, offset, epoch, end in handles:
                lease = state.leases.get((topic, queue_id))
                if lease is not None:
                    touched.append((lease, len(lease.in_flight)))
                high = functools.partial(self.queue_end, topic, queue_id)  # for a refusal
                try:
                    news = state.ack(member_id, topic, queue_id, epoch, offset, end, high, now)
                except GroupError as exc:  # the others still count: the first is reported
                    refused = refused or exc
                    continue
                if news:
                    acked += news
                    self.deliveries.acked(group, member_id, topic, queue_id, offset, end)
        finally:
            self._changed.set()
            if _freed(touched, state.settings.orderly):
                self._fetcher.poke(group)
        if refused is not None:
            raise refused
        return acked

    async def nack(
        self, group: str, member_id: str, handle: tuple[str, int, int, int], delay_level: int
    ) -> NackOutcome:
        """Retry a delivered message later (see the module docstring)."""
        began_ms = int(time.time() * 1000)  # the nack's time, before the copy it puts
        topic, queue_id, offset, epoch = handle
        state = await self._group(group)
        lease = state.check_lease(member_id, topic, queue_id, epoch)
        state.delivered(lease, offset)
        if delay_level and not 1 <= delay_level <= len(self._levels):
            raise InvalidMessage(f"delay level {delay_level} outside [1, {len(self._levels)}]")
        out = await self._nack(group, state, lease, offset, delay_level)
        self.deliveries.nacked(
            group, member_id, topic, queue_id, offset, out.outcome, out.delay_level, began_ms
        )
        return out

    async def _nack(
        self, group: str, state: GroupState, lease: Lease, offset: int, delay_level: int
    ) -> NackOutcome:
        topic, queue_id = lease.topic, lease.queue_id
        units = self._log.units(topic, queue_id, offset, 1)
        if not units:
            raise UnknownMessage(f"{topic}/{queue_id} offset {offset} is no longer stored")
        msg = self._log.message(units[0])
        settings = state.settings
        if settings.orderly:
            level = delay_level or 1
            delay_ms = self._levels[level - 1]
            tries = state.retry_in_place(lease, offset, delay_ms, _now_ms())
            if tries < settings.max_reconsume:
                self._moved(group)
                return NackOutcome("in-place", tries, delay_ms, level)
            # The queue stays paused until the dead letter is stored: were it to resume
            # after the delay, the message could be delivered again during the put.
            lease.suspended_until_ms = _HELD_MS
            try:
                await self._dead_letter(group, msg, units[0].commitlog_offset, tries, "orderly")
            except BaseException:
                lease.suspended_until_ms = _now_ms()  # not stored: it is retried in place
                self._moved(group)
                raise
            lease.suspended_until_ms = 0
            lease.mark_acked(offset)
            self._moved(group)
            return NackOutcome("dead-letter", tries, 0)
        times = lease.attempts.get(offset, reconsume_times(msg.properties)) + 1
        if times > settings.max_reconsume:
            await self._dead_letter(group, msg, units[0].commitlog_offset, times - 1, "retries")
            lease.mark_acked(offset)
            self._moved(group)
            return NackOutcome("dead-letter", times - 1, 0)
        level = delay_level or min(settings.first_retry_level + times - 1, len(self._levels))
        spec = self._retry_spec(group, msg, units[0].commitlog_offset, times, level)
        await self._log.put([spec], _PUT_TIMEOUT_S)
        lease.mark_acked(offset)
        self._moved(group)
        return NackOutcome("retry", times, self._levels[level - 1], level)

    def _retry_spec(
        self, group: str, msg: StoredMessage, commitlog_offset: int, times: int, level: int
    ) -> PutSpec:
        """A put of `msg` to the group's retry topic, through the schedule on `level`."""
        props = carried(msg, times)
        uniq = f"retry:{group}:{commitlog_offset}"
        placed = schedule(
            retry_topic(group),
            0,
            uniq,
            delay_level=level,
            deliver_at_ms=0,
            levels=self._levels,
            max_timer_delay_s=self._max_timer_delay_s,
            now_ms=int(time.time() * 1000),
        )
        return self.prepare_copy(
            msg,
            placed.uniq_key,
            SCHEDULE_TOPIC,
            placed.queue_id,
            scheduled_properties(props, placed),
        )

    async def _dead_letter(
        self, group: str, msg: StoredMessage, commitlog_offset: int, times: int, reason: str
    ) -> None:
        props = carried(msg, times)
        props[PROPERTY_DLQ_REASON] = reason
        uniq = f"dlq:{group}:{commitlog_offset}"
        spec = self.prepare_copy(msg, uniq, dlq_topic(group), 0, props)
        await self._log.put([spec], _PUT_TIMEOUT_S)

    def prepare_copy(
        self, msg: StoredMessage, uniq: str, topic: str, queue_id: int, props: dict[str, str]
    ) -> PutSpec:
        props = dict(props)
        if msg.keys:
            props[PROPERTY_KEYS] = " ".join(msg.keys)
        if msg.tags:
            props[PROPERTY_TAGS] = msg.tags
        return self._log.prepare(
            topic,
            msg.body,
            props,
            uniq_key=uniq,
            queue_id=queue_id,
            born_timestamp_ms=msg.born_timestamp_ms,
        )

    # -- operators -------------------------------------------------------------------

    async def commit_fenced(
        self, group: str, member_id: str, topic: str, queue_id: int, epoch: int, offset: int
    ) -> bool:
        """A client's own offset commit in a group with live members: only from the
        queue's owner under its lease (StaleLease), recorded as acks below `offset`.
        False if the group has no live members here (the commit goes through as is).

        A new leader does not know the old one's members until they claim their queues
        in the grace period: a commit for a group none of whose members claimed yet
        waits for the end of the grace period (a session timeout from the election),
        then is judged by who claimed; so a stale owner's commit, or anyone's plain
        one, cannot move an offset behind the members' backs right after a failover."""
        states = await self._states()
        state = states.get(group)
        grace_left_ms = self._led_since_ms() + self.session_timeout_ms - _now_ms()
        if grace_left_ms > 0 and (state is None or not state.members):
            await asyncio.sleep(grace_left_ms / 1000)
            states = await self._states()  # NotLeader if the leadership ended meanwhile
            state = states.get(group)
        if state is None or not state.members:
            if state is not None:
                state.reset(topic, queue_id, offset)  # members that join start from it
            return False
        if not member_id:
            raise StaleLease(
                f"group {group!r} has {len(state.members)} live member(s): an "
                "offset commit must name the member and its lease epoch"
            )
        lease = state.check_lease(member_id, topic, queue_id, epoch)
        if offset > lease.cursor:
            raise UnknownMessage(
                f"offset {offset} is past what {topic}/{queue_id} delivered "
                f"to group {group!r} ({lease.cursor})"
            )
        if offset > lease.frontier:
            lease.mark_range(lease.frontier, offset)
        self._moved(group)
        return True

    def _moved(self, group: str) -> None:
        """A change to commit, that may give the group's waiting fetches a read."""
        self._changed.set()
        self._fetcher.poke(group)

    async def state_of(self, group: str) -> GroupState | None:
        states = await self._states()
        return states.get(group)

    # -- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """While this node leads: expire members and move leases (every TICK_INTERVAL_S),
        commit the acked frontiers (every FLUSH_INTERVAL_S when there are some)."""
        try:
            await self._run()
        finally:
            self._fetcher.close()

    async def _run(self) -> None:
        last_tick = last_flush = 0.0
        while True:
            try:
                async with asyncio.timeout(FLUSH_INTERVAL_S):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()
            self._led_since_ms()
            if self._term is None or self._log.leading_term() != self._term:
                if self._fetcher.waiting:
                    self._fetcher.poke()  # no longer the leader: they answer so
                continue
            now = time.monotonic()
            if now - last_tick >= TICK_INTERVAL_S:
                last_tick = now
                for name, state in list(self._groups.items()):
                    self._fetcher.seen(state, _now_ms())
                    if state.tick(_now_ms()):
                        self._moved(name)
                    if not state.members and not state.unflushed():
                        del self._groups[name]  # members that come back start afresh
                await self._dead_letter_poisoned()
            if now - last_flush < FLUSH_INTERVAL_S:
                continue  # acks of the next FLUSH_INTERVAL_S go in one put
            last_flush = now
            try:
                await self._flush()
            except Exception as exc:  # interrupted: the acks stay, the next pass commits
                log.info("group offsets not committed this pass: %s", exc)
                await asyncio.sleep(FLUSH_INTERVAL_S)

    async def _dead_letter_poisoned(self) -> None:
        """Messages no handler finished within the ack wait, `max_reconsume` + 1 times
        (concurrent mode), go to the dead-letter topic: they stall the frontier
        otherwise, and would be delivered for ever."""
        for group, state in list(self._groups.items()):
            for lease, offset in state.poisoned(_now_ms()):
                units = self._log.units(lease.topic, lease.queue_id, offset, 1)
                if units:
                    msg = self._log.message(units[0])
                    times = lease.deliveries.get(offset, 0) - 1
                    await self._dead_letter(
                        group, msg, units[0].commitlog_offset, times, "ack-wait"
                    )
                lease.mark_acked(offset)
                self._moved(group)

    async def _flush(self) -> None:
        pending = [(g, t, q, o) for g, s in self._groups.items() for t, q, o in s.unflushed()]
        if not pending:
            return
        specs = [self._log.offset_commit(g, t, q, o) for g, t, q, o in pending]
        await self._log.put(specs, _PUT_TIMEOUT_S)
        for g, t, q, o in pending:
            state = self._groups.get(g)
            if state is not None:
                state.flushed(t, q, o)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


_HELD_MS = 1 << 62  # a queue's pause while the dead letter that ends its run is put


def _freed(touched: list[tuple[Lease, int]], orderly: bool) -> bool:
    """Whether acks may have given the owner's fetch a read: they ended an orderly run,
    or freed room in a queue that had its most in flight."""
    return any(
        (orderly and before and not lease.in_flight)
        or before >= MAX_IN_FLIGHT_PER_QUEUE > len(lease.in_flight)
        for lease, before in touched
    )


def carried(msg: StoredMessage, times: int) -> dict[str, str]:
    """The properties a retried or dead-lettered copy of `msg` carries."""
    props = {
        k: v
        for k, v in msg.properties.items()
        if k not in (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY)
    }
    props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
    props.setdefault(PROPERTY_ORIGIN_MSG_ID, msg.uniq_key or "")
    props[PROPERTY_RECONSUME_TIMES] = str(times)
    return props
