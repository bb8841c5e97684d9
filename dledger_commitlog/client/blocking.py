"""`Client`: the blocking client, for threads (one client may serve many).

Owns how a blocking call performs the core's steps (`retry.Run`): a unary call
on a blocking gRPC channel, `time.sleep` for a back-off, servers' Status asked one
after another; and the event loop its framed puts run in (`_LoopThread`).

Invariant: a client's pipes and asyncio channels are touched only in its loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

from dledger_commitlog.client import retry
from dledger_commitlog.client.access import CHANNEL_OPTIONS, Channels
from dledger_commitlog.client.api import ClientBase, chunks
from dledger_commitlog.client.errors import ClientError
from dledger_commitlog.client.values import MessageSpec, NodeStatus, PutResult, StatusError

R = TypeVar("R")


class _LoopThread:
    """An event loop in a daemon thread: the blocking client's framed puts run there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="dledger-puts",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Cancel what still runs there (gRPC's own call tasks too), as asyncio.run does."""
        self.run(_cancel_others())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _cancel_others() -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class Client(ClientBase):
    """Blocking client: one gRPC channel per server, reused across calls and threads."""

    def __init__(self, servers: Sequence[str] | str, **kwargs: Any) -> None:
        super().__init__(servers, **kwargs)
        self._sync = Channels(lambda address: self.access.channel(address, CHANNEL_OPTIONS))
        self._loop: _LoopThread | None = None  # the framed puts' event loop
        self._loop_lock = threading.Lock()  # puts from several threads start one loop

    def _framing_loop(self) -> _LoopThread:
        with self._loop_lock:
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    def _stub(self, address: str) -> Any:
        return self._sync.stub(address)

    def _run(self, op: retry.Op[R]) -> R:
        run = retry.Run(self._router, self, op)
        while run.step is not None:
            run.answer(self._perform(run.step))
        return run.result

    def _perform(self, step: retry.Step) -> Any:
        """Do `step` (a framed put: in the client's put loop); what came of it."""
        if isinstance(step, retry.Pause):
            time.sleep(step.seconds)
            return None
        if isinstance(step, retry.Discover):
            return self._statuses(step)
        if step.framed:
            return self._framing_loop().run(self._framed_put(step))
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
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.run(self._close_aio())
            loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
