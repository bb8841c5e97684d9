"""Run many simulation seeds: `python -m tests.sim --seeds N [--steps S] [--seed X]`;
`--membership` interleaves membership changes with the faults (tests/sim/membership.py)."""

from __future__ import annotations

import argparse
import sys

from tests.sim.simulation import Simulation, run_seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    ap.add_argument("--first", type=int, default=0, help="first seed of the range")
    ap.add_argument("--seed", type=int, default=None, help="run only this seed")
    ap.add_argument("--steps", type=int, default=3000, help="events per seed")
    ap.add_argument("--nodes", type=int, default=None, help="cluster size (3 or 5)")
    ap.add_argument("--membership", action="store_true", help="with membership changes")
    ap.add_argument("--stats", action="store_true", help="print fault and event counts")
    args = ap.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    return run_seeds(
        seeds,
        args.steps,
        lambda seed: Simulation(seed, args.nodes, membership=args.membership),
        stats=args.stats,
    )


if __name__ == "__main__":
    sys.exit(main())
