"""`AsyncClient`: the asyncio client (grpc.aio); use one in one event loop.

Owns how an asyncio call performs the core's steps (`retry.Run`): an awaited
unary call on an asyncio channel, `asyncio.sleep` for a back-off, every server's
Status asked at once. Its framed puts run in the caller's own loop.
Invariant: nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

from dledger_commitlog.client import retry
from dledger_commitlog.client.api import AsyncClientBase, chunks
from dledger_commitlog.client.errors import ClientError
from dledger_commitlog.client.groups import GroupOps
from dledger_commitlog.client.values import MessageSpec, NodeStatus, PutResult, StatusError

R = TypeVar("R")


class AsyncClient(GroupOps, AsyncClientBase):
    """asyncio client, the same API as `Client` with coroutines."""

    def _stub(self, address: str) -> Any:
        return self._aio.stub(address)

    async def _run(self, op: retry.Op[R]) -> R:
        run = retry.Run(self._router, self, op)
        while run.step is not None:
            run.answer(await self._perform(run.step))
        return run.result

    async def _perform(self, step: retry.Step) -> Any:
        """Do `step`, awaiting it; what came of it."""
        if isinstance(step, retry.Pause):
            await asyncio.sleep(step.delay_s)
            return None
        if isinstance(step, retry.Discover):
            return await self.status_all(timeout_s=step.budget_s())
        if step.framed:
            return await self._framed_put(step)
        try:
            return await step.op.call(self._stub(step.address), step.timeout_s, self._metadata)
        except grpc.RpcError as exc:
            return retry.Failure.of(exc)

    async def status_all(self, timeout_s: float | None = None) -> list[NodeStatus | StatusError]:
        """Every server's Status (or why it gave none), asked at once, in server order."""

        async def one(address: str) -> NodeStatus | StatusError:
            try:
                return await self.status(address, timeout_s)
            except ClientError as exc:
                return StatusError(address, exc)

        return list(await asyncio.gather(*(one(s) for s in self.servers)))

    async def put_stream(
        self, messages: Iterable[MessageSpec], batch: int = 64
    ) -> AsyncIterator[PutResult]:
        """Put an unbounded sequence in order, `batch` messages per PutBatch call."""
        for chunk in chunks(messages, batch):
            for result in await self.put_batch(chunk):
                yield result

    async def close(self) -> None:
        """Close the put streams and the channels (a later call opens them again)."""
        await self._close_aio()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
