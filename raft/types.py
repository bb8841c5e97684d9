"""Plain value types shared by the Raft core, its storage and its drivers.

Owns: log entries, the persistent hard state, node roles, read states.
Invariants: every type here is immutable and holds only ints, bytes, enums and
tuples, so drivers can persist or serialize them without copying.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class EntryKind(enum.IntEnum):
    """What an entry carries."""

    NORMAL = 0  # application data
    NOOP = 1  # the leader's empty entry on election
    CONFIG = 2  # a new membership (raft/membership.py), in effect once appended


# EntryKind by value: a dict lookup per entry, not an enum call, where entries are
# decoded by the thousand (a catch-up decodes about a thousand per MB).
KINDS: dict[int, EntryKind] = {int(k): k for k in EntryKind}


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. `index` starts at 1; index 0 is the sentinel with term 0."""

    index: int
    term: int
    data: bytes = b""
    kind: EntryKind = EntryKind.NORMAL


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: int | None = None  # node id voted for in `term`
    commit: int = 0
    # The last configuration entry at or below `commit` (raft/membership.py): its
    # index and encoded membership (0 and b"": the static bootstrap of `Config.peers`).
    conf_index: int = 0
    conf: bytes = b""


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where a follower's log restarts after a snapshot: the log becomes empty
    after `index` (first_index() == index + 1, last_index() == index) with
    term(index) == `term`. `data` is the leader storage's opaque description of
    that starting point (`LogStorage.snapshot_data()`). Everything up to `index`
    is committed; the application state is rebuilt from the log, not from here."""

    index: int
    term: int
    data: bytes = b""
    conf: bytes = b""  # the encoded membership in effect at `index` (raft/membership.py)
    conf_index: int = 0  # the index of that configuration's entry


class Role(enum.Enum):
    """The four roles of a node; transitions live in `CoreState._become_*` (raft/state.py)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read position: serve the read once `applied >= index`."""

    ctx: bytes
    index: int


class Rng(Protocol):
    """The randomness the core needs; pass a seeded `random.Random`."""

    def randrange(self, start: int, stop: int) -> int: ...
