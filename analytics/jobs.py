"""Ready-made analytics over the committed log: each returns a `Table`, which can also be a PNG.

- `rate`: messages and body bytes per topic per minute (of store time, UTC);
- `top_keys`: the most frequent message keys per topic;
- `sizes`: body-size percentiles per topic;
- `lag`: per queue of a consumer group, how many committed messages it has not
  consumed, and how old the oldest of them is (from the servers, no Spark).

The Spark jobs take a DataFrame of the `dledger` source (or of an export read
from Parquet): `read(spark, ...)` builds one that decodes only the columns the
jobs use.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import OptionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from .sources import ServerStore

JOB_COLUMNS = "topic string, keys array<string>, store_timestamp timestamp, body_size int"
PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    chart: str  # "lines" (x, series, y), "bars" (label, value)

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.headers, row, strict=True)) for row in self.rows]


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
    from pyspark.sql import functions as F

    rows = (
        df.groupBy("topic", F.window("store_timestamp", "1 minute").start.alias("minute"))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("body_size").alias("bytes"))
        .orderBy("minute", "topic")
        .collect()
    )
    out = [
        (r["minute"].strftime("%Y-%m-%d %H:%M"), r["topic"], r["messages"], r["bytes"])
        for r in rows
    ]
    return Table(
        "messages and body bytes per topic per minute (UTC)",
        ("minute", "topic", "messages", "bytes"),
        out,
        "lines",
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


def lag(store: ServerStore, group: str, topics: Sequence[str] | None = None) -> Table:
    """Per queue: committed end, the group's offset, lag, age of the oldest unconsumed message."""
    from . import plan

    queues = plan.select(store.queues(), tuple(topics) if topics else None)
    committed: dict[tuple[str, int], int] = {}
    for topic in sorted({q.topic for q in queues}):
        for g in store.group_offsets(group, topic):
            committed[(g.topic, g.queue_id)] = g.offset
    now_ms = time.time() * 1000
    out = []
    for q in queues:
        offset = committed.get((q.topic, q.queue_id), -1)
        consumed_from = q.min_offset if offset < 0 else max(offset, q.min_offset)
        behind = max(0, q.max_offset - consumed_from)
        age_s: float | None = None
        if behind:
            batch = next(
                iter(
                    store.read(
                        q.topic, q.queue_id, consumed_from, consumed_from + 1, ["store_timestamp"]
                    )
                )
            )
            stored_us = batch.column(0).cast("int64")[0].as_py()
            age_s = round(max(0.0, now_ms - stored_us / 1000) / 1000, 1)
        out.append(
            (q.topic, q.queue_id, q.max_offset, None if offset < 0 else offset, behind, age_s)
        )
    return Table(
        f"consumer group {group!r}: lag per queue",
        ("topic", "queue", "committed_end", "group_offset", "lag", "oldest_unconsumed_s"),
        out,
        "bars",
    )


def write_chart(table: Table, path: str | Path) -> Path:
    """Render `table` as a PNG at `path` (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    fig, ax = plt.subplots(figsize=(10, 5))
    try:
        if table.chart == "lines":  # (x, series, y, ...)
            series: dict[str, tuple[list[str], list[float]]] = {}
            for row in table.rows:
                xs, ys = series.setdefault(str(row[1]), ([], []))
                xs.append(str(row[0]))
                ys.append(float(row[2]))
            for name, (xs, ys) in sorted(series.items()):
                ax.plot(xs, ys, marker="o", label=name)
            ax.set_xlabel(table.headers[0])
            ax.set_ylabel(table.headers[2])
            ax.legend()
            ax.tick_params(axis="x", labelrotation=45)
        else:
            labels, values = _bars(table)
            ax.barh(labels, values)
            ax.invert_yaxis()
            ax.set_xlabel(_bar_value(table)[0])
        ax.set_title(table.title)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", dpi=100)
    finally:
        plt.close(fig)
    return out


def _bar_value(table: Table) -> tuple[str, int]:
    """The column a bar chart shows: lag, messages of a key, or the median size."""
    for name in ("lag", "p50", "messages"):
        if name in table.headers:
            return name, table.headers.index(name)
    return table.headers[-1], len(table.headers) - 1


def _bars(table: Table) -> tuple[list[str], list[float]]:
    _, k = _bar_value(table)
    labels, values = [], []
    for row in table.rows:
        if "key" in table.headers:
            label = f"{row[0]}: {row[table.headers.index('key')]}"
        elif "queue" in table.headers:
            label = f"{row[0]}/{row[1]}"
        else:
            label = str(row[0])
        value = row[k]
        labels.append(label)
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        values.append(0.0 if missing else float(value))
    return labels, values
