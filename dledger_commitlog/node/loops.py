"""A node's background loops: ticks, dispatch, checkpoints, retention.

Owns `NodeLoops`, the periodic and event-driven work beside the Ready driver:
- ticks: wall-clock time reaches the Raft core only here, every `tick_ms` (on
  multiples of it, so that the shards of a process tick together);
- dispatch: committed messages go to consume queues and the key index in
  batches as the commit position advances (never past it: see Dispatcher);
- checkpoints: every second, off the loop, the applied index (entry checkpoint
  and raft.state's commit) and then what dispatch covers. The commit index goes
  first, so that at restart the committed prefix covers everything the dispatch
  checkpoint says was dispatched;
- retention: a pass every 10 s (or `clean_now`).
A failure in dispatch (a unit conflicting with its queue, a message that does
not decode, a failed write) stops the node (`stop_on`) rather than serve wrong
data; a stopping node does not tick (it must not campaign meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor

from dispatch.dispatcher import Dispatcher, DispatchSnapshot
from dledger_commitlog.log.commitlog import DLedgerCommitLog
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.retention import Retention
from dledger_commitlog.node.metrics import NodeMetrics
from raft import RaftCore
from raftio.hard_state import RaftStateFile

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 1.0
RETENTION_INTERVAL_S = 10.0


Listener = Callable[[], None]


async def next_call(add: Callable[[Listener], None], remove: Callable[[Listener], None]) -> None:
    """Return at the next call of a listener registered with `add` (then `remove`d)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done() -> None:
        if not fut.done():
            fut.set_result(None)

    add(done)
    try:
        await fut
    finally:
        remove(done)


class NodeLoops:
    def __init__(
        self,
        node_id: int,
        core: RaftCore,
        *,
        tick_ms: int,
        tick: Callable[[], None],
        kick: Callable[[], None],
        metrics: NodeMetrics,
        commitlog: DLedgerCommitLog,
        dispatcher: Dispatcher,
        store: EntryStore,
        state_file: RaftStateFile,
        retention: Retention,
        executor: Executor,
        stop_on: Callable[[BaseException, str], None],
        stopping: Callable[[], bool],
        checkpointed: tuple[int, int],
    ) -> None:
        self._id = node_id
        self._core = core
        self._tick_s = tick_ms / 1000
        self._tick = tick  # the core's tick, through the node
        self._kick = kick
        self._metrics = metrics
        self._commitlog = commitlog
        self._dispatcher = dispatcher
        self._store = store
        self._state_file = state_file
        self._retention = retention
        self._executor = executor
        self._stop_on = stop_on
        self._stopping = stopping
        self._checkpointed = checkpointed  # (applied, core commit) last written
        self._checkpoint_lock = threading.Lock()
        self._dispatch_wakeup = asyncio.Event()
        commitlog.add_commit_listener(self._dispatch_wakeup.set)

    def start(self) -> list[asyncio.Task[None]]:
        loop = asyncio.get_running_loop()
        return [
            loop.create_task(self._tick_loop(), name="tick-loop"),
            loop.create_task(self._checkpoint_loop(), name="checkpoint-loop"),
            loop.create_task(self._dispatch_loop(), name="dispatch-loop"),
            loop.create_task(self._retention_loop(), name="retention-loop"),
        ]

    # -- ticks -------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        interval = self._tick_s
        # On multiples of the interval of the loop's clock: the shards of a multi-Raft
        # process tick in the same loop iteration, so their heartbeats to a peer leave
        # together in one batch of the shared stream (raftio/multiplex.py).
        now = asyncio.get_running_loop().time()
        next_at = now - now % interval
        core, tick, kick, metrics = self._core, self._tick, self._kick, self._metrics
        while True:
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - asyncio.get_running_loop().time()))
            if self._stopping():
                return  # it must not campaign meanwhile
            tick()
            kick()
            metrics.update_role(core)

    # -- dispatch ----------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        dispatcher, wakeup = self._dispatcher, self._dispatch_wakeup
        while True:
            await wakeup.wait()
            wakeup.clear()
            try:
                more = dispatcher.dispatch_batch()
            except Exception as exc:
                self._stop_on(exc, f"dispatch at {dispatcher.dispatched_pos}")
                return
            if more:
                wakeup.set()  # more may be committed: another batch after others ran
                await asyncio.sleep(0)

    async def wait_for_dispatch(self, timeout_s: float) -> bool:
        """Wait until the next dispatched batch (True) or the timeout (False)."""
        try:
            async with asyncio.timeout(timeout_s):
                await next_call(self._dispatcher.add_listener, self._dispatcher.remove_listener)
            return True
        except TimeoutError:
            return False

    async def wait_dispatched(self, pos: int, timeout_s: float) -> None:
        """Wait until dispatch has passed commit-log position `pos`."""
        async with asyncio.timeout(timeout_s):
            while self._dispatcher.dispatched_pos < pos:
                await self.wait_for_dispatch(timeout_s)

    # -- retention ---------------------------------------------------------------------

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(RETENTION_INTERVAL_S)
            try:
                self._retention.run_pass()
            except OSError as exc:
                log.error("node %d: retention pass failed: %s", self._id, exc)

    def clean_now(self, force: bool) -> tuple[int, int, str]:
        """A retention pass now (`force`: whatever the age)."""
        out = self._retention.run_pass(forced=True, ignore_age=force)
        return out.deleted_segments, out.min_offset, out.reason

    # -- checkpoints -------------------------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL_S)
            self._metrics.update_replication(self._core)
            retention = self._retention
            self._metrics.update_disk(retention.usage_ratio, retention.policy.refuse_ratio)
            snap = self._dispatcher.snapshot()
            await loop.run_in_executor(self._executor, self.checkpoint_now, snap)

    def checkpoint_now(self, snap: DispatchSnapshot) -> None:
        """Record the applied index, then what dispatch covers (blocking: off the loop)."""
        with self._checkpoint_lock:  # the loop's pass may still run when close() checkpoints
            applied = self._commitlog.committed_index
            if (applied, self._core.commit_index) != self._checkpointed:
                if applied >= self._store.first_index():
                    self._store.write_checkpoint(applied)
                self._state_file.save_commit(applied)
                self._checkpointed = (applied, self._core.commit_index)
            self._dispatcher.persist(snap)
