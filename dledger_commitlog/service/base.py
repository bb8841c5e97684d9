"""What every client RPC shares: the node, authentication, forwarding, error mapping.

Owns `ServiceBase`, the base of the client service's parts (one per concern:
`writes`, `message_reads`, `offsets`, `transactions`, `log_reads`, `admin`;
`client_service.ClientService` joins them). It holds the node's facade
(`node.RaftNode`, the only way the service reaches the node), the leader-side
services (`messaging.services.LeaderServices`), the metrics, the security
settings and the read pool. Every error a client gets is a gRPC status with a
message saying what is wrong; the node keeps serving:

- bad input is INVALID_ARGUMENT before anything is proposed (it stores nothing);
- no leader is UNAVAILABLE (retryable); a follower forwards a write once to the
  leader (`_forward_to_leader`), marked so that it is never forwarded again;
- reads serve committed data only: a position outside the log is OUT_OF_RANGE,
  a damaged entry DATA_LOSS (`read_failure`); a message id that names no message
  (wherever it points) is NOT_FOUND;
- a request that does not parse (a string field that is not UTF-8) is
  INVALID_ARGUMENT before any handler runs (`decoding`).

With an ACL every call is authenticated (`_caller`) and each RPC checks the
caller's rights on what it touches before doing anything.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, ParamSpec, Protocol, TypeAlias, TypeVar

import grpc

from dispatch.names import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.protocol import PutResult, shard_metadata
from dledger_commitlog.common.signing import metadata_value
from dledger_commitlog.log import reads
from dledger_commitlog.log.message_layout import make_msg_id
from dledger_commitlog.messaging.services import LeaderServices
from dledger_commitlog.node.acl import Account, AuthError
from dledger_commitlog.node.config import NodeConfig
from dledger_commitlog.node.metrics import NodeMetrics
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.node.security import NodeSecurity
from dledger_commitlog.service.loop_probe import LoopLagProbe
from dledger_commitlog.service.shard_map import ShardMap
from netkit.channel import open_channel
from netkit.peer_auth import NODE_AUTH, PeerAuthError
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from raft import NotLeader
from store.errors import CorruptEntry, InvalidMessage, OffsetOutOfRange
from store.message import StoredMessage, check_name

log = logging.getLogger(__name__)

_FORWARDED = "dledger-forwarded"
# What a follower sends its leader.
_FORWARDABLE = frozenset({"PutBatch", "CommitOffset", "PutHalf", "EndTransaction"})
# What a node that serves no read now (`RaftNode.membership.read_refusal`) refuses as
# UNAVAILABLE.
_READS = frozenset(
    {
        "Get",
        "Pull",
        "QueryByKey",
        "ReadRange",
        "ReadLog",
        "ReadUnits",
        "OffsetsForTimes",
        "FetchOffset",
    }
)
_ON_BEHALF = "dledger-on-behalf-of"  # a forwarded call: the access key the peer authenticated
_LEADER = "dledger-leader"
_LEADER_ID = "dledger-leader-id"
_DEFAULT_TIMEOUT_S = 10.0
_READ_THREADS = 2  # the read pool: disk reads and per-message work off the loop
Metadata: TypeAlias = Sequence[tuple[str, str | bytes]]
_T = TypeVar("_T")
_P = ParamSpec("_P")


class Context(Protocol):
    """What a handler may do with its call: the part of grpc.aio.ServicerContext the
    service uses. Both client ports provide it: grpc.aio's own context (grpcio ships no
    type hints, so mypy checks the service against this alone) and `h2_port`'s
    adapter (checked against it)."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with `code` and `details` (and the trailing metadata set)."""

    def invocation_metadata(self) -> Metadata | None: ...

    def set_trailing_metadata(self, metadata: Metadata) -> None: ...

    async def send_initial_metadata(self, metadata: Metadata) -> None: ...

    async def write(self, message: Any) -> None:
        """Send one answer of a server stream (grpc_health's Watch)."""

    def time_remaining(self) -> float | None:
        """Seconds to the call's deadline (None: none)."""

    def peer(self) -> str: ...


class ServiceBase(pb_grpc.DLedgerClientServicer):  # type: ignore[misc]
    """The state and helpers every part of the client service uses."""

    _next_queue = itertools.count()  # puts without a queue id, within a route's part

    def __init__(
        self,
        cfg: NodeConfig,
        node: RaftNode,
        services: LeaderServices,
        *,
        metrics: NodeMetrics,
        security: NodeSecurity | None = None,
        shard_map: ShardMap | None = None,
    ) -> None:
        """`shard_map`: the process's shards and routes (None: a process of this one shard)."""
        self.cfg = cfg
        self.node = node
        self.shard_map = shard_map or ShardMap(
            cfg.shard_count, cfg.queues_per_topic, {cfg.shard: node}
        )
        self.services = services
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

    async def _caller(self, context: Context, method: str) -> Account | None:
        """Who makes this call of RPC `method` (None: no ACL, every caller may do anything).

        A call a follower forwarded carries the follower's token instead of the
        client's signature: made for this RPC and this access key, so a token seen on
        the wire vouches for nothing else. A read is UNAVAILABLE on a node that serves
        none now (joining and catching up, or removed: `RaftNode.membership.read_refusal`)."""
        if method in _READS:
            refusal = self.node.membership.read_refusal
            if refusal is not None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
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
            try:
                src = peers.check(
                    metadata_value(meta, NODE_AUTH),
                    self.cfg.node_id,
                    scope=forward_scope(method, on_behalf),
                )
            except PeerAuthError as exc:
                raise AuthError(exc.message) from None
            if src == self.cfg.node_id or src not in self.node.membership.accepted:
                raise AuthError(f"forwarded by node {src}, not a peer")
            return acl.account(on_behalf)
        except AuthError as exc:
            await self._deny(context, exc)
        raise AssertionError("unreachable: abort raises")

    async def _allow(
        self, context: Context, method: str, check: Callable[[Account], None]
    ) -> Account | None:
        """Authenticate the caller and run `check` on its account (abort if it fails)."""
        account = await self._caller(context, method)
        await self._check(context, account, check)
        return account

    async def _check(
        self, context: Context, account: Account | None, check: Callable[[Account], None]
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
        meta = [(_FORWARDED, str(self.cfg.node_id)), *shard_metadata(self.cfg.shard)]
        leader = self.node.leader_id
        on_behalf = account.access_key if account is not None else ""
        if self.security.peers is not None and leader is not None:
            scope = forward_scope(method, on_behalf)
            meta.append((NODE_AUTH, self.security.peers.token(self.cfg.node_id, leader, scope)))
        if account is not None:
            meta.append((_ON_BEHALF, on_behalf))
        return tuple(meta)

    async def _deny(self, context: Context, exc: AuthError) -> None:
        self.metrics.auth_failures.labels(exc.status.name.lower()).inc()
        log.info("refused a client call from %s: %s", context.peer(), exc.message)
        await context.abort(exc.status, exc.message)

    # -- helpers ---------------------------------------------------------------------

    async def _redirect(self, context: Context) -> NoReturn:
        """This node does not lead: FAILED_PRECONDITION with the leader's address in the
        trailing metadata (the clients follow it), UNAVAILABLE if it knows no leader."""
        leader = self.node.leader_client_address()
        if leader is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no leader at the moment; retry")
        context.set_trailing_metadata(self._leader_metadata())
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION, f"not the leader; the leader is at {leader}"
        )

    def _leader_metadata(self) -> tuple[tuple[str, str], ...]:
        return (
            (_LEADER, self.node.leader_client_address() or ""),
            (_LEADER_ID, str(self.node.leader_id or 0)),
        )

    def _check_cluster(self, cluster: str) -> str | None:
        if cluster and cluster != self.cfg.cluster:
            return f"wrong cluster: this node serves {self.cfg.cluster!r}, not {cluster!r}"
        return None

    @staticmethod
    def _timeout(context: Context) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return _DEFAULT_TIMEOUT_S
        return max(0.05, min(float(remaining) - 0.05, 60.0))

    async def _leader_stub(
        self, exc: NotLeader, context: Context
    ) -> tuple[str, pb_grpc.DLedgerClientStub]:
        """A stub for the leader, or abort: no leader, or this call was forwarded once."""
        leader = self.node.leader_client_address()
        meta = dict(context.invocation_metadata() or ())
        if leader is None or exc.leader_hint is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no leader at the moment; retry")
        assert leader is not None
        if _FORWARDED in meta or leader == self.cfg.client_address:
            context.set_trailing_metadata(self._leader_metadata())
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"not the leader; the leader is at {leader}"
            )
        channel = self._channels.get(leader)
        if channel is None:
            channel = open_channel(leader, self.security)
            self._channels[leader] = channel
        return leader, pb_grpc.DLedgerClientStub(channel)

    async def _forward_to_leader(
        self,
        exc: NotLeader,
        context: Context,
        method: str,
        request: Any,
        account: Account | None,
    ) -> Any:
        leader, stub = await self._leader_stub(exc, context)
        try:
            meta = self._forward_metadata(account, method)
            return await getattr(stub, method)(
                request, timeout=self._timeout(context), metadata=meta
            )
        except grpc.aio.AioRpcError as err:
            await context.abort(*forward_failure(err, leader))
        raise AssertionError("unreachable: abort raises")

    async def _linearize(self, context: Context) -> None:
        try:
            await self.node.read_index(self._timeout(context))
        except NotLeader:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no leader to confirm the read")
        except TimeoutError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "read could not be confirmed")

    async def _dispatched_linearizable(self, context: Context) -> None:
        """ReadIndex, then wait until dispatch covers the confirmed committed position."""
        await self._linearize(context)
        try:
            await self.node.wait_dispatched(self.node.committed_pos, self._timeout(context))
        except TimeoutError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "dispatch did not catch up in time")

    def _routed_queues(self, topic: str) -> int | None:
        """How many queues of `topic` this shard holds by a configured route (None: no
        route says: a single-shard cluster, a process without shard 0, or the default
        route, which is queues_per_topic in every data shard)."""
        host = self.shard_map
        if host.routes is None or self.cfg.shard == 0:
            return None
        route = host.routes.current().configured.get(topic)
        if route is None:
            return None
        return int(dict(route.shards).get(self.cfg.shard, 0))

    def _check_queues(self, topic: str, queue_id: int) -> None:
        """A queue of `topic`, or (-1) every queue of it: InvalidMessage if not."""
        if queue_id != -1:
            self._check_queue(topic, queue_id)
        else:
            check_name(topic)

    def _check_queue(self, topic: str, queue_id: int) -> None:
        check_name(topic)
        limit = 1 if topic.startswith(SYSTEM_TOPIC_PREFIX) else self.cfg.queues_per_topic
        if not 0 <= queue_id < limit:
            raise InvalidMessage(f"queue id {queue_id} outside [0, {limit}) for {topic!r}")


class Refused(Exception):
    """A put this node refuses, with the status that says why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def refuse_outcome(outcome: pb.PutOutcome, code: grpc.StatusCode, message: str) -> None:
    outcome.code = code.value[0]
    outcome.error = message


def forward_scope(method: str, access_key: str) -> str:
    return f"forward:{method}:{access_key}"


def damaged(exc: CorruptEntry) -> str:
    """What a client is told of a damaged entry (the node's log names the file)."""
    log.warning("a read met a damaged entry: %s", exc)
    return (
        f"the entry at commit-log position {exc.offset} is damaged on this replica "
        "(never served): read it from another replica"
    )


def read_everything(account: Account) -> None:
    if not account.reads_everything:
        raise AuthError(
            f"access key {account.access_key!r} may not read every topic: "
            "ReadRange returns the raw commit log",
            denied=True,
        )


def _local_files(data_dir: str) -> pb.LocalFiles | None:
    """Where a reader on this host finds this node's files (see QueueOffsets)."""
    try:
        path = os.path.abspath(data_dir)
        st = os.stat(path)
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        return None  # not Linux, or no boot id: readers use the RPCs
    return pb.LocalFiles(data_dir=path, boot_id=boot_id, dir_device=st.st_dev, dir_inode=st.st_ino)


def read_failure(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status a read answers for bad input, a position outside the log, or damage."""
    if isinstance(exc, OffsetOutOfRange):
        return grpc.StatusCode.OUT_OF_RANGE, str(exc)
    if isinstance(exc, CorruptEntry):
        return grpc.StatusCode.DATA_LOSS, damaged(exc)
    return grpc.StatusCode.INVALID_ARGUMENT, str(exc)


def forward_failure(err: grpc.aio.AioRpcError, leader: str) -> tuple[grpc.StatusCode, str]:
    """What a follower answers when the leader it forwarded to failed the call. The
    leader it knew may have lost its leadership meanwhile ("not the leader",
    FAILED_PRECONDITION without the redirect the client needs): that is a retry,
    UNAVAILABLE, not a refusal the client would take for a wrong cluster."""
    code = err.code()
    if code is grpc.StatusCode.FAILED_PRECONDITION and "not the leader" in (err.details() or ""):
        code = grpc.StatusCode.UNAVAILABLE
    return code, f"(forwarded to {leader}) {err.details()}"


def result_pb(r: PutResult) -> pb.PutResult:
    return pb.PutResult(
        msg_id=r.msg_id,
        commitlog_offset=r.commitlog_offset,
        queue_id=r.queue_id,
        queue_offset=r.queue_offset,
        store_timestamp_ms=r.store_timestamp_ms,
        duplicate=r.duplicate,
    )


def stored_message_pb(msg: StoredMessage, size: int) -> pb.StoredMessage:
    props = {k: v for k, v in msg.properties.items() if k not in ("KEYS", "TAGS", "UNIQ_KEY")}
    return pb.StoredMessage(
        topic=msg.topic,
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        commitlog_offset=msg.physical_offset,
        msg_id=make_msg_id(msg.store_host, msg.physical_offset),
        body=msg.body,
        keys=msg.keys,
        tags=msg.tags or "",
        properties=props,
        born_timestamp_ms=msg.born_timestamp_ms,
        store_timestamp_ms=msg.store_timestamp_ms,
        body_size=len(msg.body),
        size=size,
        uniq_key=msg.uniq_key or "",
        flag=msg.flag,
    )
