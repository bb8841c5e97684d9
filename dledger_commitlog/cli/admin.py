"""The operator's commands: status, transfer-leader, verify, admin clean-now, the
local cluster (cluster up, down, status) and certs. (Membership: `members.py`.)

Status tables show every node, the ones that did not answer with their error,
then the members (voters and learners) with each one's lag as the leader knows it;
the exit code is 1 only when none answered. `cluster up` starts the nodes of a
directory that do not run (all of them for a new or stopped cluster), leaves
running ones alone and says which it started; `cluster down` stops them all
(`launcher.LocalCluster` does the work). `certs` imports its cryptography only
when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dledger_commitlog.cli.cluster_layout import saved_extra_config, shards_config
from dledger_commitlog.cli.commands import (
    RenamedOption,
    UsageError,
    cluster_dir,
    command,
    emit,
    key_value,
    make_client,
    members_table,
    node_settings,
    table,
)
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import ClientError, NodeStatus, StatusError
from dledger_commitlog.console.views import leader_members, member_json, status_json


def with_members(text: str, statuses: Sequence[NodeStatus | StatusError]) -> str:
    """A status table, then the voters and learners with each one's lag."""
    members = leader_members(statuses)
    if not members:
        return text
    voters = sum(m.role == "voter" for m in members)
    head = f"members: {voters} voter{'s' * (voters != 1)}, {len(members) - voters} learner(s)"
    return f"{text}\n\n{head}\n{members_table(members)}"


def status_table(statuses: Sequence[NodeStatus | StatusError]) -> str:
    headers = ("node", "address", "role", "term", "leader", "last", "commit", "applied", "note")
    rows: list[list[Any]] = []
    for s in statuses:
        if isinstance(s, StatusError):
            rows.append(["?", s.address, "-", "-", "-", "-", "-", "-", s.error.message[:60]])
        else:
            rows.append([s.node_id, s.address, s.role, s.term, s.leader_id or None])
            note = s.flush_mode + (", drained" if s.drained else "")
            rows[-1] += [s.last_index, s.committed_index, s.applied_index, note]
    return table(headers, rows)


@command("status", "every server's Raft and store status")
def _status(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        statuses = client.status_all(timeout_s=min(args.timeout, 5.0))
    doc = {"nodes": [status_json(s) for s in statuses]}
    doc["members"] = [member_json(m) for m in leader_members(statuses)]
    emit(args, doc, with_members(status_table(statuses), statuses))
    return 0 if any(isinstance(s, NodeStatus) for s in statuses) else 1


def _transfer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", type=int, required=True, metavar="N", help="target node id")
    p.add_argument("--timeout-ms", type=int, default=5000, metavar="MS")


@command("transfer-leader", "hand leadership to another node", _transfer_args)
def _transfer(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        leader = client.transfer_leadership(args.to, args.timeout_ms)
    emit(args, {"leader_id": leader}, f"leader is now node {leader}")
    return 0


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, metavar="D", help="a stopped node's data dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


@command(
    "verify",
    "check a stopped node's store offline (CRCs, index, queues vs a rebuild)",
    _verify_args,
)
def _verify(args: argparse.Namespace) -> int:
    # the store's modules (numpy among them) load only for the command that reads a store
    from dledger_commitlog.log.verify import progress_bar, verify_store

    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise UsageError(f"{data_dir} is not a directory")
    progress = None if args.no_progress or args.json else progress_bar()
    try:
        report = verify_store(data_dir, progress)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    doc = report.as_json()
    rows = [(k, v) for k, v in doc.items() if k != "problems"]
    text = table(("check", "result"), rows)
    if report.problems:
        text += "\nproblems:\n" + "\n".join(f"  - {p}" for p in report.problems)
    emit(args, doc, text)
    return 0 if report.ok else 1


def _clean_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="delete old-enough-or-not segments that are safe to delete",
    )


@command("admin clean-now", "run commit-log retention now on every node", _clean_args)
def _clean_now(args: argparse.Namespace) -> int:
    rows = []
    with make_client(args) as client:
        for server in client.servers:
            try:
                r = client.clean_now(server, force=args.force)
                rows.append(
                    {
                        "server": server,
                        "deleted_segments": r.deleted_segments,
                        "min_offset": r.min_offset,
                        "reason": r.reason,
                    }
                )
            except ClientError as exc:
                rows.append({"server": server, "error": exc.message})
    text = table(
        ("server", "deleted", "min offset", "note"),
        [
            (
                r["server"],
                r.get("deleted_segments"),
                r.get("min_offset"),
                r.get("reason") or r.get("error"),
            )
            for r in rows
        ],
    )
    emit(args, {"nodes": rows}, text)
    return 0 if all("error" not in r for r in rows) else 1


def _cluster_up_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="D", help="cluster directory (holds cluster.json)")
    p.add_argument("--nodes", type=int, default=3, choices=(1, 3, 5))
    p.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="data shards (each one Raft group), every node process hosting all of them, "
        "plus the route shard 0 (docs/scaling.md; default 1: one shard, no shard 0)",
    )
    p.add_argument(
        "--groups",
        type=int,
        dest="shards",
        action=RenamedOption,
        new="--shards",
        help=argparse.SUPPRESS,
    )
    p.add_argument("--base-port", type=int, metavar="P", help="default: free ports")
    p.add_argument("--flush-mode", choices=("sync", "async"))
    p.add_argument("--set", action="append", type=key_value, default=[], metavar="FIELD=V")
    p.add_argument("--wait", type=float, default=30.0, metavar="S", help="for a leader")
    p.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="TLS on every port with a development CA made in D/pki",
    )
    p.add_argument(
        "--acl",
        action="store_true",
        default=None,
        help="clients sign calls; an admin account in D/admin.credentials",
    )


def _dir_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="D", help="cluster directory (holds cluster.json)")


@command("cluster up", "start a local cluster (or restart a stopped one)", _cluster_up_args)
def _cluster_up(args: argparse.Namespace) -> int:
    try:
        extra = node_settings(args.set)
        if args.shards is not None:
            saved = saved_extra_config(cluster_dir(args))
            had = int(saved.get("shard_count", 1))
            if args.shards < had:
                raise UsageError(
                    f"--shards {args.shards}: the cluster has {had} shards, "
                    "and their data stays theirs (shards are added, not removed)"
                )
            extra = {**saved, **extra, **shards_config(args.shards)}
        cluster = LocalCluster(
            cluster_dir(args),
            nodes=args.nodes,
            base_port=args.base_port,
            flush_mode=args.flush_mode,
            extra_config=extra or None,
            cluster=args.cluster_name or "dledger",
            tls=args.tls,
            acl=args.acl,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    down = [i for i in cluster.specs if not cluster.is_running(i)]
    cluster.up(timeout_s=args.wait)  # starts the nodes that are down, leaves the others
    cluster.detach()
    return _print_cluster(args, cluster, started=down)


@command("cluster down", "stop a local cluster", _dir_args)
def _cluster_down(args: argparse.Namespace) -> int:
    directory = cluster_dir(args)
    if not (directory / "cluster.json").exists():
        raise UsageError(f"{directory}: no cluster.json here")
    LocalCluster(directory).down()
    emit(args, {"stopped": str(directory)}, f"stopped the cluster in {directory}")
    return 0


@command("cluster status", "processes and status of a local cluster", _dir_args)
def _cluster_status(args: argparse.Namespace) -> int:
    directory = cluster_dir(args)
    if not (directory / "cluster.json").exists():
        raise UsageError(f"{directory}: no cluster.json here")
    return _print_cluster(args, LocalCluster(directory))


def _print_cluster(
    args: argparse.Namespace, cluster: LocalCluster, started: Sequence[int] | None = None
) -> int:
    statuses = cluster.statuses(timeout_s=1.0)
    nodes: list[dict[str, Any]] = []
    for spec in cluster:
        doc: dict[str, Any] = {"id": spec.id, "pid": cluster.pid(spec.id), "client": spec.client}
        doc |= {"raft": spec.raft, "metrics": spec.metrics, "data_dir": spec.data_dir}
        doc["status"] = status_json(statuses[spec.id])
        nodes.append(doc)
    keys = ("role", "term", "leader", "error")
    rows = [[n["id"], n["pid"], n["client"], *(n["status"].get(k) for k in keys)] for n in nodes]
    text = table(("node", "pid", "client", "role", "term", "leader", "error"), rows)
    out: dict[str, Any] = {"dir": str(cluster.directory), "nodes": nodes}
    members = leader_members(list(statuses.values()))
    out["members"] = [member_json(m) for m in members]
    out["removed"] = sorted(cluster.retired)  # nodes that left the cluster (not started)
    text = with_members(text, list(statuses.values()))
    if started is not None:
        out["started"] = list(started)
        text = _started_line(started, list(cluster.specs)) + "\n" + text
    emit(args, out, text)
    return 0


def _started_line(started: Sequence[int], every: Sequence[int]) -> str:
    """'started nodes 1, 3 (2 was running)', 'started nodes 1, 2, 3', 'started none: ...'."""
    running = [i for i in every if i not in started]
    if not started:
        return "started none: every node was running"
    line = f"started node{'s' * (len(started) > 1)} {', '.join(map(str, started))}"
    if running:
        verb = "were" if len(running) > 1 else "was"
        line += f" ({', '.join(map(str, running))} {verb} running)"
    return line


def _certs_args(p: argparse.ArgumentParser) -> None:
    from dledger_commitlog.cli.certs import add_arguments

    add_arguments(p)


@command("certs", "make a development CA and node/client certificates (TLS)", _certs_args)
def _certs(args: argparse.Namespace) -> int:
    from dledger_commitlog.cli.certs import run as run_certs

    return run_certs(args)
