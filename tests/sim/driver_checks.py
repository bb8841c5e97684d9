"""What the driver simulation (tests/sim/driver_sim.py) checks, besides tests/sim/checkers.py.

The Ready contract against what is durable: a message leaves only once the term
and vote it promises are in raft.state, an acknowledgement only once the entries it
covers are fsynced, an entry is applied only once it is fsynced on that node.
After every step: raft.state's commit never goes back and never covers an entry
not yet durable. At a restart: recovery keeps every entry fsynced before the power
loss, and the node's committed prefix (raft.state's commit over its recovered log)
is the committed log. At the end (`converge`), after healing everything and
restarting every node: a leader commits a new entry that every node applies within
`CONVERGE_MS` of simulated time, and every node's log holds every entry ever
applied anywhere (`check_durability`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from raft import (
    AppendEntries,
    AppendResponse,
    Entry,
    Message,
    NotLeader,
    RequestVote,
    Role,
    SnapshotMeta,
    VoteResponse,
)
from tests.sim.checkers import InvariantViolation, LogView
from tests.sim.membership import final_members
from tests.sim.streams import NetProfile

if TYPE_CHECKING:
    from tests.sim.driver_node import Life, SimNode
    from tests.sim.driver_sim import DriverSim

CONVERGE_MS = 30_000  # after healing, a new entry is applied everywhere within this


def check_send(sim: DriverSim, life: Life, m: Message) -> None:
    """The Ready contract against what is durable on the sender."""
    hs = life.state_file.saved
    node_id = life.node.id
    match m:
        case RequestVote(pre_vote=True):
            ok = hs.term >= m.term - 1
        case RequestVote():
            ok = hs.term > m.term or (hs.term == m.term and hs.vote == node_id)
        case VoteResponse(granted=True, pre_vote=False):
            ok = hs.term > m.term or (hs.term == m.term and hs.vote == m.dst)
        case VoteResponse(granted=True, pre_vote=True):
            ok = True
        case AppendResponse(reject=False):
            durable = life.durable_last()
            if hs.term < m.term or durable < m.index:
                raise InvariantViolation(
                    f"node {node_id} acknowledged entries up to {m.index} ({m}) with only "
                    f"{durable} on disk (raft.state {hs})"
                )
            ok = True
        case _:
            ok = hs.term >= m.term
    if not ok:
        raise InvariantViolation(f"node {node_id} sent {m} before persisting (raft.state {hs})")
    if isinstance(m, AppendEntries) and m.entries:
        assert m.entries[0].index == m.prev_index + 1
    sim.checker.on_ack(m)


def check_apply(sim: DriverSim, life: Life, entries: Sequence[Entry]) -> None:
    """An entry is applied only once it is fsynced on that node."""
    durable = life.durable_last()
    if entries[-1].index > durable:
        raise InvariantViolation(
            f"node {life.node.id} applied up to {entries[-1].index} with only {durable} on disk"
        )
    sim.checker.on_apply(life.node.id, life.core.term, tuple(entries))
    if sim.record:
        sim.log(life, "apply", entries[-1].index)


def check_node(sim: DriverSim, node: SimNode, life: Life) -> None:
    """After every step: raft.state's commit never goes back and never covers an entry
    not yet durable; the node's state passes the checker's checks."""
    saved = life.state_file.saved
    if saved.commit < node.saved_commit:
        raise InvariantViolation(
            f"node {node.id}: raft.state's commit went back {node.saved_commit} -> {saved.commit}"
        )
    node.saved_commit = saved.commit
    if saved.commit > life.last_index_checked and saved.commit > life.durable_last():
        raise InvariantViolation(
            f"node {node.id}: raft.state's commit {saved.commit} covers entries not yet on "
            f"disk (durable up to {life.durable_last()}): a power loss now makes a restart "
            "apply whatever the log holds there"
        )
    life.last_index_checked = saved.commit
    # The core's commit may sit below raft.state's after a cut tail (it catches up):
    # the durable commit is checked at restart (check_restart) instead.
    node.view.hard_state = dataclasses.replace(saved, commit=0)
    sim.checker.check_node(node.id, life.core, node.view)


def check_restart(sim: DriverSim, node: SimNode, life: Life) -> None:
    """A restarted node takes its log up to raft.state's commit as applied: that
    prefix must be the committed log (what other nodes applied), or become it."""
    checker, core, store = sim.checker, life.core, life.store
    index, term = node.durable_at_crash
    if index > store.last_index() or (
        index >= store.first_index() - 1 and store.term(index) != term
    ):
        raise InvariantViolation(
            f"node {node.id} recovered its log up to {store.last_index()} but entry {index} "
            f"(term {term}) was fsynced before the crash (tail cut: {store.tail_cut})"
        )
    upto = checker.applied_upto.get(node.id, 0)
    applied = core.applied
    first = store.first_index()
    if applied > upto:
        if first - 1 > upto:  # the log restarts after a base beyond what it applied
            checker.on_snapshot(node.id, SnapshotMeta(first - 1, store.term(first - 1)))
            upto = first - 1
        if applied > upto:
            checker.on_apply(node.id, core.term, tuple(core.log_slice(upto + 1, applied + 1)))
    canon = checker.canon
    lo, hi = max(first, 1), min(applied, len(canon))
    if lo <= hi and core.log_slice(lo, hi + 1) != canon[lo - 1 : hi]:
        raise InvariantViolation(
            f"node {node.id} restarted with a committed prefix (up to {applied}) that "
            "differs from the committed log"
        )
    checker.on_restart(node.id, core)


def check_logs(sim: DriverSim) -> None:
    """Log matching over the logs of the nodes that are up."""
    logs: dict[int, LogView] = {}
    for node in sim.nodes.values():
        if node.life is not None:
            core = node.life.core
            base = core.first_index - 1
            entries = core.log_slice(base + 1, core.last_index + 1)
            logs[node.id] = LogView(
                base, core.log_term(base), entries, core.membership, core.conf_index
            )
    sim.checker.check_log_matching(logs)


def check_durability(sim: DriverSim, members: Sequence[SimNode] | None = None) -> None:
    """Every entry applied anywhere is in every member's log (all are up now; without
    `members`, every node is one)."""
    canon = sim.checker.canon
    for node in sim.nodes.values() if members is None else members:
        assert node.life is not None
        core = node.life.core
        if core.last_index < len(canon):
            raise InvariantViolation(
                f"node {node.id} ends at {core.last_index}: committed entries up to "
                f"{len(canon)} are missing"
            )
        lo = max(core.first_index, 1)
        if core.log_slice(lo, len(canon) + 1) != canon[lo - 1 :]:
            raise InvariantViolation(f"node {node.id} lost or changed committed entries")


def converge(sim: DriverSim) -> list[SimNode]:
    """Stop the faults, heal everything, restart every node (but the retired): a
    leader must then commit a new entry that every node (with membership changes:
    every member of the final configuration) applies within CONVERGE_MS; those
    nodes."""
    sim.faults = sim.clients = False  # only the marker is proposed
    sim.net.heal()
    sim.net.profile = NetProfile(0.0, 1, 5)
    for node in sim.nodes.values():
        node.crash_in_fsync = False
        if node.life is None and not node.retired:
            sim.open_node(node)
    sim.settle()
    marker = b"converge-%d" % sim.seed
    deadline = sim.now + CONVERGE_MS
    pending: tuple[int, Life, int] | None = None  # (index, proposer, its term)
    while sim.now < deadline:
        sim.step()
        if pending is None:
            pending = _propose_marker(sim, marker)
            continue
        index, proposer, term = pending
        members = (
            list(sim.nodes.values())
            if sim.members is None
            else final_members(sim.nodes, None if proposer.dead else proposer.core, term)
        )
        if members is not None and all(
            n.life is not None and n.life.core.applied >= index for n in members
        ):
            if sim.checker.canon[index - 1].data == marker:
                sim.stats["converged_ms"] = sim.now - (deadline - CONVERGE_MS)
                return members
            pending = None  # lost to a leader change: propose again
        elif proposer.dead or proposer.core.term != term or proposer.core.role is not Role.LEADER:
            pending = None
    raise AssertionError(
        f"liveness: no new entry applied everywhere {CONVERGE_MS} ms after healing"
    )


def _propose_marker(sim: DriverSim, marker: bytes) -> tuple[int, Life, int] | None:
    life = sim.leader()
    if life is None:
        return None
    try:
        first, _ = life.core.propose(marker)
    except NotLeader:
        return None
    life.kick()
    return first, life, life.core.term
