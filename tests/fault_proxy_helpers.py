"""What the fault-proxy tests (tests/test_fault_proxy*.py) share: the API under test,
upstreams, and socket helpers.

The chaos tests talk to a Toxiproxy-compatible server with `toxiproxy-python`; the
fault-proxy tests drive our own server (chaos/proxy/) with that same client (plus
raw HTTP where the client has no call, e.g. toxic updates, or hides the server's
answer behind its own checks), with tiny local TCP servers as upstreams. With
TOXIPROXY_URL set (e.g. http://127.0.0.1:8474) the same tests run against that real
Toxiproxy instead, touching only proxies named with this run's prefix (except
`test_reset`, which resets the whole server).

Timing is only ever asserted as a lower bound caused by a toxic (e.g. latency 300 ms
makes a round trip take >= 0.28 s); "nothing arrives" is watched for QUIET_S, and
everything else waits on a condition up to a deadline.

The fixtures are named `fixture_<name>` and registered as `<name>`: a test module
imports them (`from tests.fault_proxy_helpers import fixture_tp as fixture_tp`) and
its tests take `tp`.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer

from chaos.proxy.serve import start_in_thread

ROOT: Final = Path(__file__).resolve().parents[1]
DEADLINE_S: Final = 5.0
QUIET_S: Final = 0.3  # how long a blackholed direction is watched for stray data
PREFIX: Final = f"fpt{uuid.uuid4().hex[:6]}_"
REAL_TOXIPROXY: Final = os.environ.get("TOXIPROXY_URL")
ours_only = pytest.mark.skipif(REAL_TOXIPROXY is not None, reason="tests our server itself")

# Bypass any HTTP proxy configured in the environment: the API is local.
_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def name(tag: str) -> str:
    return f"{PREFIX}{tag}"


# --------------------------------------------------------------------------- upstreams


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        while True:
            try:
                data = sock.recv(65536)
                if not data:
                    return
                sock.sendall(data)
            except OSError:
                return


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class PairServer:
    """Accepts connections and hands the server-side sockets to the test."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._accepted: queue.Queue[socket.socket] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pair-server", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self._accepted.put(conn)

    def accept(self) -> socket.socket:
        try:
            return self._accepted.get(timeout=DEADLINE_S)
        except queue.Empty:
            raise AssertionError(f"no connection reached {self.address}") from None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)
        self._sock.close()
        while not self._accepted.empty():
            self._accepted.get_nowait().close()


@pytest.fixture(scope="module", name="echo")
def fixture_echo() -> Iterator[str]:
    server = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(DEADLINE_S)


@pytest.fixture(scope="module", name="pair")
def fixture_pair() -> Iterator[PairServer]:
    server = PairServer()
    try:
        yield server
    finally:
        server.close()


# --------------------------------------------------------------------------- API


@dataclass(frozen=True)
class Api:
    host: str
    port: int

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.fixture(scope="module", name="api")
def fixture_api() -> Iterator[Api]:
    """Our server in a thread, or the real Toxiproxy at TOXIPROXY_URL."""
    if REAL_TOXIPROXY is not None:
        url = urllib.parse.urlsplit(
            REAL_TOXIPROXY if "//" in REAL_TOXIPROXY else f"http://{REAL_TOXIPROXY}"
        )
        yield Api(url.hostname or "127.0.0.1", url.port or 8474)
        return
    handle = start_in_thread()
    try:
        yield Api(handle.host, handle.port)
    finally:
        handle.stop()
    assert handle.leftover_tasks == []
    assert not handle.thread.is_alive()


@pytest.fixture(name="tp")
def fixture_tp(api: Api) -> Iterator[Any]:
    """The toxiproxy-python client pointed at `api`; removes this run's proxies afterwards."""
    saved = (APIConsumer.host, APIConsumer.port)
    client = Toxiproxy()
    client.update_api_consumer(api.host, api.port)
    try:
        yield client
    finally:
        try:
            for proxy_name, proxy in client.proxies().items():
                if proxy_name.startswith(PREFIX):
                    proxy.destroy()
        finally:
            APIConsumer.host, APIConsumer.port = saved


def http(
    api: Api | str, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    """One raw API call: (status, decoded JSON body or None)."""
    base = api if isinstance(api, str) else api.base
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(request, timeout=DEADLINE_S) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, payload = err.code, err.read()
    return status, json.loads(payload) if payload.strip() else None


def create(tp: Any, tag: str, upstream: str) -> Any:
    return tp.create(upstream=upstream, name=name(tag), listen="127.0.0.1:0")


# --------------------------------------------------------------------------- sockets


def connect(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return socket.create_connection((host, int(port)), timeout=DEADLINE_S)


def refused(listen: str) -> bool:
    try:
        connect(listen).close()
    except ConnectionRefusedError:
        return True
    return False


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    deadline = time.monotonic() + DEADLINE_S
    buf = bytearray()
    while len(buf) < size:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(size - len(buf))
        except TimeoutError:
            raise AssertionError(f"got {len(buf)} of {size} bytes in {DEADLINE_S}s") from None
        if not data:
            raise AssertionError(f"connection closed after {len(buf)} of {size} bytes")
        buf += data
    return bytes(buf)


def roundtrip(sock: socket.socket, payload: bytes = b"ping") -> float:
    """Send `payload` through the echo upstream and read it back; the seconds it took."""
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def nothing_arrives(sock: socket.socket) -> None:
    sock.settimeout(QUIET_S)
    try:
        data = sock.recv(1)
    except TimeoutError:
        return
    raise AssertionError(f"expected silence, got {data!r}")


def read_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    """Everything received until the peer closes, and how: "eof" or "reset"."""
    deadline = time.monotonic() + DEADLINE_S
    buf = bytearray()
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return bytes(buf), "reset"
        except TimeoutError:
            raise AssertionError(f"connection still open after {DEADLINE_S}s") from None
        if not data:
            return bytes(buf), "eof"
        buf += data


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {DEADLINE_S}s waiting for {what}")
        time.sleep(0.02)
