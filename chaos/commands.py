"""`dledger chaos`: run a chaos scenario against a local cluster and report.

Registered on import (cli.build_parser imports it). Exit code 0 when the run is valid
(nothing acknowledged was lost, no other violation), 1 when it is not, 2 for a
bad command line. The report goes to stdout (a table, or JSON with --json) and
to the file `--out` names (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dledger_commitlog.cli.commands import UsageError, command, emit, table

SCENARIO_HELP = "a scenario name, or 'list'"


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, metavar="NAME", help=SCENARIO_HELP)
    p.add_argument(
        "--duration", type=float, default=15.0, metavar="S", help="seconds of faults (default 15)"
    )
    p.add_argument("--seed", type=int, default=1, metavar="N", help="replays the schedule")
    p.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    p.add_argument("--clients", type=int, default=4, metavar="N", help="client threads")
    p.add_argument(
        "--network",
        default="toxiproxy",
        choices=("toxiproxy", "netns"),
        help="proxies per link (TOXIPROXY_URL: a real Toxiproxy), or namespaces "
        "and iptables (root)",
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="run directory (default: a temporary one, removed when the run is valid)",
    )
    p.add_argument(
        "--leader-faults",
        type=int,
        metavar="N",
        help="end the schedule after N faults that take the leader away",
    )
    p.add_argument("--out", metavar="FILE.json", help="write the report here too")


@command("chaos", "run a chaos scenario against a local cluster and check the history", _configure)
def _chaos(args: argparse.Namespace) -> int:
    from chaos.runner import ChaosConfig, run
    from chaos.scenarios import KINDS, SCENARIOS

    if args.scenario == "list":
        rows = [(n, KINDS[n], d) for n, (_, d) in SCENARIOS.items()]
        emit(args, {n: d for n, _, d in rows}, table(("scenario", "fault", "what it does"), rows))
        return 0
    cfg = ChaosConfig(
        args.scenario,
        duration_s=args.duration,
        seed=args.seed,
        directory=Path(args.dir) if args.dir else None,
        nodes=args.nodes,
        clients=args.clients,
        network=args.network,
        max_leader_faults=args.leader_faults,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if not args.json:
        print(f"chaos: {cfg.scenario}, {cfg.duration_s:g} s, seed {cfg.seed}", file=sys.stderr)
    report = run(cfg, log=lambda line: print(f"chaos: {line}", file=sys.stderr))
    doc = report.as_json()
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    text = table(("", ""), report.lines())
    if report.directory:
        text += f"\nhistory, node logs and report kept in {report.directory}"
    emit(args, doc, text)
    return 0 if report.valid else 1
