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
from collections.abc import AsyncIterator, Callable, Sequence

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
from raft.types import Entry, EntryKind
from store.flush import cancel_and_wait

log = logging.getLogger(__name__)

_ENTRY_HEAD = struct.Struct(">qqiI")
_T = pb.RaftMessage
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
                      log_term=m.prev_term, commit=m.commit,
                      entries=data), len(data) + _FIELDS_BOUND  # fmt: skip
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
                             decode_entries(p.entries), p.commit)  # fmt: skip
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
    """The outgoing stream to one peer, reconnecting with backoff when it breaks."""

    def __init__(self, cluster: str, peer_id: int, address: str) -> None:
        self.peer_id = peer_id
        self.address = address
        self._cluster = cluster
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
            channel = grpc.aio.insecure_channel(self.address, options=GRPC_OPTIONS)
            try:
                # Connect first, with a short bound: a stream started on a channel that
                # is still connecting can sit for seconds before it fails or flows.
                # (asyncio.timeout: 3.11's wait_for can swallow close()'s cancel.)
                async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                    await channel.channel_ready()
                self.connected = True
                await pb_grpc.RaftPeerStub(channel).Stream(self._batches())
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                pass  # not reachable yet: try again with a fresh channel at once
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    log.error("peer %d refused our stream: %s", self.peer_id, exc.details())
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
    """Receives peers' streams and hands each message to `deliver`."""

    def __init__(self, cluster: str, deliver: Callable[[Message], None]) -> None:
        self._cluster = cluster
        self._deliver = deliver

    async def Stream(
        self, request_iterator: AsyncIterator[pb.RaftBatch], context: grpc.aio.ServicerContext
    ) -> pb.RaftAck:
        async for batch in request_iterator:
            if batch.cluster != self._cluster:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"wrong cluster: this node belongs to {self._cluster!r}, "
                    f"the stream to {batch.cluster!r}",
                )
            for p in batch.messages:
                try:
                    msg = from_proto(p)
                except ValueError as exc:
                    log.warning("dropping a malformed raft message: %s", exc)
                    continue
                self._deliver(msg)
        return pb.RaftAck()
