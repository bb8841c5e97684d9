"""Who is in the group: voters, learners and their addresses, as the log says.

Owns `Member`, `Membership` (an immutable member set and its codec: the data of
a CONFIG entry), `ConfChange` (one change an operator asks for) and `ConfLog`,
the configurations carried by one node's log.

Membership is state carried by the log (Raft thesis, section 4.1; etcd's
ConfChange): a CONFIG entry holds the whole new membership and takes effect on
a node as soon as it is appended there, committed or not. Changes go one at a
time (single-server changes): each configuration differs from the one before
it by one voter at most, so any majority of the old and any majority of the
new overlap, and a leader proposes a change only when the previous one has
committed and it has committed an entry of its own term (the fix to the
single-server change bug of the thesis' errata).

Invariants:
- a `Membership` has at least one voter, distinct positive ids, and learners
  that are not voters; `decode(encode(m)) == m`, and `decode` refuses any
  other input with a ValueError naming what is wrong;
- `ConfLog` holds (index, membership) in increasing index order; its first
  pair is the base (a configuration at or below the log's start, from the hard
  state, a snapshot or the static bootstrap) and never goes; a truncation of
  the log drops exactly the configurations above the truncation point.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from raft.errors import MembershipError
from raft.types import Entry, EntryKind

MAX_MEMBERS = 64
MAX_ID = (1 << 31) - 1  # ids travel as int32 in the Raft messages
_MAX_ADDRESS = 255
MAX_CONF_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class Member:
    """One member: its id, where its Raft and client ports listen, and its role."""

    id: int
    raft: str = ""  # HOST:PORT of its Raft port
    client: str = ""  # HOST:PORT of its client port
    learner: bool = False

    @property
    def role(self) -> str:
        return "learner" if self.learner else "voter"


@dataclass(frozen=True, slots=True)
class Membership:
    """The members of the group, sorted by id (build with `Membership.of`)."""

    members: tuple[Member, ...]

    @classmethod
    def of(cls, members: Iterable[Member]) -> Membership:
        ms = tuple(sorted(members, key=lambda m: m.id))
        _check(ms)
        return cls(ms)

    @classmethod
    def voters_only(cls, ids: Iterable[int]) -> Membership:
        """The static bootstrap: these voters, addresses unknown to the core."""
        return cls.of(Member(i) for i in ids)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(m.id for m in self.members)

    @property
    def voters(self) -> tuple[int, ...]:
        return tuple(m.id for m in self.members if not m.learner)

    @property
    def learners(self) -> tuple[int, ...]:
        return tuple(m.id for m in self.members if m.learner)

    def get(self, node_id: int) -> Member | None:
        return next((m for m in self.members if m.id == node_id), None)

    def apply(self, change: ConfChange) -> Membership:
        """The membership after `change`; MembershipError (nothing changes) if it
        does not apply here."""
        cur = self.get(change.node_id)
        match change.op:
            case ChangeOp.ADD_LEARNER:
                if cur is not None:
                    raise MembershipError(f"node {change.node_id} is already a {cur.role}")
                m = change.member
                assert m is not None
                return Membership.of((*self.members, replace(m, learner=True)))
            case ChangeOp.PROMOTE:
                if cur is None:
                    raise MembershipError(f"node {change.node_id} is not a member")
                if not cur.learner:
                    raise MembershipError(f"node {change.node_id} is a voter already")
                return Membership.of(
                    replace(m, learner=False) if m.id == cur.id else m for m in self.members
                )
            case ChangeOp.REMOVE:
                if cur is None:
                    raise MembershipError(f"node {change.node_id} is not a member")
                if not cur.learner and self.voters == (cur.id,):
                    raise MembershipError(f"node {change.node_id} is the last voter")
                return Membership.of(m for m in self.members if m.id != cur.id)

    def encode(self) -> bytes:
        doc = {"members": [[m.id, m.raft, m.client, m.learner] for m in self.members]}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Membership:
        """The membership a CONFIG entry holds; ValueError if it holds none."""
        if len(data) > MAX_CONF_BYTES:
            raise ValueError(f"configuration of {len(data)} bytes, over {MAX_CONF_BYTES}")
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"configuration is not JSON ({exc})") from None
        rows = doc.get("members") if isinstance(doc, dict) else None
        if not isinstance(rows, list) or len(doc) != 1:
            raise ValueError('configuration must be {"members": [...]}')
        members = []
        for row in rows:
            ok = (
                isinstance(row, list)
                and len(row) == 4
                and type(row[0]) is int
                and isinstance(row[1], str)
                and isinstance(row[2], str)
                and type(row[3]) is bool
            )
            if not ok:
                raise ValueError(f"configuration member {row!r} is not [id, raft, client, learner]")
            members.append(Member(*row))
        return cls.of(members)


def _check(ms: tuple[Member, ...]) -> None:
    if not any(not m.learner for m in ms):
        raise ValueError("a membership needs at least one voter")
    if len(ms) > MAX_MEMBERS:
        raise ValueError(f"{len(ms)} members, over {MAX_MEMBERS}")
    ids = [m.id for m in ms]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate member ids in {ids}")
    for m in ms:
        if not 0 < m.id <= MAX_ID:
            raise ValueError(f"member id {m.id} not in [1, {MAX_ID}]")
        if len(m.raft) > _MAX_ADDRESS or len(m.client) > _MAX_ADDRESS:
            raise ValueError(f"member {m.id}: address longer than {_MAX_ADDRESS} characters")


def majorities_overlap(a: Iterable[int], b: Iterable[int]) -> bool:
    """Whether every majority of voter set `a` meets every majority of `b`."""
    sa, sb = set(a), set(b)
    need_a, need_b = len(sa) // 2 + 1, len(sb) // 2 + 1
    # Disjoint majorities exist iff each can be filled from outside the other
    # (taking shared members only for what is missing) without reusing one.
    shared = len(sa & sb)
    return max(0, need_a - len(sa - sb)) + max(0, need_b - len(sb - sa)) > shared


class ChangeOp(enum.Enum):
    ADD_LEARNER = "add-learner"
    PROMOTE = "promote"
    REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class ConfChange:
    """One membership change: add a learner (`member` says where it listens),
    promote a learner to voter, or remove a member."""

    op: ChangeOp
    node_id: int
    member: Member | None = None

    def __post_init__(self) -> None:
        if (self.op is ChangeOp.ADD_LEARNER) != (self.member is not None):
            raise ValueError("ADD_LEARNER, and only it, names the member")
        if self.member is not None and self.member.id != self.node_id:
            raise ValueError("the member's id differs from the change's")


class ConfLog:
    """The configurations in one node's log: a base at or below its start, then one
    per CONFIG entry. The last one is in effect (see the module docstring). Each is
    kept with its encoding (b"" for the static bootstrap, which no entry holds)."""

    __slots__ = ("_confs",)

    def __init__(self, base_index: int, base: Membership, encoded: bytes = b"") -> None:
        self._confs: list[tuple[int, Membership, bytes]] = [(base_index, base, encoded)]

    @property
    def current(self) -> Membership:
        return self._confs[-1][1]

    @property
    def index(self) -> int:
        """Index of the configuration in effect (the base's: at or below the log start)."""
        return self._confs[-1][0]

    def at(self, index: int) -> tuple[int, Membership, bytes]:
        """The configuration in effect at `index` (the base if it is older)."""
        confs = self._confs
        if len(confs) == 1 or confs[-1][0] <= index:
            return confs[-1]
        for triple in reversed(confs):
            if triple[0] <= index:
                return triple
        return confs[0]

    def appended(self, entries: Sequence[Entry]) -> None:
        """`entries` were appended to the log (after a truncation at their start)."""
        if self._confs[-1][0] >= entries[0].index:
            self.truncate(entries[0].index)
        config = EntryKind.CONFIG
        for e in entries:
            if e.kind is config:
                self._confs.append((e.index, Membership.decode(e.data), e.data))

    def truncate(self, index: int) -> None:
        """The log lost its entries from `index` on: so do its configurations."""
        confs = self._confs
        while len(confs) > 1 and confs[-1][0] >= index:
            confs.pop()

    def reset(self, base_index: int, base: Membership, encoded: bytes) -> None:
        """A snapshot restarted the log after `base_index`."""
        self._confs = [(base_index, base, encoded)]

    def pending_after(self, committed: int) -> int:
        """The index of a configuration entry above `committed` (0: none)."""
        idx = self._confs[-1][0]
        return idx if idx > committed and len(self._confs) > 1 else 0
