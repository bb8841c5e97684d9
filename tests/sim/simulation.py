"""The simulation loop: seeded events over a cluster of RaftCores.

Owns: the event queue (ticks, message deliveries, client proposals and reads,
faults and their repairs, log compaction), the per-node driver that follows
the Ready contract against a FakeDisk, and failure reports that name the seed.

Compaction: per seed none, lazy (now and then a random node drops part of its
applied prefix) or eager (often, the whole applied prefix, preferably on the
leader), so lagging, restarted and partitioned followers need snapshots.
Membership (`membership=True`, tests/sim/membership.py): the run starts with 1,
3 or 5 voters and, every 30-200 ms, asks the leader for a membership change;
an added learner is a new, empty node joining the group; a node whose removal
committed is stopped half the time (`retired`, never restarted), else it keeps
running. At the end, the final configuration must have a leader and every live
member must hold its committed log.

Wiping a node's whole data dir is not simulated: a node that forgets its term,
vote and acknowledged entries may break safety unless it is kept from voting
until caught up, which the core does not model.

One step is one event. Every random choice comes from `random.Random(seed)`,
so a seed replays exactly. Bounds: the event queue holds at most one tick,
client and fault event per source plus the bounded in-flight messages.
"""

from __future__ import annotations

import heapq
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raft import Message, NotLeader, RaftCore, Ready, Role, Snapshot
from raft.membership import ChangeOp
from tests.sim.checkers import Checker, LogView
from tests.sim.config import random_config
from tests.sim.disk import FakeDisk
from tests.sim.membership import (
    ASK_FOLLOWER_RATE,
    RETIRE_RATE,
    MembershipEvents,
    final_members,
    initial_voters,
    node_config,
)
from tests.sim.network import MAX_IN_FLIGHT, FakeNetwork, LinkProfile

TICK_MS = 10
CONVERGE_STEPS = 30_000


@dataclass(slots=True)
class SimNode:
    id: int
    disk: FakeDisk = field(default_factory=FakeDisk)
    core: RaftCore | None = None
    paused_until: int | None = None
    crash_on_persist: bool = False
    outstanding: Ready | None = None  # handed out by ready(), being persisted
    retired: bool = False  # removed from the group and stopped for good

    @property
    def live(self) -> bool:
        return self.core is not None and self.paused_until is None


class SimFailure(AssertionError):
    pass


class Seeded(Protocol):
    """A simulation of one seed (`Simulation`, `driver_sim.DriverSim`)."""

    stats: Counter[str]
    checker: Checker

    def run(self, steps: int) -> None: ...


def run_seeds(
    seeds: Sequence[int], steps: int, make: Callable[[int], Seeded], *, stats: bool = False
) -> int:
    """Run each seed, print every failure (with its replay command) and a summary;
    the process exit status: 1 if any seed failed."""
    failed = 0
    totals: Counter[str] = Counter()
    started = time.perf_counter()
    for seed in seeds:
        sim = make(seed)
        try:
            sim.run(steps)
        except SimFailure as err:
            failed += 1
            print(err, file=sys.stderr)
        totals.update(sim.stats)
        totals["leaders_elected"] += len(sim.checker.leaders)
        totals["entries_committed"] += len(sim.checker.canon)
    took = time.perf_counter() - started
    print(f"{len(seeds)} seeds x {steps} steps: {failed} failed in {took:.1f} s")
    if stats:
        for key, value in sorted(totals.items()):
            print(f"  {key:<24} {value}")
    return 1 if failed else 0


class Simulation:
    def __init__(self, seed: int, nodes: int | None = None, *, membership: bool = False) -> None:
        self.seed = seed
        rng = self.rng = random.Random(seed)
        if membership and nodes is None:
            nodes = initial_voters(rng)
        self.config = random_config(rng, nodes, async_storage_writes=False, membership=membership)
        self.sync_disk_rate = rng.choice((1.0, 0.7, 0.0))  # else the disk takes 1-5 ms
        self.compaction = rng.choice(("none", "lazy", "eager", "eager"))
        self.net = FakeNetwork(rng, LinkProfile.random(rng))
        self.nodes = {i: SimNode(i) for i in self.config.peers}
        self.checker = Checker(self.config.peers)
        self.now = 0
        self.steps = 0
        self.faults = True
        self.in_flight = 0
        self._seq = 0
        self._heap: list[tuple[int, int, str, object]] = []
        self._counter = 0
        self.trace: deque[tuple[int, str, object]] = deque(maxlen=40)
        self.stats: Counter[str] = Counter()
        self.members = MembershipEvents(self.config.peers, self.stats) if membership else None
        for node in self.nodes.values():
            self._start(node)
            self._push(rng.randrange(TICK_MS), "tick", node.id)
        self._push(rng.randrange(20), "client", None)
        self._push(rng.randrange(50), "read", None)
        self._push(rng.randrange(100, 400), "fault", None)
        if self.compaction != "none":
            self._push(rng.randrange(50, 200), "compact", None)
        if self.members is not None:
            self._push(rng.randrange(30, 200), "member", None)

    # --- running ---

    def run(self, steps: int) -> None:
        """`steps` events with faults, then heal everything and demand progress."""
        try:
            for _ in range(steps):
                self.step()
            self.check_logs()
            self.converge()
            self.check_logs()
            self.stats["conf_committed"] += self.checker.confs_committed
            self.stats["learnt_removal"] += len(self.checker.learnt_removal)
        except AssertionError as err:
            raise SimFailure(self.report(err, steps)) from err

    def report(self, err: BaseException, steps: int) -> str:
        tail = "\n".join(f"  t={t} {kind} {arg}" for t, kind, arg in self.trace)
        return (
            f"simulation seed {self.seed} failed at step {self.steps} (t={self.now} ms): {err}\n"
            f"replay: .venv/bin/python -m tests.sim --seed {self.seed} --steps {steps}"
            f"{' --membership' if self.members is not None else ''}\n"
            f"config: {self.config}\ncompaction: {self.compaction}, "
            f"sync disk rate {self.sync_disk_rate}\n"
            f"network: {self.net.profile}\nnodes:\n{self._describe()}\nlast events:\n{tail}"
        )

    def _describe(self) -> str:
        lines = []
        for n in self.nodes.values():
            c = n.core
            if c is None:
                lines.append(f"  node {n.id}: {'retired' if n.retired else 'down'}")
                continue
            m = c.membership
            lines.append(
                f"  node {n.id}: {c.role.value} term {c.term} leader {c.leader_id} log "
                f"[{c.first_index}, {c.last_index}] commit {c.commit_index} applied {c.applied} "
                f"voters {m.voters} learners {m.learners} (entry {c.conf_index})"
                f"{' paused' if n.paused_until is not None else ''}"
            )
        return "\n".join(lines)

    def step(self) -> None:
        t, _, kind, arg = heapq.heappop(self._heap)
        self.now = t
        self.steps += 1
        self.trace.append((t, kind, arg))
        match kind:
            case "tick":
                self._on_tick(self.nodes[arg])  # type: ignore[index]
            case "deliver":
                self.in_flight -= 1
                self._on_deliver(arg)  # type: ignore[arg-type]
            case "client":
                self._push(self.now + self.rng.randrange(1, 15), "client", None)
                if self.faults:  # while converging, let the backlog drain
                    self._client_propose()
            case "read":
                self._push(self.now + self.rng.randrange(5, 60), "read", None)
                self._client_read()
            case "fault":
                self._push(self.now + self.rng.randrange(50, 600), "fault", None)
                if self.faults:
                    self._inject_fault()
            case "restart":
                node = self.nodes[arg]  # type: ignore[index]
                if node.core is None and not node.retired:
                    self._start(node)
            case "resume":
                self.nodes[arg].paused_until = None  # type: ignore[index]
            case "heal":
                self.net.heal()
            case "persisted":
                self._on_persisted(arg)  # type: ignore[arg-type]
            case "compact":
                eager = self.compaction == "eager"
                self._push(
                    self.now + self.rng.randrange(*((5, 60) if eager else (50, 400))),
                    "compact",
                    None,
                )
                self._compact(eager)
            case "member":
                self._push(self.now + self.rng.randrange(30, 200), "member", None)
                if self.faults:
                    self._change_membership()
            case "retire":
                self._retire(self.nodes[arg])  # type: ignore[index]
            case _:
                raise AssertionError(kind)
        for node in self.nodes.values():
            if node.core is not None:
                self.checker.check_node(node.id, node.core, node.disk)
        if self.steps % 500 == 0:
            self.check_logs()

    def converge(self) -> None:
        """Heal all faults; a leader must then commit a new entry on every node."""
        self.faults = False
        self.net.heal()
        self.net.profile = LinkProfile(0.0, 0.0, 1, 5, self.net.profile.reorder)
        for node in self.nodes.values():
            node.paused_until = None
            node.crash_on_persist = False
            if node.core is None and not node.retired:
                self._start(node)
        marker = b"converge-%d" % self.seed
        pending: tuple[int, int, int] | None = None  # (index, proposer, its term)
        deadline = self.steps + CONVERGE_STEPS
        while self.steps < deadline:
            self.step()
            if pending is None:
                pending = self._propose_marker(marker)
                continue
            index, proposer, term = pending
            core = self.nodes[proposer].core
            members = self._final_members(core, term)
            if members is not None and all(
                n.core is not None and n.core.applied >= index for n in members
            ):
                if self.checker.canon[index - 1].data == marker:
                    self._check_final(members)
                    return
                pending = None  # the marker was lost to a leader change: propose again
            elif core is None or core.term != term or core.role is not Role.LEADER:
                pending = None  # its leader was deposed; the marker may never commit
        raise AssertionError(f"no progress within {CONVERGE_STEPS} steps after healing")

    def _final_members(self, core: RaftCore | None, term: int) -> list[SimNode] | None:
        """The nodes that must apply the marker: every node, or with membership changes
        the members of the final configuration, that of the marker's leader while it
        leads as a voter of it (None: not yet, or never for this marker)."""
        if self.members is None:
            return list(self.nodes.values())
        return final_members(self.nodes, core, term)

    def _check_final(self, members: Sequence[SimNode]) -> None:
        """Every live member's log holds the committed log (what was applied anywhere)."""
        canon = self.checker.canon
        for n in members:
            assert n.core is not None
            lo = max(n.core.first_index, 1)
            if n.core.log_slice(lo, len(canon) + 1) != canon[lo - 1 :]:
                raise AssertionError(f"member {n.id} does not hold the committed log")

    def _propose_marker(self, marker: bytes) -> tuple[int, int, int] | None:
        for node in self.nodes.values():
            if node.core is not None and node.core.role is Role.LEADER:
                try:
                    first, _ = node.core.propose(marker)
                except NotLeader:
                    return None
                self._drive(node)
                return first, node.id, node.core.term
        return None

    def check_logs(self) -> None:
        logs: dict[int, LogView] = {}
        for n in self.nodes.values():
            core = n.core
            if core is not None:
                base = core.first_index - 1
                entries = core.log_slice(base + 1, core.last_index + 1)
                logs[n.id] = LogView(
                    base, core.log_term(base), entries, core.membership, core.conf_index
                )
            st = n.disk.storage  # durable logs must match too
            base = st.first_index() - 1
            logs[-n.id] = LogView(base, st.term(base), st.all_entries())
        self.checker.check_log_matching(logs)

    # --- events ---

    def _push(self, at: int, kind: str, arg: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, arg))

    def _on_tick(self, node: SimNode) -> None:
        self._push(self.now + TICK_MS + self.rng.randrange(-1, 2), "tick", node.id)
        if node.live:
            assert node.core is not None
            node.core.tick()
            self._drive(node)

    def _on_deliver(self, m: Message) -> None:
        node = self.nodes[m.dst]
        if node.core is None or not self.net.can_deliver(m):
            return
        if node.paused_until is not None:  # held in the socket buffer until it wakes
            self._send_later(m, node.paused_until + self.rng.randrange(5) - self.now)
            return
        node.core.step(m)
        self._drive(node)

    def _send_later(self, m: Message, delay_ms: int) -> None:
        if self.in_flight >= MAX_IN_FLIGHT:
            return
        self.in_flight += 1
        self._push(self.now + delay_ms, "deliver", m)

    def _client_propose(self) -> None:
        live = [n for n in self.nodes.values() if n.live]
        if not live:
            return
        leaders = [n for n in live if n.core is not None and n.core.role is Role.LEADER]
        node = self.rng.choice(leaders or live)
        assert node.core is not None
        self._counter += 1
        batch = [b"%d.%d" % (self._counter, k) for k in range(self.rng.randint(1, 3))]
        try:
            node.core.propose(batch)
        except NotLeader:
            self.stats["proposals_refused"] += 1
            return
        self.stats["proposals"] += 1
        self._drive(node)

    def _client_read(self) -> None:
        live = [n for n in self.nodes.values() if n.live]
        if not live:
            return
        node = self.rng.choice(live)
        assert node.core is not None
        self._counter += 1
        ctx = b"read-%d" % self._counter
        self.checker.on_read_issued(ctx)
        try:
            node.core.read_index(ctx)
        except NotLeader:
            return
        self._drive(node)

    # --- the driver: the Ready contract against the fake disk ---

    def _start(self, node: SimNode) -> None:
        joining = self.members.join_peers.get(node.id) if self.members is not None else None
        cfg = node_config(self.config, node.id, joining)
        rng = random.Random(self.rng.randrange(1 << 32))
        node.core = RaftCore(cfg, node.disk.storage, node.disk.hard_state, rng=rng)
        node.paused_until = None
        node.crash_on_persist = False
        node.outstanding = None
        self.checker.on_restart(node.id, node.core)

    def _crash(self, node: SimNode) -> None:
        """Kill the node; a write in progress is torn (only a prefix survives)."""
        self.stats["crashes"] += 1
        if node.outstanding is not None:
            rd, node.outstanding = node.outstanding, None
            self.stats["torn_writes"] += 1
            node.disk.persist_torn(rd.snapshot, rd.entries, rd.hard_state, self.rng)
        node.core = None
        node.paused_until = None
        node.crash_on_persist = False
        self._push(self.now + self.rng.randrange(10, 500), "restart", node.id)

    def _drive(self, node: SimNode) -> None:
        """Hand out Readies; persist at once, or (a slow disk) start the write and
        let the core keep stepping until `_on_persisted` completes it."""
        core = node.core
        assert core is not None
        while node.outstanding is None and core.has_ready():
            rd = node.outstanding = core.ready()
            if node.crash_on_persist and (rd.entries or rd.hard_state or rd.snapshot):
                self._crash(node)
                return
            if self.rng.random() >= self.sync_disk_rate:
                self._push(self.now + self.rng.randrange(1, 6), "persisted", (node.id, rd))
                return
            self._complete(node, rd)

    def _on_persisted(self, arg: tuple[int, Ready]) -> None:
        node = self.nodes[arg[0]]
        if node.outstanding is not arg[1]:
            return  # the node crashed meanwhile
        if node.paused_until is not None:
            self._push(node.paused_until + self.rng.randrange(3), "persisted", arg)
            return
        self._complete(node, arg[1])
        self._drive(node)

    def _complete(self, node: SimNode, rd: Ready) -> None:
        core, disk = node.core, node.disk
        assert core is not None
        disk.persist(rd.snapshot, rd.entries, rd.hard_state)
        if rd.snapshot is not None:
            self.stats["snapshots_restored"] += 1
            self.checker.on_snapshot(node.id, rd.snapshot)
        for m in rd.messages:
            self.checker.on_send(node.id, m, disk)
            if isinstance(m, Snapshot):
                self.stats["snapshots_sent"] += 1
            for at in self.net.arrivals(m, self.now):
                self._send_later(m, at - self.now)
        self.checker.on_apply(node.id, core.term, rd.committed_entries)
        for rs in rd.read_states:
            self.stats["reads_answered"] += 1
            self.checker.on_read_state(node.id, rs)
        node.outstanding = None
        core.advance(rd)

    # --- membership changes ---

    def _change_membership(self) -> None:
        """Ask the leader (now and then a follower) for a membership change; start the
        node it adds; retire, now and then, a node whose removal it accepted."""
        assert self.members is not None
        rng = self.rng
        live = [n for n in self.nodes.values() if n.live]
        leader = next((n for n in live if n.core is not None and n.core.role is Role.LEADER), None)
        if leader is None or rng.random() < ASK_FOLLOWER_RATE:
            if not live:
                return
            leader = rng.choice(live)
        core = leader.core
        assert core is not None
        asked = self.members.ask(rng, core, leader.id)
        if asked is None:
            return
        change, new = asked
        if new is not None:
            node = self.nodes[new] = SimNode(new)
            self._start(node)
            self._push(self.now + rng.randrange(TICK_MS), "tick", new)
        elif change.op is ChangeOp.REMOVE and rng.random() < RETIRE_RATE:
            self._push(self.now + rng.randrange(50, 500), "retire", change.node_id)
        self._drive(leader)

    def _retire(self, node: SimNode) -> None:
        """Stop a removed node for good once its removal is committed (else later)."""
        if node.retired or not self.faults:
            return
        if node.id not in self.checker.removed_at:
            self._push(self.now + self.rng.randrange(50, 500), "retire", node.id)
            return
        self.stats["retired"] += 1
        node.retired = True
        node.core = None
        node.outstanding = None
        node.paused_until = None

    def _compact(self, eager: bool) -> None:
        """Retention on one node (eagerly, the leader half the time): drop part of
        its applied prefix, or all of it. Runs whenever, even with a write of the
        node in progress, as retention does in a real driver."""
        rng = self.rng
        up = [(n, n.core) for n in self.nodes.values() if n.core is not None]
        if not up:
            return
        node, core = rng.choice(up)
        if eager and rng.random() < 0.5:
            node, core = next(((n, c) for n, c in up if c.role is Role.LEADER), (node, core))
        st = node.disk.storage
        lo = st.first_index() - 1
        hi = min(core.applied, st.last_index())
        if hi <= lo:
            return
        index = hi if eager or rng.random() < 0.3 else rng.randint(lo + 1, hi)
        self.stats["compactions"] += 1
        node.disk.compact(index)

    def _inject_fault(self) -> None:
        rng = self.rng
        ids = [i for i, n in self.nodes.items() if not n.retired]  # (retired: gone for good)
        victim = self.nodes[rng.choice(ids)]
        leader = next(
            (n for n in self.nodes.values() if n.core is not None and n.core.role is Role.LEADER),
            None,
        )
        if leader is not None and rng.random() < 0.5:
            victim = leader
        fault = rng.randrange(8)
        self.stats[f"fault_{_FAULTS[fault]}"] += 1
        match fault:
            case 0:
                if victim.core is not None:
                    self._crash(victim)
            case 1:
                victim.crash_on_persist = victim.core is not None
            case 2:
                if victim.live:
                    victim.paused_until = self.now + rng.randrange(20, 600)
                    self._push(victim.paused_until, "resume", victim.id)
            case 3 if len(ids) > 1:  # (a lone first voter has nobody to be cut from)
                rng.shuffle(ids)
                cut = rng.randrange(1, len(ids))
                self.net.partition([ids[:cut], ids[cut:]])
                self._push(self.now + rng.randrange(50, 800), "heal", None)
            case 4:
                others = [i for i in ids if i != victim.id]
                if rng.random() < 0.5:
                    self.net.block_one_way([victim.id], others)
                else:
                    self.net.block_one_way(others, [victim.id])
                self._push(self.now + rng.randrange(50, 800), "heal", None)
            case 5:
                self.net.partition([[victim.id], [i for i in ids if i != victim.id]])
                self._push(self.now + rng.randrange(50, 800), "heal", None)
            case 6:
                if leader is not None and leader.live:
                    assert leader.core is not None
                    leader.core.transfer_leadership(rng.choice(leader.core.membership.voters))
                    self._drive(leader)
            case _:
                pass  # a quiet period


_FAULTS = ("crash", "torn", "pause", "split", "one_way", "isolate", "transfer", "none")
