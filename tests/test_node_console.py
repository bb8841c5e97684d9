"""A node's own console (`[listen] console`): the JSON API served by a node process.

One three-node cluster with TLS and an ACL for the module, node 1 alone with a
console (`node_config`): it serves HTTPS with node 1's certificate, a request
signs in as its user (the console holds no right of its own), the cluster view
shows the three nodes and a leader, a put through it reads back. A console bind
the rules refuse (non-loopback, plaintext, no ACL) stops `dledger serve` with one
line before its data directory is made, and a console port in use is a
ListenError naming it.
"""

from __future__ import annotations

import base64
import errno
import http.client
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger_commitlog.cli.launcher import LocalCluster, free_ports
from dledger_commitlog.client import load_credentials
from tests.conftest import SHARED_CONFIG, register, wait_until
from tests.console_helpers import ROOT, Http, console_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Http]]:
    """The module's cluster, and node 1's console signed in as the cluster's admin."""
    (port,) = free_ports(1)
    with LocalCluster(
        tmp_path_factory.mktemp("nodeconsole"),
        extra_config=SHARED_CONFIG,
        node_config={1: {"listen_console": f"127.0.0.1:{port}"}},
        tls=True,
        acl=True,
    ) as cluster:
        cluster.up()
        api = Http(f"https://127.0.0.1:{port}/api/v1", cluster.tls_ca)
        assert cluster.credentials_path is not None
        yield cluster, api.as_user(*load_credentials(cluster.credentials_path))


def test_the_nodes_console_shows_the_cluster(
    request: pytest.FixtureRequest, node_console: tuple[LocalCluster, Http]
) -> None:
    cluster, admin = node_console
    register(request.node, cluster)
    anonymous = Http(admin.base, admin.tls_ca).get("/cluster")
    assert anonymous.status == 401, anonymous.body
    leader = cluster.leader_id()
    view = wait_until(
        lambda: admin.get("/cluster").json,
        10,
        "the console's view of a leader",
        lambda doc: doc["shards"][0]["leader"] == leader,
    )
    (shard,) = view["shards"]
    assert sorted(n["node_id"] for n in shard["nodes"]) == [1, 2, 3]
    assert {n["role"] for n in shard["nodes"]} >= {"leader"}
    assert view["tls"] is True and view["acl"] is True
    assert [r["node_id"] for r in view["node_metrics"]] == [1]  # its own metrics port


def test_a_put_through_the_nodes_console_reads_back(
    request: pytest.FixtureRequest, node_console: tuple[LocalCluster, Http]
) -> None:
    cluster, admin = node_console
    register(request.node, cluster)
    put = admin.put("orders", b"through node 1", "?key=o-1")
    assert put.status == 200, put.body
    got = admin.get(f"/messages/{put.json['msg_id']}").json
    assert got["body"] == "through node 1" and got["keys"] == ["o-1"]


def test_the_nodes_shutdown_stops_its_console(
    request: pytest.FixtureRequest, node_console: tuple[LocalCluster, Http]
) -> None:
    """Last of the module's cluster tests: it stops node 1 (SIGTERM) while a page's
    event stream is open; the node exits on its own and its console port is closed."""
    cluster, admin = node_console
    register(request.node, cluster)
    context = ssl.create_default_context(cafile=str(admin.tls_ca))
    stream = http.client.HTTPSConnection(admin.host, admin.port, timeout=10, context=context)
    assert admin.auth is not None
    token = base64.b64encode(":".join(admin.auth).encode()).decode()
    stream.request("GET", admin.prefix + "/events", headers={"Authorization": f"Basic {token}"})
    reply = stream.getresponse()
    assert reply.status == 200
    lines = iter(reply.readline, b"")
    assert any(line == b"event: snapshot\n" for line in lines)  # the stream is live
    cluster.stop(1, timeout_s=5.0)
    assert cluster.exit_code(1) == 0, cluster.log_tail(1)
    stream.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((admin.host, admin.port), timeout=2).close()


def _serve(tmp_path: Path, console: str) -> subprocess.CompletedProcess[str]:
    """`dledger serve` of a one-node cluster of its own with `--listen-console`."""
    client, raft = free_ports(2)
    argv = [sys.executable, "-m", "dledger_commitlog", "serve", "--node-id", "1"]
    argv += ["--data-dir", str(tmp_path / "data"), "--data-segment-bytes", str(1 << 20)]
    argv += ["--index-segment-bytes", str(32 * 4096), "--max-message-bytes", "65536"]
    argv += ["--peer", f"1=127.0.0.1:{raft}/127.0.0.1:{client}", "--listen-console", console]
    return subprocess.run(
        argv, capture_output=True, text=True, env=console_env(), cwd=ROOT, timeout=30, check=False
    )


def test_a_console_beyond_loopback_in_plaintext_is_refused(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    done = _serve(tmp_path, f"0.0.0.0:{port}")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"dledger: error: listen.console 0.0.0.0:{port} is reachable"), line
    assert not (tmp_path / "data").exists()  # refused before the store opened


def test_a_console_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _serve(tmp_path, f"127.0.0.1:{port}")
    assert done.returncode == 1, done.stderr
    in_use = os.strerror(errno.EADDRINUSE)
    last = done.stderr.splitlines()[-1]
    assert last == f"dledger: cannot listen for the console on 127.0.0.1:{port}: {in_use}"
