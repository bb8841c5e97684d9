"""HTTP/1.1 on asyncio streams for the console: llhttp parses (httptools, C), this
module frames the answers and does the I/O.

Owns `HttpServer` (a listener, plain or TLS, and one task per connection: requests
read one after another, pipelined ones in order, keep-alive, `Expect: 100-continue`
answered, an answer with a body of bytes written in one write), the values a
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
import functools
import json
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

import httptools

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


@dataclass(frozen=True, slots=True)
class _Parsed:
    """One request as the parser completed it, before routing."""

    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]  # names lower-case
    body: bytes
    keep_alive: bool  # the client may send another on this connection
    chunked: bool  # a streamed answer may be chunked (HTTP/1.1); else it ends at the close


class _Parser:
    """llhttp (through httptools) parsing one connection's bytes into `_Parsed`
    requests, in order, within `limits`; a request it cannot take is `failed` (the
    requests completed before it are still served).

    llhttp enforces the grammar (methods, tokens, header value characters, one of
    Content-Length or Transfer-Encoding, chunk sizes); this class adds the sizes and
    the HTTP versions the console serves."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.parser = httptools.HttpRequestParser(self)
        self.done: deque[_Parsed] = deque()
        self.failed: ApiError | None = None
        self.ended = False  # nothing more can be read (an upgrade, or a close requested)
        self.in_request = False  # a request has begun and is not complete
        self.in_head = False  # ... and its head is not complete
        self.head_fed = 0  # bytes fed while a head was incomplete
        self.continue_wanted = False  # `Expect: 100-continue` and the body is still to come
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()

    def feed(self, data: bytes) -> None:
        if not self.in_request or self.in_head:
            self.head_fed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refusal = exc.__context__
            self.failed = refusal if isinstance(refusal, ApiError) else _bad_request(str(exc))
        except httptools.HttpParserUpgrade:
            self.ended = True  # an Upgrade or CONNECT: what completed is served, then close
        except httptools.HttpParserError as exc:
            self.failed = _bad_request(str(exc))
        if self.in_head and self.head_fed > self.limits.head_bytes + _READ_CHUNK:
            self.failed = self.failed or _head_too_large(self.limits.head_bytes)

    # -- httptools' callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_request = self.in_head = True
        self._target, self._headers, self._body = b"", [], bytearray()

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        """The head is whole: its size (a head that arrived in parts is bounded by
        `head_fed` meanwhile), version, Host, the body's announced length, `Expect`."""
        self.in_head, self.head_fed = False, 0
        size, host, length, expect = len(self._target), False, None, None
        for k, v in self._headers:
            size += len(k) + len(v) + 4
            if k == b"host":
                host = True
            elif k == b"content-length" and length is None:
                length = v
            elif k == b"expect" and expect is None:
                expect = v
        if size > self.limits.head_bytes:
            raise _head_too_large(self.limits.head_bytes)
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise ApiError(505, "http_version_not_supported", "HTTP/1.0 and 1.1 are served")
        if version == "1.1" and not host:
            raise _bad_request("an HTTP/1.1 request must name its Host")
        if length is not None and int(length) > self.limits.body_bytes:
            raise _too_large(self.limits.body_bytes)
        self.continue_wanted = expect is not None and expect.lower() == b"100-continue"

    def on_body(self, data: bytes) -> None:
        self._body += data
        if len(self._body) > self.limits.body_bytes:
            raise _too_large(self.limits.body_bytes)

    def on_message_complete(self) -> None:
        p = self.parser
        keep_alive = p.should_keep_alive()
        self.in_request = self.continue_wanted = False
        self.ended = self.ended or not keep_alive
        self.done.append(
            _Parsed(
                p.get_method(),
                self._target,
                tuple(self._headers),
                bytes(self._body),
                keep_alive,
                p.get_http_version() == "1.1",
            )
        )


class _Connection:
    """One client connection: its requests one after another, each answered in one
    write where its body is bytes."""

    def __init__(
        self, server: HttpServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.limits = server.limits
        self.reader = reader
        self.writer = writer
        self.parse = _Parser(self.limits)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""

    async def serve(self) -> None:
        while True:
            try:
                parsed = await self._next()
            except ApiError as exc:
                await self._refuse(exc)
                await self._discard()
                return
            except (TimeoutError, ConnectionError):
                return
            if parsed is None:
                return
            response = await self._handle(parsed)
            try:
                if not await self._send(response, parsed):
                    return
            except (ConnectionError, TimeoutError):
                return
            except ValueError:  # nothing of it was written
                log.exception("console: the answer to %r could not be sent", parsed.target)
                await self._refuse(ApiError(500, "internal", "the console failed; see its log"))
                return

    async def _next(self) -> _Parsed | None:
        """The next complete request; None when the client closed or nothing more may
        be read; ApiError for one that cannot be taken."""
        parse = self.parse
        while not parse.done:
            if parse.failed is not None:
                raise parse.failed
            if parse.ended:
                return None
            timeout = self.limits.read_timeout_s if parse.in_request else self.limits.idle_timeout_s
            async with asyncio.timeout(timeout):
                data = await self.reader.read(_READ_CHUNK)
            if not data:
                return None  # closed, between requests or in the middle of one
            parse.feed(data)
            if parse.continue_wanted:
                parse.continue_wanted = False
                self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return parse.done.popleft()

    async def _refuse(self, refusal: ApiError) -> None:
        """Answer a request that cannot be read on, then close."""
        with contextlib.suppress(ConnectionError, TimeoutError):
            await self._send(refusal.response(), None)

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

    async def _handle(self, parsed: _Parsed) -> Response:
        """The answer to `parsed`: its handler's, or a refusal."""
        method = parsed.method.decode("ascii", "replace")
        try:
            path, query = parse_target(parsed.target)
            handler, params = self.server.router.find(method, path)
            request = Request(method, path, query, parsed.headers, parsed.body, params, self.peer)
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except Exception:
            log.exception("console: %s %r failed", method, parsed.target)
            return ApiError(500, "internal", "the console failed; see its log").response()

    async def _send(self, response: Response, parsed: _Parsed | None) -> bool:
        """Write `response` to the request `parsed` (None: a refusal); whether the
        connection stays open for another. ValueError: a header that cannot be sent."""
        body, w = response.body, self.writer
        if isinstance(body, bytes):
            keep = parsed is not None and parsed.keep_alive
            head = _head(response, keep, len(body), chunked=False)
            w.write(head if parsed is not None and parsed.method == b"HEAD" else head + body)
        else:
            keep = parsed is not None and parsed.keep_alive and parsed.chunked
            w.write(_head(response, keep, None, chunked=keep))  # HTTP/1.0: to the close
            try:
                async for chunk in body:
                    if w.is_closing():  # the client left: a write would raise RuntimeError
                        raise ConnectionResetError("the client closed the connection")
                    if chunk:
                        w.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if keep else chunk)
                    async with asyncio.timeout(self.limits.read_timeout_s):
                        await w.drain()
            finally:  # a stream whose client left ends now, not when collected
                aclose = getattr(body, "aclose", None)
                if aclose is not None:
                    await aclose()
            if keep:
                w.write(b"0\r\n\r\n")
        if w.transport.get_write_buffer_size():  # the socket did not take it all at once
            async with asyncio.timeout(self.limits.read_timeout_s):
                await w.drain()
        return keep


def _head(response: Response, keep: bool, length: int | None, *, chunked: bool) -> bytes:
    """The status line and headers of `response` (`_fixed_head`), and the framing:
    `length` bytes, chunked, or to the close; `keep`: the connection stays open."""
    head = _fixed_head(response.status, response.content_type, tuple(response.headers))
    if length is not None:
        head += b"Content-Length: %d\r\n" % length
    elif chunked:
        head += b"Transfer-Encoding: chunked\r\n"
    return head + (b"\r\n" if keep else b"Connection: close\r\n\r\n")


@functools.lru_cache(maxsize=256)
def _fixed_head(status: int, content_type: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """The status line and the headers that do not depend on the body: ours, the strict
    ones the response did not set itself, its own (a few kinds of answer make all of a
    console's, so they are made once). ValueError: a header value with a line break (it
    would start a header of its own) or outside Latin-1."""
    own = {name.lower() for name, _ in headers}
    lines = [f"HTTP/1.1 {status} {_reason(status)}", f"Server: {SERVER_NAME}"]
    lines += (f"{n}: {v}" for n, v in SECURITY_HEADERS if n.lower() not in own)
    lines.append(f"Content-Type: {content_type}")
    lines += (f"{n}: {v}" for n, v in headers)
    for line in lines:
        if "\r" in line or "\n" in line:
            raise ValueError(f"a response header has a line break: {line[:80]!r}")
    return "".join(line + "\r\n" for line in lines).encode("latin-1")


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


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _bad_request(detail: str) -> ApiError:
    return ApiError(400, "bad_request", f"not an HTTP/1.1 request the console takes: {detail}")


def _head_too_large(limit: int) -> ApiError:
    return ApiError(431, "header_too_large", f"the request's head is over {limit} bytes")


def _too_large(limit: int) -> ApiError:
    return ApiError(
        400,
        "invalid_argument",
        f"the body is larger than the {limit} bytes a message may have; nothing was stored",
        "body",
    )
