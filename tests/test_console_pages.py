"""The console's server-sent events over real HTTP, against a real three-node cluster.

One cluster and one `dledger console` process serve the module.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from tests.console_helpers import Http, running_console

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def console(shared_cluster: LocalCluster) -> Iterator[Http]:
    shared_cluster.wait_for_leader(timeout_s=10.0)
    with running_console(shared_cluster) as http:
        yield http


def read_snapshot(console: Http) -> dict[str, Any]:
    conn = http.client.HTTPConnection(console.host, console.port, timeout=10)
    try:
        conn.request("GET", console.prefix + "/events")
        reply = conn.getresponse()
        assert reply.status == 200
        assert reply.getheader("content-type") == "text/event-stream"
        event = ""
        while True:
            line = reply.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "snapshot":
                doc: dict[str, Any] = json.loads(line.removeprefix("data: "))
                return doc
    finally:
        conn.close()


def test_events_stream_snapshots_of_the_cluster_and_topics(console: Http) -> None:
    assert console.put("pages-events", b"one").status == 200
    doc = read_snapshot(console)
    assert doc["errors"] == [] and doc["time_ms"] > 0
    assert 1 in {s["shard"] for s in doc["cluster"]["shards"]}
    assert doc["cluster"]["tls"] is False and doc["cluster"]["acl"] is False
    assert "pages-events" in {t["topic"] for t in doc["topics"]}
