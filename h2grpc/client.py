"""The client's side of an HTTP/2 connection: calls opened, their answers read.

Owns `ClientConnection` (`connect` makes one: TCP, or TLS with ALPN h2) and the
reading of a call's answer: `Answer.of(stream)` gives its status, message and
metadata from the trailers (or a trailers-only answer), once they came.
A connection that cannot be made within its bound is TimeoutError; one refused is
OSError.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from h2grpc import frames as f
from h2grpc.connection import Connection
from h2grpc.stream import KEEPALIVE_S, ConnectionLost, Stream, StreamReset


class ClientConnection(Connection):
    """A connection whose streams this side opens (odd ids)."""

    client_side = True

    def __init__(self, authority: str, scheme: str, keepalive_s: float = KEEPALIVE_S) -> None:
        super().__init__(keepalive_s=keepalive_s)
        self._authority = authority
        self._scheme = scheme
        self._next_id = 1

    def open(
        self, path: str, metadata: Sequence[tuple[str, str]] = (), timeout_s: float | None = None
    ) -> Stream:
        """Start a call of `path` (`/package.Service/Method`): its request headers leave."""
        if self.closed is not None:
            raise self.closed
        if self.goaway_received:
            raise ConnectionLost("the server is going away")
        stream = Stream(self, self._next_id)
        self._next_id += 2
        self.streams[stream.id] = stream
        headers = [
            (":method", "POST"),
            (":scheme", self._scheme),
            (":path", path),
            (":authority", self._authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if timeout_s is not None:
            headers.append(("grpc-timeout", f.format_timeout(timeout_s)))
        headers.extend(metadata)
        stream.send_headers(headers)
        return stream


async def connect(
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    timeout_s: float = 5.0,
    keepalive_s: float = KEEPALIVE_S,
) -> ClientConnection:
    """A connection to `host:port`, made within `timeout_s`."""
    loop = asyncio.get_running_loop()
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    scheme = "http" if ssl_context is None else "https"
    async with asyncio.timeout(timeout_s):
        _, conn = await loop.create_connection(
            lambda: ClientConnection(authority, scheme, keepalive_s),
            host,
            port,
            ssl=ssl_context,
            server_hostname=server_hostname if ssl_context else None,
        )
    if ssl_context is not None:
        ssl_object = conn.transport.get_extra_info("ssl_object") if conn.transport else None
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            conn.close()
            raise ConnectionLost("the server did not agree to HTTP/2 (ALPN h2)")
    return conn


@dataclass(frozen=True, slots=True)
class Answer:
    """A call's status as the server gave it."""

    status: int
    message: str
    metadata: tuple[tuple[str, str], ...]

    @property
    def code_name(self) -> str:
        return f.status_name(self.status)

    @classmethod
    def of(cls, stream: Stream) -> Answer | None:
        """The status of `stream`: from its trailers (or a trailers-only answer); an
        UNAVAILABLE or CANCELLED one if it was reset or lost; None while none came."""
        fields = stream.trailers if stream.trailers is not None else stream.headers
        if fields is not None and any(k == "grpc-status" for k, _ in fields):
            status, message, meta = f.UNKNOWN, "", []
            for key, value in fields:
                if key == "grpc-status":
                    status = int(value) if value.isdigit() else f.UNKNOWN
                elif key == "grpc-message":
                    message = f.decode_message_text(value)
                elif not key.startswith(":") and key != "content-type":
                    meta.append((key, value))
            return cls(status, message, tuple(meta))
        if stream.error is not None:
            code = (
                f.CANCELLED
                if isinstance(stream.error, StreamReset) and (stream.error.code == f.CANCEL)
                else f.UNAVAILABLE
            )
            return cls(code, str(stream.error), ())
        if stream.remote_closed:
            return cls(f.INTERNAL, "the server ended the call without a status", ())
        return None
