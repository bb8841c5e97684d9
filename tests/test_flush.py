"""Group commit and periodic flush: one fsync serves many writers, never on the loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

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


def test_group_commit_serves_many_writers_with_few_fsyncs(tmp_path: Path) -> None:
    q = CountingQueue(tmp_path)

    async def main() -> list[int]:
        gc = GroupCommit(q)

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
    assert 1 <= q.flushes < 64
    assert threading.get_ident() not in q.threads
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


def test_group_commit_fails_waiters_when_fsync_fails(tmp_path: Path) -> None:
    class Broken(CountingQueue):
        def flush(self) -> int:
            raise OSError("disk on fire")

    q = Broken(tmp_path)

    async def main() -> str:
        gc = GroupCommit(q)
        q.append(b"y")
        try:
            await gc.sync(1)
        except OSError as exc:
            return str(exc)
        finally:
            await gc.close()
        return "no error"

    assert asyncio.run(main()) == "disk on fire"
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
