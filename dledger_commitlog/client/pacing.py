"""How a consumer paces its calls: how much a fetch asks for, and acks as ranges.

Owns `FetchSize` and `ack_ranges`, for `consumer.AsyncConsumer`. Every fetch and
every ack is a call the group's coordinator (the leader) answers on its event
loop, so a consumer that keeps up with a busy topic makes few, large ones:

- a fetch asks for about `AHEAD_S` of the handlers' recent work (the messages
  they ended per second, measured over windows of at least `WINDOW_S`), at least
  `least` and at most `MAX_FETCH` (the coordinator's own bound). A slow handler
  keeps fetches small, so what a member holds is handled well within its ack wait;
- the offsets acked since the last call go as ranges: the consecutive offsets of
  a queue under one lease epoch as one handle [offset, end).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

MAX_FETCH: Final = 256  # the most a fetch brings (the coordinator's bound)
AHEAD_S: Final = 0.1
WINDOW_S: Final = 0.05

Handle = tuple[str, int, int, int]  # topic, queue, offset, epoch
Range = tuple[str, int, int, int, int]  # topic, queue, offset, epoch, end


class FetchSize:
    """Messages per fetch: fixed (`fixed`), or paced by the handlers' rate from `least`."""

    def __init__(self, fixed: int | None, least: int) -> None:
        self.fixed = fixed
        self.least = least
        self._rate = 0.0  # handler calls ended per second, last window
        self._since = time.monotonic()
        self._ended = 0  # handler calls ended at `_since`

    def size(self, ended: int) -> int:
        """How many the next fetch asks for, `ended` handler calls having ended so far."""
        if self.fixed is not None:
            return self.fixed
        now = time.monotonic()
        if now - self._since >= WINDOW_S:
            self._rate = (ended - self._ended) / (now - self._since)
            self._since, self._ended = now, ended
        return int(min(MAX_FETCH, max(self.least, self._rate * AHEAD_S)))


def ack_ranges(handles: Sequence[Handle]) -> list[Range]:
    """Handles as ranges: the consecutive offsets of a queue under one epoch as one
    (topic, queue, offset, epoch, end) handle of [offset, end)."""
    out: list[Range] = []
    for topic, queue_id, offset, epoch in sorted(set(handles), key=_order):
        if out:
            t, q, start, e, end = out[-1]
            if (t, q, e, end) == (topic, queue_id, epoch, offset):
                out[-1] = (t, q, start, e, end + 1)
                continue
        out.append((topic, queue_id, offset, epoch, offset + 1))
    return out


def _order(handle: Handle) -> tuple[str, int, int, int]:
    topic, queue_id, offset, epoch = handle
    return topic, queue_id, epoch, offset
