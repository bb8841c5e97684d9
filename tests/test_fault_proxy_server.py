"""Our fault proxy server itself (chaos/proxy/), and the chaos network built on it.

Stopping the server closes every proxy and connection; it runs in-process under
asyncio and as a standalone process (`python -m chaos.proxy`); `ToxiproxyNetwork`
(chaos/network.py) names a spare node's links from the start.
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from toxiproxy.api import APIConsumer

from chaos.proxy.api import FaultProxyServer
from chaos.proxy.serve import start_in_thread
from tests.fault_proxy_helpers import (
    DEADLINE_S,
    PREFIX,
    ROOT,
    connect,
    http,
    ours_only,
    read_until_closed,
    refused,
    roundtrip,
)

# The fixtures these tests take (pytest finds them by their names).
from tests.fault_proxy_helpers import fixture_echo as fixture_echo

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
