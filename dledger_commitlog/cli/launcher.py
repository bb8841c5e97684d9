"""Local cluster process management: N `dledger serve` processes on this machine.

`LocalCluster` runs the nodes of a `ClusterLayout` directory D (`cluster_layout.py`:
node configs, cluster.json, security files); each node's stdout and stderr go to
`D/n{i}/node.log`, appended across restarts. Used by the CLI (`dledger cluster
up/down/status`), `make run`, and integration and chaos tests.
Invariants: every node runs in its own process group; a process this object
started is stopped by `down()`, by the context manager's exit, or by an atexit
SIGKILL at the latest, unless `detach()` hands it over on purpose; `up` starts
only the nodes that do not run (a stopped cluster restarts from its data) and
leaves running ones alone; a pid read from cluster.json is signalled only if its
command line names our config.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, Unpack

from dledger_commitlog.cli.cluster_layout import ClusterError as ClusterError
from dledger_commitlog.cli.cluster_layout import ClusterLayout, LayoutOptions
from dledger_commitlog.cli.cluster_layout import NodeSpec as NodeSpec
from dledger_commitlog.cli.cluster_layout import free_ports as free_ports
from dledger_commitlog.cli.cluster_layout import node_toml as node_toml
from dledger_commitlog.client import (
    Client,
    ClientError,
    NodeStatus,
    StatusError,
    load_credentials,
)
from dledger_commitlog.node.config import load_config

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.05


class LocalCluster(ClusterLayout):
    """A cluster of local node processes rooted at `directory` (see the module doc)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        command_prefix: Callable[[int], list[str]] | None = None,
        env: Mapping[str, str] | None = None,
        **layout: Unpack[LayoutOptions],
    ) -> None:
        """The layout (`ClusterLayout`), and: `command_prefix(i)` is put before node i's
        command line (`ip netns exec NS`, say); `env` is added to the nodes'
        environment. `interpreters[i]`, when set, is the Python of another installation
        that runs node i (an earlier release: its own packages, this tree kept off its
        path); the others run this Python on this tree."""
        self.command_prefix = command_prefix
        self.env = dict(env or {})
        self.interpreters: dict[int, str] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._client: Client | None = None
        self._atexit = False
        super().__init__(directory, **layout)

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

    def start(self, node_id: int, drained: bool = False) -> None:
        """Start node `node_id` unless it runs; returns once the process exists.
        `drained`: it starts drained (`dledger serve --drained`, docs/upgrades.md)."""
        if self.is_running(node_id):
            return
        self._check_usable()
        spec = self.specs[node_id]
        spec.home.mkdir(parents=True, exist_ok=True)
        if not spec.config_path.exists():
            self._write_layout()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        python = self.interpreters.get(node_id)
        if python is None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(_PROJECT_ROOT), env.get("PYTHONPATH")])
            )
        else:
            env.pop("PYTHONPATH", None)
        cmd = [
            *(self.command_prefix(node_id) if self.command_prefix else []),
            python or sys.executable,
            "-m",
            "dledger_commitlog",
            "serve",
            "--config",
            str(spec.config_path),
            *(["--drained"] if drained else []),
        ]
        with spec.log_path.open("ab") as log:
            log.write(
                f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting node {node_id}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=spec.home,
                env=env,
            )
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
        """Start every node that does not run; return when a leader is elected, every
        node answers Status and knows that leader. Running nodes are left alone, as
        long as they run the settings this object would write (else ClusterError:
        `down` them first). If start-up fails, the nodes this call started are stopped
        again."""
        self._check_usable()
        running = [i for i in self.specs if self.is_running(i)]
        for i in running:
            if load_config(self.specs[i].config_path) != self.configs[i]:
                raise ClusterError(
                    f"node {i} runs (pid {self.pid(i)}) with other settings "
                    "than these: `down` it first"
                )
        self._write_layout()
        started: list[int] = []
        try:
            for i in self.specs:
                if i not in running:
                    self.start(i)
                    started.append(i)
            self._wait_ready(timeout_s)
        except BaseException:
            self._stop_together(started, timeout_s=5.0)
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
            if not all(map(_accepts, (s.client for s in self.specs.values()))):
                statuses: dict[int, NodeStatus | StatusError] = {}  # still starting
            else:
                statuses = self.statuses(timeout_s=1.0)
            answered = statuses and all(isinstance(s, NodeStatus) for s in statuses.values())
            leader = _leader_of(statuses.values())
            # Ready: every node follows that leader (a node that started after the
            # election learns of it with the leader's next message).
            if answered and leader is not None and _all_follow(statuses.values(), leader):
                return
            if time.monotonic() >= deadline:
                tails = "\n".join(f"-- n{i}:\n{self.log_tail(i, 10)}" for i in self.specs)
                raise ClusterError(f"no ready cluster after {timeout_s:g}s: {statuses}\n{tails}")
            time.sleep(_POLL_S)

    def down(self, timeout_s: float = 10.0) -> None:
        """Stop every node: SIGTERM to all, wait, SIGKILL what is left."""
        self._stop_together(self.specs, timeout_s)
        self._forget_processes()
        if self.cluster_file.exists():
            self._save()

    def _stop_together(self, node_ids: Iterable[int], timeout_s: float) -> None:
        """SIGTERM to every running node of `node_ids` at once, wait, SIGKILL what is left."""
        running = {i: pid for i in node_ids if (pid := self.pid(i)) is not None}
        for pid in running.values():
            _killpg(pid, signal.SIGCONT)
            _killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for i, pid in running.items():
            if not self._wait_gone(i, pid, max(0.0, deadline - time.monotonic())):
                _killpg(pid, signal.SIGKILL)
                self._wait_gone(i, pid, timeout_s=10.0)

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()


def _accepts(address: str) -> bool:
    """Whether `address` (host:port) accepts a TCP connection now. Probed before the
    first Status, so that gRPC's reconnect backoff does not start while a node imports."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
            return True
    except OSError:
        return False


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


def _leader_of(statuses: Collection[NodeStatus | StatusError]) -> int | None:
    leaders = [s for s in statuses if isinstance(s, NodeStatus) and s.role == "leader"]
    return max(leaders, key=lambda s: s.term).node_id if leaders else None


def _all_follow(statuses: Collection[NodeStatus | StatusError], leader: int) -> bool:
    return all(isinstance(s, NodeStatus) and s.leader_id == leader for s in statuses)


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
