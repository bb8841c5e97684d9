"""Network faults in the kernel: one network namespace per node (needs root).

`NetnsNetwork(node_ids)` gives node i its own network namespace with one veth
interface (`eth0`, address 10.231.X.i/24) plugged into a bridge in the root
namespace, which holds 10.231.X.254 so this process reaches every node's ports.
Nodes run under `command_prefix(i)` (`ip netns exec NS`), listen on `hosts()[i]`
and dial each other directly (`links()` is empty). After `LocalCluster` chose
the ports, `attach(raft_addresses)` tells this object each node's Raft port.

`cut(src, dst)` adds an iptables rule in dst's namespace that drops TCP packets
from src's address to dst's Raft port: src's Raft stream to dst goes dark, while
dst's stream to src (the other link) and every client port stay reachable.
`slow(src, dst, ...)` puts a netem qdisc on src's `eth0` for the packets to
dst's Raft port (needs `tc` from iproute2 and a kernel with sch_netem).

Names carry a per-run id (`dlc<6 hex>`: namespaces `dlc<id>n<i>`, bridge
`dlc<id>b`, host-side veths `dlc<id>v<i>`, all <= 15 characters) and the subnet's
third octet X is one no other interface or route of the root namespace uses.
Each run records its owner (pid, start time, pid namespace) and its subnet in
`/run/dledger-netns/<id>.json` *before* it creates anything, all under one file
lock; a new run removes what runs whose owner is gone left behind (owners in
another pid namespace are never judged gone), and runs whose namespaces exist
without a record.

Invariants: `heal()` leaves no rule and no qdisc of ours; `close()` (idempotent,
also run at exit) removes the namespaces, veths, bridge and record; processes
still inside a namespace keep running, cut off from everything but their own
loopback. The root namespace's firewall is never touched: where bridged traffic
goes through it (br_netfilter) and its FORWARD policy drops, nodes cannot talk.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

Link = tuple[int, int]

STATE_DIR: Final = Path("/run/dledger-netns")
PREFIX: Final = "dlc"
SUBNET: Final = "10.231"  # 10.231.X.0/24, X chosen per run
ROOT_HOST: Final = 254  # the root namespace's address on the bridge: 10.231.X.254
IFACE: Final = "eth0"  # every node's interface, inside its namespace
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})(?:n\d+|b|v\d+|p)$")
_SBIN: Final = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"]
)
_CMD_TIMEOUT_S: Final = 15.0


class NetnsError(RuntimeError):
    """A namespace, link or rule could not be set up; the message names the command."""


def _tool(name: str) -> str | None:
    return shutil.which(name, path=_SBIN)


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"`{' '.join(cmd)}`: {exc}") from exc
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` exited with {done.returncode}: {done.stderr.strip()}")
    return done


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The lock every run holds while it creates, inspects or removes namespaces."""
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (STATE_DIR / "lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _start_time(pid: int) -> str | None:
    """The kernel's start time of process `pid` (tells a reused pid apart), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _owner(pid: int) -> dict[str, Any]:
    """What identifies process `pid` in a run's record."""
    return {"pid": pid, "start": _start_time(pid), "pidns": _pid_namespace()}


def _owner_gone(record: Mapping[str, Any]) -> bool:
    """Whether the record's owner is known to be gone (an unreadable record's is)."""
    pid, start = record.get("pid"), record.get("start")
    if not isinstance(pid, int) or not isinstance(start, str):
        return True
    if record.get("pidns") != _pid_namespace():
        return False  # another pid namespace's process: we cannot tell, so keep its run
    return _start_time(pid) != start


def _namespaces() -> list[str]:
    out = _run(_ip(), "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _run(_ip(), "-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            names.append(parts[1].strip().split("@")[0])
    return names


def _ip() -> str:
    return _tool("ip") or "ip"


def _remove_run(run_id: str) -> None:
    """Delete every namespace and link of run `run_id`, then its record (lock held)."""
    for ns in _namespaces():
        m = _NAME.match(ns)
        if m and m.group(1) == run_id:
            _run(_ip(), "netns", "delete", ns, check=False)
    # A namespace with processes left in it outlives `netns delete`; deleting the
    # host side of its veth (and the bridge) still cuts it off.
    for link in _links():
        m = _NAME.match(link)
        if m and m.group(1) == run_id:
            _run(_ip(), "link", "delete", link, check=False)
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{run_id}.json").unlink()


def _records() -> dict[str, dict[str, Any]]:
    out = {}
    for path in STATE_DIR.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}
        out[path.stem] = record if isinstance(record, dict) else {}
    return out


def clean_leftovers() -> list[str]:
    """Remove what dead runs left (lock held); returns the run ids removed.

    A run goes if its record's owner is gone, or if a namespace of it exists without
    a record (every run writes its record first, under the lock). Links named like
    ours with neither record nor namespace may belong to another mount namespace
    sharing this network namespace: they stay.
    """
    records = _records()
    gone = {run for run, record in records.items() if _owner_gone(record)}
    for ns in _namespaces():
        m = _NAME.match(ns)
        if m and m.group(1) not in records:
            gone.add(m.group(1))
    for run in sorted(gone):
        _remove_run(run)
    return sorted(gone)


def _octets_in_use() -> set[int]:
    text = _run(_ip(), "-o", "-4", "addr", "show", check=False).stdout
    text += _run(_ip(), "-4", "route", "show", "table", "all", check=False).stdout
    used = {int(x) for x in re.findall(rf"\b{re.escape(SUBNET)}\.(\d+)\.", text)}
    for record in _records().values():
        if isinstance(record.get("octet"), int):
            used.add(record["octet"])
    return used


_available: str | bool | None = False  # False: not probed yet


def available() -> str | None:
    """None if this process can build a `NetnsNetwork`, else why not (probed once)."""
    global _available  # noqa: PLW0603 - a cache of one probe per process
    if _available is False:
        _available = _probe()
    return _available if isinstance(_available, str) else None


def _probe() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (run the tests as root)"
    for tool in ("ip", "iptables"):
        if _tool(tool) is None:
            return f"`{tool}` is not installed (packages iproute2 and iptables)"
    ns = f"{PREFIX}{secrets.token_hex(3)}p"

    def in_probe(args: str) -> None:
        _run(_ip(), "-n", ns, *args.split())

    try:
        with _locked():
            try:
                _run(_ip(), "netns", "add", ns)
                in_probe("link set lo up")
                # veths and a bridge (inside the probe namespace: they go with it)
                in_probe("link add name v0 type veth peer name v1")
                in_probe("link add name br0 type bridge")
                _run(_ip(), "netns", "exec", ns, _tool("iptables") or "iptables", "-w", "-S")
            finally:
                _run(_ip(), "netns", "delete", ns, check=False)
    except (NetnsError, OSError) as exc:
        return f"cannot create network namespaces here: {exc}"
    return None


class NetnsNetwork:
    """A network namespace per node, joined by a bridge (see the module doc)."""

    name = "netns"

    def __init__(self, node_ids: Iterable[int]) -> None:
        ids = sorted(set(node_ids))
        if not ids or ids[0] < 1 or ids[-1] >= ROOT_HOST:
            raise ValueError(f"node ids must lie in 1..{ROOT_HOST - 1}: {ids}")
        reason = available()
        if reason is not None:
            raise NetnsError(reason)
        self.ids = ids
        self.run_id = secrets.token_hex(3)
        self.bridge = f"{PREFIX}{self.run_id}b"
        self._ip = _ip()
        self._iptables = _tool("iptables") or "iptables"
        self._lock = threading.Lock()
        self._raft_ports: dict[int, int] = {}
        self._cut: set[Link] = set()
        self._slow: set[Link] = set()
        self._shaped: set[int] = set()  # sources whose eth0 has our root qdisc
        self._closed = False
        with _locked():
            clean_leftovers()
            free = sorted(set(range(256)) - _octets_in_use())
            if not free:
                raise NetnsError(f"no free {SUBNET}.X.0/24 subnet left")
            self.octet = secrets.choice(free)
            record = {**_owner(os.getpid()), "octet": self.octet}
            (STATE_DIR / f"{self.run_id}.json").write_text(json.dumps(record) + "\n")
            atexit.register(self.close)
            try:
                self._create()
            except BaseException:
                _remove_run(self.run_id)
                atexit.unregister(self.close)
                self._closed = True
                raise

    def _create(self) -> None:
        ip = self._ip
        _run(ip, "link", "add", "name", self.bridge, "type", "bridge")
        _run(ip, "addr", "add", f"{self.root_ip}/24", "dev", self.bridge)
        _run(ip, "link", "set", self.bridge, "up")
        for i in self.ids:
            ns, veth = self.namespace(i), f"{PREFIX}{self.run_id}v{i}"
            _run(ip, "netns", "add", ns)
            _run(ip, "-n", ns, "link", "set", "lo", "up")
            _run(
                ip, "link", "add", "name", veth, "type", "veth", "peer", "name", IFACE, "netns", ns
            )
            _run(ip, "link", "set", veth, "master", self.bridge, "up")
            _run(ip, "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", IFACE)
            _run(ip, "-n", ns, "link", "set", IFACE, "up")

    # ------------------------------------------------------------ layout

    @property
    def root_ip(self) -> str:
        """This (the root) namespace's address on the bridge."""
        return f"{SUBNET}.{self.octet}.{ROOT_HOST}"

    def ip(self, node_id: int) -> str:
        self._check_id(node_id)
        return f"{SUBNET}.{self.octet}.{node_id}"

    def namespace(self, node_id: int) -> str:
        self._check_id(node_id)
        return f"{PREFIX}{self.run_id}n{node_id}"

    def hosts(self) -> dict[int, str]:
        """The address each node listens on (`LocalCluster(hosts=...)`)."""
        return {i: self.ip(i) for i in self.ids}

    def command_prefix(self, node_id: int) -> list[str]:
        """`ip netns exec NS`: runs node `node_id`'s command in its namespace."""
        return [self._ip, "netns", "exec", self.namespace(node_id)]

    def attach(self, raft_addresses: Mapping[int, str]) -> None:
        """Learn each node's Raft port ("host:port" per node id, as LocalCluster allocated)."""
        if set(raft_addresses) != set(self.ids):
            raise ValueError(f"attach: nodes {sorted(raft_addresses)} are not {self.ids}")
        ports = {}
        for i, address in raft_addresses.items():
            host, sep, port = address.rpartition(":")
            if not sep or not port.isdigit() or host not in (self.ip(i), "0.0.0.0"):
                raise ValueError(
                    f"attach: node {i}'s Raft address {address!r} is not on {self.ip(i)}"
                )
            ports[i] = int(port)
        with self._lock:
            self._raft_ports = ports

    def links(self) -> dict[Link, str]:
        return {}  # nodes dial each other's own addresses

    def _check_id(self, node_id: int) -> None:
        if node_id not in self.ids:
            raise ValueError(f"node {node_id} is not one of {self.ids}")

    def _link(self, src: int, dst: int) -> tuple[str, int]:
        """src's address and dst's Raft port, once the link is known to be valid."""
        self._check_id(src)
        self._check_id(dst)
        if src == dst:
            raise ValueError(f"({src}, {dst}) is not a link between two nodes")
        if self._closed:
            raise NetnsError("this network is closed")
        if not self._raft_ports:
            raise NetnsError("attach() the nodes' Raft addresses first")
        return self.ip(src), self._raft_ports[dst]

    # ------------------------------------------------------------ faults

    def _drop_rule(self, action: str, src: int, dst: int) -> list[str]:
        src_ip, port = self._link(src, dst)
        return [
            self._ip,
            "netns",
            "exec",
            self.namespace(dst),
            self._iptables,
            "-w",
            action,
            "INPUT",
            "-s",
            f"{src_ip}/32",
            "-p",
            "tcp",
            "--dport",
            str(port),
            "-j",
            "DROP",
        ]

    def cut(self, src: int, dst: int) -> None:
        """Drop what src sends to dst's Raft port (dst's own stream to src is untouched)."""
        with self._lock:
            if (src, dst) not in self._cut:
                _run(*self._drop_rule("-I", src, dst))
                self._cut.add((src, dst))

    def restore(self, src: int, dst: int) -> None:
        with self._lock:
            if (src, dst) in self._cut:
                _run(*self._drop_rule("-D", src, dst))
                self._cut.discard((src, dst))

    def slow(self, src: int, dst: int, latency_ms: int, jitter_ms: int = 0) -> None:
        """Delay what src sends to dst's Raft port by `latency_ms` (+- `jitter_ms`).

        src's eth0 gets an htb root (class 1:1, the default, is unshaped) with a
        class per slowed destination, a netem qdisc under it, and a u32 filter for
        dst's address and Raft port. Raises NotImplementedError without `tc` or netem.
        """
        if latency_ms < 0 or jitter_ms < 0:
            raise ValueError("latency_ms and jitter_ms must be >= 0")
        tc = _tool("tc")
        if tc is None:
            raise NotImplementedError("slow() needs `tc` (package iproute2), which is missing")
        with self._lock:
            port = self._link(src, dst)[1]
            ns, band = self.namespace(src), f"{0x100 + dst:x}"
            unshaped = "htb rate 10gbit quantum 60000"  # no shaping, just a class to hang netem on

            def run(args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
                return _run(tc, "-n", ns, *args.split(), check=check)

            try:
                if src not in self._shaped:
                    run(f"qdisc add dev {IFACE} root handle 1: htb default 1")
                    self._shaped.add(src)
                    run(f"class replace dev {IFACE} parent 1: classid 1:1 {unshaped}")
                run(f"class replace dev {IFACE} parent 1: classid 1:{band} {unshaped}")
                jitter = f" {jitter_ms}ms" if jitter_ms else ""
                netem = f"parent 1:{band} handle {band}: netem delay {latency_ms}ms{jitter}"
                done = run(f"qdisc replace dev {IFACE} {netem}", check=False)
                if done.returncode != 0:
                    if "unknown" in done.stderr.lower():
                        raise NotImplementedError(
                            "slow() needs the kernel's netem qdisc (sch_netem), which this "
                            f"kernel lacks: {done.stderr.strip()}"
                        )
                    raise NetnsError(f"tc {netem} in {ns}: {done.stderr.strip()}")
                if (src, dst) not in self._slow:
                    match = f"match ip dst {self.ip(dst)}/32 match ip dport {port} 0xffff"
                    run(
                        f"filter add dev {IFACE} parent 1: protocol ip prio 1 u32 {match} "
                        f"flowid 1:{band}"
                    )
                    self._slow.add((src, dst))
            except BaseException:
                if not any(s == src for s, _ in self._slow):  # nothing of ours to keep there
                    self._unshape(src)
                raise

    def _unshape(self, src: int) -> None:
        if src in self._shaped:
            tc = _tool("tc") or "tc"
            _run(tc, "-n", self.namespace(src), "qdisc", "del", "dev", IFACE, "root", check=False)
            self._shaped.discard(src)
        self._slow -= {link for link in self._slow if link[0] == src}

    def heal(self) -> None:
        """Remove every drop rule and every delay."""
        with self._lock:
            if self._closed:
                return
            for src, dst in sorted(self._cut):
                _run(*self._drop_rule("-D", src, dst), check=False)
            for i in self.ids:  # the namespaces are ours: no rule of anyone else's goes
                _run(
                    self._ip,
                    "netns",
                    "exec",
                    self.namespace(i),
                    self._iptables,
                    "-w",
                    "-F",
                    "INPUT",
                )
            for src in sorted(self._shaped):
                self._unshape(src)
            self._cut.clear()
            self._slow.clear()

    @property
    def faulty(self) -> set[Link]:
        """The links cut or slowed right now."""
        with self._lock:
            return self._cut | self._slow

    def close(self) -> None:
        """Remove the namespaces, veths, bridge and record (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cut.clear()
            self._slow.clear()
            self._shaped.clear()
        atexit.unregister(self.close)
        with _locked():
            _remove_run(self.run_id)

    def __enter__(self) -> NetnsNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
