"""The Ready driver: carries out what the Raft core hands out, in the order it demands.

Owns `ReadyDriver`, the loop that turns each `Ready` (raft/ready.py) into I/O:
append the entries to the log storage, make a changed term or vote durable,
send the messages, apply committed entries, hand out read states, `advance`.
Everything it touches is injected (the core, the storage, the hard-state file,
the flusher, the transport, the state machine), so the simulator runs this very
code against its own network, clock and crash-prone disks.

Pipelined in sync flush mode (etcd's async storage writes, the core configured
with `async_storage_writes`): entries go to the storage (its write buffer) and
an fsync covering them is *requested* from the flusher, never awaited, so the
loop goes on stepping, proposing and appending while it runs. What promises
durability (a follower's acknowledgement, and everything queued after it, so
that what a peer receives keeps its order) is held until the covering fsync
completes; `_on_durable` then tells the core (`persisted`), which counts a
leader's own log only up to there and applies only durable entries. A leader
whose term and vote are durable sends its appends and heartbeats at once, so
replication overlaps its own fsync.

Invariants:
- a snapshot's restore comes after the hard state of its Ready is durable (its
  membership, term and vote; the commit as it was recorded before);
- no message leaves before the hard state it depends on is durable (a changed
  term or vote is saved and fsynced before anything of its Ready is sent);
- in sync flush mode the commit index saved with a changed term or vote covers
  only durable entries: a restart applies raft.state's commit over the log it
  recovers, where an entry not yet fsynced may be missing, or the suffix an
  append just replaced may be back in its place;
- an acknowledgement leaves only once the entries it covers are durable;
- the core hears `persisted` only for entries it has handed out and that were
  advanced (no await between the flush request and `advance`; the flusher
  answers every request, one for bytes another flush already made durable
  too, on a later pass of the loop, never from inside `request`);
- an append that replaces a suffix, and a snapshot restore, first wait until
  nothing is in flight: no fsync may cover bytes a truncation rewrites;
- one Ready at a time; inputs arriving meanwhile go into the next one.
Without a flusher (async flush mode) `advance` itself means "persisted" and
`on_appended` pokes the periodic flush.

Commit notices linger (with `defer`): a leader's `quiet` commit-only append to a
follower is held until `defer` calls back (the node: 20 ms later), and dropped if
an append or heartbeat carrying a commit index as high goes to that follower
first. Under a sequential writer the next put's append carries the commit, so a
put costs each follower one message fewer. A held notice that a later message does
not cover leaves before it: what one peer receives keeps its order.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from raft import HardState, Message, RaftCore, Ready, Role
from raft.messages import AppendEntries, Heartbeat
from raft.types import Entry, ReadState, SnapshotMeta


class DriverStorage(Protocol):
    """The log storage as the driver writes it (EntryStore)."""

    def append_entries(self, entries: Sequence[Entry]) -> list[int]: ...

    def last_index(self) -> int: ...

    @property
    def write_position(self) -> int: ...

    @property
    def flushed_position(self) -> int: ...


class Flusher(Protocol):
    """Durability of the storage's bytes (store.flush.GroupCommit)."""

    def request(self, position: int) -> None:
        """Have the listeners told, on a later pass of the loop, once the storage is
        durable up to `position` (also when it already is: then without an fsync)."""
        ...

    async def sync(self, position: int | None = None) -> int: ...

    def add_listener(self, on_durable: Callable[[int], None]) -> None: ...


class HardStateFile(Protocol):
    @property
    def saved(self) -> HardState:
        """What the file holds now."""
        ...

    def needs_sync(self, hs: HardState) -> bool: ...


class ReadyDriver:
    """One node's Ready loop (see the module docstring)."""

    def __init__(
        self,
        core: RaftCore,
        storage: DriverStorage,
        state_file: HardStateFile,
        *,
        send: Callable[[Sequence[Message]], None],
        apply: Callable[[Sequence[Entry]], None],
        save_hard_state: Callable[[HardState], Awaitable[None]],
        restore: Callable[[SnapshotMeta], Awaitable[None]],
        read_states: Callable[[Sequence[ReadState]], None] = lambda _: None,
        after_ready: Callable[[], None] = lambda: None,
        flusher: Flusher | None = None,
        on_appended: Callable[[], None] = lambda: None,
        defer: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        self.core = core
        self._storage = storage
        self._state_file = state_file
        self._send = send
        self._apply = apply
        self._save_hard_state = save_hard_state
        self._restore = restore
        self._read_states = read_states
        self._after_ready = after_ready
        self._flusher = flusher
        self._on_appended = on_appended
        self._defer = defer
        # Quiet commit-only appends held per follower until `defer` calls back.
        self._notices: dict[int, AppendEntries] = {}
        # Appended but not yet durable: (end position, last index, its term).
        self._unflushed: collections.deque[tuple[int, int, int]] = collections.deque()
        # Messages held until the storage is durable up to the position they follow.
        self._held: collections.deque[tuple[int, Sequence[Message]]] = collections.deque()
        # The last index durable here with all before it (what storage holds at start
        # survived): raft.state's commit never goes beyond it (sync flush).
        self._durable_index = storage.last_index()
        self.wakeup = asyncio.Event()
        self.stopped = False  # the node stopped: nothing more is sent or reported
        if flusher is not None:
            flusher.add_listener(self._on_durable)

    async def run(self) -> None:
        """Carry out Readies as the core has them, until cancelled."""
        core, wakeup = self.core, self.wakeup
        while True:
            await wakeup.wait()
            wakeup.clear()
            while core.has_ready():
                await self.handle(core.ready())

    async def handle(self, rd: Ready) -> None:
        """Carry out one Ready (see the module docstring for the order)."""
        core, storage, flusher = self.core, self._storage, self._flusher
        if rd.snapshot is not None:
            await self.settle()
            hs = rd.hard_state
            if hs is not None and self._state_file.needs_sync(hs):
                # The snapshot's membership (and term, vote) first: a crash after the
                # restore must not restart in a configuration older than the committed
                # one. The commit stays what was recorded: until the restore is done the
                # log is the old one, whose entries beyond it may never have committed.
                commit = self._state_file.saved.commit
                await self._save_hard_state(dataclasses.replace(hs, commit=commit))
            await self._restore(rd.snapshot)
            self._durable_index = rd.snapshot.index
        if rd.entries:
            if flusher is not None and rd.entries[0].index <= storage.last_index():
                await self.settle()  # a truncation: no fsync in flight may cover it
            storage.append_entries(rd.entries)
            self._durable_index = min(self._durable_index, rd.entries[0].index - 1)
        hs = rd.hard_state
        if hs is not None and self._state_file.needs_sync(hs):
            if flusher is not None and hs.commit > self._durable_index:
                # A restart takes the log up to raft.state's commit as committed: it must
                # not cover entries a power loss may still take, or turn back into the
                # suffix an append just replaced (the commit rides along lazily anyway).
                hs = dataclasses.replace(hs, commit=self._durable_index)
            await self._save_hard_state(hs)
        # From here to advance() no await: `persisted` only for advanced entries.
        if core.role is Role.LEADER:
            early: list[Message] = []
            late: list[Message] = []
            for m in rd.messages:
                (early if isinstance(m, AppendEntries | Heartbeat) else late).append(m)
            if early:  # before the fsync is asked for: the followers' disks start first
                self._send(self._hold_notices(early) if self._defer is not None else early)
            self._appended(rd)
            self._send_when_durable(late)
        else:
            self._appended(rd)
            self._send_when_durable(rd.messages)
        if rd.committed_entries:
            self._apply(rd.committed_entries)
        if rd.read_states:
            self._read_states(rd.read_states)
        core.advance(rd)
        self._after_ready()

    def _appended(self, rd: Ready) -> None:
        """The entries of `rd` are in the storage: ask for their fsync (or, in async
        flush mode, poke the periodic flush)."""
        if not rd.entries:
            return
        flusher, storage = self._flusher, self._storage
        if flusher is None:
            self._on_appended()
            return
        last = rd.entries[-1]
        self._unflushed.append((storage.write_position, last.index, last.term))
        flusher.request(storage.write_position)

    def _hold_notices(self, messages: list[Message]) -> list[Message]:
        """`messages` less the commit notices to hold; a held one goes out first where
        a message to its follower does not carry its commit index."""
        notices, out = self._notices, list[Message]()
        was_empty = not notices
        for m in messages:
            assert isinstance(m, AppendEntries | Heartbeat)
            if isinstance(m, AppendEntries) and m.quiet and not m.entries:
                notices[m.dst] = m  # a newer notice carries a commit at least as high
                continue
            held = notices.pop(m.dst, None)
            if held is not None and m.commit < held.commit:
                out.append(held)
            out.append(m)
        if notices and was_empty:
            assert self._defer is not None
            self._defer(self._send_notices)
        return out

    def _send_notices(self) -> None:
        """The commit notices still held (`defer`'s callback)."""
        notices, self._notices = list(self._notices.values()), {}
        if notices and not self.stopped and self.core.role is Role.LEADER:
            self._send(notices)

    def _send_when_durable(self, messages: Sequence[Message]) -> None:
        """Send now if nothing appended waits for its fsync, else after that fsync."""
        if not messages:
            return
        if self._flusher is None or not (self._held or self._unflushed):
            self._send(messages)
        else:
            self._held.append((self._storage.write_position, messages))

    def _on_durable(self, flushed: int) -> None:
        """The storage is durable up to `flushed` (the flusher's report, on the loop)."""
        if self.stopped:
            return
        unflushed, held = self._unflushed, self._held
        reported = False
        while unflushed and unflushed[0][0] <= flushed:
            _, index, term = unflushed.popleft()
            self.core.persisted(index, term)
            self._durable_index = index
            reported = True
        while held and held[0][0] <= flushed:
            self._send(held.popleft()[1])
        if reported:
            self.wakeup.set()

    async def settle(self) -> None:
        """Wait until everything written is durable and every held message sent."""
        if self._flusher is not None and (self._unflushed or self._held):
            await self._flusher.sync(self._storage.write_position)
            self._on_durable(self._storage.flushed_position)
