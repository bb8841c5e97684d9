"""The faults the driver simulation (tests/sim/driver_sim.py) injects, and retention.

While a run has `faults`: power losses of a minority at any point (also while an
fsync is in flight), of every node at once (sync flush promises that no
acknowledged entry is lost even then), partitions, one-way blocks, broken streams,
leadership transfers; with membership changes, the leader (now and then a
follower) is asked for one every 30-200 ms, an added learner is a new node with an
empty directory, and a node whose removal committed is stopped now and then. Per
seed, retention drops an applied prefix (`compact`), so that lagging followers are
restored from snapshots.

The five EntryStore recovery bugs the simulation found are fixed and pinned in
tests/test_entry_store.py; the stats count how often it runs into their triggers:
the index below the tail not durable (a power loss with no entry checkpoint in the
retained log: `crashes_unanchored`), the filler after a restore's base
(`crashes_after_base_filler`), retention beyond the checkpoint
(`compactions_beyond_checkpoint`), retention on a log whose first segment holds only
that filler (`compactions_after_filler`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dledger_commitlog.log.entry_records import CHECKPOINT_FILE, read_record
from dledger_commitlog.log.entry_store import EntryStore
from raft import NotLeader, Role
from raft.membership import ChangeOp
from store.errors import CorruptEntry
from tests.sim.membership import ASK_FOLLOWER_RATE, RETIRE_RATE

if TYPE_CHECKING:
    from tests.sim.driver_node import Life, SimNode
    from tests.sim.driver_sim import DriverSim

# The fault `inject_fault` draws, by its number (the stats count each one).
_FAULTS = (
    "crash",
    "crash",
    "crash_in_fsync",
    "cluster_power_loss",
    "split",
    "isolate",
    "one_way",
    "stream_break",
    "transfer",
    "transfer",
    "none",
)


def read_checkpoint_index(log_dir: Path) -> int:
    """The index recorded in `entries.checkpoint` (0: none or invalid)."""
    try:
        record = read_record(log_dir / CHECKPOINT_FILE)
    except CorruptEntry:
        return 0
    return record[0] if record is not None else 0


def after_base_filler(store: EntryStore) -> bool:
    """The log restarts after a base that ends right before a filler (a restore)."""
    b = store.base
    return (
        b is not None
        and store.data_queue.min_offset <= b[2] < store.write_position
        and store.next_entry_pos(b[2]) != b[2]
    )


def _count_crash_situation(sim: DriverSim, life: Life) -> None:
    """Count the states a power loss now leaves recovery to cope with (beyond a torn
    tail): they once hid EntryStore bugs."""
    store = life.store
    if read_checkpoint_index(life.node.root / "log") < store.first_index():
        sim.stats["crashes_unanchored"] += 1  # the index below the tail is not durable
    if after_base_filler(store):
        sim.stats["crashes_after_base_filler"] += 1


def crash(sim: DriverSim, node: SimNode) -> None:
    """Power loss: the process dies, the disk keeps its durable images plus a random
    part of what the page cache held beyond them."""
    life = node.life
    assert life is not None
    sim.stats["crashes"] += 1
    _count_crash_situation(sim, life)
    life.dead = True
    life.driver.stopped = True
    life.task.cancel()
    sim.loop.run_until_complete(_reap(life.task))
    rng = sim.rng
    if life.restoring is not None and rng.random() < 0.5:
        life.finish_restore()  # it reached the disk; the driver never heard
    if life.hs_save is not None and rng.random() < 0.5:
        life.finish_hs_save()  # the rename reached the disk
    durable = life.durable_last()
    node.durable_at_crash = (durable, life.store.term(durable))
    plan = node.disk.plan_power_loss(rng, sim.stats, sim.tear_modes)
    life.store.close()  # commits buffered bytes to the files: undone below
    node.disk.apply_power_loss(plan)
    node.life = None
    node.crash_in_fsync = False
    sim.schedule(rng.randrange(10, 500), "restart", node)


def compact(sim: DriverSim) -> None:
    """Retention on one node: drop whole segments of its applied prefix."""
    up = [n.life for n in sim.nodes.values() if n.life is not None]
    if not up:
        return
    life = sim.rng.choice(up)
    if sim.rng.random() < 0.5:
        life = next((x for x in up if x.core.role is Role.LEADER), life)
    if life.restoring is not None:
        return  # the driver is between settle and restore
    store = life.store
    before = store.first_index()
    upto = life.applied
    last = min(upto, store.last_index())
    if after_base_filler(store) and last > before:
        data = store.data_queue
        if store.locate(last)[0] >= data.min_offset + data.segment_size:
            sim.stats["compactions_after_filler"] += 1  # the first segment: a filler
    after = store.delete_prefix(upto)
    if after > before:
        sim.stats["compactions"] += 1
        if after - 1 > read_checkpoint_index(life.node.root / "log"):
            sim.stats["compactions_beyond_checkpoint"] += 1


def inject_fault(sim: DriverSim) -> None:
    """One random fault, half the time on the leader; a node crashes alone only if a
    majority of the nodes not retired stays up."""
    rng = sim.rng
    ids = [i for i, n in sim.nodes.items() if not n.retired]  # (retired: gone for good)
    victim = sim.nodes[rng.choice(ids)]
    leader = sim.leader()
    if leader is not None and rng.random() < 0.5:
        victim = leader.node
    down = sum(1 for n in sim.nodes.values() if n.life is None and not n.retired)
    may_crash = victim.life is not None and down < (len(ids) - 1) // 2
    fault = rng.randrange(11)
    match fault:
        case 0 | 1:
            if may_crash:
                crash(sim, victim)
        case 2:
            if may_crash:
                victim.crash_in_fsync = True
        case 3:
            if sim.cluster_power_loss and rng.random() < 0.5:
                sim.stats["cluster_power_losses"] += 1
                for node in sim.nodes.values():
                    if node.life is not None:
                        crash(sim, node)
        case 4 if len(ids) > 1:  # (a lone first voter has nobody to be cut from)
            rng.shuffle(ids)
            cut = rng.randrange(1, len(ids))
            cut_links(sim, ids[:cut], ids[cut:], both=True)
        case 5:
            cut_links(sim, [victim.id], [i for i in ids if i != victim.id], both=True)
        case 6:
            others = [i for i in ids if i != victim.id]
            if rng.random() < 0.5:
                cut_links(sim, [victim.id], others, both=False)
            else:
                cut_links(sim, others, [victim.id], both=False)
        case 7:
            sim.stats["stream_breaks"] += 1
            sim.net.break_streams(
                [(a, b) for a in ids for b in ids if a != b and victim.id in (a, b)]
            )
        case 8 | 9:
            if leader is not None:
                with contextlib.suppress(NotLeader):
                    leader.core.transfer_leadership(rng.choice(leader.core.membership.voters))
                leader.kick()
        case _:
            pass  # a quiet spell
    sim.stats[f"fault_{_FAULTS[fault]}"] += 1


def change_membership(sim: DriverSim) -> None:
    """Ask the leader (now and then a follower) for a membership change; start the
    node it adds; retire, now and then, a node whose removal it accepted."""
    assert sim.members is not None
    rng = sim.rng
    life = sim.leader()
    if life is None or rng.random() < ASK_FOLLOWER_RATE:
        up = [n.life for n in sim.nodes.values() if n.life is not None]
        if not up:
            return
        life = rng.choice(up)
    core = life.core
    asked = sim.members.ask(rng, core, life.node.id)
    if asked is None:
        return
    change, new = asked
    if new is not None:
        sim.start_node(sim.new_node(new))
    elif change.op is ChangeOp.REMOVE and rng.random() < RETIRE_RATE:
        sim.schedule(rng.randrange(50, 500), "retire", sim.nodes[change.node_id])
    life.kick()


def retire(sim: DriverSim, node: SimNode) -> None:
    """Stop a removed node for good once its removal is committed (else later)."""
    if node.retired or not sim.faults:
        return
    if node.id not in sim.checker.removed_at:
        sim.schedule(sim.rng.randrange(50, 500), "retire", node)
        return
    sim.stats["retired"] += 1
    node.retired = True
    life = node.life
    if life is None:
        return
    life.dead = True
    life.driver.stopped = True
    life.task.cancel()
    sim.loop.run_until_complete(_reap(life.task))
    life.store.close()
    node.life = None


def cut_links(sim: DriverSim, a: Sequence[int], b: Sequence[int], *, both: bool) -> None:
    links = [(x, y) for x in a for y in b]
    if both:
        links += [(y, x) for x in a for y in b]
    sim.net.block(links)
    sim.stats["partitions"] += 1
    sim.schedule(sim.rng.randrange(50, 800), "heal", None)


async def _reap(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task
