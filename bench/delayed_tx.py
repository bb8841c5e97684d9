"""Delayed and transactional messages on a local 3-node cluster (issue 15).

1 KiB messages, sync flush. (a) Delivery lag of delayed messages: `--messages`
puts of delay level 1 (1 s) paced over `--spread-s`, while a consumer long-polls
the real topic; the lag of a message is how long after its due time (the stored
copy's store timestamp + 1 s) it was stored in its topic (server clocks, one host)
and seen by the consumer (this process's clock). (b) Delayed puts/s, 32 in
flight. (c) Transactions/s, put_half then end_transaction(commit), 32 in flight,
and their latency. Run: `.venv/bin/python bench/delayed_tx.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import report
from bench.cluster import async_client
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import AsyncClient

BODY = b"m" * 1024
CONFIG = {
    "data_segment_bytes": 64 << 20,
    "index_segment_bytes": 32 << 20,
    "delay_levels": "1s 5s",
    "queues_per_topic": 4,
}
LEVEL_MS = 1000


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


async def consume(
    client: AsyncClient, topic: str, want: int, deadline: float, seen: dict[str, tuple[int, float]]
) -> None:
    """Long-poll every queue of `topic`: uniq key -> (store ts, local receive time)."""
    offsets = dict.fromkeys(range(4), 0)
    while len(seen) < want and time.time() < deadline:
        for q in offsets:
            got = await client.pull(topic, q, offsets[q], max_messages=256, wait_ms=20)
            now = time.time()
            for m in got.messages:
                seen.setdefault(m.uniq_key, (m.store_timestamp_ms, now))
            offsets[q] = got.next_offset


async def delivery_lag(cl: LocalCluster, n: int, spread_s: float) -> dict[str, float]:
    async with async_client(cl) as client:
        due: dict[str, int] = {}
        seen: dict[str, tuple[int, float]] = {}
        consumer = asyncio.ensure_future(
            consume(client, "lagged", n, time.time() + spread_s + 30, seen)
        )
        started = time.perf_counter()
        for i in range(n):
            r = await client.put("lagged", BODY, delay_level=1, uniq_key=f"lag-{i}")
            due[f"lag-{i}"] = r.store_timestamp_ms + LEVEL_MS
            pause = started + (i + 1) * spread_s / n - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
        await consumer
    stored = [seen[k][0] - due[k] for k in due if k in seen]
    received = [seen[k][1] * 1000 - due[k] for k in due if k in seen]
    early = sum(1 for k in due if k in seen and seen[k][0] < due[k])
    return {
        "delayed_delivered": len(seen),
        "delayed_sent": n,
        "delayed_early": early,
        "delivery_lag_store_p50_ms": pct(stored, 50),
        "delivery_lag_store_p99_ms": pct(stored, 99),
        "delivery_lag_store_max_ms": max(stored, default=0.0),
        "delivery_lag_consumer_p50_ms": pct(received, 50),
        "delivery_lag_consumer_p99_ms": pct(received, 99),
    }


async def throughput(cl: LocalCluster, seconds: float, inflight: int) -> dict[str, float]:
    async with async_client(cl) as client:
        delayed = 0
        tx_lat: list[float] = []

        async def put_delayed(end: float) -> None:
            nonlocal delayed
            while time.perf_counter() < end:
                await client.put("later", BODY, delay_level=2)
                delayed += 1

        async def transact(end: float) -> None:
            while time.perf_counter() < end:
                t = time.perf_counter()
                half = await client.put_half("paid", BODY, producer_group="bench")
                await client.end_transaction(half, commit=True)
                tx_lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(put_delayed(t0 + seconds) for _ in range(inflight)))
        delayed_rate = delayed / (time.perf_counter() - t0)
        t1 = time.perf_counter()
        await asyncio.gather(*(transact(t1 + seconds) for _ in range(inflight)))
        tx_rate = len(tx_lat) / (time.perf_counter() - t1)
    return {
        "delayed_put_msgs_per_s": delayed_rate,
        "tx_half_commit_per_s": tx_rate,
        "tx_p50_ms": statistics.median(tx_lat) * 1000,
        "tx_p99_ms": pct(tx_lat, 99) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--spread-s", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--inflight", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), extra_config=CONFIG) as cl:
        cl.up()
        m = asyncio.run(delivery_lag(cl, args.messages, args.spread_s))
        m |= asyncio.run(throughput(cl, args.seconds, args.inflight))
    rows = [
        (
            "(a) delayed messages delivered",
            f"{m['delayed_delivered']:.0f}/{args.messages}",
            f"{m['delayed_early']:.0f} early (store time before due)",
        ),
        (
            "    lag after due, store time",
            f"p50 {m['delivery_lag_store_p50_ms']:.0f} ms",
            f"p99 {m['delivery_lag_store_p99_ms']:.0f} ms, max "
            f"{m['delivery_lag_store_max_ms']:.0f} ms",
        ),
        (
            "    lag after due, consumer",
            f"p50 {m['delivery_lag_consumer_p50_ms']:.0f} ms",
            f"p99 {m['delivery_lag_consumer_p99_ms']:.0f} ms (long poll, 4 queues)",
        ),
        (
            "(b) delayed puts",
            f"{m['delayed_put_msgs_per_s']:,.0f} msgs/s",
            f"{args.inflight} in flight",
        ),
        (
            "(c) put_half + commit",
            f"{m['tx_half_commit_per_s']:,.0f} tx/s",
            f"p50 {m['tx_p50_ms']:.1f} ms, p99 {m['tx_p99_ms']:.1f} ms, {args.inflight} in flight",
        ),
    ]
    report("delayed_tx", rows, m)


if __name__ == "__main__":
    main()
