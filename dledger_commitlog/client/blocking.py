"""`Client`: the blocking client, for threads (one client may serve many).

Owns how a blocking call performs the core's steps (`retry.Run`): a unary call
on a blocking gRPC channel, `time.sleep` for a back-off, servers' Status asked one
after another; and the event loop its framed puts run in (`_LoopThread`).

Invariants: every Client of a process runs its framed puts in one event loop, in
one daemon thread, and that loop is never closed. (gRPC's poller hands a call's
completion events to the loop the call was made in, also events that come after
the call was cancelled and its client closed; one for a closed loop makes
whichever loop passes it on log "Event loop is closed". A loop that is never
closed is never handed one.) A client's pipes and asyncio channels are touched
only in that loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

import grpc

from dledger_commitlog.client import retry
from dledger_commitlog.client.access import CHANNEL_OPTIONS, Channels
from dledger_commitlog.client.api import BlockingClientBase, chunks
from dledger_commitlog.client.errors import ClientError
from dledger_commitlog.client.groups import GroupOps
from dledger_commitlog.client.values import MessageSpec, NodeStatus, PutResult, StatusError

R = TypeVar("R")


class _LoopThread:
    """The event loop, in a daemon thread, that every blocking client's framed puts
    run in: one per process, started by the first framed put, never closed."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _shared: ClassVar[_LoopThread | None] = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="dledger-puts", daemon=True
        )
        self._thread.start()

    @classmethod
    def shared(cls) -> _LoopThread:
        """The process's loop (a fresh one in a forked child, where the thread is gone)."""
        with cls._lock:
            if cls._shared is None or cls._shared.pid != os.getpid():
                cls._shared = cls()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class Client(GroupOps, BlockingClientBase):
    """Blocking client: one gRPC channel per server, reused across calls and threads."""

    def __init__(self, servers: Sequence[str] | str, **kwargs: Any) -> None:
        super().__init__(servers, **kwargs)
        self._sync = Channels(lambda address: self.access.channel(address, CHANNEL_OPTIONS))

    def _stub(self, address: str) -> Any:
        return self._sync.stub(address)

    def _run(self, op: retry.Op[R]) -> R:
        run = retry.Run(self._router, self, op)
        while run.step is not None:
            run.answer(self._perform(run.step))
        return run.result

    def _perform(self, step: retry.Step) -> Any:
        """Do `step` (a framed put: in the process's put loop); what came of it."""
        if isinstance(step, retry.Pause):
            time.sleep(step.delay_s)
            return None
        if isinstance(step, retry.Discover):
            return self._statuses(step)
        if step.framed:
            return _LoopThread.shared().run(self._framed_put(step))
        try:
            return step.op.call(self._stub(step.address), step.timeout_s, self._metadata)
        except grpc.RpcError as exc:
            return retry.Failure.of(exc)

    def _statuses(self, step: retry.Discover) -> list[NodeStatus | StatusError]:
        """Each server's Status in turn, while the call has time left."""
        out: list[NodeStatus | StatusError] = []
        for address in self.servers:
            budget_s = step.budget_s()
            if budget_s <= 0:
                break
            out.append(self._status_or_error(address, budget_s))
        return out

    def _status_or_error(self, address: str, timeout_s: float | None) -> NodeStatus | StatusError:
        try:
            return self.status(address, timeout_s)
        except ClientError as exc:
            return StatusError(address, exc)

    def status_all(self, timeout_s: float | None = None) -> list[NodeStatus | StatusError]:
        """Every server's Status (or why it gave none), in the order of `servers`."""
        return [self._status_or_error(address, timeout_s) for address in self.servers]

    def put_stream(self, messages: Iterable[MessageSpec], batch: int = 64) -> Iterator[PutResult]:
        """Put an unbounded sequence in order, `batch` messages per PutBatch call."""
        for chunk in chunks(messages, batch):
            yield from self.put_batch(chunk)

    def close(self) -> None:
        """Close the channels and the put streams (a later call opens them again)."""
        for channel in self._sync.take():
            channel.close()
        if self._pipes or self._aio:  # (read outside the loop: a put racing close reopens)
            _LoopThread.shared().run(self._close_aio())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
