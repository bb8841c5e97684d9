"""Chaos scenarios: seeded schedules of faults a `Nemesis` injects into a running cluster.

A scenario is a function of a `Nemesis` that injects faults until the nemesis's
deadline and may leave faults in place (the runner heals everything afterwards).
Every fault is recorded in the history as an `info` event once it is in place (so a
failover is timed from the moment the leader is really gone); faults that take the
leader away are also recorded as leader faults, from which the runner measures
failover times. Randomness comes only from `nemesis.rng` (seeded), so a seed
replays the same schedule (timings still vary with the machine).
The pauses between faults here are the schedule itself, not waits for a
condition: conditions are awaited with `Nemesis.wait_*`, each with a deadline.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chaos.history import OK, History
from chaos.network import Network, isolate, partition
from dledger_commitlog.cli.launcher import LocalCluster, NodeSpec, answered
from dledger_commitlog.client import NodeStatus


class ScenarioError(RuntimeError):
    """The cluster did not reach a state the schedule needs (e.g. no leader in time)."""


@dataclass(slots=True)
class Nemesis:
    cluster: LocalCluster
    net: Network
    history: History
    rng: random.Random
    deadline: float  # monotonic
    leader_faults: list[float] = field(default_factory=list)  # history times
    loss_windows: list[tuple[float, float]] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)
    stopped: set[int] = field(default_factory=set)
    stop_event: threading.Event = field(default_factory=threading.Event)
    settle_s: float = 30.0  # how long a node may take to come back and catch up
    max_leader_faults: int | None = None  # stop the schedule after this many
    exits: list[str] = field(default_factory=list)  # nodes that stopped on their own
    # Membership scenarios (chaos/membership.py): the ids the run may add (their links
    # exist from the start), whom the runner tells of a node that joins or leaves (the
    # monitor, the clients), the nodes whose data directory was deleted, and the
    # nodes removed while killed (their store was never reconciled by a restart).
    spare_ids: tuple[int, ...] = ()
    on_join: Callable[[NodeSpec], None] = lambda spec: None
    on_leave: Callable[[NodeSpec], None] = lambda spec: None
    wiped: set[int] = field(default_factory=set)
    crashed: set[int] = field(default_factory=set)

    @property
    def nodes(self) -> list[int]:
        return sorted(self.cluster.specs)

    def running(self) -> bool:
        enough = self.max_leader_faults is not None and (
            len(self.leader_faults) >= self.max_leader_faults
        )
        return time.monotonic() < self.deadline and not self.stop_event.is_set() and not enough

    def pause_for(self, lo: float, hi: float) -> None:
        """The schedule's gap between two steps (cut short at the deadline)."""
        gap = self.rng.uniform(lo, hi)
        self.stop_event.wait(max(0.0, min(gap, self.deadline - time.monotonic())))

    def fault(self, name: str, detail: str = "", leader: bool = False) -> float:
        at = self.history.info(name, detail)
        if leader:
            self.leader_faults.append(at)
        return at

    # -------------------------------------------------------------- observing

    def statuses(self) -> dict[int, NodeStatus]:
        return answered(self.cluster.statuses(timeout_s=0.3))

    def leader(self, exclude: set[int] | None = None, timeout_s: float = 10.0) -> int:
        """A leader all answering nodes agree on (not in `exclude`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.supervise()
            got = self.statuses()
            leaders = {s.node_id: s.term for s in got.values() if s.role == "leader"}
            if leaders:
                best = max(leaders, key=lambda i: leaders[i])
                if best not in (exclude or set()):
                    return best
            if time.monotonic() >= deadline:
                raise ScenarioError(f"no leader (excluding {exclude}) within {timeout_s:g}s")
            time.sleep(0.05)

    def supervise(self) -> None:
        """Restart a node that exited on its own (as a supervisor would), noting why."""
        for node in self.nodes:
            if node not in self.stopped and not self.cluster.is_running(node):
                last = self.cluster.log_tail(node, 1).strip()[-300:]
                self.exits.append(f"n{node}: {last}")
                self.fault("exited", f"n{node} exited on its own; restarted ({last})")
                self.cluster.start(node)

    def wait_caught_up(self, nodes: list[int] | None = None) -> None:
        """Every node in `nodes` (default all) answers and commits what the leader had."""
        ids = nodes if nodes is not None else self.nodes
        leader = self.leader(timeout_s=self.settle_s)
        target = self.statuses().get(leader)
        goal = target.committed_index if target is not None else 0
        deadline = time.monotonic() + self.settle_s
        while True:
            self.supervise()
            got = self.statuses()
            if all(i in got and got[i].committed_index >= goal for i in ids):
                return
            if time.monotonic() >= deadline:
                raise ScenarioError(f"nodes {ids} did not reach index {goal} in {self.settle_s}s")
            time.sleep(0.05)

    def wait_put_acked_after(self, at: float, timeout_s: float, why: str) -> float:
        """Until a put invoked at or after history time `at` is acknowledged (the group
        serves); its acknowledgement's time. ScenarioError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = [o.end for o in self.history.operations("put") if o.type == OK and o.start >= at]
            if done:
                return min(done)
            if time.monotonic() >= deadline:
                raise ScenarioError(
                    f"no put invoked after {at:.2f}s was acknowledged within {timeout_s:g}s: {why}"
                )
            time.sleep(0.05)

    # -------------------------------------------------------------- process faults

    def kill(self, node: int, leader: bool = False, why: str = "") -> None:
        self.cluster.kill(node, signal.SIGKILL)
        self.fault("kill", f"kill -9 n{node}" + (f" {why}" if why else ""), leader)
        self.stopped.add(node)
        self.paused.discard(node)

    def start(self, node: int) -> None:
        self.fault("start", f"start n{node}")
        self.cluster.start(node)
        self.stopped.discard(node)

    def pause(self, node: int, leader: bool = False) -> None:
        self.cluster.pause(node)
        self.fault("pause", f"SIGSTOP n{node}", leader)
        self.paused.add(node)

    def resume(self, node: int) -> None:
        self.fault("resume", f"SIGCONT n{node}")
        self.cluster.resume(node)
        self.paused.discard(node)

    def heal(self) -> float:
        """Undo every fault: links healed, paused nodes resumed, stopped nodes started."""
        at = self.fault("heal", "links healed, every node running")
        self.net.heal()
        for node in sorted(self.paused):
            self.cluster.resume(node)
        for node in sorted(self.stopped):
            self.cluster.start(node)
        self.paused.clear()
        self.stopped.clear()
        return at


Scenario = Callable[[Nemesis], None]
SCENARIOS: dict[str, tuple[Scenario, str]] = {}
KINDS: dict[str, str] = {}  # scenario -> the kind of fault it injects
ASYNC_SCENARIOS = {"power-loss"}  # scenarios whose cluster runs with flush_mode async


def scenario(name: str, doc: str, kind: str) -> Callable[[Scenario], Scenario]:
    """Register a scenario; `kind` names its fault (scenarios of one kind differ in
    where and when it strikes). The first of each kind is that kind's representative."""

    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = (fn, doc)
        KINDS[name] = kind
        return fn

    return register


@scenario(
    "leader-kill", "kill -9 the leader, restart it once a new leader serves; repeat", "process kill"
)
def leader_kill(n: Nemesis) -> None:
    while n.running():
        old = n.leader()
        n.kill(old, leader=True)
        n.leader(exclude={old})
        n.pause_for(0.2, 0.6)
        n.start(old)
        n.wait_caught_up()
        n.pause_for(0.5, 1.5)


@scenario(
    "leader-isolate", "cut the leader off from every follower; it must step down", "partition"
)
def leader_isolate(n: Nemesis) -> None:
    while n.running():
        old = n.leader()
        isolate(n.net, old, n.nodes)
        n.fault("isolate", f"n{old} isolated", leader=True)
        n.leader(exclude={old})
        _wait_stepped_down(n, old)
        n.pause_for(0.5, 1.5)
        n.fault("heal", "links healed")
        n.net.heal()
        n.wait_caught_up()
        n.pause_for(0.5, 1.5)


def _wait_stepped_down(n: Nemesis, node: int) -> None:
    """Check-quorum: a leader that hears from no quorum steps down within an election."""
    deadline = time.monotonic() + 5.0
    while True:
        s = n.statuses().get(node)
        if s is not None and s.role != "leader":
            n.fault("stepped-down", f"n{node} is {s.role} in term {s.term}")
            return
        if time.monotonic() >= deadline:
            raise ScenarioError(f"isolated n{node} was still leader 5 s after the cut")
        time.sleep(0.05)


@scenario("partition-minority", "the leader lands in a minority; the majority elects", "partition")
def partition_minority(n: Nemesis) -> None:
    while n.running():
        old = n.leader()
        others = [i for i in n.nodes if i != old]
        side = [old, *n.rng.sample(others, (len(n.nodes) - 1) // 2 - 1)]
        partition(n.net, n.nodes, side)
        n.fault("partition", f"{sorted(side)} | rest", leader=True)
        n.leader(exclude=set(side))
        n.pause_for(1.0, 2.5)
        n.fault("heal", "links healed")
        n.net.heal()
        n.wait_caught_up()
        n.pause_for(0.5, 1.5)


@scenario(
    "partition-majority", "a minority of followers is cut off; the leader serves on", "partition"
)
def partition_majority(n: Nemesis) -> None:
    while n.running():
        old = n.leader()
        others = [i for i in n.nodes if i != old]
        side = n.rng.sample(others, (len(n.nodes) - 1) // 2)
        partition(n.net, n.nodes, side)
        n.fault("partition", f"{sorted(side)} | rest")
        n.pause_for(1.5, 3.0)
        n.fault("heal", "links healed")
        n.net.heal()
        n.wait_caught_up()
        n.pause_for(0.5, 1.5)


@scenario("flapping", "random partitions come and go every few hundred milliseconds", "partition")
def flapping(n: Nemesis) -> None:
    while n.running():
        if n.rng.random() < 0.5:
            side = n.rng.sample(n.nodes, n.rng.randint(1, (len(n.nodes) - 1) // 2))
            n.fault("partition", f"{sorted(side)} | rest")
            n.net.heal()
            partition(n.net, n.nodes, side)
        else:
            n.fault("heal", "links healed")
            n.net.heal()
        n.pause_for(0.2, 0.8)


@scenario(
    "one-way", "one direction of a leader-follower link fails, the other works", "one-way link"
)
def one_way(n: Nemesis) -> None:
    while n.running():
        leader = n.leader()
        follower = n.rng.choice([i for i in n.nodes if i != leader])
        src, dst = (leader, follower) if n.rng.random() < 0.5 else (follower, leader)
        n.fault("cut", f"n{src} -> n{dst} (one way)")
        n.net.cut(src, dst)
        n.pause_for(1.5, 3.0)
        n.fault("heal", "links healed")
        n.net.heal()
        n.wait_caught_up()
        n.pause_for(0.3, 1.0)


@scenario("slow-follower", "a follower's links get 50-300 ms of latency with jitter", "latency")
def slow_follower(n: Nemesis) -> None:
    while n.running():
        leader = n.leader()
        slow = n.rng.choice([i for i in n.nodes if i != leader])
        latency = n.rng.randint(50, 300)
        n.fault("slow", f"n{slow} links +{latency} ms")
        for other in n.nodes:
            if other != slow:
                n.net.slow(other, slow, latency, latency // 4)
                n.net.slow(slow, other, latency, latency // 4)
        n.pause_for(2.0, 4.0)
        n.fault("heal", "links healed")
        n.net.heal()
        n.wait_caught_up()


@scenario("paused-leader", "SIGSTOP the leader past the election timeout, then SIGCONT", "pause")
def paused_leader(n: Nemesis) -> None:
    while n.running():
        old = n.leader()
        n.pause(old, leader=True)
        n.leader(exclude={old})
        n.pause_for(0.5, 1.5)
        n.resume(old)
        _wait_stepped_down(n, old)
        n.wait_caught_up()
        n.pause_for(0.5, 1.5)


@scenario("rolling-restart", "restart every node in turn (SIGTERM, start, catch up)", "restart")
def rolling_restart(n: Nemesis) -> None:
    """Each round starts with the node that leads (every round fails the leader over,
    however slowly the machine restarts nodes), then the others in order."""
    while n.running():
        leader = n.leader()
        for node in sorted(n.nodes, key=lambda node: node != leader):
            if not n.running():
                return
            was_leader = n.leader() == node
            n.cluster.stop(node)
            n.fault("restart", f"SIGTERM n{node} stopped", leader=was_leader)
            n.cluster.start(node)
            n.wait_caught_up()
            n.pause_for(0.3, 1.0)


@scenario("full-cluster-kill", "kill -9 every node at once, restart them all", "cluster crash")
def full_cluster_kill(n: Nemesis) -> None:
    while n.running():
        n.pause_for(1.0, 2.5)
        for node in n.nodes:
            n.cluster.kill(node, signal.SIGKILL)
        n.fault("kill-all", "kill -9 every node", leader=True)
        for node in n.nodes:
            n.cluster.start(node)
        n.wait_caught_up()


@scenario("power-loss", "async flush: every node loses power and its unflushed tail", "power loss")
def power_loss(n: Nemesis) -> None:
    from chaos import disk

    flush_s = n.cluster.configs[n.nodes[0]].flush_interval_ms / 1000
    while n.running():
        n.pause_for(1.0, 2.5)
        at = n.fault("power-loss", "kill -9 every node, drop what was not flushed", leader=True)
        for node in n.nodes:
            n.cluster.kill(node, signal.SIGKILL)
        # The documented window: puts acknowledged within the last flush interval (plus
        # the time the kills took) may be lost; nothing acknowledged earlier.
        n.loss_windows.append((at - flush_s - WINDOW_SLACK_S, n.history.now()))
        for node in n.nodes:
            report = disk.power_loss(Path(n.cluster.specs[node].data_dir))
            n.fault("dropped", f"n{node}: {report}")
        for node in n.nodes:
            n.cluster.start(node)
        n.wait_caught_up()


WINDOW_SLACK_S = 0.1  # a flush that started before the kill may still be in its fsync


@scenario(
    "corrupt-tail",
    "flip a byte in a stopped node's log tail; it must repair from peers",
    "disk corruption",
)
def corrupt_tail(n: Nemesis) -> None:
    from chaos import disk

    while n.running():
        n.pause_for(0.5, 1.5)
        leader = n.leader()
        node = n.rng.choice(n.nodes)
        n.kill(node, leader=node == leader)
        if node == leader:
            n.leader(exclude={node})
        hit = disk.flip_byte(Path(n.cluster.specs[node].data_dir), n.rng)
        n.fault("flip-byte", f"n{node}: {hit}")
        n.start(node)
        n.wait_caught_up()


def representatives() -> list[str]:
    """The first scenario of each kind of fault, in registration order."""
    firsts: dict[str, str] = {}
    for name, kind in KINDS.items():
        firsts.setdefault(kind, name)
    return list(firsts.values())
