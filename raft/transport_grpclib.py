"""The Raft peer link on grpclib: gRPC over HTTP/2 on the node's own event loop.

Owns `GrpclibLink` (a `PeerLink` whose stream is a grpclib client stream) and
`GrpclibPeerServer` (the RaftPeer service on a grpclib server, every stream through
the `PeerGate`). Every byte of a peer's stream is parsed, checked and delivered on
the loop that runs the node: no thread and no hop between threads (grpc.aio, the
other stack in `transport_grpcio`, makes three per message). The wire is the same
(the RaftPeer service of proto/dledger.proto): either stack talks to the other.

What grpclib leaves to the caller, done here:
- the message limit: a request is read by its length prefix and refused with
  RESOURCE_EXHAUSTED past MAX_MESSAGE_BYTES before its bytes are buffered, then
  parsed by the gate (a batch that does not parse is INVALID_ARGUMENT, not
  grpclib's UNKNOWN). This reads the HTTP/2 stream under grpclib's gRPC stream
  (`Stream._stream`, grpclib 0.4; pyproject keeps it below 0.5);
- a dead connection: both ends ping every KEEPALIVE_S and close a connection
  whose ping is not answered within KEEPALIVE_TIMEOUT_S, as the grpcio stack does;
- a refusal, or the loss of the connection, while our side only sends: a watcher
  awaits the response headers, so either ends the stream at once (and the link
  reconnects), not at the next send;
- TLS from the node's PEM identity (`TlsIdentity.ssl_context`); the sender's node
  id from its verified certificate (`peercert_node`).

Back-pressure: a slow peer's HTTP/2 flow-control window (4 MiB) holds the link's
sender task; the link's queue stays bounded (`PeerLink.send`), the loop never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from typing import Any

from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Server

from proto import dledger_grpc as pb_grpclib
from proto import dledger_pb2 as pb
from raft.peer_auth import PeerSecurity, peercert_node
from raft.peer_link import (
    CONNECT_TIMEOUT_S,
    REFUSALS,
    LinkBroken,
    LinkRefused,
    PeerGate,
    PeerLink,
    Refusal,
    batches_read,
)
from raft.wire import BATCHES_READ, MAX_MESSAGE_BYTES

KEEPALIVE_S = 10.0
KEEPALIVE_TIMEOUT_S = 5.0
_CONFIG = Configuration(
    _keepalive_time=KEEPALIVE_S,
    _keepalive_timeout=KEEPALIVE_TIMEOUT_S,
    _keepalive_permit_without_calls=True,
    _http2_max_pings_without_data=0,
    _http2_min_sent_ping_interval_without_data=KEEPALIVE_S / 2,
)
_PREFIX = struct.Struct(">?I")  # a gRPC message: compressed flag, length


class GrpclibLink(PeerLink):
    """The outgoing stream to one peer as a grpclib client stream."""

    def __init__(
        self, cluster: str, peer_id: int, address: str, *, me: int = 0,
        security: PeerSecurity | None = None,
    ) -> None:  # fmt: skip
        super().__init__(cluster, peer_id, address, me=me, security=security)
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        tls = self._security.tls
        self._ssl: ssl.SSLContext | None = None if tls is None else tls.ssl_context(server=False)

    async def _stream_once(self) -> None:
        channel = Channel(self._host, self._port, ssl=self._ssl, config=_CONFIG)
        stream: Any = None
        try:
            method = pb_grpclib.RaftPeerStub(channel).Stream
            async with method.open(metadata=self.metadata()) as stream:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await stream.send_request()  # connects
                self.connected = True
                await self._until_broken(stream)
        except GRPCError as exc:
            if exc.status.name in REFUSALS:
                read = batches_read(_answer_headers(stream))
                raise LinkRefused(exc.status.name, exc.message or "", read) from None
            raise LinkBroken(f"{exc.status.name}: {exc.message}") from None
        except StreamTerminatedError as exc:
            raise LinkBroken(str(exc)) from None
        finally:
            channel.close()

    async def _until_broken(self, stream: Any) -> None:
        """Send batches on `stream` while a watcher awaits the peer's answer, which
        comes only when it refuses or the stream ends; return or raise when either does."""
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(stream.recv_initial_metadata())
        sender = loop.create_task(self._send_batches(stream))
        try:
            done, _ = await asyncio.wait((watcher, sender), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watcher, sender):
                task.cancel()
            await asyncio.gather(watcher, sender, return_exceptions=True)
        for task in done:
            exc = task.exception()
            if exc is not None:
                raise exc
        raise LinkBroken("the peer answered the stream before it ended")

    async def _send_batches(self, stream: Any) -> None:
        while True:
            batch = await self.next_batch()
            assert batch is not None  # without a stream id it always has one
            await stream.send_message(batch)


def _answer_headers(stream: Any) -> list[tuple[str, str]]:
    """The peer's answer to `stream` as it came, trailers-only or trailers: read off the
    HTTP/2 stream, since grpclib keeps no trailing metadata when, as a refusal often
    does, the answer arrives with a reset of the stream."""
    inner = getattr(stream, "_stream", None)
    return [*(getattr(inner, "trailers", None) or ()), *(getattr(inner, "headers", None) or ())]


class _RaftPeer(pb_grpclib.RaftPeerBase):
    """The RaftPeer service: each stream's sender proven, then its batches delivered."""

    def __init__(self, gate: PeerGate) -> None:
        self._gate = gate

    async def Stream(self, stream: Any) -> None:
        gate = self._gate
        addr = stream.peer.addr()
        peer = f"{addr[0]}:{addr[1]}" if addr else "?"
        read = 0
        try:
            tls_node = peercert_node(stream.peer.cert()) if gate.security.tls else None
            sender = gate.sender(dict(stream.metadata or {}), tls_node, peer)
            while (raw := await _read_message(stream)) is not None:
                read += 1
                gate.receive(raw, sender, peer)
        except Refusal as exc:
            read_meta = {BATCHES_READ: exc.batches_read(read)}
            await stream.send_trailing_metadata(status=Status[exc.code], status_message=exc.why,
                                                metadata=read_meta)  # fmt: skip
            return
        await stream.send_message(pb.RaftAck())


async def _read_message(stream: Any) -> bytes | None:
    """The next request of `stream` as bytes (None at its end), refused past the limit
    before it is buffered."""
    h2_stream = stream._stream
    head = await h2_stream.recv_data(_PREFIX.size)
    if not head:
        return None
    compressed, size = _PREFIX.unpack(head)
    if compressed:
        raise GRPCError(Status.UNIMPLEMENTED, "compressed raft batches are not accepted")
    if size > MAX_MESSAGE_BYTES:
        why = f"a raft batch of {size} bytes, over the limit of {MAX_MESSAGE_BYTES}"
        raise GRPCError(Status.RESOURCE_EXHAUSTED, why)
    data: bytes = await h2_stream.recv_data(size)
    return data


class GrpclibPeerServer:
    """The Raft port on a grpclib server: `bind`, then `start`; `stop` at the end."""

    def __init__(self, gate: PeerGate) -> None:
        self._gate = gate
        self._server = Server([_RaftPeer(gate)], config=_CONFIG)
        self._sock: socket.socket | None = None
        self._started = False

    def bind(self, address: str) -> int:
        """Bind `address` now (OSError if it cannot be): the port bound, ours before start."""
        host, _, port_text = address.rpartition(":")
        family, kind, proto, _, where = socket.getaddrinfo(
            host.strip("[]") or None, int(port_text), type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )[0]  # fmt: skip
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        bound: int = sock.getsockname()[1]
        return bound

    async def start(self) -> None:
        assert self._sock is not None, "bind before start"
        tls = self._gate.security.tls
        context = None if tls is None else tls.ssl_context(server=True)
        await self._server.start(sock=self._sock, ssl=context)
        self._started = True

    async def stop(self, grace_s: float) -> None:
        if not self._started:
            if self._sock is not None:
                self._sock.close()
            return
        self._server.close()  # cancels the streams' handlers
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self._server.wait_closed()
