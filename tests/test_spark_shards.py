"""The `dledger` Spark source over a multi-shard cluster: every shard read, exactly once.

A topic of a three-shard cluster has queues in every data shard (the default route),
put through `RoutedClient`; Spark reads them all, each row naming its shard
(`shard`), in every read path (files, ReadUnits + ReadLog, Pull) and offline from
a stopped node's directory; a stream stays exactly-once while the leader of shard 2 is
killed and restarted. Shares the one Spark session of test_spark.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from analytics.stores import open_shards
from dledger_commitlog.cli.cluster_layout import shards_config
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, ClientError, NodeStatus, PutResult, RoutedClient
from dledger_commitlog.common.routes import shard_of_msg_id
from tests.conftest import wait_until
from tests.test_analytics_server import fresh_topic
from tests.test_spark import spark

pytestmark = pytest.mark.slow
assert spark

SHARDS = 3


def sharded_cluster(make_cluster: Callable[..., LocalCluster], name: str) -> LocalCluster:
    cluster = make_cluster(name, **shards_config(SHARDS))
    for g in range(1, SHARDS + 1):
        shard_leader(cluster, g)
    return cluster


def shard_leader(cluster: LocalCluster, shard: int, exclude: int = 0) -> int:
    """The node that leads `shard` (once one other than `exclude` does)."""
    with Client([s.client for s in cluster], shard=shard) as client:

        def leader() -> int:
            found = [s for s in client.status_all(timeout_s=1.0) if isinstance(s, NodeStatus)]
            leaders = [s.node_id for s in found if s.role == "leader"]
            return leaders[0] if len(leaders) == 1 and leaders[0] != exclude else 0

        return wait_until(leader, 30, f"a leader of shard {shard} (not node {exclude})")


def put_routed(client: RoutedClient, topic: str, first: int, count: int) -> list[PutResult]:
    return [
        client.put(topic, f"{topic} {k}".encode() * (1 + k % 3), keys=[f"id{k}"])
        for k in range(first, first + count)
    ]


def wait_dispatched(cluster: LocalCluster, topic: str, count: int) -> None:
    """Until every running node has dispatched `count` messages of `topic` over its shards."""
    for spec in cluster:
        if not cluster.is_running(spec.id):
            continue

        def total(address: str = spec.client) -> int:
            store = open_shards([address], timeout_s=5, local_reads=False)
            try:
                return sum(q.max_offset - q.min_offset for q in store.queues() if q.topic == topic)
            finally:
                store.close()

        wait_until(
            total, 30, f"node {spec.id} to dispatch {count} of {topic}", ok=lambda n: n >= count
        )


def read(spark: SparkSession, topic: str, **options: str) -> DataFrame:
    reader = spark.read.format("dledger").option("topics", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def placed(results: list[PutResult]) -> dict[str, tuple[int, int, int]]:
    """msg id -> (shard, queue id, queue offset) of acknowledged puts."""
    return {r.msg_id: (shard_of_msg_id(r.msg_id), r.queue_id, r.queue_offset) for r in results}


def test_a_batch_reads_every_shard_of_a_topic_exactly_once(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = sharded_cluster(make_cluster, "g3")
    topic, other = fresh_topic("grp"), fresh_topic("grp")
    servers = ",".join(s.client for s in cluster)
    with RoutedClient(servers.split(",")) as client:
        acked = put_routed(client, topic, 0, 150)
        put_routed(client, other, 0, 12)  # not read
        routes = client.routes()
    assert routes.shard_count == SHARDS
    want = placed(acked)
    assert {g for g, _, _ in want.values()} == {1, 2, 3}  # the topic spans every shard
    wait_dispatched(cluster, topic, 150)
    columns = "msg_id,shard,queue_id,queue_offset,body"
    for how in (
        {},  # this host: each shard's replica files
        {"localReads": "false", "partitioning": "log"},  # ReadUnits + ReadLog, per shard
        {"localReads": "false", "partitioning": "queue"},  # Pull, per shard
    ):
        df = read(spark, topic, servers=servers, columns=columns, minPartitions="4", **how)
        rows = df.collect()
        got = [r["msg_id"] for r in rows]
        assert len(got) == len(set(got)) == 150, how  # exactly once
        assert {
            r["msg_id"]: (r["shard"], r["queue_id"], r["queue_offset"]) for r in rows
        } == want, how
        assert df.rdd.getNumPartitions() >= SHARDS, how  # a partition never spans shards
    # The default schema is unchanged; shard is there when named (a metadata column).
    plain = read(spark, topic, servers=servers)
    assert "shard" not in plain.columns and plain.count() == 150
    typed = spark.read.format("dledger").schema("shard int, queue_id int")
    counts = typed.option("servers", servers).option("topics", topic).load()
    by_shard = {
        r["shard"]: r["n"]
        for r in counts.groupBy("shard").count().withColumnRenamed("count", "n").collect()
    }
    assert by_shard == {g: sum(1 for v in want.values() if v[0] == g) for g in (1, 2, 3)}
    # shard = / IN are pushed down (shards chosen before reading), and exact.
    two = read(spark, topic, servers=servers, columns="msg_id,shard").where("shard = 2")
    assert {r["msg_id"] for r in two.collect()} == {m for m, v in want.items() if v[0] == 2}
    # Offsets by shard and queue: start shard 2's queue 0 at its end, read the rest.
    end = max(o for g, q, o in want.values() if (g, q) == (2, 0)) + 1
    start = json.dumps({topic: {"2:0": end}})
    part = read(spark, topic, servers=servers, columns="msg_id", startingOffsets=start)
    assert {r["msg_id"] for r in part.collect()} == {
        m for m, (g, q, _) in want.items() if (g, q) != (2, 0)
    }
    # Offline: a stopped node's directory holds every shard (shard 1 at its root).
    node = max(s.id for s in cluster)
    cluster.stop(node)
    offline = read(spark, topic, path=cluster.specs[node].data_dir, columns=columns).collect()
    assert {r["msg_id"]: (r["shard"], r["queue_id"], r["queue_offset"]) for r in offline} == want
    assert len(offline) == 150


_STREAM_COLUMNS = "msg_id,shard,queue_id,queue_offset"


@contextlib.contextmanager
def _stream(
    spark: SparkSession, servers: str, topic: str, sink: Path, checkpoint: Path, now: bool
) -> Iterator[StreamingQuery]:
    writer = (
        spark.readStream.format("dledger")
        .option("servers", servers)
        .option("topics", topic)
        .option("columns", _STREAM_COLUMNS)
        .option("localReads", "false")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "60")
        .load()
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
    )
    trigger = {"availableNow": True} if now else {"processingTime": "200 milliseconds"}
    query = writer.trigger(**trigger).start()
    try:
        yield query
    finally:
        query.stop()  # a failed wait must not leave it running in the shared session


def test_a_stream_over_shards_is_exactly_once_across_a_shard_leader_kill(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """A stream reads a topic of three shards while a writer puts through RoutedClient;
    the node leading shard 2 is killed (SIGKILL), a new leader of shard 2 elected, the
    node restarted: every acknowledged put lands in the sink exactly once, and the sink
    holds exactly the committed messages; the checkpoint keys its offsets "G:Q"."""
    cluster = sharded_cluster(make_cluster, "g3eo")
    topic = fresh_topic("geo")
    servers = ",".join(s.client for s in cluster)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    with RoutedClient(servers.split(",")) as client:
        acked = put_routed(client, topic, 0, 90)
    stop = threading.Event()
    written = threading.Event()

    def writer() -> None:  # a put every 10 ms or so, across the shards, at most 900
        with RoutedClient(servers.split(","), timeout_s=30) as client:
            for k in range(90, 990):
                if stop.wait(0.01):
                    return
                with contextlib.suppress(ClientError):  # outcome unknown across the kill
                    acked.extend(put_routed(client, topic, k, 1))
                    written.set()

    t = threading.Thread(target=writer)
    commits = checkpoint / "commits"
    try:
        with _stream(spark, servers, topic, sink, checkpoint, now=False) as query:
            wait_until(
                lambda: len(_files(commits)), 120, "first micro-batches", ok=lambda n: n >= 2
            )
            t.start()
            assert written.wait(30)
            victim = shard_leader(cluster, 2)
            cluster.kill(victim)
            shard_leader(cluster, 2, exclude=victim)
            done = len(_files(commits))
            wait_until(
                lambda: len(_files(commits)),
                120,
                "micro-batches after the kill",
                ok=lambda n: n >= done + 3,
            )
            cluster.start(victim)
            for g in range(1, SHARDS + 1):
                shard_leader(cluster, g)
            done = len(_files(commits))
            wait_until(
                lambda: len(_files(commits)),
                120,
                "micro-batches after the restart",
                ok=lambda n: n >= done + 2,
            )
            assert query.exception() is None
    finally:
        stop.set()
        if t.is_alive():
            t.join(60)
    wait_dispatched(cluster, topic, len(acked))
    with _stream(spark, servers, topic, sink, checkpoint, now=True) as resumed:
        assert resumed.awaitTermination(180)
        assert resumed.exception() is None
    got = [r["msg_id"] for r in spark.read.parquet(str(sink)).collect()]
    assert len(got) == len(set(got))  # exactly once
    assert {r.msg_id for r in acked} <= set(got)  # every acknowledged put
    committed = read(spark, topic, servers=servers, columns="msg_id,shard").collect()
    assert set(got) == {r["msg_id"] for r in committed}  # nothing uncommitted
    assert all(shard_of_msg_id(r["msg_id"]) == r["shard"] for r in committed)
    last = max(_files(checkpoint / "offsets"), key=lambda p: int(p.name))
    offsets = json.loads(last.read_text().splitlines()[-1])
    assert {"1:0", "2:0", "3:0"} <= set(offsets[topic])  # one offset per shard and queue


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.isdigit()] if directory.is_dir() else []
