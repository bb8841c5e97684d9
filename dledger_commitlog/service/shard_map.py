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
