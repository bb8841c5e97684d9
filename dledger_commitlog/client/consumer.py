"""`Consumer`: a blocking consumer of a group, its handler run in threads, over
`async_consumer.AsyncConsumer` (see there for what delivery promises).

    def handle(m: ConsumedMessage) -> bool | None | Retry:
        ...                       # None or True: done (acked); False, Retry(level)
                                  # or an exception: retried later
    with Consumer("127.0.0.1:7401,...", "billing", ["orders"], handle) as consumer:
        consumer.run()            # until stop() (or max_messages, idle_exit_s)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, Self

from dledger_commitlog.client.async_consumer import AsyncConsumer, Topics, run_together
from dledger_commitlog.client.groups import ConsumedMessage as ConsumedMessage
from dledger_commitlog.client.groups import HandlerResult as HandlerResult
from dledger_commitlog.client.groups import QueueLease
from dledger_commitlog.client.groups import Retry as Retry


class Consumer:
    """A blocking consumer: `run()` consumes in this thread until `stop()` (from another
    thread or a signal handler) or its limits; `start()` runs it in a thread of its
    own. The handler runs in a pool of `concurrency` threads. Same arguments as
    `AsyncConsumer`, with the servers (or a cluster file's list) first."""

    def __init__(
        self,
        servers: str | Sequence[str],
        group: str,
        topics: Topics,
        handler: Callable[[ConsumedMessage], HandlerResult],
        **kwargs: Any,
    ) -> None:
        self._args = (servers, group, topics, handler)
        self._kwargs = kwargs
        self._consumers: list[AsyncConsumer] = []
        self._stop_asked = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.processed = 0

    @property
    def member_id(self) -> str | None:
        return self._consumers[0].member_id if self._consumers else None

    @property
    def leases(self) -> tuple[QueueLease, ...]:
        """The queues held (of every shard consumed: a lease names no shard)."""
        return tuple(lease for c in self._consumers for lease in c.leases)

    async def _open(self) -> list[AsyncConsumer]:
        """The consumers to run together: one, of the servers' shard
        (`RoutedConsumer`: one per data shard of the cluster)."""
        return [AsyncConsumer(*self._args, **self._kwargs)]

    async def _close(self) -> None:
        """Close what `_open` opened besides the consumers (each closes its own client)."""

    def run(self, *, max_messages: int = 0, idle_exit_s: float = 0.0) -> int:
        """Consume until stopped or a limit (see `AsyncConsumer.run`); how many handled."""

        async def main() -> int:
            try:
                self._consumers = await self._open()
                if self._stop_asked:
                    for consumer in self._consumers:
                        consumer.stop()
                return await run_together(
                    self._consumers, max_messages=max_messages, idle_exit_s=idle_exit_s
                )
            finally:
                self.processed = sum(c.processed for c in self._consumers)
                await self._close()

        return asyncio.run(main())

    def start(self, **limits: Any) -> Self:
        """Run in a background thread (`join` waits for it to end)."""

        def target() -> None:
            try:
                self.run(**limits)
            except BaseException as exc:  # reported by join()
                self._error = exc

        self._thread = threading.Thread(target=target, name="dledger-consumer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop_asked = True
        for consumer in self._consumers:
            consumer.stop()

    def join(self, timeout_s: float | None = None) -> int:
        """Wait for a started consumer to end; re-raise what ended it, if it failed."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._error is not None:
            raise self._error
        return self.processed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._thread is not None:
            self.join(60.0)
