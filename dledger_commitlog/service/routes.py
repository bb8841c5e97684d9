"""Routes of a multi-Raft cluster: `Route` and `TopicUpdate` (docs/scaling.md).

Owns `RouteRpcs` and `Host`, what one node process knows beyond the group a call
names: the groups it hosts (their leaders and members) and, when it hosts the
metadata group 0, the route table (`messaging.routes.RouteStore`). `Route` is
answered by any group's service of the process (it is the process's answer);
`TopicUpdate` is a call of group 0 (the dispatcher sends it to group 0's service,
a follower redirects to group 0's leader) and needs the admin right when the ACL
is on. A single-group cluster answers `Route` with its one default route per topic
and refuses `TopicUpdate`: every topic lives in group 1 there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from dispatch.dispatcher import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.routes import TopicRoute
from dledger_commitlog.messaging.routes import RouteError, RouteStore, RouteTable
from dledger_commitlog.node.acl import require_admin
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.service.base import Context, ServiceBase
from proto import dledger_pb2 as pb
from raft import NotLeader

_OPS = {pb.TopicUpdateRequest.CREATE: "create", pb.TopicUpdateRequest.UPDATE: "update",
        pb.TopicUpdateRequest.DELETE: "delete"}  # fmt: skip


@dataclass
class Host:
    """The process: its hosted groups' nodes and, with group 0, the route table."""

    data_groups: int
    queues_per_topic: int
    nodes: Mapping[int, RaftNode] = field(default_factory=dict)
    routes: RouteStore | None = None

    def table(self) -> RouteTable | None:
        """The route table (None: a multi-group process without group 0)."""
        if self.routes is not None:
            return self.routes.current()
        if self.data_groups == 1:
            return RouteTable(1, self.queues_per_topic)
        return None

    def leaders(self) -> list[pb.GroupLeader]:
        return [
            pb.GroupLeader(
                group=g,
                leader_id=node.leader_id or 0,
                leader=node.leader_client_address() or "",
                members=sorted(m.id for m in node.members()),
            )
            for g, node in sorted(self.nodes.items())
        ]


def route_pb(route: TopicRoute) -> pb.TopicRoute:
    return pb.TopicRoute(
        topic=route.topic, configured=route.configured,
        groups=[pb.GroupQueues(group=g, queues=n) for g, n in route.groups],
    )  # fmt: skip


class RouteRpcs(ServiceBase):
    host: Host | None = None  # set by the server; None: a single-group view of this node

    def _host(self) -> Host:
        if self.host is None:
            self.host = Host(1, self.cfg.queues_per_topic, {self.cfg.group: self.node})
        return self.host

    def _queues_here(self, topic: str) -> int | None:
        host = self.host
        if host is None or host.data_groups == 1 or self.cfg.group == 0:
            return None
        table = host.table()
        if table is None or topic.startswith(SYSTEM_TOPIC_PREFIX):
            return None
        return dict(table.route(topic).groups).get(self.cfg.group, 0)

    async def Route(self, request: pb.RouteRequest, context: Context) -> pb.RouteResponse:
        await self._caller(context, "Route")
        wrong = self._check_cluster(request.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        host = self._host()
        table = host.table()
        if table is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"node {self.cfg.node_id}'s process does not host group 0 "
                                "(the routes): ask one that does")  # fmt: skip
        assert table is not None
        routes = ([table.route(request.topic)] if request.topic
                  else [table.configured[t] for t in sorted(table.configured)])  # fmt: skip
        return pb.RouteResponse(
            data_groups=table.data_groups, queues_per_topic=table.queues_per_topic,
            routes=[route_pb(r) for r in routes], leaders=host.leaders(), version=table.version,
        )  # fmt: skip

    async def TopicUpdate(
        self, request: pb.TopicUpdateRequest, context: Context
    ) -> pb.TopicUpdateResponse:
        await self._allow(context, "TopicUpdate", lambda a: require_admin(a, "TopicUpdate"))
        wrong = self._check_cluster(request.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        host = self._host()
        if host.data_groups == 1:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "a single-group cluster: every topic lives in group 1 "
                                "(start the cluster with --groups N to spread topics)")  # fmt: skip
        if self.cfg.group != 0 or host.routes is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"node {self.cfg.node_id}'s process does not host group 0 "
                                "(the routes): ask one that does")  # fmt: skip
        assert host.routes is not None
        op = _OPS.get(request.op)
        if op is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown op {request.op}")
        assert op is not None
        groups = [(q.group, q.queues) for q in request.groups]
        try:
            route, version = await host.routes.change(op, request.topic, groups,
                                                      self._timeout(context))  # fmt: skip
        except RouteError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotLeader:
            await self._redirect(context)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                "the route change did not commit in time; "
                                "it may still")  # fmt: skip
        reply = pb.TopicUpdateResponse(version=version)
        if route is not None:
            reply.route.CopyFrom(route_pb(route))
        return reply
