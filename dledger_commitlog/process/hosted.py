"""The Raft groups one node process hosts, built, started and closed together.

Owns `Groups`: per hosted group (`NodeConfig.host_groups`; group 1 alone in a
cluster of one data group) its config (`config.group_config`: its own data directory),
`RaftNode`, leader-side services (`messaging.services.LeaderServices`), metrics
and client service (`client_service.ClientService`), and what the groups of a
process share (docs/scaling.md): the event loop, the Raft peer port (`gate`: each
message goes to the group it names), one outgoing stream per peer process
(`raftio.multiplex.LinkPool`), the client port (`client_services`: each call goes to
the group it names, `multigroup`), the metrics port (`registry`: every group's
metrics with a `shard` label: the Raft group) and what the process knows beyond one group
(`service.host.Host`: its groups' nodes and, with group 0, the route table).
A cluster of one data group is built by the same code: a process hosting one group.

A group's failure (corruption, a full disk) stops that group, not the process: a
group whose directory cannot be opened (recovery refuses it) is left closed, and a
group that fails later stops itself as a single node does (`RaftNode.stop_on`);
either way its calls are UNAVAILABLE naming why (`stopped`), its peers' messages
are dropped, and the other groups keep serving. The process stops when every group
it hosts has failed (its one group, if it hosts one), and refuses to start when
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
from dledger_commitlog.node.config import NodeConfig, group_config
from dledger_commitlog.node.metrics import NodeMetrics
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.node.security import NodeSecurity
from dledger_commitlog.service.client_service import ClientService
from dledger_commitlog.service.decoding import Services
from dledger_commitlog.service.host import Host
from dledger_commitlog.service.multigroup import group_services
from proto import dledger_pb2_grpc as pb_grpc
from raft.messages import Message
from raftio.multiplex import LinkPool
from raftio.transport import PeerGate, open_link

log = logging.getLogger(__name__)


@dataclass
class Hosted:
    """One hosted group."""

    group: int
    cfg: NodeConfig
    metrics: NodeMetrics
    node: RaftNode
    services: LeaderServices
    client: ClientService | None = None


class Groups:
    def __init__(self, cfg: NodeConfig, stop: asyncio.Event, security: NodeSecurity) -> None:
        self.cfg = cfg
        self._stop = stop
        self.security = security
        self._pool = LinkPool(open_link)
        self.hosted: dict[int, Hosted] = {}
        # Groups that stopped on this node (could not open, or failed since), and why:
        # their calls are UNAVAILABLE (`multigroup`), their Raft messages dropped.
        self.stopped: dict[int, str] = {}
        self.host = Host(cfg.data_groups, cfg.queues_per_topic)  # with its groups once open

    @property
    def first(self) -> Hosted:
        return next(iter(self.hosted.values()))

    async def open(self) -> None:
        """Open (recover) every hosted group's data directory, in ascending group order;
        if one cannot be opened, close the ones opened before it and raise."""
        try:
            self._open()
        except BaseException:
            await self.close()
            raise

    def _open(self) -> None:
        first: Exception | None = None
        for group in sorted(self.cfg.host_groups):
            gcfg = group_config(self.cfg, group)
            metrics = NodeMetrics(self.cfg.node_id)
            try:
                node = RaftNode(gcfg, metrics, security=self.security,
                                on_fatal=self._failure_of(group), links=self._pool)  # fmt: skip
            except Exception as exc:
                first = first or exc
                self.stopped[group] = (f"group {group} is stopped on node {self.cfg.node_id}: "
                                       f"it could not be opened ({exc})")  # fmt: skip
                continue
            self.hosted[group] = Hosted(group, gcfg, metrics, node,
                                        LeaderServices(node, gcfg, metrics))  # fmt: skip
        if not self.hosted and first is not None:
            raise first  # no group opened (a second copy of the process, say)
        for why in self.stopped.values():
            log.critical("node %d: %s; the process's other groups serve on",
                         self.cfg.node_id, why)  # fmt: skip
        routes = None
        if 0 in self.hosted:
            routes = RouteStore(
                self.hosted[0].services.system_log, self.cfg.data_groups, self.cfg.queues_per_topic
            )
        self.host = Host(self.cfg.data_groups, self.cfg.queues_per_topic,
                         {g: h.node for g, h in self.hosted.items()}, routes)  # fmt: skip

    def _failure_of(self, group: int) -> Callable[[], None]:
        def failed() -> None:
            why = self.hosted[group].node.fatal
            self.stopped[group] = f"group {group} is stopped on node {self.cfg.node_id}: {why}"
            log.critical("node %d: group %d stopped (%s); the process's other groups "
                         "keep serving", self.cfg.node_id, group, why)  # fmt: skip
            if set(self.stopped) >= set(self.hosted):
                self._stop.set()

        return failed

    def gate(self) -> PeerGate:
        """The Raft port's gate: every stream checked once, each message to its group."""
        cfg = self.cfg
        reject = self.first.metrics.peer_rejects

        def members() -> frozenset[int]:
            out: frozenset[int] = frozenset()
            for h in self.hosted.values():
                out |= frozenset(h.node.member_ids())
            return out

        def deliver_of(group: int) -> Callable[[Message], None] | None:
            hosted = self.hosted.get(group)
            return None if hosted is None or group in self.stopped else hosted.node.deliver

        return PeerGate(cfg.cluster, self.first.node.deliver, me=cfg.node_id, members=members,
                        security=self.security, on_reject=lambda why: reject.labels(why).inc(),
                        groups=deliver_of)  # fmt: skip

    def start_services(self) -> None:
        """Build and start each group's client service (on the serving loop)."""
        for h in self.hosted.values():
            h.client = ClientService(h.cfg, h.node, h.services, metrics=h.metrics,
                                     security=self.security, host=self.host)  # fmt: skip
            h.client.start()

    def client_services(self) -> Services:
        add = pb_grpc.add_DLedgerClientServicer_to_server
        clients = {g: h.client for g, h in self.hosted.items()}
        return group_services(add, clients, self.stopped)

    async def start(self) -> None:
        for h in self.hosted.values():
            await h.node.start()
            h.services.start()

    def describe(self) -> str:
        return (f", groups {sorted(self.hosted)} of 1..{self.cfg.data_groups}"
                f"{' and 0 (routes)' if 0 in self.hosted else ''}")  # fmt: skip

    def registry(self) -> CollectorRegistry:
        """What the metrics port serves: every group's metrics in one registry, each
        sample labelled with its Raft group (`shard`: `group` names a consumer group)."""
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
        """What stopped a group, if anything did (the first group's first)."""
        for h in self.hosted.values():
            if h.node.fatal is not None:
                return h.node.fatal
        return None


class _Labelled(Collector):
    """Several registries' metrics as one, each sample labelled with its group."""

    def __init__(self, registries: dict[int, CollectorRegistry]) -> None:
        self._registries = registries

    def collect(self) -> list[Metric]:
        families: dict[str, Metric] = {}
        for group, registry in self._registries.items():
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for sample in family.samples:
                    merged.samples.append(sample._replace(
                        labels={**sample.labels, "shard": str(group)}))  # fmt: skip
        return list(families.values())
