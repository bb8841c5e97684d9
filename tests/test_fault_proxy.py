"""The fault proxy (chaos/proxy/), driven through the toxiproxy-python client.

The chaos tests talk to a Toxiproxy-compatible server with `toxiproxy-python`; these
tests drive our own server with that same client (plus raw HTTP where the client has
no call, e.g. toxic updates, or hides the server's answer behind its own checks), with
tiny local TCP servers as upstreams. With TOXIPROXY_URL set (e.g. http://127.0.0.1:8474)
the same tests run against that real Toxiproxy instead, touching only proxies named
with this run's prefix (except `test_reset`, which resets the whole server).

Timing is only ever asserted as a lower bound caused by a toxic (e.g. latency 300 ms
makes a round trip take >= 0.28 s); "nothing arrives" is watched for QUIET_S, and
everything else waits on a condition up to a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import select
import signal
import socket
import socketserver
import subprocess
import sys
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
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.proxy.api import FaultProxyServer
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


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
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


@pytest.fixture(scope="module")
def pair() -> Iterator[PairServer]:
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


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
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


@pytest.fixture
def tp(api: Api) -> Iterator[Any]:
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


# --------------------------------------------------------------------------- API tests


def test_version_and_running(tp: Any) -> None:
    assert tp.running()
    version: bytes = tp.version()
    assert b"2." in version


def test_create_list_get_destroy(tp: Any, echo: str) -> None:
    proxy = create(tp, "crud", echo)
    assert proxy.enabled is True and proxy.upstream == echo
    host, _, port = proxy.listen.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0  # the bound address, not ":0"

    listed = tp.proxies()
    assert listed[name("crud")].listen == proxy.listen
    shown = tp.get_proxy(name("crud"))
    assert shown is not None and shown.upstream == echo and shown.enabled is True
    with connect(proxy.listen) as sock:
        roundtrip(sock)

    assert proxy.destroy()
    assert tp.get_proxy(name("crud")) is None
    assert refused(proxy.listen)


def test_errors_are_toxiproxys(tp: Any, api: Api, echo: str) -> None:
    proxy = create(tp, "errors", echo)
    spec = {"name": name("errors"), "listen": "127.0.0.1:0", "upstream": echo}
    with pytest.raises(ProxyExists):  # the client checks first...
        tp.create(**spec)
    with pytest.raises(ProxyExists):  # ...and so does the server
        APIConsumer.post("/proxies", json=spec)
    assert http(api, "POST", "/proxies", spec) == (
        409,
        {"error": "proxy already exists", "status": 409},
    )

    missing = f"/proxies/{name('missing')}"
    assert http(api, "GET", missing) == (404, {"error": "proxy not found", "status": 404})
    with pytest.raises(NotFound):
        APIConsumer.get(missing)
    status, body = http(api, "POST", "/proxies", {"name": name("x")})
    assert status == 400 and body["error"].startswith("missing required field")
    status, body = http(api, "POST", "/proxies", raw=b"{not json")
    assert status == 400 and body["error"].startswith("bad request body")

    toxics = f"/proxies/{proxy.name}/toxics"
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no_such_toxic")
    status, body = http(api, "POST", toxics, {"type": "latency", "stream": "sideways"})
    assert status == 400 and body["error"].startswith("stream was invalid")
    proxy.add_toxic(type="latency", attributes={"latency": 1})
    assert http(api, "POST", toxics, {"type": "latency"}) == (
        409,
        {"error": "toxic already exists", "status": 409},
    )
    for method in ("GET", "DELETE"):
        assert http(api, method, f"{toxics}/nope") == (
            404,
            {"error": "toxic not found", "status": 404},
        )


def test_toxic_crud(tp: Any, api: Api, echo: str) -> None:
    proxy = create(tp, "toxics", echo)
    proxy.add_toxic(type="latency", attributes={"latency": 100, "jitter": 10})
    proxy.add_toxic(
        type="timeout", stream="upstream", name="cut", toxicity=0.5, attributes={"timeout": 0}
    )
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "cut"}  # default name: <type>_<stream>
    latency = toxics["latency_downstream"]
    assert (latency.type, latency.stream, latency.toxicity) == ("latency", "downstream", 1.0)
    assert latency.attributes == {"latency": 100, "jitter": 10}
    assert (toxics["cut"].stream, toxics["cut"].toxicity) == ("upstream", 0.5)

    # Updating (no client call for it) merges the given attributes into the toxic's.
    path = f"/proxies/{proxy.name}/toxics/latency_downstream"
    status, body = http(api, "POST", path, {"attributes": {"latency": 50}})
    assert status == 200 and body["attributes"] == {"latency": 50, "jitter": 10}
    assert http(api, "GET", path)[1]["attributes"] == {"latency": 50, "jitter": 10}
    status, shown = http(api, "GET", f"/proxies/{proxy.name}")
    assert {t["name"] for t in shown["toxics"]} == {"latency_downstream", "cut"}

    assert proxy.destroy_toxic("cut")
    assert proxy.get_toxic("cut") is None
    assert set(proxy.toxics()) == {"latency_downstream"}


def test_populate(tp: Any, api: Api, echo: str) -> None:
    status, body = http(
        api,
        "POST",
        "/populate",
        [
            {"name": name("pop1"), "listen": "127.0.0.1:0", "upstream": echo},
            {"name": name("pop2"), "listen": "127.0.0.1:0", "upstream": echo, "enabled": False},
        ],
    )
    assert status == 201
    made = {p["name"]: p for p in body["proxies"]}
    assert made[name("pop1")]["enabled"] is True and made[name("pop2")]["enabled"] is False
    listen = made[name("pop1")]["listen"]
    with connect(listen) as live:
        roundtrip(live)
        # The same name, listen and upstream again: left untouched (the connection lives).
        again = [{"name": name("pop1"), "listen": listen, "upstream": echo}]
        status, body = http(api, "POST", "/populate", again)
        assert status == 201 and body["proxies"][0]["listen"] == listen
        roundtrip(live)
    assert set(tp.proxies()) >= {name("pop1"), name("pop2")}


# --------------------------------------------------------------------------- partitions


def test_disable_cuts_live_connections_and_enable_restores(tp: Any, echo: str) -> None:
    proxy = create(tp, "partition", echo)
    with connect(proxy.listen) as live:
        roundtrip(live)
        proxy.disable()
        assert tp.get_proxy(proxy.name).enabled is False
        read_until_closed(live)  # the live connection is cut...
    assert refused(proxy.listen)  # ...and nothing listens
    proxy.enable()  # on the same address again
    with connect(proxy.listen) as sock:
        roundtrip(sock)
    with proxy.down():
        assert refused(proxy.listen)
    with connect(proxy.listen) as sock:
        roundtrip(sock)


def test_update_upstream_restarts_the_proxy(tp: Any, api: Api, echo: str, pair: PairServer) -> None:
    proxy = create(tp, "retarget", echo)
    with connect(proxy.listen) as old:
        roundtrip(old)
        status, body = http(api, "POST", f"/proxies/{proxy.name}", {"upstream": pair.address})
        assert status == 200 and body["upstream"] == pair.address
        assert body["listen"] == proxy.listen and body["enabled"] is True
        read_until_closed(old)  # changing upstream drops the connections
    with connect(proxy.listen) as client, pair.accept() as server:
        client.sendall(b"hello")
        assert recv_exactly(server, 5) == b"hello"


def test_reset_enables_all_and_removes_toxics(tp: Any, echo: str) -> None:
    proxy = create(tp, "reset", echo)
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 2000})
    proxy.disable()
    assert tp.reset()
    shown = tp.get_proxy(proxy.name)
    assert shown.enabled is True and shown.toxics() == {}
    with connect(proxy.listen) as sock:
        assert roundtrip(sock) < 1.5  # neither the timeout nor the 2 s latency is left


# --------------------------------------------------------------------------- toxics


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_latency_on_live_and_new_connections(tp: Any, echo: str, stream: str) -> None:
    proxy = create(tp, f"latency_{stream}", echo)
    with connect(proxy.listen) as live:
        roundtrip(live)
        proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 300})
        assert roundtrip(live) >= 0.28
        with connect(proxy.listen) as fresh:
            assert roundtrip(fresh) >= 0.28
        proxy.destroy_toxic(f"latency_{stream}")
        wait_for(lambda: roundtrip(live) < 0.2, "round trips without the latency")


def test_toxicity_zero_never_applies(tp: Any, echo: str) -> None:
    proxy = create(tp, "toxicity", echo)
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 2000})
    with connect(proxy.listen) as sock:
        assert roundtrip(sock) < 1.5


def test_bandwidth_limits_live_connection(tp: Any, echo: str) -> None:
    proxy = create(tp, "bandwidth", echo)
    payload = os.urandom(50_000)
    with connect(proxy.listen) as live:
        roundtrip(live, payload)
        proxy.add_toxic(type="bandwidth", attributes={"rate": 100})  # KB/s, server->client
        assert roundtrip(live, payload) >= 0.35  # 50 KB at 100 KB/s takes ~0.5 s


def test_timeout_zero_blackholes_until_removed(tp: Any, echo: str) -> None:
    proxy = create(tp, "blackhole", echo)
    with connect(proxy.listen) as live:
        roundtrip(live)
        proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        live.sendall(b"lost")
        nothing_arrives(live)
        proxy.destroy_toxic("timeout_upstream")
        # As in Toxiproxy, removing a timeout closes the connections it held: they lost data.
        data, _ = read_until_closed(live)
        assert data == b""
    with connect(proxy.listen) as fresh:
        roundtrip(fresh)


def test_timeout_closes_after_timeout(tp: Any, echo: str) -> None:
    proxy = create(tp, "timeout", echo)
    proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        sock.sendall(b"ping")
        data, _ = read_until_closed(sock)
        assert data == b"" and time.monotonic() - start >= 0.25


@pytest.mark.parametrize("timeout_ms", [0, 300])
def test_reset_peer(tp: Any, echo: str, timeout_ms: int) -> None:
    proxy = create(tp, f"reset_peer_{timeout_ms}", echo)
    proxy.add_toxic(type="reset_peer", attributes={"timeout": timeout_ms})
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        sock.sendall(b"ping")
        data, how = read_until_closed(sock)
        assert (data, how) == (b"", "reset")
        assert time.monotonic() - start >= timeout_ms / 1000 * 0.9


def test_limit_data_closes_after_n_bytes(tp: Any, echo: str) -> None:
    proxy = create(tp, "limit", echo)
    proxy.add_toxic(type="limit_data", attributes={"bytes": 100})
    payload = os.urandom(300)
    with connect(proxy.listen) as sock:
        sock.sendall(payload)
        data, _ = read_until_closed(sock)
        assert data == payload[:100]


def test_slow_close_delays_the_close(tp: Any, echo: str) -> None:
    proxy = create(tp, "slow_close", echo)
    proxy.add_toxic(type="slow_close", attributes={"delay": 300})
    with connect(proxy.listen) as sock:
        roundtrip(sock)
        start = time.monotonic()
        sock.shutdown(socket.SHUT_WR)
        assert read_until_closed(sock) == (b"", "eof")
        assert time.monotonic() - start >= 0.28


def test_slicer_keeps_the_data(tp: Any, echo: str) -> None:
    proxy = create(tp, "slicer", echo)
    proxy.add_toxic(
        type="slicer", attributes={"average_size": 10, "size_variation": 5, "delay": 100}
    )
    with connect(proxy.listen) as sock:
        roundtrip(sock, os.urandom(2000))


@pytest.mark.parametrize("cut", ["upstream", "downstream"])
def test_directions_are_independent(tp: Any, pair: PairServer, cut: str) -> None:
    proxy = create(tp, f"one_way_{cut}", pair.address)
    with connect(proxy.listen) as client, pair.accept() as server:
        proxy.add_toxic(type="timeout", stream=cut, attributes={"timeout": 0})
        if cut == "upstream":
            (cut_from, cut_to), (open_from, open_to) = (client, server), (server, client)
        else:
            (cut_from, cut_to), (open_from, open_to) = (server, client), (client, server)
        open_from.sendall(b"flows")
        assert recv_exactly(open_to, 5) == b"flows"
        cut_from.sendall(b"dropped")
        nothing_arrives(cut_to)
        open_from.sendall(b"still")
        assert recv_exactly(open_to, 5) == b"still"


# --------------------------------------------------------------------------- our server


@ours_only
def test_stop_closes_everything(echo: str) -> None:
    handle = start_in_thread()
    status, made = http(
        handle.url, "POST", "/proxies", {"name": "p", "listen": "127.0.0.1:0", "upstream": echo}
    )
    assert status == 201
    http(handle.url, "POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"latency": 1}})
    with connect(made["listen"]) as live:
        roundtrip(live)
        handle.stop()
        read_until_closed(live)
    assert not handle.thread.is_alive()
    assert handle.leftover_tasks == []
    assert refused(made["listen"]) and refused(f"{handle.host}:{handle.port}")
    handle.stop()  # idempotent


@ours_only
def test_in_process_asyncio(echo: str) -> None:
    async def scenario() -> float:
        async with FaultProxyServer(port=0) as server:
            [made] = await server.populate(
                [{"name": "p", "listen": "127.0.0.1:0", "upstream": echo}]
            )
            host, _, port = made["listen"].rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                start = time.monotonic()
                writer.write(b"ping")
                assert await asyncio.wait_for(reader.readexactly(4), DEADLINE_S) == b"ping"
                return time.monotonic() - start
            finally:
                writer.close()

    assert asyncio.run(scenario()) >= 0


@ours_only
def test_standalone_process(tmp_path: Path, echo: str) -> None:
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"name": "p", "listen": "127.0.0.1:0", "upstream": echo}]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.proxy", "--listen", "127.0.0.1:0", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 10.0)
        assert ready, "the proxy process printed no address"
        line = proc.stdout.readline()
        assert "listening on http://" in line, line
        url = line.rsplit(" ", 1)[1].strip()
        assert http(url, "GET", "/version") == (200, {"version": "2.12.0"})
        status, proxies = http(url, "GET", "/proxies")
        assert status == 200
        with connect(proxies["p"]["listen"]) as sock:
            roundtrip(sock)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


# --------------------------------------------------------------------------- the chaos network


def test_a_spares_links_exist_from_the_start_and_forward_once_it_joins(echo: str) -> None:
    """`ToxiproxyNetwork(spares=...)`: node configs name every link once, so a node a run
    adds later has its proxies from the start; they reach it once it `join`s."""
    from chaos.network import ToxiproxyNetwork

    saved = (APIConsumer.host, APIConsumer.port)
    try:
        with ToxiproxyNetwork({1: "127.0.0.1:1"}, prefix=PREFIX, spares=[2]) as net:
            links = net.links()
            assert sorted(links) == [(1, 2), (2, 1)]
            with connect(links[1, 2]) as early:  # nobody there yet: closed at once
                assert read_until_closed(early)[0] == b""
            net.join(2, echo)
            with connect(links[1, 2]) as sock:
                roundtrip(sock)
            net.cut(1, 2)
            assert refused(links[1, 2])
            net.heal()
            with connect(links[1, 2]) as sock:
                roundtrip(sock)
    finally:
        APIConsumer.host, APIConsumer.port = saved
