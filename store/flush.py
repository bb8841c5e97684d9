"""Flush services: sync group commit and async periodic flush, both off the event loop.

`GroupCommit` (RocketMQ's GroupCommitService) lets many writers wait for
durability of their bytes with one fsync between them: a writer calls
`await sync(pos)`; one flusher task runs `target.flush()` in a worker thread,
covering every byte appended before that flush started, then releases every
waiter whose position it covers in one pass. Writers that arrive while an fsync
runs are served by the next one. Invariants: a waiter is released only when
`flushed_position >= its position`; at most one fsync is in flight per target.

`PeriodicFlush` (FlushRealTimeService) flushes every `interval_ms`, or sooner
once `min_bytes` are unflushed, for the async flush mode: puts are acknowledged
before fsync and the loss window on power failure is at most one interval.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol


class Flushable(Protocol):
    @property
    def write_position(self) -> int: ...

    @property
    def flushed_position(self) -> int: ...

    def flush(self) -> int: ...


class GroupCommit:
    """Writers await `sync(pos)`; one fsync at a time serves them all.

    The first waiter starts an fsync at once from its own call (no task hop), so
    the fsync runs in its thread while the event loop goes on appending for the
    writers behind it; those are covered by the next fsync, started as soon as
    this one completes.
    """

    def __init__(
        self,
        target: Flushable,
        *,
        executor: ThreadPoolExecutor | None = None,
        on_flush: Callable[[int, float], None] | None = None,
    ) -> None:
        self._target = target
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix="group-commit")
        self._waiters: collections.deque[tuple[int, asyncio.Future[int]]] = collections.deque()
        self._inflight: asyncio.Future[tuple[int, float]] | None = None
        self._closed = False
        self._on_flush = on_flush  # (flushed position, seconds the fsync took)
        self.fsync_count = 0
        self.error: BaseException | None = None  # a failed fsync: never retried

    async def sync(self, position: int | None = None) -> int:
        """Return once every byte below `position` (default: all written) is on disk."""
        target = self._target
        pos = target.write_position if position is None else position
        if target.flushed_position >= pos:
            return target.flushed_position
        if self.error is not None:
            raise OSError(f"an earlier fsync failed ({self.error}); nothing is flushed since")
        if self._closed:
            raise ConnectionAbortedError("group commit closed")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append((pos, fut))
        if self._inflight is None:
            self._start_flush()
        return await fut

    def _timed_flush(self) -> tuple[int, float]:
        started = time.perf_counter()
        flushed = self._target.flush()
        return flushed, time.perf_counter() - started

    def _start_flush(self) -> None:
        loop = asyncio.get_running_loop()
        self._inflight = loop.run_in_executor(self._executor, self._timed_flush)
        self._inflight.add_done_callback(self._flush_done)

    def _flush_done(self, done: asyncio.Future[tuple[int, float]]) -> None:
        self._inflight = None
        if done.cancelled():
            self._fail_all(ConnectionAbortedError("group commit closed"))
            return
        exc = done.exception()
        if exc is not None:  # an fsync error fails every waiter, now and later
            self.error = exc
            self._fail_all(exc)
            return
        flushed, seconds = done.result()
        self.fsync_count += 1
        if self._on_flush is not None:
            self._on_flush(flushed, seconds)
        self._release(flushed)
        if self._waiters and not self._closed:
            self._start_flush()

    def _release(self, flushed: int) -> None:
        waiters = self._waiters
        # Positions arrive in append order almost always; keep any stragglers.
        kept: list[tuple[int, asyncio.Future[int]]] = []
        while waiters:
            pos, fut = waiters.popleft()
            if pos <= flushed:
                if not fut.done():
                    fut.set_result(flushed)
            else:
                kept.append((pos, fut))
        waiters.extend(kept)

    def _fail_all(self, exc: BaseException) -> None:
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    async def close(self) -> None:
        """Finish the fsync in flight (its waiters are served), fail the rest."""
        self._closed = True
        if self._inflight is not None:
            with contextlib.suppress(Exception):  # already delivered to its waiters
                await asyncio.shield(self._inflight)
        self._fail_all(ConnectionAbortedError("group commit closed"))
        if self._own_executor:
            self._executor.shutdown(wait=True)


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


class PeriodicFlush:
    """Flush every `interval_ms`, or as soon as `min_bytes` are pending (checked on `poke`)."""

    def __init__(
        self,
        target: Flushable,
        *,
        interval_ms: int = 500,
        min_bytes: int = 4 * 4096,
        executor: ThreadPoolExecutor | None = None,
        on_flush: Callable[[int, float], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if interval_ms <= 0:
            raise ValueError("interval_ms must be positive")
        self._target = target
        self._interval_s = interval_ms / 1000.0
        self._min_bytes = min_bytes
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix="periodic-flush")
        self._poke = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._on_flush = on_flush
        self._on_error = on_error
        self.error: BaseException | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def poke(self) -> None:
        """Writers call this after appending; flushes early once min_bytes are pending."""
        if self._target.write_position - self._target.flushed_position >= self._min_bytes:
            self._poke.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel
            # that arrives as the poke does, and close() then waited forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._poke.wait()
            self._poke.clear()
            if self._target.flushed_position >= self._target.write_position:
                continue
            started = time.perf_counter()
            try:
                flushed = await loop.run_in_executor(self._executor, self._target.flush)
            except Exception as exc:
                # After a failed fsync the kernel may have dropped the dirty pages:
                # a retry that succeeds proves nothing. Stop flushing and report.
                self.error = exc
                if self._on_error is not None:
                    self._on_error(exc)
                return
            if self._on_flush is not None:
                self._on_flush(flushed, time.perf_counter() - started)

    async def close(self) -> None:
        """Stop and flush what is left, so a clean shutdown loses nothing.

        After a failed flush nothing more is flushed (see `_run`).
        """
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self.error is None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._target.flush)
        if self._own_executor:
            self._executor.shutdown(wait=True)
