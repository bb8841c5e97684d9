"""The trace of one stored message: what happened to it, from the log and the leader.

Owns `trace`: from a message (by commit-log offset) the events of its life, on the
shard that stores it, as one list ordered by time:

- `stored`: where and when (topic, queue, queue offset; the store time).
- per consumer group that reads its topic (committed offsets, or live members):
  `delivered` (to which member, the how-many-th time), `acked`, `nacked` (its
  outcome and delay level): the leader's recent delivery events
  (`deliveries.DeliveryLog`, memory: lost with a leader, and bounded);
- `retry` (the copy a nack put through the schedule topic, with its delay level
  and reconsume count: the nack's time), `retry_stored` (the copy stored in the
  group's retry topic when its delay ended), `dead_lettered` (with its
  DLQ_REASON), `resent` (a dead letter put to the retry topic again): all in the
  log, found by the UNIQ_KEYs the coordinator gives its copies
  (`retry:<group>:<offset>`, `dlq:<group>:<offset>`, `resend:<group>:<offset>`,
  the offset being the commit-log offset of the message copied) through the key
  index; the walk goes on from each copy, so retries of retries are in it too.

Per group it also says whether the group's committed offset (or the leader's acked
frontier) is past the last copy of it the group reads (`consumed`: durable, without
a time; a dead letter not resent is not consumed) and from when
the leader holds its delivery events (`history_since_ms`): events before that are
not known (another leader served them, or the ring dropped them).

Invariants: a trace reads and never writes; every copy it follows is checked to
be a message of the topic its key names (`SystemLog.find`); the walk ends after
`MAX_HOPS` copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatch.names import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.protocol import PROPERTY_DLQ_REASON, reconsume_times
from dledger_commitlog.messaging.deliveries import DeliveryEvent
from dledger_commitlog.messaging.group_state import DLQ_PREFIX, RETRY_PREFIX, dlq_topic, retry_topic
from dledger_commitlog.messaging.groups import GroupService
from dledger_commitlog.messaging.schedule import (
    PROPERTY_DELAY,
    SCHEDULE_TOPIC,
    SCHEDULED_KEY_PREFIX,
    due_ms,
)
from store.message import StoredMessage

MAX_HOPS = 1100  # copies followed: more than any group's retries (at most 1000) and a resend


@dataclass(frozen=True, slots=True)
class TraceEvent:
    time_ms: int
    kind: str  # stored, delivered, acked, nacked, retry, retry_stored, dead_lettered, resent
    group: str = ""
    topic: str = ""  # where the message (or the copy) the event is about is stored
    queue_id: int = 0
    queue_offset: int = 0
    commitlog_offset: int = -1  # of that copy (-1: the event is not about a stored copy)
    member_id: str = ""
    delivery_count: int = 0
    delay_level: int = 0
    reconsume_times: int = 0
    outcome: str = ""  # nacked: retry, in-place, dead-letter
    reason: str = ""  # dead_lettered: DLQ_REASON
    due_ms: int = 0  # retry: when the copy is due in the retry topic


@dataclass(slots=True)
class GroupTrace:
    group: str
    consumed: bool = False  # the group's acked frontier is past the last copy it reads
    history_since_ms: int = 0


@dataclass(slots=True)
class Trace:
    events: list[TraceEvent] = field(default_factory=list)
    groups: list[GroupTrace] = field(default_factory=list)


def trace(groups: GroupService, commitlog_offset: int, message: StoredMessage) -> Trace:
    """The trace of `message`, stored at `commitlog_offset` (see the module docstring);
    on the leader, after `groups.states()` settled its view."""
    out = Trace([_stored("stored", "", message, commitlog_offset)])
    for group in _groups_of(groups, message):
        found = GroupTrace(group, history_since_ms=groups.deliveries.history_since_ms(group))
        out.groups.append(found)
        last = _walk(groups, group, commitlog_offset, message, out.events)
        dead = out.events[-1].kind == "dead_lettered"  # the walk ended in the DLQ
        found.consumed = not dead and _consumed(groups, group, last)
    order = {id(e): i for i, e in enumerate(out.events)}
    out.events.sort(key=lambda e: (e.time_ms, order[id(e)]))
    return out


def _groups_of(groups: GroupService, message: StoredMessage) -> list[str]:
    """The groups that read the message's topic: with offsets on its queue, or live
    members subscribed to it; for a retry or dead-letter copy, its group."""
    topic = message.topic
    found = {g for (g, t, q) in groups.log.group_offsets() if t == topic}
    for name, state in groups.live_states().items():
        if any(topic in m.subscriptions for m in state.members.values()):
            found.add(name)
        if (topic, message.queue_id) in state.leases:
            found.add(name)
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            found.add(topic.removeprefix(prefix))
    return sorted(g for g in found if not g.startswith(SYSTEM_TOPIC_PREFIX))


def _walk(
    groups: GroupService,
    group: str,
    offset: int,
    msg: StoredMessage,
    events: list[TraceEvent],
) -> StoredMessage:
    """The group's events of `msg` and of every copy made of it, in order; the last
    copy the group reads (the message itself, a retry or a resent copy)."""
    log = groups.log
    for _hop in range(MAX_HOPS):
        for e in groups.deliveries.events(group, msg.topic, msg.queue_id, msg.queue_offset):
            events.append(_delivery(group, msg, offset, e))
        scheduled = log.find(SCHEDULE_TOPIC, f"{SCHEDULED_KEY_PREFIX}retry:{group}:{offset}")
        if scheduled is not None:
            _, copy = scheduled
            events.append(
                TraceEvent(
                    copy.store_timestamp_ms,
                    "retry",
                    group,
                    copy.topic,
                    copy.queue_id,
                    copy.queue_offset,
                    scheduled[0],
                    delay_level=int(copy.properties.get(PROPERTY_DELAY, "0") or 0),
                    reconsume_times=reconsume_times(copy.properties),
                    due_ms=due_ms(copy, groups.levels),
                )
            )
        retried = log.find(retry_topic(group), f"retry:{group}:{offset}")
        if retried is not None:
            events.append(_stored("retry_stored", group, retried[1], retried[0]))
        dead = log.find(dlq_topic(group), f"dlq:{group}:{offset}")
        if dead is not None:
            dead_offset, letter = dead
            events.append(
                _stored(
                    "dead_lettered",
                    group,
                    letter,
                    dead_offset,
                    reason=letter.properties.get(PROPERTY_DLQ_REASON, ""),
                )
            )
            resent = log.find(retry_topic(group), f"resend:{group}:{dead_offset}")
            if resent is None:
                return msg
            events.append(_stored("resent", group, resent[1], resent[0]))
            offset, msg = resent
            continue
        if retried is None:
            return msg
        offset, msg = retried
    return msg


def _consumed(groups: GroupService, group: str, msg: StoredMessage) -> bool:
    """Whether the group's acked frontier of the message's queue is past it."""
    done = groups.log.group_offset(group, msg.topic, msg.queue_id)
    state = groups.live_states().get(group)
    lease = state.leases.get((msg.topic, msg.queue_id)) if state is not None else None
    if lease is not None:
        done = max(done, lease.frontier)
    return done > msg.queue_offset


def _stored(
    kind: str, group: str, msg: StoredMessage, commitlog_offset: int, *, reason: str = ""
) -> TraceEvent:
    return TraceEvent(
        msg.store_timestamp_ms,
        kind,
        group,
        msg.topic,
        msg.queue_id,
        msg.queue_offset,
        commitlog_offset,
        reconsume_times=reconsume_times(msg.properties),
        reason=reason,
    )


def _delivery(group: str, msg: StoredMessage, offset: int, e: DeliveryEvent) -> TraceEvent:
    count = 0
    if e.kind == "delivered":
        count = e.counts[e.offsets.index(msg.queue_offset)] if e.counts else 1
    return TraceEvent(
        e.time_ms,
        e.kind,
        group,
        msg.topic,
        msg.queue_id,
        msg.queue_offset,
        offset,
        member_id=e.member_id,
        delivery_count=count,
        delay_level=e.delay_level,
        outcome=e.outcome,
    )
