"""Membership events for both simulators: which change to ask the leader for next.

Owns `MembershipEvents`, the seeded chooser of configuration changes that
tests/sim/simulation.py and tests/sim/driver_sim.py share, the bookkeeping of
which ids were added and removed, `node_config`, the `Config` a node starts
with (a node of the first voter set, or one joining the running group with
`Config.join`), and `final_members`, the nodes that must hold the committed log
at the end of a seed (the members of the final configuration).

A membership run starts with 1, 3 or 5 voters and a pool of spare ids; at random
times the simulation asks the current leader (now and then a follower) to add a
learner (the simulation then starts that node, empty), to promote a learner, to
remove a learner, a voter or the leader itself; now and then a change that
cannot apply (an id that exists, a voter to promote, an unknown id), which the
core must refuse. Refusals are counted, never failures.

Invariants kept here: an id is added only once it is known to no configuration
the leader has (a fresh id, or one whose addition a new leader rolled back), and
never again once its removal was accepted (a removed node keeps its disk, its
term and its vote: it is retired, not recycled), so a node that learnt of its
removal never has a reason to campaign again (tests/sim/checkers.py checks it).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from raft import Config, NotLeader, RaftCore, Role
from raft.errors import MembershipError
from raft.membership import ChangeOp, ConfChange, Member, Membership

SPARE_IDS = 6  # ids a run may add, beyond its first voters
BAD_CHANGE_RATE = 0.08  # a change that does not apply: the core must refuse it
ASK_FOLLOWER_RATE = 0.05  # a change asked of a follower: NotLeader
RETIRE_RATE = 0.5  # a node whose removal committed is stopped (else it keeps running)
TARGET_VOTERS = (3, 5)  # changes steer the voter count back into this range


def initial_voters(rng: random.Random) -> int:
    """How many voters a membership run starts with: mostly 3, sometimes 1 or 5."""
    return rng.choice((1, 3, 3, 3, 5))


def node_config(base: Config, node_id: int, join_peers: Sequence[int] | None) -> Config:
    """Node `node_id`'s config: `base` (a first voter's) with its id, or, for a node
    joining the running group, `join` with the voters it was told of."""
    if join_peers is None:
        return dataclasses.replace(base, id=node_id)
    peers = tuple(join_peers)
    pref = base.preferred_leader if base.preferred_leader in peers else None
    return dataclasses.replace(base, id=node_id, peers=peers, join=True, preferred_leader=pref)


def member(node_id: int) -> Member:
    return Member(node_id, f"10.0.0.{node_id}:7000", f"10.0.0.{node_id}:8000")


class MembershipEvents:
    """The seeded chooser of membership changes and what became of them."""

    def __init__(self, voters: Sequence[int], stats: Counter[str]) -> None:
        self.bootstrap = tuple(voters)
        top = max(voters)
        self._fresh = list(range(top + 1, top + 1 + SPARE_IDS))
        self.added: set[int] = set()  # ADD_LEARNER accepted by some leader
        self.removed: set[int] = set()  # REMOVE accepted by some leader: never re-added
        self.join_peers: dict[int, tuple[int, ...]] = {}  # started joining, told these voters
        self.stats = stats

    def choose(self, rng: random.Random, conf: Membership, leader: int) -> ConfChange | None:
        """A change to ask of leader `leader`, whose configuration is `conf`."""
        if rng.random() < BAD_CHANGE_RATE:
            return self._bad(rng, conf)
        voters, learners = conf.voters, conf.learners
        addable = [*sorted(self.added - self.removed - set(conf.ids)), *self._fresh[:1]]
        low, high = TARGET_VOTERS
        options: list[tuple[ConfChange, int]] = []
        if addable and len(conf.ids) < high + 1:
            i = addable[0]
            options.append((ConfChange(ChangeOp.ADD_LEARNER, i, member(i)), 3))
        for i in learners:
            options.append((ConfChange(ChangeOp.PROMOTE, i), 4 if len(voters) < high else 1))
            options.append((ConfChange(ChangeOp.REMOVE, i), 1))
        if len(voters) > 1:
            weight = 3 if len(voters) > low else 1
            for i in voters:
                options.append((ConfChange(ChangeOp.REMOVE, i), weight))
        if not options:
            return None
        return rng.choices([c for c, _ in options], [w for _, w in options])[0]

    def _bad(self, rng: random.Random, conf: Membership) -> ConfChange:
        self.stats["conf_bad_asked"] += 1
        unknown = max((*conf.ids, *self._fresh, *self.removed)) + 1
        match rng.randrange(3):
            case 0:  # an id that exists
                i = rng.choice(conf.ids)
                return ConfChange(ChangeOp.ADD_LEARNER, i, member(i))
            case 1:  # a voter to promote
                return ConfChange(ChangeOp.PROMOTE, rng.choice(conf.voters))
            case _:  # nobody
                return ConfChange(rng.choice((ChangeOp.PROMOTE, ChangeOp.REMOVE)), unknown)

    def ask(
        self, rng: random.Random, core: RaftCore, node_id: int
    ) -> tuple[ConfChange, int | None] | None:
        """Ask node `node_id` (whose core is `core`) for a change chosen here: None if
        none was appended (nothing to choose, not the leader, refused), else the change
        and the id of a node to start, as `accepted` says. Both simulators ask so."""
        change = self.choose(rng, core.membership, node_id)
        if change is None:
            return None
        self.stats["conf_asked"] += 1
        voters = core.membership.voters
        try:
            core.propose_conf_change(change)
        except NotLeader:
            self.stats["conf_not_leader"] += 1
            return None
        except MembershipError:
            self.stats["conf_refused"] += 1
            return None
        return change, self.accepted(change, node_id, voters)

    def accepted(self, change: ConfChange, leader: int, voters: Sequence[int]) -> int | None:
        """The leader appended `change`; the id of a node to start (joining, told of
        `voters`) if it adds one that does not run yet."""
        i = change.node_id
        self.stats["conf_accepted"] += 1
        match change.op:
            case ChangeOp.ADD_LEARNER:
                self.stats["conf_add_learner"] += 1
                self.added.add(i)
                if i in self._fresh:
                    self._fresh.remove(i)
                if i not in self.join_peers:
                    self.join_peers[i] = tuple(v for v in voters if v != i)
                    return i
            case ChangeOp.PROMOTE:
                self.stats["conf_promote"] += 1
            case ChangeOp.REMOVE:
                self.stats["conf_remove_self" if i == leader else "conf_remove"] += 1
                self.removed.add(i)
        return None


class _Node(Protocol):
    retired: bool


N = TypeVar("N", bound=_Node)


def final_members(nodes: Mapping[int, N], core: RaftCore | None, term: int) -> list[N] | None:
    """The members of the final configuration, as `core` (the marker's proposer, which
    proposed it in `term`) sees it while it leads them as a voter; None if it does not
    (deposed, or removed and handing over: the marker is proposed again)."""
    if core is None or core.role is not Role.LEADER or core.term != term:
        return None
    conf = core.membership
    me = core.leader_id
    if me not in conf.voters:
        return None
    out = [nodes[i] for i in conf.ids]
    if any(n.retired for n in out):
        raise AssertionError(f"a retired node is a member of the final configuration {conf}")
    return out
