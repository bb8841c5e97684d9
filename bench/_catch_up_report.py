"""What bench/catch_up.py measures, and how it reports it.

Owns `CatchUp` (one wiped node's catch-up: its timings, the leader's log then, the
CPU spent per node and thread kind) and `Rates` (the puts/s of bench/cluster.py's
`WORKLOADS`, steady and while a node catches up), and the table rows and JSON
metrics of a run: `catch_up_rows`, `copy_rows` (the raw copies, and catch-up over
copy), `rate_rows` (puts while catching up, against issue 22's `MAX_DROP`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MB = 1e6
MAX_DROP = 0.20  # issue 22: puts while a learner catches up, at most 20% below steady
Row = tuple[str, str, str]
# the put workloads (bench/cluster.py's): metric prefix -> label
WORKLOADS = {"inflight32": "(b) 32 in-flight puts", "seq": "(a) 1 sequential client"}


@dataclass
class CatchUp:
    """One wiped node's catch-up: seconds from its process start to its first Status
    answer (`up_s`), to applied == the leader's commit (`done_s`), to everything
    dispatched (`dispatched_s`); the leader's log then; CPU seconds per node and
    thread kind meanwhile (from `up_s` to `done_s`); the node's longest event-loop
    delay over its life (start-up and catch-up), from its Status."""

    up_s: float
    done_s: float
    dispatched_s: float
    log_bytes: int
    log_index: int
    cpu_s: dict[str, dict[str, float]]
    loop_lag_ms: float = float("nan")

    @property
    def seconds(self) -> float:
        return self.done_s - self.up_s

    @property
    def mb_per_s(self) -> float:
        return self.log_bytes / self.seconds / MB


@dataclass
class Rates:
    """Puts/s per workload: steady (all nodes up) and while a node catches up, with the
    node's lag (entries) at the end of each catching-up window."""

    steady: dict[str, list[float]]
    catching: dict[str, list[float]]
    lag_at_end: dict[str, list[int]]
    loaded: list[CatchUp]  # the catch-ups under those windows


def catch_up_rows(cu: CatchUp, label: str) -> tuple[list[Row], dict[str, float]]:
    m = {
        "catch_up_s": cu.seconds,
        "catch_up_mb_per_s": cu.mb_per_s,
        "catch_up_with_start_s": cu.done_s,
        "catch_up_dispatched_s": cu.dispatched_s - cu.up_s,
        "node_start_s": cu.up_s,
        "catch_up_loop_lag_max_ms": cu.loop_lag_ms,
        "log_bytes": cu.log_bytes,
        "log_entries": cu.log_index,
    }
    rows: list[Row] = [
        (
            label,
            f"{cu.mb_per_s:,.1f} MB/s",
            f"{cu.log_bytes / MB:,.0f} MB, {cu.log_index:,} entries in {cu.seconds:.1f} s from its "
            f"first Status answer ({cu.done_s:.1f} s from its start; the process took "
            f"{cu.up_s:.1f} s to answer)",
        ),
        (
            "    its event loop's longest delay",
            f"{cu.loop_lag_ms:,.0f} ms",
            "over its life (start-up and catch-up): its Status and reads wait that long",
        ),
        (
            "    ... and dispatched",
            f"{cu.dispatched_s - cu.up_s:.1f} s",
            "consume queues and key index built (what it serves reads from)",
        ),
    ]
    for role, kinds in cu.cpu_s.items():
        total = sum(kinds.values())
        split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(kinds.items()))
        per_gb = total / (cu.log_bytes / 1e9)
        rows.append(
            (
                f"    {role} CPU",
                f"{total:.1f} s",
                f"{total / cu.seconds:.0%} of a core; {per_gb:.1f} s/GB; by thread kind: {split}",
            )
        )
        m[f"{role}_cpu_s_per_gb"] = per_gb
        m[f"{role}_cpu_pct"] = total / cu.seconds * 100
        for k, v in kinds.items():
            m[f"{role}_{k}_cpu_s"] = v
    return rows, m


def copy_rows(
    copies: dict[str, list[tuple[int, float]]], cu_mb_per_s: float
) -> tuple[list[Row], dict[str, float]]:
    rows: list[Row] = []
    m: dict[str, float] = {}
    for cache, runs in copies.items():
        rate = statistics.median(n / s / MB for n, s in runs)
        m[f"copy_{cache}_mb_per_s"] = rate
        m[f"catch_up_to_copy_{cache}_ratio"] = cu_mb_per_s / rate
        rows.append(
            (
                f"raw copy, {cache} page cache",
                f"{rate:,.0f} MB/s",
                f"{runs[0][0] / MB:,.0f} MB (data + index files up to the log's end), "
                "copy_file_range + fsync; catch-up/copy "
                f"{cu_mb_per_s / rate:.3f}",
            )
        )
    return rows, m


def rate_rows(rates: Rates) -> tuple[list[Row], dict[str, float]]:
    rows: list[Row] = []
    m: dict[str, float] = {}
    for w, label in WORKLOADS.items():
        steady = statistics.median(rates.steady[w])
        catching = statistics.median(rates.catching[w])
        ratio = catching / steady
        m |= {
            f"steady_{w}_msgs_per_s": steady,
            f"catching_up_{w}_msgs_per_s": catching,
            f"{w}_during_catch_up_ratio": ratio,
        }
        verdict = "ok" if ratio >= 1 - MAX_DROP else f"FAILS (> {MAX_DROP:.0%} below steady)"
        lags = ", ".join(f"{lag:,}" for lag in rates.lag_at_end[w])
        rows.append(
            (
                f"{label}, steady -> catching up",
                f"{steady:,.0f} -> {catching:,.0f}/s",
                f"ratio {ratio:.3f}: {verdict}; the node's lag at each window's end: "
                f"{lags} entries",
            )
        )
        runs = ", ".join(f"{r:,.0f}" for r in rates.steady[w])
        rows.append(("    steady windows", runs, "(before each catch-up, and one after the last)"))
    for k, cu in enumerate(rates.loaded):
        rows.append(
            (
                f"    catch-up under those puts #{k + 1}",
                f"{cu.mb_per_s:,.1f} MB/s",
                f"{cu.log_bytes / MB:,.0f} MB in {cu.seconds:.1f} s (a moving target)",
            )
        )
    m["catch_up_loaded_mb_per_s"] = statistics.median(cu.mb_per_s for cu in rates.loaded)
    return rows, m
