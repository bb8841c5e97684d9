"""Flush services: sync group commit and async periodic flush, off the event loop when slow.

`GroupCommit` (RocketMQ's GroupCommitService) lets many writers wait for
durability of their bytes with one fsync between them: a writer calls
`await sync(pos)` (or `request(pos)` and listens); one flusher thread (or, on a
fast disk with nothing else waiting, the loop itself, see the class) runs
`target.flush()`, covering every byte appended before that flush started, then
releases every waiter whose position it covers in one pass. Writers that arrive
while an fsync runs are served by the next one. Invariants: a waiter is released
only when `flushed_position >= its position`; every request is answered (one
for bytes already flushed, by this or any other flush, on the loop's next pass);
at most one fsync is in flight per target; after a failed fsync nothing is
reported durable again.

`PeriodicFlush` (FlushRealTimeService) flushes every `interval_ms`, or sooner
once `min_bytes` are unflushed, for the async flush mode: puts are acknowledged
before fsync and the loss window on power failure is at most one interval.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from netkit.tasks import cancel_and_wait

INLINE_MAX_S = 0.002  # fsyncs faster than this (on average, lately) may run on the loop


class Flushable(Protocol):
    @property
    def write_position(self) -> int: ...

    @property
    def flushed_position(self) -> int: ...

    def flush(self) -> int: ...


class GroupCommit:
    """Writers ask for durability up to a position; one fsync thread serves them all.

    The loop hands positions to a dedicated flusher thread through a
    `queue.SimpleQueue` (no executor, no future per fsync); the thread drains
    every request queued meanwhile, runs one `target.flush()` covering every byte
    appended before it started, and reports the flushed position back with one
    `call_soon_threadsafe`. There the waiters it covers are released in one pass
    and the `on_durable` listeners run (the node driver's pipeline: it keeps
    appending and stepping while the fsync runs, and sends what waited for
    durability from its listener). Writers that arrive while an fsync runs are
    served by the next one. Two ways in: `await sync(pos)`, or `request(pos)`
    plus a listener (no future at all); a request for bytes already flushed is
    answered without an fsync, on the loop's next pass.

    Inline when nothing else waits: the requests of one loop pass made while the
    flusher thread is idle, on a disk whose recent fsyncs took less than
    `inline_max_s` on average, get one fsync on the loop itself at its next pass
    (about a tenth of a millisecond on a local SSD), which spares the two thread hops
    (the thread's wake-up, then its report's) that cost a lone writer more than the
    fsync itself. Once fsyncs grow slower than that (a busy or remote disk), or while
    the thread works, requests go to the thread and the loop never waits for the disk.
    """

    def __init__(
        self,
        target: Flushable,
        *,
        on_flush: Callable[[int, float], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        name: str = "group-commit",
        inline_max_s: float = INLINE_MAX_S,
    ) -> None:
        self._target = target
        self._inline_max_s = inline_max_s
        self._fsync_s = 0.0  # a moving average of the recent fsyncs' duration
        self._thread_requests = 0  # handed to the thread and not yet reported
        self._inline_due = 0  # the highest position asked for this pass (inline)
        self._inline_scheduled = False
        self._on_error = on_error
        self._name = name
        self._waiters: collections.deque[tuple[int, asyncio.Future[int]]] = collections.deque()
        self._requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._on_flush = on_flush  # (flushed position, seconds the fsync took)
        self._listeners: list[Callable[[int], None]] = []
        self._answer_scheduled = False  # a report for requests already covered is due
        self.fsync_count = 0
        self.error: BaseException | None = None  # a failed fsync: never retried

    def add_listener(self, on_durable: Callable[[int], None]) -> None:
        """Call `on_durable(flushed position)` on the loop after every fsync."""
        self._listeners.append(on_durable)

    def request(self, position: int) -> None:
        """Ask for an fsync covering `position` without waiting (see `add_listener`).

        Bytes already flushed (by an earlier fsync, or by anyone else's flush of the
        target) need none: the listeners hear the flushed position all the same, on
        the loop's next pass, as they would from the flush thread (never from inside
        this call, so a caller may request before it is ready to hear the answer).
        """
        if self.error is not None:
            raise OSError(f"an earlier fsync failed ({self.error}); nothing is flushed since")
        if self._closed:
            raise ConnectionAbortedError("group commit closed")
        if position <= self._target.flushed_position:
            # (A truncation may have moved the positions back: this is the only test.)
            if not self._answer_scheduled:
                self._answer_scheduled = True
                asyncio.get_running_loop().call_soon(self._answer_covered)
            return
        if self._thread_requests == 0 and self._fsync_s < self._inline_max_s:
            self._inline_due = max(self._inline_due, position)
            if not self._inline_scheduled:
                self._inline_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_inline)
            return
        self._to_thread(position)

    def _to_thread(self, position: int) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._thread_requests += 1
        self._requests.put(position)

    def _flush_inline(self) -> None:
        """One fsync on the loop for the requests of the pass before (see the class
        docstring); its listeners are told here, a pass after those requests."""
        if not self._inline_scheduled:
            return  # close() ran it already
        self._inline_scheduled = False
        position, self._inline_due = self._inline_due, 0
        if self.error is not None:
            return
        if self._thread_requests:  # the thread has work: it serves these too
            self._to_thread(position)
            return
        started = time.perf_counter()
        try:
            flushed = self._target.flush()
        except BaseException as exc:
            self._failed(exc)
            return
        self._flushed(flushed, time.perf_counter() - started, 0)
        if flushed < position:  # another thread's flush held those bytes: the thread's turn
            self._to_thread(position)

    async def sync(self, position: int | None = None) -> int:
        """Return once every byte below `position` (default: all written) is on disk."""
        target = self._target
        pos = target.write_position if position is None else position
        if target.flushed_position >= pos:
            return target.flushed_position
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.request(pos)
        self._waiters.append((pos, fut))
        return await fut

    def _run(self) -> None:
        """The flusher thread: one fsync per batch of requests, until None."""
        requests, target = self._requests, self._target
        loop = self._loop
        assert loop is not None
        while True:
            wanted = requests.get()
            stop = wanted is None
            taken = 0 if stop else 1
            while not requests.empty():  # coalesce what queued meanwhile
                if requests.get_nowait() is None:
                    stop = True
                else:
                    taken += 1
            if target.flushed_position < target.write_position or not stop:
                started = time.perf_counter()
                try:
                    flushed = target.flush()
                except BaseException as exc:
                    self._call(loop, self._failed, exc)
                    return
                self._call(loop, self._flushed, flushed, time.perf_counter() - started, taken)
            if stop:
                return

    @staticmethod
    def _call(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(fn, *args)

    def _flushed(self, flushed: int, seconds: float, taken: int) -> None:
        self._thread_requests -= taken
        self._fsync_s += (seconds - self._fsync_s) * 0.25
        self.fsync_count += 1
        if self._on_flush is not None:
            self._on_flush(flushed, seconds)
        self._report(flushed)

    def _answer_covered(self) -> None:
        """Requests that were covered when made: report what is flushed now (no fsync)."""
        self._answer_scheduled = False
        if self.error is None:
            self._report(self._target.flushed_position)

    def _report(self, flushed: int) -> None:
        self._release(flushed)
        for listener in self._listeners:
            listener(flushed)

    def _failed(self, exc: BaseException) -> None:
        self.error = exc  # an fsync error fails every waiter, now and later
        self._fail_all(exc)
        if self._on_error is not None:
            self._on_error(exc)

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
        """Finish the fsyncs requested (their waiters are served), fail the rest."""
        self._closed = True
        self._flush_inline()  # one due this pass: served, not failed
        thread = self._thread
        if thread is not None:
            self._requests.put(None)
            await asyncio.to_thread(thread.join)
            await asyncio.sleep(0)  # run the thread's last report
        self._fail_all(ConnectionAbortedError("group commit closed"))


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
