"""Status and maintenance: `dledger status`, `admin clean-now`, `transfer-leader`,
`node drain` and `node undrain`.

Owns `AdminRpcs` and `status_pb`, the node's state as the Status RPC reports it
(with the members, voters and learners, and each one's lag as this node knows it;
whether it is drained; its software version and wire versions). CleanNow,
TransferLeadership and Drain need the admin right when the ACL is on; a
leadership goes only to a voter of the live membership that is not drained. Drain
is this node's own (never forwarded): a refused drain is FAILED_PRECONDITION and
changed nothing (docs/upgrades.md).
"""

from __future__ import annotations

import grpc

from dledger_commitlog.node.acl import require_admin
from dledger_commitlog.node.config import NodeConfig
from dledger_commitlog.node.drain import DrainRefused
from dledger_commitlog.node.versions import WIRE_VERSIONS, software_version
from dledger_commitlog.node.views import NodeState
from dledger_commitlog.service.base import Context, ServiceBase
from dledger_commitlog.service.members import members_pb
from proto import dledger_pb2 as pb


class AdminRpcs(ServiceBase):
    async def CleanNow(self, request: pb.CleanNowRequest, context: Context) -> pb.CleanNowResponse:
        await self._allow(context, "CleanNow", lambda a: require_admin(a, "CleanNow"))
        deleted, min_offset, reason = await self.node.clean_now(force=request.force)
        return pb.CleanNowResponse(deleted_segments=deleted, min_offset=min_offset, reason=reason)

    async def Status(self, request: pb.StatusRequest, context: Context) -> pb.StatusResponse:
        await self._caller(context, "Status")
        reply = status_pb(self.node.status(), self.cfg, removed=self.node.membership.removed)
        reply.loop_lag_max_ms = self.loop_lag.max_ms(reset=request.reset_loop_lag)
        reply.members.extend(members_pb(self.node.membership.members()))
        return reply

    # -- transactional messages (docs/delayed-and-transactional.md) ------------------

    async def TransferLeadership(
        self, request: pb.TransferLeadershipRequest, context: Context
    ) -> pb.TransferLeadershipResponse:
        await self._allow(
            context, "TransferLeadership", lambda a: require_admin(a, "TransferLeadership")
        )
        target = request.target_node_id
        role = {m.id: m.role for m in self.node.membership.members()}.get(target)
        if role is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"node {target} is not a peer")
        if role != "voter":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {target} is a {role}: only a voter can lead",
            )
        if not self.node.is_leader():
            await self._redirect(context)
        try:
            leader_id = await self.node.transfer_leadership(
                target, (request.timeout_ms or 5000) / 1000
            )
        except TimeoutError as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except ValueError as exc:  # the target is drained
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.TransferLeadershipResponse(leader_id=leader_id)

    async def Drain(self, request: pb.DrainRequest, context: Context) -> pb.DrainResponse:
        await self._allow(context, "Drain", lambda a: require_admin(a, "Drain"))
        try:
            moved = await self.node.drain(
                request.drained, (request.timeout_ms or 5000) / 1000, request.dry_run
            )
        except DrainRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TimeoutError as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        return pb.DrainResponse(
            drained=self.node.drained, leader_id=self.node.leader_id or 0, moved=moved
        )


REMOVED = "removed"  # the role a node reports once the configuration in effect left it out


def status_pb(state: NodeState, cfg: NodeConfig, *, removed: bool = False) -> pb.StatusResponse:
    """The Status answer: `state` as the node sees it; its role `removed` (not the
    Raft role it still plays until it stops) once it is no longer a member."""
    peers = [
        pb.PeerStatus(
            node_id=p, match_index=pr.match, next_index=pr.next, recent_active=pr.recent_active
        )
        for p, pr in sorted(state.progress.items())
    ]
    return pb.StatusResponse(
        node_id=cfg.node_id,
        role=REMOVED if removed else state.role.value,
        term=state.term,
        leader_id=state.leader_id or 0,
        leader_address=state.leader_client_address or "",
        first_index=state.first_index,
        last_index=state.last_index,
        committed_index=state.committed_index,
        committed_pos=state.committed_pos,
        flushed_pos=state.flushed_pos,
        dispatched_pos=state.dispatched_pos,
        applied_index=state.committed_index,
        cluster=cfg.cluster,
        peers=peers,
        last_chain_crc=state.last_chain_crc,
        flush_mode=cfg.flush_mode,
        drained=state.drained,
        version=software_version(),
        wire_versions=WIRE_VERSIONS,
    )
