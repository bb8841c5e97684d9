"""One node of the driver simulation (tests/sim/driver_sim.py): its incarnations.

A `SimNode` is a node's directory, its disk (`PowerLossDisk`) and what the checks
remember across its crashes; a `Life` is one incarnation: the production path of
a sync-flush node, a `ReadyDriver` around a `RaftCore` with
`async_storage_writes`, a real `EntryStore` and a real `RaftStateFile`, opened and
recovered the way `RaftNode._open` does. The worker thread is simulated: raft.state
saves and snapshot restores complete as later events of the simulation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from dledger_commitlog.log.entry_store import EntryStore
from raft import Entry, HardState, Message, RaftCore, ReadState, SnapshotMeta
from raft.driver import ReadyDriver
from raftio.hard_state import RaftStateFile
from tests.sim.checkers import InvariantViolation
from tests.sim.disk import FakeDisk
from tests.sim.driver_checks import check_apply
from tests.sim.driver_io import SimFlusher, SimStorage
from tests.sim.membership import node_config
from tests.sim.power_loss import PowerLossDisk

if TYPE_CHECKING:
    from tests.sim.driver_sim import DriverSim

T = TypeVar("T")

LINGER_MS = 2  # how long a leader's driver holds a commit notice (the node: 2 ms)


class Wakeup(asyncio.Event):
    """The driver's wakeup event, telling the simulation when the driver waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = False

    async def wait(self) -> Literal[True]:
        self.waiting = True
        try:
            return await super().wait()
        finally:
            self.waiting = False


class Life:
    """One incarnation of a node: its open files, core, driver and flusher (a
    crash ends it; a restart opens a new one from the node's directory)."""

    def __init__(self, sim: DriverSim, node: SimNode) -> None:
        self.sim = sim
        self.node = node
        self.incarnation = node.incarnations
        self.dead = False
        root = node.root
        self.state_file = RaftStateFile(root / "raft.state")
        saved = self.state_file.saved
        self.store = EntryStore(
            root / "log",
            data_segment_bytes=sim.data_segment_bytes,
            index_segment_bytes=sim.index_segment_bytes,
            committed_index=saved.commit,
            preallocate=False,  # no background thread: the run must replay exactly
            write_buffer_bytes=sim.write_buffer_bytes,
        )
        store = self.store
        # Recovered from disk: all of it is durable.
        self.durable_pos = store.write_position
        self.low_water = store.write_position  # lowest data position written since a capture
        self.truncations = 0
        commit = min(saved.commit, store.last_index())
        self.missing_through = store.missing_through
        joining = sim.members.join_peers.get(node.id) if sim.members is not None else None
        self.core = RaftCore(
            node_config(sim.config, node.id, joining),
            store,
            # The membership raft.state recorded (the last committed configuration).
            dataclasses.replace(saved, commit=commit),
            rng=random.Random(sim.rng.randrange(1 << 32)),
            applied=commit,
            catch_up_to=self.missing_through,
        )
        self.applied = self.core.applied
        self.last_index_checked = 0  # raft.state's commit last found durable
        self.parked: asyncio.Future[Any] | None = None
        self.hs_save: tuple[HardState, asyncio.Future[None]] | None = None
        self.restoring: tuple[SnapshotMeta, asyncio.Future[None]] | None = None
        self.flusher = SimFlusher(self)
        self.wakeup = Wakeup()
        self.driver = ReadyDriver(
            self.core,
            SimStorage(self),
            self.state_file,
            send=self._send,
            apply=self._apply,
            save_hard_state=self._save_hard_state,
            restore=self._restore,
            read_states=self._read_states,
            flusher=self.flusher,
            defer=lambda later: sim.schedule(LINGER_MS, "later", (self, later)),
        )
        self.driver.wakeup = self.wakeup  # before run() reads it
        self.task = sim.loop.create_task(self.driver.run(), name=f"ready-loop-{node.id}")

    # -- what the simulation asks --

    def idle(self) -> bool:
        """Parked: on the wakeup with nothing to do, or on a future not yet completed;
        and no answer of the flusher due on the loop."""
        if self.task.done():
            exc = None if self.task.cancelled() else self.task.exception()
            raise AssertionError(f"node {self.node.id}: the ready loop ended: {exc!r}") from exc
        if self.flusher.answer_pending:
            return False
        parked = self.parked
        if parked is not None:
            return not parked.done()
        return self.wakeup.waiting and not self.wakeup.is_set()

    def waiting_on(self) -> str:
        fl = self.flusher
        what = "busy"
        if self.hs_save is not None:
            what = "raft.state save"
        elif self.restoring is not None:
            what = "restore"
        elif self.parked is not None:
            what = "fsync"
        elif self.wakeup.waiting:
            what = "wakeup"
        return (
            f"waits on {what}, fsync {'in flight' if fl.in_flight else 'idle'}, requested "
            f"{fl.requested}, written {self.store.write_position}, durable {self.durable_pos}"
        )

    def kick(self) -> None:
        self.wakeup.set()

    def durable_last(self) -> int:
        """The last index whose entry (and every one before it) is on disk."""
        store, pos = self.store, self.durable_pos
        lo, hi = store.first_index(), store.last_index()
        best = lo - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            start, size = store.locate(mid)
            if start + size <= pos:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    async def park(self, fut: asyncio.Future[T]) -> T:
        self.parked = fut
        try:
            return await fut
        finally:
            self.parked = None

    # -- the driver's injected callbacks --

    def _send(self, messages: Sequence[Message]) -> None:
        if self.dead:
            return
        for m in messages:
            self.sim.on_send(self, m)

    def _apply(self, entries: Sequence[Entry]) -> None:
        if self.dead or not entries:
            return
        check_apply(self.sim, self, entries)
        self.applied = entries[-1].index

    def _read_states(self, states: Sequence[ReadState]) -> None:
        for rs in states:
            self.sim.stats["reads_answered"] += 1
            self.sim.checker.on_read_state(self.node.id, rs)

    async def _save_hard_state(self, hs: HardState) -> None:
        fut: asyncio.Future[None] = self.sim.loop.create_future()
        self.hs_save = (hs, fut)
        self.sim.schedule(self.sim.rng.randrange(0, 4), "hs_saved", self)
        await self.park(fut)

    async def _restore(self, snap: SnapshotMeta) -> None:
        saved = self.state_file.saved
        if saved.conf_index < snap.conf_index:
            raise InvariantViolation(
                f"node {self.node.id} restores a snapshot of entry {snap.index} whose "
                f"configuration (entry {snap.conf_index}) raft.state does not hold yet "
                f"({saved.conf_index}): a crash after the restore restarts it in an older one"
            )
        fut: asyncio.Future[None] = self.sim.loop.create_future()
        self.restoring = (snap, fut)
        self.sim.schedule(self.sim.rng.randrange(1, 10), "restored", self)
        await self.park(fut)

    # -- completions of the worker thread --

    def finish_hs_save(self) -> None:
        assert self.hs_save is not None
        hs, fut = self.hs_save
        self.hs_save = None
        self.state_file.save(hs)
        if not fut.done():
            fut.set_result(None)

    def finish_restore(self) -> None:
        assert self.restoring is not None
        snap, fut = self.restoring
        self.restoring = None
        self.store.restore(snap.index, snap.term, snap.data)
        self.node.disk.forget_all()  # every segment was deleted
        self.durable_pos = self.low_water = self.store.write_position
        self.truncations += 1
        self.sim.stats["snapshots_restored"] += 1
        self.sim.checker.on_snapshot(self.node.id, snap)
        self.applied = snap.index
        if not fut.done():
            fut.set_result(None)


@dataclass(eq=False)
class SimNode:
    id: int
    root: Path
    disk: PowerLossDisk
    life: Life | None = None
    incarnations: int = 0
    crash_in_fsync: bool = False
    view: FakeDisk = dataclasses.field(default_factory=FakeDisk)  # for Checker.check_node
    saved_commit: int = 0  # the highest commit raft.state ever held
    durable_at_crash: tuple[int, int] = (0, 0)  # (index, term) of the last durable entry
    fsync_ms: tuple[int, int] | None = None  # this node's fsync latency (default: the sim's)
    retired: bool = False  # removed from the group and stopped for good
