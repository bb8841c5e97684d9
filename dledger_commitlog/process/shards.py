"""The shards one node process hosts, built, started and closed together.

Owns `Shards`: per hosted shard (`NodeConfig.host_shards`; shard 1 alone in a
cluster of one data shard) its config (`config.shard_config`: its own data directory),
`RaftNode`, leader-side services (`messaging.services.LeaderServices`), metrics
and client service (`client_service.ClientService`), and what the shards of a
process share (docs/scaling.md): the event loop, the Raft peer port (`gate`: each
message goes to the shard it names), one outgoing stream per peer process
(`raftio.multiplex.LinkPool`), the client port (`client_services`: each call goes to
the shard it names, `shard_calls`), the metrics port (`registry`: every shard's
metrics with a `shard` label) and what the process knows beyond one shard
(`service.shard_map.ShardMap`: its shards' nodes and, with shard 0, the route table).
A cluster of one data shard is built by the same code: a process hosting one shard.

A shard's failure (corruption, a full disk) stops that shard, not the process: a
shard whose directory cannot be opened (recovery refuses it) is left closed, and a
shard that fails later stops itself as a single node does (`RaftNode.stop_on`);
either way its calls are UNAVAILABLE naming why (`stopped`), its peers' messages
are dropped, and the other shards keep serving. The process stops when every shard
it hosts has failed (its one shard, if it hosts one), and refuses to start when
none can be opened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dledger_commitlog.messaging.routes import RouteStore
from dledger_commitlog.messaging.services import LeaderServices
from dledger_commitlog.node.config import NodeConfig, shard_config
from dledger_commitlog.node.metrics import NodeMetrics
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.node.security import NodeSecurity
from dledger_commitlog.service.client_service import ClientService
from dledger_commitlog.service.decoding import Services
from dledger_commitlog.service.shard_calls import shard_services
from dledger_commitlog.service.shard_map import ShardMap
from proto import dledger_pb2_grpc as pb_grpc
from raft.messages import Message
from raftio.multiplex import LinkPool
from raftio.transport import PeerGate, open_link

log = logging.getLogger(__name__)


@dataclass
class HostedShard:
    """One hosted shard."""

    shard: int
    cfg: NodeConfig
    metrics: NodeMetrics
    node: RaftNode
    services: LeaderServices
    client: ClientService | None = None


class Shards:
    def __init__(self, cfg: NodeConfig, stop: asyncio.Event, security: NodeSecurity) -> None:
        self.cfg = cfg
        self._stop = stop
        self.security = security
        self._pool = LinkPool(open_link)
        self.hosted: dict[int, HostedShard] = {}
        # Shards that stopped on this node (could not open, or failed since), and why:
        # their calls are UNAVAILABLE (`shard_calls`), their Raft messages dropped.
        self.stopped: dict[int, str] = {}
        self.shard_map: ShardMap  # what the process knows of its shards: made by `open`

    @property
    def first(self) -> HostedShard:
        return next(iter(self.hosted.values()))

    async def open(self) -> None:
        """Open (recover) every hosted shard's data directory, in ascending shard order;
        if one cannot be opened, close the ones opened before it and raise."""
        try:
            self._open()
        except BaseException:
            await self.close()
            raise

    def _open(self) -> None:
        first: Exception | None = None
        for shard in sorted(self.cfg.host_shards):
            gcfg = shard_config(self.cfg, shard)
            metrics = NodeMetrics(self.cfg.node_id)
            try:
                node = RaftNode(
                    gcfg,
                    metrics,
                    security=self.security,
                    on_fatal=self._failure_of(shard),
                    links=self._pool,
                )
            except Exception as exc:
                first = first or exc
                self.stopped[shard] = (
                    f"shard {shard} is stopped on node {self.cfg.node_id}: "
                    f"it could not be opened ({exc})"
                )
                continue
            self.hosted[shard] = HostedShard(
                shard, gcfg, metrics, node, LeaderServices(node, gcfg, metrics)
            )
        if not self.hosted and first is not None:
            raise first  # no shard opened (a second copy of the process, say)
        for why in self.stopped.values():
            log.critical("node %d: %s; the process's other shards serve on", self.cfg.node_id, why)
        routes = None
        if 0 in self.hosted:
            routes = RouteStore(
                self.hosted[0].services.system_log, self.cfg.shard_count, self.cfg.queues_per_topic
            )
        self.shard_map = ShardMap(
            self.cfg.shard_count,
            self.cfg.queues_per_topic,
            {g: h.node for g, h in self.hosted.items()},
            routes,
        )

    def _failure_of(self, shard: int) -> Callable[[], None]:
        def failed() -> None:
            why = self.hosted[shard].node.fatal
            self.stopped[shard] = f"shard {shard} is stopped on node {self.cfg.node_id}: {why}"
            log.critical(
                "node %d: shard %d stopped (%s); the process's other shards keep serving",
                self.cfg.node_id,
                shard,
                why,
            )
            if set(self.stopped) >= set(self.hosted):
                self._stop.set()

        return failed

    def gate(self) -> PeerGate:
        """The Raft port's gate: every stream checked once, each message to its shard."""
        cfg = self.cfg
        reject = self.first.metrics.peer_rejects

        def members() -> frozenset[int]:
            out: frozenset[int] = frozenset()
            for h in self.hosted.values():
                out |= h.node.membership.accepted
            return out

        def deliver_of(shard: int) -> Callable[[Message], None] | None:
            hosted = self.hosted.get(shard)
            return None if hosted is None or shard in self.stopped else hosted.node.deliver

        return PeerGate(
            cfg.cluster,
            self.first.node.deliver,
            me=cfg.node_id,
            members=members,
            security=self.security,
            on_reject=lambda why: reject.labels(why).inc(),
            shards=deliver_of,
        )

    def start_services(self) -> None:
        """Build and start each shard's client service (on the serving loop)."""
        for h in self.hosted.values():
            h.client = ClientService(
                h.cfg,
                h.node,
                h.services,
                metrics=h.metrics,
                security=self.security,
                shard_map=self.shard_map,
            )
            h.client.start()

    def client_services(self) -> Services:
        add = pb_grpc.add_DLedgerClientServicer_to_server
        clients = {g: h.client for g, h in self.hosted.items()}
        return shard_services(add, clients, self.stopped)

    async def start(self) -> None:
        for h in self.hosted.values():
            await h.node.start()
            h.services.start()

    def describe(self) -> str:
        return (
            f", shards {sorted(self.hosted)} of 1..{self.cfg.shard_count}"
            f"{' and 0 (routes)' if 0 in self.hosted else ''}"
        )

    def registry(self) -> CollectorRegistry:
        """What the metrics port serves: every shard's metrics in one registry, each
        sample labelled with its shard (`shard`: `group` names a consumer group)."""
        merged = CollectorRegistry()
        merged.register(_Labelled({g: h.metrics.registry for g, h in self.hosted.items()}))
        return merged

    async def close(self) -> None:
        """Close in reverse order of opening: services, client services, nodes."""
        for h in reversed(list(self.hosted.values())):
            if h.client is not None:
                await h.client.close()
            await h.services.close()
            await h.node.close()

    @property
    def fatal(self) -> BaseException | None:
        """What stopped a shard, if anything did (the first shard's first)."""
        for h in self.hosted.values():
            if h.node.fatal is not None:
                return h.node.fatal
        return None


class _Labelled(Collector):
    """Several registries' metrics as one, each sample labelled with its shard."""

    def __init__(self, registries: dict[int, CollectorRegistry]) -> None:
        self._registries = registries

    def collect(self) -> list[Metric]:
        families: dict[str, Metric] = {}
        for shard, registry in self._registries.items():
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for sample in family.samples:
                    merged.samples.append(
                        sample._replace(labels={**sample.labels, "shard": str(shard)})
                    )
        return list(families.values())
