"""Deterministic simulation of real Ready drivers over real entry stores (sync flush).

`DriverSim(seed).run(steps)` runs a cluster of 3 or 5 nodes, each the production
path of a sync-flush node: a `ReadyDriver` (dledger_commitlog/driver.py) around a
`RaftCore` with `async_storage_writes`, a real `EntryStore` and a real
`RaftStateFile` in a per-node directory, opened and recovered the way
`RaftNode._open` does. Only the edges are simulated, each one injected:

- the flusher (`SimFlusher`, a `driver.Flusher`): an fsync starts a little after
  it is requested and calls the store's real `flush()`; its completion, and with
  it the driver's listener, comes later, so the driver keeps appending, sending
  and applying while it runs and several Readies are in flight. One fsync at a
  time per node, as GroupCommit; what it reports covers the bytes written when
  it started;
- the transport (`StreamNetwork`): one stream per ordered pair of nodes, FIFO as
  a gRPC stream; a message may be lost (a batch of a broken stream, the queue's
  overflow), a break drops everything in flight on a stream, partitions block
  streams; no duplicates, no reordering within a stream;
- the clock: ticks are events, 10 ms of simulated time apart;
- the worker thread: raft.state saves and snapshot restores complete as later
  events; a periodic checkpointer writes the entry checkpoint and raft.state's
  commit (loops.NodeLoops.checkpoint_now), now and then right between the
  driver's append and its flush request (it runs on its own thread in a node);
  per seed, retention drops an applied prefix, so that lagging followers are
  restored from snapshots;
- the disk's durability (`PowerLossDisk`): the content of every data and index
  segment as of its last fsync is its durable image. A crash is a power loss:
  every segment keeps its durable image plus some of what the page cache held
  beyond it, by 512-byte sectors (none, all, a prefix, a prefix whose last
  sector is junk, any subset); so a suffix that was fsynced and then replaced
  may come back, and bytes buffered in the process (write_buffer_bytes) are
  lost. raft.state keeps its last completed save (a save in flight lands or not).
  Directory operations are taken as durable (segment creation is fsynced; the
  deletion of segments by a truncation is not modelled as reversible).

All drivers run as tasks on one asyncio event loop that nobody else uses. After
each event the loop runs until every driver is parked: on its wakeup event with
nothing to do, or on a future the simulation completes later. No wall clock,
no threads, no real sleeps: every choice comes from `random.Random(seed)`, so a
seed replays exactly (`python -m tests.sim.driver_sim --seed N`).

Membership (`membership=True`, tests/sim/membership.py, as in tests/sim/simulation.py):
the run starts with 1, 3 or 5 voters; every 30-200 ms the leader is asked for a
membership change; an added learner is a new node with an empty directory,
started with `Config.join`; a node whose removal committed is stopped half the
time, else it keeps running. A node restarts with the membership raft.state
recorded. At the end, the final configuration must have a leader and every member
(not a removed node) must hold every committed entry.

Faults (while `faults`): power losses of a minority at any point (also while an
fsync is in flight), of every node at once (sync flush promises that no
acknowledged entry is lost even then), partitions, one-way blocks, broken
streams, message loss, leadership transfers. The five EntryStore recovery bugs
it found are fixed and pinned in tests/test_entry_store.py; the stats count how
often a power loss falls in the states that hid them (`_count_crash_situation`).

Checks: election safety, leader completeness, log matching and state-machine
safety (tests/sim/checkers.py); the Ready contract against what is durable (a
message leaves only once the term and vote it promises are in raft.state, an
acknowledgement only once the entries it covers are fsynced, an entry is
applied only once it is fsynced on that node, a snapshot restored only once
raft.state holds its membership); no truncation over bytes not yet durable;
raft.state's commit never goes back and never covers an entry not yet
durable; recovery keeps every entry fsynced before the power loss; a restarted
node's committed prefix (raft.state's commit over its recovered log) is the
committed log; and at the end, after healing everything and restarting every
node: a leader commits a new entry that every node applies within
`CONVERGE_MS` of simulated time, and every node's log holds every entry ever
applied anywhere (durability).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import heapq
import logging
import os
import random
import shutil
import sys
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from dledger_commitlog.log.entry_records import CHECKPOINT_FILE, read_record
from dledger_commitlog.log.entry_store import EntryStore
from raft import (
    AppendEntries,
    AppendResponse,
    Entry,
    HardState,
    Message,
    NotLeader,
    RaftCore,
    ReadState,
    RequestVote,
    Role,
    Snapshot,
    SnapshotMeta,
    VoteResponse,
)
from raft.driver import ReadyDriver
from raft.membership import ChangeOp
from raftio.hard_state import RaftStateFile
from store.entry_format import INDEX_UNIT_SIZE
from store.errors import CorruptEntry
from tests.sim.checkers import Checker, InvariantViolation, LogView
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
from tests.sim.simulation import SimFailure, run_seeds

T = TypeVar("T")

TICK_MS = 10
CONVERGE_MS = 30_000  # after healing, a new entry is applied everywhere within this
LINGER_MS = 2  # how long a leader's driver holds a commit notice (the node: 2 ms)
SETTLE_ROUNDS = 10_000  # loop iterations after one event before the drivers must be parked
CHECK_LOGS_EVERY = 500
_SECTOR = 512
_SEGMENT_NAME = 20


# The EntryStore bugs the simulation found, fixed, and the stats that count how often
# it runs into their triggers: the index below the tail not durable (a power loss with
# no entry checkpoint in the retained log: `crashes_unanchored`), the filler after a
# restore's base (`crashes_after_base_filler`), retention beyond the checkpoint
# (`compactions_beyond_checkpoint`), retention on a log whose first segment holds only
# that filler (`compactions_after_filler`).


def read_checkpoint_index(log_dir: Path) -> int:
    """The index recorded in `entries.checkpoint` (0: none or invalid)."""
    try:
        record = read_record(log_dir / CHECKPOINT_FILE)
    except CorruptEntry:
        return 0
    return record[0] if record is not None else 0


# --- the disk: durable images and power loss ---------------------------------


@dataclass(frozen=True, slots=True)
class Capture:
    """Segment contents read at one moment (`seq` orders captures)."""

    seq: int
    files: dict[Path, tuple[int, bytes]]  # path -> (inode, content)


def _segments(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    return sorted(
        (int(name), directory / name)
        for name in os.listdir(directory)
        if len(name) == _SEGMENT_NAME and name.isdigit()
    )


def _read(path: Path) -> tuple[int, bytes]:
    with path.open("rb") as f:
        return os.fstat(f.fileno()).st_ino, f.read()


def _diff_range(a: bytes, b: bytes) -> tuple[int, int]:
    """[lo, hi): the span from the first to the last byte where a and b differ (a != b)."""
    n = len(a)
    chunk = 4096
    lo = 0
    while lo + chunk <= n and a[lo : lo + chunk] == b[lo : lo + chunk]:
        lo += chunk
    while a[lo] == b[lo]:
        lo += 1
    hi = n
    while hi - chunk >= lo and a[hi - chunk : hi] == b[hi - chunk : hi]:
        hi -= chunk
    while a[hi - 1] == b[hi - 1]:
        hi -= 1
    return lo, hi


TEAR_MODES = ("lost", "kept", "prefix", "garbage", "sectors")
_TEAR_WEIGHTS = (3, 1, 3, 2, 1)


def tear(cur: bytes, old: bytes, rng: random.Random, mode: str) -> bytes:
    """What a power loss leaves of a file whose page cache holds `cur` and whose disk
    holds `old` (its content as of its last fsync). A 512-byte sector reaches the
    disk whole or not at all, except (`garbage`) the one being written when the power
    went, whose new bytes are junk; bytes the page cache did not change are never
    touched (that would be a disk that loses fsynced data)."""
    lo, hi = _diff_range(cur, old)
    first = lo - lo % _SECTOR
    cut = min(hi, first + _SECTOR * rng.randint(0, (hi - first + _SECTOR - 1) // _SECTOR))
    cut = max(cut, lo)
    match mode:
        case "lost":  # nothing was written back
            return old
        case "kept":  # everything was
            return cur
        case "prefix":  # written back in order, up to a sector boundary
            return cur[:cut] + old[cut:]
        case "garbage":  # ... and the sector being written holds junk
            cut = min(cut, hi - 1)
            end = min(cut - cut % _SECTOR + _SECTOR, hi)
            return cur[:cut] + rng.randbytes(end - cut) + old[end:]
        case "sectors":  # written back in any order
            out = bytearray(old)
            for s in range(first, hi, _SECTOR):
                if rng.random() < 0.5:
                    out[s : s + _SECTOR] = cur[s : s + _SECTOR]
            return bytes(out)
    raise ValueError(mode)


class PowerLossDisk:
    """The durable image of one node's segment files, and what a power loss leaves.

    The image of a segment is its content as of the last fsync that covered it
    (a capture taken when the fsync started, committed when it completed). A
    segment without an image was created since (allocated and its name fsynced:
    it is durably all zeros), or re-created under the same name (the inode tells).
    """

    def __init__(self, dirs: dict[Path, int]) -> None:
        self.dirs = dirs  # segment directory -> segment size
        self._images: dict[Path, tuple[int, int, bytes]] = {}  # path -> (seq, inode, content)
        self._seq = 0

    def capture(self, directory: Path, from_pos: int = 0) -> Capture:
        """The page-cache content of `directory`'s segments that reach past `from_pos`."""
        self._seq += 1
        size = self.dirs[directory]
        files = {
            path: _read(path) for start, path in _segments(directory) if start + size > from_pos
        }
        return Capture(self._seq, files)

    def commit(self, cap: Capture) -> None:
        """An fsync that started at `cap` completed: its content is durable."""
        for path, (ino, data) in cap.files.items():
            old = self._images.get(path)
            if old is None or old[0] < cap.seq:
                self._images[path] = (cap.seq, ino, data)

    def sync_all(self) -> None:
        """Everything is fsynced now (an entry checkpoint flushes data and index)."""
        for directory in self.dirs:
            self.commit(self.capture(directory))
        self._images = {p: img for p, img in self._images.items() if p.exists()}

    def forget_from(self, directory: Path, pos: int) -> None:
        """A truncation at `pos` deleted the segments from the next boundary on."""
        size = self.dirs[directory]
        cut = pos if pos % size == 0 else pos - pos % size + size
        for path in [p for p in self._images if p.parent == directory and int(p.name) >= cut]:
            del self._images[path]

    def forget_all(self) -> None:
        self._images.clear()

    def durable(self, path: Path, ino: int, size: int) -> bytes:
        img = self._images.get(path)
        if img is None or img[1] != ino:
            return bytes(size)
        data = img[2]
        return data if len(data) == size else data[:size].ljust(size, b"\0")

    def plan_power_loss(
        self, rng: random.Random, stats: Counter[str], modes: Sequence[str] = TEAR_MODES
    ) -> dict[Path, bytes]:
        """What every segment holds after a power loss now (read before the process
        state is dropped: bytes still buffered in the process never reach the disk)."""
        plan: dict[Path, bytes] = {}
        for directory in self.dirs:
            for _, path in _segments(directory):
                ino, cur = _read(path)
                old = self.durable(path, ino, len(cur))
                if cur == old:
                    plan[path] = cur
                    continue
                weights = [_TEAR_WEIGHTS[TEAR_MODES.index(m)] for m in modes]
                mode = rng.choices(modes, weights)[0]
                stats[f"torn_{mode}"] += 1
                plan[path] = tear(cur, old, rng, mode)
        return plan

    def apply_power_loss(self, plan: dict[Path, bytes]) -> None:
        """Make the files what `plan` says (after the process is gone); that is durable."""
        for directory in self.dirs:
            for _, path in _segments(directory):
                if path not in plan:  # written by the dying process after the plan
                    path.unlink()
        self._images.clear()
        self._seq += 1
        for path, data in plan.items():
            with path.open("r+b") as f:
                f.write(data)
                f.truncate(len(data))
                ino = os.fstat(f.fileno()).st_ino
            self._images[path] = (self._seq, ino, data)


# --- the network -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NetProfile:
    drop_rate: float
    min_ms: int
    max_ms: int

    @staticmethod
    def random(rng: random.Random) -> NetProfile:
        lo = rng.randrange(0, 3)
        return NetProfile(
            drop_rate=rng.choice((0.0, 0.01, 0.05, 0.1)),
            min_ms=lo,
            max_ms=lo + rng.choice((1, 5, 15, 40)),
        )


class StreamNetwork:
    """One FIFO stream per ordered pair of nodes, like the gRPC transport: what
    arrives on a stream arrives in the order sent, with gaps (a lost batch, a
    broken stream); a partition breaks and blocks the streams it cuts."""

    def __init__(self, rng: random.Random, profile: NetProfile) -> None:
        self.rng = rng
        self.profile = profile
        self.blocked: set[tuple[int, int]] = set()
        self._epoch: dict[tuple[int, int], int] = {}
        self._last_arrival: dict[tuple[int, int], int] = {}

    def send(self, m: Message, now: int) -> tuple[int, int] | None:
        """(arrival time, stream epoch) of `m` sent at `now`; None if lost."""
        link = (m.src, m.dst)
        p = self.profile
        if link in self.blocked or self.rng.random() < p.drop_rate:
            return None
        at = max(now + self.rng.randint(p.min_ms, p.max_ms), self._last_arrival.get(link, 0))
        self._last_arrival[link] = at
        return at, self._epoch.get(link, 0)

    def deliverable(self, m: Message, epoch: int) -> bool:
        link = (m.src, m.dst)
        return link not in self.blocked and self._epoch.get(link, 0) == epoch

    def break_streams(self, links: Sequence[tuple[int, int]]) -> None:
        """Everything in flight on these streams is lost."""
        for link in links:
            self._epoch[link] = self._epoch.get(link, 0) + 1

    def block(self, links: Sequence[tuple[int, int]]) -> None:
        self.blocked.update(links)
        self.break_streams(links)

    def heal(self) -> None:
        self.blocked.clear()


# --- one node ----------------------------------------------------------------


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
        self.sim.on_apply(self, entries)
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


class SimStorage:
    """The store as the driver writes it (driver.DriverStorage): the real EntryStore,
    watched so the simulation knows what each append changes on disk."""

    def __init__(self, life: Life) -> None:
        self._life = life

    def append_entries(self, entries: Sequence[Entry]) -> list[int]:
        life = self._life
        store, disk = life.store, life.node.disk
        first = entries[0].index
        if life.flusher.in_flight is not None:
            life.sim.stats["appends_during_fsync"] += 1
        if first <= store.last_index():
            # A truncation: the driver must have waited until everything written is durable.
            if life.durable_pos < store.write_position:
                raise InvariantViolation(
                    f"node {life.node.id} truncates its log at {first} with bytes "
                    f"[{life.durable_pos}, {store.write_position}) not yet durable"
                )
            pos = store.locate(first)[0]
            life.sim.stats["truncations"] += 1
            life.truncations += 1
            life.low_water = min(life.low_water, pos)
            life.durable_pos = min(life.durable_pos, pos)
            positions = store.append_entries(entries)
            root = life.node.root / "log"
            disk.forget_from(root / "data", pos)
            disk.forget_from(root / "index", first * INDEX_UNIT_SIZE)
        else:
            life.low_water = min(life.low_water, store.write_position)
            positions = store.append_entries(entries)
        if life.sim.record:
            life.sim.log(life, "append", entries[-1].index)
        if life.sim.rng.random() < life.sim.checkpoint_race:
            # The checkpointer's thread flushes right now, between the driver's append
            # and its flush request (it runs whenever it likes in a real node).
            life.sim.stats["checkpoint_races"] += 1
            life.sim.checkpoint(life)
        return positions

    def last_index(self) -> int:
        return self._life.store.last_index()

    @property
    def write_position(self) -> int:
        return self._life.store.write_position

    @property
    def flushed_position(self) -> int:
        return self._life.durable_pos  # what completed fsyncs made durable


@dataclass(slots=True)
class InFlight:
    flushed: int  # what the store's flush() returned when the fsync started
    capture: Capture
    truncations: int  # the life's truncation count when it started
    started: int  # sim time


class SimFlusher:
    """driver.Flusher modelled on store.flush.GroupCommit, with simulated timing.

    As GroupCommit: `request(pos)` for a `pos` already flushed needs no fsync,
    and the flushed position is reported on the loop's next pass (`answer_pending`
    until then); else it queues a request for the flusher "thread", which serves
    every queued request with one fsync covering all bytes written when that
    fsync starts, then reports the flushed position (waiters whose position it
    covers are released, then the listeners run) and takes the next queued
    request, if any. The store's flushed position as GroupCommit sees it is the
    life's `durable_pos`: raised by completed fsyncs and entry checkpoints,
    lowered by truncations.
    """

    def __init__(self, life: Life) -> None:
        self._life = life
        self._listeners: list[Callable[[int], None]] = []
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []
        self.requested = 0  # the last position requested (for reports)
        self.queued = False  # a request waits for the thread
        self.start_pending = False  # the thread is about to start an fsync
        self.in_flight: InFlight | None = None
        self.answer_pending = False  # a report for requests already covered is due
        self.history: list[tuple[int, int, int]] = []  # (started, completed, reported)

    def add_listener(self, on_durable: Callable[[int], None]) -> None:
        self._listeners.append(on_durable)

    def request(self, position: int) -> None:
        life = self._life
        if position <= life.durable_pos:
            # As GroupCommit: flushed already (by anyone), so no fsync; the answer
            # comes on the loop's next pass, never from inside this call.
            if not self.answer_pending:
                self.answer_pending = True
                life.sim.loop.call_soon(self._answer_covered)
            return
        self.requested = position
        self.queued = True
        self._maybe_start()

    async def sync(self, position: int | None = None) -> int:
        life = self._life
        pos = life.store.write_position if position is None else position
        if life.durable_pos >= pos:
            return life.durable_pos
        fut: asyncio.Future[int] = life.sim.loop.create_future()
        self.request(pos)
        self._waiters.append((pos, fut))
        return await life.park(fut)

    def _answer_covered(self) -> None:
        self.answer_pending = False
        self._report(self._life.durable_pos)

    def _maybe_start(self) -> None:
        if self.queued and self.in_flight is None and not self.start_pending:
            self.start_pending = True
            sim = self._life.sim
            sim.schedule(sim.rng.randrange(0, 2), "fsync_start", self._life)

    def start(self) -> None:
        """The thread takes every queued request: one fsync covering all written."""
        life, sim = self._life, self._life.sim
        self.start_pending = False
        self.queued = False
        flushed = life.store.flush()  # commits the write buffer; fdatasync
        cap = life.node.disk.capture(life.node.root / "log" / "data", life.low_water)
        life.low_water = life.store.write_position
        self.in_flight = InFlight(flushed, cap, life.truncations, sim.now)
        latency = sim.rng.randint(*(life.node.fsync_ms or sim.fsync_ms))
        if life.node.crash_in_fsync:
            life.node.crash_in_fsync = False
            sim.stats["crashes_in_fsync"] += 1
            sim.schedule(sim.rng.randint(0, latency), "crash", life.node)
        sim.schedule(latency, "fsync_done", life)
        sim.stats["fsyncs"] += 1

    def done(self) -> None:
        """The fsync completed: report the store's flushed position, as flush() returns it."""
        life = self._life
        fl = self.in_flight
        assert fl is not None
        self.in_flight = None
        life.node.disk.commit(fl.capture)
        if fl.truncations == life.truncations:
            life.durable_pos = max(life.durable_pos, fl.flushed)
        # else a truncation raced the fsync: like MappedFileQueue.flush, it claims nothing
        flushed = life.durable_pos
        self.history.append((fl.started, life.sim.now, flushed))
        if life.sim.record:
            life.sim.log(life, "fsync_done", life.durable_last())
        self._report(flushed)
        self._maybe_start()

    def _report(self, flushed: int) -> None:
        """Release the waiters `flushed` covers, then tell the listeners."""
        kept: list[tuple[int, asyncio.Future[int]]] = []
        for pos, fut in self._waiters:
            if pos <= flushed:
                if not fut.done():
                    fut.set_result(flushed)
            else:
                kept.append((pos, fut))
        self._waiters = kept
        for listener in self._listeners:
            listener(flushed)


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


# --- the simulation ----------------------------------------------------------


class DriverSim:
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
            self._new_node(i)
        for node in self.nodes.values():
            self._open(node)
            self.schedule(rng.randrange(TICK_MS), "tick", node)
            self.schedule(rng.randrange(50, 500), "checkpoint", node)
        if self.members is not None:
            self.schedule(rng.randrange(30, 200), "member", None)
        self.schedule(rng.randrange(20), "client", None)
        self.schedule(rng.randrange(50), "read", None)
        self.schedule(rng.randrange(100, 400), "fault", None)
        if self.compaction:
            self.schedule(rng.randrange(100, 400), "compact", None)
        self._settle()

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
                self._compact()
            case "fault":
                self.schedule(self.rng.randrange(30, 400), "fault", None)
                if self.faults:
                    self._inject_fault()
            case "crash":
                if arg.life is not None and self.faults:
                    self.crash(arg)
            case "restart":
                if arg.life is None and not arg.retired:
                    self._open(arg)
            case "heal":
                self.net.heal()
            case "member":
                self.schedule(self.rng.randrange(30, 200), "member", None)
                if self.faults:
                    self._change_membership()
            case "retire":
                self._retire(arg)
            case _:
                raise AssertionError(kind)
        self._settle()
        for node in self.nodes.values():
            if node.life is not None:
                self._check_node(node, node.life)
        if self.steps % CHECK_LOGS_EVERY == 0:
            self.check_logs()

    def _settle(self) -> None:
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

    def _new_node(self, i: int) -> SimNode:
        root_i = self.root / f"n{i}"
        root_i.mkdir(parents=True, exist_ok=True)
        log_dir = root_i / "log"
        dirs = {
            log_dir / "data": self.data_segment_bytes,
            log_dir / "index": self.index_segment_bytes,
        }
        node = self.nodes[i] = SimNode(i, root_i, PowerLossDisk(dirs))
        return node

    def _open(self, node: SimNode) -> None:
        """Start a node from its directory, as RaftNode._open does (sync flush)."""
        node.incarnations += 1
        life = Life(self, node)
        node.life = life
        self.stats["starts"] += 1
        if life.store.tail_cut is not None:
            self.stats["tail_cuts"] += 1
        if life.missing_through:
            self.stats["gated_starts"] += 1
        self._check_restart(node, life)

    @staticmethod
    def _after_base_filler(store: EntryStore) -> bool:
        """The log restarts after a base that ends right before a filler (a restore)."""
        b = store.base
        return (
            b is not None
            and store.data_queue.min_offset <= b[2] < store.write_position
            and store.next_entry_pos(b[2]) != b[2]
        )

    def _count_crash_situation(self, life: Life) -> None:
        """Count the states a power loss now leaves recovery to cope with (beyond a torn
        tail): they once hid EntryStore bugs."""
        store = life.store
        if read_checkpoint_index(life.node.root / "log") < store.first_index():
            self.stats["crashes_unanchored"] += 1  # the index below the tail is not durable
        if self._after_base_filler(store):
            self.stats["crashes_after_base_filler"] += 1

    def crash(self, node: SimNode) -> None:
        """Power loss: the process dies, the disk keeps its durable images plus a random
        part of what the page cache held beyond them."""
        life = node.life
        assert life is not None
        self.stats["crashes"] += 1
        self._count_crash_situation(life)
        life.dead = True
        life.driver.stopped = True
        life.task.cancel()
        self.loop.run_until_complete(_reap(life.task))
        rng = self.rng
        if life.restoring is not None and rng.random() < 0.5:
            life.finish_restore()  # it reached the disk; the driver never heard
        if life.hs_save is not None and rng.random() < 0.5:
            life.finish_hs_save()  # the rename reached the disk
        durable = life.durable_last()
        node.durable_at_crash = (durable, life.store.term(durable))
        plan = node.disk.plan_power_loss(rng, self.stats, self.tear_modes)
        life.store.close()  # commits buffered bytes to the files: undone below
        node.disk.apply_power_loss(plan)
        node.life = None
        node.crash_in_fsync = False
        self.schedule(rng.randrange(10, 500), "restart", node)

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

    def _compact(self) -> None:
        """Retention on one node: drop whole segments of its applied prefix."""
        up = [n.life for n in self.nodes.values() if n.life is not None]
        if not up:
            return
        life = self.rng.choice(up)
        if self.rng.random() < 0.5:
            life = next((x for x in up if x.core.role is Role.LEADER), life)
        if life.restoring is not None:
            return  # the driver is between settle and restore
        store = life.store
        before = store.first_index()
        upto = life.applied
        last = min(upto, store.last_index())
        if self._after_base_filler(store) and last > before:
            data = store.data_queue
            if store.locate(last)[0] >= data.min_offset + data.segment_size:
                self.stats["compactions_after_filler"] += 1  # the first segment: a filler
        after = store.delete_prefix(upto)
        if after > before:
            self.stats["compactions"] += 1
            if after - 1 > read_checkpoint_index(life.node.root / "log"):
                self.stats["compactions_beyond_checkpoint"] += 1

    # --- the transport ---

    def on_send(self, life: Life, m: Message) -> None:
        self._check_send(life, m)
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
        self._settle()
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

    # --- faults ---

    def _inject_fault(self) -> None:
        rng = self.rng
        ids = [i for i, n in self.nodes.items() if not n.retired]  # (retired: gone for good)
        victim = self.nodes[rng.choice(ids)]
        leader = self.leader()
        if leader is not None and rng.random() < 0.5:
            victim = leader.node
        down = sum(1 for n in self.nodes.values() if n.life is None and not n.retired)
        may_crash = victim.life is not None and down < (len(ids) - 1) // 2
        fault = rng.randrange(11)
        match fault:
            case 0 | 1:
                if may_crash:
                    self.crash(victim)
            case 2:
                if may_crash:
                    victim.crash_in_fsync = True
            case 3:
                if self.cluster_power_loss and rng.random() < 0.5:
                    self.stats["cluster_power_losses"] += 1
                    for node in self.nodes.values():
                        if node.life is not None:
                            self.crash(node)
            case 4 if len(ids) > 1:  # (a lone first voter has nobody to be cut from)
                rng.shuffle(ids)
                cut = rng.randrange(1, len(ids))
                self._cut(ids[:cut], ids[cut:], both=True)
            case 5:
                self._cut([victim.id], [i for i in ids if i != victim.id], both=True)
            case 6:
                others = [i for i in ids if i != victim.id]
                if rng.random() < 0.5:
                    self._cut([victim.id], others, both=False)
                else:
                    self._cut(others, [victim.id], both=False)
            case 7:
                self.stats["stream_breaks"] += 1
                self.net.break_streams(
                    [(a, b) for a in ids for b in ids if a != b and victim.id in (a, b)]
                )
            case 8 | 9:
                if leader is not None:
                    with contextlib.suppress(NotLeader):
                        leader.core.transfer_leadership(rng.choice(leader.core.membership.voters))
                    leader.kick()
            case _:
                pass  # a quiet spell
        self.stats[f"fault_{_FAULTS[fault]}"] += 1

    # --- membership changes ---

    def _change_membership(self) -> None:
        """Ask the leader (now and then a follower) for a membership change; start the
        node it adds; retire, now and then, a node whose removal it accepted."""
        assert self.members is not None
        rng = self.rng
        life = self.leader()
        if life is None or rng.random() < ASK_FOLLOWER_RATE:
            up = [n.life for n in self.nodes.values() if n.life is not None]
            if not up:
                return
            life = rng.choice(up)
        core = life.core
        asked = self.members.ask(rng, core, life.node.id)
        if asked is None:
            return
        change, new = asked
        if new is not None:
            node = self._new_node(new)
            self._open(node)
            self.schedule(rng.randrange(TICK_MS), "tick", node)
            self.schedule(rng.randrange(50, 500), "checkpoint", node)
        elif change.op is ChangeOp.REMOVE and rng.random() < RETIRE_RATE:
            self.schedule(rng.randrange(50, 500), "retire", self.nodes[change.node_id])
        life.kick()

    def _retire(self, node: SimNode) -> None:
        """Stop a removed node for good once its removal is committed (else later)."""
        if node.retired or not self.faults:
            return
        if node.id not in self.checker.removed_at:
            self.schedule(self.rng.randrange(50, 500), "retire", node)
            return
        self.stats["retired"] += 1
        node.retired = True
        life = node.life
        if life is None:
            return
        life.dead = True
        life.driver.stopped = True
        life.task.cancel()
        self.loop.run_until_complete(_reap(life.task))
        life.store.close()
        node.life = None

    def _cut(self, a: Sequence[int], b: Sequence[int], *, both: bool) -> None:
        links = [(x, y) for x in a for y in b]
        if both:
            links += [(y, x) for x in a for y in b]
        self.net.block(links)
        self.stats["partitions"] += 1
        self.schedule(self.rng.randrange(50, 800), "heal", None)

    # --- checks ---

    def log(self, life: Life, what: str, index: int) -> None:
        self.events.append((self.now, life.node.id, what, index))

    def _check_send(self, life: Life, m: Message) -> None:
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
        self.checker.on_ack(m)

    def on_apply(self, life: Life, entries: Sequence[Entry]) -> None:
        durable = life.durable_last()
        if entries[-1].index > durable:
            raise InvariantViolation(
                f"node {life.node.id} applied up to {entries[-1].index} with only {durable} on disk"
            )
        self.checker.on_apply(life.node.id, life.core.term, tuple(entries))
        if self.record:
            self.log(life, "apply", entries[-1].index)

    def _check_node(self, node: SimNode, life: Life) -> None:
        saved = life.state_file.saved
        if saved.commit < node.saved_commit:
            raise InvariantViolation(
                f"node {node.id}: raft.state's commit went back "
                f"{node.saved_commit} -> {saved.commit}"
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
        # the durable commit is checked at restart (_check_restart) instead.
        node.view.hard_state = dataclasses.replace(saved, commit=0)
        self.checker.check_node(node.id, life.core, node.view)

    def _check_restart(self, node: SimNode, life: Life) -> None:
        """A restarted node takes its log up to raft.state's commit as applied: that
        prefix must be the committed log (what other nodes applied), or become it."""
        checker, core, store = self.checker, life.core, life.store
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

    def check_logs(self) -> None:
        logs: dict[int, LogView] = {}
        for node in self.nodes.values():
            if node.life is not None:
                core = node.life.core
                base = core.first_index - 1
                entries = core.log_slice(base + 1, core.last_index + 1)
                logs[node.id] = LogView(
                    base, core.log_term(base), entries, core.membership, core.conf_index
                )
        self.checker.check_log_matching(logs)

    def check_durability(self, members: Sequence[SimNode] | None = None) -> None:
        """Every entry applied anywhere is in every member's log (all are up now; without
        `members`, every node is one)."""
        canon = self.checker.canon
        for node in self.nodes.values() if members is None else members:
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

    # --- convergence ---

    def converge(self) -> list[SimNode]:
        """Stop the faults, heal everything, restart every node (but the retired): a
        leader must then commit a new entry that every node (with membership changes:
        every member of the final configuration) applies within CONVERGE_MS; those
        nodes."""
        self.faults = self.clients = False  # only the marker is proposed
        self.net.heal()
        self.net.profile = NetProfile(0.0, 1, 5)
        for node in self.nodes.values():
            node.crash_in_fsync = False
            if node.life is None and not node.retired:
                self._open(node)
        self._settle()
        marker = b"converge-%d" % self.seed
        deadline = self.now + CONVERGE_MS
        pending: tuple[int, Life, int] | None = None  # (index, proposer, its term)
        while self.now < deadline:
            self.step()
            if pending is None:
                pending = self._propose_marker(marker)
                continue
            index, proposer, term = pending
            members = (
                list(self.nodes.values())
                if self.members is None
                else final_members(self.nodes, None if proposer.dead else proposer.core, term)
            )
            if members is not None and all(
                n.life is not None and n.life.core.applied >= index for n in members
            ):
                if self.checker.canon[index - 1].data == marker:
                    self.stats["converged_ms"] = self.now - (deadline - CONVERGE_MS)
                    return members
                pending = None  # lost to a leader change: propose again
            elif (
                proposer.dead or proposer.core.term != term or proposer.core.role is not Role.LEADER
            ):
                pending = None
        raise AssertionError(
            f"liveness: no new entry applied everywhere {CONVERGE_MS} ms after healing"
        )

    def _propose_marker(self, marker: bytes) -> tuple[int, Life, int] | None:
        life = self.leader()
        if life is None:
            return None
        try:
            first, _ = life.core.propose(marker)
        except NotLeader:
            return None
        life.kick()
        return first, life, life.core.term


_FAULTS = ("crash", "crash", "crash_in_fsync", "cluster_power_loss", "split", "isolate",
           "one_way", "stream_break", "transfer", "transfer", "none")  # fmt: skip


async def _reap(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task


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
        seeds, args.steps,
        lambda seed: DriverSim(seed, args.nodes, write_buffer=wb, membership=args.membership),
        stats=args.stats,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
