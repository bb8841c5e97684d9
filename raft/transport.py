"""Raft messages over gRPC: the only place that converts them to and from protobuf.

Each node keeps one outgoing client stream (`RaftPeer.Stream`) per peer and
pushes batches of messages on it in order; replies come back on the peer's own
stream to us. Entries of an append travel as one blob (`encode_entries`), not as
protobuf objects. Invariants: messages to one peer leave in the order they were
queued; a broken stream loses what was queued for it (Raft retransmits), never
reorders; the outgoing queue per peer is bounded, and overflow drops the oldest
messages rather than blocking the node's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import AsyncIterator, Callable, Collection, Sequence

import grpc

from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from raft.messages import (
    AppendEntries,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    RequestVote,
    Snapshot,
    TimeoutNow,
    VoteResponse,
)
from raft.peer_auth import NODE_AUTH, PeerAuthError, PeerSecurity, certificate_node
from raft.types import Entry, EntryKind
from raft.validate import InvalidPeerMessage
from store.flush import cancel_and_wait

log = logging.getLogger(__name__)

_ENTRY_HEAD = struct.Struct(">qqiI")
_T = pb.RaftMessage
PEER_ID = "dledger-peer-id"  # stream metadata: the node id the sender claims
_REFUSALS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED,
             grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)  # fmt: skip
MAX_QUEUED = 4096
_CONNECT_TIMEOUT_S = 0.2
MAX_BATCH = 256
# A stream message (RaftBatch) stays far below gRPC's 64 MiB limit: appends of
# large entries queued behind a slow stream must not add up past it, or every
# send of the batch would fail and replication would stall.
MAX_BATCH_BYTES = 16 << 20
_FIELDS_BOUND = 128  # a RaftMessage's fields besides its entries or snapshot bytes
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # A peer that restarts must be reachable again within an election timeout: gRPC's
    # default reconnect backoff (1 s growing to 120 s, shared between channels through
    # the global subchannel pool) kept elections waiting for seconds.
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 300),
    ("grpc.use_local_subchannel_pool", 1),
]


def encode_entries(entries: Sequence[Entry]) -> bytes:
    head = _ENTRY_HEAD.pack
    parts: list[bytes] = []
    for e in entries:
        parts.append(head(e.index, e.term, int(e.kind), len(e.data)))
        parts.append(e.data)
    return b"".join(parts)


def decode_entries(blob: bytes) -> tuple[Entry, ...]:
    out: list[Entry] = []
    off, size = 0, len(blob)
    unpack = _ENTRY_HEAD.unpack_from
    hsize = _ENTRY_HEAD.size
    while off < size:
        if off + hsize > size:
            raise ValueError("truncated entry header in append")
        index, term, kind, n = unpack(blob, off)
        off += hsize
        if off + n > size:
            raise ValueError("truncated entry data in append")
        out.append(Entry(index, term, blob[off : off + n], EntryKind(kind)))
        off += n
    return tuple(out)


def to_wire(m: Message) -> tuple[pb.RaftMessage, int]:
    """`m` as a proto, and a bound on its encoded size (for batching by bytes)."""
    match m:
        case AppendEntries():
            data = encode_entries(m.entries)
            return _T(type=_T.APPEND, src=m.src, dst=m.dst, term=m.term, index=m.prev_index,
                      log_term=m.prev_term, commit=m.commit, entries=data,
                      quiet=m.quiet), len(data) + _FIELDS_BOUND  # fmt: skip
        case Snapshot():
            return to_proto(m), len(m.data) + _FIELDS_BOUND
    return to_proto(m), _FIELDS_BOUND


def to_proto(m: Message) -> pb.RaftMessage:
    match m:
        case AppendEntries():
            return to_wire(m)[0]
        case AppendResponse():
            return _T(type=_T.APPEND_RESPONSE, src=m.src, dst=m.dst, term=m.term, index=m.index,
                      reject=m.reject, hint_index=m.hint_index, hint_term=m.hint_term)  # fmt: skip
        case Snapshot():
            return _T(type=_T.SNAPSHOT, src=m.src, dst=m.dst, term=m.term, index=m.index,
                      log_term=m.log_term, commit=m.commit, snapshot=m.data)  # fmt: skip
        case Heartbeat():
            return _T(type=_T.HEARTBEAT, src=m.src, dst=m.dst, term=m.term, commit=m.commit,
                      ctx=m.ctx)  # fmt: skip
        case HeartbeatResponse():
            return _T(type=_T.HEARTBEAT_RESPONSE, src=m.src, dst=m.dst, term=m.term, ctx=m.ctx)
        case RequestVote():
            return _T(type=_T.VOTE, src=m.src, dst=m.dst, term=m.term, index=m.last_index,
                      log_term=m.last_term, pre_vote=m.pre_vote, transfer=m.transfer)  # fmt: skip
        case VoteResponse():
            return _T(type=_T.VOTE_RESPONSE, src=m.src, dst=m.dst, term=m.term,
                      granted=m.granted, pre_vote=m.pre_vote)  # fmt: skip
        case TimeoutNow():
            return _T(type=_T.TIMEOUT_NOW, src=m.src, dst=m.dst, term=m.term)
        case ReadIndexRequest():
            return _T(type=_T.READ_INDEX, src=m.src, dst=m.dst, term=m.term, ctx=m.ctx)
        case ReadIndexResponse():
            return _T(type=_T.READ_INDEX_RESPONSE, src=m.src, dst=m.dst, term=m.term, ctx=m.ctx,
                      index=m.index)  # fmt: skip
    raise TypeError(f"not a raft message: {m!r}")


def from_proto(p: pb.RaftMessage) -> Message:
    t = p.type
    if t == _T.APPEND:
        return AppendEntries(p.src, p.dst, p.term, p.index, p.log_term,
                             decode_entries(p.entries), p.commit, p.quiet)  # fmt: skip
    if t == _T.APPEND_RESPONSE:
        return AppendResponse(p.src, p.dst, p.term, p.index, p.reject, p.hint_index, p.hint_term)
    if t == _T.SNAPSHOT:
        return Snapshot(p.src, p.dst, p.term, p.index, p.log_term, p.commit, p.snapshot)
    if t == _T.HEARTBEAT:
        return Heartbeat(p.src, p.dst, p.term, p.commit, p.ctx)
    if t == _T.HEARTBEAT_RESPONSE:
        return HeartbeatResponse(p.src, p.dst, p.term, p.ctx)
    if t == _T.VOTE:
        return RequestVote(p.src, p.dst, p.term, p.index, p.log_term, p.pre_vote, p.transfer)
    if t == _T.VOTE_RESPONSE:
        return VoteResponse(p.src, p.dst, p.term, p.granted, p.pre_vote)
    if t == _T.TIMEOUT_NOW:
        return TimeoutNow(p.src, p.dst, p.term)
    if t == _T.READ_INDEX:
        return ReadIndexRequest(p.src, p.dst, p.term, p.ctx)
    if t == _T.READ_INDEX_RESPONSE:
        return ReadIndexResponse(p.src, p.dst, p.term, p.ctx, p.index)
    raise ValueError(f"unknown raft message type {t}")


class PeerLink:
    """The outgoing stream to one peer, reconnecting with backoff when it breaks.

    With TLS the channel verifies the peer against the CA and presents this node's
    certificate; with a cluster secret each stream opens with a fresh peer token.
    """

    def __init__(
        self, cluster: str, peer_id: int, address: str, *, me: int = 0,
        security: PeerSecurity | None = None,
    ) -> None:  # fmt: skip
        self.peer_id = peer_id
        self.address = address
        self._cluster = cluster
        self._me = me
        self._security = security or PeerSecurity()
        self._queue: collections.deque[tuple[pb.RaftMessage, int]] = collections.deque()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.dropped = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"peer-{self.peer_id}"
        )

    def send(self, messages: Sequence[tuple[pb.RaftMessage, int]]) -> None:
        """Queue (message, size bound) pairs (`to_wire`) for the stream."""
        self._queue.extend(messages)
        while len(self._queue) > MAX_QUEUED:
            self._queue.popleft()
            self.dropped += 1
        self._ready.set()

    async def _batches(self) -> AsyncIterator[pb.RaftBatch]:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                yield pb.RaftBatch(cluster=self._cluster, messages=self._take_batch())

    def _take_batch(self) -> list[pb.RaftMessage]:
        """The next messages of the queue: MAX_BATCH, MAX_BATCH_BYTES at most (one at least)."""
        msg, size = self._queue.popleft()
        msgs = [msg]
        while self._queue and len(msgs) < MAX_BATCH:
            size += self._queue[0][1]
            if size > MAX_BATCH_BYTES:
                break
            msgs.append(self._queue.popleft()[0])
        return msgs

    async def _run(self) -> None:
        while True:
            channel = open_channel(self.address, self._security)
            try:
                # Connect first, with a short bound: a stream started on a channel that
                # is still connecting can sit for seconds before it fails or flows.
                # (asyncio.timeout: 3.11's wait_for can swallow close()'s cancel.)
                async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                    await channel.channel_ready()
                self.connected = True
                metadata = [(PEER_ID, str(self._me))]
                if self._security.peers is not None:
                    metadata.append((NODE_AUTH, self._security.peers.token(self._me, self.peer_id)))
                await pb_grpc.RaftPeerStub(channel).Stream(self._batches(), metadata=metadata)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                pass  # not reachable yet: try again with a fresh channel at once
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _REFUSALS:
                    log.error("peer %d refused our stream: %s: %s", self.peer_id,
                              exc.code().name, exc.details())  # fmt: skip
                    await asyncio.sleep(1.0)
                else:
                    log.info("stream to peer %d broke: %s", self.peer_id, exc.code().name)
            finally:
                self.connected = False
                await channel.close(grace=None)

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)


class PeerService(pb_grpc.RaftPeerServicer):  # type: ignore[misc]
    """Receives peers' streams and hands each message to `deliver`.

    A stream is accepted only from a member: the one its mTLS certificate names
    (TLS on), the one its peer token proves (cluster secret), or any member in
    open mode; every message on it must then come from that member.
    `deliver` raises InvalidPeerMessage for a message it refuses: the stream
    ends with INVALID_ARGUMENT (PERMISSION_DENIED for a membership violation),
    logged and counted by `on_reject(reason)`, and nothing of it reaches the core.
    """

    def __init__(
        self,
        cluster: str,
        deliver: Callable[[Message], None],
        *,
        me: int = 0,
        members: Collection[int] = (),
        security: PeerSecurity | None = None,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self._cluster = cluster
        self._deliver = deliver
        self._me = me
        self._members = frozenset(members)
        self._security = security or PeerSecurity()
        self._on_reject = on_reject or (lambda reason: None)

    async def _refuse(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode,
                      reason: str, why: str) -> None:  # fmt: skip
        log.warning("refused a raft stream from %s: %s", context.peer(), why)
        self._on_reject(reason)
        await context.abort(code, why)

    async def _sender(self, context: grpc.aio.ServicerContext) -> int | None:
        """The member this stream comes from (None in open mode: any member)."""
        meta: dict[str, str] = dict(context.invocation_metadata() or ())
        claimed_text = meta.get(PEER_ID)
        claimed = int(claimed_text) if claimed_text and claimed_text.isdigit() else None
        sender: int | None = None
        sec = self._security
        if sec.tls is not None:
            sender = certificate_node(context.auth_context())
            if sender is None:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "certificate",
                                   "its certificate names no dledger node")  # fmt: skip
        if sec.peers is not None:
            try:
                proven = sec.peers.check(meta.get(NODE_AUTH), self._me, once=True)
                if sender is not None and proven != sender:
                    raise PeerAuthError(f"token for node {proven} on node {sender}'s certificate")
            except PeerAuthError as exc:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "token", exc.message)
                raise
            sender = proven
        if sender is not None and claimed is not None and claimed != sender:
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "identity",
                               f"claims to be node {claimed} but is node {sender}")  # fmt: skip
        if sender is not None and (sender not in self._members or sender == self._me):
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, "membership",
                               f"node {sender} is not a peer of node {self._me}")  # fmt: skip
        return sender

    async def Stream(
        self, request_iterator: AsyncIterator[pb.RaftBatch], context: grpc.aio.ServicerContext
    ) -> pb.RaftAck:
        sender = await self._sender(context)
        async for batch in request_iterator:
            if batch.cluster != self._cluster:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"wrong cluster: this node belongs to {self._cluster!r}, "
                    f"the stream to {batch.cluster!r}",
                )
            try:  # the whole batch decodes, or none of it is delivered
                messages = [from_proto(p) for p in batch.messages]
            except ValueError as exc:
                await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                                   f"malformed raft message: {exc}")  # fmt: skip
                raise
            for msg in messages:
                try:
                    if sender is not None and msg.src != sender:
                        raise InvalidPeerMessage(
                            f"message from node {msg.src} on node {sender}'s stream",
                            membership=True,
                        )
                    self._deliver(msg)
                except InvalidPeerMessage as exc:
                    code = (grpc.StatusCode.PERMISSION_DENIED if exc.membership
                            else grpc.StatusCode.INVALID_ARGUMENT)  # fmt: skip
                    reason = "membership" if exc.membership else "invalid"
                    await self._refuse(context, code, reason, exc.reason)
                    raise
        return pb.RaftAck()


def open_channel(address: str, security: PeerSecurity) -> grpc.aio.Channel:
    """An aio channel to a node: TLS (with this node's certificate) when configured."""
    if security.tls is None:
        return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    return grpc.aio.secure_channel(address, security.tls.channel_credentials(),
                                   options=GRPC_OPTIONS)  # fmt: skip
