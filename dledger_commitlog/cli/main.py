"""The `dledger` command line: one argparse tree built from a registry of subcommands.

Owns argument parsing, output (`--json`: one JSON document on stdout; otherwise
readable tables) and exit codes: 0 success, 1 the cluster or a server said no,
2 usage (bad arguments, bad config, unreadable input files). Expected errors
print one line on stderr, never a traceback. Every subcommand accepts the same
connection options (`--cluster FILE | --servers H:P,...`, `--cluster-name`,
`--timeout`, `--json`). Subcommands register with `@command("admin clean-now",
...)` (`commands.py`, which also has the helpers they share); `build_parser`
imports the modules that add more (analytics.cli, chaos.cli). A space in the
name makes a command group.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dledger_commitlog.cli.commands import _REGISTRY as _REGISTRY
from dledger_commitlog.cli.commands import UsageError as UsageError
from dledger_commitlog.cli.commands import cell, load_plugins, preview
from dledger_commitlog.cli.commands import command as command
from dledger_commitlog.cli.commands import emit as emit
from dledger_commitlog.cli.commands import make_client as make_client
from dledger_commitlog.cli.commands import message_json as message_json
from dledger_commitlog.cli.commands import messages_table as messages_table
from dledger_commitlog.cli.commands import table as table
from dledger_commitlog.cli.launcher import ClusterError
from dledger_commitlog.client import (
    ClientError,
    NodeStatus,
    PullResult,
    PutResult,
    StatusError,
    StoredMessage,
)
from dledger_commitlog.log.verify import progress_bar, verify_store
from dledger_commitlog.node.config import (
    ConfigError,
    ListenError,
    NodeConfig,
    load_config,
    parse_peer,
)
from store.errors import CorruptEntry, DirectoryInUse


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not true or false")


_FIELD_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "int | None": int,
    "bool": _bool,
}


def build_parser() -> argparse.ArgumentParser:
    load_plugins()  # analytics, chaos: their modules register their subcommands
    common = argparse.ArgumentParser(add_help=False)
    conn = common.add_argument_group("connection and output")
    conn.add_argument("--cluster", metavar="FILE", help="cluster.json of a cluster")
    conn.add_argument("--servers", metavar="H:P,...", help="client addresses of the servers")
    conn.add_argument("--cluster-name", metavar="NAME", help="refuse servers of other clusters")
    conn.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per command")
    conn.add_argument("--tls-ca", metavar="PEM", help="speak TLS; trust servers this CA signed")
    conn.add_argument("--credentials", metavar="FILE",
                      help="access_key and secret_key (TOML) to sign calls with")  # fmt: skip
    conn.add_argument("--json", action="store_true", help="print one JSON document")
    parser = argparse.ArgumentParser(prog="dledger", description="dledger-py commit log")
    groups: dict[tuple[str, ...], Any] = {(): parser.add_subparsers(dest="command", metavar="CMD")}
    for path, cmd in sorted(_REGISTRY.items()):
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in groups:
                group = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                groups[prefix] = group.add_subparsers(dest="_".join(prefix), metavar="CMD")
                groups[prefix].required = True
        sub = groups[path[:-1]].add_parser(path[-1], help=cmd.help, parents=[common])
        cmd.configure(sub)
        sub.set_defaults(run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = args.run(args)
    except (UsageError, ConfigError) as exc:
        return _fail(f"error: {exc}", 2)
    except ClientError as exc:
        where = f" ({exc.address})" if exc.address else ""
        return _fail(f"{exc.code or type(exc).__name__}{where}: {exc.message}", 1)
    except ClusterError as exc:
        return _fail(f"cluster: {exc}", 1)
    except (ListenError, DirectoryInUse, CorruptEntry) as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:  # `dledger ... | head`: the reader left; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


def _fail(message: str, code: int) -> int:
    print(f"dledger: {message}", file=sys.stderr)
    return code


# ---------------------------------------------------------------- helpers


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


# ---------------------------------------------------------------- serve


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="node TOML file (see config.py)")
    p.add_argument("--peer", action="append", metavar="ID=RAFT/CLIENT", help="repeatable")
    for f in dataclasses.fields(NodeConfig):
        if f.name in ("peers", "cluster", "tls_ca"):  # --peer; --cluster-name; --tls-ca
            continue
        opt = "--" + f.name.replace("_", "-")
        if str(f.type) == "bool":
            p.add_argument(opt, dest=f"cfg_{f.name}", action="store_const", const=True)
            continue
        kind = _FIELD_TYPES[str(f.type)]
        choices = ("sync", "async") if f.name == "flush_mode" else None
        p.add_argument(opt, dest=f"cfg_{f.name}", type=kind, choices=choices, metavar="V")


@command("serve", "run one node until SIGTERM/SIGINT", _serve_args)
def _serve(args: argparse.Namespace) -> int:
    config = serve_config(args)
    from dledger_commitlog.service import server  # lazily: the server's imports are not the CLI's

    server.run(config)
    return 0


def serve_config(args: argparse.Namespace) -> NodeConfig:
    """The NodeConfig `serve` runs: the --config file with the options on top."""
    overrides: dict[str, Any] = {
        f.name: getattr(args, f"cfg_{f.name}", None) for f in dataclasses.fields(NodeConfig)
    }
    overrides["cluster"] = args.cluster_name
    overrides["tls_ca"] = args.tls_ca
    overrides["peers"] = tuple(parse_peer(p) for p in args.peer) if args.peer else None
    return load_config(args.config, overrides)


# ---------------------------------------------------------------- messages


def _message_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True)
    p.add_argument("--key", action="extend", nargs="+", default=[], metavar="K")
    p.add_argument("--tag", metavar="TAG")
    p.add_argument("--property", action="extend", nargs="+", type=_key_value, default=[])
    p.add_argument("--uniq-key", metavar="U", help="idempotency key (default: a fresh one)")
    p.add_argument("--queue", type=_non_negative, metavar="Q", help="default: the server picks")
    body = p.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", metavar="TEXT")
    body.add_argument("--body-file", metavar="F", help="'-': standard input")


def _put_args(p: argparse.ArgumentParser) -> None:
    _message_args(p)
    later = p.add_mutually_exclusive_group()
    later.add_argument(
        "--delay-level",
        type=_positive,
        metavar="L",
        help="deliver after the cluster's delay level L (1: 1s by default)",
    )
    later.add_argument("--deliver-at", type=_deliver_at, metavar="TIME",
                       help="deliver at TIME: ISO 8601 (2026-01-01T12:00:00Z) or ms since "
                       "the epoch")  # fmt: skip


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _deliver_at(text: str) -> int:
    """ISO 8601 (a zone is required) or ms since the epoch -> ms since the epoch."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither ISO 8601 (2026-01-01T12:00:00Z) nor ms since the epoch"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add Z or +HH:MM)")
    return int(when.timestamp() * 1000)


def _body_of(args: argparse.Namespace) -> bytes | str:
    if args.body is not None:
        return str(args.body)
    if args.body_file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(args.body_file).read_bytes()
    except OSError as exc:
        raise UsageError(f"--body-file: {exc}") from exc


def _result_doc(r: PutResult) -> dict[str, Any]:
    return {
        "msg_id": r.msg_id,
        "commitlog_offset": r.commitlog_offset,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
        "store_timestamp": r.store_timestamp_ms,
        "duplicate": r.duplicate,
    }


@command("put", "put one message (--delay-level/--deliver-at: delivered later)", _put_args)
def _put(args: argparse.Namespace) -> int:
    body = _body_of(args)
    with make_client(args) as client:
        r = client.put(
            args.topic,
            body,
            keys=args.key,
            tags=args.tag,
            properties=dict(args.property),
            uniq_key=args.uniq_key,
            queue_id=args.queue,
            delay_level=args.delay_level or 0,
            deliver_at_ms=args.deliver_at or 0,
        )
    doc = _result_doc(r)
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


def _put_half_args(p: argparse.ArgumentParser) -> None:
    _message_args(p)
    p.add_argument("--group", required=True, metavar="G", help="the producer group")


@command("tx put-half", "store a transactional message (invisible until committed)",
         _put_half_args)  # fmt: skip
def _tx_put_half(args: argparse.Namespace) -> int:
    body = _body_of(args)
    with make_client(args) as client:
        half = client.put_half(
            args.topic, body, producer_group=args.group, keys=args.key, tags=args.tag,
            properties=dict(args.property), uniq_key=args.uniq_key, queue_id=args.queue,
        )  # fmt: skip
    doc = {"transaction_id": half.transaction_id, "half_offset": half.half_offset,
           "duplicate": half.result.duplicate}  # fmt: skip
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


def _tx_end_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("transaction_id", metavar="ID")
    p.add_argument("half_offset", type=_non_negative, metavar="HALF_OFFSET")


def _tx_end(args: argparse.Namespace, commit: bool) -> int:
    with make_client(args) as client:
        done = client.end_transaction(args.transaction_id, args.half_offset, commit=commit)
    doc: dict[str, Any] = {"transaction_id": args.transaction_id,
                           "outcome": "committed" if done.committed else "rolled back",
                           "duplicate": done.duplicate}  # fmt: skip
    if done.result is not None:
        doc |= {"msg_id": done.result.msg_id, "commitlog_offset": done.result.commitlog_offset}
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


@command("tx commit", "commit a transaction: its message becomes visible, once", _tx_end_args)
def _tx_commit(args: argparse.Namespace) -> int:
    return _tx_end(args, True)


@command("tx rollback", "roll a transaction back: its message is never visible", _tx_end_args)
def _tx_rollback(args: argparse.Namespace) -> int:
    return _tx_end(args, False)


def _get_args(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--msg-id", metavar="ID")
    which.add_argument("--offset", type=_non_negative, metavar="N", help="commit-log offset")
    p.add_argument("--linearizable", action="store_true", help="confirm with the leader first")


@command("get", "one message by id or commit-log offset", _get_args)
def _get(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        m = client.get(msg_id=args.msg_id, offset=args.offset, linearizable=args.linearizable)
    doc = message_json(m)
    text = "\n".join(f"{k:<18} {cell(v)}" for k, v in doc.items())
    emit(args, doc, text)
    return 0


def _pull_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True)
    p.add_argument("--queue", type=_non_negative, required=True, metavar="Q")
    p.add_argument("--offset", type=_non_negative, required=True, metavar="N")
    p.add_argument("--max", type=int, default=32, metavar="M")
    p.add_argument("--tag-expr", default="*", metavar="E", help="'*' or 'TagA || TagB'")
    p.add_argument("--wait-ms", type=_non_negative, default=0, metavar="W")


@command("pull", "messages of one consume queue from an offset", _pull_args)
def _pull(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        r: PullResult = client.pull(
            args.topic, args.queue, args.offset, args.max, args.tag_expr, args.wait_ms
        )
    doc = {
        "messages": [message_json(m) for m in r.messages],
        "next_offset": r.next_offset,
        "min_offset": r.min_offset,
        "max_offset": r.max_offset,
    }
    footer = f"next_offset {r.next_offset}  (queue holds {r.min_offset}..{r.max_offset})"
    emit(args, doc, messages_table(r.messages) + "\n" + footer)
    return 0


def _query_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--begin", type=_non_negative, default=0, metavar="TS", help="ms since epoch")
    p.add_argument("--end", type=_non_negative, default=0, metavar="TS", help="0: now")
    p.add_argument("--max", type=int, default=32, metavar="M")


@command("query", "messages by key", _query_args)
def _query(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        msgs = client.query(args.topic, args.key, args.begin, args.end, args.max)
    emit(args, {"messages": [message_json(m) for m in msgs]}, messages_table(msgs))
    return 0


def _consume_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", required=True, metavar="G", help="consumer group")
    p.add_argument("--topic", required=True)
    p.add_argument("--tag-expr", default="*", metavar="E", help="'*' or 'TagA || TagB'")
    p.add_argument("--max", type=_non_negative, default=0, metavar="N",
                   help="stop after N messages (0: no limit)")  # fmt: skip
    p.add_argument("--idle-exit", type=float, default=0.0, metavar="S",
                   help="stop after S seconds without a new message (0: never)")  # fmt: skip
    p.add_argument("--batch", type=int, default=32, metavar="B", help="messages per pull")


@command("consume", "tail a topic from the group's committed offsets, committing as it goes",
         _consume_args)  # fmt: skip
def _consume(args: argparse.Namespace) -> int:
    """Pull every queue of the topic from the group's offset; commit after each batch."""
    consumed = 0
    idle_since = time.monotonic()
    with make_client(args) as client:
        positions: dict[int, int] = {}
        wait_ms = 0
        while not (args.max and consumed >= args.max):
            for q in client.queue_offsets(args.topic):
                if q.queue_id not in positions:
                    committed = client.fetch_offset(args.group, args.topic, q.queue_id)
                    start = committed.get(q.queue_id, -1)
                    positions[q.queue_id] = start if start >= 0 else q.min_offset
            got = 0
            for queue_id, offset in sorted(positions.items()):
                limit = args.batch if not args.max else min(args.batch, args.max - consumed)
                if limit <= 0:
                    break
                r = client.pull(args.topic, queue_id, offset, limit, args.tag_expr,
                                wait_ms=wait_ms)  # fmt: skip
                for m in r.messages:
                    _print_consumed(args, m)
                got += len(r.messages)
                consumed += len(r.messages)
                if r.next_offset != offset:
                    client.commit_offset(args.group, args.topic, queue_id, r.next_offset)
                    positions[queue_id] = r.next_offset
            if got:
                idle_since, wait_ms = time.monotonic(), 0
            else:
                if args.idle_exit and time.monotonic() - idle_since >= args.idle_exit:
                    break
                wait_ms = max(50, 1000 // max(1, len(positions)))
    if not args.json:
        print(f"consumed {consumed} messages", file=sys.stderr)
    return 0


def _print_consumed(args: argparse.Namespace, m: StoredMessage) -> None:
    if args.json:
        print(json.dumps(message_json(m)), flush=True)
    else:
        print(f"{m.topic}/{m.queue_id}@{m.queue_offset}  {m.msg_id}  tags={m.tags or '-'}  "
              f"keys={','.join(m.keys) or '-'}  {preview(m.body)}", flush=True)  # fmt: skip


# ---------------------------------------------------------------- status and admin


def status_json(s: NodeStatus | StatusError) -> dict[str, Any]:
    if isinstance(s, StatusError):
        return {"address": s.address, "error": s.error.message, "code": s.error.code}
    doc = {"node_id": s.node_id, "role": s.role, "term": s.term, "leader": s.leader_id}
    doc.update({f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
    doc["peers"] = [dataclasses.asdict(p) for p in s.peers]
    return doc


def status_table(statuses: Sequence[NodeStatus | StatusError]) -> str:
    headers = ("node", "address", "role", "term", "leader", "last", "commit", "applied", "note")
    rows: list[list[Any]] = []
    for s in statuses:
        if isinstance(s, StatusError):
            rows.append(["?", s.address, "-", "-", "-", "-", "-", "-", s.error.message[:60]])
        else:
            rows.append([s.node_id, s.address, s.role, s.term, s.leader_id or None])
            rows[-1] += [s.last_index, s.committed_index, s.applied_index, s.flush_mode]
    return table(headers, rows)


@command("status", "every server's Raft and store status")
def _status(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        statuses = client.status_all(timeout_s=min(args.timeout, 5.0))
    emit(args, {"nodes": [status_json(s) for s in statuses]}, status_table(statuses))
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


@command("verify", "check a stopped node's store offline (CRCs, index, queues vs a rebuild)",
         _verify_args)  # fmt: skip
def _verify(args: argparse.Namespace) -> int:
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
    p.add_argument("--force", action="store_true",
                   help="delete old-enough-or-not segments that are safe to delete")  # fmt: skip


@command("admin clean-now", "run commit-log retention now on every node", _clean_args)
def _clean_now(args: argparse.Namespace) -> int:
    rows = []
    with make_client(args) as client:
        for server in client.servers:
            try:
                r = client.clean_now(server, force=args.force)
                rows.append({"server": server, "deleted_segments": r.deleted_segments,
                             "min_offset": r.min_offset, "reason": r.reason})  # fmt: skip
            except ClientError as exc:
                rows.append({"server": server, "error": exc.message})
    text = table(("server", "deleted", "min offset", "note"),
                 [(r["server"], r.get("deleted_segments"), r.get("min_offset"),
                   r.get("reason") or r.get("error")) for r in rows])  # fmt: skip
    emit(args, {"nodes": rows}, text)
    return 0 if all("error" not in r for r in rows) else 1


# ---------------------------------------------------------------- local clusters


def _cluster_dir(args: argparse.Namespace) -> Path:
    if args.dir:
        return Path(args.dir)
    if args.cluster:
        return Path(args.cluster).parent
    raise UsageError("which cluster? pass --dir D")


def _cluster_up_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="D", help="cluster directory (holds cluster.json)")
    p.add_argument("--nodes", type=int, default=3, choices=(1, 3, 5))
    p.add_argument("--base-port", type=int, metavar="P", help="default: free ports")
    p.add_argument("--flush-mode", choices=("sync", "async"))
    p.add_argument("--set", action="append", type=_key_value, default=[], metavar="FIELD=V")
    p.add_argument("--wait", type=float, default=30.0, metavar="S", help="for a leader")
    p.add_argument("--tls", action="store_true", default=None,
                   help="TLS on every port with a development CA made in D/pki")  # fmt: skip
    p.add_argument("--acl", action="store_true", default=None,
                   help="clients sign calls; an admin account in D/admin.credentials")  # fmt: skip


def _dir_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="D", help="cluster directory (holds cluster.json)")


def _extra_config(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    kinds = {f.name: _FIELD_TYPES.get(str(f.type)) for f in dataclasses.fields(NodeConfig)}
    out: dict[str, Any] = {}
    for key, value in pairs:
        kind = kinds.get(key)
        if kind is None:
            raise UsageError(f"--set {key}: not a node setting")
        try:
            out[key] = kind(value)
        except ValueError as exc:
            raise UsageError(f"--set {key}={value}: {exc}") from exc
    return out


@command("cluster up", "start a local cluster (or restart a stopped one)", _cluster_up_args)
def _cluster_up(args: argparse.Namespace) -> int:
    from dledger_commitlog.cli.launcher import LocalCluster

    try:
        cluster = LocalCluster(
            _cluster_dir(args),
            nodes=args.nodes,
            base_port=args.base_port,
            flush_mode=args.flush_mode,
            extra_config=_extra_config(args.set) or None,
            cluster=args.cluster_name or "dledger",
            tls=args.tls,
            acl=args.acl,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    cluster.up(timeout_s=args.wait)
    cluster.detach()
    return _print_cluster(args, cluster)


@command("cluster down", "stop a local cluster", _dir_args)
def _cluster_down(args: argparse.Namespace) -> int:
    from dledger_commitlog.cli.launcher import LocalCluster

    directory = _cluster_dir(args)
    if not (directory / "cluster.json").exists():
        raise UsageError(f"{directory}: no cluster.json here")
    LocalCluster(directory).down()
    emit(args, {"stopped": str(directory)}, f"stopped the cluster in {directory}")
    return 0


@command("cluster status", "processes and status of a local cluster", _dir_args)
def _cluster_status(args: argparse.Namespace) -> int:
    from dledger_commitlog.cli.launcher import LocalCluster

    directory = _cluster_dir(args)
    if not (directory / "cluster.json").exists():
        raise UsageError(f"{directory}: no cluster.json here")
    return _print_cluster(args, LocalCluster(directory))


def _print_cluster(args: argparse.Namespace, cluster: Any) -> int:
    statuses = cluster.statuses(timeout_s=1.0)
    nodes = []
    for spec in cluster:
        doc = {"id": spec.id, "pid": cluster.pid(spec.id), "client": spec.client}
        doc |= {"raft": spec.raft, "metrics": spec.metrics, "data_dir": spec.data_dir}
        doc["status"] = status_json(statuses[spec.id])
        nodes.append(doc)
    keys = ("role", "term", "leader", "error")
    rows = [[n["id"], n["pid"], n["client"], *(n["status"].get(k) for k in keys)] for n in nodes]
    text = table(("node", "pid", "client", "role", "term", "leader", "error"), rows)
    emit(args, {"dir": str(cluster.directory), "nodes": nodes}, text)
    return 0


def _certs_args(p: argparse.ArgumentParser) -> None:
    from dledger_commitlog.cli.certs import add_arguments

    add_arguments(p)


@command("certs", "make a development CA and node/client certificates (TLS)", _certs_args)
def _certs(args: argparse.Namespace) -> int:
    from dledger_commitlog.cli.certs import run as run_certs

    return run_certs(args)
