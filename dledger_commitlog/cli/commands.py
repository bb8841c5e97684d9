"""The registry of `dledger` subcommands and the helpers every subcommand module uses.

Owns `command` (register a subcommand; a space in the name makes a group), the
client the connection options name (`make_client`, `security_files`, and
`cluster_dir` for a local cluster's directory), the argument types subcommands
share (`key_value`, `non_negative`, `positive`, `FIELD_TYPES` for node settings and
`node_settings` for `--set` pairs),
and the output helpers (`emit`: JSON with --json, else the text; `table`; the
views of messages and members). Modules that add subcommands import this one:
the CLI's own (`cli.messages`, `cli.admin`, `cli.main`), and the plugins named by the
`dledger.commands` entry points (`analytics.commands`, `chaos.commands`), which
`load_plugins` imports, the way pytest and Flask find theirs: no module imports
the CLI that imports it, and the server package never imports analytics or chaos.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dledger_commitlog.common.extras import MissingExtra
from dledger_commitlog.node.config import NodeConfig

if TYPE_CHECKING:  # the client is loaded by the commands that make one: `serve` never does
    from dledger_commitlog.client import Client, MemberInfo, StoredMessage


class UsageError(Exception):
    """The command line asks for something impossible; exit code 2."""


Run = Callable[[argparse.Namespace], int]
Configure = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True, slots=True)
class Command:
    path: tuple[str, ...]  # ("cluster", "up")
    help: str
    configure: Configure
    run: Run


_REGISTRY: dict[tuple[str, ...], Command] = {}
PLUGIN_GROUP = "dledger.commands"


def command(name: str, help: str, configure: Configure | None = None) -> Callable[[Run], Run]:
    """Register `run` as the subcommand `name` ("put", "cluster up")."""

    def register(run: Run) -> Run:
        path = tuple(name.split())
        if path in _REGISTRY:
            raise ValueError(f"subcommand {name!r} registered twice")
        _REGISTRY[path] = Command(path, help, configure or (lambda p: None), run)
        return run

    return register


def renamed_command(old: str, new: str) -> None:
    """Keep the subcommand `old` for one more release: it runs `new`, after a warning on
    stderr naming it (hidden from the help)."""
    cmd = _REGISTRY[tuple(new.split())]

    def run(args: argparse.Namespace) -> int:
        print(
            f"dledger: `{old}` is now `{new}` (the old name works for one more release)",
            file=sys.stderr,
        )
        return cmd.run(args)

    _REGISTRY[tuple(old.split())] = Command(
        tuple(old.split()), argparse.SUPPRESS, cmd.configure, run
    )


class RenamedOption(argparse.Action):
    """An option kept for one more release under its old name: stores into the new
    option's `dest`, after a warning on stderr naming the new one."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"dledger: {option_string} is now {self.new} (the old name works for one more release)",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def load_plugins() -> None:
    """Import every module the `dledger.commands` entry points name (registering their
    subcommands). A plugin that fails to load is one line on stderr; the rest work."""
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            ep.load()
        except MissingExtra as exc:  # installed without its extra: its commands say so
            for name in exc.commands:
                _missing_extra(name, exc)
        except Exception as exc:  # a broken plugin must not take `dledger put` down
            print(
                f"dledger: the {ep.name} commands are unavailable ({ep.value}: {exc})",
                file=sys.stderr,
            )


def _missing_extra(name: str, exc: MissingExtra) -> None:
    """Register `name` as a command that says which extra it needs (once)."""
    if (name,) in _REGISTRY:
        return

    def run(args: argparse.Namespace) -> int:
        print(f"dledger {name}: {exc}", file=sys.stderr)
        return 2

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.set_defaults(any_arguments=True)  # whatever follows: it only says the above

    command(name, f"(needs the [{exc.extra}] extra)", configure)(run)


def make_client(args: argparse.Namespace, shard: int | None = None) -> Client:
    """The client the connection options (or DLEDGER_SERVERS / DLEDGER_CLUSTER) name,
    of shard `shard` (default: --shard, else 1)."""
    from dledger_commitlog.client import Access, Client

    kw: dict[str, Any] = {"timeout_s": args.timeout, "cluster": args.cluster_name}
    kw["shard"] = shard if shard is not None else getattr(args, "shard", None) or 1
    servers = args.servers or os.environ.get("DLEDGER_SERVERS")
    cluster_file = args.cluster or os.environ.get("DLEDGER_CLUSTER")
    try:
        access = Access.load(*security_files(args))
    except OSError as exc:
        raise UsageError(f"{exc.filename}: {exc.strerror}") from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    kw.update(tls_ca=access.tls_ca, credentials=access.credentials)
    try:
        if servers:
            return Client([s for s in servers.split(",") if s.strip()], **kw)
        if cluster_file:
            return Client.from_cluster_file(cluster_file, **kw)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    raise UsageError("no servers: pass --cluster FILE or --servers HOST:PORT,...")


def security_files(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The CA and credentials files for this command: the options, else the environment
    (DLEDGER_TLS_CA, DLEDGER_CREDENTIALS), else what a cluster file records."""
    tls_ca = args.tls_ca or os.environ.get("DLEDGER_TLS_CA")
    credentials = args.credentials or os.environ.get("DLEDGER_CREDENTIALS")
    cluster_file = args.cluster or os.environ.get("DLEDGER_CLUSTER")
    if cluster_file and not (args.servers or os.environ.get("DLEDGER_SERVERS")):
        from dledger_commitlog.client import cluster_security

        try:
            recorded = cluster_security(json.loads(Path(cluster_file).read_text()))
        except (OSError, ValueError, AttributeError) as exc:
            raise UsageError(f"{cluster_file}: not a readable cluster file ({exc})") from exc
        tls_ca, credentials = tls_ca or recorded[0], credentials or recorded[1]
    return tls_ca, credentials


def key_value(text: str) -> tuple[str, str]:
    """An argument type: `KEY=VALUE` (the value may hold more `=`)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def non_negative(text: str) -> int:
    """An argument type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def positive(text: str) -> int:
    """An argument type: an integer >= 1."""
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _int_list(text: str) -> tuple[int, ...]:
    """ "0,1,2" -> (0, 1, 2) (`--host-shards`, `--set host_shards=...`)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of integers") from None


# The parser of each NodeConfig field's type, by the type's name (`serve`'s options, `--set`).
FIELD_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "int | None": int,
    "bool": _bool,
    "tuple[int, ...]": _int_list,
}


def node_settings(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """`--set FIELD=V` pairs as NodeConfig settings (each value parsed by its field's type)."""
    kinds = {f.name: FIELD_TYPES.get(str(f.type)) for f in dataclasses.fields(NodeConfig)}
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


def emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(json.dumps(doc, sort_keys=False) if args.json else text)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[[cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def cell(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return "-" if value is None or value == "" else str(value)


def cluster_dir(args: argparse.Namespace) -> Path:
    """The local cluster's directory: --dir, else the one holding --cluster FILE."""
    if getattr(args, "dir", None):
        return Path(args.dir)
    if args.cluster:
        return Path(args.cluster).parent
    raise UsageError("which cluster? pass --dir D")


def members_table(members: Sequence[MemberInfo]) -> str:
    """Voters and learners, each one's match index and lag (-: not known here)."""
    rows = [(m.id, m.role, m.raft, m.client, _known(m.match_index), _known(m.lag)) for m in members]
    return table(("member", "role", "raft", "client", "match", "lag"), rows)


def _known(value: int) -> int | None:
    return None if value < 0 else value


def messages_table(msgs: Sequence[StoredMessage]) -> str:
    rows = [
        (m.queue_id, m.queue_offset, m.commitlog_offset, m.msg_id, m.tags, m.keys, preview(m.body))
        for m in msgs
    ]
    return table(("queue", "q_offset", "cl_offset", "msg_id", "tags", "keys", "body"), rows)


def preview(body: bytes, width: int = 40) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes>"
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."
