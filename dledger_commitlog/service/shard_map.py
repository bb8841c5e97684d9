"""What one node process knows beyond the shard a call names (docs/scaling.md).

Owns `ShardMap`: the shards the process hosts (their nodes: leaders and members) and,
when it hosts the metadata shard 0, the route table (`messaging.routes.RouteStore`).
The process builds one (`process.shards`) and hands it to every shard's client
service; a cluster of one data shard has no shard 0 and answers with its one
default route per topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dledger_commitlog.messaging.routes import RouteStore, RouteTable
from dledger_commitlog.node.node import RaftNode
from proto import dledger_pb2 as pb


@dataclass
class ShardMap:
    """The process: its hosted shards' nodes and, with shard 0, the route table."""

    shard_count: int
    queues_per_topic: int
    nodes: Mapping[int, RaftNode] = field(default_factory=dict)
    routes: RouteStore | None = None

    def table(self) -> RouteTable | None:
        """The route table (None: a multi-shard process without shard 0)."""
        if self.routes is not None:
            return self.routes.current()
        if self.shard_count == 1:
            return RouteTable(1, self.queues_per_topic)
        return None

    def routes_behind_ms(self) -> int:
        """How old `table()` may be (RouteResponse.age_ms): 0 on shard 0's leader and
        where the routes never change (one data shard); else how long since this node
        heard from shard 0's leader (-1: not since it started)."""
        node = self.nodes.get(0)
        if self.routes is None or node is None:
            return 0
        return node.membership.behind_ms()

    async def confirm_routes(self, timeout_s: float) -> None:
        """Return once `table()` holds every route change shard 0 had committed when
        asked: a read index confirmed by its quorum, then dispatched here (NotLeader,
        TimeoutError)."""
        node = self.nodes.get(0)
        if self.routes is None or node is None:
            return
        await node.read_index(timeout_s)
        await node.wait_dispatched(node.committed_pos, timeout_s)

    def leaders(self) -> list[pb.GroupLeader]:
        return [
            pb.GroupLeader(
                group=g,
                leader_id=node.leader_id or 0,
                leader=node.leader_client_address() or "",
                members=sorted(m.id for m in node.membership.members()),
            )
            for g, node in sorted(self.nodes.items())
        ]
