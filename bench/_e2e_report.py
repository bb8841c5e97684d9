"""How bench/e2e.py reports a run: its figures, the notes of its rows, and the targets.

Owns `fmt` (a figure, "n/a" for NaN), the notes a row of a load case carries
(latency, CPU per message per role, the missing/duplicates/failures check),
`failure_rows` (the commonest kinds of failed put), and `targets`: the issue's
targets this run measured (module docstring of bench/e2e.py), each checked against
the metrics, met or not (`ok`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from bench._e2e_worker import Result

Row = tuple[str, str, str]


def fmt(v: float, unit: str = "", digits: int = 0) -> str:
    return "n/a" if math.isnan(v) else f"{v:,.{digits}f}{unit}"


def lat_note(m: dict[str, float], p: str) -> str:
    note = "ack p50/p99/max " + "/".join(
        fmt(m[f"{p}_ack_{q}_ms"], "", 1) for q in ("p50", "p99", "max")
    )
    if f"{p}_e2e_p50_ms" in m:
        note += "; e2e " + "/".join(fmt(m[f"{p}_e2e_{q}_ms"], "", 1) for q in ("p50", "p99", "max"))
    return note + " ms"


def cpu_note(m: dict[str, float], p: str) -> str:
    roles = [
        r
        for r in ("leader", "follower1", "follower2", "producer", "consumer", "orchestrator")
        if f"{p}_{r}_cpu_us_per_msg" in m
    ]
    return "CPU us/msg " + ", ".join(f"{r} {fmt(m[f'{p}_{r}_cpu_us_per_msg'])}" for r in roles)


def check_note(m: dict[str, float], p: str) -> str:
    missing, dups = m.get(f"{p}_missing", math.nan), m.get(f"{p}_duplicates", math.nan)
    failed = m[f"{p}_put_failures"]
    return f"missing {fmt(missing)}, duplicates {fmt(dups)}, put failures {fmt(failed)}"


def failure_rows(results: Sequence[Result]) -> list[Row]:
    """A row per common kind of failed put, if any failed."""
    errors: dict[str, int] = {}
    for r in results:
        for what, n in r.errors.items():
            errors[what] = errors.get(what, 0) + n
    return [("", "", f"  {n:,} failed: {what}") for what, n in errors.items()]


# -- the targets --------------------------------------------------------------------------


def ok(met: bool) -> str:
    return "met" if met else "NOT met"


def targets(m: dict[str, float], paced_labels: list[str]) -> list[Row]:
    """The issue's targets that this run measured: a row each, met or not; adds
    targets_met and targets_checked to `m`."""
    checks: list[tuple[str, str, bool]] = []

    def check(what: str, value: str, met: bool) -> None:
        checks.append((what, value, met))

    if "paced1000_ack_p50_ms" in m:
        check(
            "1,000/s: ack p50 <= 5 ms",
            fmt(m["paced1000_ack_p50_ms"], " ms", 1),
            m["paced1000_ack_p50_ms"] <= 5,
        )
        check(
            "1,000/s: ack p99 <= 25 ms",
            fmt(m["paced1000_ack_p99_ms"], " ms", 1),
            m["paced1000_ack_p99_ms"] <= 25,
        )
        check(
            "1,000/s: e2e p99 <= 30 ms",
            fmt(m["paced1000_e2e_p99_ms"], " ms", 1),
            m["paced1000_e2e_p99_ms"] <= 30,
        )
    idle = paced_labels[0] if paced_labels else ""
    cap = 0.8 * m.get("closed_produce_only_msgs_per_s", math.nan)
    loaded = [lb for lb in paced_labels[1:] if m[f"paced{lb}_rate"] <= cap * 1.001]
    if loaded and not math.isnan(cap):
        for kind in ("ack", "e2e"):
            base = m[f"paced{idle}_{kind}_p50_ms"]
            worst = max(m[f"paced{lb}_{kind}_p50_ms"] / base for lb in loaded)
            check(
                f"<= 80% of max: {kind} p50 <= 3x unloaded ({base:.1f} ms)",
                f"worst {worst:.2f}x",
                worst <= 3,
            )
    if len(paced_labels) > 1:
        cpus = [m[f"paced{lb}_server_cpu_us_per_msg"] for lb in paced_labels]
        falls = all(b <= a * 1.1 for a, b in itertools.pairwise(cpus))
        check(
            "server CPU/msg falls as the rate rises (10% noise allowed)",
            " > ".join(f"{c:,.0f}" for c in cpus) + " us",
            falls,
        )
    for lb in paced_labels:
        p = f"paced{lb}"
        check(
            f"paced {m[f'{p}_rate']:,.0f}/s: e2e p50 <= 1.5x, p99 <= 3x ack",
            f"{m[f'{p}_e2e_over_ack_p50']:.2f}x, {m[f'{p}_e2e_over_ack_p99']:.2f}x",
            m[f"{p}_e2e_over_ack_p50"] <= 1.5 and m[f"{p}_e2e_over_ack_p99"] <= 3,
        )
    if "closed_ratio" in m:
        check(
            "closed loop: sustained / produce only >= 0.90",
            f"{m['closed_ratio']:.2f}",
            m["closed_ratio"] >= 0.9 and bool(m["closed_bounded"]),
        )
    if "drain_vs_batched_put_ratio" in m:
        check(
            "drain (1 consumer) >= 2x the batched put rate",
            f"{m['drain_vs_batched_put_ratio']:.2f}x",
            m["drain_vs_batched_put_ratio"] >= 2,
        )
        check(
            "drain (1 consumer): leader CPU <= 15 us/msg",
            fmt(m["drain1_leader_cpu_us_per_msg"], " us", 1),
            m["drain1_leader_cpu_us_per_msg"] <= 15,
        )
    lost = sum(v for k, v in m.items() if k.endswith("_missing"))
    check("every acknowledged put handled (all cases)", f"{lost:,.0f} missing", lost == 0)
    m["targets_met"] = sum(c[2] for c in checks)
    m["targets_checked"] = len(checks)
    return [(f"target: {what}", value, ok(met)) for what, value, met in checks]
