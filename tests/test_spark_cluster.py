"""The `dledger` Spark source over running clusters: it reads committed data, and only that.

Shares the one Spark session of test_spark.py (its `spark` fixture, session scoped).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import ClientError, MessageSpec, NodeStatus
from store.message import StoredMessage
from tests.conftest import leader_cut_off, wait_until
from tests.test_analytics_codec import expected_row
from tests.test_analytics_offline import key, plain
from tests.test_analytics_server import client_scan, dispatched_everywhere, fresh_topic
from tests.test_spark import spark

pytestmark = pytest.mark.slow
assert spark


def read(spark: SparkSession, servers: list[str], topics: str, **options: str) -> DataFrame:
    reader = spark.read.format("dledger").option("servers", ",".join(servers))
    for name, value in {"topics": topics, **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def specs(topic: str, count: int, start: int = 0) -> list[MessageSpec]:
    return [
        MessageSpec(
            topic,
            f"{topic} body {k}".encode() * (1 + k % 4),
            keys=[f"key{k % 5}", f"id{k}"],
            tags="even" if k % 2 == 0 else None,
            properties={"seq": str(k)},
        )
        for k in range(start, start + count)
    ]


def scanned_rows(cluster: LocalCluster, topics: set[str]) -> list[dict[str, Any]]:
    """The committed messages of `topics` by a client scan (ReadRange + the canonical codec)."""
    with cluster.client() as client:
        msgs: list[StoredMessage] = [m for m in client_scan(client) if m.topic in topics]
    return [expected_row(m) for m in msgs]


def test_batch_rows_counts_and_checksums_equal_a_client_scan(
    spark: SparkSession, cluster: LocalCluster
) -> None:
    topics = {fresh_topic("a"), fresh_topic("b")}
    with cluster.client() as client:
        for t in sorted(topics):
            client.put_batch(specs(t, 150))
    for t in topics:
        dispatched_everywhere(cluster, t, 150)
    want = scanned_rows(cluster, topics)
    assert len(want) == 300
    servers = [s.client for s in cluster]
    for how in (
        {},  # this host: a replica's files, below the ends it reports
        {"localReads": "false", "partitioning": "log"},  # ReadUnits + ReadLog
        {"localReads": "false", "partitioning": "queue"},  # Pull
    ):
        df = read(spark, servers, ",".join(sorted(topics)), minPartitions="5", **how)
        got = plain(r.asDict(recursive=True) for r in df.collect())
        assert sorted(got, key=key) == sorted(want, key=key), how
    df = read(spark, servers, ",".join(sorted(topics)), minPartitions="5")
    sums = df.groupBy("topic").agg(
        F.count(F.lit(1)).alias("n"), F.sum(F.crc32("body")).alias("crc")
    )
    expected: dict[str, tuple[int, int]] = {}
    for r in want:
        n, crc = expected.get(r["topic"], (0, 0))
        expected[r["topic"]] = (n + 1, crc + zlib.crc32(r["body"]))
    assert {r["topic"]: (r["n"], r["crc"]) for r in sums.collect()} == expected


def test_a_node_cut_off_from_its_quorum_contributes_no_uncommitted_rows(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = make_cluster()
    topic = fresh_topic("cut")
    with cluster.client() as client:
        committed = client.put_batch(specs(topic, 60))
    dispatched_everywhere(cluster, topic, 60)
    with leader_cut_off(cluster, specs(topic, 25, start=1000)) as leader:
        # The old leader appends the puts but cannot commit them, and soon steps down:
        # a node cut off from the others, holding uncommitted entries in its log.
        st = wait_until(
            lambda: cluster.statuses()[leader],
            15,
            f"node {leader} to hold uncommitted entries and step down",
            ok=lambda s: (
                isinstance(s, NodeStatus)
                and s.last_index > s.committed_index
                and s.role != "leader"
            ),
        )
        assert isinstance(st, NodeStatus)
        df = read(spark, [cluster.specs[leader].client], topic)
        got = {r["msg_id"] for r in df.select("msg_id").collect()}
        assert got == {r.msg_id for r in committed}
        after = cluster.statuses()[leader]
        assert isinstance(after, NodeStatus) and after.committed_index == st.committed_index


def test_stream_stopped_and_restarted_over_a_growing_log_yields_each_message_once(
    spark: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    topic = fresh_topic("stream")
    servers = [s.client for s in cluster]
    with cluster.client() as client:
        acked = client.put_batch(specs(topic, 100))
    dispatched_everywhere(cluster, topic, 100)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    writing = threading.Event()
    more: list[Any] = []

    def writer() -> None:
        with cluster.client() as client:
            for k in range(10):
                more.extend(client.put_batch(specs(topic, 15, start=100 + 15 * k)))
                writing.set()

    with _query(spark, servers, topic, sink, checkpoint, available_now=False) as query:
        t = threading.Thread(target=writer)
        t.start()
        wait_until(lambda: query.recentProgress, 60, "a first micro-batch", ok=_has_rows)
        assert writing.wait(30)
    # Stopped while the log grows; the rest of the writes land while no query runs.
    t.join(60)
    assert len(more) == 150
    dispatched_everywhere(cluster, topic, 250)
    with _query(spark, servers, topic, sink, checkpoint, available_now=True) as query:
        assert query.awaitTermination(120)
        assert query.exception() is None
    got = spark.read.parquet(str(sink)).select("msg_id", "queue_id", "queue_offset").collect()
    assert len(got) == len({r["msg_id"] for r in got})  # exactly once
    assert {r["msg_id"] for r in got} == {r.msg_id for r in acked + more}
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) < 250  # the restart read only what the first run had not
    assert max(sizes) <= 90 and len(sizes) >= 2  # availableNow, still rate-limited


def _has_rows(progress: list[Any]) -> bool:
    return any(p["numInputRows"] for p in progress)


@contextlib.contextmanager
def _query(
    spark: SparkSession,
    servers: list[str],
    topic: str,
    sink: Path,
    checkpoint: Path,
    available_now: bool,
) -> Iterator[StreamingQuery]:
    writer = (
        spark.readStream.format("dledger")
        .option("servers", ",".join(servers))
        .option("topics", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "90")
        .load()
        .select("msg_id", "queue_id", "queue_offset", "body")
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
    )
    trigger = {"availableNow": True} if available_now else {"processingTime": "200 milliseconds"}
    query = writer.trigger(**trigger).start()
    try:
        yield query
    finally:
        query.stop()


def test_a_stopped_node_read_offline_equals_the_servers(
    spark: SparkSession, cluster: LocalCluster
) -> None:
    topic = fresh_topic("offline")
    with cluster.client() as client:
        client.put_batch(specs(topic, 120))
    dispatched_everywhere(cluster, topic, 120)
    node = max(s.id for s in cluster)
    online = read(spark, [s.client for s in cluster], topic).collect()
    cluster.stop(node)
    try:
        offline = (
            spark.read.format("dledger")
            .option("path", cluster.specs[node].data_dir)
            .option("topics", topic)
            .load()
            .collect()
        )
    finally:
        cluster.start(node)
    a = plain(r.asDict(recursive=True) for r in online)
    b = plain(r.asDict(recursive=True) for r in offline)
    assert len(a) == 120
    assert sorted(a, key=key) == sorted(b, key=key)
    assert json.dumps(sorted(r["msg_id"] for r in a)) == json.dumps(sorted(r["msg_id"] for r in b))


def test_filters_and_timestamps_over_the_servers(
    spark: SparkSession, cluster: LocalCluster
) -> None:
    topic, other = fresh_topic("flt"), fresh_topic("flt")
    with cluster.client() as client:
        first = client.put_batch(specs(topic, 80) + specs(other, 40))
        wait_until(
            time.time,
            5,
            "the clock to move on",
            ok=lambda t: t * 1000 > first[-1].store_timestamp_ms + 5,
        )
        later = client.put_batch(specs(topic, 60, start=80))
    dispatched_everywhere(cluster, topic, 140)
    dispatched_everywhere(cluster, other, 40)
    servers = [s.client for s in cluster]
    since = later[0].store_timestamp_ms
    for local in ("true", "false"):
        reader = spark.read.format("dledger").option("servers", ",".join(servers))
        df = reader.option("localReads", local).load()
        iso = dt.datetime.fromtimestamp(since / 1000, dt.UTC).isoformat()
        got = df.where(f"topic = '{topic}' AND store_timestamp >= '{iso}'").select("msg_id")
        assert {r["msg_id"] for r in got.collect()} == {r.msg_id for r in later}, local
        # `other` has nothing that late: its end (not an error, with strategy latest).
        stamped = read(
            spark,
            servers,
            f"{topic},{other}",
            startingTimestamp=str(since),
            startingOffsetsByTimestampStrategy="latest",
            localReads=local,
        ).select("msg_id")
        assert {r["msg_id"] for r in stamped.collect()} == {r.msg_id for r in later}, local


_DRIVER = """
import sys
from analytics.session import local_session

servers, topic, sink, checkpoint = sys.argv[1:5]
spark = local_session("local[2]", shuffle_partitions=2)
query = (
    spark.readStream.format("dledger").option("servers", servers).option("topics", topic)
    .option("localReads", "false")  # over gRPC (ReadUnits + ReadLog): failed over on a kill
    .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "40").load()
    .select("msg_id", "queue_id", "queue_offset")
    .writeStream.format("parquet").option("path", sink)
    .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds")
    .start()
)
query.awaitTermination()
"""


def test_a_stream_is_exactly_once_across_a_leader_kill_and_a_driver_kill(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """A driver process streams a topic to Parquet while a writer puts; the leader is
    killed, then the driver (kill -9, JVM and all) mid-stream; a new driver resumes from
    the checkpoint: every committed message lands exactly once."""
    cluster = make_cluster("eo")
    topic = fresh_topic("eo")
    servers = ",".join(s.client for s in cluster)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    with cluster.client() as client:
        acked: list[Any] = client.put_batch(specs(topic, 200))
    stop = threading.Event()

    def writer() -> None:  # 10 messages every 50 ms, at most 600
        with cluster.client(timeout_s=30) as client:
            for k in range(200, 800, 10):
                if stop.wait(0.05):
                    return
                with contextlib.suppress(ClientError):  # outcome unknown across the kill
                    acked.extend(client.put_batch(specs(topic, 10, start=k)))

    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    args = [sys.executable, str(script), servers, topic, str(sink), str(checkpoint)]
    driver_log = tmp_path / "driver.log"
    with driver_log.open("wb") as out:
        driver = subprocess.Popen(
            args, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )
    t = threading.Thread(target=writer)
    commits = checkpoint / "commits"

    def batches() -> int:
        if driver.poll() is not None:  # it died at start-up: say why, now
            tail = driver_log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"the driver exited with {driver.returncode}:\n{tail}")
        return len(_files(commits))

    try:
        wait_until(batches, 180, "the driver's first micro-batches", ok=lambda n: n >= 2)
        t.start()
        cluster.kill(cluster.leader_id())
        cluster.wait_for_leader(timeout_s=30)
        done = len(_files(commits))
        wait_until(batches, 120, "micro-batches after the leader kill", ok=lambda n: n >= done + 2)
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, mid-stream
        driver.wait(30)
    finally:
        stop.set()
        if t.is_alive():
            t.join(60)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
    for spec in cluster:
        if not cluster.is_running(spec.id):
            cluster.start(spec.id)
    with cluster.client() as client:
        committed = [expected_row(m)["msg_id"] for m in client_scan(client) if m.topic == topic]
    assert {r.msg_id for r in acked} <= set(committed)
    dispatched_everywhere(cluster, topic, len(committed))
    resumed = (
        spark.readStream.format("dledger")
        .option("servers", servers)
        .option("topics", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "300")
        .load()
        .select("msg_id", "queue_id", "queue_offset")
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert resumed.awaitTermination(180)
        assert resumed.exception() is None
    finally:
        resumed.stop()  # a failed wait must not leave it running in the shared session
    got = [r["msg_id"] for r in spark.read.parquet(str(sink)).collect()]
    assert len(got) == len(set(got))  # exactly once
    assert set(got) == set(committed)  # every committed message


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.isdigit()] if directory.is_dir() else []
