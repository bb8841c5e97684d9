"""h2grpc against real peers: grpcio clients and servers, and raw sockets that misbehave.

gRPC is one protocol: grpc.aio's client calls an h2grpc server (unary, streaming both
ways, metadata and trailers, statuses with non-ASCII details, a deadline, a cancel,
messages larger than every flow-control window, TLS with ALPN) and an h2grpc client
calls a grpc.aio server. A peer that breaks HTTP/2 (no preface, an oversized frame,
a bad header block) gets GOAWAY and the connection ends, without disturbing other
connections; a peer that stops answering pings is dropped; a reader that stops
reading stops its sender (flow control), whose writer then waits without buffering
without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

import h2grpc
from dledger_commitlog.cli.certs import make_dev_pki
from h2grpc import connection as h2conn
from h2grpc import frames as f
from h2grpc import stream as h2stream
from netkit.peer_auth import TlsIdentity, peercert_node

TIMEOUT_S = 10.0


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


class Echo:
    """An h2grpc server with a few methods, as a test peer."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.deadlines: list[float | None] = []
        self.metadata: list[tuple[tuple[str, str], ...]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def handle(self, call: h2grpc.ServerCall) -> None:
        self.metadata.append(call.metadata)
        self.deadlines.append(call.time_remaining())
        loop = asyncio.get_running_loop()
        if call.method == "/t.Echo/Unary":
            task = loop.create_task(self._unary(call))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif call.method == "/t.Echo/Upper":  # each request answered as it comes
            call.on_message = lambda m: call.send_message(m.upper())
            call.stream.on_event = lambda s: call.finish() if s.remote_closed else None
        elif call.method == "/t.Echo/Hang":
            task = loop.create_task(asyncio.sleep(30))

            def on_event(s: h2grpc.Stream) -> None:
                if s.error is not None:
                    task.cancel()
                    self.cancelled.set()

            call.stream.on_event = on_event
        else:
            call.finish(f.UNIMPLEMENTED, f"no method {call.method}")

    async def _unary(self, call: h2grpc.ServerCall) -> None:
        request = await call.read()
        assert request is not None
        if request.startswith(b"fail:"):
            call.finish(_FAILED_PRECONDITION, request[5:].decode(), [("x-why", "asked")])
            return
        call.send_initial_metadata([("x-initial", "1")])
        call.send_message(request)
        await call.drain()
        call.finish(f.OK, "", [("x-trailer", str(len(request)))])


_FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]


@contextlib.asynccontextmanager
async def serving(
    handle: Callable[[h2grpc.ServerCall], None], ssl_context: Any = None
) -> AsyncIterator[int]:
    sock = h2grpc.bind("127.0.0.1:0")
    port: int = sock.getsockname()[1]
    server = h2grpc.Server(handle, ssl_context=ssl_context)
    await server.start(sock)
    try:
        yield port
    finally:
        await server.close(1.0)


def test_a_grpcio_client_calls_an_h2grpc_server() -> None:
    echo = Echo()

    async def main() -> None:
        options = [("grpc.max_receive_message_length", 64 << 20)]
        async with (
            serving(echo.handle) as port,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel,
        ):
            unary = channel.unary_unary("/t.Echo/Unary")
            call = unary(b"hello", metadata=(("x-key", "v"),), timeout=TIMEOUT_S)
            assert await call == b"hello"
            assert ("x-initial", "1") in tuple(await call.initial_metadata())
            assert ("x-trailer", "5") in tuple(await call.trailing_metadata())
            assert ("x-key", "v") in echo.metadata[-1]
            # gRPC core rounds a grpc-timeout up ("arbitrarily", timeout_encoding.h)
            assert echo.deadlines[-1] is not None and 0 < echo.deadlines[-1] <= TIMEOUT_S * 1.05
            # 20 MiB: past the 4 MiB stream window and the 16 MiB connection window
            big = bytes(range(256)) * (80 << 10)
            assert await unary(big, timeout=TIMEOUT_S) == big
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unary(b"fail:caf\xc3\xa9 100% sure", timeout=TIMEOUT_S)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.details() == "café 100% sure"
            assert ("x-why", "asked") in tuple(refused.value.trailing_metadata())
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await channel.unary_unary("/t.Echo/Nope")(b"", timeout=TIMEOUT_S)
            assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED

            async def requests() -> AsyncIterator[bytes]:
                for i in range(100):
                    yield b"m%d" % i

            upper = channel.stream_stream("/t.Echo/Upper")
            answers = [a async for a in upper(requests(), timeout=TIMEOUT_S)]
            assert answers == [b"M%d" % i for i in range(100)]
            hang = channel.unary_unary("/t.Echo/Hang")(b"", timeout=TIMEOUT_S)
            await asyncio.sleep(0.05)  # let the call reach the server before it is cancelled
            hang.cancel()
            async with asyncio.timeout(TIMEOUT_S):
                await echo.cancelled.wait()

    run(main())


def test_an_h2grpc_client_calls_a_grpcio_server() -> None:
    async def main() -> None:
        server = grpc.aio.server()

        async def unary(request: bytes, context: Any) -> bytes:
            await context.send_initial_metadata((("x-server", "grpcio"),))
            if request == b"refuse":
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "refused: ünïcode")
            return request[::-1]

        async def count(requests: Any, context: Any) -> bytes:
            n = 0
            async for r in requests:
                n += len(r)
            return str(n).encode()

        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Count": grpc.stream_unary_rpc_method_handler(count),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        conn = await h2grpc.connect("127.0.0.1", port)
        try:
            stream = conn.open("/t.S/Unary", [("x-key", "v")], timeout_s=TIMEOUT_S)
            stream.send_message(b"abc", end_stream=True)
            assert await stream.read() == b"cba"
            assert ("x-server", "grpcio") in (stream.headers or [])
            await stream.wait_closed()
            answer = h2grpc.Answer.of(stream)
            assert answer is not None and answer.status == f.OK
            stream = conn.open("/t.S/Unary", timeout_s=TIMEOUT_S)
            stream.send_message(b"refuse", end_stream=True)
            await stream.wait_closed()
            answer = h2grpc.Answer.of(stream)
            assert answer is not None
            assert (answer.code_name, answer.message) == ("PERMISSION_DENIED", "refused: ünïcode")
            stream = conn.open("/t.S/Count", timeout_s=TIMEOUT_S)
            for _ in range(64):  # 8 MiB: the sender waits for grpcio's window updates
                stream.send_message(b"x" * (128 << 10))
                await stream.drain()
            stream.end()
            assert await stream.read() == str(64 * (128 << 10)).encode()
        finally:
            conn.close()
            await server.stop(None)

    run(main())


def test_tls_with_alpn_both_ways(tmp_path: Path) -> None:
    """Mutual TLS: the server sees the client's certificate, the client the server's
    name; a client that does not offer HTTP/2 by ALPN is not served."""
    make_dev_pki(tmp_path, [1, 2], [])

    def identity(node: int) -> TlsIdentity:
        files = (tmp_path / "ca.pem", tmp_path / f"node-{node}.pem", tmp_path / f"node-{node}.key")
        return TlsIdentity(*(p.read_bytes() for p in files))

    seen: list[int | None] = []

    def handle(call: h2grpc.ServerCall) -> None:
        seen.append(peercert_node(call.peer_certificate()))
        Echo().handle(call)

    async def main() -> None:
        async with serving(handle, identity(1).ssl_context(server=True)) as port:
            conn = await h2grpc.connect(
                "127.0.0.1",
                port,
                server_hostname="127.0.0.1",
                ssl_context=identity(2).ssl_context(server=False),
            )
            try:
                stream = conn.open("/t.Echo/Unary", timeout_s=TIMEOUT_S)
                stream.send_message(b"secret", end_stream=True)
                assert await stream.read() == b"secret"
            finally:
                conn.close()
            assert seen == [2]
            plain = identity(2).ssl_context(server=False)
            plain.set_alpn_protocols(["http/1.1"])
            with pytest.raises((h2grpc.ConnectionLost, OSError)):
                conn = await h2grpc.connect(
                    "127.0.0.1", port, server_hostname="127.0.0.1", ssl_context=plain
                )
                conn.close()

    run(main())


def _raw_connection(port: int, data: bytes) -> bytes:
    """Send `data` on a fresh TCP connection; what the server answered before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
        s.sendall(data)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                got += chunk
        return got


def _frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while len(data) - pos >= 9:
        hi, lo, kind, flags, sid = f.HEADER.unpack_from(data, pos)
        length = (hi << 16) | lo
        out.append((kind, flags, sid & 0x7FFFFFFF, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


@pytest.mark.parametrize(
    ("case", "payload", "code"),
    [
        ("no preface", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 9, f.PROTOCOL_ERROR),
        (
            "oversized frame",
            f.PREFACE + f.frame_header(h2stream.MAX_FRAME + 1, f.DATA, 0, 1),
            f.FRAME_SIZE_ERROR,
        ),
        (
            "bad header block",
            f.PREFACE + f.frame_header(3, f.HEADERS, f.END_HEADERS, 1) + b"\xff\xff\xff",
            f.COMPRESSION_ERROR,
        ),
        (
            "even stream id",
            f.PREFACE + f.frame_header(1, f.HEADERS, f.END_HEADERS, 2) + b"\x83",
            f.PROTOCOL_ERROR,
        ),
    ],
)
def test_a_peer_that_breaks_http2_gets_goaway(case: str, payload: bytes, code: int) -> None:
    echo = Echo()

    async def main() -> None:
        async with serving(echo.handle) as port:
            answer = await asyncio.to_thread(_raw_connection, port, payload)
            goaways = [p for kind, _, _, p in _frames_of(answer) if kind == f.GOAWAY]
            assert goaways, f"{case}: no GOAWAY in {answer!r}"
            assert struct.unpack(">I", goaways[0][4:8])[0] == code
            # the server still serves everyone else
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                assert await channel.unary_unary("/t.Echo/Unary")(b"ok", timeout=5) == b"ok"

    run(main())


def test_a_ping_is_answered_and_an_unanswered_one_drops_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(h2conn, "KEEPALIVE_TIMEOUT_S", 0.2)
    echo = Echo()

    async def main() -> None:
        async with serving(echo.handle) as port:
            # A raw peer that answers nothing: the client side pings it and gives up.
            quiet = socket.create_server(("127.0.0.1", 0))
            quiet_port = quiet.getsockname()[1]
            try:
                conn = await h2grpc.connect("127.0.0.1", quiet_port, keepalive_s=0.1)
                stream = conn.open("/t.Echo/Unary", timeout_s=5)
                async with asyncio.timeout(5):
                    with pytest.raises(h2grpc.ConnectionLost, match="ping"):
                        await stream.wait_closed()
                        raise stream.error or AssertionError("no error")
            finally:
                quiet.close()
            # A live server answers our pings: the connection stays up past several.
            conn = await h2grpc.connect("127.0.0.1", port, keepalive_s=0.05)
            try:
                await asyncio.sleep(0.5)  # ten keepalive periods, each answered in time
                assert conn.closed is None
                stream = conn.open("/t.Echo/Unary", timeout_s=5)
                stream.send_message(b"alive", end_stream=True)
                assert await stream.read() == b"alive"
            finally:
                conn.close()

    run(main())


def test_a_reader_that_does_not_read_stops_its_sender() -> None:
    """Flow control: a stream nobody reads takes at most its window (plus the queue
    bound); the sender's drain waits instead of buffering without bound."""
    calls: list[h2grpc.ServerCall] = []

    def handle(call: h2grpc.ServerCall) -> None:
        calls.append(call)  # never read

    async def main() -> None:
        async with serving(handle) as port:
            conn = await h2grpc.connect("127.0.0.1", port)
            try:
                stream = conn.open("/t.Slow/In", timeout_s=TIMEOUT_S)
                sent = 0
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(1.0):
                        while True:
                            stream.send_message(b"x" * (256 << 10))
                            sent += 256 << 10
                            await stream.drain()
                assert h2stream.STREAM_WINDOW <= sent <= 3 * h2stream.STREAM_WINDOW + (1 << 20)
                queued = calls[0].stream
                taken = 0
                while queued.messages:  # reading opens the window again: more flows
                    taken += len(await calls[0].read() or b"")
                async with asyncio.timeout(5):
                    stream.send_message(b"y" * (256 << 10))
                    await stream.drain()
                assert taken >= h2stream.STREAM_WINDOW
            finally:
                conn.close()

    run(main())


def test_a_message_past_the_limit_is_resource_exhausted(monkeypatch: pytest.MonkeyPatch) -> None:
    echo = Echo()

    async def main() -> None:
        async with serving(echo.handle) as port:
            conn = await h2grpc.connect("127.0.0.1", port)
            try:
                stream = conn.open("/t.Echo/Unary", timeout_s=TIMEOUT_S)
                # only the prefix: a length past the limit is refused before its bytes
                stream.send_data(f.MESSAGE_PREFIX.pack(0, h2stream.MAX_MESSAGE_BYTES + 1))
                await stream.wait_closed()
                answer = h2grpc.Answer.of(stream)
                assert answer is not None and answer.code_name == "RESOURCE_EXHAUSTED"
                assert "larger than max" in answer.message
                stream = conn.open("/t.Echo/Unary", timeout_s=TIMEOUT_S)
                stream.send_data(f.MESSAGE_PREFIX.pack(1, 3) + b"zip", end_stream=True)
                await stream.wait_closed()
                answer = h2grpc.Answer.of(stream)
                assert answer is not None and answer.code_name == "UNIMPLEMENTED"
            finally:
                conn.close()

    run(main())


def test_grpc_timeout_values_round_trip() -> None:
    for seconds in (0.000_001, 0.25, 1.0, 90.0, 10 * 86_400.0):
        text = f.format_timeout(seconds)
        back = f.parse_timeout(text)
        assert back is not None and back >= seconds * 0.999
        assert len(text) <= 9
    assert f.parse_timeout("12x") is None
    assert f.parse_timeout("S") is None
    assert f.parse_timeout("123456789S") is None
