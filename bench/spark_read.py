"""Spark reading the commit log: the `dledger` source against the same rows in Parquet.

A local 3-node cluster (async flush, so that loading is quick; reads are the
same in either flush mode) is loaded with N committed 256-byte messages over 4
topics (4 queues each) by PutBatch, and the same rows are written to Parquet
(every column, from the source). Then, in one local[2] Spark session, every
query is `groupBy("topic").count()` over every topic, in three phases:

- cluster over gRPC (`localReads=false`): ReadUnits + ReadLog (raw entries,
  decoded in the Spark workers), `columns=topic` and the full schema; and a
  filter pushed down: `topic = 'orders' AND store_timestamp >= <the middle of
  the load>`, `count()` (a quarter of the topics, half the time);
- a replica's files (`localReads=true`, the default when a replica runs on the
  same host): the live node's files below the ends it reports;
- files (`path`): a stopped node's data directory, with the whole cluster down.

Each phase also runs Parquet (read natively, which prunes to the one column it
needs) and the floor of the Python Data Source API: a source that reads and
decodes nothing, its partitions yielding ready-made Arrow batches of the
`topic` column (as many partitions and rows a batch as the `dledger` source).
Every query of a phase runs once to warm up, then the phase runs `--repeat`
rounds, each running every query once, interleaved, so load from elsewhere on
the machine falls on all of them alike; each row is the median of its rounds,
against the median of Parquet in the same phase.

Also a raw Pull of 16,384 messages against a node, with the node's event-loop
lag (`Status.loop_lag_max_ms`) before and during it: the Pull's disk reads run
in a thread, so it must not hold the loop that runs Raft (bench/read_loop_lag.py
measures it against every big read, over many trials).

Targets (issue 21), each against Parquet in the same phase: over the cluster
(gRPC, `columns=topic`) >= 50%, files (`columns=topic`) >= 70%, full schema
>= 35%; a 16k Pull never blocks the loop over 20 ms.
Run: `.venv/bin/python bench/spark_read.py [--messages 1000000] [--repeat 5]`;
writes bench/results/spark_read.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.server_store import ServerStore
from bench._report import report
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import AsyncClient, ClientError, MessageSpec

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
PULL = 16_384


async def load(servers: list[str], total: int) -> tuple[float, int, int]:
    """Put `total` messages (round-robin over TOPICS) with PutBatch; returns msgs/s and
    the store timestamps (ms) of the first and the last message.

    Each message has its own UNIQ_KEY, so a batch that fails (a leader change) is
    put again without duplicates (the leaders' idempotency window).
    """
    todo = total // BATCH + (1 if total % BATCH else 0)
    stamps: list[int] = []
    async with AsyncClient(servers, timeout_s=60) as client:
        started = time.perf_counter()
        counter = iter(range(todo))

        async def worker() -> None:
            for k in counter:
                first = k * BATCH
                batch = [
                    MessageSpec(TOPICS[i % len(TOPICS)], BODY, tags="t", uniq_key=f"{i:032X}")
                    for i in range(first, min(total, first + BATCH))
                ]
                for attempt in range(5):
                    try:
                        results = await client.put_batch(batch)
                        break
                    except ClientError:
                        if attempt == 4:
                            raise
                stamps.extend((results[0].store_timestamp_ms, results[-1].store_timestamp_ms))

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        return total / (time.perf_counter() - started), min(stamps), max(stamps)


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


Run = Callable[[], object]


def phase(runs: dict[str, Run], repeat: int) -> dict[str, list[float]]:
    """Seconds of each run over `repeat` interleaved rounds, after one warm-up run each
    (JVM, Python workers and page cache ready)."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    return times


def floor_source(n: int) -> type:
    """A Python data source that only yields prepared `topic` batches (see the doc)."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from analytics.rows import BATCH_ROWS

    class FloorReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(k) for k in range(2)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            names = pa.array(list(TOPICS), pa.string())
            codes = np.arange(n // 2, dtype=np.int32) % len(TOPICS)
            for lo in range(0, n // 2, BATCH_ROWS):
                part = pa.array(codes[lo : lo + BATCH_ROWS])
                yield pa.RecordBatch.from_arrays([names.take(part)], names=["topic"])

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "floor"

        def schema(self) -> str:
            return "topic string"

        def reader(self, schema: object) -> DataSourceReader:
            return FloorReader()

    return Floor


def pull_lag(address: str) -> tuple[float, float, float]:
    """(loop lag ms while idle, loop lag ms during raw Pulls of PULL messages, Pull seconds)."""
    import grpc

    from proto import dledger_pb2 as pb
    from proto import dledger_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address, [("grpc.max_receive_message_length", 256 << 20)]) as ch:
        stub = pb_grpc.DLedgerClientStub(ch)
        stub.Status(pb.StatusRequest(reset_loop_lag=True), timeout=10)
        time.sleep(1.0)  # an idle second: the baseline
        idle = stub.Status(pb.StatusRequest(reset_loop_lag=True), timeout=10).loop_lag_max_ms
        took = []
        ends = stub.QueueOffsets(pb.QueueOffsetsRequest(topic=TOPICS[0]), timeout=10).queues
        end = next(q.max_offset for q in ends if q.queue_id == 0)
        for offset in range(0, end, PULL):
            t = time.perf_counter()
            r = stub.Pull(
                pb.PullRequest(
                    topic=TOPICS[0],
                    queue_id=0,
                    queue_offset=offset,
                    max_messages=PULL,
                    raw=True,
                    max_bytes=64 << 20,
                ),
                timeout=30,
            )
            took.append(time.perf_counter() - t)
            assert r.next_offset == min(end, offset + PULL), (r.next_offset, offset)
        busy = stub.Status(pb.StatusRequest(reset_loop_lag=True), timeout=10).loop_lag_max_ms
    return idle, busy, min(took)


def _floor_run(spark: Any, n: int) -> Run:
    def run() -> object:
        df = spark.read.format("floor").load()
        got: dict[str, int] = dict(df.groupBy("topic").count().collect())
        if sum(got.values()) != n // 2 * 2:
            raise RuntimeError(f"floor read {sum(got.values())} rows")
        return got

    return run


def _count(spark: Any, n: int, columns: str | None, **options: str) -> Run:
    def run() -> object:
        reader = spark.read.format("dledger")
        if columns:
            reader = reader.option("columns", columns)
        for k, v in options.items():
            reader = reader.option(k, v)
        got: dict[str, int] = dict(reader.load().groupBy("topic").count().collect())
        if sum(got.values()) != n:
            raise RuntimeError(f"read {sum(got.values())} rows, expected {n}")
        return got

    return run


def _native(spark: Any, n: int, parquet: Path) -> Run:
    def run() -> object:
        df = spark.read.parquet(str(parquet))
        got: dict[str, int] = dict(df.groupBy("topic").count().collect())
        if sum(got.values()) != n:
            raise RuntimeError(f"parquet read {sum(got.values())} rows")
        return got

    return run


def _pushed(spark: Any, options: dict[str, str], middle: dt.datetime) -> Run:
    def run() -> object:
        df = (
            spark.read.format("dledger")
            .options(**options)
            .load()
            .where(f"topic = 'orders' AND store_timestamp >= '{middle.isoformat()}'")
        )
        return df.count()

    return run


# (metric name, label, target share of Parquet or None), in the order reported.
ROWS: tuple[tuple[str, str, float | None], ...] = (
    ("cluster_topic", "cluster over gRPC (ReadLog), columns=topic", 0.50),
    ("cluster", "cluster over gRPC (ReadLog), full schema", 0.35),
    ("cluster_filter", "filter topic=orders, store_timestamp>=middle (gRPC)", None),
    ("cluster_local_topic", "cluster, a replica's files, columns=topic", None),
    ("cluster_local", "cluster, a replica's files, full schema", 0.35),
    ("files_topic", "files (stopped node), columns=topic", 0.70),
    ("files", "files (stopped node), full schema", 0.35),
)
PHASES = {"grpc": "cluster over gRPC", "local": "a replica's files", "files": "files, cluster down"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.messages
    from analytics.session import local_session

    rows: list[tuple[str, str, str]] = []
    m: dict[str, float] = {"messages": n, "body_bytes": len(BODY), "repeat": args.repeat}
    times: dict[str, dict[str, list[float]]] = {}  # phase -> query -> seconds
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with LocalCluster(root / "cluster", flush_mode="async", extra_config=CONFIG) as cluster:
            cluster.up()
            servers = [s.client for s in cluster]
            m["load_msgs_per_s"], first_ms, last_ms = asyncio.run(load(servers, n))
            wait_dispatched(servers, n, timeout_s=600)
            rows.append(
                (
                    "load (PutBatch 2000 x 4, async flush)",
                    f"{m['load_msgs_per_s']:,.0f}",
                    "msgs/s, 3 replicas, committed and dispatched",
                )
            )
            follower = next(s.id for s in cluster if s.id != cluster.leader_id())
            idle, busy, pull_s = pull_lag(cluster.specs[follower].client)
            m["pull_16k_s"] = pull_s
            m["loop_lag_idle_ms"] = idle
            m["loop_lag_during_16k_pulls_ms"] = busy
            spark = local_session("local[2]", shuffle_partitions=2)
            try:
                joined = ",".join(servers)
                parquet = root / "parquet"
                spark.read.format("dledger").option("servers", joined).load().write.parquet(
                    str(parquet)
                )
                m["parquet_files"] = len(list(parquet.glob("*.parquet")))
                spark.dataSource.register(floor_source(n))
                base = {"parquet": _native(spark, n, parquet), "floor": _floor_run(spark, n)}
                grpc_only = {"servers": joined, "localReads": "false"}
                middle = dt.datetime.fromtimestamp((first_ms + last_ms) / 2000, dt.UTC)
                pushed = _pushed(spark, grpc_only, middle)
                m["filter_rows"] = float(pushed())  # type: ignore[arg-type]
                times["grpc"] = phase(
                    {
                        **base,
                        "cluster_topic": _count(spark, n, "topic", **grpc_only),
                        "cluster": _count(spark, n, None, **grpc_only),
                        "cluster_filter": pushed,
                    },
                    args.repeat,
                )
                times["local"] = phase(
                    {
                        **base,
                        "cluster_local_topic": _count(spark, n, "topic", servers=joined),
                        "cluster_local": _count(spark, n, None, servers=joined),
                    },
                    args.repeat,
                )
                cluster.down()
                path = cluster.specs[follower].data_dir
                times["files"] = phase(
                    {
                        **base,
                        "files_topic": _count(spark, n, "topic", path=path),
                        "files": _count(spark, n, None, path=path),
                    },
                    args.repeat,
                )
            finally:
                spark.stop()
        shutil.rmtree(root / "parquet", ignore_errors=True)
    rows += _report_rows(times, n, m)
    lag = f"loop lag: idle {idle:.1f} ms, during Pulls {busy:.1f} ms (target < 20)"
    rows.append(("raw Pull of 16,384 messages", f"{m['pull_16k_s'] * 1000:.0f} ms", lag))
    rows.append(
        (
            "",
            "",
            f"groupBy(topic).count() over {n:,} messages; medians of "
            f"{args.repeat} interleaved rounds per phase",
        )
    )
    report("spark_read", rows, m)


def _report_rows(
    times: dict[str, dict[str, list[float]]], n: int, m: dict[str, float]
) -> list[tuple[str, str, str]]:
    """The table's rows (and metrics into `m`): per phase Parquet and the floor, then
    each read against the Parquet of its phase."""
    out: list[tuple[str, str, str]] = []
    median = {p: {k: statistics.median(v) for k, v in t.items()} for p, t in times.items()}

    def runs(p: str, name: str) -> str:
        return ", ".join(f"{t:.2f}" for t in times[p][name])

    for p, title in PHASES.items():
        pq = median[p]["parquet"]
        m[f"parquet_{p}_s"] = pq
        m[f"parquet_{p}_rows_per_s"] = n / pq
        m[f"floor_{p}_s"] = median[p]["floor"]
        m[f"floor_{p}_vs_parquet"] = pq / median[p]["floor"]
        out.append(
            (
                f"[{title}] Parquet, native",
                f"{n / pq:,.0f}",
                f"rows/s; {pq:.2f} s (runs: {runs(p, 'parquet')})",
            )
        )
        out.append(
            (
                f"[{title}] floor: a source yielding ready batches",
                f"{n / median[p]['floor']:,.0f}",
                f"rows/s; {pq / median[p]['floor']:.0%} of Parquet (runs: {runs(p, 'floor')})",
            )
        )
        for name, label, target in ROWS:
            if name not in median[p]:
                continue
            took = median[p][name]
            share = pq / took
            m[f"{name}_rows_per_s"] = n / took
            m[f"{name}_s"] = took
            m[f"{name}_vs_parquet"] = share
            note = f"rows/s; {share:.0%} of Parquet"
            if target is not None:
                note += f" (target {target:.0%}: {'met' if share >= target else 'NOT met'})"
            if name == "cluster_filter":
                note += f"; {m['filter_rows']:,.0f} rows match, rate over all {n:,}"
            out.append((f"  {label}", f"{n / took:,.0f}", f"{note} (runs: {runs(p, name)})"))
    m["floor_vs_parquet"] = m["floor_files_vs_parquet"]
    return out


if __name__ == "__main__":
    main()
