"""Group commit and periodic flush: one fsync serves many writers, on the loop only when fast."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from netkit.tasks import cancel_and_wait
from store.flush import GroupCommit, PeriodicFlush
from store.mapped_file import MappedFileQueue


class CountingQueue(MappedFileQueue):
    """The real file queue, counting fsync rounds and the threads that ran them."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, 1 << 20)
        self.flushes = 0
        self.threads: set[int] = set()

    def flush(self) -> int:
        self.flushes += 1
        self.threads.add(threading.get_ident())
        return super().flush()


@pytest.mark.parametrize("inline_max_s", [0.0, 10.0], ids=["thread", "inline"])
def test_group_commit_serves_many_writers_with_few_fsyncs(
    tmp_path: Path, inline_max_s: float
) -> None:
    """64 writers of one loop pass share fsyncs; with inline fsyncs off (a slow disk)
    none runs on the loop; allowed, the pass's requests get one fsync there."""
    q = CountingQueue(tmp_path)

    async def main() -> list[int]:
        gc = GroupCommit(q, inline_max_s=inline_max_s)

        async def writer(i: int) -> int:
            end = q.append(bytes([i]) * 100) + 100
            flushed = await gc.sync(end)
            assert q.flushed_position >= end
            return flushed

        results = await asyncio.gather(*(writer(i) for i in range(64)))
        await gc.close()
        return results

    results = asyncio.run(main())
    assert min(results) >= 100
    assert q.flushed_position == 6400
    if inline_max_s:
        assert q.flushes == 1
        assert q.threads == {threading.get_ident()}
    else:
        assert 1 <= q.flushes < 64
        assert threading.get_ident() not in q.threads
    q.close()


class SlowQueue(CountingQueue):
    """fsyncs that take 5 ms: a disk too slow to wait for on the loop."""

    def flush(self) -> int:
        flushed = super().flush()
        time.sleep(0.005)
        return flushed


def test_group_commit_leaves_the_loop_once_fsyncs_are_slow(tmp_path: Path) -> None:
    """The first fsync may run inline; once the average is over `inline_max_s`, every
    later one runs in the flusher thread, and each writer is still answered."""
    q = SlowQueue(tmp_path)
    loop_thread = threading.get_ident()
    on_loop: list[bool] = []

    async def main() -> None:
        gc = GroupCommit(q, inline_max_s=0.002)
        for i in range(20):
            end = q.append(bytes([i]) * 100)
            before = q.flushes
            assert await gc.sync(end + 100) >= end + 100
            assert q.flushes == before + 1
            on_loop.append(loop_thread in q.threads)
            q.threads.clear()
        await gc.close()

    asyncio.run(main())
    assert on_loop[0] is True  # nothing measured yet: the first one is inline
    assert not any(on_loop[3:])  # 5 ms fsyncs took the average past 2 ms by then
    q.close()


def test_group_commit_returns_at_once_when_already_durable(tmp_path: Path) -> None:
    q = CountingQueue(tmp_path)
    q.append(b"x" * 10)
    q.flush()

    async def main() -> int:
        gc = GroupCommit(q)
        flushed = await gc.sync(10)
        await gc.close()
        return flushed

    assert asyncio.run(main()) == 10
    assert q.flushes == 1
    q.close()


class Broken(CountingQueue):
    """Every fsync fails, as on a disk that has gone bad."""

    def flush(self) -> int:
        self.flushes += 1
        raise OSError("disk on fire")


def test_group_commit_fails_waiters_when_fsync_fails_and_never_retries(tmp_path: Path) -> None:
    q = Broken(tmp_path)

    async def main() -> tuple[str, str]:
        gc = GroupCommit(q)
        q.append(b"y")
        try:
            with pytest.raises(OSError) as first:
                await gc.sync(1)
            # A later fsync could "succeed" after the kernel dropped the dirty
            # pages: group commit must not report durability again.
            q.append(b"z")
            with pytest.raises(OSError) as second:
                await gc.sync(2)
        finally:
            await gc.close()
        return str(first.value), str(second.value)

    first, second = asyncio.run(main())
    assert first == "disk on fire"
    assert "an earlier fsync failed (disk on fire)" in second
    assert q.flushes == 1
    q.close()


def test_periodic_flush_stops_and_reports_after_a_failed_fsync(tmp_path: Path) -> None:
    q = Broken(tmp_path)
    errors: list[BaseException] = []

    async def main() -> None:
        failed = asyncio.Event()

        def on_error(exc: BaseException) -> None:
            errors.append(exc)
            failed.set()

        pf = PeriodicFlush(q, interval_ms=10, min_bytes=1 << 30, on_error=on_error)
        pf.start()
        q.append(b"a" * 100)
        async with asyncio.timeout(5):
            await failed.wait()
        q.append(b"b" * 100)
        pf.poke()
        await asyncio.sleep(0.05)  # five more intervals in which it must not flush again
        await pf.close()  # and no final flush either

    asyncio.run(main())
    assert [str(e) for e in errors] == ["disk on fire"]
    assert q.flushes == 1
    q.close()


def test_periodic_flush_flushes_pending_bytes_and_on_close(tmp_path: Path) -> None:
    q = CountingQueue(tmp_path)

    async def main() -> None:
        flushed = asyncio.Event()
        pf = PeriodicFlush(
            q, interval_ms=10, min_bytes=1 << 30, on_flush=lambda pos, _s: flushed.set()
        )
        pf.start()
        q.append(b"a" * 100)
        async with asyncio.timeout(5):
            await flushed.wait()
        assert q.flushed_position == 100
        q.append(b"b" * 100)
        await pf.close()

    asyncio.run(main())
    assert q.flushed_position == 200
    q.close()


def test_periodic_flush_flushes_early_past_min_bytes(tmp_path: Path) -> None:
    q = CountingQueue(tmp_path)

    async def main() -> None:
        flushed = asyncio.Event()
        pf = PeriodicFlush(
            q, interval_ms=60_000, min_bytes=1000, on_flush=lambda pos, _s: flushed.set()
        )
        pf.start()
        q.append(b"c" * 10)
        pf.poke()  # below min_bytes: no flush
        q.append(b"c" * 1990)
        pf.poke()
        async with asyncio.timeout(5):
            await flushed.wait()
        assert q.flushed_position == 2000
        await pf.close()

    asyncio.run(main())
    q.close()


def test_periodic_flush_closes_when_the_cancel_meets_a_poke(tmp_path: Path) -> None:
    """close() right after a poke: the cancel and the wake-up land in the same loop
    pass. Python 3.11's wait_for returned the poke and dropped the cancel, and close
    waited forever (a node's shutdown hung in CI)."""
    q = CountingQueue(tmp_path)

    async def main() -> None:
        pf = PeriodicFlush(q, interval_ms=60_000, min_bytes=1)
        pf.start()
        await asyncio.sleep(0)  # the flush loop waits for a poke
        task = pf._task
        q.append(b"d" * 10)
        pf.poke()
        closing = asyncio.ensure_future(pf.close())
        done, _ = await asyncio.wait([closing], timeout=5)  # asyncio.wait cancels nothing
        assert done, "close() did not return"
        assert task is not None and task.done(), "the flush loop still runs"

    asyncio.run(main())
    assert q.flushed_position == 10
    q.close()


def test_cancel_and_wait_absorbs_the_tasks_cancel_but_not_the_callers() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.ensure_future(forever())
        await asyncio.sleep(0)
        await cancel_and_wait(task)  # returns: the task's own cancel is absorbed
        assert task.cancelled()

        async def stubborn() -> None:  # ends only a moment after its cancel
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.5)
                raise

        slow = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        with pytest.raises(TimeoutError):  # a timeout around the wait still fires
            async with asyncio.timeout(0.1):
                await cancel_and_wait(slow)

    asyncio.run(main())


def test_group_commit_flushes_again_after_a_truncation_moved_positions_back(
    tmp_path: Path,
) -> None:
    """A follower's log cut (a conflicting append) writes below what was flushed:
    the next request is lower than earlier ones and must still be served."""
    q = CountingQueue(tmp_path)

    async def main() -> list[int]:
        gc = GroupCommit(q)
        seen: list[int] = []
        done = asyncio.Event()

        def durable(flushed: int) -> None:
            seen.append(flushed)
            if flushed >= 80 and q.write_position == 80:
                done.set()

        gc.add_listener(durable)
        q.append(b"a" * 100)
        await gc.sync(100)
        q.truncate(50)
        q.append(b"b" * 30)  # ends at 80, below the 100 requested before
        gc.request(80)
        async with asyncio.timeout(5):
            await done.wait()
        await gc.close()
        return seen

    seen = asyncio.run(main())
    assert seen[0] == 100 and seen[-1] == 80
    assert q.flushed_position == 80
    q.close()


def test_group_commit_answers_a_request_for_bytes_already_flushed(tmp_path: Path) -> None:
    """Bytes another flush made durable (the entry checkpointer's) need no fsync, but a
    request for them is answered all the same: the listeners hear the flushed position
    on the loop's next pass, as from the flush thread, never from inside request()."""
    q = CountingQueue(tmp_path)
    q.append(b"c" * 40)
    q.flush()  # someone else's flush, before the request

    async def main() -> tuple[list[int], list[int], int]:
        gc = GroupCommit(q)
        seen: list[int] = []
        heard = asyncio.Event()

        def durable(flushed: int) -> None:
            seen.append(flushed)
            heard.set()

        gc.add_listener(durable)
        gc.request(40)
        gc.request(10)  # covered too: the same answer serves both
        during = list(seen)
        async with asyncio.timeout(5):
            await heard.wait()
        await gc.close()
        return during, seen, gc.fsync_count

    during, seen, fsyncs = asyncio.run(main())
    assert during == []  # not from inside request(): its caller may not be ready
    assert seen == [40]
    assert fsyncs == 0 and q.flushes == 1  # no fsync of its own
    q.close()
