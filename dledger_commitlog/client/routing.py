"""Clients of a multi-shard cluster: each call goes to the shard that owns its queue.

    from dledger_commitlog.client import RoutedClient
    with RoutedClient.from_cluster_file("/tmp/c1/cluster.json") as client:
        result = client.put("orders", b"hello", sharding_key="customer-7")
        client.get(result.msg_id)          # the id names its shard

A topic's queues lie in one or more shards (docs/scaling.md); the route (topic
-> shards and queues per shard) is kept by the cluster's shard 0 and served by
every node (`Route`). `RoutedClient` (blocking) and `AsyncRoutedClient` fetch a
topic's route once and cache it, number the topic's queues across its shards (the
topic's queue k is the k-th of the route's concatenation, `TopicRoute.locate`), and
send each call through one per-shard client (`Client(shard=g)`: it finds and
follows that shard's leader itself). A put goes to the next queue in turn, or to
the queue of its sharding key (crc32 over all the topic's queues: one key, one
queue of one shard, in order), or to the queue it names; so does a transactional
half message, whose commit or rollback goes to the shard its id names. Consumer
groups live in each shard: `RoutedConsumer` (blocking, as `Consumer`) and
`AsyncRoutedClient.consumers` run one consumer per data shard, with one member id
and a `max_messages` shared between them (`async_consumer.run_together`). A refusal that
says the route changed (a queue the shard does not have) refreshes the route, as
shard 0's leader confirms it (`linearizable`: a node of shard 0 that lags would answer
with the route just refused), and tries once more; a cached route is asked for again
after `route_ttl_s` (30 s, as RocketMQ's clients poll their name server), and
`refresh_routes` drops the cache.
A message id names its shard, so `get` needs no route. Everything else is a call of
one shard: `client(g)`.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

from dledger_commitlog.client.aio import AsyncClient
from dledger_commitlog.client.api import cluster_file_args
from dledger_commitlog.client.async_consumer import (
    CONSUMER_OPTIONS,
    AsyncConsumer,
    new_member_id,
)
from dledger_commitlog.client.blocking import Client
from dledger_commitlog.client.consumer import Consumer
from dledger_commitlog.client.errors import InvalidArgument
from dledger_commitlog.client.values import (
    HalfResult,
    PutResult,
    Routes,
    StoredMessage,
    TopicRoute,
    TransactionEnd,
)
from dledger_commitlog.common.routes import shard_of_msg_id

C = TypeVar("C", Client, AsyncClient)


def _shard_of(msg_id: str) -> int:
    try:
        return shard_of_msg_id(msg_id)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"{old}= is now {new}= (the old name works for one more release)",
        FutureWarning,
        stacklevel=3,
    )


_ROUTE_CHANGED = "outside"  # InvalidArgument "queue id N outside [0, M)": the route moved


class _Routing(Generic[C]):
    """What both routed clients share: the per-shard clients, the route cache, the choice."""

    _kind: type[C]

    def __init__(
        self,
        servers: Any,
        *,
        route_ttl_s: float = 30.0,
        shard_servers: Mapping[int, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """`servers` and `kwargs` as `Client` takes them (every shard's client gets them);
        `route_ttl_s`: how long a topic's route is used before it is asked for again;
        `shard_servers`: the servers of each shard where not every node process hosts
        every shard (one process per shard, docs/scaling.md: routes are asked of
        shard 0's), `servers` for the shards it does not name (`group_servers`: its
        old name)."""
        kwargs.pop("group", None)
        kwargs.pop("shard", None)
        old = kwargs.pop("group_servers", None)
        if old is not None:
            _renamed("group_servers", "shard_servers")
            shard_servers = old
        self.route_ttl_s = route_ttl_s
        self._servers = servers
        self._shard_servers = dict(shard_servers or {})
        self._kwargs = kwargs
        self._clients: dict[int, C] = {}
        self._routes: dict[str, tuple[TopicRoute, float]] = {}  # topic -> (route, expiry)
        self._turn: dict[str, Iterator[int]] = {}

    @classmethod
    def from_cluster_file(cls, path: str | Path, **kwargs: Any) -> Self:
        """A routed client of the cluster a `cluster.json` describes."""
        servers, kwargs = cluster_file_args(path, kwargs)
        return cls(servers, **kwargs)

    def client(self, shard: int | None = None, *, group: int | None = None) -> C:
        """The client of shard `shard` (made once); `group` is its old name."""
        if group is not None:
            _renamed("group", "shard")
            shard = group
        if shard is None:
            raise TypeError("client() needs the shard")
        found = self._clients.get(shard)
        if found is None:
            servers = self._shard_servers.get(shard, self._servers)
            found = self._clients[shard] = self._kind(servers, shard=shard, **self._kwargs)
        return found

    def _choose(self, route: TopicRoute, queue: int | None, sharding_key: str) -> tuple[int, int]:
        """(shard, queue id there) of a put (see the module doc)."""
        total = route.total_queues
        if queue is not None:
            if not 0 <= queue < total:
                raise InvalidArgument(
                    f"queue {queue} outside the {total} queues of {route.topic!r}"
                )
            return route.locate(queue)
        if sharding_key:
            return route.locate(route.queue_of_key(sharding_key))
        turn = self._turn.get(route.topic)
        if turn is None:
            turn = self._turn[route.topic] = itertools.cycle(range(total))
        return route.locate(next(turn) % total)

    def _cached(self, routes: Routes, topic: str) -> TopicRoute:
        route = routes.route(topic)
        if route.total_queues == 0:
            raise InvalidArgument(f"topic {topic!r} has no queues in its route")
        self._routes[topic] = (route, time.monotonic() + self.route_ttl_s)
        self._turn.pop(topic, None)
        return route

    def _fresh(self, topic: str) -> TopicRoute | None:
        found = self._routes.get(topic)
        if found is None or found[1] < time.monotonic():
            return None
        return found[0]

    def _forget(self, topic: str) -> None:
        self._routes.pop(topic, None)
        self._turn.pop(topic, None)

    def refresh_routes(self) -> None:
        """Forget the cached routes: the next call of each topic asks again."""
        self._routes.clear()
        self._turn.clear()


class RoutedClient(_Routing[Client]):
    """The blocking routed client (see the module doc)."""

    _kind = Client

    def route(self, topic: str) -> TopicRoute:
        """`topic`'s route (cached)."""
        found = self._fresh(topic)
        return found if found is not None else self._cached(self.routes(topic), topic)

    def routes(self, topic: str = "", linearizable: bool = False) -> Routes:
        """The cluster's routes as a node of shard 0 answers them now (not cached;
        `linearizable`: as its leader confirms them)."""
        return self.client(0).route(topic, linearizable=linearizable)

    def put(
        self,
        topic: str,
        body: bytes | str,
        *,
        queue: int | None = None,
        sharding_key: str = "",
        **kwargs: Any,
    ) -> PutResult:
        """Put to the shard of the chosen queue (`Client.put`'s other arguments);
        `queue`: the topic's queue number across its shards. The result's queue_id
        is the queue id within the shard its msg_id names."""
        for attempt in range(2):
            shard, queue_id = self._choose(self.route(topic), queue, sharding_key)
            try:
                return self.client(shard).put(topic, body, queue_id=queue_id, **kwargs)
            except InvalidArgument as exc:
                if attempt or _ROUTE_CHANGED not in str(exc):
                    raise
                self.refresh_routes()
                self._cached(self.routes(topic, linearizable=True), topic)
        raise AssertionError("unreachable")

    def get(self, msg_id: str, linearizable: bool = False) -> StoredMessage:
        """The message a message id names, from the shard the id names."""
        return self.client(_shard_of(msg_id)).get(msg_id, linearizable=linearizable)

    def put_half(self, topic: str, body: bytes | str, **kwargs: Any) -> HalfResult:
        """A transactional message (`Client.put_half`) in the shard of the next queue
        (or of `queue` / `sharding_key`); its transaction lives in that shard."""
        queue, key = kwargs.pop("queue", None), kwargs.pop("sharding_key", "")
        shard, queue_id = self._choose(self.route(topic), queue, key)
        return self.client(shard).put_half(topic, body, queue_id=queue_id, **kwargs)

    def end_transaction(self, half: HalfResult, *, commit: bool) -> TransactionEnd:
        """Commit or roll back in the shard the half message lies in."""
        shard = _shard_of(half.result.msg_id)
        return self.client(shard).end_transaction(half, commit=commit)

    def topic_update(
        self,
        op: str,
        topic: str,
        shards: Mapping[int, int] | None = None,
        *,
        groups: Mapping[int, int] | None = None,
    ) -> TopicRoute | None:
        """Create, update or delete a topic's route (through shard 0; needs the admin
        right with an ACL): `shards` as `Client.topic_update` takes it (`groups`: its
        old name); the cached route of `topic` is dropped."""
        if groups is not None:
            _renamed("groups", "shards")
            shards = groups
        made = self.client(0).topic_update(op, topic, shards)
        self._forget(topic)
        return made

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> RoutedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRoutedClient(_Routing[AsyncClient]):
    """The asyncio routed client (see the module doc)."""

    _kind = AsyncClient

    async def route(self, topic: str) -> TopicRoute:
        found = self._fresh(topic)
        return found if found is not None else self._cached(await self.routes(topic), topic)

    async def routes(self, topic: str = "", linearizable: bool = False) -> Routes:
        return await self.client(0).route(topic, linearizable=linearizable)

    async def put(
        self,
        topic: str,
        body: bytes | str,
        *,
        queue: int | None = None,
        sharding_key: str = "",
        **kwargs: Any,
    ) -> PutResult:
        for attempt in range(2):
            shard, queue_id = self._choose(await self.route(topic), queue, sharding_key)
            try:
                return await self.client(shard).put(topic, body, queue_id=queue_id, **kwargs)
            except InvalidArgument as exc:
                if attempt or _ROUTE_CHANGED not in str(exc):
                    raise
                self.refresh_routes()
                self._cached(await self.routes(topic, linearizable=True), topic)
        raise AssertionError("unreachable")

    async def get(self, msg_id: str, linearizable: bool = False) -> StoredMessage:
        return await self.client(_shard_of(msg_id)).get(msg_id, linearizable=linearizable)

    async def put_half(self, topic: str, body: bytes | str, **kwargs: Any) -> HalfResult:
        queue, key = kwargs.pop("queue", None), kwargs.pop("sharding_key", "")
        shard, queue_id = self._choose(await self.route(topic), queue, key)
        return await self.client(shard).put_half(topic, body, queue_id=queue_id, **kwargs)

    async def end_transaction(self, half: HalfResult, *, commit: bool) -> TransactionEnd:
        shard = _shard_of(half.result.msg_id)
        return await self.client(shard).end_transaction(half, commit=commit)

    async def consumers(
        self,
        group: str,
        topics: Any,
        handler: Any,
        *,
        shards: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> list[AsyncConsumer]:
        """One `AsyncConsumer` of consumer group `group` per data shard of the cluster
        (a consumer group lives in each shard, as a topic's queues do), or per
        shard of `shards`, all with one member id: run them with
        `async_consumer.run_together`."""
        old = kwargs.pop("raft_groups", None)
        if old is not None:
            _renamed("raft_groups", "shards")
            shards = old
        if shards is None:
            shards = range(1, (await self.routes()).shard_count + 1)
        kwargs["member_id"] = kwargs.get("member_id") or new_member_id()
        return [AsyncConsumer(self.client(g), group, topics, handler, **kwargs) for g in shards]

    async def topic_update(
        self,
        op: str,
        topic: str,
        shards: Mapping[int, int] | None = None,
        *,
        groups: Mapping[int, int] | None = None,
    ) -> TopicRoute | None:
        if groups is not None:
            _renamed("groups", "shards")
            shards = groups
        made = await self.client(0).topic_update(op, topic, shards)
        self._forget(topic)
        return made

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def __aenter__(self) -> AsyncRoutedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RoutedConsumer(Consumer):
    """A blocking consumer of every data shard of the cluster (one `AsyncConsumer` per
    shard, run together), or of the shards `shards` names: `Consumer`'s
    arguments, plus `AsyncRoutedClient`'s `shard_servers` and `route_ttl_s`. It asks
    a node for the routes first (without `shards`): a single-shard cluster
    answers one shard, and a process that does not host shard 0 refuses, naming
    why (give `shard_servers`, or `shards`)."""

    _routed: AsyncRoutedClient | None = None

    async def _open(self) -> list[AsyncConsumer]:
        servers, group, topics, handler = self._args
        shards = self._kwargs.get("shards")
        if "raft_groups" in self._kwargs:
            _renamed("raft_groups", "shards")
            shards = self._kwargs["raft_groups"]
        options = {k: v for k, v in self._kwargs.items() if k in CONSUMER_OPTIONS}
        connection = {
            k: v
            for k, v in self._kwargs.items()
            if k not in CONSUMER_OPTIONS and k not in ("shards", "raft_groups")
        }
        self._routed = AsyncRoutedClient(servers, **connection)
        return await self._routed.consumers(group, topics, handler, shards=shards, **options)

    async def _close(self) -> None:
        if self._routed is not None:
            await self._routed.close()
