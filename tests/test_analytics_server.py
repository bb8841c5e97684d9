"""Reading committed messages from a running cluster without Spark: `ServerStore`, lag."""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.parquet as pq
import pytest

import analytics.commands  # registers `dledger analytics ...`
from analytics import jobs
from analytics.errors import SourceError
from analytics.server_store import ServerStore
from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.launcher import LocalCluster, free_ports
from dledger_commitlog.client import Client, MessageSpec
from store.message import decode_message
from tests.conftest import wait_until

pytestmark = pytest.mark.slow
T = TypeVar("T")
assert analytics.commands


def fresh_topic(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def put(client: Client, topic: str, count: int, start: int = 0) -> list[Any]:
    specs = [
        MessageSpec(topic, f"{topic} {k}".encode() * (1 + k % 5), keys=[f"k{k % 3}"], tags="t")
        for k in range(start, start + count)
    ]
    return client.put_batch(specs)


def answered(call: Callable[[], T]) -> T | SourceError:
    """What `call` gives, or the SourceError of a replica that does not answer yet (one
    restarted just now): an observation for `wait_until` that is not ok."""
    try:
        return call()
    except SourceError as exc:
        return exc


def dispatched_everywhere(cluster: LocalCluster, topic: str, count: int) -> None:
    """Every replica serves all `count` messages of `topic` (they are committed and dispatched)."""
    for spec in cluster:
        store = ServerStore([spec.client], timeout_s=5)
        try:
            wait_until(
                lambda store=store: answered(  # type: ignore[misc]
                    lambda: sum(q.max_offset for q in store.queues(topic))
                ),
                30,
                f"{spec.client} to dispatch {count} messages of {topic}",
                ok=lambda n: n == count,
            )
        finally:
            store.close()


def offsets_everywhere(cluster: LocalCluster, group: str, topic: str, want: dict[int, int]) -> None:
    """Every replica answers the shard's committed offsets `want` (queue -> offset)."""
    for spec in cluster:
        store = ServerStore([spec.client], timeout_s=5)
        try:
            wait_until(
                lambda store=store: answered(  # type: ignore[misc]
                    lambda: {g.queue_id: g.offset for g in store.group_offsets(group, topic)}
                ),
                30,
                f"{spec.client} to dispatch the offsets {want} of {group}",
                ok=lambda got: (
                    isinstance(got, dict) and all(got.get(q) == o for q, o in want.items())
                ),
            )
        finally:
            store.close()


def test_every_queue_reads_back_exactly_the_acknowledged_messages(cluster: LocalCluster) -> None:
    topic = fresh_topic("srv")
    with cluster.client() as client:
        acked = put(client, topic, 200)
    dispatched_everywhere(cluster, topic, 200)
    # A dead address first: the reader fails over to the live servers.
    servers = [f"127.0.0.1:{free_ports(1)[0]}", *(s.client for s in cluster)]
    planner = ServerStore(servers, timeout_s=10)
    queues = planner.queues(topic)
    planner.close()
    # A fresh store starts with the dead address; small pulls: many round trips.
    store = ServerStore(servers, timeout_s=10, pull_bytes=2048)
    try:
        assert [q.queue_id for q in queues] == [0, 1, 2, 3]
        got: dict[str, bytes] = {}
        for q in queues:
            for batch in store.read(topic, q.queue_id, 0, q.max_offset, ["msg_id", "body"]):
                ids, bodies = batch.column("msg_id").to_pylist(), batch.column("body").to_pylist()
                got.update(zip(ids, bodies, strict=True))
    finally:
        store.close()
    assert set(got) == {r.msg_id for r in acked}
    with cluster.client() as client:
        for r in acked[::37]:
            assert got[r.msg_id] == client.get(msg_id=r.msg_id).body


def test_a_read_beyond_the_committed_end_is_refused(cluster: LocalCluster) -> None:
    topic = fresh_topic("end")
    with cluster.client() as client:
        put(client, topic, 8)
    dispatched_everywhere(cluster, topic, 8)
    store = ServerStore([s.client for s in cluster], timeout_s=2)
    try:
        q = store.queues(topic)[0]
        with pytest.raises(SourceError, match="no replica served queue offset"):
            list(store.read(topic, q.queue_id, 0, q.max_offset + 1))
    finally:
        store.close()


def test_no_server_at_all_is_a_clear_error() -> None:
    store = ServerStore([f"127.0.0.1:{free_ports(1)[0]}"], timeout_s=1)
    with pytest.raises(SourceError, match="no server answered in 1s"):
        store.queues()


def test_consumer_group_lag_per_queue(
    cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = fresh_topic("lag")
    with cluster.client() as client:
        acked = put(client, topic, 40)
        ends = {q: max(r.queue_offset for r in acked if r.queue_id == q) + 1 for q in range(4)}
        client.commit_offset("billing", topic, 0, ends[0])  # caught up
        client.commit_offset("billing", topic, 1, 2)  # behind
    dispatched_everywhere(cluster, topic, 40)
    offsets_everywhere(cluster, "billing", topic, {0: ends[0], 1: 2})
    store = ServerStore([s.client for s in cluster])
    try:
        table = jobs.lag(store, "billing", [topic])
    finally:
        store.close()
    by_queue = {row[1]: row for row in table.rows}
    assert by_queue[0][2:5] == (ends[0], ends[0], 0)
    assert by_queue[0][5] is None  # nothing unconsumed, no age
    assert by_queue[1][2:5] == (ends[1], 2, ends[1] - 2)
    assert by_queue[2][2:5] == (ends[2], None, ends[2])  # nothing committed: all of it
    assert all(row[5] is not None and 0 <= row[5] < 600 for row in table.rows if row[4])
    servers = ",".join(s.client for s in cluster)
    chart = tmp_path / "lag.png"
    argv = ["analytics", "lag", "--servers", servers, "--group", "billing", "--topics", topic]
    assert cli.main([*argv, "--json", "--chart", str(chart)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["lag"] for r in doc["rows"]] == [row[4] for row in table.rows]
    assert chart.read_bytes().startswith(b"\x89PNG")
    bad = ["analytics", "lag", "--servers", servers, "--group", "g", "--topics", "nope"]
    assert cli.main(bad) == 2
    assert "unknown topic(s) 'nope'" in capsys.readouterr().err


def test_export_from_the_servers_is_incremental(
    cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = fresh_topic("exp")
    servers = ",".join(s.client for s in cluster)
    argv = [
        "export",
        "--servers",
        servers,
        "--to",
        str(tmp_path / "e"),
        "--topics",
        topic,
        "--json",
    ]
    with cluster.client() as client:
        first = put(client, topic, 30)
        dispatched_everywhere(cluster, topic, 30)
        assert cli.main(argv) == 0
        assert json.loads(capsys.readouterr().out)["messages"] == 30
        second = put(client, topic, 12, start=30)
    dispatched_everywhere(cluster, topic, 42)
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["messages"] == 12
    table = pq.read_table(tmp_path / "e", partitioning="hive")
    assert sorted(table.column("msg_id").to_pylist()) == sorted(r.msg_id for r in first + second)


def test_client_scan_and_store_agree_on_every_byte(cluster: LocalCluster) -> None:
    """The reference the Spark tests use: ReadRange plus the canonical decoder."""
    topic = fresh_topic("scan")
    with cluster.client() as client:
        put(client, topic, 50)
    dispatched_everywhere(cluster, topic, 50)
    with cluster.client() as client:
        scanned = {
            m.physical_offset: zlib.crc32(m.body) for m in client_scan(client) if m.topic == topic
        }
    store = ServerStore([s.client for s in cluster])
    try:
        read = {}
        for q in store.queues(topic):
            for b in store.read(topic, q.queue_id, 0, q.max_offset, ["commitlog_offset", "body"]):
                for off, body in zip(b.column(0).to_pylist(), b.column(1).to_pylist(), strict=True):
                    read[off] = zlib.crc32(body)
    finally:
        store.close()
    assert read == scanned and len(read) == 50


def client_scan(client: Client) -> list[Any]:
    """Every committed message of the log, via ReadRange and `decode_message`."""
    out = []
    offset = 0
    while True:
        r = client.read_range(offset, max_messages=4096)
        raw = r.messages
        pos = 0
        while pos < len(raw):
            size = int.from_bytes(raw[pos : pos + 4], "big")
            out.append(decode_message(raw[pos : pos + size]))
            pos += size
        if r.next_offset == offset or (not raw and r.next_offset >= r.committed_offset):
            return out
        offset = r.next_offset
