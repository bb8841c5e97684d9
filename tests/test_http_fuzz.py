"""Garbage at the console's HTTP/1.1 server, generated (hypothesis): random bytes and
valid requests with bytes flipped, cut, repeated or sent in pieces.

A real listener on loopback (its own loop in a thread, as `dledger console` serves)
and blocking sockets. Each example sends its bytes, half-closes, and reads to the
close: the server answers with statuses it means (never 500, never an unframed
answer), or closes without one, within its read deadline; and a valid request on a
new connection is answered 200 after every example (nothing crashed, nothing leaked).
Hypothesis prints the falsifying bytes of a failure (and `@reproduce_failure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dledger_commitlog.console.http import HttpServer, Router
from tests.test_http_server import LIMITS, echo

VALID = (
    b"POST /echo/a?x=1&y=%41 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 5\r\n\r\nhello"
)
CHUNKED = (
    b"POST /echo/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
)
STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")
MEANT = {100, 200, 400, 404, 405, 431, 505}  # what the server says to such bytes


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """A server on a loop of its own thread, for every example of the module."""
    loop = asyncio.new_event_loop()
    router = Router()
    router.add("POST", "/echo/{name}", echo)
    router.add("GET", "/echo/{name}", echo)
    server = HttpServer(router, LIMITS)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(5)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def exchange(port: int, pieces: list[bytes]) -> bytes:
    """Send `pieces` (one send each), half-close, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for piece in pieces:
            try:
                sock.sendall(piece)
            except OSError:  # the server refused and closed first
                break
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        out = b""
        deadline = time.monotonic() + 4 * LIMITS.read_timeout_s + 2
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                return out
            out += chunk
        raise AssertionError(f"the server held the connection past its deadlines: {out[:200]!r}")


def check_answer(out: bytes) -> None:
    statuses = [int(s) for s in STATUS.findall(out)]
    assert out == b"" or out.startswith(b"HTTP/1.1 "), out[:200]
    assert set(statuses) <= MEANT, (statuses, out[:300])
    for head in re.findall(rb"HTTP/1\.1 [2-5]\d\d .*?\r\n\r\n", out, re.S):
        assert b"Content-Length: " in head or b"Transfer-Encoding: chunked" in head, head


def still_serves(port: int) -> None:
    out = exchange(port, [VALID.replace(b"Host: x", b"Host: x\r\nConnection: close")])
    assert out.startswith(b"HTTP/1.1 200 ") and out.endswith(b'{"n":5,"params":{"name":"a"}}')


def mutate(base: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """`base` with each (position, length, replacement) applied in turn."""
    out = base
    for position, length, new in edits:
        at = position % (len(out) + 1)
        out = out[:at] + new + out[at + length :]
    return out


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


FUZZ = settings(
    max_examples=150,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
EDITS = st.lists(
    st.tuples(
        st.integers(0, 400),
        st.integers(0, 8),
        st.one_of(
            st.binary(max_size=8),
            st.sampled_from(
                [b"\r\n", b"\n", b"\r\n\r\n", b" ", b":", b"\x00", b"999999999999", b"chunked"]
            ),
        ),
    ),
    min_size=1,
    max_size=4,
)


@FUZZ
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=4))
def test_random_bytes_get_a_meant_status_or_a_close(
    port: int, data: bytes, cuts: list[int]
) -> None:
    check_answer(exchange(port, pieces(data, cuts)))
    still_serves(port)


@FUZZ
@given(
    base=st.sampled_from([VALID, CHUNKED, VALID + VALID, VALID + CHUNKED]),
    edits=EDITS,
    cuts=st.lists(st.integers(0, 400), max_size=4),
)
def test_mutated_requests_get_a_meant_status_or_a_close(
    port: int, base: bytes, edits: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    data = mutate(base, edits)
    check_answer(exchange(port, pieces(data, cuts)))
    still_serves(port)


@FUZZ
@given(cuts=st.lists(st.integers(0, 400), max_size=6))
def test_valid_requests_in_any_pieces_are_answered_alike(port: int, cuts: list[int]) -> None:
    data = VALID + CHUNKED
    out = exchange(port, pieces(data, cuts))
    assert out.count(b"HTTP/1.1 200 OK") == 2, out
    assert b'{"n":5,"params":{"name":"a"}}' in out and b'{"n":5,"params":{"name":"b"}}' in out
