"""The event stream's pollers, in one process: one poll per period however many
streams of one identity are open.

`SnapshotHub` with a snapshot reader that counts its calls (the cluster read stands
behind it in the console; here it is the count that matters): two listeners of one
identity get the same snapshots from one poll each period, a listener that joins
late gets the last snapshot at once, two identities poll apart, and once the last
listener leaves the poller stops. (Two real streams of a real console share their
snapshots: tests/test_http_api.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dledger_commitlog.console.events import Listener, SnapshotHub

INTERVAL_S = 0.02


class Reads:
    """The hub's reader: each call a new snapshot `{"n": calls so far, "who": client}`."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, client: Any) -> dict[str, Any]:
        self.calls += 1
        return {"n": self.calls, "who": client}


async def numbers(listener: Listener, count: int) -> list[int]:
    out = []
    for _ in range(count):
        event = (await listener.next()).decode()
        assert event.startswith("event: snapshot\ndata: ")
        out.append(int(event.split('"n":')[1].split(",")[0]))
    return out


def test_two_streams_share_one_poll_per_period() -> None:
    async def run() -> None:
        reads = Reads()
        hub = SnapshotHub(reads, INTERVAL_S)
        async with contextlib.AsyncExitStack() as stack:
            a = await stack.enter_async_context(hub.listen("", "console"))
            b = await stack.enter_async_context(hub.listen("", "console"))
            got_a, got_b = await asyncio.gather(numbers(a, 5), numbers(b, 5))
            assert got_a == got_b == [1, 2, 3, 4, 5]
            assert reads.calls in (5, 6)  # one read a period (the sixth may be under way)
            late = await stack.enter_async_context(hub.listen("", "console"))
            (first,) = await numbers(late, 1)
            assert first >= 5  # the last snapshot at once, not after a new read
            poller = hub.pollers[""]
        assert hub.pollers == {}
        assert poller.task.cancelling()  # stopped with the last listener
        with contextlib.suppress(asyncio.CancelledError):
            await poller.task
        assert poller.task.cancelled()

    asyncio.run(run())


def test_each_identity_has_its_poller() -> None:
    async def run() -> None:
        reads = Reads()
        hub = SnapshotHub(reads, INTERVAL_S)
        async with hub.listen("alice", "a") as a, hub.listen("bob", "b") as b:
            assert set(hub.pollers) == {"alice", "bob"}
            got_a, got_b = await asyncio.gather(a.next(), b.next())
            assert b'"who":"a"' in got_a and b'"who":"b"' in got_b
        assert hub.pollers == {}

    asyncio.run(run())
