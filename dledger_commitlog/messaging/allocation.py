"""Queue allocation among a consumer group's live members: which member reads which queue.

Owns the strategies (`STRATEGIES`) and `allocate`, which maps every member to its
queues. Pure and deterministic: the result depends only on the set of queues
and the set of members (not on their order, and duplicates count once), so
every member (and the coordinator) computes the same allocation from the same
view. Every queue goes to exactly one member; a member may get none (more
members than queues). No members: no allocation.

- "average" is RocketMQ's AllocateMessageQueueAveragely: members and queues
  sorted, each member takes a contiguous block of queues, the first
  `len(queues) % len(members)` members one more than the rest (sizes differ by
  at most 1).
- "consistent-hash" puts each member on a hash ring at `VIRTUAL_NODES` points
  (blake2b of f"{member}#{i}", 64 bits) and gives a queue to the member of the
  first point clockwise of (at or after) the hash of f"{topic}:{queue_id}"
  (wrapping round). A member that leaves gives up only its own queues, and one
  that joins takes queues only to itself; sizes are balanced only roughly.

`share_out` divides one fetch among a member's queues the same way: evenly among
those that want some, a queue that wants less than an even share leaving the rest
to the others, what does not divide going one each in a turn that rotates.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

__all__ = ["STRATEGIES", "VIRTUAL_NODES", "QueueRef", "allocate", "share_out"]

QueueRef = tuple[str, int]  # (topic, queue_id)

STRATEGIES: tuple[str, ...] = ("average", "consistent-hash")
VIRTUAL_NODES: Final = 64


def allocate(
    strategy: str, queues: Sequence[QueueRef], members: Sequence[str]
) -> dict[str, list[QueueRef]]:
    """Every member id -> its queues (sorted). Deterministic: the same inputs give the same result
    whatever their order. Every queue goes to exactly one member (disjoint, complete cover);
    no members -> {}. ValueError naming the known strategies for an unknown one."""
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown allocation strategy {strategy!r}: known strategies are "
            + ", ".join(STRATEGIES)
        )
    ids = sorted(set(members))
    refs = sorted(set(queues))
    if not ids:
        return {}
    if strategy == "average":
        return _average(refs, ids)
    return _consistent_hash(refs, ids)


def _average(queues: list[QueueRef], members: list[str]) -> dict[str, list[QueueRef]]:
    size, extra = divmod(len(queues), len(members))
    out: dict[str, list[QueueRef]] = {}
    start = 0
    for index, member in enumerate(members):
        count = size + (1 if index < extra else 0)
        out[member] = queues[start : start + count]
        start += count
    return out


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=4096)
def _points(member: str) -> tuple[int, ...]:
    """A member's places on the ring."""
    return tuple(_hash(f"{member}#{i}") for i in range(VIRTUAL_NODES))


def _consistent_hash(queues: list[QueueRef], members: list[str]) -> dict[str, list[QueueRef]]:
    # ties (two members on one point) go to the smaller member id, whatever the order given
    ring = sorted((point, member) for member in members for point in _points(member))
    hashes = [point for point, _ in ring]
    out: dict[str, list[QueueRef]] = {member: [] for member in members}
    for topic, queue_id in queues:  # sorted, so each member's list is too
        at = bisect.bisect_left(hashes, _hash(f"{topic}:{queue_id}"))
        out[ring[at % len(ring)][1]].append((topic, queue_id))
    return out


def share_out(wants: Sequence[int], total: int, turn: int = 0) -> list[int]:
    """`total` divided among `wants` (each gets at most its want; the sum is the lesser
    of `total` and the wants' sum): evenly, a want below an even share met whole and
    the rest shared again; a remainder smaller than one each goes one each to the
    wanting ones from the `turn`-th (mod their count) on."""
    shares = [0] * len(wants)
    wanting = [i for i, want in enumerate(wants) if want > 0]
    left = total
    while left > 0 and wanting:
        each = left // len(wanting)
        if each == 0:
            k = turn % len(wanting)
            for i in (wanting[k:] + wanting[:k])[:left]:
                shares[i] += 1
            break
        still = []
        for i in wanting:
            give = min(each, wants[i] - shares[i])
            shares[i] += give
            left -= give
            if shares[i] < wants[i]:
                still.append(i)
        wanting = still
    return shares
