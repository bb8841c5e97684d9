"""The transport of the driver simulation (tests/sim/driver_sim.py): gRPC-like streams.

One stream per ordered pair of nodes, FIFO as a gRPC stream; a message may be lost
(a batch of a broken stream, the queue's overflow), a break drops everything in
flight on a stream, partitions block streams; no duplicates, no reordering within
a stream.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from raft import Message


@dataclass(frozen=True, slots=True)
class NetProfile:
    drop_rate: float
    min_ms: int
    max_ms: int

    @staticmethod
    def random(rng: random.Random) -> NetProfile:
        lo = rng.randrange(0, 3)
        return NetProfile(
            drop_rate=rng.choice((0.0, 0.01, 0.05, 0.1)),
            min_ms=lo,
            max_ms=lo + rng.choice((1, 5, 15, 40)),
        )


class StreamNetwork:
    """One FIFO stream per ordered pair of nodes, like the gRPC transport: what
    arrives on a stream arrives in the order sent, with gaps (a lost batch, a
    broken stream); a partition breaks and blocks the streams it cuts."""

    def __init__(self, rng: random.Random, profile: NetProfile) -> None:
        self.rng = rng
        self.profile = profile
        self.blocked: set[tuple[int, int]] = set()
        self._epoch: dict[tuple[int, int], int] = {}
        self._last_arrival: dict[tuple[int, int], int] = {}

    def send(self, m: Message, now: int) -> tuple[int, int] | None:
        """(arrival time, stream epoch) of `m` sent at `now`; None if lost."""
        link = (m.src, m.dst)
        p = self.profile
        if link in self.blocked or self.rng.random() < p.drop_rate:
            return None
        at = max(now + self.rng.randint(p.min_ms, p.max_ms), self._last_arrival.get(link, 0))
        self._last_arrival[link] = at
        return at, self._epoch.get(link, 0)

    def deliverable(self, m: Message, epoch: int) -> bool:
        link = (m.src, m.dst)
        return link not in self.blocked and self._epoch.get(link, 0) == epoch

    def break_streams(self, links: Sequence[tuple[int, int]]) -> None:
        """Everything in flight on these streams is lost."""
        for link in links:
            self._epoch[link] = self._epoch.get(link, 0) + 1

    def block(self, links: Sequence[tuple[int, int]]) -> None:
        self.blocked.update(links)
        self.break_streams(links)

    def heal(self) -> None:
        self.blocked.clear()
