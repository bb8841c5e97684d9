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
