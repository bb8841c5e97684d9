"""The gRPC client service: the client RPCs mapped onto the node's narrow interfaces.

`ClientService` sees the node only through `ports`, one interface per concern
(leadership, writes, transactions, commit-log reads, consume-queue reads,
status and maintenance), and its metrics; `server.serve` builds the `RaftNode`
and hands it over as each of them. This module imports no part of the node (a
test checks it).

Maps the proto onto those interfaces: validation errors become INVALID_ARGUMENT
before anything is proposed (bad input loses nothing and stores nothing); a put
on a follower is forwarded once to the leader; no leader is UNAVAILABLE
(retryable); reads serve committed data only. Every error carries a message
saying what is wrong; the node keeps serving.

Reads that touch many messages (Pull, ReadLog, ReadUnits, OffsetsForTimes) do
their disk reads and per-message work in a small thread pool (`reads`), never on
the event loop that also runs Raft: the loop takes a snapshot of the committed
bounds and hands the rest to a thread. `Status` reports how long the loop was
ever late (`loop_lag_max_ms`, from `loop_probe`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeAlias, TypeVar

import grpc

from dispatch.dispatcher import (
    OFFSETS_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    encode_offset_commit,
    parse_tag_expression,
)
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from raft import NotLeader
from store.errors import CorruptEntry, InvalidMessage, OffsetOutOfRange
from store.message import Message, check_name, decode_message

from . import reads
from .acl import (
    Account,
    AuthError,
    Perm,
    metadata_value,
    require_admin,
    require_group,
    require_topics,
)
from .commitlog import (
    OutcomeUnknown,
    Overloaded,
    PutFailed,
    PutResult,
    PutSpec,
    make_msg_id,
    offset_of_msg_id,
)
from .config import NodeConfig
from .loop_probe import LoopLagProbe
from .metrics import NodeMetrics
from .ports import Admin, Leadership, LogReads, QueueReads, Status, Transactions, Writes
from .schedule import SCHEDULE_TOPIC, schedule, scheduled_properties
from .security import NODE_AUTH, NodeSecurity
from .transactions import (
    HALF_KEY_PREFIX,
    HALF_TOPIC,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    TransactionConflict,
    UnknownTransaction,
    half_properties,
)
from .transport import open_channel

log = logging.getLogger(__name__)

_FORWARDED = "dledger-forwarded"
_FRAMES_IN_FLIGHT = 64  # per PutFrames stream: more wait for the client's next read
# What a follower sends its leader.
_FORWARDABLE = frozenset({"PutBatch", "CommitOffset", "PutHalf", "EndTransaction"})
_ON_BEHALF = "dledger-on-behalf-of"  # a forwarded call: the access key the peer authenticated
_LEADER = "dledger-leader"
_LEADER_ID = "dledger-leader-id"
_DEFAULT_TIMEOUT_S = 10.0
_DEFAULT_PULL = 32
_MAX_PULL = 1024  # messages per Pull or QueryByKey answer
_MAX_PULL_RAW = 65536  # raw pulls (analytics) are bounded by max_bytes instead
_READ_THREADS = 2  # the read pool: disk reads and per-message work off the loop
_LOG_CHUNK = 4 << 20  # ReadLog: bytes per answer by default
_MAX_LOG_CHUNK = 8 << 20
_Context: TypeAlias = Any  # grpc.aio.ServicerContext; grpcio ships no type hints
_T = TypeVar("_T")
_P = ParamSpec("_P")


def _result_pb(r: PutResult) -> pb.PutResult:
    return pb.PutResult(msg_id=r.msg_id, commitlog_offset=r.commitlog_offset,
                        queue_id=r.queue_id, queue_offset=r.queue_offset,
                        store_timestamp_ms=r.store_timestamp_ms, duplicate=r.duplicate)  # fmt: skip


class ClientService(pb_grpc.DLedgerClientServicer):  # type: ignore[misc]
    """The client RPCs. With an ACL every call is authenticated (`_caller`) and each
    RPC checks the caller's rights on what it touches before doing anything.

    What it uses of the node comes in one interface per concern (`ports`)."""

    def __init__(
        self,
        cfg: NodeConfig,
        *,
        leadership: Leadership,
        writes: Writes,
        transactions: Transactions,
        commit_log: LogReads,
        queues: QueueReads,
        admin: Admin,
        metrics: NodeMetrics,
        security: NodeSecurity | None = None,
    ) -> None:
        self.cfg = cfg
        self.leadership = leadership
        self.writes = writes
        self.transactions = transactions
        self.commit_log = commit_log
        self.queues = queues
        self.admin = admin
        self.metrics = metrics
        self.security = security or NodeSecurity()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._reads = ThreadPoolExecutor(_READ_THREADS, f"reads-n{self.cfg.node_id}")
        self.verified = reads.VerifiedRanges()  # commit-log ranges whose CRCs were checked
        self.loop_lag = LoopLagProbe()
        self._local = _local_files(self.cfg.data_dir)

    def start(self) -> None:
        """Start the loop-lag probe (on the serving loop)."""
        self.loop_lag.start()

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close(grace=None)
        await self.loop_lag.stop()
        # Reads still running use the node's files: they end before the node closes them.
        await asyncio.to_thread(self._reads.shutdown, wait=True, cancel_futures=True)

    async def _in_thread(self, fn: Callable[_P, _T], *args: _P.args, **kw: _P.kwargs) -> _T:
        """Run `fn` in the read pool: the loop stays free for Raft."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reads, lambda: fn(*args, **kw))

    # -- authentication and authorization -------------------------------------------

    async def _caller(self, context: _Context, method: str) -> Account | None:
        """Who makes this call of RPC `method` (None: no ACL, every caller may do anything).

        A call a follower forwarded carries the follower's token instead of the
        client's signature: made for this RPC and this access key, so a token seen on
        the wire vouches for nothing else."""
        acl = self.security.acl
        if acl is None:
            return None
        meta = context.invocation_metadata()
        try:
            if metadata_value(meta, _FORWARDED) is None:
                return acl.authenticate(meta, method)
            peers = self.security.peers
            assert peers is not None  # the config demands a cluster secret with an ACL
            if method not in _FORWARDABLE:
                raise AuthError(f"{method} is never forwarded")
            on_behalf = metadata_value(meta, _ON_BEHALF) or ""
            src = peers.check(metadata_value(meta, NODE_AUTH), self.cfg.node_id,
                              scope=_forward_scope(method, on_behalf))  # fmt: skip
            if src == self.cfg.node_id or src not in {p.id for p in self.cfg.peers}:
                raise AuthError(f"forwarded by node {src}, not a peer")
            return acl.account(on_behalf)
        except AuthError as exc:
            await self._deny(context, exc)
        raise AssertionError("unreachable: abort raises")

    async def _allow(
        self, context: _Context, method: str, check: Callable[[Account], None]
    ) -> Account | None:
        """Authenticate the caller and run `check` on its account (abort if it fails)."""
        account = await self._caller(context, method)
        await self._check(context, account, check)
        return account

    async def _check(
        self, context: _Context, account: Account | None, check: Callable[[Account], None]
    ) -> None:
        if account is not None:
            try:
                check(account)
            except AuthError as exc:
                await self._deny(context, exc)

    def _forward_metadata(
        self, account: Account | None, method: str
    ) -> tuple[tuple[str, str], ...]:
        """A forwarded call of RPC `method`: marked (never forwarded again), vouched for
        with the cluster secret, on behalf of the access key this node authenticated."""
        meta = [(_FORWARDED, str(self.cfg.node_id))]
        leader = self.leadership.leader_id
        on_behalf = account.access_key if account is not None else ""
        if self.security.peers is not None and leader is not None:
            scope = _forward_scope(method, on_behalf)
            meta.append((NODE_AUTH, self.security.peers.token(self.cfg.node_id, leader, scope)))
        if account is not None:
            meta.append((_ON_BEHALF, on_behalf))
        return tuple(meta)

    async def _deny(self, context: _Context, exc: AuthError) -> None:
        self.metrics.auth_failures.labels(exc.status.name.lower()).inc()
        log.info("refused a client call from %s: %s", context.peer(), exc.message)
        await context.abort(exc.status, exc.message)

    # -- helpers ---------------------------------------------------------------------

    def _leader_metadata(self) -> tuple[tuple[str, str], ...]:
        return (
            (_LEADER, self.leadership.leader_client_address() or ""),
            (_LEADER_ID, str(self.leadership.leader_id or 0)),
        )

    def _check_cluster(self, cluster: str) -> str | None:
        if cluster and cluster != self.cfg.cluster:
            return f"wrong cluster: this node serves {self.cfg.cluster!r}, not {cluster!r}"
        return None

    def _spec(self, m: pb.MessageData, *, producer_group: str | None = None) -> PutSpec:
        """Validate and encode a message to put: to its topic, or (delayed) to the
        schedule topic, or (`producer_group`: a half message) to the half topic.

        A message without a uniq_key gets one here, written into `m`: a forward of
        the request to the leader then carries the same key (one message, once)."""
        if m.topic.startswith(SYSTEM_TOPIC_PREFIX):
            raise InvalidMessage(f"topic {m.topic!r}: the prefix {SYSTEM_TOPIC_PREFIX} is reserved")
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
                topic, qid, uniq, delay_level=m.delay_level, deliver_at_ms=m.deliver_at_ms,
                levels=self.writes.delay_levels, max_timer_delay_s=self.cfg.max_timer_delay_s,
                now_ms=int(time.time() * 1000),
            )  # fmt: skip
            props = scheduled_properties(props, placed)
            topic, uniq, qid = SCHEDULE_TOPIC, placed.uniq_key, placed.queue_id
        return self.writes.prepare(
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

    @staticmethod
    def _timeout(context: _Context) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return _DEFAULT_TIMEOUT_S
        return max(0.05, min(float(remaining) - 0.05, 60.0))

    async def _put_specs(
        self,
        specs: Sequence[PutSpec],
        context: _Context,
        forward: Callable[[], pb.PutBatchRequest],
        account: Account | None,
    ) -> list[PutResult] | None:
        """Put locally, or forward `forward()` (built only then) to the leader; None if
        the context was aborted."""
        try:
            return await self._commit(specs, self._timeout(context))
        except NotLeader as exc:
            return await self._forward(exc, context, forward(), account)
        except _Refused as exc:
            await context.abort(exc.code, exc.message)
        return None

    async def _commit(self, specs: Sequence[PutSpec], timeout_s: float) -> list[PutResult]:
        """Put as the leader: the results; NotLeader, or _Refused with the status to say."""
        writes, metrics = self.writes, self.metrics
        started = time.perf_counter()
        if writes.write_refusal is not None:
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, writes.write_refusal)
        try:
            results = await writes.put(specs, timeout_s)
        except Overloaded as exc:
            metrics.puts.labels("overloaded").inc(len(specs))
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
        except OutcomeUnknown as exc:
            metrics.puts.labels("unknown").inc(len(specs))
            raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
        except PutFailed as exc:
            metrics.puts.labels("failed").inc(len(specs))
            raise _Refused(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
        metrics.puts.labels("ok").inc(len(specs))
        metrics.put_latency.observe(time.perf_counter() - started)
        return results

    async def _leader_stub(
        self, exc: NotLeader, context: _Context
    ) -> tuple[str, pb_grpc.DLedgerClientStub]:
        """A stub for the leader, or abort: no leader, or this call was forwarded once."""
        leader = self.leadership.leader_client_address()
        meta = dict(context.invocation_metadata() or ())
        if leader is None or exc.leader_hint is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no leader at the moment; retry")
        assert leader is not None
        if _FORWARDED in meta or leader == self.cfg.client_address:
            context.set_trailing_metadata(self._leader_metadata())
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"not the leader; the leader is at {leader}")  # fmt: skip
        channel = self._channels.get(leader)
        if channel is None:
            channel = open_channel(leader, self.security)
            self._channels[leader] = channel
        return leader, pb_grpc.DLedgerClientStub(channel)

    async def _forward(
        self,
        exc: NotLeader,
        context: _Context,
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
        self, messages: Sequence[pb.MessageData], cluster: str, context: _Context
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
        return None

    # -- RPCs ----------------------------------------------------------------------

    async def Put(self, request: pb.PutRequest, context: _Context) -> pb.PutResponse:
        return await self._put(request, context, await self._caller(context, "Put"))

    async def _put(
        self, request: pb.PutRequest, context: _Context, account: Account | None
    ) -> pb.PutResponse:
        topic = request.message.topic
        await self._check(context, account, lambda a: require_topics(a, [topic], Perm.PUB))
        specs = await self._prepare([request.message], request.cluster, context)
        assert specs is not None

        def fwd() -> pb.PutBatchRequest:
            return pb.PutBatchRequest(messages=[request.message], cluster=request.cluster)

        results = await self._put_specs(specs, context, fwd, account)
        assert results is not None
        return pb.PutResponse(result=_result_pb(results[0]))

    async def PutBatch(self, request: pb.PutBatchRequest, context: _Context) -> pb.PutBatchResponse:
        topics = {m.topic for m in request.messages}
        account = await self._allow(
            context, "PutBatch", lambda a: require_topics(a, sorted(topics), Perm.PUB)
        )
        specs = await self._prepare(request.messages, request.cluster, context)
        assert specs is not None
        results = await self._put_specs(specs, context, lambda: request, account)
        assert results is not None
        return pb.PutBatchResponse(results=[_result_pb(r) for r in results])

    async def PutStream(
        self, request_iterator: AsyncIterator[pb.PutRequest], context: _Context
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
        self, request_iterator: AsyncIterator[pb.PutFrame], context: _Context
    ) -> AsyncIterator[pb.PutFrameResult]:
        """Frames of puts (the clients' coalesced puts), many in flight; each message
        succeeds or fails on its own; frames are answered as they commit."""
        account = await self._caller(context, "PutFrames")  # once: a stream outlives it
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
        self, frame: pb.PutFrame, context: _Context, account: Account | None
    ) -> pb.PutFrameResult:
        """One frame: every message checked on its own, the good ones put as one batch."""
        outcomes = [pb.PutOutcome() for _ in frame.messages]
        wrong = self._check_cluster(frame.cluster)
        specs: list[PutSpec] = []
        at: list[int] = []
        for i, m in enumerate(frame.messages):
            try:
                if wrong:
                    raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, wrong)
                if account is not None:
                    require_topics(account, [m.topic], Perm.PUB)
                specs.append(self._spec(m))
                at.append(i)
            except AuthError as exc:
                self.metrics.auth_failures.labels(exc.status.name.lower()).inc()
                _refuse(outcomes[i], exc.status, exc.message)
            except InvalidMessage as exc:
                _refuse(outcomes[i], grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except _Refused as exc:
                _refuse(outcomes[i], exc.code, exc.message)
        reply = pb.PutFrameResult(seq=frame.seq)
        if specs:
            try:
                results = await self._commit(specs, self._timeout(context))
                for i, r in zip(at, results, strict=True):
                    outcomes[i].result.CopyFrom(_result_pb(r))
            except NotLeader:
                leader = self.leadership.leader_client_address()
                code = (
                    grpc.StatusCode.FAILED_PRECONDITION if leader else grpc.StatusCode.UNAVAILABLE
                )
                why = f"not the leader; the leader is at {leader}" if leader else "no leader"
                reply.leader = leader or ""
                for i in at:
                    _refuse(outcomes[i], code, why)
            except _Refused as exc:
                for i in at:
                    _refuse(outcomes[i], exc.code, exc.message)
        reply.outcomes.extend(outcomes)
        return reply

    async def Get(self, request: pb.GetRequest, context: _Context) -> pb.GetResponse:
        which = request.WhichOneof("key")
        account = await self._caller(context, "Get")
        try:
            if which == "msg_id":
                offset = offset_of_msg_id(request.msg_id)
            elif which == "commitlog_offset":
                offset = request.commitlog_offset
            else:
                raise InvalidMessage("give msg_id or commitlog_offset")
            if request.linearizable:
                await self._linearize(context)
            msg, size = self.commit_log.get_by_offset(offset)
            await self._check(context, account, lambda a: require_topics(a, [msg.topic], Perm.SUB))
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except OffsetOutOfRange as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        except KeyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        except CorruptEntry as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, _damaged(exc))
        return pb.GetResponse(message=stored_message_pb(msg, size))

    async def _linearize(self, context: _Context) -> None:
        try:
            await self.leadership.read_index(self._timeout(context))
        except NotLeader:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no leader to confirm the read")
        except TimeoutError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "read could not be confirmed")

    async def _dispatched_linearizable(self, context: _Context) -> None:
        """ReadIndex, then wait until dispatch covers the confirmed committed position."""
        await self._linearize(context)
        try:
            await self.queues.wait_dispatched(self.commit_log.committed_pos, self._timeout(context))
        except TimeoutError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "dispatch did not catch up in time")

    def _queue_view(self, topic: str, queue_id: int) -> reads.QueueView | None:
        return reads.queue_view(self.queues, topic, queue_id, self.cfg.cq_units_per_file)

    def _check_queue(self, topic: str, queue_id: int) -> None:
        check_name(topic)
        limit = 1 if topic.startswith(SYSTEM_TOPIC_PREFIX) else self.cfg.queues_per_topic
        if not 0 <= queue_id < limit:
            raise InvalidMessage(f"queue id {queue_id} outside [0, {limit}) for {topic!r}")

    async def Pull(self, request: pb.PullRequest, context: _Context) -> pb.PullResponse:
        """Messages of one queue from an offset; long-polls up to wait_ms for new ones.

        The reads and the answer's encoding run in the read pool (`_pull_reply`)."""
        r = request
        await self._allow(context, "Pull", lambda a: require_topics(a, [r.topic], Perm.SUB))
        try:
            self._check_queue(r.topic, r.queue_id)
            tags = parse_tag_expression(r.tag_expression)
            if r.max_messages < 0 or r.wait_ms < 0 or r.max_bytes < 0:
                raise InvalidMessage("max_messages, wait_ms and max_bytes must not be negative")
            if r.linearizable:
                await self._dispatched_linearizable(context)
            limit = _MAX_PULL_RAW if r.raw else _MAX_PULL
            max_messages = min(r.max_messages or _DEFAULT_PULL, limit)
            max_bytes = r.max_bytes or (4 << 20)
            wait_s = min(r.wait_ms / 1000, self._timeout(context))
            deadline = time.monotonic() + wait_s
            while True:
                queue = self._queue_view(r.topic, r.queue_id)
                view = reads.log_view(self.commit_log)
                reply = await self._in_thread(
                    _pull_reply, queue, view, r, max_messages, tags, max_bytes
                )
                remaining = deadline - time.monotonic()
                found = reply.raw_messages or reply.messages
                if found or reply.next_offset != r.queue_offset or remaining <= 0:
                    break
                await self.queues.wait_for_dispatch(remaining)
        except (InvalidMessage, OffsetOutOfRange, CorruptEntry) as exc:
            await context.abort(*_read_failure(exc))
        return reply

    async def QueryByKey(
        self, request: pb.QueryByKeyRequest, context: _Context
    ) -> pb.QueryByKeyResponse:
        """Messages whose KEYS (or UNIQ_KEY) hold `key`, newest first, in [begin, end]."""
        r = request
        await self._allow(context, "QueryByKey", lambda a: require_topics(a, [r.topic], Perm.SUB))
        try:
            check_name(r.topic)
            if not r.key:
                raise InvalidMessage("key must not be empty")
            if r.max_messages < 0 or r.begin_ms < 0 or r.end_ms < 0:
                raise InvalidMessage("max_messages, begin_ms and end_ms must not be negative")
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        end = r.end_ms or int(time.time() * 1000)
        limit = min(r.max_messages or _DEFAULT_PULL, _MAX_PULL)
        out: list[pb.StoredMessage] = []
        # Candidates include hash collisions: ask for more, keep the exact matches.
        for offset in self.queues.query_offsets(r.topic, r.key, r.begin_ms, end, 4 * limit):
            try:
                raw = self.commit_log.read_message(offset)
                msg, size = decode_message(raw), len(raw)
            except OffsetOutOfRange:
                continue  # deleted by retention since the index was read
            except CorruptEntry as exc:
                await context.abort(grpc.StatusCode.DATA_LOSS, _damaged(exc))
            if (
                msg.topic == r.topic
                and (r.key in msg.keys or msg.uniq_key == r.key)
                and r.begin_ms <= msg.store_timestamp_ms <= end
            ):
                out.append(stored_message_pb(msg, size))
                if len(out) >= limit:
                    break
        return pb.QueryByKeyResponse(messages=out)

    async def QueueOffsets(
        self, request: pb.QueueOffsetsRequest, context: _Context
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
        queues = self.queues
        reply = pb.QueueOffsetsResponse(
            queues=[
                pb.QueueOffset(topic=t, queue_id=q, min_offset=lo, max_offset=hi)
                for t, q, lo, hi in queues.queue_offsets(topic)
                if account is None or Perm.SUB in account.topic_perm(t)
            ],
            dispatched_offset=queues.dispatched_pos,
        )
        if self._local is not None and (account is None or account.reads_everything):
            # The files hold every topic: only for a caller who may read them all.
            reply.local_files.CopyFrom(self._local)
            reply.local_files.log_file_end = min(
                self.commit_log.flushed_position, self.commit_log.committed_pos
            )
        return reply

    async def CommitOffset(
        self, request: pb.CommitOffsetRequest, context: _Context
    ) -> pb.CommitOffsetResponse:
        """Record a group's offset through the Raft log (so it survives failover)."""
        r = request
        account = await self._allow(
            context, "CommitOffset", lambda a: _group_rights(a, r.group, r.topic)
        )
        try:
            wrong = self._check_cluster(r.cluster)
            if wrong:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
            check_name(r.group, "group")
            self._check_queue(r.topic, r.queue_id)
            if r.offset < 0:
                raise InvalidMessage(f"offset {r.offset} must not be negative")
            spec = self.writes.prepare(
                OFFSETS_TOPIC,
                encode_offset_commit(r.group, r.topic, r.queue_id, r.offset),
                keys=[r.group],
                uniq_key=uuid.uuid4().hex.upper(),
                queue_id=0,
                born_timestamp_ms=int(time.time() * 1000),
            )
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            (result,) = await self.writes.put([spec], self._timeout(context))
            await self.queues.wait_dispatched(result.commitlog_offset + 1, self._timeout(context))
        except NotLeader as exc:
            await self._forward_to_leader(exc, context, "CommitOffset", request, account)
        except (OutcomeUnknown, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"offset commit: {exc}")
        except (PutFailed, Overloaded) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"offset commit: {exc}")
        return pb.CommitOffsetResponse()

    async def FetchOffset(
        self, request: pb.FetchOffsetRequest, context: _Context
    ) -> pb.FetchOffsetResponse:
        r = request
        await self._allow(context, "FetchOffset", lambda a: _group_rights(a, r.group, r.topic))
        try:
            check_name(r.group, "group")
            if r.queue_id != -1:
                self._check_queue(r.topic, r.queue_id)
            else:
                check_name(r.topic)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if r.linearizable:
            await self._dispatched_linearizable(context)
        offsets = self.queues.group_offsets
        queues = [r.queue_id] if r.queue_id != -1 else range(self.cfg.queues_per_topic)
        return pb.FetchOffsetResponse(
            offsets=[
                pb.GroupOffset(
                    topic=r.topic, queue_id=q, offset=offsets.get((r.group, r.topic, q), -1)
                )
                for q in queues
            ]
        )

    async def CleanNow(self, request: pb.CleanNowRequest, context: _Context) -> pb.CleanNowResponse:
        await self._allow(context, "CleanNow", lambda a: require_admin(a, "CleanNow"))
        deleted, min_offset, reason = await self.admin.clean_now(force=request.force)
        return pb.CleanNowResponse(deleted_segments=deleted, min_offset=min_offset, reason=reason)

    async def Status(self, request: pb.StatusRequest, context: _Context) -> pb.StatusResponse:
        await self._caller(context, "Status")
        reply = status_pb(self.admin, self.cfg)
        reply.loop_lag_max_ms = self.loop_lag.max_ms(reset=request.reset_loop_lag)
        return reply

    # -- transactional messages (docs/delayed-and-transactional.md) ------------------

    async def _forward_to_leader(
        self, exc: NotLeader, context: _Context, method: str, request: Any,
        account: Account | None,
    ) -> Any:  # fmt: skip
        leader, stub = await self._leader_stub(exc, context)
        try:
            meta = self._forward_metadata(account, method)
            return await getattr(stub, method)(request, timeout=self._timeout(context),
                                               metadata=meta)  # fmt: skip
        except grpc.aio.AioRpcError as err:
            await context.abort(*_forward_failure(err, leader))
        raise AssertionError("unreachable: abort raises")

    async def PutHalf(self, request: pb.PutHalfRequest, context: _Context) -> pb.PutHalfResponse:
        m = request.message
        account = await self._allow(
            context, "PutHalf", lambda a: require_topics(a, [m.topic], Perm.PUB)
        )
        wrong = self._check_cluster(request.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        try:
            spec = self._spec(m, producer_group=request.producer_group)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            (result,) = await self._commit([spec], self._timeout(context))
        except NotLeader as exc:
            reply: pb.PutHalfResponse = await self._forward_to_leader(
                exc, context, "PutHalf", request, account
            )
            return reply
        except _Refused as exc:
            await context.abort(exc.code, exc.message)
        return pb.PutHalfResponse(result=_result_pb(result), transaction_id=m.uniq_key)

    async def EndTransaction(
        self, request: pb.EndTransactionRequest, context: _Context
    ) -> pb.EndTransactionResponse:
        r, leadership = request, self.leadership
        account = await self._caller(context, "EndTransaction")
        wrong = self._check_cluster(r.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        if not leadership.is_leader():
            reply: pb.EndTransactionResponse = await self._forward_to_leader(
                NotLeader(leadership.leader_id), context, "EndTransaction", request, account
            )
            return reply
        half = self.transactions.message_at(r.half_offset)
        if half is None or half.uniq_key != HALF_KEY_PREFIX + r.transaction_id:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no half message of transaction {r.transaction_id!r} at "
                                f"offset {r.half_offset}")  # fmt: skip
        assert half is not None
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        await self._check(context, account, lambda a: require_topics(a, [topic], Perm.PUB))
        try:
            done = await self.transactions.end_transaction(
                r.transaction_id, r.half_offset, r.commit
            )
        except NotLeader as exc:
            forwarded: pb.EndTransactionResponse = await self._forward_to_leader(
                exc, context, "EndTransaction", request, account
            )
            return forwarded
        except UnknownTransaction as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except TransactionConflict as exc:
            await context.abort(grpc.StatusCode.ABORTED, str(exc))
        except (OutcomeUnknown, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{exc}; retry: ending "
                                "a transaction twice the same way changes nothing")  # fmt: skip
        except (PutFailed, Overloaded) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        reply = pb.EndTransactionResponse(committed=done.outcome == "commit",
                                          duplicate=done.duplicate)  # fmt: skip
        if done.result is not None:
            reply.result.CopyFrom(_result_pb(done.result))
        return reply

    async def TransactionChecks(
        self, request_iterator: AsyncIterator[pb.TransactionCheckAnswer], context: _Context
    ) -> AsyncIterator[pb.TransactionCheck]:
        """A producer's stream: checks of its group's undecided halves go out while this
        node leads; each answer commits, rolls back, or (UNKNOWN) waits for the next."""
        account = await self._caller(context, "TransactionChecks")
        hello = await anext(aiter(request_iterator), None)
        if hello is None or not hello.producer_group:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "the stream's first message names the producer group")  # fmt: skip
        assert hello is not None
        group = hello.producer_group
        transactions = self.transactions
        checks = transactions.open_checks(group)
        answering: set[asyncio.Task[None]] = set()
        # What this stream asked about: an answer may decide only those (any other
        # transaction is ended through EndTransaction, which checks the caller's rights).
        asked: set[tuple[str, int]] = set()

        async def answer(a: pb.TransactionCheckAnswer) -> None:
            if a.action == pb.TransactionCheckAnswer.UNKNOWN:
                return
            if (a.transaction_id, a.half_offset) not in asked:
                log.warning("check answer for %s ignored: this stream was not asked about it",
                            a.transaction_id)  # fmt: skip
                return
            try:
                await transactions.end_transaction(
                    a.transaction_id, a.half_offset, a.action == pb.TransactionCheckAnswer.COMMIT,
                    by="check",
                )  # fmt: skip
            except (NotLeader, UnknownTransaction, TransactionConflict, OutcomeUnknown,
                    PutFailed, Overloaded, TimeoutError) as exc:  # fmt: skip
                log.info("check answer for %s not applied: %s", a.transaction_id, exc)

        async def read_answers() -> None:
            async for a in request_iterator:
                task = asyncio.ensure_future(answer(a))
                answering.add(task)
                task.add_done_callback(answering.discard)

        reader = asyncio.ensure_future(read_answers())
        try:
            while not reader.done():
                getter = asyncio.ensure_future(checks.get())
                await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                check = getter.result()
                topic = check.message.properties.get(PROPERTY_REAL_TOPIC, "")
                if account is not None:
                    try:
                        require_topics(account, [topic], Perm.PUB)
                    except AuthError:
                        continue  # not this producer's to decide
                shown = _as_committed(check.message, topic)
                asked.add((check.transaction_id, check.half_offset))
                yield pb.TransactionCheck(
                    transaction_id=check.transaction_id, half_offset=check.half_offset,
                    check_times=check.check_times,
                    message=stored_message_pb(shown, len(check.message.body)),
                )  # fmt: skip
        finally:
            transactions.close_checks(group, checks)
            reader.cancel()

    async def TransferLeadership(
        self, request: pb.TransferLeadershipRequest, context: _Context
    ) -> pb.TransferLeadershipResponse:
        await self._allow(
            context, "TransferLeadership", lambda a: require_admin(a, "TransferLeadership")
        )
        target = request.target_node_id
        if target not in {p.id for p in self.cfg.peers}:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"node {target} is not a peer")
        if not self.leadership.is_leader():
            leader = self.leadership.leader_client_address()
            if leader is None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "no leader at the moment; retry")
            context.set_trailing_metadata(self._leader_metadata())
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"not the leader; the leader is at {leader}")  # fmt: skip
        try:
            leader_id = await self.leadership.transfer_leadership(
                target, (request.timeout_ms or 5000) / 1000
            )
        except TimeoutError as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        return pb.TransferLeadershipResponse(leader_id=leader_id)

    async def ReadRange(
        self, request: pb.ReadRangeRequest, context: _Context
    ) -> pb.ReadRangeResponse:
        await self._allow(context, "ReadRange", _read_everything)
        cl = self.commit_log
        try:
            bodies, nxt = cl.read_range(request.from_offset, request.max_messages or 1024,
                                        request.max_bytes or (4 << 20))  # fmt: skip
        except KeyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        except CorruptEntry as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, _damaged(exc))
        return pb.ReadRangeResponse(
            messages=b"".join(bodies),
            next_offset=nxt,
            committed_offset=cl.committed_pos,
            min_offset=cl.min_offset,
        )

    async def ReadLog(
        self, request: pb.ReadLogRequest, context: _Context
    ) -> AsyncIterator[pb.ReadLogChunk]:
        """Raw committed commit-log bytes [from_pos, min(end_pos, committed)), in chunks read
        (and CRC-checked, once per process) in the read pool."""
        await self._allow(context, "ReadLog", _read_everything)
        r = request
        if r.from_pos < 0 or r.end_pos < 0 or r.chunk_bytes < 0:
            why = "from_pos, end_pos and chunk_bytes must not be negative"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        chunk = min(r.chunk_bytes or _LOG_CHUNK, _MAX_LOG_CHUNK)
        view = reads.log_view(self.commit_log)
        end = view.committed if r.end_pos == 0 else min(r.end_pos, view.committed)
        pos = r.from_pos
        if pos < view.min_pos and pos < end:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, f"commit-log position {pos} is "
                                f"below the first retained position {view.min_pos}")  # fmt: skip
        loop = asyncio.get_running_loop()

        def read(at: int, view: reads.LogView) -> asyncio.Future[pb.ReadLogChunk]:
            def work() -> pb.ReadLogChunk:
                data = reads.read_log_checked(view, self.verified, at, chunk, end)
                return pb.ReadLogChunk(pos=at, data=data, committed_pos=view.committed,
                                       min_pos=view.min_pos)  # fmt: skip

            return loop.run_in_executor(self._reads, work)

        pending = read(pos, view) if pos < end else None
        while pending is not None:
            try:
                answer = await pending
            except (InvalidMessage, OffsetOutOfRange, CorruptEntry) as exc:
                await context.abort(*_read_failure(exc))
            pos = answer.pos + len(answer.data)
            # The next chunk is read while this one is sent (retention may move on: a
            # fresh snapshot of the files each time).
            pending = read(pos, reads.log_view(self.commit_log)) if pos < end else None
            try:
                yield answer
            except BaseException:
                if pending is not None:
                    pending.cancel()
                raise

    async def ReadUnits(
        self, request: pb.ReadUnitsRequest, context: _Context
    ) -> AsyncIterator[pb.QueueUnits]:
        """Raw consume-queue units of the queues asked, below their committed ends (and of
        messages in [from_pos, to_pos) when given)."""
        r = request
        topics = sorted({q.topic for q in r.queues})
        await self._allow(context, "ReadUnits", lambda a: require_topics(a, topics, Perm.SUB))
        try:
            if r.from_pos < 0 or r.to_pos < 0:
                raise InvalidMessage("from_pos and to_pos must not be negative")
            for want in r.queues:
                self._check_queue(want.topic, want.queue_id)
                if want.start_offset < 0 or want.end_offset < 0:
                    raise InvalidMessage("start_offset and end_offset must not be negative")
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        for want in r.queues:
            queue = self._queue_view(want.topic, want.queue_id)
            if queue is None:
                yield pb.QueueUnits(topic=want.topic, queue_id=want.queue_id)
                continue
            start = max(want.start_offset, queue.min_offset)
            end = queue.max_offset if want.end_offset == 0 else want.end_offset
            end = max(start, min(end, queue.max_offset))
            answer = pb.QueueUnits(
                topic=want.topic,
                queue_id=want.queue_id,
                min_offset=queue.min_offset,
                max_offset=queue.max_offset,
            )
            answer.first_offset = start
            try:
                if r.from_pos or r.to_pos:
                    start, end = await self._in_thread(
                        reads.units_between, queue, start, end, r.from_pos, r.to_pos
                    )
                    answer.first_offset = start
                if start >= end:
                    yield answer
                for lo in range(start, end, reads.MAX_UNITS_ANSWER):
                    hi = min(end, lo + reads.MAX_UNITS_ANSWER)
                    answer.first_offset = lo
                    answer.units = await self._in_thread(reads.units_chunk, queue, lo, hi)
                    yield answer
            except (OffsetOutOfRange, CorruptEntry) as exc:
                await context.abort(*_read_failure(exc))

    async def OffsetsForTimes(
        self, request: pb.OffsetsForTimesRequest, context: _Context
    ) -> pb.OffsetsForTimesResponse:
        """Per (queue, timestamp): the first offset stored at or after it (binary search)."""
        r = request
        topics = sorted({q.topic for q in r.queries})
        await self._allow(context, "OffsetsForTimes", lambda a: require_topics(a, topics, Perm.SUB))
        try:
            for q in r.queries:
                self._check_queue(q.topic, q.queue_id)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        views = [self._queue_view(q.topic, q.queue_id) for q in r.queries]
        log_view = reads.log_view(self.commit_log)

        def search() -> list[int]:
            return [
                0 if v is None else reads.offset_for_time(v, log_view, q.timestamp_ms)
                for q, v in zip(r.queries, views, strict=True)
            ]

        try:
            offsets = await self._in_thread(search)
        except (OffsetOutOfRange, CorruptEntry) as exc:
            await context.abort(*_read_failure(exc))
        return pb.OffsetsForTimesResponse(offsets=offsets)


class _Refused(Exception):
    """A put this node refuses, with the status that says why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _refuse(outcome: pb.PutOutcome, code: grpc.StatusCode, message: str) -> None:
    outcome.code = code.value[0]
    outcome.error = message


def _forward_scope(method: str, access_key: str) -> str:
    return f"forward:{method}:{access_key}"


def _damaged(exc: CorruptEntry) -> str:
    """What a client is told of a damaged entry (the node's log names the file)."""
    log.warning("a read met a damaged entry: %s", exc)
    return (f"the entry at commit-log position {exc.offset} is damaged on this replica "
            "(never served): read it from another replica")  # fmt: skip


def _group_rights(account: Account, group: str, topic: str) -> None:
    require_group(account, group)
    require_topics(account, [topic], Perm.SUB)


def _read_everything(account: Account) -> None:
    if not account.reads_everything:
        raise AuthError(f"access key {account.access_key!r} may not read every topic: "
                        "ReadRange returns the raw commit log", denied=True)  # fmt: skip


def _pull_reply(
    queue: reads.QueueView | None,
    view: reads.LogView,
    r: pb.PullRequest,
    max_messages: int,
    tags: frozenset[str] | None,
    max_bytes: int,
) -> pb.PullResponse:
    """One Pull's answer, read and encoded in the read pool."""
    found = reads.pull_scan(queue, view, r.queue_offset, max_messages, tags,
                            max_bytes=max_bytes, end_offset=r.end_offset)  # fmt: skip
    reply = pb.PullResponse(
        next_offset=found.next_offset,
        min_offset=queue.min_offset if queue is not None else 0,
        max_offset=queue.max_offset if queue is not None else 0,
    )
    if r.raw:
        reply.raw_messages = b"".join(found.messages)
    else:
        reply.messages.extend(
            stored_message_pb(decode_message(d), size)
            for d, size in zip(found.messages, found.sizes, strict=True)
        )
    return reply


def _local_files(data_dir: str) -> pb.LocalFiles | None:
    """Where a reader on this host finds this node's files (see QueueOffsets)."""
    try:
        path = os.path.abspath(data_dir)
        st = os.stat(path)
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        return None  # not Linux, or no boot id: readers use the RPCs
    return pb.LocalFiles(data_dir=path, boot_id=boot_id, dir_device=st.st_dev,
                         dir_inode=st.st_ino)  # fmt: skip


def _read_failure(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status a read answers for bad input, a position outside the log, or damage."""
    if isinstance(exc, OffsetOutOfRange):
        return grpc.StatusCode.OUT_OF_RANGE, str(exc)
    if isinstance(exc, CorruptEntry):
        return grpc.StatusCode.DATA_LOSS, _damaged(exc)
    return grpc.StatusCode.INVALID_ARGUMENT, str(exc)


def _forward_failure(err: grpc.aio.AioRpcError, leader: str) -> tuple[grpc.StatusCode, str]:
    """What a follower answers when the leader it forwarded to failed the call. The
    leader it knew may have lost its leadership meanwhile ("not the leader",
    FAILED_PRECONDITION without the redirect the client needs): that is a retry,
    UNAVAILABLE, not a refusal the client would take for a wrong cluster."""
    code = err.code()
    if code is grpc.StatusCode.FAILED_PRECONDITION and "not the leader" in (err.details() or ""):
        code = grpc.StatusCode.UNAVAILABLE
    return code, f"(forwarded to {leader}) {err.details()}"


def _as_committed(msg: Message, topic: str) -> Message:
    """A half message as its real topic will hold it (for a producer's check)."""
    props = {
        k: v
        for k, v in msg.properties.items()
        if k not in (PROPERTY_REAL_TOPIC, PROPERTY_PRODUCER_GROUP, "REAL_QID", "TRAN_MSG")
    }
    uniq = (msg.uniq_key or "").removeprefix(HALF_KEY_PREFIX)
    return dataclasses.replace(msg, topic=topic, properties={**props, "UNIQ_KEY": uniq})


def stored_message_pb(msg: Message, size: int) -> pb.StoredMessage:
    props = {k: v for k, v in msg.properties.items() if k not in ("KEYS", "TAGS", "UNIQ_KEY")}
    return pb.StoredMessage(
        topic=msg.topic, queue_id=msg.queue_id, queue_offset=msg.queue_offset,
        commitlog_offset=msg.physical_offset,
        msg_id=make_msg_id(msg.store_host, msg.physical_offset),
        body=msg.body, keys=msg.keys, tags=msg.tags or "", properties=props,
        born_timestamp_ms=msg.born_timestamp_ms, store_timestamp_ms=msg.store_timestamp_ms,
        body_size=len(msg.body), size=size, uniq_key=msg.uniq_key or "", flag=msg.flag,
    )  # fmt: skip


def status_pb(node: Status, cfg: NodeConfig) -> pb.StatusResponse:
    peers = [
        pb.PeerStatus(
            node_id=p, match_index=pr.match, next_index=pr.next, recent_active=pr.recent_active
        )
        for p, pr in sorted(node.progress.items())
    ]
    return pb.StatusResponse(
        node_id=cfg.node_id, role=node.role.value, term=node.term,
        leader_id=node.leader_id or 0, leader_address=node.leader_client_address() or "",
        first_index=node.first_index(), last_index=node.last_index(),
        committed_index=node.committed_index, committed_pos=node.committed_pos,
        flushed_pos=node.flushed_position, dispatched_pos=node.dispatched_pos,
        applied_index=node.committed_index,
        cluster=cfg.cluster, peers=peers, last_chain_crc=node.last_chain_crc,
        flush_mode=cfg.flush_mode,
    )  # fmt: skip
