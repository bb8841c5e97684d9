"""The driver contract: what `RaftCore.ready()` hands out and in which order
it must be carried out. Plain data; see `Ready`."""

from __future__ import annotations

from dataclasses import dataclass

from raft.messages import Message
from raft.types import Entry, HardState, ReadState, SnapshotMeta


@dataclass(frozen=True, slots=True)
class Ready:
    """Work for the driver, to be done in this order:

    0. if `snapshot` is not None (only on a follower that was behind its
       leader's first retained entry): first make `hard_state` durable (it
       carries the snapshot's membership: a crash after the restore must not
       find the older one; keep the commit index recorded before, since the
       old log may hold entries that never committed), then call
       `storage.restore(snapshot.index, snapshot.term, snapshot.data)`, which
       empties the log so that it restarts after `snapshot.index`, and reset
       the application state to "everything up to `snapshot.index` applied"
       (our state is rebuilt from the log itself; entries up to
       `snapshot.index` are never handed out as `committed_entries`);
    1. persist `entries` (append them to the `LogStorage` the core reads;
       they may overwrite a suffix; after a snapshot they start at
       `snapshot.index + 1`) and then `hard_state` (if not None), and make
       the restore, the entries and the hard state durable;
    2. send `messages` (only now: they may promise what steps 0 and 1 stored);
    3. apply `committed_entries` to the state machine, and hand `read_states`
       to waiting readers (serve each once applied >= its index);
    4. call `advance(ready)`.

    Only one Ready is outstanding at a time; `tick`, `step`, `propose` and the
    other inputs may be called between `ready()` and `advance()`. The core
    never reads the storage while a snapshot it handed out is not yet
    advanced, so the driver may restore it at any point before `advance`.
    """

    entries: tuple[Entry, ...]
    hard_state: HardState | None
    messages: tuple[Message, ...]
    committed_entries: tuple[Entry, ...]
    read_states: tuple[ReadState, ...]
    snapshot: SnapshotMeta | None = None
