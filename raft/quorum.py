"""Majority quorum arithmetic over a voter set.

Owns: the only place that knows what "a quorum" is, so joint consensus or
other membership changes can replace it later. Pure functions of their inputs.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def majority(voters: Collection[int]) -> int:
    """How many of `voters` make a quorum."""
    assert voters, "empty voter set"
    return len(voters) // 2 + 1


def committed_index(voters: Collection[int], match: Mapping[int, int]) -> int:
    """The largest index known to be stored on a quorum of `voters`.

    `match[v]` is the last index known to be durable on voter v (missing is 0).
    """
    indexes = sorted((match.get(v, 0) for v in voters), reverse=True)
    return indexes[majority(voters) - 1]


def vote_result(voters: Collection[int], votes: Mapping[int, bool]) -> VoteResult:
    """WON once a quorum granted, LOST once a quorum can no longer be reached."""
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    need = majority(voters)
    if granted >= need:
        return VoteResult.WON
    if len(voters) - rejected < need:
        return VoteResult.LOST
    return VoteResult.PENDING


def has_quorum(voters: Collection[int], acked: Iterable[int]) -> bool:
    """Whether the voters in `acked` form a quorum."""
    members = set(voters)
    return sum(1 for v in set(acked) if v in members) >= majority(voters)
