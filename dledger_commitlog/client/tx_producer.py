"""Transaction producers: answer the cluster's checks of undecided transactions.

A half message left undecided (the producer crashed between `put_half` and
`end_transaction`, or the end was lost) is checked back by the leader with a
producer of its group (docs/delayed-and-transactional.md). `TransactionProducer`
(blocking, a thread per server) and `AsyncTransactionProducer` (asyncio) keep a
`TransactionChecks` stream open to every server of the client, since any of them
may lead, and answer each check with `check(TransactionCheck)`: True commits,
False rolls back, None leaves it for the next check (as does a `check` that
raises, which is logged). A broken stream is reopened after `reconnect_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc

from dledger_commitlog.client.aio import AsyncClient
from dledger_commitlog.client.blocking import Client
from dledger_commitlog.client.values import StoredMessage, stored_message
from proto import dledger_pb2 as pb

log = logging.getLogger(__name__)

_A = pb.TransactionCheckAnswer
C = TypeVar("C")
F = TypeVar("F")


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    transaction_id: str
    half_offset: int
    check_times: int
    message: StoredMessage  # as its real topic will hold it


def _check_of(msg: pb.TransactionCheck) -> TransactionCheck:
    return TransactionCheck(
        msg.transaction_id, msg.half_offset, msg.check_times, stored_message(msg.message)
    )


def _answer(check: TransactionCheck, decision: bool | None) -> pb.TransactionCheckAnswer:
    action = _A.UNKNOWN if decision is None else (_A.COMMIT if decision else _A.ROLLBACK)
    return _A(transaction_id=check.transaction_id, half_offset=check.half_offset, action=action)


class _Producer(Generic[C, F]):
    """What both producers hold: the client, the group, the check, the reconnect pause."""

    def __init__(
        self, client: C, producer_group: str, check: F, *, reconnect_s: float = 0.5
    ) -> None:
        if not producer_group:
            raise ValueError("a transaction producer needs a producer group")
        self.client = client
        self.group = producer_group
        self._check = check
        self._reconnect_s = reconnect_s
        self.answered = 0


class TransactionProducer(_Producer[Client, Callable[[TransactionCheck], bool | None]]):
    """Blocking: one thread per server keeps its check stream open (a context manager)."""

    def __init__(
        self,
        client: Client,
        producer_group: str,
        check: Callable[[TransactionCheck], bool | None],
        *,
        reconnect_s: float = 0.5,
    ) -> None:
        super().__init__(client, producer_group, check, reconnect_s=reconnect_s)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._calls: dict[str, Any] = {}
        self._lock = threading.Lock()

    def start(self) -> TransactionProducer:
        for address in self.client.servers:
            t = threading.Thread(
                target=self._serve, args=(address,), daemon=True, name=f"tx-checks-{address}"
            )
            t.start()
            self._threads.append(t)
        return self

    def _serve(self, address: str) -> None:
        while not self._stop.is_set():
            answers: queue.SimpleQueue[pb.TransactionCheckAnswer | None] = queue.SimpleQueue()

            def requests(q: queue.SimpleQueue[Any] = answers) -> Iterator[Any]:
                yield _A(producer_group=self.group)
                while (item := q.get()) is not None:
                    yield item

            try:
                call = self.client._stub(address).TransactionChecks(
                    requests(), metadata=self.client._metadata("TransactionChecks")
                )
                with self._lock:
                    self._calls[address] = call
                if self._stop.is_set():
                    call.cancel()
                for msg in call:
                    check = _check_of(msg)
                    try:
                        decision = self._check(check)
                    except Exception:
                        log.exception("transaction check of %s failed", check.transaction_id)
                        decision = None
                    answers.put(_answer(check, decision))
                    self.answered += 1
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    log.info("check stream to %s ended: %s", address, exc.code())
            finally:
                answers.put(None)
                with self._lock:
                    self._calls.pop(address, None)
            self._stop.wait(self._reconnect_s)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            calls = list(self._calls.values())
        for call in calls:
            call.cancel()
        for t in self._threads:
            t.join(timeout=5.0)
        self._threads.clear()

    def __enter__(self) -> TransactionProducer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncTransactionProducer(
    _Producer[AsyncClient, Callable[[TransactionCheck], Awaitable[bool | None]]]
):
    """asyncio: one task per server keeps its check stream open (`async with`)."""

    def __init__(
        self,
        client: AsyncClient,
        producer_group: str,
        check: Callable[[TransactionCheck], Awaitable[bool | None]],
        *,
        reconnect_s: float = 0.5,
    ) -> None:
        super().__init__(client, producer_group, check, reconnect_s=reconnect_s)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> AsyncTransactionProducer:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._serve(a), name=f"tx-checks-{a}") for a in self.client.servers
        ]
        return self

    async def _serve(self, address: str) -> None:
        while True:
            answers: asyncio.Queue[pb.TransactionCheckAnswer | None] = asyncio.Queue()

            async def requests(q: asyncio.Queue[Any] = answers) -> Any:
                yield _A(producer_group=self.group)
                while (item := await q.get()) is not None:
                    yield item

            call = self.client._stub(address).TransactionChecks(
                requests(), metadata=self.client._metadata("TransactionChecks")
            )
            try:
                async for msg in call:
                    check = _check_of(msg)
                    try:
                        decision = await self._check(check)
                    except Exception:
                        log.exception("transaction check of %s failed", check.transaction_id)
                        decision = None
                    answers.put_nowait(_answer(check, decision))
                    self.answered += 1
            except grpc.RpcError as exc:
                log.info("check stream to %s ended: %s", address, exc.code())
            finally:
                answers.put_nowait(None)
                call.cancel()
            await asyncio.sleep(self._reconnect_s)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def __aenter__(self) -> AsyncTransactionProducer:
        return await self.start()

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
