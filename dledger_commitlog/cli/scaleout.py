"""Shard commands (docs/scaling.md; a shard is one Raft group): topic routes and the
leaders of the shards.

- `topic route [TOPIC]`: the configured routes (or one topic's, configured or
  default), each shard's queues of it and the shard's leader.
- `topic create|update TOPIC --queues G:N[,G:N...]`, `topic delete TOPIC`: a route
  change through shard 0 (the admin right with an ACL).
- `shard status`: shard x node, each one's role, term and lag behind its leader.
- `shard balance [--dry-run]`: move leaders by transfer so that each shard is led
  by its preferred node when that one is up (`common.routes.preferred_leader`),
  else by the live voter leading the fewest shards, so that no node leads more
  than ceil(shards / nodes) (`common.balance.plan_moves`, the plan the console's
  balance makes too); prints each move, and the leaders after.

Each speaks to the cluster through per-shard clients (`Client(shard=g)`): the
route calls through any node, the status of each shard from each node.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from dledger_commitlog.cli.commands import (
    UsageError,
    command,
    emit,
    make_client,
    renamed_command,
    table,
)
from dledger_commitlog.client import ClientError, NodeStatus, TopicRoute
from dledger_commitlog.common.balance import plan_moves
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.console.views import leader_of, shard_cells


def _queues(text: str) -> dict[int, int]:
    """ "2:4,3:2" -> {2: 4, 3: 2} (shard: queues)."""
    out: dict[int, int] = {}
    for part in text.split(","):
        shard, sep, count = part.strip().partition(":")
        if not sep or not shard.isdigit() or not count.isdigit():
            raise argparse.ArgumentTypeError(f"{part!r} is not SHARD:QUEUES")
        out[int(shard)] = int(count)
    return out


def _topic_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    p.add_argument(
        "--queues",
        type=_queues,
        required=True,
        metavar="G:N,...",
        help="the topic's queues per shard, e.g. 1:4,2:4",
    )


def _route_json(route: TopicRoute) -> dict[str, Any]:
    return {
        "topic": route.topic,
        "configured": route.configured,
        "shards": [{"shard": g, "queues": n} for g, n in route.shards],
    }


def _change(args: argparse.Namespace, op: str, shards: dict[int, int] | None) -> int:
    with make_client(args, shard=0) as client:
        try:
            route = client.topic_update(op, args.topic, shards)
        except ClientError as exc:
            raise UsageError(str(exc)) from exc
    if route is None:
        emit(args, {"deleted": args.topic}, f"deleted the route of {args.topic}")
    else:
        spread = ", ".join(f"shard {g}: {n} queues" for g, n in route.shards)
        emit(args, _route_json(route), f"{op}d {args.topic}: {spread}")
    return 0


@command("topic create", "give a topic its route: queues per shard", _topic_args)
def _topic_create(args: argparse.Namespace) -> int:
    return _change(args, "create", args.queues)


@command("topic update", "change a topic's route", _topic_args)
def _topic_update(args: argparse.Namespace) -> int:
    return _change(args, "update", args.queues)


def _delete_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")


@command("topic delete", "drop a topic's route (it takes the default again)", _delete_args)
def _topic_delete(args: argparse.Namespace) -> int:
    return _change(args, "delete", None)


def _route_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", nargs="?", default="", help="default: every configured topic")


@command("topic route", "topics' routes: shards, queues, leaders", _route_args)
def _topic_route(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        routes = client.route(args.topic)
    shown = [routes.route(args.topic)] if args.topic else list(routes.routes.values())
    rows = []
    for r in shown:
        for g, n in r.shards:
            leader = routes.leaders.get(g)
            who = leader.leader_id if leader is not None else None
            rows.append((r.topic, g, n, who or "-", "configured" if r.configured else "default"))
    doc = {
        "shard_count": routes.shard_count,
        "version": routes.version,
        "routes": [_route_json(r) for r in shown],
        "leaders": {str(g): x.leader_id for g, x in routes.leaders.items()},
    }
    text = (
        table(("topic", "shard", "queues", "leader", "route"), rows)
        if rows
        else (
            f"no configured routes: every topic has {routes.queues_per_topic} queues in each of "
            f"shards 1..{routes.shard_count}"
        )
    )
    emit(args, doc, text)
    return 0


def _statuses(args: argparse.Namespace) -> tuple[list[int], dict[int, dict[int, Any]], list[int]]:
    """(shards, {shard: {node: NodeStatus | StatusError}}, the nodes: members of any shard)."""
    with make_client(args) as client:
        routes = client.route()
    members = {n for x in routes.leaders.values() for n in x.members}
    shards = shard_ids(routes.shard_count)
    out: dict[int, dict[int, Any]] = {}
    for g in shards:
        with make_client(args, shard=g) as client:
            by_node: dict[int, Any] = {}
            for i, st in enumerate(client.status_all(timeout_s=2.0)):
                key = st.node_id if isinstance(st, NodeStatus) else -(i + 1)
                by_node[key] = st
            out[g] = by_node
    nodes = sorted(members | {n for by in out.values() for n in by if n > 0})
    return shards, out, nodes


def _leaders(statuses: dict[int, dict[int, Any]]) -> dict[int, int | None]:
    return {g: leader_of(nodes) for g, nodes in statuses.items()}


def _cell_text(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "down"
    lag = cell["lag"]
    return f"{cell['role']} t{cell['term']}" + (f" lag {lag}" if lag else "")


@command("shard status", "shards x nodes: roles, terms and lag")
def _shard_status(args: argparse.Namespace) -> int:
    shards, statuses, nodes = _statuses(args)
    rows: list[tuple[Any, ...]] = []
    doc: dict[str, dict[str, Any]] = {}
    for g in shards:
        doc[str(g)] = cells = shard_cells(statuses[g], nodes)
        rows.append((g, *(_cell_text(cells[str(n)]) for n in nodes)))
    led = Counter(n for n in _leaders(statuses).values() if n is not None)
    text = table(("shard", *(f"node {n}" for n in nodes)), rows)
    text += "\nleads: " + ", ".join(f"node {n}: {led.get(n, 0)}" for n in nodes)
    emit(args, {"shards": doc, "leads": {str(n): led.get(n, 0) for n in nodes}}, text)
    return 0


def _balance_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the moves, make none")


@command("shard balance", "spread the shards' leaders over the nodes", _balance_args)
def _shard_balance(args: argparse.Namespace) -> int:
    shards, statuses, nodes = _statuses(args)
    candidates = {
        g: [n for n, st in statuses[g].items() if isinstance(st, NodeStatus)] for g in shards
    }
    moves = plan_moves(_leaders(statuses), candidates, nodes)
    lines, done = [], []
    for g, src, dst in moves:
        if args.dry_run:
            lines.append(f"shard {g}: would move the leader from node {src} to node {dst}")
            continue
        with make_client(args, shard=g) as client:
            try:
                now = client.transfer_leadership(dst)
            except ClientError as exc:
                lines.append(f"shard {g}: moving the leader to node {dst} failed: {exc}")
                continue
        done.append({"shard": g, "from": src, "to": now})
        lines.append(f"shard {g}: leader moved from node {src} to node {now}")
    led = Counter(n for n in _leaders(_statuses(args)[1]).values() if n is not None)
    lines.append("leads: " + ", ".join(f"node {n}: {led.get(n, 0)}" for n in nodes))
    emit(
        args,
        {
            "moves": done if not args.dry_run else [list(m) for m in moves],
            "leads": {str(n): led.get(n, 0) for n in nodes},
        },
        "\n".join(lines) if moves else "balanced: no move needed\n" + lines[-1],
    )
    return 0


renamed_command("groups status", "shard status")
renamed_command("groups balance", "shard balance")
