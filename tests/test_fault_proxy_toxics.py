"""The fault proxy's toxics (chaos/proxy/) on live and new connections.

Latency, toxicity, bandwidth, timeout, reset_peer, limit_data, slow_close and slicer,
each direction on its own. Timing is only asserted as a lower bound the toxic
causes. Runs against a real Toxiproxy with TOXIPROXY_URL set
(tests/fault_proxy_helpers.py).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest

from tests.fault_proxy_helpers import (
    PairServer,
    connect,
    create,
    nothing_arrives,
    read_until_closed,
    recv_exactly,
    roundtrip,
    wait_for,
)

# The fixtures these tests take (pytest finds them by their names).
from tests.fault_proxy_helpers import fixture_api as fixture_api
from tests.fault_proxy_helpers import fixture_echo as fixture_echo
from tests.fault_proxy_helpers import fixture_pair as fixture_pair
from tests.fault_proxy_helpers import fixture_tp as fixture_tp


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
