"""Topic routes of a multi-shard cluster, kept in the log of shard 0 (the metadata).

A cluster of several data shards (docs/scaling.md) spreads each topic's queues
over shards, as RocketMQ spreads a topic over broker groups behind its name
server. The route of a topic names, per shard, how many queues of it that shard
holds (queues 0..n-1 there). A topic nobody configured has the default route:
every data shard, `queues_per_topic` queues each. `TopicUpdate` writes a route
change as one message of ROUTES_TOPIC in shard 0 holding the whole table after
it (so the last record is the table, whatever retention removed before it); every
node that hosts shard 0 answers `Route` from its own committed copy, and a new
leader of shard 0 knows every change its predecessor committed.

Owns `RouteTable` (pure: the table a record holds, the validation of a change,
the default route) and `RouteStore` (shard 0's side: reads the committed records
through `SystemLog`, writes a change through Raft on the leader).

Invariants: the table is a pure function of shard 0's last committed record
(every replica that dispatched it holds the same table); changes are made one at a
time on the leader; a change is validated against the table
the leader holds after `settle` (every earlier committed change applied) and
refused whole; a shard named by a route is one of the cluster's data shards and
never holds more than `queues_per_topic` queues of a topic (the queue bound every
shard's server enforces).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence

from dispatch.names import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.routes import TopicRoute, default_route
from dledger_commitlog.messaging.groups import reserved_topic
from dledger_commitlog.messaging.system_log import SystemLog
from store.errors import InvalidMessage
from store.message import check_name

ROUTES_TOPIC = SYSTEM_TOPIC_PREFIX + "ROUTES"
OPS = ("create", "update", "delete")
_SETTLE_S = 5.0


class RouteError(ValueError):
    """A route change that cannot be made; the message says why."""


class RouteTable:
    """The route of every topic, as shard 0's last record holds it."""

    def __init__(self, shard_count: int, queues_per_topic: int) -> None:
        self.shard_count = shard_count
        self.queues_per_topic = queues_per_topic
        self.configured: dict[str, TopicRoute] = {}
        self.version = 0  # the shard-0 queue offset after the last record applied

    def route(self, topic: str) -> TopicRoute:
        """`topic`'s configured route, or the default one."""
        found = self.configured.get(topic)
        return found or default_route(topic, self.shard_count, self.queues_per_topic)

    def check(self, op: str, topic: str, shards: Sequence[tuple[int, int]]) -> TopicRoute | None:
        """The route `op` makes of `topic` (None: deleted); RouteError if it cannot."""
        if op not in OPS:
            raise RouteError(f"unknown route operation {op!r} (one of {', '.join(OPS)})")
        try:
            check_name(topic)
        except InvalidMessage as exc:
            raise RouteError(str(exc)) from None
        if reserved_topic(topic):
            raise RouteError(f"{topic!r}: system topics live in every shard; they have no route")
        exists = topic in self.configured
        if op == "create" and exists:
            raise RouteError(f"topic {topic!r} already has a route (update it instead)")
        if op in ("update", "delete") and not exists:
            raise RouteError(f"topic {topic!r} has no configured route to {op}")
        if op == "delete":
            return None
        if not shards:
            raise RouteError("a route names at least one shard")
        seen: set[int] = set()
        for shard, count in shards:
            if not 1 <= shard <= self.shard_count:
                raise RouteError(f"shard {shard} is not a data shard (1..{self.shard_count})")
            if shard in seen:
                raise RouteError(f"shard {shard} is named twice")
            seen.add(shard)
            if not 1 <= count <= self.queues_per_topic:
                raise RouteError(
                    f"shard {shard}: {count} queues, not in 1..{self.queues_per_topic}"
                    " (store.queues_per_topic)"
                )
        return TopicRoute(topic, tuple((int(g), int(n)) for g, n in shards), configured=True)

    def changed(self, route: TopicRoute | None, topic: str) -> dict[str, list[list[int]]]:
        """The whole table after a checked change (what a record holds)."""
        routes = {t: [list(g) for g in r.shards] for t, r in self.configured.items()}
        if route is None:
            routes.pop(topic, None)
        else:
            routes[topic] = [list(g) for g in route.shards]
        return routes

    def load(self, record: Mapping[str, object], version: int) -> None:
        """Take the table a committed record holds (each record is the whole table, so
        the last one is all a replica needs, whatever retention removed before it)."""
        self.version = version
        raw = record.get("routes")
        if not isinstance(raw, dict):
            return
        table: dict[str, TopicRoute] = {}
        for topic, shards in raw.items():
            try:
                pairs = tuple((int(g), int(n)) for g, n in shards)
                table[str(topic)] = TopicRoute(str(topic), pairs, configured=True)
            except (TypeError, ValueError):
                continue
        self.configured = table


def encode_table(routes: Mapping[str, list[list[int]]], op: str, topic: str) -> bytes:
    return json.dumps({"routes": routes, "op": op, "topic": topic}, sort_keys=True).encode()


class RouteStore:
    """Shard 0's routes on one node: the table of its last committed record, and changes."""

    def __init__(self, system_log: SystemLog, shard_count: int, queues_per_topic: int) -> None:
        self._log = system_log
        self.table = RouteTable(shard_count, queues_per_topic)
        self._changing = asyncio.Lock()  # one change at a time: each record is the whole table

    def current(self) -> RouteTable:
        """The table of the last record this node has dispatched."""
        end = self._log.queue_end(ROUTES_TOPIC, 0)
        if end > self.table.version:
            units = self._log.units(ROUTES_TOPIC, 0, end - 1, 1)
            record: object = {}
            if units:
                try:
                    record = json.loads(self._log.message(units[0]).body)
                except ValueError:
                    record = {}
            self.table.load(record if isinstance(record, dict) else {}, end)
        return self.table

    async def change(
        self, op: str, topic: str, shards: Sequence[tuple[int, int]], timeout_s: float
    ) -> tuple[TopicRoute | None, int]:
        """Validate and commit one change on shard 0's leader (NotLeader elsewhere);
        the route it made (None: deleted) and the table's version with it."""
        async with self._changing:
            await self._log.settle(min(timeout_s, _SETTLE_S))
            table = self.current()
            route = table.check(op, topic, shards)
            body = encode_table(table.changed(route, topic), op, topic)
            spec = self._log.prepare(
                ROUTES_TOPIC, body, {}, uniq_key=uuid.uuid4().hex.upper(), queue_id=0
            )
            result = (await self._log.put([spec], timeout_s))[0]
            await self._log.caught_up(timeout_s)
            self.current()
            return route, result.queue_offset + 1
