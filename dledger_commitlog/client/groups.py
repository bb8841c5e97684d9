"""Consumer-group calls, written once for both clients, and what they return.

Owns `GroupOps` (a mixin of `Client` and `AsyncClient`: heartbeat, fetch, ack,
nack, leave, and the operators' list, describe, reset-offsets and dead-letter
calls, each an `operation.operation`), `Subscription`, and the values: `Delivery`
(decoded from a fetch's compact answer, `run_deliveries`), `QueueLease`,
`GroupSummary`, `GroupDescription`, and what a consumer's handler sees and answers
(`ConsumedMessage`, `Retry`). `consumer.AsyncConsumer` and `consumer.Consumer`
are built on these; an operator's tool uses them directly.

A refusal of the coordinator (a lease the member no longer holds, a member whose
session ended, settings that disagree with the group's) is `GroupRefused`; an ack
or nack of a message never delivered, or an unknown group, is `NotFound`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from dledger_commitlog.client.errors import GroupRefused
from dledger_commitlog.client.operation import operation
from dledger_commitlog.client.retry import Op
from dledger_commitlog.client.values import StoredMessage, stored_message, stored_message_of
from dledger_commitlog.common.protocol import origin_topic, reconsume_times
from proto import dledger_pb2 as pb
from store.message import decode_messages


@dataclass(frozen=True, slots=True)
class Subscription:
    """A topic a consumer takes, with a filter the server applies: `kind` "TAG" (the
    expression is "*" or "TagA || TagB") or "SQL92" (e.g. "a > 5 AND region IN ('eu')")."""

    topic: str
    expression: str = "*"
    kind: str = "TAG"

    @classmethod
    def sql(cls, topic: str, expression: str) -> Subscription:
        return cls(topic, expression, "SQL92")

    def to_pb(self) -> pb.Subscription:
        return pb.Subscription(topic=self.topic, filter_kind=self.kind, expression=self.expression)


@dataclass(frozen=True, slots=True)
class QueueLease:
    """A queue a member holds, under `epoch` (its acks carry it)."""

    topic: str
    queue_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message handed to a member: ack it (or nack it) by its handle."""

    message: StoredMessage  # topic/queue_id/queue_offset: where it is stored
    epoch: int
    reconsume_times: int
    origin_topic: str  # the producer's topic (a retry is stored in %RETRY%<group>)
    delivery_count: int

    @property
    def handle(self) -> tuple[str, int, int, int]:
        m = self.message
        return (m.topic, m.queue_id, m.queue_offset, self.epoch)


@dataclass(frozen=True, slots=True)
class Retry:
    """A handler's answer: retry this message later, on `delay_level` (0: the group's
    policy, the first retry level plus the times it was retried)."""

    delay_level: int = 0


HandlerResult = bool | None | Retry
Handler = Callable[["ConsumedMessage"], HandlerResult | Awaitable[HandlerResult]]


@dataclass(frozen=True, slots=True)
class ConsumedMessage:
    """A delivered message as a handler sees it: `topic` is the producer's topic,
    `stored_topic`/`queue_id`/`queue_offset` where this copy is stored (a retried
    message is stored in the group's retry topic)."""

    delivery: Delivery

    @property
    def message(self) -> StoredMessage:
        return self.delivery.message

    @property
    def topic(self) -> str:
        return self.delivery.origin_topic

    @property
    def stored_topic(self) -> str:
        return self.delivery.message.topic

    @property
    def queue_id(self) -> int:
        return self.delivery.message.queue_id

    @property
    def queue_offset(self) -> int:
        return self.delivery.message.queue_offset

    @property
    def body(self) -> bytes:
        return self.delivery.message.body

    @property
    def msg_id(self) -> str:
        return self.delivery.message.msg_id

    @property
    def reconsume_times(self) -> int:
        return self.delivery.reconsume_times


@dataclass(frozen=True, slots=True)
class Fetched:
    deliveries: tuple[Delivery, ...]
    leases: tuple[QueueLease, ...]
    generation: int


@dataclass(frozen=True, slots=True)
class Membership:
    """A heartbeat's answer: the member's queues and the coordinator's timing."""

    leases: tuple[QueueLease, ...]
    session_timeout_ms: int
    heartbeat_interval_ms: int
    generation: int


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group: str
    members: int
    lag: int
    retries: int
    dead_letters: int
    strategy: str
    orderly: bool
    generation: int
    oldest_unconsumed_ms: int = 0  # store time of its oldest unconsumed message (0: none)


@dataclass(frozen=True, slots=True)
class GroupQueue:
    topic: str
    queue_id: int
    committed: int  # -1: nothing committed
    max_offset: int
    lag: int
    owner: str
    epoch: int
    in_flight: int
    revoking: bool
    oldest_unconsumed_ms: int = 0  # store time of the message at its frontier (0: none)


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client: str
    last_seen_ms_ago: int
    leases: tuple[QueueLease, ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    summary: GroupSummary
    members: tuple[GroupMember, ...]
    queues: tuple[GroupQueue, ...]
    subscriptions: tuple[Subscription, ...]


@dataclass(frozen=True, slots=True)
class DeadLetters:
    messages: tuple[StoredMessage, ...]
    resent: int
    next_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One event of a message's life (`message_trace`; proto TraceEvent says each field)."""

    time_ms: int
    kind: str  # stored, delivered, acked, nacked, retry, retry_stored, dead_lettered, resent
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    member_id: str
    delivery_count: int
    delay_level: int
    reconsume_times: int
    outcome: str
    reason: str
    due_ms: int


@dataclass(frozen=True, slots=True)
class TraceGroup:
    group: str
    consumed: bool  # its acked frontier is past the last copy of the message it reads
    history_since_ms: int  # the leader holds its delivery events from then on


@dataclass(frozen=True, slots=True)
class MessageTrace:
    events: tuple[TraceEvent, ...]  # ordered by time
    groups: tuple[TraceGroup, ...]


def _leases(items: Sequence[pb.QueueLease]) -> tuple[QueueLease, ...]:
    return tuple(QueueLease(x.topic, x.queue_id, x.epoch) for x in items)


def _summary(s: pb.GroupSummary) -> GroupSummary:
    return GroupSummary(
        s.group,
        s.members,
        s.lag,
        s.retries,
        s.dead_letters,
        s.strategy,
        s.orderly,
        s.generation,
        s.oldest_unconsumed_ms,
    )


def _delivery(d: pb.Delivery) -> Delivery:
    return Delivery(
        stored_message(d.message), d.epoch, d.reconsume_times, d.origin_topic, d.delivery_count
    )


def run_deliveries(run: pb.DeliveryRun) -> list[Delivery]:
    """The deliveries of a DeliveryRun: each message decoded by the message codec (its
    body CRC checked), the rest of Delivery from the message or the run's lists."""
    raw, counts, retries = run.messages, run.delivery_counts, run.reconsume_times
    out = []
    for i, (at, parts) in enumerate(decode_messages(raw)):
        props = parts[3]
        times = retries[i] if retries and retries[i] >= 0 else reconsume_times(props)
        origin = origin_topic(parts[1], props)
        message = stored_message_of(raw, at, parts)  # takes KEYS, TAGS, UNIQ_KEY out
        out.append(Delivery(message, run.epoch, times, origin, counts[i]))
    return out


def _handle(h: tuple[str, int, int, int] | tuple[str, int, int, int, int]) -> pb.MessageHandle:
    end = h[4] if len(h) == 5 else 0
    return pb.MessageHandle(
        topic=h[0], queue_id=h[1], queue_offset=h[2], epoch=h[3], end_offset=end
    )


class GroupOps:
    """The consumer-group operations (mixed into `Client` and `AsyncClient`)."""

    @operation
    def group_heartbeat(
        self,
        group: str,
        member_id: str,
        subscriptions: Sequence[Subscription],
        *,
        strategy: str = "average",
        orderly: bool = False,
        max_reconsume: int = 16,
        ack_wait_ms: int = 30_000,
        first_retry_level: int = 0,
        held: Sequence[pb.QueueLease] = (),
        client_name: str = "",
    ) -> Op[Membership]:
        """Join or stay in `group`: the member's queues now."""
        request = pb.GroupHeartbeatRequest(
            group=group,
            member_id=member_id,
            subscriptions=[s.to_pb() for s in subscriptions],
            strategy=strategy,
            orderly=orderly,
            max_reconsume=max_reconsume,
            ack_wait_ms=ack_wait_ms,
            first_retry_level=first_retry_level,
            held=list(held),
            client=client_name,
        )

        def convert(r: pb.GroupHeartbeatResponse) -> Membership:
            return Membership(
                _leases(r.queues), r.session_timeout_ms, r.heartbeat_interval_ms, r.generation
            )

        return Op("group_heartbeat", "GroupHeartbeat", request, convert, refusal=GroupRefused)

    @operation
    def group_fetch(
        self, group: str, member_id: str, max_messages: int = 32, wait_ms: int = 1000
    ) -> Op[Fetched]:
        """Messages of the member's queues (long polling up to `wait_ms`)."""
        request = pb.GroupFetchRequest(
            group=group, member_id=member_id, runs=True, max_messages=max_messages, wait_ms=wait_ms
        )

        def convert(r: pb.GroupFetchResponse) -> Fetched:
            out = [_delivery(d) for d in r.deliveries]  # a server without runs answers so
            for run in r.runs:
                out += run_deliveries(run)
            return Fetched(tuple(out), _leases(r.queues), r.generation)

        return Op(
            "group_fetch",
            "GroupFetch",
            request,
            convert,
            floor_s=1 + wait_ms / 1000,
            refusal=GroupRefused,
        )

    @operation
    def group_ack(
        self,
        group: str,
        member_id: str,
        handles: Sequence[tuple[str, int, int, int] | tuple[str, int, int, int, int]],
    ) -> Op[int]:
        """Ack deliveries by handle (topic, queue, offset, epoch[, end: a range]): how
        many were news."""
        request = pb.GroupAckRequest(
            group=group, member_id=member_id, handles=[_handle(h) for h in handles]
        )
        return Op("group_ack", "GroupAck", request, lambda r: r.acked, refusal=GroupRefused)

    @operation
    def group_nack(
        self,
        group: str,
        member_id: str,
        handle: tuple[str, int, int, int],
        delay_level: int = 0,
    ) -> Op[tuple[str, int, int]]:
        """Retry a delivery later: (outcome "retry", "in-place" or "dead-letter",
        reconsume times, delay in ms)."""
        request = pb.GroupNackRequest(
            group=group, member_id=member_id, handle=_handle(handle), delay_level=delay_level
        )
        # Not retried blindly after an unknown outcome: the retry copy's UNIQ_KEY names
        # the stored message, so a second nack of it is a duplicate the log drops.
        return Op(
            "group_nack",
            "GroupNack",
            request,
            lambda r: (r.outcome, r.reconsume_times, r.delay_ms),
            refusal=GroupRefused,
        )

    @operation
    def group_leave(self, group: str, member_id: str) -> Op[None]:
        """Leave the group at once (its queues move without waiting for the session)."""
        request = pb.GroupLeaveRequest(group=group, member_id=member_id)
        return Op("group_leave", "GroupLeave", request, lambda r: None, refusal=GroupRefused)

    @operation
    def group_list(self) -> Op[list[GroupSummary]]:
        """Every group with offsets or live members, with its lag, retries, dead letters."""
        return Op(
            "group_list",
            "GroupList",
            pb.GroupListRequest(),
            lambda r: [_summary(s) for s in r.groups],
        )

    @operation
    def group_describe(self, group: str) -> Op[GroupDescription]:
        """Members, queue leases, offsets and lag of one group (NotFound: unknown group)."""

        def convert(r: pb.GroupDescribeResponse) -> GroupDescription:
            return GroupDescription(
                _summary(r.summary),
                tuple(
                    GroupMember(m.member_id, m.client, m.last_seen_ms_ago, _leases(m.queues))
                    for m in r.members
                ),
                tuple(
                    GroupQueue(
                        q.topic,
                        q.queue_id,
                        q.committed,
                        q.max_offset,
                        q.lag,
                        q.owner,
                        q.epoch,
                        q.in_flight,
                        q.revoking,
                        q.oldest_unconsumed_ms,
                    )
                    for q in r.queues
                ),
                tuple(Subscription(s.topic, s.expression, s.filter_kind) for s in r.subscriptions),
            )

        return Op("group_describe", "GroupDescribe", pb.GroupDescribeRequest(group=group), convert)

    @operation
    def group_reset_offsets(
        self,
        group: str,
        topic: str,
        to: str,
        value: int = 0,
        *,
        queue_id: int = -1,
        force: bool = False,
    ) -> Op[dict[int, int]]:
        """Move the group's offsets of `topic` to "earliest", "latest", "offset" (`value`)
        or "time" (`value`: ms since the epoch): queue -> its new offset."""
        request = pb.GroupResetOffsetsRequest(
            group=group, topic=topic, queue_id=queue_id, to=to, value=value, force=force
        )
        return Op(
            "group_reset_offsets",
            "GroupResetOffsets",
            request,
            lambda r: {o.queue_id: o.offset for o in r.offsets},
            refusal=GroupRefused,
        )

    @operation
    def group_dlq(
        self,
        group: str,
        from_offset: int = 0,
        max_messages: int = 32,
        *,
        resend: Sequence[int] = (),
        resend_all: bool = False,
    ) -> Op[DeadLetters]:
        """The group's dead letters from `from_offset`; `resend` (DLQ offsets) or
        `resend_all` (those read) puts them again, to the group's retry topic."""
        request = pb.GroupDlqRequest(
            group=group,
            from_offset=from_offset,
            max_messages=max_messages,
            resend_offsets=list(resend),
            resend_all=resend_all,
        )

        def convert(r: pb.GroupDlqResponse) -> DeadLetters:
            return DeadLetters(
                tuple(stored_message(m) for m in r.messages), r.resent, r.next_offset, r.max_offset
            )

        return Op("group_dlq", "GroupDlq", request, convert, write=bool(resend or resend_all))

    @operation
    def message_trace(self, msg_id: str) -> Op[MessageTrace]:
        """What happened to a message: stored, delivered to which member of which group,
        acked, nacked, retried, dead-lettered, resent (the leader of its shard answers;
        NotFound: no such message)."""

        def convert(r: pb.MessageTraceResponse) -> MessageTrace:
            names = TraceEvent.__dataclass_fields__
            return MessageTrace(
                tuple(TraceEvent(**{n: getattr(e, n) for n in names}) for e in r.events),
                tuple(TraceGroup(g.group, g.consumed, g.history_since_ms) for g in r.groups),
            )

        request = pb.MessageTraceRequest(msg_id=msg_id)
        return Op("message_trace", "MessageTrace", request, convert)
