"""Linearizable reads on a node: ReadIndex requests waiting for their answers.

Owns `ReadIndexWaiter`: each `ask` hands the core a unique context, waits for the
quorum-confirmed read index the core answers with (`answer`, from a Ready's read
states) and then for this node to have applied up to it. A node that loses its
leader fails every waiting read (`fail_all`) rather than let it hang.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from raft import RaftCore
from raft.types import ReadState


class ReadIndexWaiter:
    def __init__(
        self,
        node_id: int,
        core: RaftCore,
        kick: Callable[[], None],
        wait_for_commit: Callable[[], Awaitable[None]],
        committed_index: Callable[[], int],
    ) -> None:
        self._node_id = node_id
        self._core = core
        self._kick = kick
        self._wait_for_commit = wait_for_commit
        self._committed_index = committed_index
        self._reads: dict[bytes, asyncio.Future[int]] = {}
        self._seq = 0

    async def ask(self, timeout_s: float) -> int:
        """A read position confirmed by a quorum, once applied here (NotLeader, TimeoutError)."""
        self._seq += 1
        ctx = f"{self._node_id}:{self._seq}:{time.monotonic_ns()}".encode()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reads[ctx] = fut
        try:
            self._core.read_index(ctx)
            self._kick()
            async with asyncio.timeout(timeout_s):
                index = await fut
                while self._committed_index() < index:
                    await self._wait_for_commit()
                return index
        finally:
            self._reads.pop(ctx, None)

    def answer(self, states: Sequence[ReadState]) -> None:
        for rs in states:
            fut = self._reads.get(rs.ctx)
            if fut is not None and not fut.done():
                fut.set_result(rs.index)

    def fail_all(self, exc: BaseException) -> None:
        for fut in self._reads.values():
            if not fut.done():
                fut.set_exception(exc)
