"""One queue of a consumer group as the leader keeps it: its lease and its deliveries.

Owns `Lease` (who holds the queue, under which epoch, whether it is being revoked
and for whom) and the bookkeeping of the queue's deliveries that `GroupState`
drives: the `cursor`, the next offset never delivered; below it the offsets in
flight (each with its ack deadline), how often each was delivered, and the acked
ones; the *frontier*, the lowest offset not yet acked, and `flushed`, the frontier
last committed through the log. Also `QueueRef`, a queue's (topic, queue id).

Pure like `group_state`: no I/O and no clock. Invariant: `acked` holds only
offsets above the frontier; the frontier moves past acked offsets at once
(`mark_acked`, `mark_range`, `skip_below`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import repeat

QueueRef = tuple[str, int]


@dataclass(slots=True)
class Lease:
    """One queue of the group: who holds it and where its deliveries stand."""

    topic: str
    queue_id: int
    frontier: int  # lowest offset not acked
    cursor: int  # next offset never delivered
    flushed: int  # the frontier last committed through the log
    owner: str | None = None
    epoch: int = 0
    tenure_epoch: int = 0  # the owner's acks are good under this epoch and `epoch`
    claimed: bool = False  # adopted from a claim in the grace period (a newer claim wins)
    target: str | None = None  # revoking: the member it goes to next (NOBODY: none)
    in_flight: dict[int, int] = field(default_factory=dict)  # offset -> ack deadline (ms)
    deliveries: dict[int, int] = field(default_factory=dict)  # offset -> times delivered
    acked: set[int] = field(default_factory=set)  # acked offsets above the frontier
    attempts: dict[int, int] = field(default_factory=dict)  # orderly: in-place retries
    suspended_until_ms: int = 0

    @property
    def ref(self) -> QueueRef:
        return (self.topic, self.queue_id)

    def in_flight_count(self) -> int:
        return len(self.in_flight)

    def _advance(self) -> None:
        while self.frontier in self.acked:
            self.acked.discard(self.frontier)
            self.deliveries.pop(self.frontier, None)
            self.attempts.pop(self.frontier, None)
            self.frontier += 1
        self.cursor = max(self.cursor, self.frontier)

    def mark_acked(self, offset: int) -> bool:
        """Record `offset` done; whether it was news."""
        self.in_flight.pop(offset, None)  # even if acked before: it is not in flight now
        if offset < self.frontier or offset in self.acked:
            return False
        self.acked.add(offset)
        self._advance()
        return True

    def mark_range(self, start: int, end: int) -> int:
        """`mark_acked` of each offset of [start, end); how many were news. A range from
        at most the frontier, with nothing acked above it, moves the frontier at once."""
        if self.acked or not start <= self.frontier < end:
            return sum(map(self.mark_acked, range(start, end)))
        deque(map(self.in_flight.pop, range(start, end), repeat(None)), 0)
        for table in (self.deliveries, self.attempts):
            if table:
                deque(map(table.pop, range(self.frontier, end), repeat(None)), 0)
        news = end - self.frontier
        self.frontier = end
        self.cursor = max(self.cursor, end)
        return news

    def readable(self, limit: int) -> int:
        """How many of `limit` offsets from the cursor a read may take: up to the first
        one acked already (a rewound queue delivers again only what is not acked)."""
        above = [o for o in self.acked if o >= self.cursor]
        return min(limit, min(above) - self.cursor) if above else limit

    def skip_acked(self) -> None:
        """Move the cursor past offsets acked already (after a read up to them)."""
        while self.cursor in self.acked:
            self.cursor += 1

    def rewind(self) -> None:
        """Forget every delivery: the next owner gets what is not acked again."""
        self.in_flight.clear()
        self.cursor = self.frontier
        self.suspended_until_ms = 0

    def skip_below(self, offset: int) -> None:
        """Retention removed the queue below `offset`: nothing there is delivered again."""
        if offset > self.frontier:
            for gone in [o for o in self.in_flight if o < offset]:
                del self.in_flight[gone]
            self.acked = {o for o in self.acked if o >= offset}
            self.deliveries = {o: n for o, n in self.deliveries.items() if o >= offset}
            self.attempts = {o: n for o, n in self.attempts.items() if o >= offset}
            self.frontier = offset
            self._advance()

    def reset(self, offset: int) -> None:
        """An operator moved the group's offset here (reset-offsets)."""
        self.frontier = self.cursor = self.flushed = offset
        self.in_flight.clear()
        self.deliveries.clear()
        self.acked.clear()
        self.attempts.clear()
        self.suspended_until_ms = 0
