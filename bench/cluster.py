"""A local 3-node cluster under load: put throughput, latency and failover (issue 4 targets).

1 KiB messages, sync flush (every acknowledged message fsynced on a quorum):
(a) one sequential client; (b) 32 concurrent in-flight puts; (c) batched puts
(PutBatch of 256, 4 in flight); (d) failover: kill -9 the leader under load,
time to the first successful put, over several trials; plus leader changes seen
during a steady load. Run: `.venv/bin/python bench/cluster.py [--steady-s 60]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import report
from dledger_commitlog.client import AsyncClient, Client, ClientError, MessageSpec, NodeStatus
from dledger_commitlog.cluster import LocalCluster

BODY = b"m" * 1024
CONFIG = {"data_segment_bytes": 256 << 20, "index_segment_bytes": 32 << 20}


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] if s else float("nan")


def sequential(client: Client, seconds: float) -> tuple[float, list[float]]:
    lat: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        client.put("bench", BODY)
        lat.append(time.perf_counter() - t)
    return len(lat) / sum(lat), lat


async def concurrent(
    servers: list[str], inflight: int, seconds: float
) -> tuple[float, list[float]]:
    lat: list[float] = []
    async with AsyncClient(servers) as client:
        end = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < end:
                t = time.perf_counter()
                await client.put("bench", BODY)
                lat.append(time.perf_counter() - t)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        return len(lat) / (time.perf_counter() - started), lat


async def batched(
    servers: list[str], batch: int, inflight: int, seconds: float
) -> tuple[float, list[float]]:
    lat: list[float] = []
    specs = [MessageSpec("bench", BODY) for _ in range(batch)]
    async with AsyncClient(servers) as client:
        end = time.perf_counter() + seconds
        count = 0

        async def worker() -> None:
            nonlocal count
            while time.perf_counter() < end:
                t = time.perf_counter()
                await client.put_batch(specs)
                lat.append(time.perf_counter() - t)
                count += batch

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        return count / (time.perf_counter() - started), lat


def failover_trial(cluster: LocalCluster) -> float:
    """Kill -9 the leader under load; seconds until a put succeeds again."""
    leader = cluster.leader_id()
    stop = threading.Event()
    acked_after: list[float] = []
    killed_at = [0.0]

    def load() -> None:
        with cluster.client(timeout_s=5) as client:
            while not stop.is_set():
                invoked = time.monotonic()
                try:
                    client.put("failover", BODY)
                except ClientError:
                    continue
                # Only a put invoked after the kill proves the new leader serves.
                if killed_at[0] and invoked >= killed_at[0] and not acked_after:
                    acked_after.append(time.monotonic() - killed_at[0])

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # load runs before the kill (a warm-up, not a wait for a condition)
    killed_at[0] = time.monotonic()
    cluster.kill(leader, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while not acked_after and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    cluster.start(leader)
    wait_caught_up(cluster, timeout_s=120)
    return acked_after[0] if acked_after else float("inf")


def wait_caught_up(cluster: LocalCluster, timeout_s: float) -> None:
    """Every node answers and has the leader's commit index (a healthy cluster)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ok = [s for s in cluster.statuses().values() if isinstance(s, NodeStatus)]
        if len(ok) == len(cluster.specs) and len({s.committed_index for s in ok}) == 1:
            return
        time.sleep(0.1)
    raise RuntimeError("the cluster did not catch up after a restart")


def leader_changes(cluster: LocalCluster, seconds: float) -> int:
    """Leader changes seen while 4 clients put steadily for `seconds`."""
    stop = threading.Event()

    def load() -> None:
        with cluster.client(timeout_s=5) as client:
            while not stop.is_set():
                with contextlib.suppress(ClientError):
                    client.put("steady", BODY)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    seen: set[tuple[int, int]] = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s in cluster.statuses().values():
            if isinstance(s, NodeStatus) and s.role == "leader":
                seen.add((s.term, s.node_id))
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    return max(0, len(seen) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0, help="per throughput phase")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steady-s", type=float, default=60.0)
    args = ap.parse_args()
    rows: list[tuple[str, str, str]] = []
    m: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), extra_config=CONFIG) as cl:
        cl.up()
        servers = [s.client for s in cl.specs.values()]
        with cl.client() as client:
            rate, lat = sequential(client, args.seconds)
        m |= {
            "seq_msgs_per_s": rate,
            "seq_p50_ms": pct(lat, 0.5) * 1e3,
            "seq_p99_ms": pct(lat, 0.99) * 1e3,
        }
        rows.append(
            (
                "(a) 1 sequential client",
                f"{rate:,.0f} msgs/s",
                f"p50 {m['seq_p50_ms']:.2f} ms, p99 {m['seq_p99_ms']:.2f} ms"
                " (target 1,000/s, p50 < 1 ms)",
            )
        )
        rate, lat = asyncio.run(concurrent(servers, 32, args.seconds))
        m |= {
            "inflight32_msgs_per_s": rate,
            "inflight32_p50_ms": pct(lat, 0.5) * 1e3,
            "inflight32_p99_ms": pct(lat, 0.99) * 1e3,
        }
        rows.append(
            (
                "(b) 32 in-flight puts",
                f"{rate:,.0f} msgs/s",
                f"p50 {m['inflight32_p50_ms']:.2f} ms, p99 {m['inflight32_p99_ms']:.2f} ms"
                " (target 10,000/s)",
            )
        )
        rate, lat = asyncio.run(batched(servers, 256, 4, args.seconds))
        m |= {
            "batch256x4_msgs_per_s": rate,
            "batch256x4_p50_ms": pct(lat, 0.5) * 1e3,
            "batch256x4_p99_ms": pct(lat, 0.99) * 1e3,
        }
        rows.append(
            (
                "(c) PutBatch 256 x 4 in flight",
                f"{rate:,.0f} msgs/s",
                f"p50 {m['batch256x4_p50_ms']:.1f} ms per batch (target 50,000/s)",
            )
        )
        trials = [failover_trial(cl) for _ in range(args.trials)]
        m |= {"failover_median_s": statistics.median(trials), "failover_max_s": max(trials)}
        rows.append(
            (
                "(d) failover, kill -9 leader",
                f"median {m['failover_median_s']:.2f} s",
                f"max {m['failover_max_s']:.2f} s over {len(trials)} trials: "
                + ", ".join(f"{t:.2f}" for t in trials)
                + " (target median < 1 s, all < 2 s)",
            )
        )
        changes = leader_changes(cl, args.steady_s)
        m["spurious_leader_changes"] = changes
        rows.append(
            (f"    steady load {args.steady_s:.0f} s", f"{changes} leader changes", "(target 0)")
        )
    report("cluster", rows, m)  # fmt: skip


if __name__ == "__main__":
    main()
