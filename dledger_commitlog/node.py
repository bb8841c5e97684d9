"""The node driver: one asyncio loop that owns the Raft core, its log and its I/O.

Owns the order the Ready contract demands: append entries (page cache or the
write buffer), fsync the hard state when term or vote changed, fsync entries in
sync flush mode (group commit, off the loop), and only then send the messages
that promise them, apply committed entries, `advance`. One exception, safe in
Raft: a leader whose term and vote are already durable sends its appends and
heartbeats before its own fsync, so replication overlaps the leader's disk.

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

Wall-clock time reaches the core only here, as ticks every `tick_ms`.
Randomness is a `random.Random` seeded from the OS. Invariants: one Ready in
flight at a time; inputs (steps, proposals, ticks) arriving meanwhile are
batched into the next one; nothing the core hands out is dropped on the floor.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dispatch.dispatcher import Dispatcher, DispatchSnapshot
from raft import Config, HardState, LogDiverged, Message, NotLeader, RaftCore, Ready, Role
from raft.messages import AppendEntries, Heartbeat
from raft.types import EntryKind, SnapshotMeta
from raft.validate import InvalidPeerMessage, check_peer_message
from store.fileio import DirectoryLock, fsync_dir, mkdir_durably, write_atomically
from store.flush import GroupCommit, PeriodicFlush
from store.message import is_message, max_encoded_size

from .commitlog import DLedgerCommitLog
from .config import ConfigError, NodeConfig, parse_address
from .entry_store import BASE_SIZE, EntryStore
from .metrics import NodeMetrics
from .raft_state import RaftStateFile
from .retention import Retention
from .security import NodeSecurity
from .transport import PeerLink, to_wire
from .verify import LAYOUT_FILE, read_layout, write_layout

log = logging.getLogger(__name__)

_SYNC_WRITE_BUFFER = 4 << 20
_CHECKPOINT_INTERVAL_S = 1.0
_RETENTION_INTERVAL_S = 10.0


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


class RaftNode:
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
        self.commitlog.before_assign = self._ensure_leader_state
        self.retention = Retention(cfg, self.store, self.commitlog, self.dispatcher, self.core)
        self.retention.check_disk()
        self._dispatch_wakeup = asyncio.Event()
        self.commitlog.add_commit_listener(self._dispatch_wakeup.set)
        self._executor = ThreadPoolExecutor(2, thread_name_prefix=f"node{cfg.node_id}-io")
        self.security = NodeSecurity()  # what serve() loaded; PeerLinks use it from start()
        self._members = frozenset(p.id for p in cfg.peers)
        self._max_entry_bytes = max_encoded_size(cfg.max_message_bytes)
        self._links: dict[int, PeerLink] = {}
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._led_term = 0
        self._reads: dict[bytes, asyncio.Future[int]] = {}
        self._read_seq = 0
        self._group_commit: GroupCommit | None = None
        # Sync flush: appended but not yet durable (end position, last index, term),
        # and messages held until the position they follow is durable.
        self._unflushed: collections.deque[tuple[int, int, int]] = collections.deque()
        self._held: collections.deque[tuple[int, Sequence[Message]]] = collections.deque()
        self._periodic: PeriodicFlush | None = None
        self._closed = False
        self._last_role: tuple[Role, int, int | None] = (Role.FOLLOWER, 0, None)
        self._checkpointed = (commit, saved.commit)
        self._checkpoint_lock = threading.Lock()
        self.fatal: BaseException | None = None
        # Memory and disk may disagree (a loop or a flush failed): close writes nothing.
        self.failed = False
        self.on_fatal: Callable[[], None] | None = None
        self.diverged: LogDiverged | None = None

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        on_flush = self.metrics.observe_fsync
        if self.sync_flush:
            self._group_commit = GroupCommit(
                self.store, on_flush=on_flush, name=f"node{self.cfg.node_id}-fsync",
                on_error=lambda exc: self._stop_on(exc, "fsync"),
            )  # fmt: skip
            self._group_commit.add_listener(self._on_durable)
        else:
            self._periodic = PeriodicFlush(
                self.store,
                interval_ms=self.cfg.flush_interval_ms,
                executor=self._executor,
                on_flush=on_flush,
                on_error=lambda exc: self._stop_on(exc, "flush"),
            )
            self._periodic.start()
        for peer in self.cfg.peers:
            if peer.id != self.cfg.node_id:
                link = PeerLink(self.cfg.cluster, peer.id, peer.raft, me=self.cfg.node_id,
                                security=self.security)  # fmt: skip
                link.start()
                self._links[peer.id] = link
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._ready_loop(), name="ready-loop"),
            loop.create_task(self._tick_loop(), name="tick-loop"),
            loop.create_task(self._checkpoint_loop(), name="checkpoint-loop"),
            loop.create_task(self._dispatch_loop(), name="dispatch-loop"),
            loop.create_task(self._retention_loop(), name="retention-loop"),
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
        await loop.run_in_executor(self._executor, self._checkpoint_now, snap)
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
        self._wakeup.set()

    def _on_diverged(self, exc: LogDiverged) -> None:
        """The leader's log lacks entries we hold as committed: roll back (async) or stop."""
        self.diverged = exc
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
        self._ensure_leader_state()
        first, last = self.core.propose(datas)
        self.metrics.batch_size.observe(len(datas))
        self._wakeup.set()
        return first, last, self.core.term

    def _ensure_leader_state(self) -> None:
        """On the first use of a new leadership: the commit log learns our uncommitted tail."""
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
            self._wakeup.set()
            async with asyncio.timeout(timeout_s):
                index = await fut
                while self.commitlog.committed_index < index:
                    await self.wait_for_commit()
                return index
        finally:
            self._reads.pop(ctx, None)

    async def wait_for_commit(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not fut.done():
                fut.set_result(None)

        self.commitlog.add_commit_listener(done)
        try:
            await fut
        finally:
            self.commitlog.remove_commit_listener(done)

    async def transfer_leadership(self, target: int, timeout_s: float) -> int:
        self.core.transfer_leadership(target)
        self._wakeup.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.core.leader_id == target and self.core.role is not Role.LEADER:
                return target
            await asyncio.sleep(self.cfg.tick_ms / 1000)
        raise TimeoutError(f"leadership did not move to {target} within {timeout_s}s")

    # -- the loops -----------------------------------------------------------------

    async def _tick_loop(self) -> None:
        interval = self.cfg.tick_ms / 1000
        next_at = time.monotonic()
        while True:
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if self.stopping:
                return  # it must not campaign meanwhile
            self.core.tick()
            self._wakeup.set()
            self.metrics.update_role(self.core)

    async def _ready_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self.core.has_ready():
                await self._handle_ready(self.core.ready())

    async def _handle_ready(self, rd: Ready) -> None:
        """Carry out one Ready (raft/ready.py), pipelined in sync flush mode.

        Entries go to the store (the write buffer) and an fsync covering them is
        requested from the flusher thread, but not awaited: the loop goes on
        stepping, proposing and appending while it runs. What promises durability
        (a follower's acknowledgement, anything after it to the same peers) is
        held until the covering fsync completes (`_on_durable`), which also tells
        the core (`persisted`); only durable entries are applied. A leader whose
        term and vote are durable sends its appends and heartbeats at once, so
        replication overlaps its own fsync. A changed term or vote is saved and
        fsynced before anything of this Ready is sent (elections only); an append
        that replaces a suffix first waits until nothing is in flight, so that no
        fsync covers bytes the truncation rewrites.
        """
        core = self.core
        gc = self._group_commit
        if rd.snapshot is not None:
            await self._settle()
            await self._restore(rd.snapshot)
        if rd.entries:
            if gc is not None and rd.entries[0].index <= self.store.last_index():
                await self._settle()
            self.store.append_entries(rd.entries)
        hs = rd.hard_state
        if hs is not None and self.state_file.needs_sync(hs):
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self.state_file.save, hs
            )
        if rd.entries:
            last = rd.entries[-1]
            if gc is not None:
                # Requested before anything is sent and with no await until advance():
                # the core hears `persisted` only for entries it has handed out.
                self._unflushed.append((self.store.write_position, last.index, last.term))
                gc.request(self.store.write_position)
            elif self._periodic is not None:
                self._periodic.poke()
        if core.role is Role.LEADER:
            early: list[Message] = []
            late: list[Message] = []
            for m in rd.messages:
                (early if isinstance(m, AppendEntries | Heartbeat) else late).append(m)
            self._send(early)
            self._send_when_durable(late)
        else:
            self._send_when_durable(rd.messages)
        if rd.committed_entries:
            self.commitlog.apply(rd.committed_entries)
        for rs in rd.read_states:
            fut = self._reads.get(rs.ctx)
            if fut is not None and not fut.done():
                fut.set_result(rs.index)
        core.advance(rd)
        self._log_role_change()
        self._ensure_leader_state()
        if core.role is not Role.LEADER and self._reads:
            self._fail_reads_without_leader()

    def _send_when_durable(self, messages: Sequence[Message]) -> None:
        """Send now if nothing appended waits for its fsync, else after that fsync."""
        if not messages:
            return
        gc = self._group_commit
        if gc is None or not (self._held or self._unflushed):
            self._send(messages)
        else:
            # Behind everything written so far (and behind messages already held, so
            # what one peer gets keeps its order).
            self._held.append((self.store.write_position, messages))

    def _on_durable(self, flushed: int) -> None:
        """The flusher made the store durable up to `flushed` (on the loop)."""
        if self._closed or self.stopping:
            return
        unflushed, held = self._unflushed, self._held
        reported = False
        while unflushed and unflushed[0][0] <= flushed:
            _, index, term = unflushed.popleft()
            self.core.persisted(index, term)
            reported = True
        while held and held[0][0] <= flushed:
            self._send(held.popleft()[1])
        if reported:
            self._wakeup.set()

    async def _settle(self) -> None:
        """Wait until everything written is durable and every held message sent."""
        if self._group_commit is not None and (self._unflushed or self._held):
            await self._group_commit.sync(self.store.write_position)
            self._on_durable(self.store.flushed_position)

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
        await loop.run_in_executor(self._executor, self._checkpoint_now, self.dispatcher.snapshot())
        log.warning("node %d was behind the leader's retained log: restarted after entry %d",
                    self.cfg.node_id, snap.index)  # fmt: skip

    def _log_role_change(self) -> None:
        now = (self.core.role, self.core.term, self.core.leader_id)
        if now != self._last_role:
            self._last_role = now
            log.info("node %d is %s in term %d (leader: %s)", self.cfg.node_id, now[0].value,
                     now[1], now[2])  # fmt: skip

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

    async def _dispatch_loop(self) -> None:
        """Dispatch committed messages in batches as the commit position advances."""
        dispatcher, wakeup = self.dispatcher, self._dispatch_wakeup
        while True:
            await wakeup.wait()
            wakeup.clear()
            try:
                more = dispatcher.dispatch_batch()
            except Exception as exc:
                # A unit that conflicts with the queue, a message that does not
                # decode, a failed write: stop rather than serve wrong data.
                self._stop_on(exc, f"dispatch at {dispatcher.dispatched_pos}")
                return
            if more:
                wakeup.set()  # more may be committed: another batch after others ran
                await asyncio.sleep(0)

    async def wait_for_dispatch(self, timeout_s: float) -> bool:
        """Wait until the next dispatched batch (True) or the timeout (False)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not fut.done():
                fut.set_result(None)

        self.dispatcher.add_listener(done)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            self.dispatcher.remove_listener(done)

    async def wait_dispatched(self, pos: int, timeout_s: float) -> None:
        """Wait until dispatch has passed commit-log position `pos`."""
        async with asyncio.timeout(timeout_s):
            while self.dispatcher.dispatched_pos < pos:
                await self.wait_for_dispatch(timeout_s)

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(_RETENTION_INTERVAL_S)
            try:
                self.retention.run_pass()
            except OSError as exc:
                log.error("node %d: retention pass failed: %s", self.cfg.node_id, exc)

    async def clean_now(self, force: bool) -> tuple[int, int, str]:
        """`dledger admin clean-now`: a retention pass now (`force`: whatever the age)."""
        out = self.retention.run_pass(forced=True, ignore_age=force)
        return out.deleted_segments, out.min_offset, out.reason

    async def _checkpoint_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_CHECKPOINT_INTERVAL_S)
            self.metrics.update_replication(self.core)
            snap = self.dispatcher.snapshot()
            await loop.run_in_executor(self._executor, self._checkpoint_now, snap)

    def _checkpoint_now(self, snap: DispatchSnapshot) -> None:
        """Record the applied index, then what dispatch covers (off-loop).

        The raft state's commit index goes first, so that at restart the node's
        committed prefix covers everything the dispatch checkpoint says was dispatched.
        """
        with self._checkpoint_lock:  # the loop's pass may still run when close() checkpoints
            applied = self.commitlog.committed_index
            if (applied, self.core.commit_index) != self._checkpointed:
                if applied >= self.store.first_index():
                    self.store.write_checkpoint(applied)
                self.state_file.save_commit(applied)
                self._checkpointed = (applied, self.core.commit_index)
            self.dispatcher.persist(snap)

    # -- views -----------------------------------------------------------------------

    def leader_client_address(self) -> str | None:
        leader = self.core.leader_id
        for p in self.cfg.peers:
            if p.id == leader:
                return p.client
        return None


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


def run(cfg: NodeConfig) -> None:
    """Serve until SIGTERM/SIGINT (the `dledger serve` entry point)."""
    from .service import run as run_service

    run_service(cfg)
