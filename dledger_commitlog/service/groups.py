"""Consumer-group RPCs: heartbeat, fetch, ack, nack, leave, and the operators' calls.

Owns `GroupRpcs`, the gRPC face of `messaging.groups.GroupService` (the leader's
coordinator). Only the leader answers; a follower redirects (FAILED_PRECONDITION
with the leader's address, which the clients follow). Errors a consumer sees:
INVALID_ARGUMENT for bad input (a filter that does not parse names its column),
FAILED_PRECONDITION for a lease it does not hold (a stale owner, fenced) or
settings that disagree with its group's, NOT_FOUND for an ack or nack of a message
never delivered to the group, or an unknown group in describe.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

import grpc

from dledger_commitlog.common.protocol import origin_topic, reconsume_times
from dledger_commitlog.common.routes import shard_of_msg_id
from dledger_commitlog.log.commitlog import OutcomeUnknown, Overloaded, PutFailed
from dledger_commitlog.log.message_layout import offset_of_msg_id
from dledger_commitlog.messaging.group_fetch import Delivered
from dledger_commitlog.messaging.group_lease import Lease
from dledger_commitlog.messaging.group_state import (
    DEFAULT_ACK_WAIT_MS,
    DEFAULT_FIRST_RETRY_LEVEL,
    DEFAULT_MAX_RECONSUME,
    Claim,
    GroupConflict,
    Settings,
    StaleLease,
    UnknownMessage,
)
from dledger_commitlog.messaging.message_trace import trace
from dledger_commitlog.node.acl import (
    Account,
    AuthError,
    Perm,
    require_group,
    require_topics,
)
from dledger_commitlog.service.base import Context, ServiceBase, stored_message_pb
from proto import dledger_pb2 as pb
from raft import NotLeader
from store.errors import InvalidMessage
from store.message import check_name, decode_message

_T = TypeVar("_T")
_MAX_WAIT_MS = 30_000


class GroupRpcs(ServiceBase):
    @contextlib.asynccontextmanager
    async def _group_call(self, context: Context, what: str) -> AsyncIterator[None]:
        """Map the coordinator's refusals to gRPC statuses (see the module docstring)."""
        try:
            yield
        except NotLeader:
            await self._redirect(context)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (StaleLease, GroupConflict) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except UnknownMessage as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except (OutcomeUnknown, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{what}: {exc}")
        except (PutFailed, Overloaded) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{what}: {exc}")

    async def _run(self, context: Context, what: str, call: Awaitable[_T]) -> _T:
        async with self._group_call(context, what):
            return await call
        raise AssertionError("unreachable: abort raises")

    async def GroupHeartbeat(
        self, request: pb.GroupHeartbeatRequest, context: Context
    ) -> pb.GroupHeartbeatResponse:
        r = request
        topics = [s.topic for s in r.subscriptions]

        await self._allow(context, "GroupHeartbeat", lambda a: group_rights(a, r.group, topics))
        subs = {s.topic: (s.filter_kind or "TAG", s.expression or "*") for s in r.subscriptions}
        if len(subs) != len(r.subscriptions):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a topic is subscribed twice")
        settings = Settings(
            strategy=r.strategy or "average",
            orderly=r.orderly,
            max_reconsume=r.max_reconsume or DEFAULT_MAX_RECONSUME,
            ack_wait_ms=r.ack_wait_ms or DEFAULT_ACK_WAIT_MS,
            # default: 3 (RocketMQ's first retry, 10 s), or the last level if fewer
            first_retry_level=r.first_retry_level
            or min(DEFAULT_FIRST_RETRY_LEVEL, len(self.services.schedule.levels)),
        )
        claims = [
            Claim(h.topic, h.queue_id, h.epoch, h.next_offset, h.in_flight, h.unacked_from)
            for h in r.held
        ]
        groups = self.services.groups
        leases, generation = await self._run(
            context,
            "heartbeat",
            groups.heartbeat(r.group, r.member_id, r.client, subs, settings, claims),
        )
        return pb.GroupHeartbeatResponse(
            queues=_leases_pb(leases),
            session_timeout_ms=groups.session_timeout_ms,
            heartbeat_interval_ms=groups.heartbeat_interval_ms,
            generation=generation,
        )

    async def GroupFetch(
        self, request: pb.GroupFetchRequest, context: Context
    ) -> pb.GroupFetchResponse:
        r = request
        await self._allow(context, "GroupFetch", lambda a: require_group(a, r.group))
        wait_s = min(max(r.wait_ms, 0), _MAX_WAIT_MS, int(self._timeout(context) * 1000)) / 1000
        fetch = self.services.groups.fetch(
            r.group, r.member_id, r.max_messages, wait_s, self._reads
        )
        fetched = await self._run(context, "fetch", fetch)
        reply = pb.GroupFetchResponse(
            queues=_leases_pb(fetched.leases), generation=fetched.generation
        )
        if r.runs:
            reply.runs.extend(map(_run_pb, fetched.runs))
        elif fetched.runs:  # a client that knows only Delivery: decoded here, off the loop
            reply.deliveries.extend(await self._in_thread(_deliveries_pb, fetched.runs))
        return reply

    async def GroupAck(self, request: pb.GroupAckRequest, context: Context) -> pb.GroupAckResponse:
        r = request
        await self._allow(context, "GroupAck", lambda a: require_group(a, r.group))
        handles = [(h.topic, h.queue_id, h.queue_offset, h.epoch, h.end_offset) for h in r.handles]
        ack = self.services.groups.ack(r.group, r.member_id, handles)
        acked = await self._run(context, "ack", ack)
        return pb.GroupAckResponse(acked=acked)

    async def GroupNack(
        self, request: pb.GroupNackRequest, context: Context
    ) -> pb.GroupNackResponse:
        r = request
        await self._allow(context, "GroupNack", lambda a: require_group(a, r.group))
        h = r.handle
        out = await self._run(
            context,
            "nack",
            self.services.groups.nack(
                r.group, r.member_id, (h.topic, h.queue_id, h.queue_offset, h.epoch), r.delay_level
            ),
        )
        return pb.GroupNackResponse(
            outcome=out.outcome, reconsume_times=out.reconsume_times, delay_ms=out.delay_ms
        )

    async def GroupLeave(
        self, request: pb.GroupLeaveRequest, context: Context
    ) -> pb.GroupLeaveResponse:
        r = request
        await self._allow(context, "GroupLeave", lambda a: require_group(a, r.group))
        await self._run(context, "leave", self.services.groups.leave(r.group, r.member_id))
        return pb.GroupLeaveResponse()

    async def GroupList(
        self, request: pb.GroupListRequest, context: Context
    ) -> pb.GroupListResponse:
        account = await self._caller(context, "GroupList")
        groups = self.services.groups
        await self._run(context, "list", groups.state_of(""))  # leader only, settled
        out = []
        for group, s in self.services.group_admin.summaries(ages=True).items():
            if _may_use(account, group):
                out.append(_summary_pb(group, s))
        return pb.GroupListResponse(groups=out)

    async def GroupDescribe(
        self, request: pb.GroupDescribeRequest, context: Context
    ) -> pb.GroupDescribeResponse:
        r = request
        await self._allow(context, "GroupDescribe", lambda a: require_group(a, r.group))
        try:
            check_name(r.group, "group")
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        groups = self.services.groups
        state = await self._run(context, "describe", groups.state_of(r.group))
        admin = self.services.group_admin
        summary = admin.summaries(ages=True).get(r.group)
        if summary is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown group {r.group!r}: no offsets committed and no live members",
            )
        assert summary is not None
        reply = pb.GroupDescribeResponse(summary=_summary_pb(r.group, summary))
        offsets = self.node.committed.group_offsets
        refs = {(t, q) for (g, t, q) in offsets if g == r.group}
        if state is not None:
            refs |= set(state.leases)
            now = groups.now_ms()
            for m in sorted(state.members.values(), key=lambda m: m.member_id):
                reply.members.append(
                    pb.GroupMemberInfo(
                        member_id=m.member_id,
                        client=m.client,
                        last_seen_ms_ago=now - m.last_seen_ms,
                        queues=_leases_pb(state.leases_of(m.member_id)),
                    )
                )
            subs = {t: s for m in state.members.values() for t, s in m.subscriptions.items()}
            for topic, (kind, expression) in sorted(subs.items()):
                reply.subscriptions.append(
                    pb.Subscription(topic=topic, filter_kind=kind, expression=expression)
                )
        for topic, q in sorted(refs):
            lease = state.leases.get((topic, q)) if state is not None else None
            committed = offsets.get((r.group, topic, q), -1)
            high = groups.queue_end(topic, q)
            done = lease.frontier if lease is not None else max(committed, 0)
            reply.queues.append(
                pb.GroupQueueInfo(
                    topic=topic,
                    queue_id=q,
                    committed=committed,
                    max_offset=high,
                    lag=max(0, high - done),
                    owner=(lease.owner or "") if lease else "",
                    epoch=lease.epoch if lease else 0,
                    in_flight=lease.in_flight_count() if lease else 0,
                    revoking=bool(lease and lease.target is not None),
                    oldest_unconsumed_ms=admin.stored_ms(topic, q, done) if done < high else 0,
                )
            )
        return reply

    async def GroupResetOffsets(
        self, request: pb.GroupResetOffsetsRequest, context: Context
    ) -> pb.GroupResetOffsetsResponse:
        r = request
        await self._allow(
            context, "GroupResetOffsets", lambda a: group_rights(a, r.group, [r.topic])
        )
        try:
            self._check_queues(r.topic, r.queue_id)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        groups = self.services.groups
        queues = [r.queue_id] if r.queue_id != -1 else list(range(groups.queue_count(r.topic)))
        moved = await self._run(
            context,
            "reset-offsets",
            self.services.group_admin.reset_offsets(
                r.group, r.topic, queues, r.to, r.value, r.force
            ),
        )
        return pb.GroupResetOffsetsResponse(
            offsets=[pb.GroupOffset(topic=r.topic, queue_id=q, offset=o) for q, o in moved]
        )

    async def GroupDlq(self, request: pb.GroupDlqRequest, context: Context) -> pb.GroupDlqResponse:
        r = request
        await self._allow(context, "GroupDlq", lambda a: require_group(a, r.group))
        resend = list(r.resend_offsets) if (r.resend_offsets or r.resend_all) else None
        messages, resent, next_offset, high = await self._run(
            context,
            "dlq",
            self.services.group_admin.dlq(r.group, r.from_offset, r.max_messages, resend),
        )
        return pb.GroupDlqResponse(
            messages=[stored_message_pb(m, size) for m, size in messages],
            resent=resent,
            next_offset=next_offset,
            max_offset=high,
        )

    async def MessageTrace(
        self, request: pb.MessageTraceRequest, context: Context
    ) -> pb.MessageTraceResponse:
        """A message's trace (messaging.message_trace): SUB on its topic; the groups the
        caller may use. NOT_FOUND for an id that names no message here."""
        account = await self._caller(context, "MessageTrace")
        try:
            offset = offset_of_msg_id(request.msg_id)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        groups = self.services.groups
        await self._run(context, "trace", groups.states())  # the leader, its view settled
        msg = groups.log.message_at(offset)
        if msg is None or shard_of_msg_id(request.msg_id) != self.cfg.shard:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no message with id {request.msg_id}")
        assert msg is not None
        await self._check(context, account, lambda a: require_topics(a, [msg.topic], Perm.SUB))
        found = trace(groups, offset, msg)
        allowed = {g.group for g in found.groups if _may_use(account, g.group)}
        return pb.MessageTraceResponse(
            events=[
                pb.TraceEvent(**dataclasses.asdict(e))
                for e in found.events
                if not e.group or e.group in allowed
            ],
            groups=[
                pb.TraceGroup(
                    group=g.group, consumed=g.consumed, history_since_ms=g.history_since_ms
                )
                for g in found.groups
                if g.group in allowed
            ],
        )


def _may_use(account: Account | None, group: str) -> bool:
    if account is None:
        return True
    try:
        require_group(account, group)
    except AuthError:
        return False
    return True


def group_rights(account: Account, group: str, topics: Sequence[str]) -> None:
    """The rights a group call needs: the group's, and SUB on the topics it touches."""
    require_group(account, group)
    require_topics(account, list(topics), Perm.SUB)


def _run_pb(d: Delivered) -> pb.DeliveryRun:
    return pb.DeliveryRun(
        topic=d.topic,
        queue_id=d.queue_id,
        epoch=d.epoch,
        messages=b"".join(d.messages),
        delivery_counts=d.counts,
        reconsume_times=d.retries,
    )


def _deliveries_pb(runs: list[Delivered]) -> list[pb.Delivery]:
    """The runs a fetch delivered, one Delivery per message (every field decoded)."""
    out = []
    for d in runs:
        retries = d.retries or [-1] * len(d.messages)
        for raw, count, retried in zip(d.messages, d.counts, retries, strict=True):
            msg = decode_message(raw, verify_crc=False)  # checked against its entry
            out.append(
                pb.Delivery(
                    message=stored_message_pb(msg, len(raw)),
                    epoch=d.epoch,
                    reconsume_times=retried if retried >= 0 else reconsume_times(msg.properties),
                    origin_topic=origin_topic(msg.topic, msg.properties),
                    delivery_count=count,
                )
            )
    return out


def _leases_pb(leases: list[Lease]) -> list[pb.QueueLease]:
    return [pb.QueueLease(topic=x.topic, queue_id=x.queue_id, epoch=x.epoch) for x in leases]


def _summary_pb(group: str, s: dict[str, int | str | bool]) -> pb.GroupSummary:
    return pb.GroupSummary(
        group=group,
        members=int(s["members"]),
        lag=int(s["lag"]),
        retries=int(s["retries"]),
        dead_letters=int(s["dead_letters"]),
        oldest_unconsumed_ms=int(s["oldest_unconsumed_ms"]),
        strategy=str(s["strategy"]),
        orderly=bool(s["orderly"]),
        generation=int(s["generation"]),
    )
