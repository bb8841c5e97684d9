"""`make run`: a local three-node cluster doing what users do with it, narrated.

Starts three node processes on 127.0.0.1, puts messages through the Python
client, reads them back, kills the leader with SIGKILL, shows the new leader and
that every acknowledged message is still there at the offset it was
acknowledged with, restarts the killed node and watches it catch up, checks that
the replicas' committed logs are identical, runs a Spark query over the
committed data (`spark_summary`: every acknowledged put must be among what Spark
reads), and stops the cluster. It lives here, above the server package, because
it ends in Spark; it uses the cluster launcher and the client as a user would.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from analytics.session import local_session
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, ClientError, NodeStatus
from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.node.config import SMALL_SEGMENTS


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"[demo] gave up waiting for {what}")


def put_under_load(client: Client, stop: threading.Event, acked: list[PutResult]) -> None:
    """A writer that keeps putting until told to stop; records what was acknowledged."""
    k = 0
    while not stop.is_set():
        with contextlib.suppress(ClientError):  # unknown or refused in failover: not acked
            acked.append(client.put("orders", f"order {k}", keys=[f"order-{k}"], tags="new"))
        k += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="run-demo", help="cluster directory (wiped first)")
    args = ap.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    say("starting a 3-node cluster on 127.0.0.1 (sync flush: every ack is fsynced on a quorum)")
    with LocalCluster(root, nodes=3, extra_config=SMALL_SEGMENTS) as cluster:
        cluster.up(timeout_s=30)
        leader = cluster.leader_id()
        for i, spec in cluster.specs.items():
            role = "leader" if i == leader else "follower"
            say(
                f"  node {i} ({role}): client {spec.client}, raft {spec.raft}, "
                f"metrics http://{spec.metrics}/metrics"
            )
        client = cluster.client(timeout_s=10)

        started = time.perf_counter()
        first = [
            client.put("orders", f"order {k}", keys=[f"order-{k}"], tags="new") for k in range(200)
        ]
        elapsed = time.perf_counter() - started
        say(f"put 200 messages one by one in {elapsed * 1000:.0f} ms; the last: {first[-1]}")
        back = client.get(msg_id=first[7].msg_id)
        say(f"get {first[7].msg_id}: topic={back.topic} keys={list(back.keys)} body={back.body!r}")

        stop = threading.Event()
        acked: list[PutResult] = []
        writer = threading.Thread(target=put_under_load, args=(cluster.client(), stop, acked))
        writer.start()
        wait_until(lambda: len(acked) > 100, 20, "acknowledged puts under load")
        say(f"killing the leader (node {leader}) with SIGKILL under load")
        killed_at = time.monotonic()
        cluster.kill(leader, signal.SIGKILL)
        new_leader = cluster.wait_for_leader(exclude=leader, timeout_s=15)
        elected_s = time.monotonic() - killed_at
        seen = len(acked)
        wait_until(lambda: len(acked) > seen, 15, "a put acknowledged by the new leader")
        say(
            f"node {new_leader} elected {elected_s:.2f} s after the kill; first put acknowledged "
            f"by it {time.monotonic() - killed_at:.2f} s after the kill"
        )
        stop.set()
        writer.join()
        everything = first + acked
        wrong = [r for r in everything if client.get(offset=r.commitlog_offset).msg_id != r.msg_id]
        say(f"{len(everything)} acknowledged puts, {len(wrong)} missing or moved after failover")

        say(f"restarting node {leader}")
        cluster.start(leader)
        target = max(s.committed_index for s in _ok_statuses(cluster))
        wait_until(lambda: _caught_up(cluster, target), 30, f"node {leader} to catch up")
        statuses = _ok_statuses(cluster)
        crcs = {
            (s.committed_index, s.last_chain_crc) for s in statuses if s.committed_index >= target
        }
        say(f"node {leader} caught up: committed index {target} on all nodes")
        say(f"replica logs agree (same chain CRC at the same index): {len(crcs) == 1}")
        for s in sorted(statuses, key=lambda s: s.node_id):
            say(f"  node {s.node_id}: {s.role:<9} term {s.term} committed {s.committed_index}")
        for line in spark_summary([spec.client for spec in cluster], everything):
            say(line)
        client.close()
        if wrong:
            sys.exit("[demo] acknowledged messages were lost")
    say("cluster stopped; data left in " + str(root))


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


def _ok_statuses(cluster: LocalCluster) -> list[NodeStatus]:
    return [s for s in cluster.statuses().values() if isinstance(s, NodeStatus)]


def _caught_up(cluster: LocalCluster, target: int) -> bool:
    statuses = _ok_statuses(cluster)
    return len(statuses) == len(cluster.specs) and all(
        s.committed_index >= target for s in statuses
    )


if __name__ == "__main__":
    main()
