"""The `dledger` Spark source, batch and streaming, the export read natively, and the jobs.

One local Spark session (local[2]) serves every test here. These tests read
node data directories written by `SyntheticNode` (offline mode); the tests
against a running cluster are in test_spark_cluster.py and share this session.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import analytics.commands  # registers `dledger analytics ...`
from analytics import jobs
from analytics.export import export
from analytics.file_store import OfflineStore
from analytics.session import PUSHDOWN_CONF, local_session
from dledger_commitlog.cli import main as cli
from tests.conftest import wait_until
from tests.test_analytics_offline import SyntheticNode, key, plain

pytestmark = pytest.mark.slow
BASE_MS = 1_700_000_000_000  # SyntheticNode's first store timestamp; one message a second
assert analytics.commands


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one Spark session of the test run (shared with test_spark_cluster.py)."""
    session = local_session(
        "local[2]",
        shuffle_partitions=2,
        extra={"spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SyntheticNode:
    n = SyntheticNode(tmp_path_factory.mktemp("spark") / "node", segment_bytes=1 << 15)
    n.append(600, topics=("orders", "pay", "audit"))
    return n


def source(spark: SparkSession, node: SyntheticNode, **options: str) -> DataFrame:
    reader = spark.read.format("dledger").option("path", str(node.root))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def end_offset(query: StreamingQuery) -> dict[str, dict[str, int]]:
    progress = query.lastProgress
    assert progress is not None
    doc: dict[str, dict[str, int]] = json.loads(progress["sources"][0]["endOffset"])
    return doc


def error_of(df: DataFrame) -> str:
    with pytest.raises(Exception) as info:
        df.collect()
    return str(info.value)


def test_batch_read_returns_exactly_the_stored_messages(
    spark: SparkSession, node: SyntheticNode
) -> None:
    df = source(spark, node, messagesPerPartition="60", partitioning="queue")
    assert df.rdd.getNumPartitions() == 12  # 6 queues of 100 messages, pieces of 60
    got = plain(r.asDict(recursive=True) for r in df.collect())
    assert sorted(got, key=key) == sorted(node.rows, key=key)
    # By commit-log range (the default for files): one pass over the log per partition,
    # here cut in 5 (pieces spanning several of its 32 KiB data segments).
    df = source(spark, node, minPartitions="5")
    assert df.rdd.getNumPartitions() == 5
    got = plain(r.asDict(recursive=True) for r in df.collect())
    assert sorted(got, key=key) == sorted(node.rows, key=key)


def test_topics_offsets_and_a_narrow_schema(spark: SparkSession, node: SyntheticNode) -> None:
    df = (
        spark.read.format("dledger")
        .schema("queue_id int, queue_offset bigint, body_size int")
        .option("path", str(node.root))
        .option("topics", "pay")
        .option("startingOffsets", json.dumps({"pay": {"0": 90, "1": -2}}))
        .option("endingOffsets", json.dumps({"pay": {"1": 3}}))
        .load()
    )
    assert df.columns == ["queue_id", "queue_offset", "body_size"]
    got = sorted(tuple(r) for r in df.collect())
    want = sorted(
        (r["queue_id"], r["queue_offset"], r["body_size"])
        for r in node.rows
        if r["topic"] == "pay"
        and (r["queue_offset"] >= 90 if r["queue_id"] == 0 else r["queue_offset"] < 3)
    )
    assert got == want and len(got) == 13


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "orders,nope"}, "unknown topic(s) 'nope'"),
        ({"startingOffsets": '{"orders": {"0": }'}, 'startingOffsets: \'{"orders"'),
        ({"colour": "blue"}, "unknown option(s) colour"),
        ({"startingTimestamp": "yesterday"}, "startingTimestamp: 'yesterday' is not a number"),
        ({"endingTimestamp": "-5"}, "endingTimestamp: -5 is negative"),
        ({"endingOffsetsByTimestamp": '{"pay": {"0": "x"}}'}, "must be an integer >= 0"),
        ({"subscribePattern": "or(ders"}, "subscribePattern: 'or(ders' is not a regular"),
        ({"topics": "pay", "assign": '{"pay": [0]}'}, "give at most one of topics, assign"),
        ({"assign": '{"pay": [7]}'}, "assign: pay has no queue(s) [7]"),
        ({"assign": "[1]"}, "assign: the JSON must be a non-empty object"),
        ({"partitioning": "random"}, "partitioning: 'random' is not one of auto, log, queue"),
        ({"columns": "topic,colour"}, "columns: colour"),
        ({"maxTriggerDelay": "5m"}, "maxTriggerDelay is for streaming queries"),
        (
            {"startingTimestamp": str(BASE_MS + 10**9)},
            f"startingTimestamp: no message of audit/0 was stored at or after {BASE_MS + 10**9}",
        ),
    ],
)
def test_bad_options_fail_with_a_clear_message(
    spark: SparkSession, node: SyntheticNode, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception) as info:  # when loading (the schema) or reading
        source(spark, node, **options).collect()
    text = str(info.value)
    assert "analytics.errors.OptionError" in text
    assert message in text


def test_timestamps_stand_for_offsets(spark: SparkSession, node: SyntheticNode) -> None:
    start, end = BASE_MS + 1000 * 100, BASE_MS + 1000 * 400
    df = source(spark, node, startingTimestamp=str(start), endingTimestamp=str(end))
    got = sorted(key(r) for r in plain(r.asDict() for r in df.collect()))
    assert got == sorted(key(r) for r in node.rows if start <= r["store_timestamp_ms"] < end)
    assert len(got) == 300
    # Per queue; queues left out start at earliest and end at latest.
    df = source(
        spark,
        node,
        topics="pay",
        startingOffsetsByTimestamp=json.dumps({"pay": {"1": start}}),
        endingOffsetsByTimestamp=json.dumps({"pay": {"0": end}}),
    )
    got = sorted(key(r) for r in plain(r.asDict() for r in df.collect()))
    want = [
        r
        for r in node.rows
        if r["topic"] == "pay"
        and (
            r["store_timestamp_ms"] >= start
            if r["queue_id"] == 1
            else r["store_timestamp_ms"] < end
        )
    ]
    assert got == sorted(key(r) for r in want)
    # A starting timestamp after every message: an error (as Kafka), or the end.
    late = str(BASE_MS + 10**9)
    assert (
        source(
            spark, node, startingTimestamp=late, startingOffsetsByTimestampStrategy="latest"
        ).count()
        == 0
    )
    # A stream starts there too.
    query = (
        spark.readStream.format("dledger")
        .option("path", str(node.root))
        .option("startingTimestamp", str(start))
        .load()
        .select("msg_id")
        .writeStream.format("memory")
        .queryName("from_timestamp")
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120) and query.exception() is None
    finally:
        query.stop()  # a failed wait must not leave it running in the shared session
    since = {r["msg_id"] for r in node.rows if r["store_timestamp_ms"] >= start}
    assert {r["msg_id"] for r in spark.table("from_timestamp").collect()} == since


def test_a_pattern_or_an_assignment_chooses_the_queues(
    spark: SparkSession, node: SyntheticNode
) -> None:
    df = source(spark, node, subscribePattern="or.*|aud.t")
    assert {r["topic"] for r in df.select("topic").distinct().collect()} == {"orders", "audit"}
    assert df.count() == 400
    df = source(
        spark, node, assign=json.dumps({"pay": [1], "audit": [0]}), columns="topic,queue_id"
    )
    assert df.columns == ["topic", "queue_id"]
    got = Counter((r["topic"], r["queue_id"]) for r in df.collect())
    assert got == {("pay", 1): 100, ("audit", 0): 100}


def test_filters_narrow_the_read_and_the_rows_are_exact(
    spark: SparkSession, node: SyntheticNode
) -> None:
    since = dt.datetime.fromtimestamp((BASE_MS + 1000 * 250) / 1000, dt.UTC)
    where = (
        "topic IN ('orders', 'audit') AND queue_id = 1 AND queue_offset < 80 "
        f"AND store_timestamp >= '{since.strftime('%Y-%m-%d %H:%M:%S')}'"
    )
    df = source(spark, node).where(where)
    got = sorted(key(r) for r in plain(r.asDict() for r in df.collect()))
    want = sorted(
        key(r)
        for r in node.rows
        if r["topic"] in ("orders", "audit")
        and r["queue_id"] == 1
        and r["queue_offset"] < 80
        and r["store_timestamp_ms"] >= BASE_MS + 1000 * 250
    )
    assert got == want and 0 < len(got) < 100
    # Spark handed topic, queue_id and queue_offset to the source (they are gone from its
    # own filter); store_timestamp, which the source widens, Spark checks again.
    plan = df._jdf.queryExecution().executedPlan().toString()
    spark_filter = next(line for line in plan.splitlines() if "Filter" in line)
    assert "store_timestamp" in spark_filter
    assert "topic" not in spark_filter and "queue_offset" not in spark_filter, spark_filter
    # With Python filter pushdown off (a session `register` did not set up), the same
    # answer: Spark filters everything itself (and does not refuse the source).
    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        again = source(spark, node).where(where)
        plan = again._jdf.queryExecution().executedPlan().toString()
        assert "topic" in next(line for line in plan.splitlines() if "Filter" in line)
        assert sorted(key(r) for r in plain(r.asDict() for r in again.collect())) == want
    finally:
        spark.conf.set(PUSHDOWN_CONF, "true")


def test_the_columns_option_is_the_schema(spark: SparkSession, node: SyntheticNode) -> None:
    df = source(spark, node, columns="topic,body_size")
    assert df.columns == ["topic", "body_size"]
    assert df.count() == 600
    with pytest.raises(Exception, match="`body` cannot be resolved"):
        source(spark, node, columns="topic").select("body")


def test_min_offsets_per_trigger_waits_until_max_trigger_delay(
    spark: SparkSession, tmp_path: Path
) -> None:
    """100 messages, at least 150 a batch: nothing until maxTriggerDelay (2 s) passes."""
    n = SyntheticNode(tmp_path / "node", segment_bytes=1 << 15)
    n.append(100)
    started = time.time()
    query = (
        spark.readStream.format("dledger")
        .option("path", str(n.root))
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "150")
        .option("maxTriggerDelay", "2s")
        .load()
        .select("msg_id")
        .writeStream.format("memory")
        .queryName("min_trigger")
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        progress = wait_until(
            lambda: [p for p in query.recentProgress if p["numInputRows"]],
            60,
            "a micro-batch with rows",
        )
    finally:
        query.stop()
    first = dt.datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00"))
    assert first.timestamp() - started >= 1.8, (first, started)
    assert progress[0]["numInputRows"] == 100
    assert spark.table("min_trigger").count() == 100


def test_a_schema_outside_the_source_is_refused(spark: SparkSession, node: SyntheticNode) -> None:
    reader = spark.read.format("dledger").option("path", str(node.root))
    assert "'colour' is not a column" in error_of(reader.schema("colour string").load())
    assert "column body_size is int, not string" in error_of(
        reader.schema("body_size string").load()
    )


def test_an_empty_range_reads_nothing(spark: SparkSession, node: SyntheticNode) -> None:
    everything_read = json.dumps({"audit": {"0": 100, "1": 100}})
    df = source(spark, node, topics="audit", startingOffsets=everything_read)
    assert df.count() == 0


def test_stream_restarted_over_a_growing_log_sees_each_message_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    n = SyntheticNode(tmp_path / "node", segment_bytes=1 << 15)
    n.append(100)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def start(available_now: bool) -> StreamingQuery:
        writer = (
            spark.readStream.format("dledger")
            .option("path", str(n.root))
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "60")
            .load()
            .select("topic", "queue_id", "queue_offset", "msg_id", "body")
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
        )
        if available_now:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime="0 seconds").start()

    # A running query, rate-limited: micro-batches of at most 60, then stopped.
    query = start(available_now=False)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 100 and max(sizes) <= 60 and len(sizes) >= 2
    assert end_offset(query) == {"orders": {"0": 25, "1": 25}, "pay": {"0": 25, "1": 25}}
    # The log grows (and a topic appears) while no query runs; the restart resumes.
    n.append(90, topics=("orders", "pay", "audit"))
    query = start(available_now=True)
    assert query.awaitTermination(120)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [60, 30]  # availableNow: up to where the log ended at start, rate-limited
    end = end_offset(query)
    assert end["audit"] == {"0": 15, "1": 15}
    got = spark.read.parquet(str(sink)).collect()
    assert len(got) == len({r["msg_id"] for r in got}) == 190
    want = sorted(
        (r["topic"], r["queue_id"], r["queue_offset"], r["msg_id"], r["body"]) for r in n.rows
    )
    assert sorted(tuple(r) for r in got) == want


def test_the_export_reads_natively_as_the_same_rows(
    spark: SparkSession, node: SyntheticNode, tmp_path: Path
) -> None:
    export(OfflineStore(node.root), tmp_path / "export")
    native = spark.read.parquet(str(tmp_path / "export"))
    assert {"topic", "date"} <= set(native.columns)
    assert dict(native.groupBy("topic").count().collect()) == dict(
        source(spark, node).groupBy("topic").count().collect()
    )
    sample = native.drop("date").filter("queue_offset < 3").collect()
    got = plain(r.asDict(recursive=True) for r in sample)
    want = [r for r in node.rows if r["queue_offset"] < 3]
    assert sorted(got, key=key) == sorted(want, key=key)


# ---------------------------------------------------------------- jobs


def job_frame(spark: SparkSession, node: SyntheticNode) -> DataFrame:
    return jobs.read(spark, path=str(node.root))


def test_rate_per_topic_per_minute(spark: SparkSession, node: SyntheticNode) -> None:
    table = jobs.rate(job_frame(spark, node))
    want: Counter[tuple[str, str]] = Counter()
    size: Counter[tuple[str, str]] = Counter()
    for r in node.rows:
        minute = dt.datetime.fromtimestamp(r["store_timestamp_ms"] // 60_000 * 60, dt.UTC)
        k = (minute.strftime("%Y-%m-%d %H:%M"), r["topic"])
        want[k] += 1
        size[k] += r["body_size"]
    assert {(m, t): (n, b) for m, t, n, b in table.rows} == {k: (want[k], size[k]) for k in want}
    assert [r[0] for r in table.rows] == sorted(r[0] for r in table.rows)


def test_top_keys_per_topic(spark: SparkSession, node: SyntheticNode) -> None:
    table = jobs.top_keys(job_frame(spark, node), limit=3)
    counts: dict[str, Counter[str]] = {}
    for r in node.rows:
        counts.setdefault(r["topic"], Counter()).update(r["keys"])
    want = []
    for topic in sorted(counts):
        ranked = sorted(counts[topic].items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        want += [(topic, i + 1, k, n) for i, (k, n) in enumerate(ranked)]
    assert table.rows == want


def test_size_percentiles_per_topic(spark: SparkSession, node: SyntheticNode) -> None:
    import numpy as np

    table = jobs.sizes(job_frame(spark, node))
    for topic, n, lo, p50, p90, p99, hi in table.rows:
        sizes = [r["body_size"] for r in node.rows if r["topic"] == topic]
        assert (n, lo, hi) == (len(sizes), min(sizes), max(sizes))
        assert [p50, p90, p99] == [round(float(np.percentile(sizes, q)), 1) for q in (50, 90, 99)]


def test_analytics_command_prints_a_table_and_draws_a_chart(
    spark: SparkSession,
    node: SyntheticNode,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chart = tmp_path / "sizes.png"
    argv = ["analytics", "sizes", "--path", str(node.root), "--chart", str(chart), "--json"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["topic"] for r in doc["rows"]] == ["audit", "orders", "pay"]
    assert doc["rows"][0]["messages"] == 200
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert spark.sparkContext._jsc is not None  # the shared session survived the command
    assert cli.main(["analytics", "rate", "--path", str(node.root), "--topics", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown topic(s) 'nope'" in err and "Traceback" not in err
    assert err.count("\n") == 1
