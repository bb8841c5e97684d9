"""Puts during a rolling restart (issue 34, item 5): p99 while every node is drained,
restarted and caught up in turn, against the steady p99 of the same load.

A local 3-node cluster (real processes on loopback, sync flush, bench/cluster.py's
settings). `--inflight` puts of 1 KiB in flight (one AsyncClient, in a thread of its
own) run for `--seconds` steady, then through `dledger cluster rolling-restart`'s
work (`cli.maintenance.rolling_restart`: drain, stop, start drained, catch up,
undrain; the leader last), then `--seconds` steady again. Each put is counted in the
window it started in: steady (before and after the roll) or roll. Also: the roll's
wall time, its hand-overs, the term's change (the hand-overs only: anything more was
an election), failed puts. Target: p99 during the roll within 2x the steady p99.
Run: `.venv/bin/python bench/rolling_restart.py [--seconds 5] [--inflight 16]`;
writes bench/results/rolling_restart.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import report
from bench.cluster import BODY, CONFIG, async_client, pct
from dledger_commitlog.cli.launcher import LocalCluster, answered
from dledger_commitlog.cli.maintenance import rolling_restart
from dledger_commitlog.client import ClientError

Row = tuple[str, str, str]


class Load:
    """`inflight` concurrent puts until `stop()`: (started, seconds) of each, failures."""

    def __init__(self, cluster: LocalCluster, inflight: int) -> None:
        self.cluster, self.inflight = cluster, inflight
        self.puts: list[tuple[float, float]] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    async def _run(self) -> None:
        async with async_client(self.cluster) as client:

            async def worker() -> None:
                while not self._stop.is_set():
                    t = time.monotonic()
                    try:
                        await client.put("roll", BODY)
                    except ClientError as exc:
                        self.failed.append(f"{exc.code}: {exc.message}")
                        continue
                    self.puts.append((t, time.monotonic() - t))

            await asyncio.gather(*(worker() for _ in range(self.inflight)))


def term(cluster: LocalCluster) -> int:
    return max(s.term for s in answered(cluster.statuses(timeout_s=2.0)).values())


def window(puts: list[tuple[float, float]], lo: float, hi: float) -> list[float]:
    return [s for t, s in puts if lo <= t < hi]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0, help="steady, before and after")
    p.add_argument("--inflight", type=int, default=16)
    args = p.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), extra_config=CONFIG) as cluster,
    ):
        cluster.up()
        load = Load(cluster, args.inflight).start()
        t0 = time.monotonic()
        time.sleep(args.seconds)
        before = term(cluster)
        roll_start = time.monotonic()
        steps = rolling_restart(cluster, on_step=print)
        roll_end = time.monotonic()
        after = term(cluster)
        time.sleep(args.seconds)
        t1 = time.monotonic()
        load.stop()
    steady = window(load.puts, t0, roll_start) + window(load.puts, roll_end, t1)
    roll = window(load.puts, roll_start, roll_end)
    moved = sum(len(s["moved"]) for s in steps)
    ms = 1000.0
    p99_steady, p99_roll = pct(steady, 0.99) * ms, pct(roll, 0.99) * ms
    ratio = p99_roll / p99_steady
    metrics = {
        "steady_puts": len(steady),
        "steady_p50_ms": pct(steady, 0.5) * ms,
        "steady_p99_ms": p99_steady,
        "steady_max_ms": max(steady) * ms,
        "roll_puts": len(roll),
        "roll_p50_ms": pct(roll, 0.5) * ms,
        "roll_p99_ms": p99_roll,
        "roll_max_ms": max(roll) * ms,
        "roll_p99_ratio": ratio,
        "roll_seconds": roll_end - roll_start,
        "roll_handovers": moved,
        "roll_term_change": after - before,
        "roll_elections": after - before - moved,
        "failed_puts": len(load.failed),
    }
    rows: list[Row] = [
        ("steady puts (before + after)", f"{len(steady)}", f"{args.inflight} in flight"),
        ("  p50 / p99", f"{pct(steady, 0.5) * ms:.1f} / {p99_steady:.1f} ms", ""),
        ("  max", f"{max(steady) * ms:.1f} ms", ""),
        ("puts during the roll", f"{len(roll)}", f"{roll_end - roll_start:.1f} s, 3 nodes"),
        ("  p50 / p99", f"{pct(roll, 0.5) * ms:.1f} / {p99_roll:.1f} ms", ""),
        ("  max", f"{max(roll) * ms:.1f} ms", "an election timeout is 500-1000 ms"),
        ("p99 roll / steady", f"{ratio:.2f}x", "target <= 2x"),
        ("term change", f"{after - before}", f"{moved} hand-over(s): 0 elections wanted"),
        ("failed puts", f"{len(load.failed)}", "; ".join(sorted(set(load.failed))[:3])),
    ]
    report("rolling_restart", rows, metrics)


if __name__ == "__main__":
    main()
