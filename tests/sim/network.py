"""A seeded fake network: drop, delay, reorder, duplicate and partitions.

Owns: messages in flight and the link state between nodes. Every random
choice comes from the simulation's one `random.Random`. Reordering falls out
of independent random delays, unless the profile keeps each link FIFO. The
simulation bounds the in-flight set: when full, new messages are dropped.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from raft import Message

MAX_IN_FLIGHT = 5000


@dataclass(frozen=True, slots=True)
class LinkProfile:
    drop_rate: float
    dup_rate: float
    min_delay_ms: int
    max_delay_ms: int
    reorder: bool = True  # False: each link is FIFO, like one gRPC stream

    @staticmethod
    def random(rng: random.Random) -> LinkProfile:
        lo = rng.randrange(0, 3)
        return LinkProfile(
            drop_rate=rng.choice((0.0, 0.01, 0.05, 0.15)),
            dup_rate=rng.choice((0.0, 0.01, 0.05)),
            min_delay_ms=lo,
            max_delay_ms=lo + rng.choice((1, 5, 15, 40)),
            reorder=rng.random() < 0.4,
        )


class FakeNetwork:
    def __init__(self, rng: random.Random, profile: LinkProfile) -> None:
        self.rng = rng
        self.profile = profile
        self.blocked: set[tuple[int, int]] = set()
        self._last_arrival: dict[tuple[int, int], int] = {}
        self.sent = 0
        self.dropped = 0

    def arrivals(self, m: Message, now: int) -> list[int]:
        """Arrival times of the copies of `m` sent at `now`; [] if lost."""
        self.sent += 1
        p = self.profile
        if self.rng.random() < p.drop_rate:
            self.dropped += 1
            return []
        out = [now + self.rng.randint(p.min_delay_ms, p.max_delay_ms)]
        if not p.reorder:
            link = (m.src, m.dst)
            out[0] = max(out[0], self._last_arrival.get(link, 0))
            self._last_arrival[link] = out[0]
        if self.rng.random() < p.dup_rate:  # a retransmitted copy may overtake anything
            out.append(now + self.rng.randint(p.min_delay_ms, p.max_delay_ms * 2 + 1))
        return out

    def can_deliver(self, m: Message) -> bool:
        return (m.src, m.dst) not in self.blocked

    def partition(self, groups: Iterable[Iterable[int]]) -> None:
        """Block every link between different groups (both directions)."""
        gs = [set(g) for g in groups]
        for a in gs:
            for b in gs:
                if a is not b:
                    self.blocked.update((x, y) for x in a for y in b)

    def block_one_way(self, srcs: Iterable[int], dsts: Iterable[int]) -> None:
        ds = list(dsts)
        self.blocked.update((s, d) for s in srcs for d in ds if s != d)

    def heal(self) -> None:
        self.blocked.clear()
