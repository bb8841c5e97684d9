"""The Raft peer link on h2grpc: gRPC over HTTP/2 parsed in the loop's own callbacks.

Owns `H2Link` (a `PeerLink` whose stream is an h2grpc client call) and `H2PeerServer`
(the RaftPeer service on an h2grpc server). A peer's batch is parsed, checked and
delivered to the node in the `data_received` callback that read it: no task, no
thread and no queue between the socket and `RaftCore.step`, and a Ready that follows
takes every message that came in the same read. The wire is RaftPeer.Stream of
proto/dledger.proto: any gRPC stack's client or server speaks it.

- A refusal is the gate's `Refusal`, answered as the call's status with
  BATCHES_READ in its trailers; once refused, nothing more of the stream is read.
- The message limit is the h2grpc deframer's: a request's length prefix past
  MAX_MESSAGE_BYTES is RESOURCE_EXHAUSTED before its bytes are kept.
- The link's sender learns of a refusal, or a lost connection, through the call's
  event at once (not at its next send) and reconnects.
- Back-pressure: the sender writes a batch, then waits while the transport is paused
  or the peer's flow-control window is closed; the link's queue stays bounded
  (`PeerLink.send` drops the oldest), the loop never waits.
- Keepalive pings both ways (h2grpc's), a dead connection closed within
  KEEPALIVE_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence

import h2grpc
from h2grpc import frames as f
from netkit.peer_auth import PeerSecurity, peercert_node
from proto import dledger_pb2 as pb
from raftio.link import (
    CONNECT_TIMEOUT_S,
    REFUSALS,
    LinkBroken,
    LinkRefused,
    PeerGate,
    PeerLink,
    Refusal,
    batches_read,
)
from raftio.wire import BATCHES_READ

PATH = "/dledger.v1.RaftPeer/Stream"
KEEPALIVE_S = 10.0  # a ping this often; unanswered within h2grpc's timeout: reconnect


class H2Link(PeerLink):
    """The outgoing stream to one peer as an h2grpc call."""

    def __init__(
        self,
        cluster: str,
        peer_id: int,
        address: str,
        *,
        me: int = 0,
        security: PeerSecurity | None = None,
    ) -> None:
        super().__init__(cluster, peer_id, address, me=me, security=security)
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        tls = self._security.tls
        self._ssl: ssl.SSLContext | None = None if tls is None else tls.ssl_context(server=False)
        self._open: h2grpc.Stream | None = None  # the stream while it takes writes
        self._write_due = False

    def send(self, messages: Sequence[tuple[pb.RaftMessage, int]]) -> None:
        """Queue `messages`; while the stream takes writes, what is queued in one loop
        pass (every shard's, every Ready's) leaves at the pass's end as one batch,
        with no task woken for it; else the sender takes it."""
        self._queue.extend(messages)
        self._drop_past_bound()
        if self._open is not None:
            if not self._write_due:
                self._write_due = True
                asyncio.get_running_loop().call_soon(self._write_queued)
        else:
            self._ready.set()

    def _write_queued(self) -> None:
        self._write_due = False
        stream = self._open
        if stream is None:
            return  # the stream ended meanwhile: the sender has it
        while self._queue and not (stream.sending or stream.conn.paused):
            self._write(stream)
        if self._queue:
            self._ready.set()  # flow control holds the rest: the sender waits for it

    def _write(self, stream: h2grpc.Stream) -> None:
        batch = pb.RaftBatch(cluster=self._cluster, messages=self._take_batch())
        stream.send_message(batch.SerializeToString())

    async def _stream_once(self) -> None:
        conn = await h2grpc.connect(
            self._host,
            self._port,
            ssl_context=self._ssl,
            server_hostname=self._host,
            timeout_s=CONNECT_TIMEOUT_S,
            keepalive_s=KEEPALIVE_S,
        )
        try:
            stream = conn.open(PATH, self.metadata())
            stream.on_event = self._answered  # answered, reset or lost
            self.connected = True
            queue, ready = self._queue, self._ready
            while stream.error is None and stream.headers is None and not stream.remote_closed:
                if queue:
                    self._write(stream)
                    if stream.sending or conn.paused:
                        await stream.drain()
                    continue
                self._open = stream
                ready.clear()
                await ready.wait()
                self._open = None
            if stream.headers is not None and stream.error is None:
                await stream.wait_closed()  # the trailers of a response with headers first
            answer = h2grpc.Answer.of(stream)
            name = answer.code_name if answer is not None else "UNAVAILABLE"
            if name in REFUSALS:
                assert answer is not None
                raise LinkRefused(name, answer.message, batches_read(answer.metadata))
            raise LinkBroken(f"{name}: {answer.message if answer else 'the stream ended'}")
        except h2grpc.ConnectionLost as exc:
            raise LinkBroken(str(exc)) from None
        except h2grpc.StreamReset as exc:
            raise LinkBroken(str(exc)) from None
        finally:
            self._open = None
            conn.close()

    def _answered(self, _stream: h2grpc.Stream) -> None:
        self._open = None  # the answer ends the stream: nothing more is written on it
        self._ready.set()


class H2PeerServer:
    """The Raft port on an h2grpc server: `bind`, then `start`; `stop` at the end."""

    def __init__(self, gate: PeerGate) -> None:
        self._gate = gate
        tls = gate.security.tls
        context = None if tls is None else tls.ssl_context(server=True)
        self._server = h2grpc.Server(self._call, ssl_context=context)
        self._sock: socket.socket | None = None
        self._started = False

    def bind(self, address: str) -> int:
        """Bind `address` now (OSError if it cannot be): the port bound."""
        self._sock = h2grpc.bind(address)
        bound: int = self._sock.getsockname()[1]
        return bound

    async def start(self) -> None:
        assert self._sock is not None, "bind before start"
        await self._server.start(self._sock)
        self._started = True

    async def stop(self, grace_s: float) -> None:
        if not self._started:
            if self._sock is not None:
                self._sock.close()
            return
        await self._server.close(grace_s)

    def _call(self, call: h2grpc.ServerCall) -> None:
        """A peer's stream: its sender proven, then each batch delivered as it comes."""
        if call.method != PATH:
            call.finish(f.UNIMPLEMENTED, f"Method not found: {call.method}")
            return
        gate, peer = self._gate, call.peer()
        try:
            tls_node = peercert_node(call.peer_certificate()) if gate.security.tls else None
            sender = gate.sender(dict(call.metadata), tls_node, peer)
        except Refusal as exc:
            _refuse(call, exc, 0)
            return
        read = 0

        def on_message(raw: bytes) -> None:
            nonlocal read
            if call.finished:
                return  # refused: nothing after the first refused batch is read
            read += 1
            try:
                gate.receive(raw, sender, peer)
            except Refusal as exc:
                _refuse(call, exc, read)

        def on_event(stream: h2grpc.Stream) -> None:
            if stream.remote_closed and not call.finished:  # the peer ended its stream
                call.send_message(pb.RaftAck().SerializeToString())
                call.finish(f.OK)

        call.on_message = on_message
        call.stream.on_event = on_event


def _refuse(call: h2grpc.ServerCall, exc: Refusal, read: int) -> None:
    call.finish(f.status_code(exc.code), exc.why, [(BATCHES_READ, exc.batches_read(read))])
