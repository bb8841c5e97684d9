"""Failover under load, measured by the chaos runner (issue 6's benchmark).

(a) `leader-kill` with `--kills` leader kills (kill -9, then restart once a new
leader serves) under the chaos workload: failover time per kill is the time
from the kill to the first acknowledgement of a put invoked after it. Target:
median < 1 s, max < 2 s, zero acknowledged loss.
(b) Every other scenario for `--seconds` each: acknowledged puts lost (target 0).

Usage: python bench/failover.py [--kills 20] [--seconds 10] [--seed 1] [--only-kills]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import report
from chaos.runner import ChaosConfig, run
from chaos.scenarios import SCENARIOS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only-kills", action="store_true")
    args = p.parse_args()
    rows: list[tuple[str, str, str]] = []
    metrics: dict[str, float] = {}
    kills = run(
        ChaosConfig("leader-kill", duration_s=3600, seed=args.seed, max_leader_faults=args.kills)
    )
    t, v = kills.timing, kills.verdict
    p50, worst = t["failover_p50_s"] or float("inf"), t["failover_max_s"] or float("inf")
    metrics |= {
        "failover_kills": t["failovers"],
        "failover_median_s": p50,
        "failover_max_s": worst,
        "failover_unfinished": t["failovers_unfinished"],
        "failover_acked": v.acked,
        "failover_lost": len(v.lost),
        "failover_unavailable_s": t["unavailable_s"],
    }
    rows += [
        ("(a) leader kills under load", str(t["failovers"]), f"{v.acked} puts acknowledged"),
        ("    failover median", f"{p50:.3f} s", "target < 1 s"),
        ("    failover max", f"{worst:.3f} s", "target < 2 s"),
        (
            "    acknowledged lost",
            str(len(v.lost)),
            "target 0" + ("" if kills.valid else " (run INVALID)"),
        ),
    ]
    if not args.only_kills:
        lost_all = 0
        valid = 0
        names = [n for n in SCENARIOS if n != "leader-kill"]
        for name in names:
            r = run(ChaosConfig(name, duration_s=args.seconds, seed=args.seed))
            lost_all += len(r.verdict.lost)
            valid += r.valid
            metrics[f"lost_{name.replace('-', '_')}"] = len(r.verdict.lost)
            extra = (
                f", {len(r.verdict.lost_in_window)} in the async window"
                if (r.verdict.lost_in_window)
                else ""
            )
            verdict = (
                "valid"
                if r.valid
                else "INVALID: " + "; ".join(r.verdict.problems() + r.harness_errors)
            )
            rows.append(
                (
                    f"(b) {name}",
                    f"{len(r.verdict.lost)} lost",
                    f"{r.verdict.acked} acknowledged{extra}; {verdict[:200]}",
                )
            )
        metrics |= {
            "lost_all_scenarios": lost_all,
            "scenarios_valid": valid,
            "scenarios_run": len(names),
        }
    report("failover", rows, metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
