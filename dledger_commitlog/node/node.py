"""A node: its recovered files, its Raft core and loops, and the one surface others use.

Owns `RaftNode`. Its public methods are the node's facade (hashicorp/raft's
api.go is the model): each operation one method, documented here, and nothing
else reaches through the node. The client service (`service/`) and the leader-
side services (`messaging/`) use only these:

- leadership: `node_id`, `term`, `leader_id`, `is_leader`, `leader_client_address`,
  `leading_term`, `read_index` (a quorum-confirmed read position), `transfer_leadership`,
  `drained` and `drain` (out of elections, the leadership handed over: `drain`);
- writes: `write_refusal`, `prepare` (check and encode a `Draft`), `put` (propose
  and wait for the commit; the commit log batches concurrent puts), `submit` (the
  same, answered through a future, for callers that answer from a callback);
- reads: `committed` (the part readers are handed, `committed_reads.CommittedReads`:
  the committed log, its consume queues, the groups' offsets), `committed_pos`,
  `dispatched_pos`, `wait_dispatched`, `wait_for_dispatch`, `wait_for_commit`;
- operations: `status`, `clean_now`, `start`, `close`, `stop_on`;
- membership: `membership` (the part handed out, `members.NodeMembers`: `members`,
  `add_member`, `promote_member`, `remove_member`, `accepted`, `read_refusal`);
- the Raft peer port: `deliver` (a peer's message, validated first).

Inside: `recovery.open_log` opens and recovers the data directory; the Ready
loop is `raft.driver.ReadyDriver` (the order the Ready contract demands,
pipelined in sync flush mode); ticks, dispatch, checkpoints and retention are
`loops.NodeLoops`; peers are reached through `raftio.transport.open_link`s.

A leader whose log conflicts with entries this node holds as committed
(`raft.LogDiverged`, raised by the core's `step`) means a majority lost entries
this node recorded as committed: possible only in async flush mode, after a power
loss of a majority. In async mode the node logs it loudly, writes the rollback
marker (see `recovery`) and stops (`on_fatal`); the next start rolls back and
rejoins as a follower. In sync flush mode that conflict is an invariant
violation: the node stops without a marker (docs/disk-faults.md).

Invariants: one Ready in flight at a time; inputs (steps, proposals, ticks)
arriving meanwhile are batched into the next one; nothing the core hands out is
dropped on the floor; a leadership starts only in `step` or `tick`, and the
commit log learns its uncommitted tail before any put of it is assigned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dispatch.dispatcher import RecoveryReport
from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.log.commitlog import Draft, PutSpec
from dledger_commitlog.log.entry_records import BASE_SIZE
from dledger_commitlog.log.retention import Retention
from dledger_commitlog.log.snapshot_check import check_snapshot
from dledger_commitlog.log.snapshot_extra import decode_extra, encode_extra
from dledger_commitlog.node.committed_reads import CommittedReads
from dledger_commitlog.node.config import NodeConfig
from dledger_commitlog.node.drain import Drain
from dledger_commitlog.node.loops import NodeLoops, next_call
from dledger_commitlog.node.members import NodeMembers
from dledger_commitlog.node.metrics import NodeMetrics
from dledger_commitlog.node.read_index import ReadIndexWaiter
from dledger_commitlog.node.recovery import (
    LOCK_FILE,
    FlushTrace,
    open_log,
    report_divergence,
)
from dledger_commitlog.node.security import NodeSecurity
from dledger_commitlog.node.views import NodeState
from raft import HardState, LogDiverged, Message, NotLeader, Role
from raft.driver import ReadyDriver
from raft.messages import AppendEntries, Snapshot
from raft.types import EntryKind, ReadState, SnapshotMeta
from raft.validate import InvalidPeerMessage, check_peer_message
from raftio.multiplex import LinkPool
from raftio.wire import to_wire
from store.fileio import DirectoryLock, mkdir_durably
from store.flush import GroupCommit, PeriodicFlush
from store.message import is_message, max_encoded_size

log = logging.getLogger(__name__)
# How long a leader holds a commit-only notice (raft/driver.py): above 50 puts/s the next
# append carries the commit sooner; below that a follower's reads trail by at most this.
COMMIT_LINGER_S = 0.02


class RaftNode:
    def __init__(
        self,
        cfg: NodeConfig,
        metrics: NodeMetrics | None = None,
        *,
        security: NodeSecurity | None = None,
        on_fatal: Callable[[], None] | None = None,
        links: LinkPool | None = None,
    ) -> None:
        """Open and recover `cfg.data_dir`; `security`: what the peer links present and
        check (`NodeSecurity.load`); `on_fatal`: called once when the node stops itself
        (a failed loop, a lost committed tail): the process should then close it."""
        data = Path(cfg.data_dir)
        mkdir_durably(data)
        # One process per data directory: a second one (a node started twice) would
        # "recover" the live node's files under it.
        self._dir_lock = DirectoryLock(data / LOCK_FILE)
        try:
            self._links = links  # multi-Raft: the process's shared peer links
            self._open(cfg, metrics or NodeMetrics(cfg.node_id), data)
            self.security = security or NodeSecurity()
            self.on_fatal = on_fatal
        except BaseException:
            self._dir_lock.release()
            raise

    def _open(self, cfg: NodeConfig, metrics: NodeMetrics, data: Path) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.sync_flush = cfg.flush_mode == "sync"
        opened = open_log(cfg, data, on_proposed=self._proposed)
        self.state_file, self.store, self.core = opened.state_file, opened.store, opened.core
        self.commitlog, self.dispatcher = opened.commitlog, opened.dispatcher
        self._committed = CommittedReads(self.commitlog, self.dispatcher, cfg.cq_units_per_file)
        self.recovery: RecoveryReport = opened.recovery
        self.store.snapshot_extra = self._snapshot_extra
        self.retention = Retention(
            cfg.retention_policy(), self.store, self.commitlog, self.dispatcher, self.core
        )
        self.retention.check_disk()
        self._executor = ThreadPoolExecutor(2, thread_name_prefix=f"node{cfg.node_id}-io")
        self._max_entry_bytes = max_encoded_size(cfg.max_message_bytes)
        self._tasks: list[asyncio.Task[None]] = []
        self._led_term = 0
        self._closed = False
        self._last_role: tuple[Role, int, int | None] = (Role.FOLLOWER, 0, None)
        self._group_commit: GroupCommit | None = None
        self._periodic: PeriodicFlush | None = None
        if self.sync_flush:
            self._group_commit = GroupCommit(
                self.store,
                on_flush=metrics.observe_fsync,
                name=f"node{cfg.node_id}-fsync",
                on_error=lambda exc: self.stop_on(exc, "fsync"),
            )
        else:
            # Its own thread: queued behind a checkpoint's fsyncs in the shared pool, a
            # flush came later than the interval the async mode promises as its window.
            self._periodic = PeriodicFlush(
                self.store,
                interval_ms=cfg.flush_interval_ms,
                on_flush=metrics.observe_fsync,
                on_error=lambda exc: self.stop_on(exc, "flush"),
            )
        self.driver = ReadyDriver(
            self.core,
            self.store,
            self.state_file,
            send=self._send,
            apply=self.commitlog.apply,
            save_hard_state=self._save_hard_state,
            restore=self._restore,
            read_states=self._answer_reads,
            after_ready=self._after_ready,
            flusher=self._group_commit,
            on_appended=self._periodic.poke if self._periodic is not None else lambda: None,
            defer=lambda later: asyncio.get_running_loop().call_later(COMMIT_LINGER_S, later),
        )
        self._kick = self.driver.wakeup.set
        self._drain = Drain(
            self.core,
            drained=cfg.drained,
            damaged=lambda: bool(self.commitlog.damaged),
            transfer=self.transfer_leadership,
            election_timeout_s=cfg.tick_ms * cfg.election_ticks / 1000,
            tick_s=cfg.tick_ms / 1000,
        )
        self._read_index = ReadIndexWaiter(
            cfg.node_id, self.core, self._kick, self.wait_for_commit, self._committed_index
        )
        self._members = NodeMembers(
            cfg,
            self.core,
            kick=self._kick,
            wait_for_commit=self.wait_for_commit,
            committed_index=self._committed_index,
            links=self._links,
        )
        self.loops = NodeLoops(
            cfg.node_id,
            self.core,
            tick_ms=cfg.tick_ms,
            tick=self._tick,
            kick=self._kick,
            metrics=metrics,
            commitlog=self.commitlog,
            dispatcher=self.dispatcher,
            store=self.store,
            state_file=self.state_file,
            retention=self.retention,
            executor=self._executor,
            stop_on=self.stop_on,
            stopping=lambda: self.stopping,
            checkpointed=opened.checkpointed,
        )
        self._fatal: BaseException | None = None
        # Memory and disk may disagree (a loop or a flush failed): close writes nothing.
        self.failed = False
        self.diverged: LogDiverged | None = None

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Connect to the peers and start the Ready loop and the background loops."""
        if self._periodic is not None:
            self._periodic.start()
        self._members.start(self.security)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.driver.run(), name="ready-loop"), *self.loops.start()]
        for task in self._tasks:
            task.add_done_callback(self._task_done)
        log.info(
            "node %d started: term %d, log [%d, %d], commit %d, flush %s",
            self.cfg.node_id,
            self.core.term,
            self.store.first_index(),
            self.store.last_index(),
            self.core.commit_index,
            self.cfg.flush_mode,
        )

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.stop_on(task.exception(), task.get_name())

    def stop_on(self, exc: BaseException | None, where: str) -> None:
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
        log.critical(
            "node %d: %s failed: %s. Stopping; a restart recovers from disk as after a crash",
            self.cfg.node_id,
            where,
            exc,
            exc_info=exc,
        )
        if self._fatal is None:
            self._fatal = exc
        if self._closed:
            return
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.on_fatal is not None:
            self.on_fatal()

    @property
    def fatal(self) -> BaseException | None:
        """What stopped the node (None: nothing did; it runs or closed cleanly)."""
        return self._fatal

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
        await self._members.close()
        if self._group_commit is not None:
            await self._group_commit.close()
            self.stop_on(self._group_commit.error, "the last fsync")
        if self._periodic is not None:
            await self._periodic.close()
            self.stop_on(self._periodic.error, "the last flush")
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

    # -- the Raft peer port --------------------------------------------------------

    def deliver(self, msg: Message) -> None:
        """A message from a peer; InvalidPeerMessage (nothing stepped) if it breaks the
        protocol's bounds (raft.validate) or carries an entry that is no message."""
        if self._closed or self.stopping:
            return  # it takes no Raft message (nor judges one) any more
        check_peer_message(
            msg,
            me=self.cfg.node_id,
            peers=self._members.accepted,
            term=self.core.term,
            max_entry_bytes=self._max_entry_bytes,
        )
        if isinstance(msg, AppendEntries):
            for e in msg.entries:
                if e.kind is EntryKind.NORMAL and not is_message(e.data):
                    raise InvalidPeerMessage(
                        f"append from node {msg.src}: entry {e.index} holds no well-formed message"
                    )
        elif isinstance(msg, Snapshot):
            check_snapshot(msg)  # its description, before it can reach the store
        try:
            self.core.step(msg)
        except LogDiverged as exc:
            self._on_diverged(exc)
            return
        self._members.heard(msg)
        self._ensure_leader_state()
        self._kick()

    def _tick(self) -> None:
        self.core.tick()
        self._ensure_leader_state()  # a lone voter elects itself on a tick

    def _on_diverged(self, exc: LogDiverged) -> None:
        """The leader's log lacks entries we hold as committed: roll back (async) or stop."""
        self.diverged = exc
        self.driver.stopped = True
        report_divergence(self.cfg, exc)
        if self._fatal is None:
            self._fatal = exc
        if self.on_fatal is not None:
            self.on_fatal()

    def _proposed(self, count: int) -> None:
        """The commit log proposed a batch of `count` puts: the Ready loop has work."""
        self.metrics.batch_size.observe(count)
        self._kick()

    def _ensure_leader_state(self) -> None:
        """A leadership starts: the commit log learns our uncommitted tail before any put
        is assigned queue offsets. The one place that starts one: a leadership begins
        only in `step` or `tick`, and both inputs come through here (`deliver`, `_tick`)."""
        core = self.core
        if core.role is Role.LEADER and self._led_term != core.term:
            self._led_term = core.term
            tail = core.log_slice(self.commitlog.committed_index + 1, core.last_index + 1)
            self.commitlog.become_leader(core.term, tail)
            log.info(
                "node %d leads term %d (tail of %d uncommitted entries)",
                self.cfg.node_id,
                core.term,
                len(tail),
            )

    # -- the facade: leadership ------------------------------------------------------

    @property
    def node_id(self) -> int:
        """This node's id."""
        return self.cfg.node_id

    @property
    def term(self) -> int:
        """The current Raft term (for logs; `status()` has the rest)."""
        return self.core.term

    @property
    def leader_id(self) -> int | None:
        """The leader this node knows (None: none known, an election may be under way)."""
        return self.core.leader_id

    def is_leader(self) -> bool:
        """Whether this node leads now (only the leader takes puts)."""
        return self.core.role is Role.LEADER

    def leading_term(self) -> int | None:
        """The term this node leads in, or None (a stopping node leads nothing)."""
        core = self.core
        return core.term if core.role is Role.LEADER and not self.stopping else None

    def leader_client_address(self) -> str | None:
        """The client address of the leader this node knows (None: none known)."""
        leader = self.core.leader_id
        m = None if leader is None else self._members.member(leader)
        return None if m is None else m.client

    async def read_index(self, timeout_s: float) -> int:
        """A read position confirmed by a quorum, once applied here (NotLeader, TimeoutError)."""
        return await self._read_index.ask(timeout_s)

    async def transfer_leadership(self, target: int, timeout_s: float) -> int:
        """Hand leadership to `target`; its id once it leads (TimeoutError)."""
        if target == self.cfg.node_id and self.core.role is Role.LEADER:
            return target  # it leads already (`dledger transfer-leader --to` the leader)
        self.core.transfer_leadership(target)
        self._kick()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.core.leader_id == target and self.core.role is not Role.LEADER:
                return target
            if self.core.role is Role.LEADER and self.core.lead_transferee is None:
                break  # the core gave the transfer up (an election timeout passed)
            await asyncio.sleep(self.cfg.tick_ms / 1000)
        raise TimeoutError(
            f"leadership did not move to {target} (given up, or not in {timeout_s}s)"
        )

    @property
    def drained(self) -> bool:
        """Whether this node is drained in this shard: it campaigns for nothing and
        takes no leadership (`drain`)."""
        return self._drain.drained

    async def drain(self, drained: bool, timeout_s: float, dry_run: bool = False) -> bool:
        """Drain (`drained`) or undrain this node in this shard; a drained leader hands
        over first (True: it did). DrainRefused (nothing changed), TimeoutError."""
        return await self._drain.drain(drained, timeout_s, dry_run)

    # -- the facade: membership --------------------------------------------------------

    @property
    def membership(self) -> NodeMembers:
        """The part membership callers are handed: the members, changes of them, whose
        messages this node takes, and why it serves no read now (joining, removed)."""
        return self._members

    # -- the facade: writes ------------------------------------------------------------

    @property
    def write_refusal(self) -> str | None:
        """Why puts are refused now (a disk too full), None when they are not."""
        return self.retention.refusal

    def prepare(self, draft: Draft) -> PutSpec:
        """A put checked and encoded once (InvalidMessage with the reason)."""
        return self.commitlog.prepare(draft)

    def put(
        self, specs: Sequence[PutSpec], timeout_s: float
    ) -> Coroutine[Any, Any, list[PutResult]]:
        """Propose `specs` (batched with concurrent puts) and wait for their commit
        (NotLeader, Overloaded, OutcomeUnknown, PutFailed). Returns the commit log's own
        coroutine: no frame of ours between the caller and the put path."""
        return self.commitlog.put(specs, timeout_s)

    def submit(
        self, specs: Sequence[PutSpec], timeout_s: float, done: asyncio.Future[list[PutResult]]
    ) -> None:
        """`put` answered through `done`, no task per put (Overloaded raised at once)."""
        self.commitlog.submit(specs, timeout_s, done)

    # -- the facade: the committed log, its queues and groups' offsets ----------------

    @property
    def committed(self) -> CommittedReads:
        """The part readers are handed: the committed log, its queues, groups' offsets."""
        return self._committed

    @property
    def committed_pos(self) -> int:
        """End of the committed prefix: no read reaches it."""
        return self.commitlog.committed_pos

    @property
    def dispatched_pos(self) -> int:
        """Commit-log position up to which the consume queues and key index are built."""
        return self.dispatcher.dispatched_pos

    async def wait_dispatched(self, pos: int, timeout_s: float) -> None:
        """Wait until dispatch has passed commit-log position `pos` (TimeoutError)."""
        await self.loops.wait_dispatched(pos, timeout_s)

    async def wait_for_dispatch(self, timeout_s: float) -> bool:
        """Wait until the next dispatched batch (True) or the timeout (False)."""
        return await self.loops.wait_for_dispatch(timeout_s)

    async def wait_for_commit(self) -> None:
        """Return at the next commit applied here."""
        await next_call(self.commitlog.add_commit_listener, self.commitlog.remove_commit_listener)

    # -- the facade: operations --------------------------------------------------------

    def status(self) -> NodeState:
        """The node's Raft and store positions now (`dledger status`)."""
        core, store, cl = self.core, self.store, self.commitlog
        return NodeState(
            role=core.role,
            term=core.term,
            leader_id=core.leader_id,
            leader_client_address=self.leader_client_address(),
            first_index=store.first_index(),
            last_index=store.last_index(),
            committed_index=cl.committed_index,
            committed_pos=cl.committed_pos,
            flushed_pos=store.flushed_position,
            dispatched_pos=self.dispatcher.dispatched_pos,
            last_chain_crc=store.last_chain_crc,
            progress=core.progress,
            drained=self._drain.drained,
        )

    async def clean_now(self, force: bool) -> tuple[int, int, str]:
        """`dledger admin clean-now`: a retention pass now (`force`: whatever the age),
        after a checkpoint (off the loop): retention deletes only what dispatch has
        recorded durably, and "now" includes what was dispatched a moment ago."""
        loop = asyncio.get_running_loop()
        snap = self.dispatcher.snapshot()
        await loop.run_in_executor(self._executor, self.loops.checkpoint_now, snap)
        return self.loops.clean_now(force)

    # -- the Ready driver's callbacks ---------------------------------------------------

    def _snapshot_extra(self) -> bytes:
        """What a follower restored from our log needs besides it (leader side)."""
        return encode_extra(self.commitlog.queue_next, self.dispatcher.offsets)

    async def _restore(self, snap: SnapshotMeta) -> None:
        """Our log restarts after the leader's snapshot index: reset the store and dispatch."""
        loop = asyncio.get_running_loop()
        extra = decode_extra(snap.data[BASE_SIZE:])  # checked by deliver: a failure is a fault
        await loop.run_in_executor(
            self._executor, self.store.restore, snap.index, snap.term, snap.data
        )
        self.commitlog.restart_at(snap.index, extra.queue_next)
        self.dispatcher.reset(self.commitlog.committed_pos, extra.offsets)
        await loop.run_in_executor(
            self._executor, self.loops.checkpoint_now, self.dispatcher.snapshot()
        )
        log.warning(
            "node %d was behind the leader's retained log: restarted after entry %d",
            self.cfg.node_id,
            snap.index,
        )

    def _after_ready(self) -> None:
        self._members.sync()
        now = (self.core.role, self.core.term, self.core.leader_id)
        if now != self._last_role:
            self._last_role = now
            log.info(
                "node %d is %s in term %d (leader: %s)",
                self.cfg.node_id,
                now[0].value,
                now[1],
                now[2],
            )
        if self.core.role is not Role.LEADER and self.core.leader_id is None:
            self._read_index.fail_all(NotLeader(None))

    def _answer_reads(self, states: Sequence[ReadState]) -> None:
        self._read_index.answer(states)

    def _committed_index(self) -> int:
        return self.commitlog.committed_index

    async def _save_hard_state(self, hs: HardState) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.state_file.save, hs)

    def _send(self, messages: Sequence[Message]) -> None:
        if self._drain.waiting:
            self._drain.sent(messages)
        by_peer: dict[int, list[Message]] = {}
        for m in messages:
            by_peer.setdefault(m.dst, []).append(m)
        links = self._members.links
        for peer, msgs in by_peer.items():
            link = links.get(peer)
            if link is not None:
                link.send([to_wire(m) for m in msgs])
