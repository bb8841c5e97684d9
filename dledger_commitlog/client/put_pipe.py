"""Client side of `PutFrames`: concurrent puts to one server coalesced into frames.

Owns `PutPipe`, one long-lived bidirectional stream to one server. Callers hand it
a message each (`put`); a sender task packs whatever is waiting into one frame
(at most `max_messages` / `max_bytes`), lingering up to `linger_s` for more only
while earlier frames are still unanswered (a lone sequential caller never waits);
a reader task resolves each caller's future from the frame's per-message outcome.
Invariants: no frame is written before the server said it accepted the stream
(`PUT_FRAMES_ACCEPTED`), so a refused stream fails its puts with the server's own
status; a message is sent at most once per pipe (a retry is the caller's, through
a new attempt with the same uniq_key); a broken stream fails every unanswered put
with a retryable failure and the pipe is done (`broken`); a caller that gave up
before its message left is never sent; nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from dledger_commitlog.common.protocol import PUT_FRAMES_ACCEPTED
from proto import dledger_pb2 as pb

_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


class PipeFailure(Exception):
    """One put failed: `code` is the gRPC status name; `leader` the redirect, if any."""

    def __init__(self, code: str, details: str, leader: str | None = None) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.leader = leader


class PutPipe:
    def __init__(
        self,
        stub: Any,
        *,
        cluster: str = "",
        metadata: Callable[[], Any] = lambda: None,
        linger_s: float = 0.001,
        max_messages: int = 256,
        max_bytes: int = 1 << 20,
    ) -> None:
        self._stub = stub
        self._cluster = cluster
        self._metadata = metadata
        self._linger_s = linger_s
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._pending: list[tuple[pb.MessageData, asyncio.Future[pb.PutResult]]] = []
        self._unanswered: dict[int, list[asyncio.Future[pb.PutResult]]] = {}
        self._seq = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.broken: PipeFailure | None = None

    async def put(self, message: pb.MessageData) -> pb.PutResult:
        """Send `message` in the next frame; its result, or PipeFailure."""
        if self.broken is not None:
            raise self.broken
        fut: asyncio.Future[pb.PutResult] = asyncio.get_running_loop().create_future()
        self._pending.append((message, fut))
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="put-pipe")
        return await fut

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail(PipeFailure("CANCELLED", "the client closed"))

    # -- the stream ----------------------------------------------------------------

    async def _run(self) -> None:
        call = self._stub.PutFrames(metadata=self._metadata())
        reader = asyncio.get_running_loop().create_task(self._read(call), name="put-pipe-read")
        try:
            if not await self._accepted(call):
                return
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._unanswered and self._linger_s > 0 and not self._full():
                    await asyncio.sleep(self._linger_s)  # more may come while frames fly
                while self._pending:
                    frame, futures = self._take_frame()
                    if futures:
                        self._unanswered[frame.seq] = futures
                        await call.write(frame)
        except asyncio.CancelledError:
            raise
        except grpc.RpcError as exc:
            self._fail(_failure(exc))
        except Exception as exc:  # the channel was closed under us, say
            self._fail(PipeFailure("UNAVAILABLE", f"put stream: {exc}"))
        finally:
            reader.cancel()
            call.cancel()
            # Let gRPC settle the call's status, or its task outlives the loop.
            with contextlib.suppress(BaseException):
                async with asyncio.timeout(1.0):
                    await call.code()

    async def _accepted(self, call: Any) -> bool:
        """Wait for the server's word that it accepted the stream. If it refused it
        instead (no credentials, say, or UNIMPLEMENTED from a server without
        PutFrames), every put fails with the status the server gave."""
        if PUT_FRAMES_ACCEPTED in await call.initial_metadata():
            return True
        code = await call.code()
        if code == grpc.StatusCode.OK:
            self._fail(PipeFailure("UNAVAILABLE", "the server ended the put stream"))
        else:
            self._fail(PipeFailure(code.name, await call.details() or ""))
        return False

    def _full(self) -> bool:
        return len(self._pending) >= self._max_messages

    def _take_frame(self) -> tuple[pb.PutFrame, list[asyncio.Future[pb.PutResult]]]:
        self._seq += 1
        frame = pb.PutFrame(seq=self._seq, cluster=self._cluster)
        futures: list[asyncio.Future[pb.PutResult]] = []
        size = 0
        taken = 0
        for message, fut in self._pending:
            if futures and (len(futures) >= self._max_messages or size >= self._max_bytes):
                break
            taken += 1
            if fut.done():
                continue  # its caller gave up before it left: never sent
            frame.messages.append(message)
            futures.append(fut)
            size += len(message.body) + 64
        del self._pending[:taken]
        return frame, futures

    async def _read(self, call: Any) -> None:
        try:
            async for reply in call:
                futures = self._unanswered.pop(reply.seq, [])
                for fut, outcome in zip(futures, reply.outcomes, strict=False):
                    if fut.done():
                        continue
                    if outcome.code == 0:
                        fut.set_result(outcome.result)
                    else:
                        name = _CODE_NAMES.get(outcome.code, str(outcome.code))
                        # FAILED_PRECONDITION: not the leader (a redirect), or wrong cluster
                        leader = reply.leader or None
                        fut.set_exception(PipeFailure(name, outcome.error, leader))
            self._fail(PipeFailure("UNAVAILABLE", "the server ended the put stream"))
        except grpc.RpcError as exc:
            self._fail(_failure(exc))
        except asyncio.CancelledError:
            raise
        finally:
            if self._task is not None and not self._task.done():
                self._task.cancel()

    def _fail(self, failure: PipeFailure) -> None:
        """The stream is gone: every put not answered yet fails with `failure`."""
        if self.broken is None:
            self.broken = failure
        waiting = [f for fs in self._unanswered.values() for f in fs]
        waiting += [f for _, f in self._pending]
        self._unanswered.clear()
        self._pending.clear()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(failure)
                fut.exception()  # retrieved: a caller that gave up leaves no warning


def _failure(exc: grpc.RpcError) -> PipeFailure:
    code = exc.code()
    return PipeFailure(getattr(code, "name", str(code)), exc.details() or "")
