"""HTTP/1.1 on asyncio streams for the console: h11 parses, this module does the I/O.

Owns `HttpServer` (a listener, plain or TLS, and one task per connection: requests
read one after another, keep-alive, `Expect: 100-continue` answered), the values a
handler sees and returns (`Request`, `Response`; a response's body is bytes, or an
async iterator of chunks for a stream such as server-sent events), `ApiError` (a
refusal, sent as `{"error": {"code", "message", "field"?}}`), the `Router`
(method + path pattern with `{name}` segments, and path prefixes for static files),
and the headers every response carries.

Invariants: every read has a deadline (`Limits`), and so has a connection's close: a
client that stalls is cut; a request's head is at most `head_bytes`, its body at
most `body_bytes` (a larger one is refused before it is read, and the connection
then closes); at most
`connections` connections are open at once; every response carries the strict
headers of `SECURITY_HEADERS` (a response may set one of them itself: a page sets
the Content-Security-Policy its scripts need); a handler's unexpected exception is
a 500 with no detail, logged here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

import h11

log = logging.getLogger(__name__)

SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
SERVER_NAME = "dledger-console"
_READ_CHUNK = 65536
_DISCARD_BYTES = 8 << 20  # read after a refusal mid-request, so the client sees it
_DISCARD_S = 1.0
_CLOSE_S = 1.0  # a TLS close_notify's answer


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of one connection: sizes in bytes, times in seconds."""

    head_bytes: int = 16 * 1024  # request line and headers
    body_bytes: int = 4 << 20  # the cluster's largest message, set by the console
    read_timeout_s: float = 30.0  # each read of a request in progress
    idle_timeout_s: float = 75.0  # a kept-alive connection with no request
    connections: int = 256


class ApiError(Exception):
    """A refusal: HTTP `status`, a machine-readable `code`, a sentence, the request
    field at fault (None: none in particular), extra response headers."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = tuple(headers)

    def response(self) -> Response:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return json_response(self.status, {"error": error}, self.headers)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # percent-decoded
    query: tuple[tuple[str, bytes], ...]  # names, and values as bytes (percent-decoded)
    headers: tuple[tuple[bytes, bytes], ...]  # names lower-case
    body: bytes
    params: Mapping[str, str] = field(default_factory=dict)  # the path's {name} segments
    peer: str = ""

    def header(self, name: str) -> bytes | None:
        """The value of header `name` (lower-case), the first if repeated."""
        key = name.encode()
        return next((v for k, v in self.headers if k == key), None)

    def header_values(self, name: str) -> list[bytes]:
        key = name.encode()
        return [v for k, v in self.headers if k == key]

    def query_values(self, name: str) -> list[bytes]:
        return [v for k, v in self.query if k == name]

    def query_names(self) -> set[str]:
        return {k for k, _ in self.query}


@dataclass(slots=True)
class Response:
    status: int
    body: bytes | AsyncIterator[bytes] = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def json_response(status: int, doc: Any, headers: Sequence[tuple[str, str]] = ()) -> Response:
    body = json.dumps(doc, separators=(",", ":")).encode()
    return Response(status, body, "application/json", tuple(headers))


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """Routes by method and path: exact patterns (`/api/v1/topics/{topic}`), then
    prefixes (`add_prefix`: everything under a path, e.g. static files)."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, tuple[str, ...], Handler]] = []
        self._prefixes: list[tuple[str, str, Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        self._routes.append((method, tuple(pattern.strip("/").split("/")), handler))

    def add_prefix(self, method: str, prefix: str, handler: Handler) -> None:
        self._prefixes.append((method, prefix, handler))

    def find(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        """The handler of `method path` and the path's parameters; ApiError 404 (no such
        path) or 405 (not with this method)."""
        parts = tuple(path.strip("/").split("/"))
        allowed: list[str] = []
        for m, pattern, handler in self._routes:
            params = _match(pattern, parts)
            if params is None:
                continue
            if m == method:
                return handler, params
            allowed.append(m)
        for m, prefix, handler in self._prefixes:
            if path.startswith(prefix):
                if m == method:
                    return handler, {"rest": path[len(prefix) :]}
                allowed.append(m)
        if allowed:
            raise ApiError(
                405,
                "method_not_allowed",
                f"{method} is not served here; use {', '.join(sorted(set(allowed)))}",
                headers=[("Allow", ", ".join(sorted(set(allowed))))],
            )
        raise ApiError(404, "not_found", f"no such resource: {path}")


def _match(pattern: tuple[str, ...], parts: tuple[str, ...]) -> dict[str, str] | None:
    if len(pattern) != len(parts):
        return None
    params: dict[str, str] = {}
    for want, got in zip(pattern, parts, strict=True):
        if want.startswith("{") and want.endswith("}"):
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


def parse_target(target: bytes) -> tuple[str, tuple[tuple[str, bytes], ...]]:
    """(path, query) of a request target; ApiError 400 naming the part that is not
    UTF-8 once percent-decoded."""
    raw_path, _, raw_query = target.partition(b"?")
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_argument", "the path is not UTF-8", "path") from None
    query: list[tuple[str, bytes]] = []
    for pair in raw_query.split(b"&"):
        if not pair:
            continue
        name, _, value = pair.partition(b"=")
        try:
            key = unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(
                400, "invalid_argument", "a query parameter's name is not UTF-8", "query"
            ) from None
        query.append((key, unquote_to_bytes(value.replace(b"+", b" "))))
    return path, tuple(query)


class HttpServer:
    """Serves `router` over HTTP/1.1 (TLS with `ssl_context`) within `limits`."""

    def __init__(
        self, router: Router, limits: Limits, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.router = router
        self.limits = limits
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port); the port listened on."""
        self._server = await asyncio.start_server(
            self._accept,
            host,
            port,
            ssl=self.ssl_context,
            ssl_handshake_timeout=self.limits.read_timeout_s if self.ssl_context else None,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and cut the connections open now."""
        if self._server is not None:
            self._server.close()
        for task, writer in list(self._connections.items()):
            writer.transport.abort()  # cut: no TLS close to wait for
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.limits.connections:
            writer.close()
            return
        self._connections[task] = writer
        try:
            await _Connection(self, reader, writer).serve()
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.pop(task, None)
            await _close(writer)


class _Connection:
    """One client connection: its h11 state, its requests one after another."""

    def __init__(
        self, server: HttpServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.limits = server.limits
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.head_bytes)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""

    async def serve(self) -> None:
        while True:
            try:
                request = await self._read_request()
            except ApiError as exc:
                await self._refuse(exc)
                await self._discard()
                return
            except h11.RemoteProtocolError as exc:
                if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self._refuse(ApiError(exc.error_status_hint, "bad_request", str(exc)))
                return
            except (TimeoutError, ConnectionError):
                return
            if request is None:
                return
            response = await self._handle(request)
            try:
                await self._send(response)
            except (ConnectionError, TimeoutError, h11.LocalProtocolError):
                return
            if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                return
            self.conn.start_next_cycle()

    async def _refuse(self, refusal: ApiError) -> None:
        """Answer a request that cannot be read on, then close."""
        with contextlib.suppress(ConnectionError, TimeoutError, h11.LocalProtocolError):
            await self._send(refusal.response(), close=True)

    async def _discard(self) -> None:
        """Read (and drop) what the client still sends of a refused request, a bounded
        amount for a bounded time: closing at once could reset the connection before
        the client read the refusal."""
        left = _DISCARD_BYTES
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(_DISCARD_S):
                while left > 0:
                    data = await self.reader.read(_READ_CHUNK)
                    if not data:
                        return
                    left -= len(data)

    async def _next_event(self, timeout_s: float) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            async with asyncio.timeout(timeout_s):
                data = await self.reader.read(_READ_CHUNK)
            self.conn.receive_data(data)

    async def _read_request(self) -> Request | None:
        """The next request, its body read whole; None when the client closed."""
        event = await self._next_event(self.limits.idle_timeout_s)
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise h11.RemoteProtocolError("expected a request", error_status_hint=400)
        headers = tuple((bytes(k).lower(), bytes(v)) for k, v in event.headers)
        head = len(event.target) + sum(len(k) + len(v) + 4 for k, v in headers)
        if head > self.limits.head_bytes:  # h11 bounds only a head that arrives in parts
            raise ApiError(
                431,
                "header_too_large",
                f"the request's head is over {self.limits.head_bytes} bytes",
            )
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is not None and int(length) > self.limits.body_bytes:
            raise _too_large(self.limits.body_bytes)
        if self.conn.they_are_waiting_for_100_continue:
            self.writer.write(
                self.conn.send(h11.InformationalResponse(status_code=100, headers=[]))
            )
        body = bytearray()
        while True:
            part = await self._next_event(self.limits.read_timeout_s)
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > self.limits.body_bytes:
                    raise _too_large(self.limits.body_bytes)
            elif isinstance(part, h11.EndOfMessage):
                break
            else:
                return None  # the client closed mid-request
        path, query = parse_target(bytes(event.target))
        return Request(
            event.method.decode("ascii", "replace"),
            path,
            query,
            headers,
            bytes(body),
            peer=self.peer,
        )

    async def _handle(self, request: Request) -> Response:
        try:
            handler, params = self.server.router.find(request.method, request.path)
            request = Request(
                request.method,
                request.path,
                request.query,
                request.headers,
                request.body,
                params,
                request.peer,
            )
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except Exception:
            log.exception("console: %s %s failed", request.method, request.path)
            return ApiError(500, "internal", "the console failed; see its log").response()

    async def _send(self, response: Response, *, close: bool = False) -> None:
        own = {name.lower() for name, _ in response.headers}
        headers = [
            ("Server", SERVER_NAME),
            *((n, v) for n, v in SECURITY_HEADERS if n.lower() not in own),
            ("Content-Type", response.content_type),
            *response.headers,
        ]
        if close:
            headers.append(("Connection", "close"))
        body = response.body
        if isinstance(body, bytes):
            headers.append(("Content-Length", str(len(body))))
        w = self.writer
        reason = _reason(response.status)
        head = h11.Response(status_code=response.status, headers=headers, reason=reason)
        w.write(self.conn.send(head))
        if isinstance(body, bytes):
            if body:
                w.write(self.conn.send(h11.Data(data=body)))
        else:
            try:
                async for chunk in body:
                    if w.is_closing():  # the client left: a write would raise RuntimeError
                        raise ConnectionResetError("the client closed the connection")
                    w.write(self.conn.send(h11.Data(data=chunk)))
                    async with asyncio.timeout(self.limits.read_timeout_s):
                        await w.drain()
            finally:  # a stream whose client left ends now, not when collected
                aclose = getattr(body, "aclose", None)
                if aclose is not None:
                    await aclose()
        w.write(self.conn.send(h11.EndOfMessage()))
        async with asyncio.timeout(self.limits.read_timeout_s):
            await w.drain()


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close a connection; one whose TLS peer does not answer the close (a client that
    does not read) within `_CLOSE_S` is cut, so that `HttpServer.stop` ends."""
    writer.close()
    try:
        async with asyncio.timeout(_CLOSE_S):
            await writer.wait_closed()
    except TimeoutError:
        writer.transport.abort()
    except Exception:  # the connection is gone either way
        pass


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _too_large(limit: int) -> ApiError:
    return ApiError(
        400,
        "invalid_argument",
        f"the body is larger than the {limit} bytes a message may have; nothing was stored",
        "body",
    )
