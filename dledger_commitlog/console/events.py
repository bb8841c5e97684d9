"""Server-sent events: the cluster and its topics, a snapshot a second, for the pages.

Owns `GET /api/v1/events`: a `text/event-stream` of `snapshot` events, each one
JSON document `{"time_ms", "cluster", "topics", "errors"}` where `cluster` is the
document of `GET /api/v1/cluster` and `topics` the list of `GET /api/v1/topics`
(built by the same `MessageApi` views), either null when it could not be read this
time, its refusal then in `errors` (`[{"view", "status", "code", "message"}]`).
The stream goes on until the client closes it or the console stops.

One poller per console process and identity (`SnapshotHub`): the streams of one
caller (without an ACL, every stream) share it, so however many pages are open the
cluster is read once each `interval_s`, and each snapshot, encoded once, goes to
every stream; it runs while at least one of those streams is open (a new stream gets
the last snapshot at once), and stops when the last one closes.

Invariants: each stream reads the cluster as its caller (its identity's poller reads
with the caller's client, so the ACL decides what the caller sees); a poller holds at
most one snapshot in flight, the next one `interval_s` after the last began; a stream
holds at most one snapshot not yet sent (a slow client skips to the newest); a
failed read never ends the stream (the next snapshot tries again: a leader election
is a few errors, then the new leader).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

from dledger_commitlog.client import AsyncRoutedClient, ClientError
from dledger_commitlog.console.api import PREFIX, MessageApi
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import ApiError, Request, Response, Router
from dledger_commitlog.console.params import Params
from dledger_commitlog.console.refusals import refusal

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
C = TypeVar("C")
_RETRY_MS = 2000  # how long a browser waits before it reconnects a cut stream


class Listener:
    """One stream's place in a poller: the newest snapshot it has not sent yet (an older
    one is dropped when a newer comes: a slow client skips, it does not queue)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)

    def offer(self, event: bytes) -> None:
        if self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(event)

    async def next(self) -> bytes:
        return await self.queue.get()


class _Poller(Generic[C]):
    """One identity's poll: a task reading a snapshot each `interval_s` while it has
    listeners, each snapshot encoded once and offered to all of them."""

    def __init__(self, hub: SnapshotHub[C], identity: str, client: C) -> None:
        self.listeners: set[Listener] = set()
        self.last: bytes | None = None
        self.task = asyncio.create_task(hub.run(self, client), name=f"console-events-{identity}")


class SnapshotHub(Generic[C]):
    """The pollers of the event streams: one per identity, shared by its open streams,
    running while at least one is open (see the module doc). `read` makes a snapshot
    with the identity's client (C: the console's `AsyncRoutedClient`)."""

    def __init__(
        self, read: Callable[[C], Awaitable[dict[str, Any]]], interval_s: float = INTERVAL_S
    ) -> None:
        self.read = read
        self.interval_s = interval_s
        self.pollers: dict[str, _Poller[C]] = {}

    @contextlib.asynccontextmanager
    async def listen(self, identity: str, client: C) -> AsyncIterator[Listener]:
        """A listener of `identity`'s snapshots (its poller started if none runs, and
        the last snapshot offered at once), for the block."""
        poller = self.pollers.get(identity)
        if poller is None:
            poller = self.pollers[identity] = _Poller(self, identity, client)
        listener = Listener()
        poller.listeners.add(listener)
        if poller.last is not None:
            listener.offer(poller.last)
        try:
            yield listener
        finally:
            poller.listeners.discard(listener)
            if not poller.listeners and self.pollers.get(identity) is poller:
                del self.pollers[identity]
                poller.task.cancel()

    async def run(self, poller: _Poller[C], client: C) -> None:
        while True:
            began = time.monotonic()
            try:
                data = json.dumps(await self.read(client), separators=(",", ":"))
            except Exception:  # the streams go on: the next snapshot tries again
                log.exception("console: a snapshot failed")
            else:
                poller.last = f"event: snapshot\ndata: {data}\n\n".encode()
                for listener in poller.listeners:
                    listener.offer(poller.last)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))


class Events:
    """The `/api/v1/events` stream."""

    def __init__(self, callers: Callers, views: MessageApi, interval_s: float = INTERVAL_S):
        self.callers = callers
        self.views = views
        self.hub: SnapshotHub[AsyncRoutedClient] = SnapshotHub(self.snapshot, interval_s)

    def register(self, router: Router) -> None:
        router.add("GET", PREFIX + "/events", self.stream)

    async def stream(self, request: Request) -> Response:
        Params(request, ())
        caller = await self.callers.caller(request)
        return Response(200, self._events(caller.identity, caller.client), "text/event-stream")

    async def _events(self, identity: str, client: AsyncRoutedClient) -> AsyncIterator[bytes]:
        yield f"retry: {_RETRY_MS}\n\n".encode()
        async with self.hub.listen(identity, client) as listener:
            while True:
                yield await listener.next()

    async def snapshot(self, client: AsyncRoutedClient) -> dict[str, Any]:
        """The cluster and topics views now; a view that failed is null, its error listed."""
        errors: list[dict[str, Any]] = []

        async def view(name: str, read: Any) -> Any:
            try:
                return await read
            except ClientError as exc:
                failed = refusal(exc)
            except ApiError as exc:
                failed = exc
            except Exception:
                log.exception("console: the %s view failed", name)
                failed = ApiError(500, "internal", "the console failed; see its log")
            errors.append(
                {
                    "view": name,
                    "status": failed.status,
                    "code": failed.code,
                    "message": failed.message,
                }
            )
            return None

        cluster, topics = await asyncio.gather(
            view("cluster", self.views.cluster_view(client)),
            view("topics", self.views.topics_view(client, "")),
        )
        return {
            "time_ms": int(time.time() * 1000),
            "cluster": cluster,
            "topics": topics,
            "errors": errors,
        }
