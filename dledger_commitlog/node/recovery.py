"""Opening a node's data directory: its files checked, recovered and reconciled.

Owns `open_log`, the order a start goes through before the node serves anything:
the layout check (`layout.json`: settings that fix where records lie cannot
change), the rollback marker, the entry store (recovery cuts a torn or corrupt
tail), the Raft core on it, the commit log's committed view, and the dispatcher
(consume queues and key index cut back to the checkpoint, then caught up). Also
the rollback marker's file (`write_rollback_marker`) and the test hook that
traces flushed positions (`FlushTrace`).

A log that recovery had to cut below what this node knew was committed (a
corrupt entry above the entry checkpoint, see EntryStore) starts the core with
`catch_up_to`: in sync flush mode the node neither votes nor campaigns until
the leader has replicated those entries back (an entry it had fsynced may have
been counted for a commit). In async flush mode it does not: a power loss of a
majority loses the unflushed tail everywhere, and gating every node would leave
the cluster without a leader for good (docs/disk-faults.md).

A rollback marker (`rollback.json`, written when a leader's log conflicted with
entries this node held as committed, async flush only) makes the start cut the
log there, even below the entry checkpoint: raft.state's commit index is lowered
first (a crash before the cut repeats the rollback), the dispatcher cuts consume
queues and key index back to the new log end, that is made durable, and only
then the marker goes.

Test hook: with DLEDGER_FLUSH_TRACE=1 in the environment, every successful fsync
of the commit-log data appends the flushed position (8 bytes, big-endian) to
`<data_dir>/flush.trace`, unsynced: chaos.disk.power_loss reads it to drop what
never reached the disk.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dispatch.dispatcher import Dispatcher, RecoveryReport
from dledger_commitlog.log.commitlog import DLedgerCommitLog
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.message_layout import shard_port
from dledger_commitlog.log.verify import LAYOUT_FILE, read_layout, write_layout
from dledger_commitlog.node.config import ConfigError, NodeConfig, parse_address
from raft import Config, LogDiverged, RaftCore
from raftio.hard_state import RaftStateFile
from store.fileio import fsync_dir, write_atomically

log = logging.getLogger(__name__)

ROLLBACK_FILE = "rollback.json"
LOCK_FILE = "lock"  # flock'ed by the running node; holds its pid
FLUSH_TRACE_ENV = "DLEDGER_FLUSH_TRACE"
FLUSH_TRACE_FILE = "flush.trace"
# Sync flush buffers appends until the fsync thread writes them. A buffer that fills
# is written by the appender, on the event loop: a follower catching up appends ~10 MB
# per Ready, and at 4 MiB its loop spent 12% of its time in pwrite (perf,
# bench/catch_up.py); at 32 MiB the fsync thread writes it, beside the loop.
_SYNC_WRITE_BUFFER = 32 << 20


@dataclass(slots=True)
class OpenedLog:
    """A data directory, opened and recovered: what the node is built on."""

    state_file: RaftStateFile
    store: EntryStore
    core: RaftCore
    commitlog: DLedgerCommitLog
    dispatcher: Dispatcher
    recovery: RecoveryReport
    checkpointed: tuple[int, int]  # (applied index, raft.state's commit) as found


def open_log(cfg: NodeConfig, data: Path, on_proposed: Callable[[int], None]) -> OpenedLog:
    """Open and recover `data` (see the module's docstring); `on_proposed(count)` is
    called after each batch of puts the commit log proposes."""
    started = time.perf_counter()
    layout = store_layout(cfg)
    check_layout(data, layout)  # before anything is opened: a changed layout corrupts
    write_layout(data, layout)  # before the store: a new store always has its layout
    state_file = RaftStateFile(data / "raft.state")
    sync_flush = cfg.flush_mode == "sync"
    rollback_path = data / ROLLBACK_FILE
    roll_back_to = read_rollback_marker(rollback_path)
    if roll_back_to is not None:
        # Commit index first: a crash before the log cut then repeats the rollback.
        state_file.lower_commit(roll_back_to)
    saved = state_file.saved
    store = EntryStore(
        data / "commitlog",
        data_segment_bytes=cfg.data_segment_bytes,
        index_segment_bytes=cfg.index_segment_bytes,
        committed_index=saved.commit,
        write_buffer_bytes=_SYNC_WRITE_BUFFER if sync_flush else 0,
    )
    if roll_back_to is not None:
        log.error(
            "node %d: rollback marker %s: rolling the log back from entry %d to "
            "entry %d (entries the cluster lost after a power loss)",
            cfg.node_id,
            rollback_path,
            store.last_index(),
            roll_back_to,
        )
        store.roll_back_to(roll_back_to)
    if os.environ.get(FLUSH_TRACE_ENV) == "1":
        store.on_data_flushed = FlushTrace(data / FLUSH_TRACE_FILE, store)
    commit = min(saved.commit, store.last_index())
    missing = store.missing_through
    catch_up_to = missing if sync_flush else 0
    if missing:
        log.warning(
            "node %d: its log ends at entry %d but entries up to %d may be committed; %s",
            cfg.node_id,
            store.last_index(),
            missing,
            "it stays out of elections until the leader has replicated them again"
            if catch_up_to
            else "async flush: they are lost here unless a peer has them",
        )
    core = RaftCore(
        raft_config(cfg),
        store,
        dataclasses.replace(saved, commit=commit),
        rng=random.Random(int.from_bytes(os.urandom(8))),
        applied=commit,
        catch_up_to=catch_up_to,
    )
    host, port = parse_address(cfg.client_address)  # with the shard: message ids name it
    commitlog = DLedgerCommitLog(
        store,
        store_host=(_ipv4(host), shard_port(port, cfg.shard)),
        queues_per_topic=cfg.queues_per_topic,
        max_message_bytes=cfg.max_message_bytes,
        max_pending=cfg.max_pending_puts,
        idempotency_window=cfg.idempotency_window,
        core=core,
        on_proposed=on_proposed,
    )
    commitlog.start_at(commit)
    dispatcher = Dispatcher(
        data,
        commitlog,
        units_per_file=cfg.cq_units_per_file,
        index_slots=cfg.index_slots,
        index_entries=cfg.index_entries,
    )
    log_end = (
        sum(store.locate(store.last_index()))
        if store.last_index() >= store.first_index()
        else commitlog.min_pos
    )
    recovery = dispatcher.recover(log_end)
    caught_up = dispatcher.catch_up()
    commitlog.load_committed(commit, dispatcher.max_offsets())
    if commitlog.damaged:
        # As leader it would have to send those entries to a follower that needs
        # them: it follows (and votes) until it is repaired (docs/disk-faults.md).
        core.may_campaign = False
        recovery.notes.append(
            f"{len(commitlog.damaged)} damaged committed entries: this node will "
            "not campaign for leadership until it is repaired"
        )
    if roll_back_to is not None:
        # Queues and index are cut back to the new log end (recover): make that
        # and the lower dispatch position durable before the marker goes.
        dispatcher.persist(dispatcher.snapshot())
        rollback_path.unlink()
        fsync_dir(data)
        recovery.notes.append(f"rolled back to entry {roll_back_to} ({ROLLBACK_FILE})")
    recovery.seconds = time.perf_counter() - started
    log.info(
        "node %d recovered in %.2fs after a %s: dispatch resumed at %d, re-dispatched %d "
        "messages to %d%s",
        cfg.node_id,
        recovery.seconds,
        "crash" if recovery.crashed else "clean shutdown",
        recovery.resume_pos,
        caught_up,
        dispatcher.dispatched_pos,
        "".join(f"; {n}" for n in recovery.notes),
    )
    return OpenedLog(
        state_file, store, core, commitlog, dispatcher, recovery, (commit, saved.commit)
    )


def raft_config(cfg: NodeConfig) -> Config:
    """The Raft core's settings, from the node's. A fresh group's first leader is its
    preferred one, else its lowest bootstrap id: that node campaigns at once."""
    peers = tuple(p.id for p in cfg.peers)
    first = cfg.preferred_leader if cfg.preferred_leader is not None else min(peers)
    return Config(
        id=cfg.node_id,
        peers=peers,
        election_ticks=cfg.election_ticks,
        heartbeat_ticks=cfg.heartbeat_ticks,
        max_append_entries=cfg.max_append_entries,
        max_append_bytes=cfg.max_append_bytes,
        max_inflight_msgs=cfg.max_inflight_msgs,
        max_inflight_bytes=max(cfg.max_append_bytes, 64 << 20),
        async_storage_writes=cfg.flush_mode == "sync",
        check_quorum=True,
        pre_vote=True,
        preferred_leader=cfg.preferred_leader,
        join=cfg.join,
        eager_campaign=cfg.node_id == first,
        catch_up_bytes_per_tick=int(cfg.catch_up_mb_s * 1e6 * cfg.tick_ms / 1000),
    )


def store_layout(cfg: NodeConfig) -> dict[str, int]:
    """The settings that shape a store's files (recorded in its layout file)."""
    names = (
        "data_segment_bytes",
        "index_segment_bytes",
        "cq_units_per_file",
        "index_slots",
        "index_entries",
    )
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


def write_rollback_marker(path: Path, doc: dict[str, int]) -> int:
    """Write the marker `doc` (its `roll_back_to` lowered to an earlier marker's, if
    one is there); the index the next start rolls back to."""
    before = read_rollback_marker(path)
    if before is not None:
        doc = {**doc, "roll_back_to": min(doc["roll_back_to"], before)}
    write_atomically(path, json.dumps(doc).encode())
    return doc["roll_back_to"]


def report_divergence(cfg: NodeConfig, exc: LogDiverged) -> None:
    """A leader's log conflicts with entries this node holds as committed: in sync flush
    mode an invariant violation (logged; the node stops), in async flush mode a lost
    tail after a power loss of a majority (logged, and the rollback marker written so
    that the next start rolls the log back and rejoins)."""
    node = cfg.node_id
    if cfg.flush_mode == "sync":
        log.critical(
            "node %d: INVARIANT VIOLATED in sync flush mode: %s. Nothing acknowledged "
            "can be lost in sync mode; stopping. Restore this node's data from a "
            "replica (or investigate the disks)",
            node,
            exc,
        )
        return
    path = Path(cfg.data_dir) / ROLLBACK_FILE
    to = write_rollback_marker(
        path,
        {
            "roll_back_to": exc.agree,
            "conflict_at": exc.index,
            "committed": exc.committed,
            "leader": exc.leader,
            "term": exc.term,
        },
    )
    log.error(
        "node %d: LOST COMMITTED ENTRIES: leader %d (term %d) has other entries than "
        "ours from entry %d, while we hold entries up to %d as committed (async "
        "flush: a power loss of a majority lost entries %d..%d, which this node may "
        "have served). Stopping; wrote %s: the next start rolls the log back to "
        "entry %d and rejoins",
        node,
        exc.leader,
        exc.term,
        exc.index,
        exc.committed,
        exc.index,
        exc.committed,
        path,
        to,
    )


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
    return socket.gethostbyname(host)
