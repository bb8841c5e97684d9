"""Puts: single, batched, streamed and framed (the clients' coalesced puts).

Owns `WriteRpcs`: a message is validated and encoded once (`_spec`: to its topic,
to the schedule topic when delayed, to the half topic when transactional), then
put through the node (`_commit`) or forwarded once to the leader. A frame's
messages succeed or fail each on its own; a PutFrames stream keeps at most
_FRAMES_IN_FLIGHT frames in flight.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from dispatch.dispatcher import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.protocol import PUT_FRAMES_ACCEPTED, PutResult
from dledger_commitlog.log.commitlog import OutcomeUnknown, Overloaded, PutFailed, PutSpec
from dledger_commitlog.messaging.group_state import DLQ_PREFIX, RETRY_PREFIX
from dledger_commitlog.messaging.groups import reserved_topic, sharding_queue
from dledger_commitlog.messaging.schedule import SCHEDULE_TOPIC, schedule, scheduled_properties
from dledger_commitlog.messaging.transactions import HALF_KEY_PREFIX, HALF_TOPIC, half_properties
from dledger_commitlog.node.acl import Account, AuthError, Perm, require_topics
from dledger_commitlog.service.base import Context, Refused, ServiceBase, refuse_outcome, result_pb
from proto import dledger_pb2 as pb
from raft import NotLeader
from store.errors import InvalidMessage
from store.message import check_name

_FRAMES_IN_FLIGHT = 64  # per PutFrames stream: more wait for the client's next read


class WriteRpcs(ServiceBase):
    def _spec(self, m: pb.MessageData, *, producer_group: str | None = None) -> PutSpec:
        """Validate and encode a message to put: to its topic, or (delayed) to the
        schedule topic, or (`producer_group`: a half message) to the half topic.

        A message without a uniq_key gets one here, written into `m`: a forward of
        the request to the leader then carries the same key (one message, once)."""
        if reserved_topic(m.topic):
            raise InvalidMessage(f"topic {m.topic!r}: the prefixes {SYSTEM_TOPIC_PREFIX}, "
                                 f"{RETRY_PREFIX} and {DLQ_PREFIX} are reserved")  # fmt: skip
        here = self._queues_here(m.topic)  # None: no route known (one group, or no group 0)
        if m.sharding_key:
            if m.has_queue_id:
                raise InvalidMessage("give a queue id or a sharding key, not both")
            m.queue_id = sharding_queue(m.sharding_key, here or self.cfg.queues_per_topic)
            m.has_queue_id = True
            m.sharding_key = ""  # a forward to the leader carries the queue it chose
        if not m.uniq_key:
            m.uniq_key = uuid.uuid4().hex.upper()
        if here is not None:
            self._route_queue(m, here)
        topic, uniq, qid = m.topic, m.uniq_key, m.queue_id if m.has_queue_id else None
        props = dict(m.properties)
        if producer_group is not None:
            if m.delay_level or m.deliver_at_ms:
                raise InvalidMessage("a transactional message cannot be delayed")
            check_name(producer_group, "producer group")
            props = half_properties(props, topic, qid, producer_group)
            topic, uniq, qid = HALF_TOPIC, HALF_KEY_PREFIX + uniq, 0
        elif m.delay_level or m.deliver_at_ms:
            placed = schedule(
                topic, qid, uniq, delay_level=m.delay_level, deliver_at_ms=m.deliver_at_ms,
                levels=self.services.schedule.levels, max_timer_delay_s=self.cfg.max_timer_delay_s,
                now_ms=int(time.time() * 1000),
            )  # fmt: skip
            props = scheduled_properties(props, placed)
            topic, uniq, qid = SCHEDULE_TOPIC, placed.uniq_key, placed.queue_id
        return self.node.prepare(
            topic,
            m.body,
            keys=list(m.keys),
            tags=m.tags or None,
            properties=props,
            uniq_key=uniq,
            queue_id=qid,
            born_timestamp_ms=m.born_timestamp_ms or int(time.time() * 1000),
            flag=m.flag,
        )

    def _route_queue(self, m: pb.MessageData, here: int) -> None:
        """Keep a put within the queues this group holds of its topic by the cluster's
        route (docs/scaling.md): a queue beyond them is refused, saying "outside" (a
        routed client then asks for the route again); a put naming no queue gets one
        of them (by its uniq_key)."""
        group = self.cfg.group
        if m.has_queue_id and not 0 <= m.queue_id < here:
            raise InvalidMessage(f"queue id {m.queue_id} outside [0, {here}) for {m.topic!r} "
                                 f"in group {group}: the topic's route gives group {group} "
                                 f"{here} of its queues (ask Route again)")  # fmt: skip
        if not m.has_queue_id and here < self.cfg.queues_per_topic:
            if here == 0:
                raise InvalidMessage(f"topic {m.topic!r} has no queues in group {group} "
                                     "(outside [0, 0): ask Route for its groups)")  # fmt: skip
            m.queue_id = zlib.crc32(m.uniq_key.encode()) % here
            m.has_queue_id = True

    async def _put_specs(
        self,
        specs: Sequence[PutSpec],
        context: Context,
        forward: Callable[[], pb.PutBatchRequest],
        account: Account | None,
    ) -> list[PutResult] | None:
        """Put locally, or forward `forward()` (built only then) to the leader; None if
        the context was aborted."""
        try:
            return await self._commit(specs, self._timeout(context))
        except NotLeader as exc:
            return await self._forward(exc, context, forward(), account)
        except Refused as exc:
            await context.abort(exc.code, exc.message)

    async def _commit(self, specs: Sequence[PutSpec], timeout_s: float) -> list[PutResult]:
        """Put as the leader: the results; NotLeader, or Refused with the status to say."""
        writes, metrics = self.node, self.metrics
        started = time.perf_counter()
        if writes.write_refusal is not None:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, writes.write_refusal)
        try:
            results = await writes.put(specs, timeout_s)
        except Overloaded as exc:
            metrics.puts.labels("overloaded").inc(len(specs))
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
        except OutcomeUnknown as exc:
            metrics.puts.labels("unknown").inc(len(specs))
            raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
        except PutFailed as exc:
            metrics.puts.labels("failed").inc(len(specs))
            raise Refused(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
        metrics.puts.labels("ok").inc(len(specs))
        metrics.put_latency.observe(time.perf_counter() - started)
        return results

    async def _forward(
        self,
        exc: NotLeader,
        context: Context,
        request: pb.PutBatchRequest,
        account: Account | None,
    ) -> list[PutResult] | None:
        reply: pb.PutBatchResponse = await self._forward_to_leader(
            exc, context, "PutBatch", request, account
        )
        return [
            PutResult(
                r.msg_id,
                r.commitlog_offset,
                r.queue_id,
                r.queue_offset,
                r.store_timestamp_ms,
                r.duplicate,
            )
            for r in reply.results
        ]

    async def _prepare(
        self, messages: Sequence[pb.MessageData], cluster: str, context: Context
    ) -> list[PutSpec] | None:
        wrong = self._check_cluster(cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        if not messages:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no message to put")
        try:
            return [self._spec(m) for m in messages]
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    # -- RPCs ----------------------------------------------------------------------

    async def Put(self, request: pb.PutRequest, context: Context) -> pb.PutResponse:
        return await self._put(request, context, await self._caller(context, "Put"))

    async def _put(
        self, request: pb.PutRequest, context: Context, account: Account | None
    ) -> pb.PutResponse:
        topic = request.message.topic
        await self._check(context, account, lambda a: require_topics(a, [topic], Perm.PUB))
        specs = await self._prepare([request.message], request.cluster, context)
        assert specs is not None

        def fwd() -> pb.PutBatchRequest:
            return pb.PutBatchRequest(messages=[request.message], cluster=request.cluster)

        results = await self._put_specs(specs, context, fwd, account)
        assert results is not None
        return pb.PutResponse(result=result_pb(results[0]))

    async def PutBatch(self, request: pb.PutBatchRequest, context: Context) -> pb.PutBatchResponse:
        topics = {m.topic for m in request.messages}
        account = await self._allow(
            context, "PutBatch", lambda a: require_topics(a, sorted(topics), Perm.PUB)
        )
        specs = await self._prepare(request.messages, request.cluster, context)
        assert specs is not None
        results = await self._put_specs(specs, context, lambda: request, account)
        assert results is not None
        return pb.PutBatchResponse(results=[result_pb(r) for r in results])

    async def PutStream(
        self, request_iterator: AsyncIterator[pb.PutRequest], context: Context
    ) -> AsyncIterator[pb.PutResponse]:
        """Puts in order; many in flight at once; answers come back in request order."""
        pending: asyncio.Queue[asyncio.Task[pb.PutResponse] | None] = asyncio.Queue(maxsize=1024)
        account = await self._caller(context, "PutStream")  # once: a stream outlives it

        async def one(req: pb.PutRequest) -> pb.PutResponse:
            return await self._put(req, context, account)

        async def feed() -> None:
            async for req in request_iterator:
                await pending.put(asyncio.ensure_future(one(req)))
            await pending.put(None)

        feeder = asyncio.ensure_future(feed())
        try:
            while (task := await pending.get()) is not None:
                yield await task
        finally:
            feeder.cancel()

    async def PutFrames(
        self, request_iterator: AsyncIterator[pb.PutFrame], context: Context
    ) -> AsyncIterator[pb.PutFrameResult]:
        """Frames of puts (the clients' coalesced puts), many in flight; each message
        succeeds or fails on its own; frames are answered as they commit."""
        account = await self._caller(context, "PutFrames")  # once: a stream outlives it
        await context.send_initial_metadata(((PUT_FRAMES_ACCEPTED, "1"),))  # before any frame
        answers: asyncio.Queue[pb.PutFrameResult | None] = asyncio.Queue()
        window = asyncio.Semaphore(_FRAMES_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()

        async def one(frame: pb.PutFrame) -> None:
            try:
                answers.put_nowait(await self._frame(frame, context, account))
            finally:
                window.release()

        async def feed() -> None:
            async for frame in request_iterator:
                await window.acquire()
                task = asyncio.ensure_future(one(frame))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(set(tasks))

        feeder = asyncio.ensure_future(feed())
        feeder.add_done_callback(lambda _: answers.put_nowait(None))
        try:
            while (answer := await answers.get()) is not None:
                yield answer
        finally:
            feeder.cancel()
            for task in list(tasks):
                task.cancel()

    async def _frame(
        self, frame: pb.PutFrame, context: Context, account: Account | None
    ) -> pb.PutFrameResult:
        """One frame: every message checked on its own, the good ones put as one batch."""
        outcomes = [pb.PutOutcome() for _ in frame.messages]
        wrong = self._check_cluster(frame.cluster)
        specs: list[PutSpec] = []
        at: list[int] = []
        for i, m in enumerate(frame.messages):
            try:
                if wrong:
                    raise Refused(grpc.StatusCode.FAILED_PRECONDITION, wrong)
                if account is not None:
                    require_topics(account, [m.topic], Perm.PUB)
                specs.append(self._spec(m))
                at.append(i)
            except AuthError as exc:
                self.metrics.auth_failures.labels(exc.status.name.lower()).inc()
                refuse_outcome(outcomes[i], exc.status, exc.message)
            except InvalidMessage as exc:
                refuse_outcome(outcomes[i], grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except Refused as exc:
                refuse_outcome(outcomes[i], exc.code, exc.message)
        reply = pb.PutFrameResult(seq=frame.seq)
        if specs:
            try:
                results = await self._commit(specs, self._timeout(context))
                for i, r in zip(at, results, strict=True):
                    outcomes[i].result.CopyFrom(result_pb(r))
            except NotLeader:
                leader = self.node.leader_client_address()
                code = (
                    grpc.StatusCode.FAILED_PRECONDITION if leader else grpc.StatusCode.UNAVAILABLE
                )
                why = f"not the leader; the leader is at {leader}" if leader else "no leader"
                reply.leader = leader or ""
                for i in at:
                    refuse_outcome(outcomes[i], code, why)
            except Refused as exc:
                for i in at:
                    refuse_outcome(outcomes[i], exc.code, exc.message)
        reply.outcomes.extend(outcomes)
        return reply
