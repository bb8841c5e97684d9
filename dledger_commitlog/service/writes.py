"""Puts: single, batched, streamed and framed (the clients' coalesced puts).

Owns `WriteRpcs`: a message is validated and encoded once (`_spec`: to its topic,
to the schedule topic when delayed, to the half topic when transactional), then
put through the node (`_commit`) or forwarded once to the leader. A frame's
messages succeed or fail each on its own; a PutFrames stream keeps at most
_FRAMES_IN_FLIGHT frames in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from dispatch.dispatcher import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.protocol import PUT_FRAMES_ACCEPTED, PutResult
from dledger_commitlog.log.commitlog import Draft, OutcomeUnknown, Overloaded, PutFailed, PutSpec
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
            raise InvalidMessage(
                f"topic {m.topic!r}: the prefixes {SYSTEM_TOPIC_PREFIX}, "
                f"{RETRY_PREFIX} and {DLQ_PREFIX} are reserved"
            )
        routed = self._routed_queues(m.topic)  # multi-Raft: this shard's part of the route
        if m.sharding_key:
            if m.has_queue_id:
                raise InvalidMessage("give a queue id or a sharding key, not both")
            m.queue_id = sharding_queue(m.sharding_key, routed or self.cfg.queues_per_topic)
            m.has_queue_id = True
            m.sharding_key = ""  # a forward to the leader carries the queue it chose
        if routed is not None:
            if routed == 0:
                raise InvalidMessage(
                    f"topic {m.topic!r} has no queues in shard {self.cfg.shard}:"
                    " a put here is outside its route (dledger topic route)"
                )
            if not m.has_queue_id:
                m.queue_id, m.has_queue_id = next(self._next_queue) % routed, True
            elif m.queue_id >= routed:
                raise InvalidMessage(
                    f"queue id {m.queue_id} outside [0, {routed}): topic "
                    f"{m.topic!r} has {routed} queues in shard {self.cfg.shard} "
                    "(its route changed: dledger topic route)"
                )
        if not m.uniq_key:
            m.uniq_key = uuid.uuid4().hex.upper()
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
                topic,
                qid,
                uniq,
                delay_level=m.delay_level,
                deliver_at_ms=m.deliver_at_ms,
                levels=self.services.schedule.levels,
                max_timer_delay_s=self.cfg.max_timer_delay_s,
                now_ms=int(time.time() * 1000),
            )
            props = scheduled_properties(props, placed)
            topic, uniq, qid = SCHEDULE_TOPIC, placed.uniq_key, placed.queue_id
        return self.node.prepare(
            Draft(
                topic,
                m.body,
                uniq,
                keys=list(m.keys),
                tags=m.tags or None,
                properties=props,
                queue_id=qid,
                born_timestamp_ms=m.born_timestamp_ms or int(time.time() * 1000),
                flag=m.flag,
            )
        )

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
        done: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        self._submit(specs, timeout_s, done)
        with contextlib.suppress(Exception):  # the outcome says which
            await done
        return self._outcome(done, started, len(specs))

    def _submit(
        self, specs: Sequence[PutSpec], timeout_s: float, done: asyncio.Future[list[PutResult]]
    ) -> None:
        """Hand `specs` to the node; Refused at once if it takes no put now."""
        node = self.node
        if node.write_refusal is not None:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, node.write_refusal)
        try:
            node.submit(specs, timeout_s, done)
        except Overloaded as exc:
            self.metrics.puts.labels("overloaded").inc(len(specs))
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None

    def _outcome(
        self, done: asyncio.Future[list[PutResult]], started: float, count: int
    ) -> list[PutResult]:
        """What a settled submission came to: its results, counted; NotLeader; or
        Refused with the status to say."""
        metrics = self.metrics
        exc = done.exception()
        if exc is None:
            metrics.puts.labels("ok").inc(count)
            metrics.put_latency.observe(time.perf_counter() - started)
            return done.result()
        if isinstance(exc, OutcomeUnknown):
            metrics.puts.labels("unknown").inc(count)
            raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        if isinstance(exc, PutFailed):
            metrics.puts.labels("failed").inc(count)
            raise Refused(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise exc

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
        succeeds or fails on its own; frames are answered as they commit. A frame is
        submitted as it is read (every frame of one read joins one proposal) and
        answered from its commit's callback: no task per frame."""
        account = await self._caller(context, "PutFrames")  # once: a stream outlives it
        await context.send_initial_metadata(((PUT_FRAMES_ACCEPTED, "1"),))  # before any frame
        answers: asyncio.Queue[pb.PutFrameResult | None] = asyncio.Queue()
        window = asyncio.Semaphore(_FRAMES_IN_FLIGHT)
        open_frames = [0]
        all_answered = asyncio.Event()

        def answer(reply: pb.PutFrameResult) -> None:
            answers.put_nowait(reply)
            window.release()
            open_frames[0] -= 1
            if not open_frames[0]:
                all_answered.set()

        async def feed() -> None:
            async for frame in request_iterator:
                await window.acquire()
                open_frames[0] += 1
                all_answered.clear()
                self._frame(frame, context, account, answer)
            if open_frames[0]:
                await all_answered.wait()

        feeder = asyncio.ensure_future(feed())
        feeder.add_done_callback(lambda _: answers.put_nowait(None))
        try:
            while (reply := await answers.get()) is not None:
                yield reply
        finally:
            feeder.cancel()

    def _frame(
        self,
        frame: pb.PutFrame,
        context: Context,
        account: Account | None,
        answer: Callable[[pb.PutFrameResult], None],
    ) -> None:
        """One frame: every message checked on its own, the good ones submitted as one
        batch; `answer` gets the frame's result once they committed (or failed)."""
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
        if not specs:
            reply.outcomes.extend(outcomes)
            answer(reply)
            return
        done: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()

        def committed(_: asyncio.Future[list[PutResult]]) -> None:
            try:
                results = self._outcome(done, started, len(specs))
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
            answer(reply)

        try:
            self._submit(specs, self._timeout(context), done)
        except Refused as exc:
            done.set_exception(exc)
            done.exception()
        done.add_done_callback(committed)
