"""How long the node's event loop was blocked: a timer that measures how late it wakes.

The loop that serves clients also runs Raft (heartbeats every few ticks, a 500 ms
election timeout), so anything that holds it for long (a disk read on the loop,
a big decode) delays Raft. The probe sleeps `interval_s` again and again and
records how much later than asked it woke up: a call that holds the loop for
160 ms shows up as about 160 ms of lag. `Status` reports the maximum
(`loop_lag_max_ms`), over the node's life or since the caller last reset it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

INTERVAL_S: Final = 0.01


class LoopLagProbe:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._max_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start probing the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-probe")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            late = loop.time() - asked
            self._max_s = max(self._max_s, late)

    def max_ms(self, reset: bool = False) -> float:
        """The longest delay seen (ms); `reset` starts a new window afterwards."""
        value = self._max_s * 1000.0
        if reset:
            self._max_s = 0.0
        return value

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
