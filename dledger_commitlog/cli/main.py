"""The `dledger` command line: one argparse tree built from a registry of subcommands.

Owns argument parsing, the `serve` command (one node, its settings from a TOML
file with options on top), and exit codes: 0 success, 1 the cluster or a server
said no, 2 usage (bad arguments, bad config, unreadable input files). Expected
errors print one line on stderr, never a traceback. Every subcommand accepts the
same connection and output options (`--cluster FILE | --servers H:P,...`,
`--cluster-name`, `--timeout`, `--json`: one JSON document on stdout, otherwise
readable tables). Subcommands register with `@command("admin clean-now", ...)`
(`commands.py`, which also has the helpers they share): the message commands in
`messages.py`, the operator's in `admin.py`, membership in `members.py`, consumer
groups in `groups.py`, and the plugins `build_parser` loads (`analytics.commands`,
`chaos.commands`). A space in the name makes a command group.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from dledger_commitlog.cli.cluster_layout import ClusterError
from dledger_commitlog.cli.commands import (
    _REGISTRY,
    FIELD_TYPES,
    RenamedOption,
    UsageError,
    command,
    load_plugins,
)
from dledger_commitlog.node.config import (
    RETIRED,
    ConfigError,
    ListenError,
    NodeConfig,
    load_config,
    parse_peer,
    parse_route,
)
from store.errors import CorruptEntry, DirectoryInUse

# The modules that register the CLI's own subcommands besides `serve` (defined here).
# A node process (`dledger serve`) loads none of them, nor the client they are built
# on, nor the plugins: a quarter of its start-up CPU, paid by every node that starts.
COMMAND_MODULES = (
    "admin",  # the operator's commands
    "console",  # `dledger console`
    "deploy",  # `dledger cluster init`
    "groups",  # the consumer-group commands
    "maintenance",  # drain, rolling-restart
    "members",  # the membership commands
    "messages",  # the message commands
    "scaleout",  # the topic and shard commands
    "snapshot",  # the backup commands
)


def load_commands() -> None:
    """Register every subcommand: the CLI's own modules and the plugins'."""
    for name in COMMAND_MODULES:
        importlib.import_module(f"dledger_commitlog.cli.{name}")
    load_plugins()  # analytics, chaos: their modules register their subcommands


def build_parser(*, serve_only: bool = False) -> argparse.ArgumentParser:
    """The whole command tree (`serve_only`: whatever is registered, without loading
    the other commands' modules: a node's own start)."""
    if not serve_only:
        load_commands()
    common = argparse.ArgumentParser(add_help=False)
    conn = common.add_argument_group("connection and output")
    conn.add_argument("--cluster", metavar="FILE", help="cluster.json of a cluster")
    conn.add_argument("--servers", metavar="H:P,...", help="client addresses of the servers")
    conn.add_argument("--cluster-name", metavar="NAME", help="refuse servers of other clusters")
    conn.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per command")
    conn.add_argument("--tls-ca", metavar="PEM", help="speak TLS; trust servers this CA signed")
    conn.add_argument(
        "--credentials", metavar="FILE", help="access_key and secret_key (TOML) to sign calls with"
    )
    conn.add_argument("--json", action="store_true", help="print one JSON document")
    conn.add_argument(
        "--shard",
        type=int,
        metavar="N",
        help="the shard (Raft group) of the cluster to speak to (default 1; docs/scaling.md)",
    )
    conn.add_argument(
        "--raft-group",
        type=int,
        dest="shard",
        action=RenamedOption,
        new="--shard",
        help=argparse.SUPPRESS,
    )
    parser = argparse.ArgumentParser(prog="dledger", description="dledger-py commit log")
    groups: dict[tuple[str, ...], Any] = {(): parser.add_subparsers(dest="command", metavar="CMD")}
    for path, cmd in sorted(_REGISTRY.items()):
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in groups:
                hidden = all(
                    c.help == argparse.SUPPRESS for p, c in _REGISTRY.items() if p[:depth] == prefix
                )
                group = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                if hidden:
                    _hide(groups[prefix[:-1]], prefix[-1])
                groups[prefix] = group.add_subparsers(dest="_".join(prefix), metavar="CMD")
                groups[prefix].required = True
        sub = groups[path[:-1]].add_parser(path[-1], help=cmd.help, parents=[common])
        if cmd.help == argparse.SUPPRESS:
            _hide(groups[path[:-1]], path[-1])
        cmd.configure(sub)
        sub.set_defaults(run=cmd.run)
    return parser


def _hide(subparsers: Any, name: str) -> None:
    """Leave subcommand `name` out of the help (an old name kept for one more release)."""
    subparsers._choices_actions = [a for a in subparsers._choices_actions if a.dest != name]


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(serve_only=words[:1] == ["serve"])
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = args.run(args)
    except (UsageError, ConfigError) as exc:
        return _fail(f"error: {exc}", 2)
    except ClusterError as exc:
        return _fail(f"cluster: {exc}", 1)
    except (ListenError, DirectoryInUse, CorruptEntry) as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:  # `dledger ... | head`: the reader left; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        client_error = _client_error(exc)
        if client_error is None:
            raise
        return _fail(client_error, 1)
    return code


def _client_error(exc: Exception) -> str | None:
    """The line for a client's error (None: `exc` is none). The client is loaded by the
    commands that call a cluster; where it was never loaded, nothing raised one."""
    errors = sys.modules.get("dledger_commitlog.client.errors")
    if errors is None or not isinstance(exc, errors.ClientError):
        return None
    where = f" ({exc.address})" if exc.address else ""
    return f"{exc.code or type(exc).__name__}{where}: {exc.message}"


def _fail(message: str, code: int) -> int:
    print(f"dledger: {message}", file=sys.stderr)
    return code


# ---------------------------------------------------------------- serve


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="node TOML file (see config.py)")
    p.add_argument(
        "--from-env",
        action="store_true",
        help="a pod of a Kubernetes StatefulSet: id, peers, ports from its environment "
        "(docs/kubernetes.md); the config file and options on top",
    )
    p.add_argument("--peer", action="append", metavar="ID=RAFT/CLIENT", help="repeatable")
    p.add_argument(
        "--route",
        action="append",
        metavar="ID=RAFT",
        help="how to reach node ID should it join (repeatable)",
    )
    for f in dataclasses.fields(NodeConfig):
        # --peer; --cluster-name; --tls-ca; --route; a per-shard config's own shard
        if f.name in ("peers", "cluster", "tls_ca", "routes", "shard"):
            continue
        opt = "--" + f.name.replace("_", "-")
        if str(f.type) == "bool":
            p.add_argument(opt, dest=f"cfg_{f.name}", action="store_const", const=True)
            continue
        kind = FIELD_TYPES[str(f.type)]
        choices = {"flush_mode": ("sync", "async")}.get(f.name)
        p.add_argument(opt, dest=f"cfg_{f.name}", type=kind, choices=choices, metavar="V")
    for name in RETIRED:  # still taken, with the config file's warning
        p.add_argument("--" + name.replace("_", "-"), dest=f"cfg_{name}", help=argparse.SUPPRESS)


@command("serve", "run one node until SIGTERM/SIGINT", _serve_args)
def _serve(args: argparse.Namespace) -> int:
    pod = None
    if args.from_env:  # a StatefulSet's pod: it calls the cluster (the client) to join
        from dledger_commitlog.cli import k8s_entry

        pod = k8s_entry.pod_from_env(os.environ)
    config = serve_config(args, pod.settings() if pod is not None else {})
    from dledger_commitlog.process import server  # lazily: the server's imports are not the CLI's

    if pod is not None:
        k8s_entry.before_serving(pod, config, os.environ)
    server.run(config)
    return 0


def serve_config(args: argparse.Namespace, base: dict[str, Any] | None = None) -> NodeConfig:
    """The NodeConfig `serve` runs: the --config file, `base` (a pod's settings) on top
    of it, the options on top of both."""
    overrides: dict[str, Any] = dict(base or {})
    for name in (*(f.name for f in dataclasses.fields(NodeConfig)), *RETIRED):
        value = getattr(args, f"cfg_{name}", None)
        if value is not None:
            overrides[name] = value
    if args.cluster_name is not None:
        overrides["cluster"] = args.cluster_name
    if args.tls_ca is not None:
        overrides["tls_ca"] = args.tls_ca
    if args.peer:
        overrides["peers"] = tuple(parse_peer(p) for p in args.peer)
    if args.route:
        overrides["routes"] = tuple(parse_route(r) for r in args.route)
    return load_config(args.config, overrides)
