"""Local cluster process management: N `dledger serve` processes on this machine.

`LocalCluster` owns one directory D: `D/n{i}/node.toml` (node i's config, in
NodeConfig's TOML layout), `D/n{i}/data` (its data), `D/n{i}/node.log` (its stdout
and stderr, appended across restarts) and `D/cluster.json` (ids, pids, addresses,
data dirs: what the CLI and `Client.from_cluster_file` read). Used by the CLI
(`dledger cluster up/down/status`), `make run`, and integration and chaos tests.
Invariants: every node runs in its own process group; a process this object
started is stopped by `down()`, by the context manager's exit, or by an atexit
SIGKILL at the latest, unless `detach()` hands it over on purpose; a directory
keeps its ports, so `up` on a stopped cluster restarts it from its data; a pid
read from cluster.json is signalled only if its command line names our config.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from dledger_commitlog.client import (
    Client,
    ClientError,
    NodeStatus,
    StatusError,
    load_credentials,
)
from dledger_commitlog.node.acl import Account, write_acl
from dledger_commitlog.node.config import _SECTIONS, ConfigError, NodeConfig, Peer, load_config
from dledger_commitlog.node.security import write_secret
from store.fileio import write_atomically

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_PER_NODE = frozenset({"node_id", "data_dir", "peers", "listen_client", "listen_raft"})
_POLL_S = 0.05


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
    """
    low, high = _ephemeral_range()
    every = range(_MIN_PORT, 65536)
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


def _ephemeral_range() -> tuple[int, int]:
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
            value = getattr(config, field)
            if value is not None and (section == "listen" or value != defaults[field].default):
                body.append(f"{key} = {_toml_value(value)}")
        if body:
            lines += ["", f"[{section}]", *body]
    for p in config.peers:
        lines += ["", "[[peers]]", f"id = {p.id}", f"raft = {_toml_value(p.raft)}"]
        lines.append(f"client = {_toml_value(p.client)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


class LocalCluster:
    """A cluster of local node processes rooted at `directory` (see the module doc)."""

    def __init__(
        self,
        directory: str | Path,
        nodes: int = 3,
        base_port: int | None = None,
        flush_mode: str | None = None,
        extra_config: dict[str, Any] | None = None,
        cluster: str = "dledger",
        *,
        links: Mapping[tuple[int, int], str] | None = None,
        hosts: Mapping[int, str] | None = None,
        command_prefix: Callable[[int], list[str]] | None = None,
        env: Mapping[str, str] | None = None,
        tls: bool | None = None,
        acl: bool | None = None,
    ) -> None:
        """`links[(i, j)]` is the address node i dials for node j's Raft port (a fault
        proxy, say; default: j's own address). `hosts[i]` is the IP node i listens on
        (default 127.0.0.1). `command_prefix(i)` is put before node i's command line
        (`ip netns exec NS`, say). `env` is added to the nodes' environment.

        Peers always authenticate with a cluster secret (`D/cluster.secret`, made at
        the first start). `tls`: a development CA and one certificate per node under
        `D/pki/` (TLS on both ports, mTLS between peers). `acl`: `D/acl.toml` with one
        admin account whose keys are in `D/admin.credentials` (clients of this object
        and the CLI's `--cluster D/cluster.json` use them). None: as saved, else off."""
        self.directory = Path(directory).resolve()
        self.command_prefix = command_prefix
        self.env = dict(env or {})
        self.cluster_file = self.directory / "cluster.json"
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._pids: dict[int, int] = {}  # from cluster.json: processes another process started
        self._client: Client | None = None
        self._atexit = False
        saved = self._load()
        if saved is not None:
            self.cluster = str(saved.get("cluster", cluster))
            self.flush_mode = flush_mode or str(saved.get("flush_mode", "sync"))
            self.extra_config = dict(extra_config or saved.get("extra_config") or {})
            self.specs = {n["id"]: self._spec(n) for n in saved["nodes"]}
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
            self.links = {}
            self.tls, self.acl = bool(tls), bool(acl)
        bad = _PER_NODE & set(self.extra_config)
        if bad:
            raise ValueError(f"extra_config cannot set per-node settings: {sorted(bad)}")
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
        """Route node i's Raft traffic to node j through `links[(i, j)]` from the next start."""
        for src, dst in links:
            if src not in self.specs or dst not in self.specs or src == dst:
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
        return NodeSpec(n["id"], n["client"], n["raft"], n.get("metrics", ""), n["data_dir"], home)

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
        peers = tuple(
            Peer(s.id, self.links.get((node_id, s.id), s.raft), s.client)
            for s in self.specs.values()
        )
        values: dict[str, Any] = {"cluster": self.cluster, "flush_mode": self.flush_mode}
        values["peer_secret_file"] = str(self.secret_path)
        if self.tls:
            values.update(tls_ca=str(self.pki_dir / "ca.pem"),
                          tls_cert=str(self.pki_dir / f"node-{node_id}.pem"),
                          tls_key=str(self.pki_dir / f"node-{node_id}.key"))  # fmt: skip
        if self.acl:
            values["acl_file"] = str(self.directory / "acl.toml")
        values.update(self.extra_config)
        values.update(node_id=node_id, data_dir=spec.data_dir, peers=peers)
        values["listen_metrics"] = spec.metrics
        return NodeConfig(**values)

    def _check_usable(self) -> None:
        if self._refused is not None:
            raise ConfigError(f"{self.cluster_file}: {self._refused}")

    @property
    def secret_path(self) -> Path:
        return self.directory / "cluster.secret"

    @property
    def pki_dir(self) -> Path:
        return self.directory / "pki"

    @property
    def credentials_path(self) -> Path | None:
        """The admin's access and secret key (a cluster with an ACL)."""
        return self.directory / "admin.credentials" if self.acl else None

    @property
    def tls_ca(self) -> Path | None:
        return self.pki_dir / "ca.pem" if self.tls else None

    def _write_security(self) -> None:
        """The files the nodes' security settings name, made once and then kept."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_secret(self.secret_path)
        if self.tls and not (self.pki_dir / "ca.pem").exists():
            from dledger_commitlog.cli.certs import make_dev_pki

            hosts = sorted({a.rpartition(":")[0] for s in self.specs.values()
                            for a in (s.client, s.raft)})  # fmt: skip
            make_dev_pki(self.pki_dir, list(self.specs), hosts)
        creds = self.credentials_path
        if creds is not None and not creds.exists():
            secret = secrets.token_hex(24)
            write_acl(self.directory / "acl.toml", [Account("admin", secret, admin=True)])
            text = f'access_key = "admin"\nsecret_key = "{secret}"\n'
            write_atomically(creds, text.encode(), mode=0o600)

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
        doc = {
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
            "nodes": [
                {
                    "id": s.id,
                    "pid": self.pid(s.id),
                    "client": s.client,
                    "raft": s.raft,
                    "metrics": s.metrics,
                    "data_dir": s.data_dir,
                }
                for s in self.specs.values()
            ],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.cluster_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, self.cluster_file)

    # ------------------------------------------------------------ processes

    def pid(self, node_id: int) -> int | None:
        """The pid of node `node_id` if it is running (ours, or recorded and verified)."""
        proc = self._procs.get(node_id)
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        pid = self._pids.get(node_id)
        if pid is not None and _alive(pid) and self._is_ours(node_id, pid):
            return pid
        return None

    def is_running(self, node_id: int) -> bool:
        return self.pid(node_id) is not None

    def exit_code(self, node_id: int) -> int | None:
        """The exit code of the process this object last started for the node, once it ended."""
        proc = self._procs.get(node_id)
        return None if proc is None else proc.poll()

    def _is_ours(self, node_id: int, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return not Path("/proc/self").exists()  # no /proc: trust the record
        return str(self.specs[node_id].config_path).encode() in cmdline

    def start(self, node_id: int) -> None:
        """Start node `node_id` unless it runs; returns once the process exists."""
        if self.is_running(node_id):
            return
        self._check_usable()
        spec = self.specs[node_id]
        spec.home.mkdir(parents=True, exist_ok=True)
        if not spec.config_path.exists():
            self._write_layout()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_PROJECT_ROOT), env.get("PYTHONPATH")])
        )
        cmd = [
            *(self.command_prefix(node_id) if self.command_prefix else []),
            sys.executable,
            "-m",
            "dledger_commitlog",
            "serve",
            "--config",
            str(spec.config_path),
        ]
        with spec.log_path.open("ab") as log:
            log.write(
                f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting node {node_id}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=spec.home, env=env,
            )  # fmt: skip
        self._procs[node_id] = proc
        self._pids.pop(node_id, None)
        if not self._atexit:
            atexit.register(self._kill_at_exit)
            self._atexit = True
        self._save()

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to node `node_id`'s process group; after SIGKILL, wait until it is gone."""
        pid = self.pid(node_id)
        if pid is None:
            return
        _killpg(pid, sig)
        if sig == signal.SIGKILL:
            self._wait_gone(node_id, pid, timeout_s=10.0)

    def stop(self, node_id: int, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL."""
        pid = self.pid(node_id)
        if pid is None:
            return
        _killpg(pid, signal.SIGCONT)  # a paused node cannot handle SIGTERM
        _killpg(pid, signal.SIGTERM)
        if not self._wait_gone(node_id, pid, timeout_s):
            _killpg(pid, signal.SIGKILL)
            self._wait_gone(node_id, pid, timeout_s=10.0)

    def pause(self, node_id: int) -> None:
        self.kill(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self.kill(node_id, signal.SIGCONT)

    def restart(self, node_id: int, sig: int = signal.SIGTERM) -> None:
        """Stop node `node_id` (gracefully for SIGTERM, else with `sig`) and start it again."""
        if sig == signal.SIGTERM:
            self.stop(node_id)
        else:
            self.kill(node_id, sig)
            if sig != signal.SIGKILL:
                self.stop(node_id)
        self.start(node_id)

    def _wait_gone(self, node_id: int, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        proc = self._procs.get(node_id)
        while True:
            gone = proc.poll() is not None if proc is not None else not _alive(pid)
            if gone:
                self._save()
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)

    def _kill_at_exit(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGKILL)

    # ------------------------------------------------------------ the cluster

    def up(self, timeout_s: float = 30.0) -> Self:
        """Start every node; return when a leader is elected and every node answers Status."""
        for i in self.specs:
            if self.is_running(i):
                raise ClusterError(f"node {i} already runs (pid {self.pid(i)}): `down` it first")
        self._write_layout()
        try:
            for i in self.specs:
                self.start(i)
            self._wait_ready(timeout_s)
        except BaseException:
            self.down(timeout_s=5.0)
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for i, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"node {i} exited with {proc.returncode} during start-up; "
                        f"{self.specs[i].log_path} ends:\n{self.log_tail(i, 20)}"
                    )
            statuses = self.statuses(timeout_s=1.0)
            answered = all(isinstance(s, NodeStatus) for s in statuses.values())
            if answered and _leader_of(statuses.values()) is not None:
                return
            if time.monotonic() >= deadline:
                tails = "\n".join(f"-- n{i}:\n{self.log_tail(i, 10)}" for i in self.specs)
                raise ClusterError(f"no ready cluster after {timeout_s:g}s: {statuses}\n{tails}")
            time.sleep(_POLL_S)

    def down(self, timeout_s: float = 10.0) -> None:
        """Stop every node: SIGTERM to all, wait, SIGKILL what is left."""
        running = {i: pid for i in self.specs if (pid := self.pid(i)) is not None}
        for pid in running.values():
            _killpg(pid, signal.SIGCONT)
            _killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for i, pid in running.items():
            if not self._wait_gone(i, pid, max(0.0, deadline - time.monotonic())):
                _killpg(pid, signal.SIGKILL)
                self._wait_gone(i, pid, timeout_s=10.0)
        self._forget_processes()
        if self.cluster_file.exists():
            self._save()

    def detach(self) -> None:
        """Leave the nodes running beyond this process (the CLI's `cluster up`)."""
        self._pids.update({i: p.pid for i, p in self._procs.items() if p.poll() is None})
        self._forget_processes()

    def _forget_processes(self) -> None:
        self._procs.clear()
        if self._atexit:
            atexit.unregister(self._kill_at_exit)
            self._atexit = False
        if self._client is not None:
            self._client.close()
            self._client = None

    def client(self, **kwargs: Any) -> Client:
        """A new client of this cluster (the caller closes it)."""
        if self.tls_ca is not None:
            kwargs.setdefault("tls_ca", str(self.tls_ca))
        if self.credentials_path is not None and "credentials" not in kwargs:
            kwargs["credentials"] = load_credentials(self.credentials_path)
        return Client([s.client for s in self.specs.values()], cluster=self.cluster, **kwargs)

    def statuses(self, timeout_s: float = 1.0) -> dict[int, NodeStatus | StatusError]:
        if self._client is None:
            self._client = self.client()
        out: dict[int, NodeStatus | StatusError] = {}
        for i, spec in self.specs.items():
            try:
                out[i] = self._client.status(spec.client, timeout_s=timeout_s)
            except ClientError as exc:
                out[i] = StatusError(spec.client, exc)
        return out

    def wait_for_leader(
        self, exclude: int | Collection[int] | None = None, timeout_s: float = 10.0
    ) -> int:
        """The id of the leader with the highest term, once there is one not in `exclude`."""
        excluded = {exclude} if isinstance(exclude, int) else set(exclude or ())
        deadline = time.monotonic() + timeout_s
        while True:
            leader = _leader_of(self.statuses(timeout_s=0.5).values())
            if leader is not None and leader not in excluded:
                return leader
            if time.monotonic() >= deadline:
                raise ClusterError(f"no leader (excluding {sorted(excluded)}) in {timeout_s:g}s")
            time.sleep(_POLL_S)

    def leader_id(self, timeout_s: float = 10.0) -> int:
        return self.wait_for_leader(timeout_s=timeout_s)

    def log_tail(self, node_id: int, lines: int = 50) -> str:
        try:
            text = self.specs[node_id].log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __iter__(self) -> Iterator[NodeSpec]:
        return iter(self.specs.values())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()


def answered(statuses: Mapping[int, NodeStatus | StatusError]) -> dict[int, NodeStatus]:
    """The statuses of the nodes that answered."""
    return {i: s for i, s in statuses.items() if isinstance(s, NodeStatus)}


def converged(statuses: Mapping[int, NodeStatus | StatusError], at_least: int = 0) -> bool:
    """Every node answered, all committed everything they hold, and their logs end alike."""
    got = answered(statuses)
    if len(got) != len(statuses) or not got:
        return False
    tails = {
        (s.committed_index, s.last_index, s.last_chain_crc, s.committed_pos) for s in got.values()
    }
    (committed, last, _, _), *rest = tails
    return not rest and committed == last and committed >= at_least


def _link_key(text: str) -> tuple[int, int]:
    src, _, dst = text.partition("->")
    return int(src), int(dst)


def _leader_of(statuses: Collection[NodeStatus | StatusError]) -> int | None:
    leaders = [s for s in statuses if isinstance(s, NodeStatus) and s.role == "leader"]
    return max(leaders, key=lambda s: s.term).node_id if leaders else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
