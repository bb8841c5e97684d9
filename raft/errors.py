"""Named exceptions for the expected failures of the Raft core.

Broken internal assumptions are `assert`s, not exceptions from this module.
"""

from __future__ import annotations


class RaftError(Exception):
    """Base class of the expected failures raised by `raft`."""


class NotLeader(RaftError):
    """This node cannot accept the request; `leader_hint` may know better.

    Raised by `propose` on a follower or candidate, on a leader that is
    transferring leadership (the hint is the transfer target), and by
    `read_index` on a node that knows no leader.
    """

    def __init__(self, leader_hint: int | None) -> None:
        super().__init__(f"not the leader (leader hint: {leader_hint})")
        self.leader_hint = leader_hint


class ProposalDropped(RaftError):
    """The proposal was refused without being appended (e.g. an empty batch)."""


class MembershipError(RaftError, ValueError):
    """A membership change that does not apply: an id that exists, an unknown or last
    voter, a learner too far behind to vote, a change while another is pending.
    Nothing was appended."""


class Compacted(RaftError):
    """The requested index is below the first index still held by the storage."""

    def __init__(self, index: int, first_index: int) -> None:
        super().__init__(f"index {index} is compacted (first index {first_index})")
        self.index = index
        self.first_index = first_index


class Unavailable(RaftError):
    """The requested index is beyond the last index of the storage."""

    def __init__(self, index: int, last_index: int) -> None:
        super().__init__(f"index {index} is beyond the last index {last_index}")
        self.index = index
        self.last_index = last_index


class LogDiverged(RaftError):
    """A leader's log conflicts with entries this node holds as committed.

    Raised by `step` (before the message changes the log) when an AppendEntries
    or Snapshot of the current leader shows an entry at or below our commit index
    that differs from ours. Raft never truncates committed entries, so the core
    cannot repair this itself. It cannot happen while every acknowledged entry is
    durable on a majority; it can after a power loss of a majority in async flush
    mode, when the new majority lost entries this node had recorded as committed.
    The driver decides: roll the log back to `agree` and rejoin, or stop.

    `index`: the first index known to differ (<= `committed`); `agree`: where to
    roll the log back to (an append: the entry before the conflict, up to which
    our log matches the leader's; a snapshot: its index - 1, after which the
    leader restores our log from that snapshot); `committed`: our commit index.
    """

    def __init__(self, index: int, agree: int, committed: int, leader: int, term: int) -> None:
        super().__init__(
            f"leader {leader} (term {term}) has other entries than ours at index {index}, "
            f"at or below our commit index {committed}; our logs agree up to {agree}"
        )
        self.index = index
        self.agree = agree
        self.committed = committed
        self.leader = leader
        self.term = term
