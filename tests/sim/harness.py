"""A hand-driven cluster for scenario tests: nothing happens unless a test says so.

Owns: `Cluster`, in the spirit of etcd's rafttest interaction environment:
`campaign`, `propose`, `tick`, `process_ready`, `deliver` (with filters and
drops), `stabilize`, `isolate`/`partition`/`heal`, `crash`/`restart`,
`compact`. Every node persists each Ready (restoring a snapshot first) to its
own MemoryStorage and hard state before the Ready's messages are queued, as a
real driver must.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raft import (
    Config,
    Entry,
    HardState,
    MemoryStorage,
    Message,
    RaftCore,
    ReadState,
    Ready,
    Role,
    SnapshotMeta,
)


@dataclass(slots=True)
class Node:
    storage: MemoryStorage
    hard_state: HardState = field(default_factory=HardState)
    core: RaftCore | None = None
    applied: list[Entry] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    snapshots: list[SnapshotMeta] = field(default_factory=list)  # restored, in order
    readies: list[Ready] = field(default_factory=list)


class Cluster:
    def __init__(
        self,
        n: int = 3,
        logs: Mapping[int, Sequence[Entry]] | None = None,
        hard_states: Mapping[int, HardState] | None = None,
        seed: int = 0,
        **overrides: Any,
    ) -> None:
        self.peers = tuple(range(1, n + 1))
        self.overrides = overrides
        self.rng = random.Random(seed)
        self.joined: set[int] = set()  # nodes added after the start (`add_node`)
        self.nodes: dict[int, Node] = {}
        for i in self.peers:
            entries = (logs or {}).get(i, ())
            hs = (hard_states or {}).get(i, HardState())
            self.nodes[i] = Node(MemoryStorage(entries), hs)
            self.restart(i)
        self.mailbox: list[Message] = []
        self.blocked: set[tuple[int, int]] = set()
        self.sent: list[Message] = []  # every message ever queued, for assertions

    def config(self, i: int) -> Config:
        if i in self.joined:
            seeds = tuple(p for p in self.peers if p not in self.joined)
            return Config(id=i, peers=seeds, join=True, **self.overrides)
        return Config(
            id=i, peers=tuple(p for p in self.peers if p not in self.joined), **self.overrides
        )

    def add_node(self, i: int) -> None:
        """Start node i, empty, as a node joining the group (`Config.join`); the
        group learns of it through a membership change (`RaftCore.propose_conf_change`)."""
        assert i not in self.nodes
        self.peers = (*self.peers, i)
        self.joined.add(i)
        self.nodes[i] = Node(MemoryStorage())
        self.restart(i)

    def core(self, i: int) -> RaftCore:
        c = self.nodes[i].core
        assert c is not None, f"node {i} is down"
        return c

    # --- faults ---

    def crash(self, i: int) -> None:
        """Lose the core's memory; storage and hard state (persisted) survive."""
        self.nodes[i].core = None
        self.mailbox = [m for m in self.mailbox if m.dst != i]

    def restart(self, i: int) -> None:
        node = self.nodes[i]
        rng = random.Random(self.rng.randrange(1 << 32))
        node.core = RaftCore(self.config(i), node.storage, node.hard_state, rng=rng)
        node.applied = []

    def compact(self, i: int, index: int | None = None) -> None:
        """Retention on node i: drop its log up to `index` (default: all it applied)."""
        core = self.core(i)
        self.nodes[i].storage.compact(core.applied if index is None else index)

    def isolate(self, i: int) -> None:
        self.partition([i], [p for p in self.peers if p != i])

    def partition(self, *groups: Sequence[int]) -> None:
        for a in groups:
            for b in groups:
                if a is not b:
                    self.blocked.update((x, y) for x in a for y in b)

    def heal(self) -> None:
        self.blocked.clear()

    # --- driving ---

    def live(self) -> list[int]:
        return [i for i in self.peers if self.nodes[i].core is not None]

    def process_ready(self, i: int, ready: Ready | None = None) -> bool:
        """Persist, send (queue), apply and advance one Ready of node i (`ready`: one a
        test already took from the core)."""
        node = self.nodes[i]
        core = self.core(i)
        if ready is None and not core.has_ready():
            return False
        rd = core.ready() if ready is None else ready
        node.readies.append(rd)
        if rd.snapshot is not None:
            snap = rd.snapshot
            node.storage.restore(snap.index, snap.term, snap.data)
            node.snapshots.append(snap)
        node.storage.append(rd.entries)
        if rd.hard_state is not None:
            node.hard_state = rd.hard_state
        self.mailbox.extend(rd.messages)
        self.sent.extend(rd.messages)
        node.applied.extend(rd.committed_entries)
        node.read_states.extend(rd.read_states)
        core.advance(rd)
        return True

    def process_all(self) -> bool:
        did = False
        for i in self.live():
            while self.process_ready(i):
                did = True
        return did

    def deliver(
        self,
        where: Callable[[Message], bool] = lambda m: True,
        drop: Callable[[Message], bool] = lambda m: False,
    ) -> int:
        """Deliver the queued messages matching `where` (dropping those matching
        `drop` or crossing a partition); others stay queued. Returns how many."""
        now = [m for m in self.mailbox if where(m)]
        self.mailbox = [m for m in self.mailbox if not where(m)]
        count = 0
        for m in now:
            node = self.nodes[m.dst]
            if drop(m) or (m.src, m.dst) in self.blocked or node.core is None:
                continue
            node.core.step(m)
            count += 1
        return count

    def stabilize(self, max_rounds: int = 1000) -> None:
        """Process Readies and deliver messages until nothing moves."""
        for _ in range(max_rounds):
            did = self.process_all()
            if self.mailbox:
                self.deliver()
                did = True
            if not did:
                return
        raise AssertionError("cluster did not stabilize")

    def tick(self, i: int, times: int = 1) -> None:
        for _ in range(times):
            self.core(i).tick()

    def tick_all(self, times: int = 1, stabilize: bool = True) -> None:
        for _ in range(times):
            for i in self.live():
                self.core(i).tick()
            if stabilize:
                self.stabilize()

    def campaign(self, i: int) -> None:
        """Tick node i (only) until it starts an election, then stabilize."""
        core = self.core(i)
        for _ in range(4 * self.config(i).election_ticks):
            if core.role is not Role.FOLLOWER:
                break
            core.tick()
        assert core.role is not Role.FOLLOWER, f"node {i} did not campaign"
        self.stabilize()

    def propose(self, i: int, *data: bytes) -> tuple[int, int]:
        return self.core(i).propose(list(data))

    # --- views ---

    def leader(self) -> int | None:
        leaders = [i for i in self.live() if self.core(i).role is Role.LEADER]
        assert len(leaders) <= 1 or len({self.core(i).term for i in leaders}) == len(leaders)
        return max(leaders, key=lambda i: self.core(i).term) if leaders else None

    def applied_data(self, i: int) -> list[bytes]:
        return [e.data for e in self.nodes[i].applied if e.data]

    def log_terms(self, i: int) -> list[int]:
        c = self.core(i)
        return [e.term for e in c.log_slice(1, c.last_index + 1)]


def entries(*terms: int, start: int = 1) -> list[Entry]:
    """A log with the given terms at indexes start, start+1, ..."""
    return [Entry(start + k, t, b"e%d" % (start + k)) for k, t in enumerate(terms)]
