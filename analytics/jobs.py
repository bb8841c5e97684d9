"""Ready-made analytics over the committed log: each returns a `Table`, which can be charted.

- `rate`: messages and body bytes per topic per minute (of store time, UTC);
- `top_keys`: the most frequent message keys per topic;
- `sizes`: body-size percentiles per topic;
- `lag`: per queue of a consumer group, how many committed messages it has not
  consumed, and how old the oldest of them is (from the servers, no Spark).

The Spark jobs take a DataFrame of the `dledger` source (or of an export read
from Parquet): `read(spark, ...)` builds one that decodes only the columns the
jobs use.

`rate_series` puts a rate table on a regular grid, every bucket from the first
to the last (an empty one as 0), coarser for longer spans: what the rate chart
draws (`analytics.charts` draws every table). Times are UTC throughout,
computed from epoch values, never from the session's or this host's time zone.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from analytics.errors import OptionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from analytics.sources import GroupOffset, QueueInfo

JOB_COLUMNS = "topic string, keys array<string>, store_timestamp timestamp, body_size int"
PERCENTILES = (0.5, 0.9, 0.99)
RATE_BUCKET_S = 60  # the rate table's bucket: a minute of store time
MINUTE_FORMAT = "%Y-%m-%d %H:%M"
MAX_CHART_BUCKETS = 720  # a rate chart over a longer span is drawn in coarser buckets
# Chart buckets (s), all whole minutes: a minute row never straddles two of them.
CHART_BUCKETS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 604800)
UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    chart: str  # "lines" (x, series, y), "bars" (label, value)
    notes: Mapping[str, Any] = field(default_factory=dict)  # what a chart needs beyond the rows

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.headers, row, strict=True)) for row in self.rows]


class LagStore(Protocol):
    """What `lag` reads: `server_store.ServerStore`."""

    def queues(self, topic: str = "") -> list[QueueInfo]: ...

    def group_offsets(self, group: str, topic: str) -> list[GroupOffset]: ...

    def read(
        self, topic: str, queue_id: int, start: int, end: int, columns: Sequence[str] = ...
    ) -> Iterator[pa.RecordBatch]: ...


def read(
    spark: SparkSession,
    *,
    servers: Sequence[str] = (),
    path: str | None = None,
    topics: Sequence[str] | None = None,
    schema: str = JOB_COLUMNS,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The committed data as a DataFrame; `options`: more of the source's (tlsCa, ...)."""
    reader = spark.read.format("dledger").schema(schema).options(**(options or {}))
    if path:
        reader = reader.option("path", path)
    else:
        reader = reader.option("servers", ",".join(servers))
    if topics:
        reader = reader.option("topics", ",".join(topics))
    return reader.load()


def rate(df: DataFrame) -> Table:
    """Rows (minute, topic, messages, bytes) of the minutes that have messages.

    `rate_series` puts them on a regular grid (empty minutes as 0), as the chart draws them.
    """
    from pyspark.sql import functions as F

    # Epoch seconds computed by Spark: independent of the session's and of Python's time zone.
    start_s = F.floor(F.unix_micros("store_timestamp") / (RATE_BUCKET_S * 1_000_000))
    rows = (
        df.groupBy("topic", (start_s * RATE_BUCKET_S).alias("minute_s"))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("body_size").alias("bytes"))
        .orderBy("minute_s", "topic")
        .collect()
    )
    out = [
        (_utc(r["minute_s"]).strftime(MINUTE_FORMAT), r["topic"], r["messages"], r["bytes"])
        for r in rows
    ]
    return Table(
        "messages and body bytes per topic per minute (UTC)",
        ("minute", "topic", "messages", "bytes"),
        out,
        "lines",
        {"bucket_s": RATE_BUCKET_S},
    )


def top_keys(df: DataFrame, limit: int = 10) -> Table:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if limit < 1:
        raise OptionError(f"--limit must be at least 1, not {limit}")
    counts = (
        df.select("topic", F.explode("keys").alias("key"))
        .groupBy("topic", "key")
        .agg(F.count(F.lit(1)).alias("messages"))
    )
    rank = Window.partitionBy("topic").orderBy(F.desc("messages"), F.asc("key"))
    rows = (
        counts.withColumn("rank", F.row_number().over(rank))
        .filter(F.col("rank") <= limit)
        .orderBy("topic", "rank")
        .collect()
    )
    out = [(r["topic"], r["rank"], r["key"], r["messages"]) for r in rows]
    return Table(f"top {limit} keys per topic", ("topic", "rank", "key", "messages"), out, "bars")


def sizes(df: DataFrame) -> Table:
    """Exact percentiles (linear interpolation between ranks, as numpy's default)."""
    from pyspark.sql import functions as F

    pct = [F.percentile("body_size", p).alias(f"p{round(p * 100)}") for p in PERCENTILES]
    rows = (
        df.groupBy("topic")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.min("body_size").alias("min"),
            *pct,
            F.max("body_size").alias("max"),
        )
        .orderBy("topic")
        .collect()
    )
    names = tuple(f"p{round(p * 100)}" for p in PERCENTILES)
    out = [
        (r["topic"], r["messages"], r["min"], *(round(float(r[n]), 1) for n in names), r["max"])
        for r in rows
    ]
    return Table(
        "message body size percentiles per topic (bytes)",
        ("topic", "messages", "min", *names, "max"),
        out,
        "bars",
    )


def lag(
    store: LagStore,
    group: str,
    topics: Sequence[str] | None = None,
    *,
    now_ms: int | None = None,
) -> Table:
    """Per queue: committed end, the group's offset, lag, the oldest unconsumed message's age.

    The age is `now_ms` (default: this host's clock when the job starts, in the title and
    in `notes["now"]`) minus the store timestamp of the message at the group's offset;
    `oldest_unconsumed_at` is that timestamp (UTC).
    """
    from analytics.offsets import select

    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    queues = select(store.queues(), tuple(topics) if topics else None)
    committed: dict[tuple[str, int], int] = {}
    for topic in sorted({q.topic for q in queues}):
        for g in store.group_offsets(group, topic):
            committed[(g.topic, g.queue_id)] = g.offset
    out = []
    for q in queues:
        offset = committed.get((q.topic, q.queue_id), -1)
        consumed_from = q.min_offset if offset < 0 else max(offset, q.min_offset)
        behind = max(0, q.max_offset - consumed_from)
        age_s: float | None = None
        stored_at: str | None = None
        if behind:
            batch = next(
                iter(
                    store.read(
                        q.topic, q.queue_id, consumed_from, consumed_from + 1, ["store_timestamp"]
                    )
                )
            )
            stored_us = batch.column(0).cast("int64")[0].as_py()
            age_s = round(max(0.0, now - stored_us / 1000) / 1000, 1)
            stored_at = _iso(stored_us)
        out.append(
            (
                q.topic,
                q.queue_id,
                q.max_offset,
                None if offset < 0 else offset,
                behind,
                age_s,
                stored_at,
            )
        )
    now_text = _iso(now * 1000)
    return Table(
        f"consumer group {group!r}: lag per queue at {now_text}",
        (
            "topic",
            "queue",
            "committed_end",
            "group_offset",
            "lag",
            "oldest_unconsumed_s",
            "oldest_unconsumed_at",
        ),
        out,
        "bars",
        {"group": group, "now": now_text, "now_ms": now},
    )


# ---------------------------------------------------------------- chart data


@dataclass(frozen=True, slots=True)
class RateSeries:
    """A rate table on a regular grid: every bucket from the first to the last, empty ones 0."""

    bucket_s: int
    starts: list[dt.datetime]  # UTC, one per bucket
    messages: dict[str, list[int]]  # per topic, per bucket
    body_bytes: dict[str, list[int]]

    @property
    def end(self) -> dt.datetime:
        """The end of the last bucket (the start of the first when there is none)."""
        if not self.starts:
            return _EPOCH
        return self.starts[-1] + dt.timedelta(seconds=self.bucket_s)

    @property
    def empty(self) -> list[bool]:
        """Per bucket: no message of any topic."""
        return [not any(c[i] for c in self.messages.values()) for i in range(len(self.starts))]

    def per_s(self, counts: Sequence[int]) -> list[float]:
        """Counts per bucket as a mean rate per second."""
        return [c / self.bucket_s for c in counts]


def rate_series(table: Table, max_buckets: int = MAX_CHART_BUCKETS) -> RateSeries:
    """The rows of `rate` on a grid of at most `max_buckets` (coarser buckets for long spans)."""
    base = int(table.notes.get("bucket_s", RATE_BUCKET_S))
    points = [(_epoch_s(r[0]), str(r[1]), int(r[2] or 0), int(r[3] or 0)) for r in table.rows]
    if not points:
        return RateSeries(base, [], {}, {})
    first = min(p[0] for p in points)
    last = max(p[0] for p in points) + base  # exclusive
    bucket = _chart_bucket(last - first, base, max_buckets)
    lo = first // bucket * bucket
    hi = -(-last // bucket) * bucket
    n = (hi - lo) // bucket
    topics = sorted({p[1] for p in points})
    messages = {t: [0] * n for t in topics}
    body_bytes = {t: [0] * n for t in topics}
    for t, topic, count, size in points:
        i = (t - lo) // bucket
        messages[topic][i] += count
        body_bytes[topic][i] += size
    starts = [_utc(lo + i * bucket) for i in range(n)]
    return RateSeries(bucket, starts, messages, body_bytes)


def _chart_bucket(span_s: int, base: int, max_buckets: int) -> int:
    for b in CHART_BUCKETS_S:
        if b >= base and b % base == 0 and math.ceil(span_s / b) + 1 <= max_buckets:
            return b
    week = CHART_BUCKETS_S[-1]
    return week * max(1, math.ceil(span_s / (week * max(1, max_buckets - 1))))


def _utc(epoch_s: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(seconds=epoch_s)


def _iso(epoch_us: int) -> str:
    """An instant as ISO 8601 UTC with milliseconds: 2024-01-02T03:04:05.678Z."""
    at = _EPOCH + dt.timedelta(microseconds=epoch_us)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _epoch_s(value: Any) -> int:
    """A rate row's minute (text of MINUTE_FORMAT, or a datetime; naive means UTC)."""
    at = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return math.floor((at - _EPOCH).total_seconds())
