"""A seeded simulation of multi-Raft: node processes that each host several Raft
shards, one RaftCore per (node, shard), their messages sharing one link per pair.

Owns: `MultiSim`, the cluster (nodes 1..n, shards given), its shared links and
its clock; the faults are filters on the links (`cut`: a message of shard g from
src to dst is lost when it returns True), as a partition of one shard's traffic
or of a whole node. Each ordered pair of nodes has one FIFO link carrying
shard-tagged messages of every shard (raftio/multiplex.py: one stream per peer
process, the shard stamped on each message), each with a random delay that never
lets it overtake an earlier one; a message the filter cuts is dropped where it
would be delivered, and the messages of other shards behind it go on.

Each node ticks its shards together (one process, one timer); proposals go to each
shard's leader every few ms. A core persists each Ready at once (MemoryStorage and
a hard state, as tests/sim/harness.py does) before its messages leave.

Checked after every step (`check`): per shard at most one leader per term, and
every node's applied entries are a prefix of the shard's one committed log.
History (`commits`, `leaders`) is kept per shard for the tests' assertions.
Every random choice comes from `random.Random(seed)`: a seed replays exactly, and
`failure` names the seed and how to replay it.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dledger_commitlog.common.routes import preferred_leader
from raft import Config, HardState, MemoryStorage, Message, NotLeader, RaftCore, Role
from raft.types import Entry

TICK_MS = 10
Cut = Callable[[int, Message], bool]  # (shard, message) -> lost


@dataclass(slots=True)
class ShardView:
    """One shard's history across the nodes."""

    canon: list[tuple[int, bytes]] = field(default_factory=list)  # committed (term, data)
    leaders: dict[int, int] = field(default_factory=dict)  # term -> leader
    changes: list[tuple[int, int | None]] = field(default_factory=list)  # (ms, leader seen)
    commits: list[tuple[int, int]] = field(default_factory=list)  # (ms, max commit index)


class MultiSim:
    def __init__(
        self,
        seed: int,
        shards: Sequence[int],
        nodes: int = 3,
        replay: str = "",
        *,
        preferred: bool = True,
    ) -> None:
        self.seed = seed
        self.replay = replay
        self.preferred = preferred
        rng = self.rng = random.Random(seed)
        self.ids = tuple(range(1, nodes + 1))
        self.shards = tuple(shards)
        heartbeat = rng.choice((1, 2, 3))
        self.max_delay_ms = rng.choice((1, 3, 8))
        self.loss = rng.choice((0.0, 0.0, 0.005, 0.02))  # random loss, every shard alike
        self.cores: dict[tuple[int, int], RaftCore] = {}
        self.storage: dict[tuple[int, int], MemoryStorage] = {}
        self.hard: dict[tuple[int, int], HardState] = {}
        self.applied: dict[tuple[int, int], int] = {}
        for n in self.ids:
            for g in self.shards:
                pref = preferred_leader(g, self.ids) if preferred else None
                cfg = Config(
                    id=n,
                    peers=self.ids,
                    election_ticks=10,
                    heartbeat_ticks=heartbeat,
                    preferred_leader=pref,
                )
                self.storage[n, g] = MemoryStorage()
                self.hard[n, g] = HardState()
                self.applied[n, g] = 0
                self.cores[n, g] = RaftCore(
                    cfg,
                    self.storage[n, g],
                    self.hard[n, g],
                    rng=random.Random(rng.randrange(1 << 32)),
                )
        # One ordered link per pair of nodes: (arrival ms, shard, message), FIFO.
        self.links: dict[tuple[int, int], deque[tuple[int, int, Message]]] = {
            (a, b): deque() for a in self.ids for b in self.ids if a != b
        }
        self.next_tick = {n: rng.randrange(TICK_MS) for n in self.ids}
        self.views = {g: ShardView() for g in self.shards}
        self.cut: Cut = lambda g, m: False
        self.load = True  # propose to each shard's leader every 3 ms
        self.now = 0
        self.proposed = 0
        self.delivered = 0
        self.lost_to_cut = 0

    # --- views ---

    def leader(self, g: int) -> int | None:
        """The leader of the highest term among the nodes that think they lead `g`."""
        leading = [n for n in self.ids if self.cores[n, g].role is Role.LEADER]
        return max(leading, key=lambda n: self.cores[n, g].term) if leading else None

    def commit(self, g: int) -> int:
        return len(self.views[g].canon)

    def failure(self, what: str) -> AssertionError:
        lines = [
            f"multi-Raft simulation seed {self.seed} failed at t={self.now} ms: {what}",
            f"replay: {self.replay or 'MultiSim'}({self.seed})",
            f"links: delay 1..{self.max_delay_ms} ms, loss {self.loss}",
        ]
        for g in self.shards:
            states = ", ".join(
                f"n{n} {self.cores[n, g].role.value} t{self.cores[n, g].term} "
                f"c{self.cores[n, g].commit_index}"
                for n in self.ids
            )
            lines.append(f"  shard {g}: {states}; leader changes {self.views[g].changes[-6:]}")
        return AssertionError("\n".join(lines))

    # --- running ---

    def run_until(self, ms: int, every_ms: Callable[[], None] | None = None) -> None:
        while self.now < ms:
            self.step()
            if every_ms is not None:
                every_ms()

    def step(self) -> None:
        """One millisecond: deliveries due, ticks due, proposals, Readies."""
        self.now += 1
        for (_a, b), link in self.links.items():
            while link and link[0][0] <= self.now:
                _, g, m = link.popleft()
                if self.cut(g, m):
                    self.lost_to_cut += 1
                    continue
                self.delivered += 1
                self.cores[b, g].step(m)
        for n in self.ids:
            if self.next_tick[n] <= self.now:
                self.next_tick[n] = self.now + TICK_MS + self.rng.randrange(-1, 2)
                for g in self.shards:
                    self.cores[n, g].tick()
        if self.load and self.now % 3 == 0:
            for g in self.shards:
                self._propose(g)
        for (n, g), core in self.cores.items():
            while core.has_ready():
                self._process(n, g, core)
        self.check()

    def _propose(self, g: int) -> None:
        for n in self.ids:
            core = self.cores[n, g]
            if core.role is Role.LEADER:
                self.proposed += 1
                with contextlib.suppress(NotLeader):
                    core.propose(b"g%d-%d" % (g, self.proposed))

    def _process(self, n: int, g: int, core: RaftCore) -> None:
        rd = core.ready()
        st = self.storage[n, g]
        if rd.entries:
            st.append(rd.entries)
        if rd.hard_state is not None:
            self.hard[n, g] = rd.hard_state
        for m in rd.messages:
            if self.rng.random() < self.loss:
                continue
            link = self.links[m.src, m.dst]
            at = self.now + self.rng.randint(1, self.max_delay_ms)
            if link:
                at = max(at, link[-1][0])  # one stream: no overtaking
            link.append((at, g, m))
        self._apply(n, g, rd.committed_entries)
        core.advance(rd)

    def _apply(self, n: int, g: int, entries: Sequence[Entry]) -> None:
        view = self.views[g]
        for e in entries:
            if e.index <= len(view.canon):
                if view.canon[e.index - 1] != (e.term, e.data):
                    raise self.failure(f"shard {g}: node {n} applied a different entry {e.index}")
            elif e.index == len(view.canon) + 1:
                view.canon.append((e.term, e.data))
                view.commits.append((self.now, e.index))
            else:
                raise self.failure(f"shard {g}: node {n} applied entry {e.index} out of order")
            self.applied[n, g] = e.index

    def check(self) -> None:
        for g in self.shards:
            view = self.views[g]
            for n in self.ids:
                core = self.cores[n, g]
                if core.role is Role.LEADER:
                    first = view.leaders.setdefault(core.term, n)
                    if first != n:
                        raise self.failure(
                            f"shard {g}: nodes {first} and {n} lead term {core.term}"
                        )
            seen = self.leader(g)
            if not view.changes or view.changes[-1][1] != seen:
                view.changes.append((self.now, seen))


def no_commit_gap(sim: MultiSim, g: int, since: int, until: int, gap_ms: int) -> None:
    """Shard `g` committed a new entry at least every `gap_ms` between `since` and `until`."""
    times = [since] + [t for t, _ in sim.views[g].commits if since < t <= until] + [until]
    worst = max(b - a for a, b in itertools.pairwise(times))
    if worst > gap_ms:
        raise sim.failure(
            f"shard {g} committed nothing for {worst} ms between t={since} and t={until}"
        )


def leaders_between(sim: MultiSim, g: int, since: int, until: int) -> list[int | None]:
    """The leaders `g` had from `since` to `until` (the one at `since` first)."""
    before = [who for t, who in sim.views[g].changes if t <= since]
    during = [who for t, who in sim.views[g].changes if since < t <= until]
    return before[-1:] + during


def move_leader(sim: MultiSim, g: int, to: int, deadline_ms: int) -> None:
    """Transfer shard `g`'s leadership to node `to` (quiet meanwhile, as `settle`)."""
    sim.load = False
    while sim.leader(g) != to:
        if sim.now >= deadline_ms:
            raise sim.failure(f"shard {g}: no transfer to node {to} in time")
        leader = sim.leader(g)
        if leader is not None and sim.now % 50 == 0:
            sim.cores[leader, g].transfer_leadership(to)
        sim.step()
    sim.load = True
    sim.run_until(sim.now + 100)


def settle(sim: MultiSim, deadline_ms: int) -> None:
    """Run until every shard is led by its preferred node (elections and transfers
    done; without preferred leaders, until every shard has a leader), then 100 ms
    under load. Quiet meanwhile: a leader hands over to its
    preferred node only when that one holds its whole log (raft/replication.py),
    which a steady stream of proposals may never let happen."""

    def settled() -> bool:
        if not sim.preferred:
            return all(sim.leader(g) is not None for g in sim.shards)
        return all(sim.leader(g) == preferred_leader(g, sim.ids) for g in sim.shards)

    sim.load = False
    while not settled():
        if sim.now >= deadline_ms:
            raise sim.failure("shards not led by their preferred nodes in time")
        sim.step()
    sim.load = True
    sim.run_until(sim.now + 100)
