"""A cluster on real hosts: `dledger cluster init` writes each node's directory, to be
copied to its host, and the operator's files (docs/deploy.md).

`HostsLayout` is a `ClusterLayout` (the same node configs, security files and
cluster.json) whose node i runs on host i. Two things differ from a local cluster:
every node listens on its host's own address, the ports being the same on every host
unless a host names its own; and a node's directory `D/n{i}` holds everything the
node reads: its node.toml names its data directory and its copies of the security
files by paths relative to that directory (`data`, `cluster.secret`, `pki/ca.pem`,
`pki/node-{i}.pem` and `.key`, `acl.toml`), so it runs wherever it is copied, started
in it (`cd DIR && dledger serve --config node.toml`). What stays with the operator in
D: cluster.json (the servers, the CA and the admin's credentials for the CLI and
`Client.from_cluster_file`), the CA's key, `admin.credentials` and the originals.

A host is `HOST` or `HOST:PORT` (an IPv6 address in brackets: `[fd00::1]:7001`):
HOST is an IP address or a DNS name, the address the node listens on and its peers
and clients dial; PORT is its client port (default --client-port, 7001). Its Raft and
metrics ports are --raft-port and --metrics-port, by default its client port + 100
and + 200 (the offsets of `cluster up --base-port`).

Invariants: nothing is written unless every argument is good (one line says what is
not); a directory that holds anything is refused unless --force, which first removes
what an earlier init wrote there; the CA's key and the admin's credentials are never
in a node's directory.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

from dledger_commitlog.cli.cluster_layout import (
    ACL_FILE,
    CREDENTIALS_FILE,
    PKI_DIR,
    SECRET_FILE,
    ClusterLayout,
    LayoutOptions,
    NodeSpec,
    shards_config,
)
from dledger_commitlog.cli.commands import (
    UsageError,
    command,
    emit,
    key_value,
    node_settings,
    positive,
)
from dledger_commitlog.node.config import ConfigError
from dledger_commitlog.node.security import check_exposure
from store.fileio import write_atomically

DEFAULT_CLIENT_PORT = 7001
RAFT_OFFSET, METRICS_OFFSET = 100, 200  # a host's ports beside its client port
DEFAULT_REMOTE_DIR = "/var/lib/dledger"


@dataclass(frozen=True, slots=True)
class HostPorts:
    """Where node i listens: its host (as an address names it) and its three ports."""

    host: str  # an IP address (IPv6 in brackets) or a DNS name
    client: int
    raft: int
    metrics: int

    def address(self, port: int) -> str:
        return f"{self.host}:{port}"


MAX_PORT = 65535


def is_port(n: int) -> bool:
    return 0 < n <= MAX_PORT


def parse_host(text: str) -> tuple[str, int | None]:
    """`HOST` or `HOST:PORT` -> (HOST as an address names it, PORT or None); an IPv6
    address takes brackets (a bare one has no port). UsageError naming `text`."""
    from dledger_commitlog.cli.certs import parse_host as host_name  # cryptography: lazily

    raw, port = text.strip(), None
    head, sep, tail = raw.rpartition(":")
    bare_ipv6 = raw.count(":") > 1 and not raw.startswith("[")
    if sep and not bare_ipv6 and (not head.startswith("[") or head.endswith("]")):
        if not (tail.isascii() and tail.isdigit() and is_port(int(tail))):
            raise UsageError(f"--hosts: {text!r}: the port is not a number in 1..{MAX_PORT}")
        raw, port = head, int(tail)
    try:
        value = host_name(raw)
    except ValueError as exc:
        raise UsageError(f"--hosts: {exc}") from None
    if isinstance(value, ipaddress.IPv6Address):
        return f"[{value}]", port
    if isinstance(value, str) and value.startswith("*"):
        raise UsageError(f"--hosts: {text!r} is a wildcard, not a host")
    return str(value), port


def host_ports(
    hosts: Sequence[str], client: int, raft: int | None, metrics: int | None
) -> list[HostPorts]:
    """Each host's address and ports (see the module doc); UsageError if two nodes would
    listen on one address, or a node on one address twice."""
    out: list[HostPorts] = []
    seen: dict[str, int] = {}
    given: dict[tuple[str, int | None], int] = {}
    for i, text in enumerate(hosts, 1):
        host, port = parse_host(text)
        first = given.setdefault((host, port), i)
        if first != i:
            raise UsageError(f"--hosts: {text!r} is given twice (nodes {first} and {i})")
        c = port or client
        r = raft if raft is not None else c + RAFT_OFFSET
        m = metrics if metrics is not None else c + METRICS_OFFSET
        if not all(map(is_port, (c, r, m))):
            raise UsageError(f"--hosts: {text!r}: its ports {c}, {r}, {m} run past {MAX_PORT}")
        each = HostPorts(host, c, r, m)
        for p in (c, r, m):
            other = seen.setdefault(each.address(p), i)
            if other != i:
                raise UsageError(f"--hosts: nodes {other} and {i} would both listen on {host}:{p}")
        if len({c, r, m}) < 3:
            raise UsageError(f"--hosts: {text!r} would listen on one port twice ({c}, {r}, {m})")
        out.append(each)
    return out


class HostsLayout(ClusterLayout):
    """The files of a cluster whose node i runs on a host of its own (the module doc)."""

    def __init__(
        self,
        directory: str | Path,
        placement: Sequence[HostPorts],
        **options: Unpack[LayoutOptions],
    ) -> None:
        """Node i on `placement[i - 1]`; `options` as `ClusterLayout`'s (but `nodes`,
        `base_port` and `hosts`, which `placement` says)."""
        self.hosts = list(placement)
        options["nodes"] = len(self.hosts)
        super().__init__(directory, **options)

    def _load(self) -> dict[str, Any] | None:
        return None  # made new each time: `cluster init` refuses a directory in use

    def _allocate(
        self, nodes: int, base_port: int | None, hosts: Mapping[int, str]
    ) -> dict[int, NodeSpec]:
        specs = {}
        for i, h in enumerate(self.hosts, 1):
            addresses = (h.address(h.client), h.address(h.raft), h.address(h.metrics))
            specs[i] = NodeSpec(i, *addresses, "data", self.directory / f"n{i}")
        return specs

    def _named(self, relative: Path) -> str:
        """A node's own copy: the path relative to its directory, where it runs."""
        return str(relative)

    def _write_security(self) -> None:
        """The originals in D, then each node's copies of the files its config names."""
        super()._write_security()
        for spec in self.specs.values():
            for relative in self.security_files(spec.id).values():
                original, copy = self.directory / relative, spec.home / relative
                copy.parent.mkdir(parents=True, exist_ok=True)
                mode = original.stat().st_mode & 0o777
                write_atomically(copy, original.read_bytes(), mode=mode)

    def write(self) -> None:
        """Write every file: the nodes' directories, the security files, cluster.json."""
        self._write_layout()

    def clear(self) -> None:
        """Remove what an init wrote in the directory: its files and node directories
        (those of its cluster.json and this layout's)."""
        ids = set(self.specs)
        try:
            doc = json.loads(self.cluster_file.read_text())
            ids |= {int(n["id"]) for n in doc["nodes"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        for name in (SECRET_FILE, ACL_FILE, CREDENTIALS_FILE, self.cluster_file.name):
            (self.directory / name).unlink(missing_ok=True)
        for path in [self.directory / PKI_DIR, *(self.directory / f"n{i}" for i in ids)]:
            if path.is_dir():
                shutil.rmtree(path)


# ---------------------------------------------------------------- the command


def _port(text: str) -> int:
    port = int(text)
    if not is_port(port):
        raise argparse.ArgumentTypeError(f"{text} is not a port (1..{MAX_PORT})")
    return port


def _init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, metavar="D", help="write the cluster's files here")
    p.add_argument(
        "--hosts",
        required=True,
        metavar="H[:P],...",
        help="node i runs on the i-th host: an IP or DNS name, :P its client port",
    )
    p.add_argument("--nodes", type=int, metavar="N", help="1, 3 or 5 (default: one per host)")
    p.add_argument("--client-port", type=_port, default=DEFAULT_CLIENT_PORT, metavar="P")
    p.add_argument("--raft-port", type=_port, metavar="P", help="default: client port + 100")
    p.add_argument("--metrics-port", type=_port, metavar="P", help="default: client port + 200")
    p.add_argument(
        "--remote-dir",
        default=DEFAULT_REMOTE_DIR,
        metavar="DIR",
        help="where node i's directory goes on its host, as DIR/n{i} (for the printed steps)",
    )
    p.add_argument("--flush-mode", choices=("sync", "async"))
    p.add_argument("--shards", type=positive, metavar="N", help="data shards (docs/scaling.md)")
    p.add_argument("--set", action="append", type=key_value, default=[], metavar="FIELD=V")
    p.add_argument("--tls", action="store_true", help="a development CA and node certificates")
    p.add_argument("--acl", action="store_true", help="clients sign calls; an admin account")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="let nodes listen on addresses other machines reach without --tls and --acl",
    )
    p.add_argument(
        "--force", action="store_true", help="write into a non-empty D (an earlier init's files go)"
    )


@command("cluster init", "write the configs and files of a cluster on real hosts", _init_args)
def _cluster_init(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    texts = [h for h in args.hosts.split(",") if h.strip()]
    if args.nodes is not None and args.nodes != len(texts):
        raise UsageError(f"--nodes {args.nodes} but --hosts names {len(texts)} hosts")
    if len(texts) not in (1, 3, 5):
        raise UsageError(f"--hosts: a cluster has 1, 3 or 5 nodes, not {len(texts)}")
    hosts = host_ports(texts, args.client_port, args.raft_port, args.metrics_port)
    extra = node_settings(args.set)
    if args.shards is not None:
        extra |= shards_config(args.shards)
    if args.insecure:
        extra["insecure"] = True
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--dir {directory}: not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not args.force:
        raise UsageError(f"--dir {directory} is not empty (--force replaces an earlier init)")
    try:
        layout = HostsLayout(
            directory,
            hosts,
            flush_mode=args.flush_mode,
            extra_config=extra,
            cluster=args.cluster_name or "dledger",
            tls=args.tls,
            acl=args.acl,
        )
    except ValueError as exc:  # ConfigError too: a setting no node can run with
        raise UsageError(str(exc)) from exc
    for i, cfg in layout.configs.items():
        try:
            check_exposure(cfg)
        except ConfigError as exc:
            raise UsageError(f"node {i}: {exc} (cluster init: --tls and --acl)") from exc
    if args.force:
        layout.clear()
    layout.write()
    doc = instructions(layout, args.remote_dir)
    emit(args, doc, instructions_text(doc))
    return 0


def instructions(layout: HostsLayout, remote_dir: str) -> dict[str, Any]:
    """What was written and what to run on each host (`cluster init --json`)."""
    nodes = []
    for spec, h in zip(layout.specs.values(), layout.hosts, strict=True):
        remote = f"{remote_dir.rstrip('/')}/n{spec.id}"
        login = h.host.strip("[]")
        nodes.append(
            {
                "id": spec.id,
                "host": login,
                "client": spec.client,
                "raft": spec.raft,
                "metrics": spec.metrics,
                "dir": str(spec.home),
                "remote_dir": remote,
                "copy": f"rsync -a {shlex.quote(f'{spec.home}/')} {h.host}:{shlex.quote(remote)}/",
                "start": f"ssh {login} " + shlex.quote(f"cd {shlex.quote(remote)} && " + SERVE),
            }
        )
    keep = [layout.pki_dir / "ca.key"] if layout.tls else []
    keep += [p for p in (layout.credentials_path,) if p is not None]
    return {
        "dir": str(layout.directory),
        "cluster": layout.cluster,
        "cluster_file": str(layout.cluster_file),
        "tls": layout.tls,
        "acl": layout.acl,
        "nodes": nodes,
        "ports": {
            kind: sorted({getattr(h, kind) for h in layout.hosts})
            for kind in ("client", "raft", "metrics")
        },
        "keep": [str(p) for p in keep],
    }


SERVE = "dledger serve --config node.toml"


def instructions_text(doc: Mapping[str, Any]) -> str:
    nodes, ports = doc["nodes"], doc["ports"]
    security = ", ".join(w for w, on in (("TLS", doc["tls"]), ("ACL", doc["acl"])) if on)
    lines = [
        f"wrote the {len(nodes)}-node cluster {doc['cluster']!r} in {doc['dir']} "
        f"(peers: cluster secret{', ' + security if security else ''})",
        "copy each node's directory to its host, then start the node in it "
        "(docs/deploy.md has a systemd unit):",
    ]
    for n in nodes:
        lines += [f"  {n['copy']}", f"  {n['start']}"]

    def listed(kind: str) -> str:
        return ", ".join(map(str, ports[kind]))

    lines.append(
        f"open the ports: {listed('client')} (clients, and nodes forwarding to the leader), "
        f"{listed('raft')} (Raft, between the hosts), {listed('metrics')} (metrics, for "
        "your scraper)"
    )
    lines.append(f"then: dledger status --cluster {shlex.quote(doc['cluster_file'])}")
    if doc["keep"]:
        lines.append(f"keep off the nodes: {', '.join(doc['keep'])}")
    return "\n".join(lines)
