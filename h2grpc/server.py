"""A gRPC server on HTTP/2 connections: each call handed over as its request headers come.

Owns `Server` (listens, keeps the connections, drains and closes them) and
`ServerCall` (one call: method, metadata, deadline and peer; its request messages,
delivered to `on_message` in `data_received` or read with `read`; its answer:
initial metadata, messages, and one status). The application's `handler(call)` is
called synchronously on the loop when the call's headers arrive; what it does
then (set `on_message`, start a task, answer at once) is its own.

Invariants: a call ends with at most one status, sent once (`finish`), after its
messages; a call answered while the client still sends is reset with NO_ERROR
(as grpc servers do), so the client stops sending; a call refused for its
message (too large, compressed) is answered with the matching status. While
draining, new calls are answered UNAVAILABLE; `close` sends GOAWAY and gives the
calls in progress a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from h2grpc import frames as f
from h2grpc.connection import Connection
from h2grpc.stream import KEEPALIVE_S, MessageRefused, ProtocolError, Stream

log = logging.getLogger(__name__)

Metadata = Sequence[tuple[str, str]]
# Request headers that are HTTP/2's or gRPC's own, not the caller's metadata.
_RESERVED = frozenset(
    {"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "user-agent"}
)


class ServerCall:
    """One call as the server's handler sees it (see the module docstring)."""

    __slots__ = (
        "_headers_sent",
        "authority",
        "conn",
        "deadline",
        "finished",
        "metadata",
        "method",
        "stream",
    )

    def __init__(self, conn: ServerConnection, stream: Stream) -> None:
        self.conn = conn
        self.stream = stream
        self.method = ""
        self.authority = ""
        self.deadline: float | None = None  # the loop's time
        meta: list[tuple[str, str]] = []
        for name, value in stream.headers or ():
            if name == ":path":
                self.method = value
            elif name == ":authority":
                self.authority = value
            elif name == "grpc-timeout":
                seconds = f.parse_timeout(value)
                if seconds is not None:
                    self.deadline = asyncio.get_running_loop().time() + seconds
            elif not name.startswith(":") and name not in _RESERVED:
                meta.append((name, value))
        self.metadata: tuple[tuple[str, str], ...] = tuple(meta)
        self._headers_sent = False
        self.finished = False

    @property
    def on_message(self) -> Callable[[bytes], None] | None:
        return self.stream.on_message

    @on_message.setter
    def on_message(self, consume: Callable[[bytes], None] | None) -> None:
        self.stream.on_message = consume

    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def peer(self) -> str:
        """The caller's address as grpc names it (`ipv4:HOST:PORT`)."""
        addr = self.conn.peer_address()
        if not addr:
            return "unknown"
        host, port = addr[0], addr[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def peer_certificate(self) -> dict[str, Any] | None:
        return self.conn.peer_certificate()

    async def read(self) -> bytes | None:
        """The next request message; None at the end of the requests."""
        return await self.stream.read()

    def send_initial_metadata(self, metadata: Metadata = ()) -> None:
        if self._headers_sent or self.finished:
            return
        self._headers_sent = True
        self.stream.send_headers(
            [(":status", "200"), ("content-type", "application/grpc"), *metadata]
        )

    def send_message(self, message: bytes) -> None:
        """Send one answer (the initial metadata first, if not sent yet); `drain` waits
        until it left."""
        if self.finished:
            return
        if not self._headers_sent:
            self.send_initial_metadata()
        self.stream.send_message(message)

    async def drain(self) -> None:
        if self.stream.sending or self.conn.paused:
            await self.stream.drain()

    def finish(self, status: int = f.OK, message: str = "", trailing: Metadata = ()) -> None:
        """End the call with `status`: trailers (trailers-only if nothing was sent)."""
        if self.finished:
            return
        self.finished = True
        fields = [("grpc-status", str(status))]
        if message:
            fields.append(("grpc-message", f.encode_message_text(message)))
        fields.extend(trailing)
        if not self._headers_sent:
            fields[:0] = [(":status", "200"), ("content-type", "application/grpc")]
        self._headers_sent = True
        stream = self.stream
        stream.send_headers(fields, end_stream=True)
        stream.on_message = _ignore
        if not stream.remote_closed and not stream.sending:
            stream.reset(f.NO_ERROR)  # the client may stop sending: nobody reads it

    @property
    def cancelled(self) -> bool:
        """The client reset the call, or the connection ended, before it finished."""
        return self.stream.error is not None and not self.finished


def _ignore(_message: bytes) -> None:
    """A finished call's requests: read off the connection, taken by nobody."""


Handler = Callable[[ServerCall], None]


class ServerConnection(Connection):
    """The server's side of one client connection."""

    def __init__(self, server: Server) -> None:
        super().__init__(keepalive_s=server.keepalive_s)
        self._server = server
        self._last_stream = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server.connections.add(self)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() != "h2":
            self.fail(f.PROTOCOL_ERROR, "TLS without ALPN h2")

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._server.connections.discard(self)
        self._server.wake()

    def new_stream(self, sid: int, headers: list[tuple[str, str]]) -> Stream | None:
        if sid % 2 == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, f"a client stream with the even id {sid}")
        if sid <= self._last_stream:
            return None  # one this side ended already (a late trailer): nothing to do
        self._last_stream = sid
        stream = Stream(self, sid)
        stream.headers = headers
        self.streams[sid] = stream
        call = stream.owner = ServerCall(self, stream)
        if self._server.draining:
            call.finish(f.UNAVAILABLE, "the server is shutting down")
        elif not call.method.startswith("/"):
            call.finish(f.UNIMPLEMENTED, "no :path")
        else:
            try:
                self._server.handler(call)
            except Exception as exc:
                log.exception("the handler of %s failed", call.method)
                call.finish(f.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        return stream

    def refused(self, stream: Stream, exc: MessageRefused) -> None:
        call = stream.owner
        assert isinstance(call, ServerCall)
        call.finish(exc.status, exc.why)

    def stream_ended(self, stream: Stream) -> None:
        if not self.streams:
            self._server.wake()


class Server:
    """gRPC calls on HTTP/2 (cleartext, or TLS with ALPN h2), each given to `handler`."""

    def __init__(
        self,
        handler: Handler,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.handler = handler
        self.keepalive_s = keepalive_s
        self.connections: set[ServerConnection] = set()
        self.draining = False
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._changed: asyncio.Event | None = None

    async def start(self, sock: socket.socket) -> None:
        """Serve on the bound socket `sock`."""
        loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._server = await loop.create_server(
            lambda: ServerConnection(self), sock=sock, ssl=self._ssl, backlog=1024
        )

    def wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def drain(self) -> None:
        """Answer new calls UNAVAILABLE from now on."""
        self.draining = True

    async def close(self, grace_s: float) -> None:
        """Stop listening, tell every connection GOAWAY, give the calls in progress
        `grace_s` to end, then close what is left."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.write(f.goaway(conn._last_stream, f.NO_ERROR))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                while any(conn.streams for conn in self.connections):
                    assert self._changed is not None
                    self._changed.clear()
                    await self._changed.wait()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()


def bind(address: str) -> socket.socket:
    """A TCP socket bound to `address` (HOST:PORT; OSError if it cannot be)."""
    host, _, port_text = address.rpartition(":")
    family, kind, proto, _, where = socket.getaddrinfo(
        host.strip("[]") or None, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
    except OSError:
        sock.close()
        raise
    return sock
