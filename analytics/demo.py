"""The Spark step of `make run`: one query over the demo cluster's committed data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .session import local_session


class _Acked(Protocol):
    @property
    def msg_id(self) -> str: ...


QUERY = (
    'spark.read.format("dledger").option("servers", ...).option("topics", "orders").load()'
    '.groupBy("queue_id").agg(count, min/max queue_offset, sum body_size)'
)


def spark_summary(servers: Sequence[str], acked: Sequence[_Acked]) -> list[str]:
    """Lines to print: per-queue counts read by Spark, and whether every ack is among them."""
    from pyspark.sql import functions as F

    spark = local_session("local[2]", shuffle_partitions=2)
    try:
        df = (
            spark.read.format("dledger")
            .option("servers", ",".join(servers))
            .option("topics", "orders")
            .load()
        )
        rows = (
            df.groupBy("queue_id")
            .agg(
                F.count(F.lit(1)).alias("messages"),
                F.min("queue_offset").alias("first"),
                F.max("queue_offset").alias("last"),
                F.sum("body_size").alias("body_bytes"),
            )
            .orderBy("queue_id")
            .collect()
        )
        seen = {r["msg_id"] for r in df.select("msg_id").collect()}
    finally:
        spark.stop()
    total = sum(r["messages"] for r in rows)
    missing = [a.msg_id for a in acked if a.msg_id not in seen]
    lines = [f"Spark: {QUERY}"]
    lines += [
        f"  queue {r['queue_id']}: {r['messages']} messages, offsets {r['first']}..{r['last']}, "
        f"{r['body_bytes']} body bytes"
        for r in rows
    ]
    lines.append(
        f"Spark read {total} committed messages of 'orders'; every one of the {len(acked)} "
        f"acknowledged puts is among them: {not missing}"
    )
    if missing:
        raise SystemExit(f"[demo] Spark does not see {len(missing)} acknowledged messages")
    return lines
