"""Consumer-group members over HTTP: a shell loop with curl shares a group's queues.

Owns `HttpMember` (one member: the console runs an `AsyncConsumer` per data shard
for it, with one member id, through `AsyncRoutedClient.consumers`, so heartbeats,
leases, acks and nacks are the Python consumer's own code) and `MemberApi` (join,
fetch with a long poll, ack, nack, leave; an idle member is dropped).

How a delivery travels: the consumer hands each message to this member's handler,
which parks it as *ready*; a fetch takes ready messages, gives each a handle and
starts its ack wait; an ack of the handle ends the handler with "done" (the
consumer acks it to the cluster, batched within ~20 ms), a nack with a retry on
its delay level (the group's retry topic). A handle not acked within the member's
`ack_wait_ms` is nacked (retried later). When the member leaves, or makes no
request for `idle_timeout_ms`, its consumers stop: messages it fetched and never
answered are not acked, so the group delivers them again (to whichever member then
holds their queue): at least once, nothing lost. A leave answers once the consumers
have left (within about a second, the longest fetch they may have in flight): what
the member held, fetched or not, ends unanswered at once, its queues go back to the
group, and no ack wait is waited for.

Invariants: a member is used only by the credentials that made it (anyone else
gets 404); a handle is answered once (a second answer, or one after the ack wait,
is 409); at most `max_members` members live at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dledger_commitlog.client import AsyncRoutedClient, ConsumedMessage, Retry, Subscription
from dledger_commitlog.client.async_consumer import new_member_id, run_together
from dledger_commitlog.client.groups import HandlerResult
from dledger_commitlog.common.routes import shard_of_msg_id
from dledger_commitlog.console.api import PREFIX, call
from dledger_commitlog.console.callers import Callers, ClusterAccess
from dledger_commitlog.console.http import ApiError, Request, Response, Router, json_response
from dledger_commitlog.console.params import (
    Params,
    bad,
    group_name,
    json_body,
    json_int,
    json_str,
    require_api_content,
    topic_name,
)
from dledger_commitlog.console.views import message_json

log = logging.getLogger(__name__)

MAX_WAIT_MS = 30_000
MAX_FETCH = 256
CONCURRENCY = 64  # deliveries a member holds at once (ready or fetched, unanswered)


@dataclass(eq=False)
class _Pending:
    """One delivery the handler holds until the HTTP member answers it."""

    message: ConsumedMessage
    answer: asyncio.Future[HandlerResult]
    handle: str = ""
    expiry: asyncio.TimerHandle | None = None

    def settle(self, outcome: HandlerResult) -> bool:
        if self.answer.done():
            return False
        self.answer.set_result(outcome)
        if self.expiry is not None:
            self.expiry.cancel()
        return True


@dataclass(eq=False)
class HttpMember:
    """A member of `group` on behalf of an HTTP client (see the module doc)."""

    member_id: str
    group: str
    owner: str
    subscriptions: list[Subscription]
    ack_wait_ms: int
    idle_timeout_ms: int
    client: AsyncRoutedClient
    last_seen: float = field(default_factory=time.monotonic)
    ready: deque[_Pending] = field(default_factory=deque)
    delivered: dict[str, _Pending] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[int] | None = None
    handles: itertools.count[int] = field(default_factory=itertools.count)
    stopping: bool = False

    async def handle(self, m: ConsumedMessage) -> HandlerResult:
        """The consumers' handler: park the message until an ack or nack answers it (a
        member that is stopping parks nothing: the handler ends unanswered at once)."""
        pending = _Pending(m, asyncio.get_running_loop().create_future())
        if self.stopping:
            pending.answer.cancel()
        else:
            self.ready.append(pending)
        self.arrived.set()
        try:
            return await pending.answer
        finally:
            self.delivered.pop(pending.handle, None)

    def take(self, most: int) -> list[_Pending]:
        taken: list[_Pending] = []
        loop = asyncio.get_running_loop()
        while self.ready and len(taken) < most:
            pending = self.ready.popleft()
            if pending.answer.done():
                continue
            pending.handle = f"{self.member_id}.{next(self.handles)}"
            pending.expiry = loop.call_later(self.ack_wait_ms / 1000, pending.settle, False)
            self.delivered[pending.handle] = pending
            taken.append(pending)
        if not self.ready:
            self.arrived.clear()
        return taken

    async def stop(self) -> None:
        """Stop the consumers; what they hold unanswered is delivered again elsewhere.
        Every delivery the member holds, and any the consumers hand it while they stop
        (a fetch in flight brings more), ends unanswered at once, so the consumers leave
        the group without waiting for an ack wait."""
        self.stopping = True
        for pending in [*self.ready, *self.delivered.values()]:
            pending.answer.cancel()  # the handler ends without an ack or a nack
        self.ready.clear()
        self.delivered.clear()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        await self.client.close()


class MemberApi:
    """The group-member endpoints, and the members they made."""

    def __init__(self, callers: Callers, access: ClusterAccess, *, max_members: int = 256) -> None:
        self.callers = callers
        self.access = access
        self.max_members = max_members
        self.members: dict[str, HttpMember] = {}
        self._reaper: asyncio.Task[None] | None = None

    def register(self, router: Router) -> None:
        base = PREFIX + "/groups/{group}/members"
        router.add("POST", base, self.join)
        router.add("GET", base + "/{member}/messages", self.fetch)
        router.add("POST", base + "/{member}/ack", self.ack)
        router.add("POST", base + "/{member}/nack", self.nack)
        router.add("DELETE", base + "/{member}", self.leave)

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap(), name="console-member-reaper")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        members, self.members = list(self.members.values()), {}
        await asyncio.gather(*(m.stop() for m in members), return_exceptions=True)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for m in list(self.members.values()):
                idle_ms = (now - m.last_seen) * 1000
                if idle_ms >= m.idle_timeout_ms or (m.task is not None and m.task.done()):
                    log.info("console: member %s of %s dropped (idle)", m.member_id, m.group)
                    self.members.pop(m.member_id, None)
                    await m.stop()

    async def join(self, request: Request) -> Response:
        """Join `group` with `{"topic": T}` (or `"topics": [...]`), optional `tag_expr`
        or `sql`, `orderly`, `strategy`, `ack_wait_ms`, `idle_timeout_ms`."""
        require_api_content(request)
        group = group_name(request.params["group"])
        Params(request, ())
        doc = json_body(request)
        subscriptions = _subscriptions(doc)
        orderly = doc.get("orderly", False)
        if not isinstance(orderly, bool):
            raise bad("orderly", "orderly must be true or false")
        strategy = json_str(doc, "strategy", "average")
        ack_wait_ms = json_int(doc, "ack_wait_ms", 30_000, 1_000, 600_000)
        idle_ms = json_int(doc, "idle_timeout_ms", 30_000, 1_000, 600_000)
        if len(self.members) >= self.max_members:
            raise ApiError(503, "unavailable", "too many members", headers=[("Retry-After", "5")])
        caller = await self.callers.caller(request)
        member_id = new_member_id()
        client = self.access.client(caller.credentials)
        member = HttpMember(
            member_id, group, caller.identity, subscriptions, ack_wait_ms, idle_ms, client
        )
        settings: dict[str, Any] = {
            "strategy": strategy,
            "orderly": orderly,
            "ack_wait_ms": ack_wait_ms,
        }
        try:
            for g in await _data_shards(client):  # refusals (rights, settings) before joining
                await call(
                    client.client(g).group_heartbeat(group, member_id, subscriptions, **settings)
                )
            consumers = await client.consumers(
                group,
                subscriptions,
                member.handle,
                member_id=member_id,
                concurrency=CONCURRENCY,
                **settings,
            )
        except BaseException:
            await client.close()
            raise
        member.task = asyncio.create_task(run_together(consumers), name=f"member-{member_id}")
        self.members[member_id] = member
        doc = {
            "member_id": member_id,
            "group": group,
            "subscriptions": [s.topic for s in subscriptions],
            "ack_wait_ms": ack_wait_ms,
            "idle_timeout_ms": idle_ms,
        }
        location = f"{PREFIX}/groups/{group}/members/{member_id}"
        return json_response(201, doc, [("Location", location)])

    async def _member(self, request: Request) -> HttpMember:
        group = group_name(request.params["group"])
        caller = await self.callers.caller(request)
        member = self.members.get(request.params["member"])
        if member is None or member.group != group or member.owner != caller.identity:
            raise ApiError(404, "not_found", "no such member (it left, or was idle too long)")
        member.last_seen = time.monotonic()
        return member

    async def fetch(self, request: Request) -> Response:
        """Up to `max` messages; waits up to `wait_ms` for the first."""
        p = Params(request, ("max", "wait_ms"))
        most = p.integer("max", 32, 1, MAX_FETCH)
        wait_ms = p.integer("wait_ms", 0, 0, MAX_WAIT_MS)
        member = await self._member(request)
        if not member.ready and wait_ms:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_ms / 1000):
                    await member.arrived.wait()
        member.last_seen = time.monotonic()
        out = []
        for pending in member.take(most):
            d = pending.message.delivery
            out.append(
                {
                    **message_json(d.message),
                    "shard": shard_of_msg_id(d.message.msg_id),
                    "handle": pending.handle,
                    "origin_topic": d.origin_topic,
                    "reconsume_times": d.reconsume_times,
                    "delivery_count": d.delivery_count,
                }
            )
        return json_response(200, {"messages": out})

    async def ack(self, request: Request) -> Response:
        return await self._answer(request, True)

    async def nack(self, request: Request) -> Response:
        return await self._answer(request, None)

    async def _answer(self, request: Request, ack: bool | None) -> Response:
        """Ack (`ack`) or nack the handles of `{"handles": [...]}` (a nack may say
        `delay_level`); 409 if none of them is held any more."""
        require_api_content(request)
        Params(request, ())
        member = await self._member(request)
        doc = json_body(request)
        handles = doc.get("handles")
        if not isinstance(handles, list) or not all(isinstance(h, str) for h in handles):
            raise bad("handles", "handles must be a list of the handles a fetch gave")
        if not handles or len(handles) > 4 * MAX_FETCH:
            raise bad("handles", f"give 1 to {4 * MAX_FETCH} handles")
        outcome: HandlerResult = True
        if ack is None:
            outcome = Retry(json_int(doc, "delay_level", 0, 0, 1000))
        done: list[str] = []
        stale: list[str] = []
        for handle in handles:
            pending = member.delivered.pop(handle, None)
            (done if pending is not None and pending.settle(outcome) else stale).append(handle)
        if not done:
            raise ApiError(
                409,
                "stale_lease",
                "no handle given is held by this member any more (answered already, or its "
                "ack wait passed and it is delivered again)",
                "handles",
            )
        key = "acked" if ack else "nacked"
        return json_response(200, {key: len(done), "stale": stale})

    async def leave(self, request: Request) -> Response:
        Params(request, ())
        member = await self._member(request)
        self.members.pop(member.member_id, None)
        await member.stop()
        return json_response(200, {"left": member.member_id})


async def _data_shards(client: AsyncRoutedClient) -> list[int]:
    routes = await call(client.routes())
    return list(range(1, routes.shard_count + 1))


def _subscriptions(doc: dict[str, Any]) -> list[Subscription]:
    topics = doc.get("topics", [doc["topic"]] if "topic" in doc else None)
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
        raise bad("topic", 'give "topic": T or "topics": [T, ...]')
    tag_expr, sql = json_str(doc, "tag_expr", "*"), json_str(doc, "sql")
    if sql and tag_expr != "*":
        raise bad("sql", "give tag_expr or sql, not both")
    return [
        Subscription.sql(topic_name(t), sql) if sql else Subscription(topic_name(t), tag_expr)
        for t in topics
    ]
