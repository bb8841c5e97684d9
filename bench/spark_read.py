"""Spark reading the commit log: the `dledger` source against the same rows in Parquet.

A local 3-node cluster (async flush, so that loading is quick; reads are the
same in either flush mode) is loaded with N committed 256-byte messages over 4
topics (4 queues each) by PutBatch. Then, in one local[2] Spark session, each
query is `groupBy("topic").count()`, timed after one warm-up run, best of 3:

- `dledger`, full schema: every column decoded, served by the 3 replicas (Pull);
- `dledger`, schema `topic string`: what a query that needs one column reads;
- `dledger` offline (`path`), both schemas: a stopped follower's data directory;
- Parquet: the same rows (written from the source, all columns), read natively,
  which prunes to the one column it needs.

The issue's target: the `dledger` source at >= 50% of the native Parquet rate.
Run: `.venv/bin/python bench/spark_read.py [--messages 2000000]`; writes
bench/results/spark_read.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.sources import ServerStore
from bench._report import report
from dledger_commitlog.client import AsyncClient, MessageSpec
from dledger_commitlog.cluster import LocalCluster

TOPICS = ("orders", "payments", "clicks", "audit")
BODY = bytes(range(256))
CONFIG = {
    "data_segment_bytes": 512 << 20,
    "index_segment_bytes": 32 << 20,
    "max_pending_puts": 100_000,
    "flush_interval_ms": 500,
}
BATCH = 2000
IN_FLIGHT = 4


async def load(servers: list[str], total: int) -> float:
    """Put `total` messages (round-robin over TOPICS) with PutBatch; returns msgs/s."""
    specs = [[MessageSpec(t, BODY, tags="t") for _ in range(BATCH // len(TOPICS))] for t in TOPICS]
    batch = [m for group in zip(*specs, strict=True) for m in group]
    todo = total // len(batch) + (1 if total % len(batch) else 0)
    async with AsyncClient(servers, timeout_s=60) as client:
        started = time.perf_counter()
        counter = iter(range(todo))

        async def worker() -> None:
            for k in counter:
                size = min(len(batch), total - k * len(batch))
                await client.put_batch(batch[:size])

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        return total / (time.perf_counter() - started)


def wait_dispatched(servers: list[str], total: int, timeout_s: float) -> None:
    """Every replica's consume queues hold all `total` messages (committed and dispatched)."""
    deadline = time.monotonic() + timeout_s
    for address in servers:
        store = ServerStore([address], timeout_s=10)
        try:
            while sum(q.max_offset - q.min_offset for q in store.queues()) < total:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{address} did not dispatch {total} messages in time")
                time.sleep(0.2)
        finally:
            store.close()


def timed(run: Callable[[], object], repeat: int = 3) -> tuple[float, list[float]]:
    """Best of `repeat` after a warm-up run (JVM and Python workers started)."""
    run()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return min(times), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.messages
    from analytics.session import local_session

    rows: list[tuple[str, str, str]] = []
    m: dict[str, float] = {"messages": n, "body_bytes": len(BODY)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with LocalCluster(root / "cluster", flush_mode="async", extra_config=CONFIG) as cluster:
            cluster.up()
            servers = [s.client for s in cluster]
            m["load_msgs_per_s"] = asyncio.run(load(servers, n))
            wait_dispatched(servers, n, timeout_s=600)
            rows.append(("load (PutBatch 2000 x 4, async flush)", f"{m['load_msgs_per_s']:,.0f}",
                         "msgs/s, 3 replicas, committed and dispatched"))  # fmt: skip
            spark = local_session("local[2]", shuffle_partitions=2)
            try:
                results: dict[str, float] = {}

                def count(reader_schema: str | None, **options: str) -> Callable[[], object]:
                    def run() -> object:
                        reader = spark.read.format("dledger")
                        if reader_schema:
                            reader = reader.schema(reader_schema)
                        for k, v in options.items():
                            reader = reader.option(k, v)
                        got: dict[str, int] = dict(reader.load().groupBy("topic").count().collect())
                        if sum(got.values()) != n:
                            raise RuntimeError(f"read {sum(got.values())} rows, expected {n}")
                        return got

                    return run

                joined = ",".join(servers)
                results["dledger"] = timed(count(None, servers=joined), args.repeat)[0]
                topic_only = count("topic string", servers=joined)
                results["dledger_topic"] = timed(topic_only, args.repeat)[0]
                parquet = root / "parquet"
                reader = spark.read.format("dledger").option("servers", joined)
                reader.load().write.parquet(str(parquet))

                def native() -> object:
                    df = spark.read.parquet(str(parquet))
                    got: dict[str, int] = dict(df.groupBy("topic").count().collect())
                    if sum(got.values()) != n:
                        raise RuntimeError(f"parquet read {sum(got.values())} rows")
                    return got

                results["parquet"], native_times = timed(native, args.repeat)
                follower = next(s.id for s in cluster if s.id != cluster.leader_id())
                cluster.stop(follower)
                path = cluster.specs[follower].data_dir
                results["offline"] = timed(count(None, path=path), args.repeat)[0]
                results["offline_topic"] = timed(count("topic string", path=path), args.repeat)[0]
            finally:
                spark.stop()
        shutil.rmtree(root / "parquet", ignore_errors=True)
    rate = {k: n / v for k, v in results.items()}
    p = rate["parquet"]
    labels = {
        "dledger": "dledger source, servers, full schema",
        "dledger_topic": "dledger source, servers, schema `topic`",
        "offline": "dledger source, offline dir, full schema",
        "offline_topic": "dledger source, offline dir, schema `topic`",
        "parquet": "Parquet, native (same rows, all columns)",
    }
    for name, label in labels.items():
        m[f"{name}_rows_per_s"] = rate[name]
        m[f"{name}_s"] = results[name]
        if name != "parquet":
            m[f"{name}_vs_parquet"] = rate[name] / p
        note = f"{results[name]:.2f} s" + (
            f", {rate[name] / p:.0%} of Parquet" if name != "parquet" else
            f" (runs: {', '.join(f'{t:.2f}' for t in native_times)})"
        )  # fmt: skip
        rows.append((label, f"{rate[name]:,.0f}", f"rows/s; {note}"))
    rows.append(("", "", f"groupBy(topic).count() over {n:,} messages; best of {args.repeat}"))
    report("spark_read", rows, m)


if __name__ == "__main__":
    main()
