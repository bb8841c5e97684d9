"""Maintenance without elections (docs/upgrades.md): `node drain`, `node undrain` and
`cluster rolling-restart`.

- `node drain --node N`: node N stops campaigning in every shard it hosts and hands
  each shard it leads to a caught-up voter that may lead (the Drain RPC, one call per
  shard, each the node's own: `node/drain.py`); it returns once N leads nothing, so
  that stopping N makes no election. Every shard is checked first (a dry run on N):
  if any would be left without a voter that may lead (the only voter; the others
  drained, down or silent; no leader), the drain is refused and nothing changes. A
  drain that fails half-way is undone in the shards it had drained.
- `node undrain --node N`: N campaigns and may lead again, in every shard.
- `cluster rolling-restart --dir D`: each node of a local cluster in turn, the
  leaders last: drained, stopped, started drained (so that it does not campaign
  before it has caught up), waited for until it answers in every shard and has
  committed what the shard's leader had committed when it came back, undrained.
  Between the drains and the stops no election happens: the terms move by the
  transfers only.

`drain_node`, `undrain_node` and `rolling_restart` are the work, given a client per
shard; tests and bench/rolling_restart.py call them on a `LocalCluster`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from typing import Any

from dledger_commitlog.cli.commands import (
    UsageError,
    cluster_dir,
    command,
    emit,
    make_client,
    positive,
    table,
)
from dledger_commitlog.cli.launcher import ClusterError, LocalCluster
from dledger_commitlog.client import ChangeRefused, Client, ClientError, NodeStatus
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.console.views import leader_of

Clients = Callable[[int], Client]  # shard -> a client of that shard (closed by the caller)
_POLL_S = 0.1


def node_address(clients: Clients, node: int) -> str:
    """The client address of node `node`, as it answers Status (UsageError if none does)."""
    with clients(1) as client:
        statuses = client.status_all(timeout_s=2.0)
    for s in statuses:
        if isinstance(s, NodeStatus) and s.node_id == node:
            return s.address
    known = sorted(s.node_id for s in statuses if isinstance(s, NodeStatus))
    raise UsageError(f"node {node} does not answer (the nodes that do: {known or 'none'})")


def cluster_shards(clients: Clients) -> list[int]:
    """Every shard of the cluster (shard 0 and 1..N with several, else [1])."""
    with clients(1) as client:
        return shard_ids(client.route().shard_count)


def _each(clients: Clients, shards: list[int]) -> Iterator[tuple[int, Client]]:
    """(shard, client) for each shard; the caller skips NOT_FOUND (a shard not hosted)."""
    for g in shards:
        with clients(g) as client:
            yield g, client


def drain_node(clients: Clients, node: int, timeout_ms: int = 5000) -> list[dict[str, Any]]:
    """Drain node `node` in every shard it hosts (see the module doc); per shard
    {"shard", "moved", "leader"}. ChangeRefused (nothing changed), ClientError."""
    address = node_address(clients, node)
    shards = cluster_shards(clients)
    hosted = []
    for g, client in _each(clients, shards):
        try:
            client.drain(address, dry_run=True, timeout_ms=timeout_ms)
        except ChangeRefused as exc:
            raise ChangeRefused(
                f"node {node} cannot be drained, nothing changed: shard {g}: {exc.message}",
                code=exc.code,
                address=address,
            ) from None
        except ClientError as exc:
            if exc.code != "NOT_FOUND":
                raise
            continue
        hosted.append(g)
    done: list[dict[str, Any]] = []
    try:
        for g, client in _each(clients, hosted):
            r = client.drain(address, timeout_ms=timeout_ms)
            done.append({"shard": g, "moved": r.moved, "leader": r.leader_id or None})
    except ClientError:
        undrain_node(clients, node, [d["shard"] for d in done], address)
        raise
    return done


def undrain_node(
    clients: Clients, node: int, shards: list[int] | None = None, address: str | None = None
) -> list[int]:
    """Undrain node `node` in `shards` (default: every shard it hosts); the shards."""
    address = address or node_address(clients, node)
    out = []
    for g, client in _each(clients, cluster_shards(clients) if shards is None else shards):
        try:
            client.drain(address, drained=False)
        except ClientError as exc:
            if exc.code != "NOT_FOUND":
                raise
            continue
        out.append(g)
    return out


def _node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", type=positive, required=True, metavar="N", help="the node's id")
    p.add_argument("--timeout-ms", type=positive, default=5000, metavar="MS", help="per shard")


@command(
    "node drain", "hand over what a node leads; keep it from leading (stop it then)", _node_args
)
def _drain(args: argparse.Namespace) -> int:
    moves = drain_node(lambda g: make_client(args, shard=g), args.node, args.timeout_ms)
    lines = [
        f"shard {m['shard']}: "
        + (f"leadership moved to node {m['leader']}" if m["moved"] else "follows")
        for m in moves
    ]
    lines.append(f"node {args.node} is drained: it leads nothing and will not campaign")
    emit(args, {"node": args.node, "drained": True, "shards": moves}, "\n".join(lines))
    return 0


@command("node undrain", "let a drained node campaign and lead again", _node_args)
def _undrain(args: argparse.Namespace) -> int:
    shards = undrain_node(lambda g: make_client(args, shard=g), args.node)
    text = f"node {args.node} is undrained in shard{'s' * (len(shards) != 1)} "
    emit(args, {"node": args.node, "drained": False, "shards": shards}, text + _list(shards))
    return 0


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values))


# ---------------------------------------------------------------- rolling restart


def wait_caught_up(cluster: LocalCluster, node: int, shards: list[int], timeout_s: float) -> None:
    """Until node `node` answers in every shard and has committed, in each, what the
    shard's leader had committed once the node answered (ClusterError at the deadline)."""
    deadline = time.monotonic() + timeout_s
    address = cluster.specs[node].client
    targets: dict[int, int] = {}
    while len(targets) < len(shards) or any(
        _committed(cluster, g, address) < c for g, c in targets.items()
    ):
        if time.monotonic() >= deadline:
            raise ClusterError(f"node {node} did not catch up within {timeout_s:g}s")
        for g in shards:
            if g not in targets and _committed(cluster, g, address) >= 0:
                leader = _leader_commit(cluster, g)
                if leader is not None:
                    targets[g] = leader
        time.sleep(_POLL_S)


def _committed(cluster: LocalCluster, shard: int, address: str) -> int:
    """The committed index of the node at `address` in `shard` (-1: it does not answer)."""
    with cluster.client(shard=shard) as client:
        try:
            return client.status(address, timeout_s=0.5).committed_index
        except ClientError:
            return -1


def _leader_commit(cluster: LocalCluster, shard: int) -> int | None:
    """The committed index of `shard`'s leader (None: no leader answers)."""
    with cluster.client(shard=shard) as client:
        statuses = dict(enumerate(client.status_all(timeout_s=0.5)))
    leader = leader_of(statuses)
    found = [s for s in statuses.values() if isinstance(s, NodeStatus) and s.node_id == leader]
    return found[0].committed_index if found else None


def rolling_restart(
    cluster: LocalCluster,
    timeout_ms: int = 5000,
    wait_s: float = 60.0,
    on_step: Callable[[str], None] = lambda line: None,
) -> list[dict[str, Any]]:
    """Restart every node of `cluster` in turn with no election (see the module doc);
    per node {"node", "moved" (shards handed over), "catch_up_s"}."""

    def clients(g: int) -> Client:
        return cluster.client(shard=g)

    shards = cluster_shards(clients)
    leader = cluster.leader_id()
    order = sorted(cluster.specs, key=lambda i: (i == leader, i))
    report = []
    for node in order:
        if not cluster.is_running(node):
            raise ClusterError(f"node {node} is not running: start it first (`cluster up`)")
        moves = drain_node(clients, node, timeout_ms)
        moved = [m["shard"] for m in moves if m["moved"]]
        handed = f", handed over shard{'s' * (len(moved) > 1)} {_list(moved)}" if moved else ""
        on_step(f"node {node}: drained{handed}")
        cluster.stop(node)
        cluster.start(node, drained=True)
        started = time.monotonic()
        wait_caught_up(cluster, node, shards, wait_s)
        caught_up_s = time.monotonic() - started
        undrain_node(clients, node, shards, cluster.specs[node].client)
        on_step(f"node {node}: restarted, caught up in {caught_up_s:.1f}s, undrained")
        report.append({"node": node, "moved": moved, "catch_up_s": round(caught_up_s, 3)})
    return report


def _roll_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="D", help="cluster directory (holds cluster.json)")
    p.add_argument("--timeout-ms", type=positive, default=5000, metavar="MS", help="per drain")
    p.add_argument("--wait", type=float, default=60.0, metavar="S", help="per node's catch-up")


@command(
    "cluster rolling-restart",
    "restart a local cluster's nodes one by one: drained first, no election",
    _roll_args,
)
def _rolling_restart(args: argparse.Namespace) -> int:
    directory = cluster_dir(args)
    if not (directory / "cluster.json").exists():
        raise UsageError(f"{directory}: no cluster.json here")
    cluster = LocalCluster(directory)
    step = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    try:
        report = rolling_restart(cluster, args.timeout_ms, args.wait, on_step=step)
    finally:
        cluster.detach()  # the restarted nodes run on after this command
    rows = [(r["node"], _list(r["moved"]) or None, r["catch_up_s"]) for r in report]
    emit(
        args,
        {"dir": str(directory), "nodes": report},
        table(("node", "handed over", "catch-up s"), rows),
    )
    return 0
