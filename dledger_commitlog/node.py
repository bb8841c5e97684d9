"""A node: its files opened and recovered, its Raft core, its lifecycle and inputs.

Owns `RaftNode`: opening a data directory (layout check, rollback marker, entry
store, raft state, commit log, dispatcher recovery), the Raft core built on it,
the peer links, and the inputs the services call (`deliver`, `propose`,
`read_index`, `transfer_leadership`). The Ready loop is `driver.ReadyDriver`
(the order the Ready contract demands, pipelined in sync flush mode); ticks,
dispatch, checkpoints and retention are `loops.NodeLoops`. The node is the
only place that wires them together; `server.run` serves it. The client service
sees it only through the narrow interfaces of `ports`, which `RaftNode` answers
through its base `node_views.NodeViews` (thin delegations to the part that knows).

A log that recovery had to cut below what this node knew was committed (a
corrupt entry above the entry checkpoint, see EntryStore) starts the core with
`catch_up_to`: in sync flush mode the node neither votes nor campaigns until
the leader has replicated those entries back (an entry it had fsynced may have
been counted for a commit). In async flush mode it does not: a power loss of a
majority loses the unflushed tail everywhere, and gating every node would leave
the cluster without a leader for good (docs/disk-faults.md).

A leader whose log conflicts with entries this node holds as committed
(`raft.LogDiverged`, raised by the core's `step`) means a majority lost entries
this node recorded as committed: possible only in async flush mode, after a power
loss of a majority. In async mode the node logs it loudly, writes the rollback
marker `<data_dir>/rollback.json` (roll back to the last entry its log shares
with the leader's) and stops (`on_fatal`); the next start cuts the log there,
even below the entry checkpoint, lowers raft.state's commit index, lets the
dispatcher cut consume queues and key index back to the new log end, persists
that, removes the marker and rejoins as a follower that catches up from the
leader. In sync flush mode that conflict is an invariant violation: the node
stops without a marker (docs/disk-faults.md).

Test hook: with DLEDGER_FLUSH_TRACE=1 in the environment, every successful fsync
of the commit-log data appends the flushed position (8 bytes, big-endian) to
`<data_dir>/flush.trace`, unsynced: chaos.disk.power_loss reads it to drop what
never reached the disk.

Randomness is a `random.Random` seeded from the OS. Invariants: one Ready in
flight at a time; inputs (steps, proposals, ticks) arriving meanwhile are
batched into the next one; nothing the core hands out is dropped on the floor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dispatch.dispatcher import Dispatcher
from raft import Config, HardState, LogDiverged, Message, NotLeader, RaftCore, Role
from raft.messages import AppendEntries
from raft.types import EntryKind, ReadState, SnapshotMeta
from raft.validate import InvalidPeerMessage, check_peer_message
from store.fileio import DirectoryLock, fsync_dir, mkdir_durably, write_atomically
from store.flush import GroupCommit, PeriodicFlush
from store.message import is_message, max_encoded_size

from .commitlog import DLedgerCommitLog
from .config import ConfigError, NodeConfig, parse_address
from .driver import ReadyDriver
from .entry_store import BASE_SIZE, EntryStore
from .loops import NodeLoops, next_call
from .metrics import NodeMetrics
from .node_views import NodeViews
from .raft_state import RaftStateFile
from .retention import Retention
from .schedule import ScheduleService, parse_levels
from .security import NodeSecurity
from .system_log import SystemLog
from .transactions import CheckRegistry, TransactionService
from .transport import PeerLink, to_wire
from .verify import LAYOUT_FILE, read_layout, write_layout

log = logging.getLogger(__name__)

_SYNC_WRITE_BUFFER = 4 << 20


def store_layout(cfg: NodeConfig) -> dict[str, int]:
    """The settings that shape a store's files (recorded in its layout file)."""
    names = ("data_segment_bytes", "index_segment_bytes", "cq_units_per_file", "index_slots",
             "index_entries")  # fmt: skip
    return {name: getattr(cfg, name) for name in names}


def check_layout(data: Path, layout: dict[str, int]) -> None:
    """Refuse settings that differ from those `data` was written with.

    The files' sizes and slot counts are baked into their positions: opened with
    other values, consume queues and the key index would be read and written at
    the wrong places (segments that do not line up are refused by the store).
    """
    if not (data / LAYOUT_FILE).exists():
        return  # a new directory
    try:
        written = read_layout(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{data / LAYOUT_FILE} is unreadable ({exc})") from None
    changed = [
        f"store.{name} is {layout[name]} but {data} was written with {was}"
        for name, was in sorted(written.items())
        if layout.get(name, was) != was
    ]
    if changed:
        raise ConfigError(
            "; ".join(changed) + ". A store's file layout cannot change: set it back, or "
            "move the directory away and let the node catch up from its peers"
        )


class RaftNode(NodeViews):
    def __init__(self, cfg: NodeConfig, metrics: NodeMetrics | None = None) -> None:
        data = Path(cfg.data_dir)
        mkdir_durably(data)
        # One process per data directory: a second one (a node started twice) would
        # "recover" the live node's files under it.
        self._dir_lock = DirectoryLock(data / LOCK_FILE)
        try:
            self._open(cfg, metrics, data)
        except BaseException:
            self._dir_lock.release()
            raise

    def _open(self, cfg: NodeConfig, metrics: NodeMetrics | None, data: Path) -> None:
        started = time.perf_counter()
        self.cfg = cfg
        self.metrics = metrics or NodeMetrics(cfg.node_id)
        layout = store_layout(cfg)
        check_layout(data, layout)  # before anything is opened: a changed layout corrupts
        write_layout(data, layout)  # before the store: a new store always has its layout
        self.state_file = RaftStateFile(data / "raft.state")
        self.sync_flush = cfg.flush_mode == "sync"
        rollback_path = data / ROLLBACK_FILE
        roll_back_to = read_rollback_marker(rollback_path)
        if roll_back_to is not None:
            # Commit index first: a crash before the log cut then repeats the rollback.
            self.state_file.lower_commit(roll_back_to)
        saved = self.state_file.saved
        self.store = EntryStore(
            data / "commitlog",
            data_segment_bytes=cfg.data_segment_bytes,
            index_segment_bytes=cfg.index_segment_bytes,
            committed_index=saved.commit,
            write_buffer_bytes=_SYNC_WRITE_BUFFER if self.sync_flush else 0,
        )
        if roll_back_to is not None:
            log.error("node %d: rollback marker %s: rolling the log back from entry %d to "
                      "entry %d (entries the cluster lost after a power loss)", cfg.node_id,
                      rollback_path, self.store.last_index(), roll_back_to)  # fmt: skip
            self.store.roll_back_to(roll_back_to)
        if os.environ.get(FLUSH_TRACE_ENV) == "1":
            self.store.on_data_flushed = FlushTrace(data / FLUSH_TRACE_FILE, self.store)
        commit = min(saved.commit, self.store.last_index())
        missing = self.store.missing_through
        catch_up_to = missing if self.sync_flush else 0
        if missing:
            log.warning(
                "node %d: its log ends at entry %d but entries up to %d may be committed; %s",
                cfg.node_id, self.store.last_index(), missing,
                "it stays out of elections until the leader has replicated them again"
                if catch_up_to else "async flush: they are lost here unless a peer has them",
            )  # fmt: skip
        self.core = RaftCore(
            Config(
                id=cfg.node_id,
                peers=tuple(p.id for p in cfg.peers),
                election_ticks=cfg.election_ticks,
                heartbeat_ticks=cfg.heartbeat_ticks,
                max_append_entries=cfg.max_append_entries,
                max_append_bytes=cfg.max_append_bytes,
                max_inflight_msgs=cfg.max_inflight_msgs,
                max_inflight_bytes=max(cfg.max_append_bytes, 64 << 20),
                async_storage_writes=self.sync_flush,
                check_quorum=True,
                pre_vote=True,
                preferred_leader=cfg.preferred_leader,
            ),
            self.store,
            HardState(saved.term, saved.vote, commit),
            rng=random.Random(int.from_bytes(os.urandom(8))),
            applied=commit,
            catch_up_to=catch_up_to,
        )
        host, port = parse_address(cfg.client_address)
        self.commitlog = DLedgerCommitLog(
            self.store,
            store_host=(_ipv4(host), port),
            queues_per_topic=cfg.queues_per_topic,
            max_message_bytes=cfg.max_message_bytes,
            max_pending=cfg.max_pending_puts,
            idempotency_window=cfg.idempotency_window,
            propose=self._propose,
        )
        self.commitlog.start_at(commit)
        self.dispatcher = Dispatcher(
            data,
            self.commitlog,
            units_per_file=cfg.cq_units_per_file,
            index_slots=cfg.index_slots,
            index_entries=cfg.index_entries,
        )
        log_end = (
            sum(self.store.locate(self.store.last_index()))
            if self.store.last_index() >= self.store.first_index()
            else self.commitlog.min_pos
        )
        self.recovery = self.dispatcher.recover(log_end)
        caught_up = self.dispatcher.catch_up()
        self.commitlog.load_committed(commit, self.dispatcher.max_offsets())
        if self.commitlog.damaged:
            # As leader it would have to send those entries to a follower that needs
            # them: it follows (and votes) until it is repaired (docs/disk-faults.md).
            self.core.may_campaign = False
            self.recovery.notes.append(
                f"{len(self.commitlog.damaged)} damaged committed entries: this node will "
                "not campaign for leadership until it is repaired"
            )
        if roll_back_to is not None:
            # Queues and index are cut back to the new log end (recover): make that
            # and the lower dispatch position durable before the marker goes.
            self.dispatcher.persist(self.dispatcher.snapshot())
            rollback_path.unlink()
            fsync_dir(data)
            self.recovery.notes.append(f"rolled back to entry {roll_back_to} ({ROLLBACK_FILE})")
        self.recovery.seconds = time.perf_counter() - started
        log.info(
            "node %d recovered in %.2fs after a %s: dispatch resumed at %d, re-dispatched %d "
            "messages to %d%s", cfg.node_id, self.recovery.seconds,
            "crash" if self.recovery.crashed else "clean shutdown", self.recovery.resume_pos,
            caught_up, self.dispatcher.dispatched_pos,
            "".join(f"; {n}" for n in self.recovery.notes),
        )  # fmt: skip
        self.store.snapshot_extra = self._snapshot_extra
        self.retention = Retention(cfg, self.store, self.commitlog, self.dispatcher, self.core)
        self.retention.check_disk()
        self._executor = ThreadPoolExecutor(2, thread_name_prefix=f"node{cfg.node_id}-io")
        self.security = NodeSecurity()  # what serve() loaded; PeerLinks use it from start()
        self._members = frozenset(p.id for p in cfg.peers)
        self._max_entry_bytes = max_encoded_size(cfg.max_message_bytes)
        self._links: dict[int, PeerLink] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._led_term = 0
        self._reads: dict[bytes, asyncio.Future[int]] = {}
        self._read_seq = 0
        self._closed = False
        self._last_role: tuple[Role, int, int | None] = (Role.FOLLOWER, 0, None)
        on_flush = self.metrics.observe_fsync
        self._group_commit: GroupCommit | None = None
        self._periodic: PeriodicFlush | None = None
        if self.sync_flush:
            self._group_commit = GroupCommit(
                self.store, on_flush=on_flush, name=f"node{cfg.node_id}-fsync",
                on_error=lambda exc: self._stop_on(exc, "fsync"),
            )  # fmt: skip
        else:
            # Its own thread: queued behind a checkpoint's fsyncs in the shared pool, a
            # flush came later than the interval the async mode promises as its window.
            self._periodic = PeriodicFlush(
                self.store, interval_ms=cfg.flush_interval_ms,
                on_flush=on_flush, on_error=lambda exc: self._stop_on(exc, "flush"),
            )  # fmt: skip
        self.driver = ReadyDriver(
            self.core, self.store, self.state_file, send=self._send,
            apply=self.commitlog.apply, save_hard_state=self._save_hard_state,
            restore=self._restore, read_states=self._answer_reads,
            after_ready=self._after_ready, flusher=self._group_commit,
            on_appended=self._periodic.poke if self._periodic is not None else lambda: None,
        )  # fmt: skip
        self._kick = self.driver.wakeup.set
        self.loops = NodeLoops(
            cfg.node_id, self.core, tick_ms=cfg.tick_ms, tick=self._tick, kick=self._kick,
            metrics=self.metrics,
            commitlog=self.commitlog, dispatcher=self.dispatcher, store=self.store,
            state_file=self.state_file, retention=self.retention, executor=self._executor,
            stop_on=self._stop_on, stopping=lambda: self.stopping,
            checkpointed=(commit, saved.commit), gauges=self._update_gauges,
        )  # fmt: skip
        # Delayed and transactional messages: leader-side services over the log.
        self.system_log = SystemLog(self)
        self.schedule = ScheduleService(self.system_log, parse_levels(cfg.delay_levels))
        self.schedule.on_delivered = self.metrics.scheduled_delivered.inc
        self.checks = CheckRegistry()
        self.transactions = TransactionService(
            self.system_log, self.checks, check_timeout_ms=cfg.check_timeout_ms,
            check_interval_ms=cfg.check_interval_ms, max_checks=cfg.max_checks,
        )  # fmt: skip
        self.fatal: BaseException | None = None
        # Memory and disk may disagree (a loop or a flush failed): close writes nothing.
        self.failed = False
        self.on_fatal: Callable[[], None] | None = None
        self.diverged: LogDiverged | None = None

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        if self._periodic is not None:
            self._periodic.start()
        for peer in self.cfg.peers:
            if peer.id != self.cfg.node_id:
                link = PeerLink(self.cfg.cluster, peer.id, peer.raft, me=self.cfg.node_id,
                                security=self.security)  # fmt: skip
                link.start()
                self._links[peer.id] = link
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.driver.run(), name="ready-loop"),
            *self.loops.start(),
            loop.create_task(self.schedule.run(), name="schedule"),
            loop.create_task(self.transactions.run(), name="transactions"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_done)
        log.info("node %d started: term %d, log [%d, %d], commit %d, flush %s",
                 self.cfg.node_id, self.core.term, self.store.first_index(),
                 self.store.last_index(), self.core.commit_index, self.cfg.flush_mode)  # fmt: skip

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._stop_on(task.exception(), task.get_name())

    def _stop_on(self, exc: BaseException | None, where: str) -> None:
        """A loop failed (a full disk, an I/O error): stop rather than linger half-alive.

        A node whose ready loop died would still answer RPCs but never append,
        flush or send again. From here on it takes no Raft message, does not
        tick and writes no checkpoint; close() then writes nothing more, and the
        next start recovers from disk as after a crash.
        """
        if exc is None or self.failed:
            return
        self.failed = True
        self.driver.stopped = True
        log.critical("node %d: %s failed: %s. Stopping; a restart recovers from disk "
                     "as after a crash", self.cfg.node_id, where, exc, exc_info=exc)  # fmt: skip
        if self.fatal is None:
            self.fatal = exc
        if self._closed:
            return
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.on_fatal is not None:
            self.on_fatal()

    @property
    def stopping(self) -> bool:
        """A failure or a lost committed tail: the node only waits for close()."""
        return self.failed or self.diverged is not None

    async def close(self) -> None:
        """Stop, flush what is written, checkpoint, and close the files.

        After a failure (`failed`) nothing more is flushed or checkpointed and
        the abort marker stays, so the next start recovers as after a crash.
        """
        if self._closed:
            return
        self._closed = True
        self.driver.stopped = True
        try:
            await self._shut_down()
        finally:
            self._dir_lock.release()

    async def _shut_down(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # failures: reported
        for link in self._links.values():
            await link.close()
        if self._group_commit is not None:
            await self._group_commit.close()
            self._stop_on(self._group_commit.error, "the last fsync")
        if self._periodic is not None:
            await self._periodic.close()
            self._stop_on(self._periodic.error, "the last flush")
        if self.failed:
            self._executor.shutdown(wait=True)  # a checkpoint in flight ends first
            try:
                self.dispatcher.close(clean=False)
                self.store.close()
            except OSError as exc:
                log.error("node %d: closing the files failed: %s", self.cfg.node_id, exc)
            return
        loop = asyncio.get_running_loop()
        self.dispatcher.catch_up()
        snap = self.dispatcher.snapshot()
        await loop.run_in_executor(self._executor, self.loops.checkpoint_now, snap)
        self.dispatcher.close(clean=True)
        self.store.close()
        if isinstance(self.store.on_data_flushed, FlushTrace):
            self.store.on_data_flushed.close()
        self._executor.shutdown(wait=True)

    # -- inputs --------------------------------------------------------------------

    def deliver(self, msg: Message) -> None:
        """A message from a peer; InvalidPeerMessage (nothing stepped) if it breaks the
        protocol's bounds (raft.validate) or carries an entry that is no message."""
        if self._closed or self.stopping:
            return  # it takes no Raft message (nor judges one) any more
        check_peer_message(msg, me=self.cfg.node_id, peers=self._members, term=self.core.term,
                           max_entry_bytes=self._max_entry_bytes)  # fmt: skip
        if isinstance(msg, AppendEntries):
            for e in msg.entries:
                if e.kind is EntryKind.NORMAL and not is_message(e.data):
                    raise InvalidPeerMessage(f"append from node {msg.src}: entry {e.index} "
                                             "holds no well-formed message")  # fmt: skip
        try:
            self.core.step(msg)
        except LogDiverged as exc:
            self._on_diverged(exc)
            return
        self._ensure_leader_state()
        self._kick()

    def _tick(self) -> None:
        self.core.tick()
        self._ensure_leader_state()  # a lone voter elects itself on a tick

    def _on_diverged(self, exc: LogDiverged) -> None:
        """The leader's log lacks entries we hold as committed: roll back (async) or stop."""
        self.diverged = exc
        self.driver.stopped = True
        node = self.cfg.node_id
        if self.sync_flush:
            log.critical(
                "node %d: INVARIANT VIOLATED in sync flush mode: %s. Nothing acknowledged "
                "can be lost in sync mode; stopping. Restore this node's data from a "
                "replica (or investigate the disks)", node, exc,
            )  # fmt: skip
        else:
            path = Path(self.cfg.data_dir) / ROLLBACK_FILE
            to = exc.agree
            before = read_rollback_marker(path)
            if before is not None:
                to = min(to, before)
            write_atomically(path, json.dumps({
                "roll_back_to": to, "conflict_at": exc.index, "committed": exc.committed,
                "leader": exc.leader, "term": exc.term,
            }).encode())  # fmt: skip
            log.error(
                "node %d: LOST COMMITTED ENTRIES: leader %d (term %d) has other entries than "
                "ours from entry %d, while we hold entries up to %d as committed (async "
                "flush: a power loss of a majority lost entries %d..%d, which this node may "
                "have served). Stopping; wrote %s: the next start rolls the log back to "
                "entry %d and rejoins", node, exc.leader, exc.term, exc.index, exc.committed,
                exc.index, exc.committed, path, to,
            )  # fmt: skip
        if self.fatal is None:
            self.fatal = exc
        if self.on_fatal is not None:
            self.on_fatal()

    def _propose(self, datas: list[bytes]) -> tuple[int, int, int]:
        first, last = self.core.propose(datas)
        self.metrics.batch_size.observe(len(datas))
        self._kick()
        return first, last, self.core.term

    def _ensure_leader_state(self) -> None:
        """A leadership starts: the commit log learns our uncommitted tail before any put
        is assigned queue offsets. The one place that starts one: a leadership begins
        only in `step` or `tick`, and both inputs come through here (`deliver`, `_tick`)."""
        core = self.core
        if core.role is Role.LEADER and self._led_term != core.term:
            self._led_term = core.term
            tail = core.log_slice(self.commitlog.committed_index + 1, core.last_index + 1)
            self.commitlog.become_leader(core.term, tail)
            log.info("node %d leads term %d (tail of %d uncommitted entries)",
                     self.cfg.node_id, core.term, len(tail))  # fmt: skip

    async def read_index(self, timeout_s: float) -> int:
        """A linearizable read position, confirmed by a quorum, once applied here."""
        self._read_seq += 1
        ctx = f"{self.cfg.node_id}:{self._read_seq}:{time.monotonic_ns()}".encode()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reads[ctx] = fut
        try:
            self.core.read_index(ctx)
            self._kick()
            async with asyncio.timeout(timeout_s):
                index = await fut
                while self.commitlog.committed_index < index:
                    await self.wait_for_commit()
                return index
        finally:
            self._reads.pop(ctx, None)

    async def wait_for_commit(self) -> None:
        """Return at the next commit applied here."""
        cl = self.commitlog
        await next_call(cl.add_commit_listener, cl.remove_commit_listener)

    async def transfer_leadership(self, target: int, timeout_s: float) -> int:
        self.core.transfer_leadership(target)
        self._kick()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.core.leader_id == target and self.core.role is not Role.LEADER:
                return target
            await asyncio.sleep(self.cfg.tick_ms / 1000)
        raise TimeoutError(f"leadership did not move to {target} within {timeout_s}s")

    # -- the loops -----------------------------------------------------------------

    def _snapshot_extra(self) -> bytes:
        """What a follower restored from our log needs besides it (leader side)."""
        doc = {
            "queue_next": [[t, q, n] for (t, q), n in sorted(self.commitlog.queue_next.items())],
            "offsets": [[g, t, q, o] for (g, t, q), o in sorted(self.dispatcher.offsets.items())],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    async def _restore(self, snap: SnapshotMeta) -> None:
        """Our log restarts after the leader's snapshot index: reset the store and dispatch."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.store.restore, snap.index, snap.term,
                                   snap.data)  # fmt: skip
        extra = json.loads(snap.data[BASE_SIZE:] or b"{}")
        queue_next = {(t, int(q)): int(n) for t, q, n in extra.get("queue_next", [])}
        offsets = {(g, t, int(q)): int(o) for g, t, q, o in extra.get("offsets", [])}
        self.commitlog.restart_at(snap.index, queue_next)
        self.dispatcher.reset(self.commitlog.committed_pos, offsets)
        await loop.run_in_executor(self._executor, self.loops.checkpoint_now,
                                   self.dispatcher.snapshot())  # fmt: skip
        log.warning("node %d was behind the leader's retained log: restarted after entry %d",
                    self.cfg.node_id, snap.index)  # fmt: skip

    def _after_ready(self) -> None:
        now = (self.core.role, self.core.term, self.core.leader_id)
        if now != self._last_role:
            self._last_role = now
            log.info("node %d is %s in term %d (leader: %s)", self.cfg.node_id, now[0].value,
                     now[1], now[2])  # fmt: skip
        if self.core.role is not Role.LEADER and self._reads:
            self._fail_reads_without_leader()

    def _update_gauges(self) -> None:
        m = self.metrics
        m.scheduled_backlog.set(self.schedule.backlog())
        m.pending_halves.set(self.transactions.pending)

    def _answer_reads(self, states: Sequence[ReadState]) -> None:
        for rs in states:
            fut = self._reads.get(rs.ctx)
            if fut is not None and not fut.done():
                fut.set_result(rs.index)

    async def _save_hard_state(self, hs: HardState) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.state_file.save, hs)

    async def wait_for_dispatch(self, timeout_s: float) -> bool:
        """Wait until the next dispatched batch (True) or the timeout (False)."""
        return await self.loops.wait_for_dispatch(timeout_s)

    async def wait_dispatched(self, pos: int, timeout_s: float) -> None:
        """Wait until dispatch has passed commit-log position `pos`."""
        await self.loops.wait_dispatched(pos, timeout_s)

    async def clean_now(self, force: bool) -> tuple[int, int, str]:
        """`dledger admin clean-now`: a retention pass now (`force`: whatever the age)."""
        return self.loops.clean_now(force)

    def _fail_reads_without_leader(self) -> None:
        if self.core.leader_id is None:
            for fut in self._reads.values():
                if not fut.done():
                    fut.set_exception(NotLeader(None))

    def _send(self, messages: Sequence[Message]) -> None:
        by_peer: dict[int, list[Message]] = {}
        for m in messages:
            by_peer.setdefault(m.dst, []).append(m)
        for peer, msgs in by_peer.items():
            link = self._links.get(peer)
            if link is not None:
                link.send([to_wire(m) for m in msgs])


ROLLBACK_FILE = "rollback.json"
LOCK_FILE = "lock"  # flock'ed by the running node; holds its pid


def read_rollback_marker(path: Path) -> int | None:
    """The index a rollback marker says to roll the log back to (None: no marker)."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    to = doc.get("roll_back_to") if isinstance(doc, dict) else None
    if not isinstance(to, int) or to < 0:
        raise ValueError(f"{path}: no valid roll_back_to index: {doc!r}")
    return to


FLUSH_TRACE_ENV = "DLEDGER_FLUSH_TRACE"
FLUSH_TRACE_FILE = "flush.trace"


class FlushTrace:
    """Appends the commit log's flushed position after each fsync (a test hook).

    Writes `store.flushed_position` read under a lock rather than the flush's own
    return value, so the traced sequence follows the real one even when the
    periodic flush and the checkpointer's flush finish in either order. The file
    is never fsynced: it models what reached the disk, and it only has to survive
    SIGKILL (the page cache does).
    """

    def __init__(self, path: Path, store: EntryStore) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._store = store
        self._lock = threading.Lock()

    def __call__(self, _flushed: int) -> None:
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, self._store.flushed_position.to_bytes(8, "big"))

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _ipv4(host: str) -> str:
    """The store host must be an IPv4 literal (RocketMQ's message layout)."""
    if host in ("localhost", "", "0.0.0.0"):
        return "127.0.0.1"
    parts = host.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        return host
    import socket

    return socket.gethostbyname(host)
