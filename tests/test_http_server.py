"""The console's HTTP/1.1 server on its own (no cluster): limits, deadlines, framing.

A real listener on loopback and raw sockets: keep-alive (pipelined requests answered in
turn), `Expect: 100-continue`, a streamed (chunked) response, HTTP/1.0 and HEAD, a
header value with a line break never sent, and the bounds every connection keeps: a head too
large is 431, a body over the limit is refused before it is read (by length or,
chunked, as it arrives), a stalled client is cut at the read deadline, garbage is
400, a connection past the cap is closed, and the strict headers are on every
answer, refusals included; a client that resets a stream's connection ends the
stream without an error (on uvloop, as the console runs, too).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from dledger_commitlog.console.http import (
    HttpServer,
    Limits,
    Request,
    Response,
    Router,
    json_response,
)

LIMITS = Limits(head_bytes=2048, body_bytes=1000, read_timeout_s=0.5, idle_timeout_s=1.0)


async def echo(request: Request) -> Response:
    return json_response(200, {"n": len(request.body), "params": dict(request.params)})


async def stream(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"data: {i}\n\n".encode()

    return Response(200, chunks(), "text/event-stream")


async def injected(request: Request) -> Response:
    return Response(200, b"{}", headers=(("X-Name", "a\r\nSet-Cookie: session=evil"),))


def serving(test: Callable[[int], Awaitable[None]], limits: Limits = LIMITS) -> None:
    async def main() -> None:
        router = Router()
        router.add("POST", "/echo/{name}", echo)
        router.add("GET", "/events", stream)
        router.add("GET", "/injected", injected)
        server = HttpServer(router, limits)
        port = await server.start("127.0.0.1", 0)
        try:
            await test(port)
        finally:
            await server.stop()

    asyncio.run(main())


async def exchange(port: int, data: bytes, *, wait_s: float = 2.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        async with asyncio.timeout(wait_s):
            while chunk := await reader.read(65536):
                out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    writer.close()
    return out


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


def test_keep_alive_serves_requests_in_turn() -> None:
    async def test(port: int) -> None:
        two = post(b"/echo/a", b"12345") + post(b"/echo/b", b"")
        out = await exchange(port, two, wait_s=1.5)
        assert out.count(b"HTTP/1.1 200 OK") == 2
        assert b'{"n":5,"params":{"name":"a"}}' in out and b'"name":"b"' in out
        assert out.count(b"Content-Security-Policy: default-src 'none'") == 2

    serving(test)


def test_http_1_0_head_and_versions() -> None:
    """HTTP/1.0 gets a stream to the close (no chunks), a HEAD the head alone; an
    HTTP/1.1 request without Host is 400, another version 505."""

    async def test(port: int) -> None:
        out = await exchange(port, b"GET /events HTTP/1.0\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in out
        assert b"chunked" not in out and out.endswith(b"data: 2\n\n")
        out = await exchange(port, b"HEAD /echo/a HTTP/1.1\r\nHost: x\r\n\r\n", wait_s=0.5)
        assert out.startswith(b"HTTP/1.1 405 ") and out.endswith(b"\r\n\r\n")
        assert b"Content-Length: " in out and b"Content-Length: 0" not in out
        out = await exchange(port, b"GET /events HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400 ") and b"Host" in out
        out = await exchange(port, b"GET /events HTTP/2.0\r\nHost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 505 ")

    serving(test)


def test_a_header_with_a_line_break_is_never_sent() -> None:
    async def test(port: int) -> None:
        out = await exchange(port, b"GET /injected HTTP/1.1\r\nHost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 500 ") and b"evil" not in out

    serving(test)


def test_expect_100_continue_is_answered() -> None:
    async def test(port: int) -> None:
        out = await exchange(
            port,
            b"POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Expect: 100-continue\r\n\r\n",
            wait_s=0.3,
        )
        assert out.startswith(b"HTTP/1.1 100 ")

    serving(test)


def test_a_streamed_response_is_chunked() -> None:
    async def test(port: int) -> None:
        out = await exchange(port, b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n", wait_s=0.5)
        assert b"Transfer-Encoding: chunked" in out
        assert all(f"data: {i}".encode() in out for i in range(3))
        assert out.rstrip().endswith(b"0")

    serving(test)


def test_a_head_too_large_is_431() -> None:
    async def test(port: int) -> None:
        big = b"GET /events HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
        out = await exchange(port, big)
        assert out.startswith(b"HTTP/1.1 431 ")

    serving(test)


def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    async def test(port: int) -> None:
        out = await exchange(port, post(b"/echo/a", b"x" * 1001))
        assert out.startswith(b"HTTP/1.1 400 ") and b'"field":"body"' in out
        assert b"Connection: close" in out
        chunked = (
            b"POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"400\r\n"
            + b"y" * 1024
            + b"\r\n0\r\n\r\n"
        )
        out = await exchange(port, chunked)
        assert out.startswith(b"HTTP/1.1 400 ") and b'"field":"body"' in out

    serving(test)


def test_a_stalled_client_is_cut_at_the_read_deadline() -> None:
    async def test(port: int) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        out = await exchange(
            port, b"POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab"
        )
        assert out == b"" and loop.time() - started < 1.5

    serving(test)


def test_garbage_is_400_and_unknown_paths_404() -> None:
    async def test(port: int) -> None:
        out = await exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400 ")
        out = await exchange(port, b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 404 ") and b"nosniff" in out
        out = await exchange(
            port, b"GET /echo/%FF HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert out.startswith(b"HTTP/1.1 400 ") and b'"field":"path"' in out

    serving(test)


def test_connections_past_the_cap_are_closed() -> None:
    async def test(port: int) -> None:
        _, held = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(0.1)
        out = await exchange(port, post(b"/echo/a", b"x"), wait_s=0.5)
        assert out == b""
        held.close()

    serving(test, Limits(connections=1, read_timeout_s=0.5, idle_timeout_s=5.0))


async def forever(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        n = 0
        while True:
            yield f"data: {n}\n\n".encode()
            n += 1
            await asyncio.sleep(0.01)

    return Response(200, chunks(), "text/event-stream")


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_a_stream_whose_client_left_ends_without_an_error(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        router = Router()
        router.add("GET", "/forever", forever)
        server = HttpServer(router, LIMITS)
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readuntil(b"data: 1")
            connections = set(server._connections)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()  # a reset: the server's next writes find the connection gone
            done, _ = await asyncio.wait(connections, timeout=2.0)
            assert done == connections, "the stream went on after its client left"
            assert [t.exception() for t in done] == [None]
        finally:
            await server.stop()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
