"""Server-sent events: the cluster and its topics, a snapshot a second, for the pages.

Owns `GET /api/v1/events`: a `text/event-stream` of `snapshot` events, each one
JSON document `{"time_ms", "cluster", "topics", "errors"}` where `cluster` is the
document of `GET /api/v1/cluster` and `topics` the list of `GET /api/v1/topics`
(built by the same `MessageApi` views), either null when it could not be read this
time, its refusal then in `errors` (`[{"view", "status", "code", "message"}]`).
The stream goes on until the client closes it or the console stops.

Invariants: each stream reads the cluster as its caller (the caller's client, so
the ACL decides what the caller sees); a stream holds at most one snapshot in
flight, the next one `interval_s` after the last began; a failed read never ends
the stream (the next snapshot tries again: a leader election is a few errors, then
the new leader).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from dledger_commitlog.client import AsyncRoutedClient, ClientError
from dledger_commitlog.console.api import PREFIX, MessageApi
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import ApiError, Request, Response, Router
from dledger_commitlog.console.params import Params
from dledger_commitlog.console.refusals import refusal

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
_RETRY_MS = 2000  # how long a browser waits before it reconnects a cut stream


class Events:
    """The `/api/v1/events` stream."""

    def __init__(self, callers: Callers, views: MessageApi, interval_s: float = INTERVAL_S):
        self.callers = callers
        self.views = views
        self.interval_s = interval_s

    def register(self, router: Router) -> None:
        router.add("GET", PREFIX + "/events", self.stream)

    async def stream(self, request: Request) -> Response:
        Params(request, ())
        client = (await self.callers.caller(request)).client
        return Response(200, self._events(client), "text/event-stream")

    async def _events(self, client: AsyncRoutedClient) -> AsyncIterator[bytes]:
        yield f"retry: {_RETRY_MS}\n\n".encode()
        while True:
            began = time.monotonic()
            doc = await self.snapshot(client)
            data = json.dumps(doc, separators=(",", ":"))
            yield f"event: snapshot\ndata: {data}\n\n".encode()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))

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
