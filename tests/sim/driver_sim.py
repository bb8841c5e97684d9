"""Deterministic simulation of real Ready drivers over real entry stores (sync flush).

`DriverSim(seed).run(steps)` runs a cluster of 3 or 5 nodes, each the production
path of a sync-flush node (tests/sim/driver_node.py): a `ReadyDriver`
(raft/driver.py) around a `RaftCore` with `async_storage_writes`, a real
`EntryStore` and a real `RaftStateFile` in a per-node directory, opened and
recovered the way `RaftNode._open` does. Only the edges are simulated, each one
injected:

- the flusher (tests/sim/driver_io.py): pipelined fsyncs, one at a time per node,
  that complete as later events, so several Readies are in flight;
- the transport (tests/sim/streams.py): one FIFO stream per ordered pair of
  nodes, with lost batches, broken streams and partitions;
- the clock: ticks are events, 10 ms of simulated time apart;
- the worker thread: raft.state saves and snapshot restores complete as later
  events; a periodic checkpointer writes the entry checkpoint and raft.state's
  commit (loops.NodeLoops.checkpoint_now), now and then right between the
  driver's append and its flush request (it runs on its own thread in a node);
- the disk's durability (tests/sim/power_loss.py): a crash is a power loss that
  keeps what was fsynced plus a torn part of what the page cache held; raft.state
  keeps its last completed save (a save in flight lands or not).

All drivers run as tasks on one asyncio event loop that nobody else uses. After
each event the loop runs until every driver is parked: on its wakeup event with
nothing to do, or on a future the simulation completes later. No wall clock,
no threads, no real sleeps: every choice comes from `random.Random(seed)`, so a
seed replays exactly (`python -m tests.sim.driver_sim --seed N`).

Membership (`membership=True`, tests/sim/membership.py, as in tests/sim/simulation.py):
the run starts with 1, 3 or 5 voters and the leader is asked for membership changes
(tests/sim/driver_faults.py). A node restarts with the membership raft.state
recorded. At the end, the final configuration must have a leader and every member
(not a removed node) must hold every committed entry.

Faults (while `faults`, tests/sim/driver_faults.py): power losses of a minority or
of every node at once, partitions, one-way blocks, broken streams, message loss,
leadership transfers; per seed, retention of an applied prefix.

Checks: election safety, leader completeness, log matching and state-machine
safety (tests/sim/checkers.py); the Ready contract against what is durable, the
durability of raft.state's commit and of recovery, and liveness and durability
at the end (tests/sim/driver_checks.py).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import logging
import os
import random
import shutil
import sys
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from raft import AppendEntries, AppendResponse, Message, NotLeader, Role, Snapshot
from store.entry_format import INDEX_UNIT_SIZE
from tests.sim import driver_checks, driver_faults
from tests.sim.checkers import Checker
from tests.sim.config import random_config
from tests.sim.driver_node import Life, SimNode
from tests.sim.membership import MembershipEvents, initial_voters
from tests.sim.power_loss import TEAR_MODES, PowerLossDisk
from tests.sim.simulation import SimFailure, run_seeds
from tests.sim.streams import NetProfile, StreamNetwork

TICK_MS = 10
SETTLE_ROUNDS = 10_000  # loop iterations after one event before the drivers must be parked
CHECK_LOGS_EVERY = 500


class DriverSim:
    """One seed's cluster of simulated nodes and the events that drive it."""

    def __init__(
        self,
        seed: int,
        nodes: int | None = None,
        *,
        write_buffer: bool | None = None,
        faults: bool = True,
        clients: bool = True,
        checkpoints: bool = True,
        fsync_ms: tuple[int, int] | None = None,
        net: NetProfile | None = None,
        compaction: bool | None = None,
        cluster_power_loss: bool | None = None,
        checkpoint_race: float | None = None,
        tear_modes: Sequence[str] | None = None,
        record: bool = False,
        root: Path | None = None,
        membership: bool = False,
    ) -> None:
        self.seed = seed
        self.args = (nodes, write_buffer, membership)
        rng = self.rng = random.Random(seed)
        if membership and nodes is None:
            nodes = initial_voters(rng)
        self.config = random_config(rng, nodes, async_storage_writes=True, membership=membership)
        wb = rng.random() < 0.5 if write_buffer is None else write_buffer
        self.write_buffer_bytes = rng.choice((200, 1 << 16)) if wb else 0
        self.data_segment_bytes = rng.choice((1024, 4096))
        self.index_segment_bytes = INDEX_UNIT_SIZE * rng.choice((16, 128))
        self.fsync_ms = fsync_ms or rng.choice(((0, 2), (1, 8), (2, 20), (5, 40)))
        self.compaction = rng.random() < 0.4 if compaction is None else compaction
        self.cluster_power_loss = (
            rng.random() < 0.5 if cluster_power_loss is None else cluster_power_loss
        )
        race = rng.choice((0.0, 0.0, 0.02))
        self.checkpoint_race = race if checkpoint_race is None else checkpoint_race
        self.tear_modes = tuple(tear_modes) if tear_modes is not None else TEAR_MODES
        self.net = StreamNetwork(rng, net or NetProfile.random(rng))
        self.faults = faults
        self.clients = clients  # random proposals and reads
        self.checkpoints = checkpoints  # the periodic entry checkpoints
        self.record = record
        self.events: list[tuple[int, int, str, int]] = []  # (time, node, what, index) if record
        self.checker = Checker(self.config.peers)
        self.stats: Counter[str] = Counter()
        self.members = MembershipEvents(self.config.peers, self.stats) if membership else None
        self.now = 0
        self.steps = 0
        self.trace: deque[tuple[int, str, str]] = deque(maxlen=40)
        self._heap: list[tuple[int, int, str, Any]] = []
        self._seq = 0
        self._counter = 0
        self._own_root = root is None
        base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
        self.root = (
            Path(tempfile.mkdtemp(prefix=f"driver-sim-{seed}-", dir=base)) if root is None else root
        )
        self.loop = asyncio.new_event_loop()
        self.nodes: dict[int, SimNode] = {}
        for i in self.config.peers:
            self.new_node(i)
        for node in self.nodes.values():
            self.start_node(node)
        if self.members is not None:
            self.schedule(rng.randrange(30, 200), "member", None)
        self.schedule(rng.randrange(20), "client", None)
        self.schedule(rng.randrange(50), "read", None)
        self.schedule(rng.randrange(100, 400), "fault", None)
        if self.compaction:
            self.schedule(rng.randrange(100, 400), "compact", None)
        self.settle()

    # --- running ---

    def run(self, steps: int) -> None:
        """`steps` events (with faults unless disabled), then heal and demand progress."""
        try:
            for _ in range(steps):
                self.step()
            self.check_logs()
            members = self.converge()
            self.check_logs()
            self.check_durability(members)
            self.stats["conf_committed"] += self.checker.confs_committed
            self.stats["learnt_removal"] += len(self.checker.learnt_removal)
        except Exception as err:  # anything the code under test raises is a failure
            raise SimFailure(self.report(err, steps)) from err
        finally:
            self.close()

    def replay_command(self, steps: int) -> str:
        cmd = f".venv/bin/python -m tests.sim.driver_sim --seed {self.seed} --steps {steps}"
        nodes, wb, membership = self.args
        if nodes is not None:
            cmd += f" --nodes {nodes}"
        if wb is not None:
            cmd += f" --write-buffer {int(wb)}"
        if membership:
            cmd += " --membership"
        return cmd

    def report(self, err: BaseException, steps: int) -> str:
        tail = "\n".join(f"  t={t} {kind} {arg}" for t, kind, arg in self.trace)
        nodes = "\n".join(f"  {self._describe(n)}" for n in self.nodes.values())
        return (
            f"driver simulation seed {self.seed} failed at step {self.steps} "
            f"(t={self.now} ms): {type(err).__name__}: {err}\n"
            f"replay: {self.replay_command(steps)}\n"
            f"config: {self.config}\nwrite buffer {self.write_buffer_bytes}, segments "
            f"{self.data_segment_bytes}/{self.index_segment_bytes}, fsync {self.fsync_ms} ms, "
            f"compaction {self.compaction}, cluster power loss {self.cluster_power_loss}\n"
            f"network: {self.net.profile}\nnodes:\n{nodes}\nlast events:\n{tail}"
        )

    def _describe(self, node: SimNode) -> str:
        life = node.life
        if life is None:
            return f"node {node.id}: {'retired' if node.retired else 'down'}"
        c = life.core
        m = c.membership
        try:
            durable: object = life.durable_last()
        except Exception as exc:  # a broken store must not hide the failure being reported
            durable = repr(exc)
        return (
            f"node {node.id}: {c.role.value} term {c.term} leader {c.leader_id} log "
            f"[{c.first_index}, {c.last_index}] commit {c.commit_index} applied {c.applied} "
            f"durable {durable} catch_up_to {c.catch_up_to} voters {m.voters} learners "
            f"{m.learners} (entry {c.conf_index}) "
            f"raft.state {life.state_file.saved}; driver {life.waiting_on()}"
        )

    def close(self) -> None:
        """Stop every driver, close the files, remove the directories we created."""
        for node in self.nodes.values():
            life = node.life
            if life is not None:
                life.dead = True
                life.driver.stopped = True
                life.task.cancel()
        if not self.loop.is_closed():
            tasks = [n.life.task for n in self.nodes.values() if n.life is not None]
            if tasks:
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.close()
        for node in self.nodes.values():
            if node.life is not None:
                node.life.store.close()
                node.life = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def schedule(self, delay: int, kind: str, arg: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (self.now + delay, self._seq, kind, arg))

    def step(self) -> None:
        t, _, kind, arg = heapq.heappop(self._heap)
        self.now = t
        self.steps += 1
        self.trace.append((t, kind, _short(arg)))
        match kind:
            case "tick":
                self.schedule(TICK_MS, "tick", arg)
                life = arg.life
                if life is not None:
                    life.core.tick()
                    life.kick()
            case "deliver":
                self._deliver(*arg)
            case "fsync_start" | "fsync_done" | "hs_saved" | "restored":
                life = arg
                if life is arg.node.life:  # else it died meanwhile
                    match kind:
                        case "fsync_start":
                            life.flusher.start()
                        case "fsync_done":
                            life.flusher.done()
                        case "hs_saved":
                            life.finish_hs_save()
                        case _:
                            life.finish_restore()
            case "later":
                life, later = arg
                if life is life.node.life:  # else it died meanwhile
                    later()
            case "client":
                self.schedule(self.rng.randrange(1, 15), "client", None)
                if self.clients:
                    self._propose()
            case "read":
                self.schedule(self.rng.randrange(5, 60), "read", None)
                if self.clients:
                    self._read()
            case "checkpoint":
                self.schedule(self.rng.randrange(50, 500), "checkpoint", arg)
                if arg.life is not None and self.checkpoints:
                    self.checkpoint(arg.life)
            case "compact":
                self.schedule(self.rng.randrange(30, 300), "compact", None)
                driver_faults.compact(self)
            case "fault":
                self.schedule(self.rng.randrange(30, 400), "fault", None)
                if self.faults:
                    driver_faults.inject_fault(self)
            case "crash":
                if arg.life is not None and self.faults:
                    self.crash(arg)
            case "restart":
                if arg.life is None and not arg.retired:
                    self.open_node(arg)
            case "heal":
                self.net.heal()
            case "member":
                self.schedule(self.rng.randrange(30, 200), "member", None)
                if self.faults:
                    driver_faults.change_membership(self)
            case "retire":
                driver_faults.retire(self, arg)
            case _:
                raise AssertionError(kind)
        self.settle()
        for node in self.nodes.values():
            if node.life is not None:
                driver_checks.check_node(self, node, node.life)
        if self.steps % CHECK_LOGS_EVERY == 0:
            self.check_logs()

    def settle(self) -> None:
        """Run the event loop until every live driver is parked."""
        lives = [n.life for n in self.nodes.values() if n.life is not None]
        if all(life.idle() for life in lives):
            return

        async def settle() -> None:
            for _ in range(SETTLE_ROUNDS):
                if all(life.idle() for life in lives):
                    return
                await asyncio.sleep(0)
            raise AssertionError("the drivers never settle (a busy Ready loop)")

        self.loop.run_until_complete(settle())

    # --- nodes ---

    def new_node(self, i: int) -> SimNode:
        root_i = self.root / f"n{i}"
        root_i.mkdir(parents=True, exist_ok=True)
        log_dir = root_i / "log"
        dirs = {
            log_dir / "data": self.data_segment_bytes,
            log_dir / "index": self.index_segment_bytes,
        }
        node = self.nodes[i] = SimNode(i, root_i, PowerLossDisk(dirs))
        return node

    def open_node(self, node: SimNode) -> None:
        """Start a node from its directory, as RaftNode._open does (sync flush)."""
        node.incarnations += 1
        life = Life(self, node)
        node.life = life
        self.stats["starts"] += 1
        if life.store.tail_cut is not None:
            self.stats["tail_cuts"] += 1
        if life.missing_through:
            self.stats["gated_starts"] += 1
        driver_checks.check_restart(self, node, life)

    def start_node(self, node: SimNode) -> None:
        """Open `node` and start its clock and its periodic checkpointer."""
        self.open_node(node)
        self.schedule(self.rng.randrange(TICK_MS), "tick", node)
        self.schedule(self.rng.randrange(50, 500), "checkpoint", node)

    def crash(self, node: SimNode) -> None:
        """Power loss on `node` (tests/sim/driver_faults.py)."""
        driver_faults.crash(self, node)

    def checkpoint(self, life: Life) -> None:
        """loops.NodeLoops.checkpoint_now: the applied index as entry checkpoint and
        as raft.state's commit (the checkpoint flushes data and index first)."""
        applied, store = life.applied, life.store
        if applied >= store.first_index():
            store.write_checkpoint(applied)
            life.node.disk.sync_all()
            life.durable_pos = max(life.durable_pos, store.flushed_position)
            life.low_water = store.write_position
            self.stats["checkpoints"] += 1
        life.state_file.save_commit(applied)

    # --- the transport ---

    def on_send(self, life: Life, m: Message) -> None:
        driver_checks.check_send(self, life, m)
        if self.record and isinstance(m, AppendResponse) and not m.reject:
            self.log(life, "ack", m.index)
        elif self.record and isinstance(m, AppendEntries) and m.entries:
            self.log(life, "send_entries", m.entries[-1].index)
        if isinstance(m, Snapshot):
            self.stats["snapshots_sent"] += 1
        arrival = self.net.send(m, self.now)
        if arrival is not None:
            at, epoch = arrival
            self.schedule(at - self.now, "deliver", (m, epoch))

    def _deliver(self, m: Message, epoch: int) -> None:
        node = self.nodes[m.dst]
        life = node.life
        if life is None or not self.net.deliverable(m, epoch):
            return
        life.core.step(m)  # LogDiverged: an invariant violation in sync flush mode
        life.kick()

    # --- clients ---

    def leader(self) -> Life | None:
        for node in self.nodes.values():
            if node.life is not None and node.life.core.role is Role.LEADER:
                return node.life
        return None

    def run_until(self, done: Callable[[], bool], within_ms: int, what: str) -> None:
        """Step until `done()`; AssertionError naming `what` after `within_ms`."""
        deadline = self.now + within_ms
        while not done():
            if self.now > deadline:
                raise AssertionError(f"seed {self.seed}: no {what} within {within_ms} ms")
            self.step()

    def propose(self, data: bytes) -> int:
        """Propose `data` on the leader; its index (AssertionError without a leader)."""
        life = self.leader()
        assert life is not None, "no leader"
        index, _ = life.core.propose(data)
        life.kick()
        self.settle()
        return index

    def _propose(self) -> None:
        life = self.leader()
        if life is None:
            return
        self._counter += 1
        batch = [b"put-%d.%d" % (self._counter, k) for k in range(self.rng.randint(1, 3))]
        try:
            life.core.propose(batch)
        except NotLeader:
            self.stats["proposals_refused"] += 1
            return
        self.stats["proposals"] += 1
        life.kick()

    def _read(self) -> None:
        up = [n.life for n in self.nodes.values() if n.life is not None]
        if not up:
            return
        life = self.rng.choice(up)
        self._counter += 1
        ctx = b"read-%d" % self._counter
        self.checker.on_read_issued(ctx)
        try:
            life.core.read_index(ctx)
        except NotLeader:
            return
        life.kick()

    # --- checks ---

    def log(self, life: Life, what: str, index: int) -> None:
        self.events.append((self.now, life.node.id, what, index))

    def check_logs(self) -> None:
        """Log matching over the live nodes' logs."""
        driver_checks.check_logs(self)

    def check_durability(self, members: Sequence[SimNode] | None = None) -> None:
        """Every entry applied anywhere is in every member's log."""
        driver_checks.check_durability(self, members)

    def converge(self) -> list[SimNode]:
        """Heal everything and demand progress (tests/sim/driver_checks.py)."""
        return driver_checks.converge(self)


def _short(arg: object) -> str:
    if isinstance(arg, SimNode):
        return f"node {arg.id}"
    if isinstance(arg, Life):
        return f"node {arg.node.id}#{arg.incarnation}"
    if isinstance(arg, tuple) and arg:
        return str(arg[0])
    return "" if arg is None else str(arg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.sim.driver_sim", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--seed", type=int, default=None, help="run only this seed")
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds to run")
    ap.add_argument("--first", type=int, default=0, help="first seed of the range")
    ap.add_argument("--steps", type=int, default=3000, help="events per seed before healing")
    ap.add_argument("--nodes", type=int, default=None, help="cluster size (3 or 5)")
    ap.add_argument("--write-buffer", type=int, choices=(0, 1), default=None)
    ap.add_argument("--membership", action="store_true", help="with membership changes")
    ap.add_argument("--stats", action="store_true", help="print fault and event counts")
    ap.add_argument("-v", "--verbose", action="store_true", help="log the stores' warnings")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    wb = None if args.write_buffer is None else bool(args.write_buffer)
    return run_seeds(
        seeds,
        args.steps,
        lambda seed: DriverSim(seed, args.nodes, write_buffer=wb, membership=args.membership),
        stats=args.stats,
    )


if __name__ == "__main__":
    sys.exit(main())
