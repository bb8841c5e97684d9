"""asyncio task helpers every room with a long-lived task uses."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait until it has ended.

    Its CancelledError is absorbed, but not one aimed at the caller itself (a
    timeout around a close, say): that one still propagates.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise
