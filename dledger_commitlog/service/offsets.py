"""Queue offsets and consumer-group offsets.

Owns `OffsetRpcs`: the queues' offset ranges (and where a reader on this host finds
the files), a group's committed offsets, and an offset commit, which travels
through the Raft log (a system topic) so it survives failover.
"""

from __future__ import annotations

import grpc

from dledger_commitlog.log.commitlog import OutcomeUnknown, Overloaded, PutFailed
from dledger_commitlog.messaging.system_log import offset_commit_draft
from dledger_commitlog.node.acl import Perm, require_topics
from dledger_commitlog.service.base import Context
from dledger_commitlog.service.groups import GroupRpcs, group_rights
from proto import dledger_pb2 as pb
from raft import NotLeader
from store.errors import InvalidMessage
from store.message import check_name


class OffsetRpcs(GroupRpcs):
    async def QueueOffsets(
        self, request: pb.QueueOffsetsRequest, context: Context
    ) -> pb.QueueOffsetsResponse:
        topic = request.topic
        account = await self._allow(
            context, "QueueOffsets", lambda a: require_topics(a, [topic] if topic else [], Perm.SUB)
        )
        if topic:
            try:
                check_name(topic)
            except InvalidMessage as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.linearizable:
            await self._dispatched_linearizable(context)
        queues = self.node.committed
        reply = pb.QueueOffsetsResponse(dispatched_offset=queues.dispatched_pos)
        add = reply.queues.add  # in place: half the time of messages made, then copied in
        for t, q, lo, hi in queues.queue_offsets(topic):
            if account is None or Perm.SUB in account.topic_perm(t):
                add(topic=t, queue_id=q, min_offset=lo, max_offset=hi)
        if self._local is not None and (account is None or account.reads_everything):
            # The files hold every topic: only for a caller who may read them all.
            reply.local_files.CopyFrom(self._local)
            reply.local_files.log_file_end = self.node.committed.log_view().file_end
        return reply

    async def CommitOffset(
        self, request: pb.CommitOffsetRequest, context: Context
    ) -> pb.CommitOffsetResponse:
        """Record a group's offset through the Raft log (so it survives failover)."""
        r = request
        account = await self._allow(
            context, "CommitOffset", lambda a: group_rights(a, r.group, [r.topic])
        )
        try:
            wrong = self._check_cluster(r.cluster)
            if wrong:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
            check_name(r.group, "group")
            self._check_queue(r.topic, r.queue_id)
            if r.offset < 0:
                raise InvalidMessage(f"offset {r.offset} must not be negative")
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if self.node.leading_term() is not None:
            groups = self.services.groups
            fenced = await self._run(
                context,
                "offset commit",
                groups.commit_fenced(r.group, r.member_id, r.topic, r.queue_id, r.epoch, r.offset),
            )
            if fenced:
                return pb.CommitOffsetResponse()  # the coordinator commits it with the acks
        try:
            spec = self.node.prepare(offset_commit_draft(r.group, r.topic, r.queue_id, r.offset))
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            (result,) = await self.node.put([spec], self._timeout(context))
            await self.node.wait_dispatched(result.commitlog_offset + 1, self._timeout(context))
        except NotLeader as exc:
            await self._forward_to_leader(exc, context, "CommitOffset", request, account)
        except (OutcomeUnknown, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"offset commit: {exc}")
        except (PutFailed, Overloaded) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"offset commit: {exc}")
        return pb.CommitOffsetResponse()

    async def FetchOffset(
        self, request: pb.FetchOffsetRequest, context: Context
    ) -> pb.FetchOffsetResponse:
        r = request
        await self._allow(context, "FetchOffset", lambda a: group_rights(a, r.group, [r.topic]))
        try:
            check_name(r.group, "group")
            self._check_queues(r.topic, r.queue_id)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if r.linearizable:
            await self._dispatched_linearizable(context)
        offsets = self.node.committed.group_offsets
        queues = [r.queue_id] if r.queue_id != -1 else range(self.cfg.queues_per_topic)
        return pb.FetchOffsetResponse(
            offsets=[
                pb.GroupOffset(
                    topic=r.topic, queue_id=q, offset=offsets.get((r.group, r.topic, q), -1)
                )
                for q in queues
            ]
        )
