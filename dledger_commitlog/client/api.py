"""What a client can do, written once for `Client` and `AsyncClient`.

Owns `ClientBase` (a client's settings, its `Router`, its PutFrames pipes) and
the operations of the API as `@operation`s (`operation.py`): methods that build the
call's `Op`; each client runs that Op with its own `_run`, so on a `Client` the
method returns the result and on an `AsyncClient` a coroutine of it. A shard's
administration calls (leadership, membership) are `ClientBase`'s base
`MemberOps`, in `member_ops.py`; the consumer-group calls are `groups.GroupOps`.
What the clients cannot share (sleeping, making a call, asking every server's
Status, closing) is theirs, in `blocking.py` and `aio.py`.

Invariants: every message gets its uniq_key before the first attempt; a request
is built once per call, so its retries send the same bytes; a framed put's pipe
lives in the event loop its client runs them in, and only there is it touched.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from dledger_commitlog.client.access import (
    CHANNEL_OPTIONS,
    Access,
    Channels,
    cluster_security,
    load_credentials,
)
from dledger_commitlog.client.errors import GroupRefused, InvalidArgument, WrongCluster
from dledger_commitlog.client.member_ops import MemberOps
from dledger_commitlog.client.operation import AsyncCalls, BlockingCalls, operation
from dledger_commitlog.client.put_pipe import PipeFailure, PutPipe
from dledger_commitlog.client.retry import NO_ANSWER, Attempt, Failure, Op, Router
from dledger_commitlog.client.values import (
    Backlog,
    CleanResult,
    HalfResult,
    MessageSpec,
    NodeStatus,
    PullResult,
    PutResult,
    QueueOffset,
    ReadRangeResult,
    Routes,
    StoredMessage,
    TopicRoute,
    TransactionEnd,
    Waiting,
    node_status,
    put_result,
    routes,
    stored_message,
    topic_route,
)
from proto import dledger_pb2 as pb


def cluster_file_args(path: str | Path, kwargs: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The servers and the client arguments (`kwargs` first) a `cluster.json` gives."""
    try:
        doc = json.loads(Path(path).read_text())
        servers = [str(node["client"]) for node in doc["nodes"] if not node.get("removed")]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable cluster file ({exc})") from exc
    kwargs = dict(kwargs)
    kwargs.setdefault("cluster", doc.get("cluster") or None)
    tls_ca, credentials = cluster_security(doc)
    if tls_ca:
        kwargs.setdefault("tls_ca", tls_ca)
    if credentials and kwargs.get("credentials") is None:
        kwargs["credentials"] = load_credentials(credentials)
    return servers, kwargs


def _now_ms() -> int:
    return int(time.time() * 1000)


def chunks(items: Iterable[MessageSpec], size: int) -> Iterator[list[MessageSpec]]:
    """`items` in lists of `size` (the last may be shorter): put_stream's batches."""
    chunk: list[MessageSpec] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class ClientBase(MemberOps):
    """Settings, routing and the operations both clients share."""

    def __init__(
        self,
        servers: Sequence[str] | str,
        *,
        cluster: str | None = None,
        timeout_s: float = 10.0,
        max_retries: int = 32,
        attempt_timeout_s: float | None = None,
        backoff_base_s: float = 0.05,
        backoff_max_s: float = 0.25,
        seed: int | None = None,
        tls_ca: str | bytes | None = None,
        credentials: tuple[str, str] | None = None,
        framed: bool = True,
        shard: int = 1,
        linger_ms: float = 1.0,
        group: int | None = None,
    ) -> None:
        """`tls_ca`: the CA (PEM path or bytes) that signed the servers' certificates:
        the client then speaks TLS. `credentials`: (access key, secret key) to sign
        every call with, for a cluster with an ACL. `framed`: single puts travel over
        one PutFrames stream per server, concurrent ones coalesced into frames (False:
        one unary Put each, as servers before PutFrames need). `linger_ms`: while earlier
        frames are unanswered, a framed put waits this long for others to share its frame
        (Kafka's linger.ms; a lone sequential put never waits; 0: never). `shard`: the
        shard (one Raft group) every call is for (docs/scaling.md; `routing.RoutedClient`
        sends each call to its topic's shards); `group` is its old name."""
        if isinstance(servers, str):
            servers = servers.split(",")
        if timeout_s <= 0 or max_retries < 0 or backoff_base_s < 0 or not linger_ms >= 0:
            raise ValueError(
                "need timeout_s > 0, max_retries >= 0, backoff_base_s >= 0 and linger_ms >= 0"
            )
        self.linger_s = linger_ms / 1000
        self._router = Router(servers, framed)
        self.cluster = cluster or ""
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.attempt_timeout_s = attempt_timeout_s or min(max(1.0, timeout_s / 4), 5.0)
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = max(backoff_max_s, backoff_base_s)
        self.rng = random.Random(seed)  # the back-off jitter
        if isinstance(tls_ca, str):
            tls_ca = Path(tls_ca).read_bytes()
        self.access = Access(tls_ca, credentials)
        if group is not None:
            warnings.warn(
                "Client(group=...) is now Client(shard=...) (the old name works "
                "for one more release)",
                FutureWarning,
                stacklevel=2,
            )
            shard = group
        if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
            raise ValueError(f"shard must be a shard id (an integer >= 0), not {shard!r}")
        self.shard = shard
        self._metadata = self.access.shard_metadata(shard)
        # asyncio channels: the pipes' (and AsyncClient's calls'), opened in their loop
        self._aio = Channels(lambda address: self.access.aio_channel(address, CHANNEL_OPTIONS))
        self._pipes: dict[str, PutPipe] = {}
        self._pipe_ssl: ssl.SSLContext | None = None

    @classmethod
    def from_cluster_file(cls, path: str | Path, **kwargs: Any) -> Self:
        """A client of the cluster a `cluster.json` describes (`cli/cluster_layout.py`;
        nodes marked removed from the cluster are left out)."""
        servers, kwargs = cluster_file_args(path, kwargs)
        return cls(servers, **kwargs)

    @property
    def servers(self) -> list[str]:
        return list(self._router.servers)

    @property
    def leader(self) -> str | None:
        """The address this client currently believes is the leader's."""
        return self._router.leader

    @property
    def framed(self) -> bool:
        """Whether single puts go through PutFrames (False once a server lacked it)."""
        return self._router.framed

    # -- in the event loop of the client's pipes --------------------------------------

    async def _framed_put(self, attempt: Attempt) -> pb.PutResponse | Failure:
        """One put through `attempt.address`'s PutFrames stream (coalesced with
        concurrent ones): the PutResponse, or the Failure of this attempt."""
        address = attempt.address
        pipe = self._pipes.get(address)
        if pipe is None or pipe.broken is not None:
            if self._pipe_ssl is None and self.access.tls_ca is not None:
                self._pipe_ssl = self.access.ssl_context()
            pipe = self._pipes[address] = PutPipe(
                address,
                ssl_context=self._pipe_ssl,
                cluster=self.cluster,
                metadata=lambda: self._metadata("PutFrames"),
                linger_s=self.linger_s,
            )
        try:
            async with asyncio.timeout(attempt.timeout_s):
                result = await pipe.put(attempt.op.request.message)
        except PipeFailure as exc:
            return Failure(exc.code, exc.details, exc.leader)
        except TimeoutError:
            return Failure("DEADLINE_EXCEEDED", NO_ANSWER)
        return pb.PutResponse(result=result)

    async def _close_aio(self) -> None:
        """Close the put streams, then the asyncio channels."""
        pipes, self._pipes = list(self._pipes.values()), {}
        for pipe in pipes:
            await pipe.close()
        for channel in self._aio.take():
            await channel.close()

    def _accept(self, address: str, resp: pb.StatusResponse) -> NodeStatus:
        st = node_status(address, resp)
        if self.cluster and st.cluster and st.cluster != self.cluster:
            raise WrongCluster(
                f"{address} serves cluster {st.cluster!r}, not {self.cluster!r}", address=address
            )
        return st

    # -- the operations --------------------------------------------------------------

    @operation
    def put(
        self,
        topic: str,
        body: bytes | str,
        *,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        uniq_key: str | None = None,
        queue_id: int | None = None,
        delay_level: int = 0,
        deliver_at_ms: int = 0,
        sharding_key: str = "",
    ) -> Op[PutResult]:
        """Put one message; with `delay_level` or `deliver_at_ms` it reaches its topic
        later (docs/delayed-and-transactional.md) and the result is the stored copy's.
        `sharding_key`: the server picks the key's queue, the same for every message of
        the key, so an orderly consumer sees them in order (docs/consumer-groups.md)."""
        spec = MessageSpec(
            topic,
            body,
            keys,
            tags,
            properties,
            uniq_key,
            queue_id,
            delay_level=delay_level,
            deliver_at_ms=deliver_at_ms,
            sharding_key=sharding_key,
        )
        msg = spec.to_pb(_now_ms())
        request = pb.PutRequest(message=msg, cluster=self.cluster)
        return Op(
            "put",
            "Put",
            request,
            lambda r: put_result(r.result),
            True,
            (msg.uniq_key,),
            framed=True,
        )

    @operation
    def put_half(
        self,
        topic: str,
        body: bytes | str,
        *,
        producer_group: str,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        uniq_key: str | None = None,
        queue_id: int | None = None,
    ) -> Op[HalfResult]:
        """Store a transactional (half) message: no consumer sees it until
        `end_transaction(..., commit=True)`; `uniq_key` is the transaction id."""
        spec = MessageSpec(topic, body, keys, tags, properties, uniq_key, queue_id)
        msg = spec.to_pb(_now_ms())
        request = pb.PutHalfRequest(
            message=msg, producer_group=producer_group, cluster=self.cluster
        )

        def convert(r: pb.PutHalfResponse) -> HalfResult:
            return HalfResult(r.transaction_id, r.result.commitlog_offset, put_result(r.result))

        return Op("put_half", "PutHalf", request, convert, True, (msg.uniq_key,))

    @operation
    def end_transaction(
        self, half: HalfResult | str, half_offset: int | None = None, *, commit: bool
    ) -> Op[TransactionEnd]:
        """Commit (the message becomes visible, once) or roll back (never visible).
        Raises TransactionConflict if it was decided the other way, NotFound if no
        such half message exists."""
        if isinstance(half, HalfResult):
            tx, offset = half.transaction_id, half.half_offset
        elif half_offset is None:
            raise InvalidArgument("give the half offset with a transaction id")
        else:
            tx, offset = half, half_offset
        request = pb.EndTransactionRequest(
            transaction_id=tx, half_offset=offset, commit=commit, cluster=self.cluster
        )

        def convert(r: pb.EndTransactionResponse) -> TransactionEnd:
            result = put_result(r.result) if r.HasField("result") else None
            return TransactionEnd(r.committed, result, r.duplicate)

        # Retried like a put: ending a transaction twice the same way changes nothing.
        return Op("end_transaction", "EndTransaction", request, convert, True, (tx,))

    @operation
    def backlog(self) -> Op[Backlog]:
        """Delayed messages per level and half messages per producer group, waiting."""

        def convert(r: pb.BacklogResponse) -> Backlog:
            return Backlog(
                tuple(
                    (d.level, d.delay_ms, Waiting(d.messages, d.oldest_stored_ms))
                    for d in r.delayed
                ),
                tuple(
                    (h.producer_group, Waiting(h.messages, h.oldest_stored_ms)) for h in r.halves
                ),
            )

        return Op("backlog", "Backlog", pb.BacklogRequest(), convert)

    @operation
    def put_batch(self, messages: Sequence[MessageSpec]) -> Op[list[PutResult]]:
        """Put messages atomically as one batch (one bad message fails all)."""
        now = _now_ms()
        msgs = [s.to_pb(now) for s in messages]
        request = pb.PutBatchRequest(messages=msgs, cluster=self.cluster)
        keys = tuple(m.uniq_key for m in msgs)
        return Op(
            "put_batch",
            "PutBatch",
            request,
            lambda r: [put_result(x) for x in r.results],
            True,
            keys,
        )

    @operation
    def get(
        self, msg_id: str | None = None, offset: int | None = None, linearizable: bool = False
    ) -> Op[StoredMessage]:
        """By message id or by commit-log offset (exactly one)."""
        if (msg_id is None) == (offset is None):
            raise ValueError("get: give exactly one of msg_id and offset")
        if msg_id is not None:
            request = pb.GetRequest(msg_id=msg_id, linearizable=linearizable)
        else:
            request = pb.GetRequest(commitlog_offset=offset, linearizable=linearizable)
        return Op("get", "Get", request, lambda r: stored_message(r.message))

    @operation
    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        tag_expression: str = "*",
        wait_ms: int = 0,
        linearizable: bool = False,
    ) -> Op[PullResult]:
        """One queue's messages from `offset`; waits up to `wait_ms` when there are none."""
        request = pb.PullRequest(
            topic=topic,
            queue_id=queue_id,
            queue_offset=offset,
            max_messages=max_messages,
            tag_expression=tag_expression,
            wait_ms=wait_ms,
            linearizable=linearizable,
        )

        def convert(r: pb.PullResponse) -> PullResult:
            msgs = tuple(stored_message(m) for m in r.messages)
            return PullResult(msgs, r.next_offset, r.min_offset, r.max_offset)

        return Op("pull", "Pull", request, convert, floor_s=1 + wait_ms / 1000)

    @operation
    def queue_offsets(self, topic: str = "", linearizable: bool = False) -> Op[list[QueueOffset]]:
        """Min and max offsets of the topic's queues (every user topic's when empty)."""
        request = pb.QueueOffsetsRequest(topic=topic, linearizable=linearizable)

        def convert(r: pb.QueueOffsetsResponse) -> list[QueueOffset]:
            return [QueueOffset(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in r.queues]

        return Op("queue_offsets", "QueueOffsets", request, convert)

    @operation
    def commit_offset(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        member_id: str = "",
        epoch: int = 0,
    ) -> Op[None]:
        """Record `offset` (the next to consume) for `group` through the Raft log. A group
        with live members (docs/consumer-groups.md) takes it only from the queue's owner:
        `member_id` and its lease `epoch` (GroupRefused otherwise)."""
        request = pb.CommitOffsetRequest(
            group=group,
            topic=topic,
            queue_id=queue_id,
            offset=offset,
            cluster=self.cluster,
            member_id=member_id,
            epoch=epoch,
        )
        # Setting an offset twice is harmless: a retry after an unknown outcome is safe.
        return Op("commit_offset", "CommitOffset", request, lambda r: None, refusal=GroupRefused)

    @operation
    def fetch_offset(
        self, group: str, topic: str, queue_id: int = -1, linearizable: bool = False
    ) -> Op[dict[int, int]]:
        """Queue id -> the group's committed offset (-1: nothing committed)."""
        request = pb.FetchOffsetRequest(
            group=group, topic=topic, queue_id=queue_id, linearizable=linearizable
        )
        return Op(
            "fetch_offset",
            "FetchOffset",
            request,
            lambda r: {o.queue_id: o.offset for o in r.offsets},
        )

    @operation
    def query(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 0, max_messages: int = 32
    ) -> Op[list[StoredMessage]]:
        """Messages of `topic` with `key`, stored between `begin_ms` and `end_ms`."""
        request = pb.QueryByKeyRequest(
            topic=topic, key=key, begin_ms=begin_ms, end_ms=end_ms, max_messages=max_messages
        )
        return Op("query", "QueryByKey", request, lambda r: [stored_message(m) for m in r.messages])

    @operation
    def read_range(
        self, from_offset: int, max_messages: int = 1024, max_bytes: int = 4 << 20
    ) -> Op[ReadRangeResult]:
        """Raw committed messages from `from_offset` on, for bulk readers (analytics)."""
        request = pb.ReadRangeRequest(
            from_offset=from_offset, max_messages=max_messages, max_bytes=max_bytes
        )

        def convert(r: pb.ReadRangeResponse) -> ReadRangeResult:
            return ReadRangeResult(r.messages, r.next_offset, r.committed_offset, r.min_offset)

        return Op("read_range", "ReadRange", request, convert)

    @operation
    def clean_now(
        self, server: str, force: bool = False, timeout_s: float = 30.0
    ) -> Op[CleanResult]:
        """Run retention now on the node at `server` (each node cleans its own store)."""

        def convert(r: pb.CleanNowResponse) -> CleanResult:
            return CleanResult(r.deleted_segments, r.min_offset, r.reason)

        request = pb.CleanNowRequest(force=force)
        return Op("clean_now", "CleanNow", request, convert, pinned=server, timeout_s=timeout_s)

    @operation
    def route(self, topic: str = "", linearizable: bool = False) -> Op[Routes]:
        """The cluster's routes (docs/scaling.md): with `topic`, that topic's (configured
        or default); without, every configured one. A single-shard cluster answers one
        shard and the default route. `linearizable`: only the table shard 0's leader
        confirms current (a node behind it waits to catch up); else the answering
        node's, as old as its `age_ms` says."""
        request = pb.RouteRequest(cluster=self.cluster, topic=topic, linearizable=linearizable)
        return Op("route", "Route", request, routes)

    @operation
    def topic_update(
        self,
        op: str,
        topic: str,
        shards: Mapping[int, int] | None = None,
        *,
        groups: Mapping[int, int] | None = None,
    ) -> Op[TopicRoute | None]:
        """Create, update or delete (`op`) `topic`'s route through shard 0: `shards` maps
        each shard to the topic's queues there (`groups`: its old name). The route made
        (None: deleted)."""
        if groups is not None:
            warnings.warn(
                "topic_update(groups=...) is now topic_update(shards=...) (the old name "
                "works for one more release)",
                FutureWarning,
                stacklevel=3,  # past operation.__call__, which calls this builder
            )
            shards = groups
        ops = {
            "create": pb.TopicUpdateRequest.CREATE,
            "update": pb.TopicUpdateRequest.UPDATE,
            "delete": pb.TopicUpdateRequest.DELETE,
        }
        if op not in ops:
            raise InvalidArgument(f"op must be one of {', '.join(ops)}, not {op!r}")
        request = pb.TopicUpdateRequest(
            cluster=self.cluster,
            topic=topic,
            op=ops[op],
            groups=[pb.GroupQueues(group=g, queues=n) for g, n in (shards or {}).items()],
        )

        def convert(r: pb.TopicUpdateResponse) -> TopicRoute | None:
            return topic_route(r.route) if r.HasField("route") else None

        return Op("topic_update", "TopicUpdate", request, convert, unknown_on_timeout=True)

    @operation
    def status(self, server: str | None = None, timeout_s: float | None = None) -> Op[NodeStatus]:
        """Status of one server (default: the leader, else the first server); one attempt."""
        address = server or self._router.leader or self._router.servers[0]
        return Op(
            "status",
            "Status",
            pb.StatusRequest(),
            lambda r: self._accept(address, r),
            pinned=address,
            timeout_s=timeout_s or 2.0,
        )


class BlockingClientBase(ClientBase, BlockingCalls):
    """A client whose operations return their results (`blocking.Client`)."""


class AsyncClientBase(ClientBase, AsyncCalls):
    """A client whose operations return coroutines of their results (`aio.AsyncClient`)."""
