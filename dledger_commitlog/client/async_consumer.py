"""`AsyncConsumer`: a consumer of a group on asyncio (`consumer.Consumer` is the
blocking one, over it), and `run_together`, several consumers run as one.

    async def handle(m: ConsumedMessage) -> bool | None | Retry:
        ...                       # None or True: done (acked); False, Retry(level)
                                  # or an exception: retried later
    consumer = AsyncConsumer("127.0.0.1:7401,...", "billing", ["orders"], handle)
    await consumer.run()          # until stop() (or max_messages, idle_exit_s)

Delivery is at least once. The group's coordinator (the leader) divides the
queues among its live members; each consumer heartbeats, fetches what its
queues hold (filtered on the server), runs the handler, and acks what it handled,
or nacks it: to the group's retry topic on the delay levels, then the dead-letter
topic after `max_reconsume` (concurrent mode), or in place (orderly mode, one
message at a time per queue, so a sharding key's order is kept). A message the
handler has not finished within `ack_wait_ms` is delivered again.

Across a leader failover the consumer carries on: its calls follow the new
leader, and its heartbeats claim the queues it holds (with what it has not acked)
so the new leader gives them back to it. A consumer whose heartbeats stop
succeeding for the session timeout stops starting handlers of its queues (they
are someone else's by then) until it heartbeats again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dledger_commitlog.client.aio import AsyncClient
from dledger_commitlog.client.errors import ClientError, GroupRefused, NotFound
from dledger_commitlog.client.groups import ConsumedMessage as ConsumedMessage
from dledger_commitlog.client.groups import Delivery, QueueLease, Subscription
from dledger_commitlog.client.groups import Handler as Handler
from dledger_commitlog.client.groups import HandlerResult as HandlerResult
from dledger_commitlog.client.groups import Retry as Retry
from dledger_commitlog.client.pacing import FetchSize, ack_ranges
from dledger_commitlog.client.quota import Quota
from proto import dledger_pb2 as pb

log = logging.getLogger(__name__)

_FETCH_WAIT_MS = 1000
_ERROR_PAUSE_S = 0.2
_LEAST_FETCH = 32  # a paced fetch asks for at least this many
_ACK_LINGER_S = 0.02  # concurrent mode: the acks of this long go in one call


@dataclass(slots=True)
class _Track:
    """One queue as this member sees it: its lease and the deliveries not acked."""

    epoch: int
    next_offset: int = 0
    unacked: set[int] = field(default_factory=set)
    # orderly: one run of the queue at a time, and what this member has handled of it
    # (a run that outlived its ack wait is delivered again: not handled twice)
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    done: set[int] = field(default_factory=set)


Topics = Sequence[str | Subscription] | Mapping[str, str]


def subscriptions_of(topics: Topics) -> list[Subscription]:
    """Topics as given (names, Subscriptions, or topic -> tag expression)."""
    if isinstance(topics, Mapping):
        return [Subscription(t, e) for t, e in topics.items()]
    if isinstance(topics, str):
        topics = [topics]
    return [t if isinstance(t, Subscription) else Subscription(t) for t in topics]


def new_member_id() -> str:
    """A consumer's id in its group: host, process and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def run_together(
    consumers: Sequence[AsyncConsumer], *, max_messages: int = 0, idle_exit_s: float = 0.0
) -> int:
    """Run `consumers` (e.g. `AsyncRoutedClient.consumers`, one per shard) until
    each has ended: `max_messages` handler calls between them, `idle_exit_s` for each.
    One that fails (bad settings, a conflict) stops the others, and the first error is
    raised once they have left their groups (the others are logged). Cancelled, it
    still waits for them to finish their handlers, ack and leave. How many messages
    the handlers took."""
    if not consumers:
        return 0
    quota = Quota(max_messages)
    runs = [
        asyncio.create_task(c.run(max_messages=quota, idle_exit_s=idle_exit_s)) for c in consumers
    ]
    try:
        await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for consumer in consumers:
            consumer.stop()
        ended = await asyncio.gather(*runs, return_exceptions=True)
    errors = [e for e in ended if isinstance(e, BaseException)]
    for extra in errors[1:]:
        log.error("consumer of group %s also failed: %r", consumers[0].group, extra)
    if errors:
        raise errors[0]
    return sum(c.processed for c in consumers)


class AsyncConsumer:
    """A member of a consumer group on asyncio (see the module docstring). A plain
    function handler runs in a thread pool of `concurrency` threads; a coroutine
    function on the loop. At most `concurrency` handlers run at once."""

    def __init__(
        self,
        client: AsyncClient | str | Sequence[str],
        group: str,
        topics: Topics,
        handler: Handler,
        *,
        orderly: bool = False,
        strategy: str = "average",
        max_reconsume: int = 16,
        ack_wait_ms: int = 30_000,
        first_retry_level: int = 0,
        batch: int | None = None,
        concurrency: int = 8,
        member_id: str | None = None,
        **client_kwargs: Any,
    ) -> None:
        self._own_client = not isinstance(client, AsyncClient)
        self.client = (
            client if isinstance(client, AsyncClient) else AsyncClient(client, **client_kwargs)
        )
        self.group = group
        self.subscriptions = subscriptions_of(topics)
        self.handler = handler
        self.orderly = orderly
        self.strategy = strategy
        self.max_reconsume = max_reconsume
        self.ack_wait_ms = ack_wait_ms
        self.first_retry_level = first_retry_level
        self.batch = batch
        self.concurrency = concurrency
        self.member_id = member_id or new_member_id()
        self.processed = 0  # handler calls that ended (acked or retried)
        self.generation = 0
        self.leases: tuple[QueueLease, ...] = ()
        self._tracks: dict[tuple[str, int], _Track] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._stopping = asyncio.Event()
        self._heartbeat_now = asyncio.Event()
        self._acks: list[tuple[str, int, int, int]] = []
        self._ack_event = asyncio.Event()
        self._closing = False
        self._slots = asyncio.Semaphore(concurrency)  # orderly runs at once
        self._running: set[asyncio.Task[None]] = set()
        self._ready: deque[Delivery] = deque()  # concurrent mode: fetched, not yet started
        self._workers = 0  # concurrent mode: tasks handling `_ready`, one at a time each
        self._backlog = 0  # deliveries taken and not ended (ready, or being handled)
        self._room = asyncio.Event()  # set when a delivery ends
        self._fetch_size = FetchSize(batch, _LEAST_FETCH)
        self._session_s = 3.0
        self._interval_s = 1.0
        self._last_heartbeat = 0.0
        self._last_delivery = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._quota = Quota(0)  # the one `run` is given

    # -- running ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop after the handlers running now (callable from any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stopping.set)
        else:
            self._stopping.set()

    async def run(self, *, max_messages: int | Quota = 0, idle_exit_s: float = 0.0) -> int:
        """Consume until `stop()`, `max_messages` handled (a Quota: shared with other
        consumers) or `idle_exit_s` without a delivery; then finish the handlers
        running, ack, and leave the group. Returns how many messages the handler took.
        Bad settings (a filter that does not parse, a strategy or mode the group's live
        members do not share) raise."""
        quota = max_messages if isinstance(max_messages, Quota) else Quota(max_messages)
        self._quota = quota
        self._loop = asyncio.get_running_loop()
        if not inspect.iscoroutinefunction(self.handler):
            self._executor = ThreadPoolExecutor(self.concurrency, f"consumer-{self.group}")
        await self._heartbeat()  # raises on bad input or a conflict
        heartbeats = asyncio.create_task(self._heartbeats(), name="consumer-heartbeats")
        acks = asyncio.create_task(self._ack_loop(), name="consumer-acks")
        try:
            await self._fetch_loop(quota, idle_exit_s)
        finally:
            if self._running:
                await asyncio.wait(self._running, timeout=self.ack_wait_ms / 1000)
            # The ack loop ends after the call it makes now (never cut in the middle of
            # one: those acks would be lost), then the rest go in one last call.
            self._closing = True
            self._ack_event.set()
            await asyncio.wait([acks], timeout=self.client.timeout_s)
            await self._flush_acks()
            for task in (heartbeats, acks):
                task.cancel()
            await asyncio.gather(heartbeats, acks, return_exceptions=True)
            with contextlib.suppress(ClientError):
                await self.client.group_leave(self.group, self.member_id)
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            if self._own_client:
                await self.client.close()
        return self.processed

    def _done(self, quota: Quota, idle_exit_s: float) -> bool:
        if self._stopping.is_set() or quota.reached():
            return True
        idle = time.monotonic() - self._last_delivery
        return bool(idle_exit_s) and idle >= idle_exit_s and not self._running

    async def _fetch_loop(self, quota: Quota, idle_exit_s: float) -> None:
        while not self._done(quota, idle_exit_s):
            size = self._fetch_size.size(self.processed)
            room = quota.room(size)
            if room <= 0 or self._backlog >= max(size, 2 * self.concurrency):
                self._room.clear()  # set again when a delivery ends
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self._room.wait()
                continue
            try:
                fetched = await self.client.group_fetch(
                    self.group, self.member_id, room, _FETCH_WAIT_MS
                )
            except GroupRefused as exc:
                log.info("consumer %s: %s", self.member_id, exc.message)
                await self._heartbeat_soon()
                continue
            except ClientError as exc:
                log.info("consumer %s: fetch failed (%s); retrying", self.member_id, exc)
                await asyncio.sleep(_ERROR_PAUSE_S)
                continue
            self._take_leases(fetched.leases, fetched.generation)
            if fetched.deliveries:
                self._last_delivery = time.monotonic()
            self._dispatch(fetched.deliveries)

    def _dispatch(self, deliveries: Sequence[Delivery]) -> None:
        deliveries = deliveries[: self._quota.take(len(deliveries))]
        for d in deliveries:
            m = d.message
            track = self._tracks.setdefault((m.topic, m.queue_id), _Track(d.epoch))
            track.epoch = max(track.epoch, d.epoch)
            track.unacked.add(m.queue_offset)
            track.next_offset = max(track.next_offset, m.queue_offset + 1)
        self._backlog += len(deliveries)
        if self.orderly:
            by_queue: dict[tuple[str, int], list[Delivery]] = {}
            for d in deliveries:
                by_queue.setdefault((d.message.topic, d.message.queue_id), []).append(d)
            for run in by_queue.values():
                self._spawn(self._in_order(run), len(run))
        else:
            self._ready.extend(deliveries)
            while self._workers < min(self.concurrency, len(self._ready)):
                self._workers += 1
                self._track(asyncio.create_task(self._work()))

    def _spawn(self, work: Awaitable[object], deliveries: int) -> None:
        async def guarded() -> None:
            try:
                async with self._slots:
                    await work
            finally:
                self._ended(deliveries)

        self._track(asyncio.create_task(guarded()))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _work(self) -> None:
        """Concurrent mode: handle ready deliveries one after another until none is left
        (one of at most `concurrency` such tasks)."""
        try:
            while self._ready:
                delivery = self._ready.popleft()
                try:
                    await self._one(delivery)
                finally:
                    self._ended(1)
        finally:
            self._workers -= 1

    def _ended(self, deliveries: int) -> None:
        self._backlog -= deliveries
        self._room.set()

    async def _in_order(self, run: Sequence[Delivery]) -> None:
        """One queue's deliveries in offset order, after the queue's previous run; a
        failure retries in place, and the rest come again after it (the coordinator
        redelivers them). What this member handled already (delivered again because
        its run outlived the ack wait) is acked again, not handled twice."""
        ordered = sorted(run, key=lambda d: d.message.queue_offset)
        track = self._tracks.setdefault(
            (run[0].message.topic, run[0].message.queue_id), _Track(run[0].epoch)
        )
        async with track.turn:
            first = ordered[0].message.queue_offset
            track.done = {o for o in track.done if o >= first}
            for d in ordered:
                offset = d.message.queue_offset
                if offset in track.done:
                    self._acks.append(d.handle)
                    self._ack_event.set()
                    self._quota.give_back()
                    continue
                if not self._holds(d):
                    self._forget(d, done=False)  # the queue is someone else's now
                    self._quota.give_back()
                    continue
                if not await self._one(d):
                    for rest in ordered:
                        if rest.message.queue_offset > offset:
                            self._forget(rest, done=False)
                            self._quota.give_back()
                    return
                track.done.add(offset)

    def _holds(self, d: Delivery) -> bool:
        """Whether this member still holds `d`'s queue: its heartbeats are fresh and the
        coordinator's last answer (a heartbeat's or a fetch's) lists the queue."""
        m = d.message
        return self._lease_fresh() and any(
            x.topic == m.topic and x.queue_id == m.queue_id for x in self.leases
        )

    def _forget(self, d: Delivery, *, done: bool) -> None:
        """No longer ours to ack. Not `done` (to be delivered again): a claim of the queue
        after a failover must not say it was, so the claimed next offset drops to it."""
        track = self._tracks.get((d.message.topic, d.message.queue_id))
        if track is not None:
            track.unacked.discard(d.message.queue_offset)
            if not done:
                track.next_offset = min(track.next_offset, d.message.queue_offset)

    async def _one(self, d: Delivery) -> bool:
        """Run the handler on one delivery, then ack or nack it; whether it succeeded."""
        try:
            outcome = await self._call(ConsumedMessage(d))
        except Exception:
            log.exception(
                "consumer %s: the handler failed on %s/%d@%d",
                self.member_id,
                d.message.topic,
                d.message.queue_id,
                d.message.queue_offset,
            )
            outcome = False
        self.processed += 1
        self._quota.handled += 1
        if outcome is None or outcome is True:
            self._acks.append(d.handle)
            self._ack_event.set()
            return True
        level = outcome.delay_level if isinstance(outcome, Retry) else 0
        try:
            kind, _times, _delay_ms = await self.client.group_nack(
                self.group, self.member_id, d.handle, level
            )
        except (GroupRefused, NotFound) as exc:
            log.info("consumer %s: nack refused: %s", self.member_id, exc.message)
            self._forget(d, done=False)
            return False
        except ClientError as exc:
            # Still unacked (and claimed so after a failover): delivered again after the
            # ack wait, never taken for done.
            log.warning(
                "consumer %s: nack failed (%s): redelivered after the ack wait", self.member_id, exc
            )
            return False
        # A retry copy or a dead letter is made (done here); retried in place (orderly),
        # it comes again.
        self._forget(d, done=kind != "in-place")
        return False

    async def _call(self, m: ConsumedMessage) -> HandlerResult:
        if self._executor is None:
            return await self.handler(m)  # type: ignore[misc,no-any-return]
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, self.handler, m)
        return result  # type: ignore[return-value]

    # -- acks ------------------------------------------------------------------------

    async def _ack_loop(self) -> None:
        while not self._closing:
            await self._ack_event.wait()
            if not self.orderly:  # an orderly queue's next run waits for these acks
                await asyncio.sleep(_ACK_LINGER_S)
            self._ack_event.clear()
            await self._flush_acks()

    async def _flush_acks(self) -> None:
        handles, self._acks = self._acks, []
        if not handles:
            return
        try:
            await self.client.group_ack(self.group, self.member_id, ack_ranges(handles))
        except (GroupRefused, NotFound) as exc:
            log.info(
                "consumer %s: acks refused (%s): those messages go to the queue's owner again",
                self.member_id,
                exc.message,
            )
        except ClientError as exc:
            log.warning(
                "consumer %s: acks failed (%s): redelivered after the ack wait", self.member_id, exc
            )
        for topic, queue_id, offset, _epoch in handles:
            track = self._tracks.get((topic, queue_id))
            if track is not None:
                track.unacked.discard(offset)

    # -- membership ------------------------------------------------------------------

    def _lease_fresh(self) -> bool:
        return time.monotonic() - self._last_heartbeat < self._session_s

    async def _heartbeat_soon(self) -> None:
        self._heartbeat_now.set()
        await asyncio.sleep(_ERROR_PAUSE_S)

    async def _heartbeats(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._heartbeat_now.wait()
            self._heartbeat_now.clear()
            try:
                await self._heartbeat()
            except ClientError as exc:
                log.info("consumer %s: heartbeat failed: %s", self.member_id, exc)

    async def _heartbeat(self) -> None:
        if not self._lease_fresh():
            self._tracks = {k: t for k, t in self._tracks.items() if t.unacked}
        held = [
            pb.QueueLease(
                topic=t,
                queue_id=q,
                epoch=x.epoch,
                next_offset=x.next_offset,
                in_flight=len(x.unacked),
                unacked_from=min(x.unacked, default=x.next_offset),
            )
            for (t, q), x in self._tracks.items()
            if x.next_offset
        ]
        started = time.monotonic()
        ms = await self.client.group_heartbeat(
            self.group,
            self.member_id,
            self.subscriptions,
            strategy=self.strategy,
            orderly=self.orderly,
            max_reconsume=self.max_reconsume,
            ack_wait_ms=self.ack_wait_ms,
            first_retry_level=self.first_retry_level,
            held=held,
            client_name=f"{socket.gethostname()}:{os.getpid()}",
        )
        self._last_heartbeat = started
        self._session_s = ms.session_timeout_ms / 1000
        self._interval_s = ms.heartbeat_interval_ms / 1000
        self._take_leases(ms.leases, ms.generation)

    def _take_leases(self, leases: Sequence[QueueLease], generation: int) -> None:
        self.leases = tuple(leases)
        self.generation = generation
        held = {(x.topic, x.queue_id): x.epoch for x in leases}
        for ref, epoch in held.items():
            track = self._tracks.get(ref)
            if track is None:
                self._tracks[ref] = _Track(epoch)
            else:
                track.epoch = epoch
        for ref in [r for r, t in self._tracks.items() if r not in held and not t.unacked]:
            del self._tracks[ref]


CONSUMER_OPTIONS = frozenset(
    p.name for p in inspect.signature(AsyncConsumer).parameters.values() if p.kind is p.KEYWORD_ONLY
)  # the settings of a consumer; the rest of its keyword arguments are its client's
