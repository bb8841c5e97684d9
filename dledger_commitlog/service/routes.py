"""Routes of a multi-shard cluster: `Route` and `TopicUpdate` (docs/scaling.md).

Owns `RouteRpcs`, over `shard_map.ShardMap` (what one node process knows beyond the
shard a call names: the shards it hosts and, with shard 0, the route table). `Route`
is answered by any shard's service of the process (it is the process's answer), with
how old its table may be (`age_ms`), or, asked `linearizable`, only once the table
holds what shard 0's leader confirms committed;
`TopicUpdate` is a call of shard 0 (the dispatcher sends it to shard 0's service,
a follower redirects to shard 0's leader) and needs the admin right when the ACL
is on. A single-shard cluster answers `Route` with its one default route per topic
and refuses `TopicUpdate`: every topic lives in shard 1 there.
"""

from __future__ import annotations

import grpc

from dledger_commitlog.common.routes import TopicRoute
from dledger_commitlog.messaging.routes import RouteError
from dledger_commitlog.node.acl import require_admin
from dledger_commitlog.service.base import Context, ServiceBase
from proto import dledger_pb2 as pb
from raft import NotLeader

_OPS = {
    pb.TopicUpdateRequest.CREATE: "create",
    pb.TopicUpdateRequest.UPDATE: "update",
    pb.TopicUpdateRequest.DELETE: "delete",
}


def route_pb(route: TopicRoute) -> pb.TopicRoute:
    return pb.TopicRoute(
        topic=route.topic,
        configured=route.configured,
        groups=[pb.GroupQueues(group=g, queues=n) for g, n in route.shards],
    )


class RouteRpcs(ServiceBase):
    async def Route(self, request: pb.RouteRequest, context: Context) -> pb.RouteResponse:
        await self._caller(context, "Route")
        wrong = self._check_cluster(request.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        host = self.shard_map
        if host.table() is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {self.cfg.node_id}'s process does not host shard 0 "
                "(the routes): ask one that does",
            )
        age_ms = host.routes_behind_ms()
        if request.linearizable and age_ms != 0:
            try:
                await host.confirm_routes(self._timeout(context))
            except NotLeader:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, "no leader of shard 0 to confirm the routes"
                )
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, "the routes could not be confirmed in time"
                )
            age_ms = 0
        table = host.table()
        assert table is not None
        routes = (
            [table.route(request.topic)]
            if request.topic
            else [table.configured[t] for t in sorted(table.configured)]
        )
        return pb.RouteResponse(
            data_groups=table.shard_count,  # the wire keeps its field names
            queues_per_topic=table.queues_per_topic,
            routes=[route_pb(r) for r in routes],
            leaders=host.leaders(),
            version=table.version,
            age_ms=age_ms,
        )

    async def TopicUpdate(
        self, request: pb.TopicUpdateRequest, context: Context
    ) -> pb.TopicUpdateResponse:
        await self._allow(context, "TopicUpdate", lambda a: require_admin(a, "TopicUpdate"))
        wrong = self._check_cluster(request.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        host = self.shard_map
        if host.shard_count == 1:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "a cluster of one shard: every topic lives in shard 1 "
                "(start the cluster with --shards N to spread topics)",
            )
        if self.cfg.shard != 0 or host.routes is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {self.cfg.node_id}'s process does not host shard 0 "
                "(the routes): ask one that does",
            )
        assert host.routes is not None
        op = _OPS.get(request.op)
        if op is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown op {request.op}")
        assert op is not None
        shards = [(q.group, q.queues) for q in request.groups]  # the wire's field names
        try:
            route, version = await host.routes.change(
                op, request.topic, shards, self._timeout(context)
            )
        except RouteError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotLeader:
            await self._redirect(context)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "the route change did not commit in time; it may still",
            )
        reply = pb.TopicUpdateResponse(version=version)
        if route is not None:
            reply.route.CopyFrom(route_pb(route))
        return reply
