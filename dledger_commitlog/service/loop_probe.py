"""How long the node's event loop was blocked: a timer that measures how late it fires.

The loop that serves clients also runs Raft (heartbeats every few ticks, a 500 ms
election timeout), so anything that holds it for long (a disk read on the loop,
a big decode) delays Raft. The probe sets a timer again and again and records how
much later than asked it fired: a call that holds the loop for 160 ms shows up as
about 160 ms of lag, less at most one interval. `Status` reports the maximum
(`loop_lag_max_ms`), over the node's life or since the caller last reset it.

Two intervals: 10 ms while someone measures (for `FINE_WINDOW_S` after a reset, the
call every lag measurement starts with), 100 ms otherwise. An idle node's loop then
wakes 10 times a second for the probe, not 100 (at 100 wake-ups a second the probe
alone cost an idle node about 0.4% of a core and 85 context switches a second).
"""

from __future__ import annotations

import asyncio
from typing import Final

INTERVAL_S: Final = 0.01  # while measured
IDLE_INTERVAL_S: Final = 0.1  # otherwise
FINE_WINDOW_S: Final = 60.0  # how long a reset keeps the fine interval


class LoopLagProbe:
    def __init__(
        self, interval_s: float = INTERVAL_S, idle_interval_s: float = IDLE_INTERVAL_S
    ) -> None:
        self.interval_s = interval_s
        self.idle_interval_s = idle_interval_s
        self._max_s = 0.0
        self._fine_until = 0.0  # loop time until which the fine interval applies
        self._asked = 0.0  # when the pending timer should fire
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start probing the running loop (idempotent)."""
        if self._timer is None:
            self._loop = asyncio.get_running_loop()
            self._schedule()

    def _schedule(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        fine = now < self._fine_until
        self._asked = now + (self.interval_s if fine else self.idle_interval_s)
        self._timer = self._loop.call_at(self._asked, self._fire)

    def _fire(self) -> None:
        assert self._loop is not None
        self._max_s = max(self._max_s, self._loop.time() - self._asked)
        self._schedule()

    def max_ms(self, reset: bool = False) -> float:
        """The longest delay seen (ms), counting the pending timer's if it is overdue;
        `reset` starts a new window afterwards, probed at the fine interval for the next
        `FINE_WINDOW_S`."""
        if self._timer is None or self._loop is None:
            return self._max_s * 1000.0
        now = self._loop.time()
        value = max(self._max_s, now - self._asked) * 1000.0
        if reset:
            self._max_s = 0.0
            self._fine_until = now + FINE_WINDOW_S
            self._timer.cancel()  # its delay so far is in `value`
            self._schedule()
        return value

    async def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
