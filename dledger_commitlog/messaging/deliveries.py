"""The leader's recent delivery events of each consumer group, in memory, bounded.

Owns `DeliveryLog`: per group a ring of the last `per_group` events the coordinator
saw (a run of messages delivered to a member, an ack of a range, a nack with its
outcome and delay level), each with the leader's wall-clock time, for the trace of
a message (`message_trace`). It is what the log does not hold: which member a
message was handed to and when, and when it was acked (the log holds the group's
offsets, the retry and dead-letter copies, not the deliveries: a replicated record
per delivery would cost the consume path a Raft write).

Invariants: nothing here is replicated or written; a new leadership (`reset`)
starts every ring empty, so history begins at the leadership's start, and a ring
that dropped its oldest events says from when it still holds all
(`history_since_ms`). One append per delivered run or acked range (consecutive
offsets are kept as a `range`, not one entry each); at most `max_groups` rings
(the least recently written is dropped first, and a group without a ring is then
known only from that time).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import NamedTuple

PER_GROUP = 8192
MAX_GROUPS = 256


class DeliveryEvent(NamedTuple):
    time_ms: int  # wall clock, ms since the epoch
    kind: str  # "delivered", "acked" or "nacked"
    topic: str
    queue_id: int
    offsets: range | tuple[int, ...]
    member_id: str
    counts: tuple[int, ...] = ()  # delivered: the delivery count of each (empty: all 1)
    outcome: str = ""  # nacked: "retry", "in-place" or "dead-letter"
    delay_level: int = 0  # nacked: the level it is retried on (0: none)


class _Ring:
    __slots__ = ("events", "since_ms")

    def __init__(self, since_ms: int, size: int) -> None:
        self.events: collections.deque[DeliveryEvent] = collections.deque(maxlen=size)
        self.since_ms = since_ms


class DeliveryLog:
    """Recent delivery events per group (see the module docstring)."""

    def __init__(
        self, per_group: int = PER_GROUP, max_groups: int = MAX_GROUPS, now_ms: int | None = None
    ) -> None:
        self.per_group = per_group
        self.max_groups = max_groups
        self._rings: dict[str, _Ring] = {}
        self.started_ms = _wall_ms() if now_ms is None else now_ms
        self._complete_since_ms = self.started_ms  # for a group without a ring

    def reset(self, since_ms: int) -> None:
        """A new leadership, since `since_ms` (wall clock): nothing of before is known."""
        self._rings.clear()
        self.started_ms = self._complete_since_ms = since_ms

    def delivered(
        self,
        group: str,
        member_id: str,
        topic: str,
        queue_id: int,
        offsets: Sequence[int],
        counts: Sequence[int],
    ) -> None:
        if not offsets:
            return
        again = tuple(counts) if any(c != 1 for c in counts) else ()
        self._add(
            group,
            DeliveryEvent(
                _wall_ms(), "delivered", topic, queue_id, _compact(offsets), member_id, again
            ),
        )

    def acked(
        self, group: str, member_id: str, topic: str, queue_id: int, start: int, end: int
    ) -> None:
        offsets = range(start, max(end, start + 1))
        self._add(group, DeliveryEvent(_wall_ms(), "acked", topic, queue_id, offsets, member_id))

    def nacked(
        self,
        group: str,
        member_id: str,
        topic: str,
        queue_id: int,
        offset: int,
        outcome: str,
        delay_level: int,
        time_ms: int,
    ) -> None:
        event = DeliveryEvent(
            time_ms, "nacked", topic, queue_id, (offset,), member_id, (), outcome, delay_level
        )
        self._add(group, event)

    def events(self, group: str, topic: str, queue_id: int, offset: int) -> list[DeliveryEvent]:
        """The events of `group` that touch one stored message, oldest first."""
        ring = self._rings.get(group)
        if ring is None:
            return []
        return [
            e
            for e in ring.events
            if e.queue_id == queue_id and e.topic == topic and offset in e.offsets
        ]

    def history_since_ms(self, group: str) -> int:
        """From when this log holds every delivery event of `group`."""
        ring = self._rings.get(group)
        return self._complete_since_ms if ring is None else ring.since_ms

    def _add(self, group: str, event: DeliveryEvent) -> None:
        ring = self._rings.pop(group, None)  # re-inserted last: the most recently written
        if ring is None:
            if len(self._rings) >= self.max_groups:
                del self._rings[next(iter(self._rings))]
                self._complete_since_ms = event.time_ms  # that group's events are gone
            ring = _Ring(self._complete_since_ms, self.per_group)
        if len(ring.events) == ring.events.maxlen:
            ring.since_ms = ring.events[0].time_ms + 1
        ring.events.append(event)
        self._rings[group] = ring


def _compact(offsets: Sequence[int]) -> range | tuple[int, ...]:
    """Rising offsets as a range when they are consecutive (the usual run)."""
    first, last = offsets[0], offsets[-1]
    if last - first + 1 == len(offsets):
        return range(first, last + 1)
    return tuple(offsets)


def _wall_ms() -> int:
    return int(time.time() * 1000)
