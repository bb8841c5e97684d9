"""The JSON API's message and view endpoints (docs/http-api.md), over the routed client.

Owns the handlers of `/api/v1`: put a message, get one by id (JSON or its raw
bytes), query a topic by key or by queue and offset, and the views of the cluster,
its topics and its consumer groups (the group members over HTTP: `members.py`).
The cluster view adds what Status does not say: each replica's lag in seconds
(`lag_clock`) and each node's disk use and put latency from its metrics port
(`node_metrics`). Each handler reads its inputs strictly (`params`), runs as its caller
(`callers`), makes the same client calls as the CLI, and writes the CLI's JSON
views (`views`); a failed call is the HTTP status of `refusals`.

Invariants: a put's inputs are all checked before the cluster is asked, so a
refused put stores nothing; every put carries an idempotency key (the caller's
`Idempotency-Key`, else one drawn here), returned with the result, so a retry with
it is answered with the first result instead of a second copy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from dledger_commitlog.client import (
    AsyncRoutedClient,
    ClientError,
    NodeStatus,
    StatusError,
    StoredMessage,
)
from dledger_commitlog.client.values import QueueOffset, Routes, new_uniq_key
from dledger_commitlog.common.routes import shard_ids, shard_of_msg_id
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import ApiError, Request, Response, Router, json_response
from dledger_commitlog.console.lag_clock import LagClock
from dledger_commitlog.console.node_metrics import NodeMetricsScraper
from dledger_commitlog.console.params import (
    Params,
    bad,
    group_name,
    msg_id_of,
    require_api_content,
    topic_name,
)
from dledger_commitlog.console.refusals import refusal
from dledger_commitlog.console.views import (
    describe_json,
    leader_members,
    leader_of,
    member_json,
    message_json,
    shard_cells,
    status_json,
    summary_json,
)

T = TypeVar("T")
PREFIX = "/api/v1"
_PUT_PARAMS = (
    "key",
    "tag",
    "property",
    "delay_level",
    "deliver_at_ms",
    "sharding_key",
    "queue",
    "uniq_key",
)
_MAX_UNIQ_KEY = 128
_MAX_QUERY = 1024
_STATUS_TIMEOUT_S = 2.0


async def call(work: Awaitable[T]) -> T:
    """`work`'s result; its ClientError as the HTTP refusal."""
    try:
        return await work
    except ClientError as exc:
        raise refusal(exc) from None


class MessageApi:
    """The message and view endpoints (see the module doc)."""

    def __init__(
        self,
        callers: Callers,
        *,
        tls: bool,
        on_groups: Callable[[list[Any]], None] | None = None,
        scraper: NodeMetricsScraper | None = None,
    ) -> None:
        self.callers = callers
        self.tls = tls
        self.on_groups = on_groups  # gets the rows of each GET /groups (the group history)
        self.scraper = scraper  # the nodes' metrics ports, where the cluster file names them
        self.lag_clock = LagClock()

    def register(self, router: Router) -> None:
        routes: Sequence[tuple[str, str, Callable[[Request], Awaitable[Response]]]] = (
            ("POST", "/topics/{topic}/messages", self.put),
            ("GET", "/topics/{topic}/messages", self.find),
            ("GET", "/messages/{msg_id}", self.get),
            ("GET", "/messages/{msg_id}/raw", self.get_raw),
            ("GET", "/cluster", self.cluster),
            ("GET", "/topics", self.topics),
            ("GET", "/topics/{topic}", self.topic),
            ("GET", "/groups", self.groups),
            ("GET", "/groups/{group}", self.group),
        )
        for method, path, handler in routes:
            router.add(method, PREFIX + path, handler)

    # -- messages ----------------------------------------------------------------------

    async def put(self, request: Request) -> Response:
        require_api_content(request)
        topic = topic_name(request.params["topic"])
        p = Params(request, _PUT_PARAMS)
        keys = p.strings("key")
        for key in keys:
            if not key or " " in key:
                raise bad("key", f"key {key!r} must be non-empty and contain no space")
        uniq_key = _uniq_key(request, p)
        queue = p.optional_integer("queue")
        sharding_key = p.string("sharding_key")
        if queue is not None and sharding_key:
            raise bad("queue", "give a queue or a sharding_key, not both")
        caller = await self.callers.caller(request)
        result = await call(
            caller.client.put(
                topic,
                request.body,
                keys=keys,
                tags=p.string("tag") or None,
                properties=p.properties(),
                uniq_key=uniq_key,
                delay_level=p.integer("delay_level", 0, 0, 1000),
                deliver_at_ms=p.integer("deliver_at_ms", 0),
                queue=queue,
                sharding_key=sharding_key,
            )
        )
        doc = {
            "msg_id": result.msg_id,
            "queue_id": result.queue_id,
            "queue_offset": result.queue_offset,
            "commitlog_offset": result.commitlog_offset,
            "store_timestamp_ms": result.store_timestamp_ms,
            "duplicate": result.duplicate,
            "shard": shard_of_msg_id(result.msg_id),
            "topic": topic,
            "uniq_key": uniq_key,
        }
        return json_response(200, doc)

    async def _message(self, request: Request) -> StoredMessage:
        msg_id = msg_id_of(request.params["msg_id"])
        caller = await self.callers.caller(request)
        return await call(caller.client.get(msg_id))

    async def get(self, request: Request) -> Response:
        if Params(request, ("raw",)).flag("raw"):
            return await self.get_raw(request)
        m = await self._message(request)
        return json_response(200, {**message_json(m), "shard": shard_of_msg_id(m.msg_id)})

    async def get_raw(self, request: Request) -> Response:
        Params(request, ("raw",))
        m = await self._message(request)
        disposition = ("Content-Disposition", f'attachment; filename="{m.msg_id}.bin"')
        return Response(200, m.body, "application/octet-stream", (disposition,))

    async def find(self, request: Request) -> Response:
        """By key (`key`, `begin_ms`, `end_ms`, `max`) or by queue and offset (`queue`,
        `offset`, `count`, `tag_expr`)."""
        topic = topic_name(request.params["topic"])
        p = Params(
            request, ("key", "begin_ms", "end_ms", "max", "queue", "offset", "count", "tag_expr")
        )
        names = request.query_names()
        caller = await self.callers.caller(request)
        if "key" in names:
            if names & {"queue", "offset", "count", "tag_expr"}:
                raise bad("queue", "query by key or by queue and offset, not both")
            key = p.string("key")
            if not key:
                raise bad("key", "key must not be empty")
            begin, end = p.integer("begin_ms", 0), p.integer("end_ms", 0)
            most = p.integer("max", 32, 1, _MAX_QUERY)
            found = await self._by_key(caller.client, topic, key, begin, end, most)
            return json_response(200, {"messages": [self._json(m) for m in found]})
        if "queue" not in names or "offset" not in names:
            raise bad("key", "give key=K, or queue=Q and offset=O")
        queue = p.integer("queue", 0, 0, 2**31 - 1)
        route = await call(caller.client.route(topic))
        try:
            shard, queue_id = route.locate(queue)
        except IndexError as exc:
            raise bad("queue", str(exc)) from None
        pulled = await call(
            caller.client.client(shard).pull(
                topic,
                queue_id,
                p.integer("offset", 0),
                p.integer("count", 32, 1, _MAX_QUERY),
                p.string("tag_expr") or "*",
            )
        )
        doc = {
            "messages": [self._json(m) for m in pulled.messages],
            "next_offset": pulled.next_offset,
            "min_offset": pulled.min_offset,
            "max_offset": pulled.max_offset,
        }
        return json_response(200, doc)

    async def _by_key(
        self, client: AsyncRoutedClient, topic: str, key: str, begin: int, end: int, most: int
    ) -> list[StoredMessage]:
        route = await call(client.route(topic))
        found: list[StoredMessage] = []
        for shard, _ in route.shards:
            found += await call(client.client(shard).query(topic, key, begin, end, most))
        found.sort(key=lambda m: (m.store_timestamp_ms, m.msg_id))
        return found[:most]

    @staticmethod
    def _json(m: StoredMessage) -> dict[str, Any]:
        return {**message_json(m), "shard": shard_of_msg_id(m.msg_id)}

    # -- views ---------------------------------------------------------------------------

    async def _shards(self, client: AsyncRoutedClient) -> tuple[list[int], list[int]]:
        """(every shard, the data shards) of the cluster."""
        return _split(await call(client.routes()))

    async def cluster(self, request: Request) -> Response:
        Params(request, ())
        client = (await self.callers.caller(request)).client
        return json_response(200, await self.cluster_view(client))

    async def cluster_view(self, client: AsyncRoutedClient) -> dict[str, Any]:
        """Per shard: each node's status, the leader, the members and each replica's lag;
        whether TLS and the ACL are on."""
        scrape = None if self.scraper is None else asyncio.ensure_future(self.scraper.figures())
        try:
            statuses_of = await shard_statuses(client)
        except BaseException:
            if scrape is not None:
                scrape.cancel()
            raise
        shards: list[dict[str, Any]] = []
        for g, by_node in statuses_of.items():
            statuses = list(by_node.values())
            members = leader_members(statuses)
            # every member, a stopped one too (null: it did not answer)
            nodes = sorted({n for n in by_node if n > 0} | {m.id for m in members})
            replicas = shard_cells(by_node, nodes)
            member_docs = [member_json(m) for m in members]
            self.lag_clock.annotate(g, by_node, member_docs, replicas)
            shards.append(
                {
                    "shard": g,
                    "leader": leader_of(by_node),
                    "nodes": [status_json(s) for s in statuses],
                    "replicas": replicas,
                    "members": member_docs,
                }
            )
        doc: dict[str, Any] = {"tls": self.tls, "acl": self.callers.access.acl, "shards": shards}
        if scrape is not None:  # read beside the statuses: a node down costs one timeout
            ids = {m["client"]: m["id"] for g in shards for m in g["members"]}  # one down too
            for by_node in statuses_of.values():
                ids.update(
                    (s.address, s.node_id) for s in by_node.values() if isinstance(s, NodeStatus)
                )
            found = await scrape
            doc["node_metrics"] = [
                {"node_id": ids.get(a), "address": a, **figures} for a, figures in found.items()
            ]
        return doc

    async def topics_view(self, client: AsyncRoutedClient, topic: str) -> list[dict[str, Any]]:
        """Per topic (every topic, or only `topic`): its queues' offsets and messages.
        One Route call for every topic (the configured routes, the others the default),
        not one per topic: a cluster may have thousands."""
        routes = await call(client.routes())
        _, data = _split(routes)
        answers = await asyncio.gather(*(call(client.client(g).queue_offsets(topic)) for g in data))
        by_topic: dict[str, list[tuple[int, QueueOffset]]] = {}
        for g, offsets in zip(data, answers, strict=True):
            for q in offsets:
                by_topic.setdefault(q.topic, []).append((g, q))
        out = []
        for name, queues in sorted(by_topic.items()):
            route = routes.route(name)
            base = {g: sum(n for _, n in route.shards[:i]) for i, (g, _) in enumerate(route.shards)}
            rows: list[dict[str, Any]] = [
                {
                    "shard": g,
                    "queue_id": q.queue_id,
                    "queue": base.get(g, 0) + q.queue_id if g in base else None,
                    "min_offset": q.min_offset,
                    "max_offset": q.max_offset,
                    "messages": q.max_offset - q.min_offset,
                }
                for g, q in sorted(queues, key=lambda x: (x[0], x[1].queue_id))
            ]
            total = sum(int(r["messages"]) for r in rows)
            out.append({"topic": name, "messages": total, "queues": rows})
        return out

    async def topics(self, request: Request) -> Response:
        Params(request, ())
        client = (await self.callers.caller(request)).client
        return json_response(200, {"topics": await self.topics_view(client, "")})

    async def topic(self, request: Request) -> Response:
        topic = topic_name(request.params["topic"])
        Params(request, ())
        client = (await self.callers.caller(request)).client
        found = await self.topics_view(client, topic)
        if not found:
            raise ApiError(404, "not_found", f"topic {topic!r} has no messages")
        return json_response(200, found[0])

    async def groups(self, request: Request) -> Response:
        Params(request, ())
        client = (await self.callers.caller(request)).client
        _, data = await self._shards(client)
        rows = []
        now_ms = int(time.time() * 1000)
        for g in data:
            for s in await call(client.client(g).group_list()):
                rows.append({**summary_json(s, now_ms), "shard": g})
        if self.on_groups is not None:
            self.on_groups(rows)
        return json_response(200, {"groups": rows})

    async def group(self, request: Request) -> Response:
        """Members, the queues each holds, committed offsets and lag, per data shard."""
        group = group_name(request.params["group"])
        Params(request, ())
        client = (await self.callers.caller(request)).client
        _, data = await self._shards(client)
        shards = []
        for g in data:
            try:
                described = await client.client(g).group_describe(group)
            except ClientError as exc:
                if refusal(exc).status == 404:
                    continue
                raise refusal(exc) from None
            shards.append({"shard": g, **describe_json(described, int(time.time() * 1000))})
        if not shards:
            raise ApiError(404, "not_found", f"group {group!r} has no members or offsets")
        return json_response(200, {"group": group, "shards": shards})


async def shard_statuses(
    client: AsyncRoutedClient,
) -> dict[int, dict[int, NodeStatus | StatusError]]:
    """Each shard's Status from each node, by node id (a node that did not answer under
    a negative key of its own), asked of all at once."""
    every, _ = _split(await call(client.routes()))
    answers = await asyncio.gather(
        *(client.client(g).status_all(timeout_s=_STATUS_TIMEOUT_S) for g in every)
    )
    return {
        g: {getattr(s, "node_id", -(i + 1)): s for i, s in enumerate(statuses)}
        for g, statuses in zip(every, answers, strict=True)
    }


def _split(routes: Routes) -> tuple[list[int], list[int]]:
    """(every shard, the data shards) of the cluster `routes` describes."""
    every = shard_ids(routes.shard_count)
    return every, [g for g in every if g != 0]


def _uniq_key(request: Request, p: Params) -> str:
    """The put's idempotency key: `Idempotency-Key`, else `uniq_key`, else a new one."""
    header = request.header("idempotency-key")
    if header is not None:
        try:
            given = header.decode("ascii")
        except UnicodeDecodeError:
            raise bad("uniq_key", "Idempotency-Key must be ASCII") from None
    else:
        given = p.string("uniq_key")
    if not given:
        return new_uniq_key()
    if len(given) > _MAX_UNIQ_KEY or not given.isprintable() or " " in given:
        raise bad("uniq_key", f"an idempotency key is 1 to {_MAX_UNIQ_KEY} visible characters")
    return given
