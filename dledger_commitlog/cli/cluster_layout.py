"""A local cluster's directory: node specs, node configs, security files, cluster.json.

`ClusterLayout` owns what lies in one directory D: `D/n{i}/node.toml` (node i's
config, in NodeConfig's TOML layout, written by `node_toml` and read back by
`load_config` to prove they agree), `D/cluster.json` (ids, pids, addresses, data
dirs, settings: what the CLI and `Client.from_cluster_file` read), the peers'
secret `D/cluster.secret`, and with TLS or an ACL `D/pki/`, `D/acl.toml` and
`D/admin.credentials`. It starts no process: `launcher.LocalCluster` adds that.
A node's config names those files by their absolute paths in D (`security_files`,
`_named`); `deploy.HostsLayout`, a cluster whose nodes run on hosts of their own,
names each node's own copies instead.

Membership (docs/operations.md): the nodes the directory was made with are its
bootstrap group, each configured with the bootstrap ids as its peers. A node added
later (`add_spec`, `dledger cluster add-node`) is configured to join (`raft.join`)
with the members at the time it was added as its peers; a node removed from the
group (`retire`) keeps its entry, marked removed, and is neither started nor asked
again. What each node's config says never changes once written: membership after
the start lives in the Raft log, not in these files.

Invariants: a directory keeps its ports and settings once cluster.json exists
(a stopped cluster restarts from its data); ports are chosen outside the kernel's
ephemeral range; per-node settings never come from `extra_config`, nor what the
layout owns (ids, directories, peers, client and Raft addresses) from a node's own
settings (`node_config`); the security files are made once and then kept; a node
id is never used twice in a directory.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import secrets
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from dledger_commitlog.node.acl import Account, write_acl
from dledger_commitlog.node.config import (
    _SECTIONS,
    RETIRED,
    ConfigError,
    NodeConfig,
    Peer,
    Route,
    load_config,
    renamed_fields,
)
from dledger_commitlog.node.security import write_secret
from store.fileio import write_atomically

SECRET_FILE = "cluster.secret"
PKI_DIR = "pki"
ACL_FILE = "acl.toml"
CREDENTIALS_FILE = "admin.credentials"
_PER_NODE = frozenset({"node_id", "data_dir", "peers", "routes", "listen_client", "listen_raft"})
# Settings a node.toml names even when empty. Any other is left out at its default, so
# a node of an earlier release, which refuses a setting it does not know, reads the
# file (tests/test_upgrade.py) unless the cluster uses what that release lacks.
_SHOWN = frozenset({"listen_client", "listen_raft", "listen_metrics"})


class ClusterError(RuntimeError):
    """The cluster could not be brought to the requested state; the message says why."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    id: int
    client: str
    raft: str
    metrics: str
    data_dir: str
    home: Path  # D/n{id}
    join: bool = False  # added to a running group (its config: raft.join)
    peers: tuple[int, ...] = ()  # a joining node's peers; () the bootstrap group

    @property
    def config_path(self) -> Path:
        return self.home / "node.toml"

    @property
    def log_path(self) -> Path:
        return self.home / "node.log"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free right now, chosen outside the kernel's ephemeral range.

    A port from the ephemeral range (what binding to port 0 returns) is one the
    kernel may hand to any later bind(0) or outgoing connection: a fault proxy
    listening on 127.0.0.1:0, or a client's local end while the node that owns the
    port is down for a restart. The node then fails to bind. Ports outside that
    range are only ever taken by someone asking for them by number.

    `DLEDGER_PORTS=LO-HI` in the environment narrows the choice to [LO, HI], so that
    launchers running side by side (parallel test workers, two operators on one
    host) never race for the same port.
    """
    low, high = ephemeral_range()
    first, last = port_range()
    every = range(first, last + 1)
    candidates = [p for p in every if not low <= p <= high] or list(every)
    start = random.SystemRandom().randrange(len(candidates))  # then onwards, wrapping
    socks: list[socket.socket] = []
    try:
        for port in itertools.chain(candidates[start:], candidates[:start]):
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < count:
            raise ClusterError(f"only {len(socks)} of {count} ports are free on {host}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_MIN_PORT = 10_000  # below: well-known and commonly configured service ports
PORTS_ENV = "DLEDGER_PORTS"


def port_range() -> tuple[int, int]:
    """The ports `free_ports` chooses from: DLEDGER_PORTS (LO-HI), else 10000-65535."""
    text = os.environ.get(PORTS_ENV, "")
    if not text:
        return _MIN_PORT, 65535
    try:
        lo, hi = (int(part) for part in text.split("-"))
    except ValueError:
        raise ClusterError(f"{PORTS_ENV}={text!r}: expected LO-HI, e.g. 20000-24999") from None
    if not 1024 <= lo <= hi <= 65535:
        raise ClusterError(f"{PORTS_ENV}={text!r}: need 1024 <= LO <= HI <= 65535")
    return lo, hi


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux; the IANA range elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def node_toml(config: NodeConfig) -> str:
    """`config` in the TOML layout `load_config` reads (defaults left out)."""
    defaults = {k: v for k, v in NodeConfig.__dataclass_fields__.items()}
    top = ["node_id", "cluster", "data_dir", "flush_mode"]
    lines = [f"{k} = {_toml_value(getattr(config, k))}" for k in top]
    for section, names in _SECTIONS.items():
        body = []
        for key, field in names.items():
            if field in RETIRED:
                continue
            value = getattr(config, field)
            if value is not None and (field in _SHOWN or value != defaults[field].default):
                body.append(f"{key} = {_toml_value(value)}")
        if body:
            lines += ["", f"[{section}]", *body]
    for p in config.peers:
        lines += ["", "[[peers]]", f"id = {p.id}", f"raft = {_toml_value(p.raft)}"]
        lines.append(f"client = {_toml_value(p.client)}")
    for r in config.routes:
        lines += ["", "[[routes]]", f"id = {r.id}", f"raft = {_toml_value(r.raft)}"]
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


class LayoutOptions(TypedDict, total=False):
    """What shapes a local cluster besides its directory (`ClusterLayout`, where each
    is described; `LocalCluster` passes them on as they are)."""

    nodes: int
    base_port: int | None
    flush_mode: str | None
    extra_config: dict[str, Any] | None
    node_config: Mapping[int, Mapping[str, Any]] | None
    cluster: str
    links: Mapping[tuple[int, int], str] | None
    hosts: Mapping[int, str] | None
    tls: bool | None
    acl: bool | None


class ClusterLayout:
    """The files of a local cluster rooted at `directory` (see the module doc)."""

    def __init__(self, directory: str | Path, **options: Unpack[LayoutOptions]) -> None:
        """`nodes` (3), `base_port` (None: free ports), `flush_mode`, `extra_config`
        (NodeConfig settings of every node), `node_config[i]` (node i's own, on top:
        `{1: {"listen_console": "127.0.0.1:7480"}}`), `cluster` (its name, "dledger").
        `links[(i, j)]` is the address node i dials for node j's Raft port (a fault
        proxy, say; default: j's own address); j may be a node not made yet (one
        added later), and i too: node i's config names it as a route. `hosts[i]` is
        the IP node i listens on (default 127.0.0.1).

        Peers always authenticate with a cluster secret (`D/cluster.secret`, made at
        the first start). `tls`: a development CA and one certificate per node under
        `D/pki/` (TLS on both ports, mTLS between peers). `acl`: `D/acl.toml` with one
        admin account whose keys are in `D/admin.credentials` (clients of this object
        and the CLI's `--cluster D/cluster.json` use them). None: as saved, else off."""
        nodes, base_port = options.get("nodes", 3), options.get("base_port")
        flush_mode, extra_config = options.get("flush_mode"), options.get("extra_config")
        node_config = options.get("node_config")
        cluster, links = options.get("cluster", "dledger"), options.get("links")
        hosts, tls, acl = options.get("hosts"), options.get("tls"), options.get("acl")
        self.directory = Path(directory).resolve()
        self.cluster_file = self.directory / "cluster.json"
        self._pids: dict[int, int] = {}  # from cluster.json: processes another process started
        self._atexit = False
        saved = self._load()
        if saved is not None:
            self.cluster = str(saved.get("cluster", cluster))
            self.flush_mode = flush_mode or str(saved.get("flush_mode", "sync"))
            self.extra_config = renamed_fields(
                dict(extra_config or saved.get("extra_config") or {})
            )
            was_set = {int(i): v for i, v in (saved.get("node_config") or {}).items()}
            node_config = was_set if node_config is None else node_config
            every = {n["id"]: self._spec(n) for n in saved["nodes"]}
            gone = {n["id"] for n in saved["nodes"] if n.get("removed")}
            self.specs = {i: spec for i, spec in every.items() if i not in gone}
            self.retired = {i: spec for i, spec in every.items() if i in gone}
            self.base_port: int | None = saved.get("base_port")
            self._pids = {n["id"]: int(n["pid"]) for n in saved["nodes"] if n.get("pid")}
            saved_links = {_link_key(k): str(v) for k, v in saved.get("links", {}).items()}
            self.links = dict(links) if links is not None else saved_links
            was = saved.get("security") or {}
            self.tls = bool(was.get("tls")) if tls is None else tls
            self.acl = bool(was.get("acl")) if acl is None else acl
        else:
            self.cluster = cluster
            self.flush_mode = flush_mode or "sync"
            self.extra_config = dict(extra_config or {})
            self.specs = self._allocate(nodes, base_port, hosts or {})
            self.retired = {}
            self.base_port = base_port
            self.links = {}
            self.tls, self.acl = bool(tls), bool(acl)
        if isinstance(self.extra_config.get("host_shards"), list):  # as cluster.json keeps it
            self.extra_config["host_shards"] = tuple(self.extra_config["host_shards"])
        bad = _PER_NODE & set(self.extra_config)
        if bad:
            raise ValueError(f"extra_config cannot set per-node settings: {sorted(bad)}")
        self.node_config = {int(i): dict(v) for i, v in (node_config or {}).items()}
        bad = _PER_NODE & {k for v in self.node_config.values() for k in v}
        if bad:
            raise ValueError(f"node_config cannot set what the layout owns: {sorted(bad)}")
        self._refused: ConfigError | None = None
        try:
            self.configs = {i: self._config(i) for i in self.specs}  # validates early
        except ConfigError as exc:
            if saved is None or extra_config is not None:
                raise
            # Saved by a version that allowed these settings: the cluster can still be
            # inspected and stopped; starting it raises this (with --set to fix it).
            self.configs, self._refused = {}, exc
        if links is not None:
            self.set_links(links)

    def set_links(self, links: Mapping[tuple[int, int], str]) -> None:
        """Route node i's Raft traffic to node j through `links[(i, j)]` from the next start
        (ids of nodes to be added later too: node i's config names j's link as a route
        unless j is among its peers)."""
        for src, dst in links:
            if src == dst or min(src, dst) < 1:
                raise ValueError(f"links: ({src}, {dst}) is not a pair of distinct node ids")
        self.links = dict(links)
        self.configs = {i: self._config(i) for i in self.specs}
        if self.directory.exists() and any(s.config_path.exists() for s in self.specs.values()):
            self._write_layout()

    # ------------------------------------------------------------ layout

    def _load(self) -> dict[str, Any] | None:
        if not self.cluster_file.exists():
            return None
        try:
            doc: dict[str, Any] = json.loads(self.cluster_file.read_text())
            for n in doc["nodes"]:
                n["id"] = int(n["id"])
            return doc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClusterError(f"{self.cluster_file}: unreadable ({exc})") from exc

    def _spec(self, n: dict[str, Any]) -> NodeSpec:
        home = self.directory / f"n{n['id']}"
        peers = tuple(int(i) for i in n.get("peers", ()))
        return NodeSpec(
            n["id"],
            n["client"],
            n["raft"],
            n.get("metrics", ""),
            n["data_dir"],
            home,
            bool(n.get("join")),
            peers,
        )

    def _allocate(
        self, nodes: int, base_port: int | None, hosts: Mapping[int, str]
    ) -> dict[int, NodeSpec]:
        if nodes not in (1, 3, 5):
            raise ValueError(f"a cluster has 1, 3 or 5 nodes, not {nodes}")
        if base_port is None:
            ports = free_ports(3 * nodes)
        elif base_port > 0 and base_port + 200 + nodes < 65536:
            ports = [base_port + k * 100 + i for k in range(3) for i in range(nodes)]
        else:
            raise ValueError(f"base_port {base_port}: need 0 < P and P + 200 + nodes < 65536")
        specs = {}
        for i in range(1, nodes + 1):
            host = hosts.get(i, "127.0.0.1")
            client, raft, metrics = (f"{host}:{ports[k * nodes + i - 1]}" for k in range(3))
            home = self.directory / f"n{i}"
            specs[i] = NodeSpec(i, client, raft, metrics, str(home / "data"), home)
        return specs

    def _config(self, node_id: int) -> NodeConfig:
        spec = self.specs[node_id]
        every = self.retired | self.specs
        ids = spec.peers or sorted(i for i, s in every.items() if not s.join)  # the bootstrap
        peers = tuple(
            Peer(i, self.links.get((node_id, i), every[i].raft), every[i].client) for i in ids
        )
        values: dict[str, Any] = {"cluster": self.cluster, "flush_mode": self.flush_mode}
        if spec.join:
            values["join"] = True
        for setting, relative in self.security_files(node_id).items():
            values[setting] = self._named(relative)
        values.update(self.extra_config)
        values.update(self.node_config.get(node_id, {}))
        routes = tuple(
            Route(dst, addr)
            for (src, dst), addr in sorted(self.links.items())
            if src == node_id and dst not in ids
        )
        values.update(node_id=node_id, data_dir=spec.data_dir, peers=peers, routes=routes)
        values["listen_metrics"] = spec.metrics
        return NodeConfig(**values)

    # ------------------------------------------------------------ membership

    def new_spec(self, members: Mapping[int, tuple[str, str]]) -> NodeSpec:
        """A node to add to the group whose `members` are {id: (raft, client)}: the next
        id never used here nor by a member, ports in the directory's scheme (`base_port +
        k * 100 + id - 1` when it was made with one, else free ones), joining with
        `members` as peers."""
        node_id = max([*self.retired, *self.specs, *members]) + 1
        host = next(iter(self.specs.values())).client.rpartition(":")[0]
        base = self.base_port
        if base is not None and base + 200 + node_id < 65536:
            ports = [base + k * 100 + node_id - 1 for k in range(3)]  # as `_allocate` does
        else:
            ports = free_ports(3, host)
        client, raft, metrics = (f"{host}:{port}" for port in ports)
        home = self.directory / f"n{node_id}"
        peers = tuple(sorted({*members, node_id}))
        return NodeSpec(node_id, client, raft, metrics, str(home / "data"), home, True, peers)

    def add_spec(self, spec: NodeSpec, members: Mapping[int, tuple[str, str]]) -> None:
        """Record `spec` (from `new_spec`) and write its config; with TLS, a certificate
        naming it from the directory's CA. Members not in the layout (added by hand,
        `dledger member add`) are recorded as retired entries so its config can name them."""
        for i, (raft, client) in members.items():
            if i not in self.specs and i not in self.retired:
                home = self.directory / f"n{i}"
                self.retired[i] = NodeSpec(i, client, raft, "", str(home / "data"), home)
        self.specs[spec.id] = spec
        self.configs[spec.id] = self._config(spec.id)
        if self.tls:
            from dledger_commitlog.cli.certs import make_dev_pki

            host = spec.client.rpartition(":")[0]
            make_dev_pki(self.pki_dir, [spec.id], [host], clients=(), reuse_ca=True)
        self._write_layout()

    def retire(self, node_id: int) -> None:
        """Node `node_id` left the group: keep its entry (its files stay), never start it."""
        self.retired[node_id] = self.specs.pop(node_id)
        self.configs.pop(node_id, None)
        self._save()

    def security_files(self, node_id: int) -> dict[str, Path]:
        """The settings of node `node_id` that name a security file, each file's path
        relative to the directory: the peers' secret; with TLS the CA and the node's
        certificate and key; with an ACL the accounts."""
        files = {"peer_secret_file": Path(SECRET_FILE)}
        if self.tls:
            pki = Path(PKI_DIR)
            files |= {"tls_ca": pki / "ca.pem", "tls_cert": pki / f"node-{node_id}.pem"}
            files["tls_key"] = pki / f"node-{node_id}.key"
        if self.acl:
            files["acl_file"] = Path(ACL_FILE)
        return files

    def _named(self, relative: Path) -> str:
        """How a node's config names the directory's file `relative`: by its absolute
        path (the nodes of a local cluster share the directory's files)."""
        return str(self.directory / relative)

    def _check_usable(self) -> None:
        if self._refused is not None:
            raise ConfigError(f"{self.cluster_file}: {self._refused}")

    @property
    def secret_path(self) -> Path:
        return self.directory / SECRET_FILE

    @property
    def pki_dir(self) -> Path:
        return self.directory / PKI_DIR

    @property
    def credentials_path(self) -> Path | None:
        """The admin's access and secret key (a cluster with an ACL)."""
        return self.directory / CREDENTIALS_FILE if self.acl else None

    @property
    def tls_ca(self) -> Path | None:
        return self.pki_dir / "ca.pem" if self.tls else None

    def _write_security(self) -> None:
        """The files the nodes' security settings name, made once and then kept."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_secret(self.secret_path)
        if self.tls and not (self.pki_dir / "ca.pem").exists():
            from dledger_commitlog.cli.certs import make_dev_pki

            hosts = sorted(
                {a.rpartition(":")[0] for s in self.specs.values() for a in (s.client, s.raft)}
            )
            make_dev_pki(self.pki_dir, list(self.specs), hosts)
        creds = self.credentials_path
        if creds is not None and not creds.exists():
            secret = secrets.token_hex(24)
            write_acl(self.directory / ACL_FILE, [Account("admin", secret, admin=True)])
            text = f'access_key = "admin"\nsecret_key = "{secret}"\n'
            write_atomically(creds, text.encode(), mode=0o600)

    def write(self) -> None:
        """Write the directory's files (node configs, security files, cluster.json) and
        start nothing: a directory made ready for `dledger cluster up`."""
        self._write_layout()

    def _write_layout(self) -> None:
        self._check_usable()
        self._write_security()
        for i, spec in self.specs.items():
            spec.home.mkdir(parents=True, exist_ok=True)
            spec.config_path.write_text(node_toml(self.configs[i]))
            if load_config(spec.config_path) != self.configs[i]:  # the writer and reader agree
                raise ClusterError(f"{spec.config_path}: does not read back as written")
        self._save()

    def _save(self) -> None:
        doc: dict[str, Any] = {
            "cluster": self.cluster,
            "flush_mode": self.flush_mode,
            "extra_config": self.extra_config,
            "links": {f"{src}->{dst}": addr for (src, dst), addr in sorted(self.links.items())},
            "security": {
                "tls": self.tls,
                "acl": self.acl,
                "tls_ca": str(self.tls_ca or ""),
                "credentials": str(self.credentials_path or ""),
            },
            "nodes": [self._node_doc(s) for _, s in sorted((self.retired | self.specs).items())],
        }
        if self.base_port is not None:
            doc["base_port"] = self.base_port
        if self.node_config:
            doc["node_config"] = {str(i): v for i, v in sorted(self.node_config.items())}
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.cluster_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, self.cluster_file)

    def _node_doc(self, s: NodeSpec) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": s.id, "pid": self.pid(s.id) if s.id in self.specs else None}
        doc |= {"client": s.client, "raft": s.raft, "metrics": s.metrics, "data_dir": s.data_dir}
        if s.join:
            doc |= {"join": True, "peers": list(s.peers)}
        if s.id in self.retired:
            doc["removed"] = True
        return doc

    def pid(self, node_id: int) -> int | None:
        """The pid cluster.json records for node `node_id` (LocalCluster: only a live one)."""
        return self._pids.get(node_id)

    def __iter__(self) -> Iterator[NodeSpec]:
        return iter(self.specs.values())

    @property
    def shard_count(self) -> int:
        """The cluster's data shards (docs/scaling.md)."""
        return int(self.extra_config.get("shard_count", 1))


def saved_extra_config(directory: Path) -> dict[str, Any]:
    """The settings a cluster directory's cluster.json keeps for every node ({}: none)."""
    try:
        doc = json.loads((directory / "cluster.json").read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{directory / 'cluster.json'}: unreadable ({exc})") from exc
    return renamed_fields(dict(doc.get("extra_config") or {}))


def shards_config(shards: int) -> dict[str, Any]:
    """The settings of a cluster of `shards` data shards whose every node process hosts
    every shard (and shard 0, the routes, when there are several); {} for one."""
    if shards < 1:
        raise ValueError(f"a cluster has at least 1 data shard, not {shards}")
    if shards == 1:
        return {}
    return {"shard_count": shards, "host_shards": tuple(range(shards + 1))}


def _link_key(text: str) -> tuple[int, int]:
    src, _, dst = text.partition("->")
    return int(src), int(dst)
