"""The storage and the flusher a driver of the driver simulation writes through.

`SimStorage` is the real EntryStore as the driver writes it, watched so the
simulation knows what each append changes on disk. `SimFlusher` is the flusher
(a `driver.Flusher`): an fsync starts a little after it is requested and calls the
store's real `flush()`; its completion, and with it the driver's listener, comes
later, so the driver keeps appending, sending and applying while it runs and
several Readies are in flight. One fsync at a time per node, as GroupCommit; what
it reports covers the bytes written when it started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raft import Entry
from store.entry_format import INDEX_UNIT_SIZE
from tests.sim.checkers import InvariantViolation
from tests.sim.power_loss import Capture

if TYPE_CHECKING:
    from tests.sim.driver_node import Life


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
