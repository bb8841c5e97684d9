"""Membership commands: `member list|add|promote|remove`, `cluster add-node|remove-node`.

The `member` commands speak to any cluster through the client (the leader answers,
a follower redirects); the runbooks that use them are docs/operations.md. The
`cluster` ones run a local cluster's processes (`launcher.LocalCluster`) around
them:

A node of a multi-shard cluster (docs/scaling.md) hosts every shard, so these
add it to, or remove it from, each shard in turn (`common.routes.shard_ids`).

- `cluster add-node --dir D` picks the next id and ports of D's scheme, records
  the node in D (configured to join, with the current members as its peers; with
  TLS a certificate naming it from D's CA), starts it, adds it as a learner and,
  without `--learner`, promotes it once the leader accepts it as caught up (a change
  the leader refuses as things stand is asked again until `--catch-up-timeout`). If
  it could not be added, its process is stopped and its entry marked removed (its id
  is never used again); once added, it stays, and an error names what is left to do.
- `cluster remove-node --dir D N` removes node N from every shard (unless it has
  left already; a refusal as things stand, such as from a leader elected a moment
  ago, is asked again until `--timeout`), stops its process and marks it removed
  in D, so that `cluster up` never starts it again; its files stay for a post-mortem.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from dledger_commitlog.cli.commands import (
    UsageError,
    cluster_dir,
    command,
    emit,
    make_client,
    members_table,
    positive,
)
from dledger_commitlog.cli.launcher import ClusterError, LocalCluster, NodeSpec
from dledger_commitlog.client import ChangeRefused, Client, ClientError, MemberChange
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.console.views import member_json

_POLL_S = 0.2


def _change_line(what: str, change: MemberChange) -> str:
    return f"{what} (configuration entry {change.config_index})"


def _timeout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout-ms",
        type=positive,
        default=10_000,
        metavar="MS",
        help="for the change to commit (default 10000)",
    )


@command("member list", "the shard's voters and learners, each one's match index and lag")
def _member_list(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        members = client.member_list()
    emit(args, {"members": [member_json(m) for m in members]}, members_table(members))
    return 0


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", type=positive, required=True, metavar="N", help="the new node's id")
    p.add_argument("--raft", required=True, metavar="HOST:PORT", help="its Raft address")
    p.add_argument("--client", required=True, metavar="HOST:PORT", help="its client address")
    p.add_argument(
        "--learner", action="store_true", help="receives the log, does not vote (promote it later)"
    )
    _timeout_arg(p)


@command("member add", "add a node to the shard (start it with raft.join = true)", _add_args)
def _member_add(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        change = client.member_add(
            args.id, args.raft, args.client, learner=args.learner, timeout_ms=args.timeout_ms
        )
    role = "learner" if args.learner else "voter"
    doc = {"id": args.id, "role": role, "config_index": change.config_index}
    emit(args, doc, _change_line(f"added node {args.id} as a {role}", change))
    return 0


def _id_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", type=positive, metavar="N", help="node id")
    _timeout_arg(p)


@command("member promote", "make a caught-up learner a voter", _id_args)
def _member_promote(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        change = client.member_promote(args.id, timeout_ms=args.timeout_ms)
    doc = {"id": args.id, "role": "voter", "config_index": change.config_index}
    emit(args, doc, _change_line(f"node {args.id} is a voter", change))
    return 0


@command("member remove", "remove a node from the shard", _id_args)
def _member_remove(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        change = client.member_remove(args.id, timeout_ms=args.timeout_ms)
    doc = {"id": args.id, "removed": True, "config_index": change.config_index}
    emit(args, doc, _change_line(f"removed node {args.id}", change))
    return 0


# ---------------------------------------------------------------- a local cluster


def _local(args: argparse.Namespace) -> LocalCluster:
    directory = cluster_dir(args)
    if not (directory / "cluster.json").exists():
        raise UsageError(f"{directory}: no cluster.json here")
    return LocalCluster(directory)


def _add_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="D", help="cluster directory (holds cluster.json)")
    p.add_argument("--learner", action="store_true", help="leave it a learner (a read replica)")
    p.add_argument(
        "--catch-up-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="for it to start, catch up and be promoted (default 120)",
    )


@command(
    "cluster add-node",
    "start one more node of a local cluster and add it to every shard",
    _add_node_args,
)
def _add_node(args: argparse.Namespace) -> int:
    cluster = _local(args)
    deadline = time.monotonic() + args.catch_up_timeout
    with cluster.client(timeout_s=args.timeout) as client:
        members = {m.id: (m.raft, m.client) for m in client.member_list()}
        spec = cluster.new_spec(members)
        cluster.add_spec(spec, members)
        try:
            cluster.start(spec.id)
            _wait_serving(cluster, client, spec, deadline)
            for shard in shard_ids(cluster.shard_count):  # multi-shard: the node joins every shard
                with cluster.client(timeout_s=args.timeout, shard=shard) as each:
                    add = partial(each.member_add, spec.id, spec.raft, spec.client, learner=True)
                    _until_accepted(add, deadline)
        except BaseException:
            cluster.stop(spec.id)
            cluster.retire(spec.id)
            raise
        cluster.detach()  # added: it runs beyond this command, whatever comes next
        role = "learner"
        if not args.learner:
            for shard in shard_ids(cluster.shard_count):
                with cluster.client(timeout_s=args.timeout, shard=shard) as each:
                    _promote_when_caught_up(each, spec.id, deadline)
            role = "voter"
    doc: dict[str, Any] = {"id": spec.id, "raft": spec.raft, "client": spec.client, "role": role}
    emit(args, doc, str(spec.id))
    return 0


def _wait_serving(cluster: LocalCluster, client: Client, spec: NodeSpec, deadline: float) -> None:
    """Until the new node's process answers Status (ClusterError: it exited, or time ran out)."""
    while True:
        code = cluster.exit_code(spec.id)
        if code is not None:
            tail = cluster.log_tail(spec.id, 20)
            raise ClusterError(
                f"node {spec.id} exited with {code} during start-up; {spec.log_path} ends:\n{tail}"
            )
        try:
            client.status(spec.client, timeout_s=1.0)
            return
        except ClientError as exc:
            if time.monotonic() >= deadline:
                raise ClusterError(f"node {spec.id} did not answer in time: {exc.message}") from exc
        time.sleep(_POLL_S)


def _until_accepted(change: Callable[[], MemberChange], deadline: float) -> MemberChange:
    """Make `change`, asked again while the leader refuses it as things stand (another
    change pending, a new leader without a commit of its term yet, a learner still
    behind), until `deadline`: then the last refusal is the error."""
    while True:
        try:
            return change()
        except ChangeRefused:
            if time.monotonic() >= deadline:
                raise
        time.sleep(_POLL_S)


def _promote_when_caught_up(client: Client, node_id: int, deadline: float) -> None:
    """Promote learner `node_id` once the leader accepts it as caught up (until `deadline`)."""
    try:
        _until_accepted(lambda: client.member_promote(node_id), deadline)
    except ChangeRefused as exc:
        raise ClusterError(
            f"node {node_id} was added as a learner but not promoted in time: "
            f"{exc.message}; it keeps catching up (`dledger member promote {node_id}`)"
        ) from exc


def _remove_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="D", help="cluster directory (holds cluster.json)")
    p.add_argument("id", type=positive, metavar="N", help="node id")
    _timeout_arg(p)


@command(
    "cluster remove-node",
    "remove a node of a local cluster from every shard and stop it",
    _remove_node_args,
)
def _remove_node(args: argparse.Namespace) -> int:
    cluster = _local(args)
    if args.id not in cluster.specs:
        gone = "was removed already" if args.id in cluster.retired else "is not in this cluster"
        raise UsageError(f"node {args.id} {gone}")
    deadline = time.monotonic() + args.timeout
    for shard in shard_ids(cluster.shard_count):  # multi-shard: the node leaves every shard
        with cluster.client(timeout_s=args.timeout, shard=shard) as client:
            if args.id in {m.id for m in client.member_list()}:
                _until_accepted(partial(client.member_remove, args.id, args.timeout_ms), deadline)
    cluster.stop(args.id)
    cluster.retire(args.id)
    emit(args, {"id": args.id, "removed": True}, f"removed node {args.id} and stopped it")
    return 0
