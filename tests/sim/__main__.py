"""Run many simulation seeds: `python -m tests.sim --seeds N [--steps S] [--seed X]`."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from tests.sim.simulation import SimFailure, Simulation


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    ap.add_argument("--first", type=int, default=0, help="first seed of the range")
    ap.add_argument("--seed", type=int, default=None, help="run only this seed")
    ap.add_argument("--steps", type=int, default=3000, help="events per seed")
    ap.add_argument("--nodes", type=int, default=None, help="cluster size (3 or 5)")
    ap.add_argument("--stats", action="store_true", help="print fault and event counts")
    args = ap.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    failed = 0
    totals: Counter[str] = Counter()
    started = time.perf_counter()
    for seed in seeds:
        sim = Simulation(seed, args.nodes)
        try:
            sim.run(args.steps)
        except SimFailure as err:
            failed += 1
            print(err, file=sys.stderr)
        totals.update(sim.stats)
        totals["leaders_elected"] += len(sim.checker.leaders)
        totals["entries_committed"] += len(sim.checker.canon)
    took = time.perf_counter() - started
    print(f"{len(seeds)} seeds x {args.steps} steps: {failed} failed in {took:.1f} s")
    if args.stats:
        for key, value in sorted(totals.items()):
            print(f"  {key:<24} {value}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
