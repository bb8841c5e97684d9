"""Membership RPCs: `dledger member list|add|promote|remove` (docs/operations.md).

Owns `MemberRpcs` and the mapping between the node's membership part
(`RaftNode.membership`: `members`, `add_member`, `promote_member`, `remove_member`)
and gRPC:

- the leader answers; a follower redirects (FAILED_PRECONDITION with the leader's
  address in the trailing metadata, as TransferLeadership does), a node that knows
  no leader is UNAVAILABLE (the clients retry both);
- a change needs the admin right when the ACL is on; MemberList any account;
- a malformed request (an id below 1, an address that is not HOST:PORT, a negative
  timeout) is INVALID_ARGUMENT before the node sees it; a change the node refuses as
  things stand (`MembershipError`: an id that exists, the last voter, an unknown
  node, a learner too far behind, a change still pending) is FAILED_PRECONDITION
  with the node's reason; both change nothing;
- a change not committed in time is DEADLINE_EXCEEDED: its outcome is unknown (it
  may still commit), which the clients report rather than repeat.

With TLS on, nothing here checks a new node's certificate: the Raft port's peer
gate does, each time a node connects (its certificate must name it,
`dledger-node-{id}`, signed by the cluster's CA), so a node added under an id its
certificate does not name never joins the conversation (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import grpc

from dledger_commitlog.node.acl import require_admin
from dledger_commitlog.node.config import ConfigError, parse_address
from dledger_commitlog.node.views import MemberStatus
from dledger_commitlog.service.base import Context, ServiceBase
from proto import dledger_pb2 as pb
from raft import NotLeader
from raft.errors import MembershipError
from raft.membership import Member

DEFAULT_CHANGE_TIMEOUT_MS = 10_000
MAX_NODE_ID = (1 << 31) - 1  # an int32 on the wire


class MemberRpcs(ServiceBase):
    async def MemberList(
        self, request: pb.MemberListRequest, context: Context
    ) -> pb.MemberListResponse:
        await self._caller(context, "MemberList")
        if not self.node.is_leader():
            await self._redirect(context)
        return pb.MemberListResponse(
            members=members_pb(self.node.membership.members()), leader_id=self.node.node_id
        )

    async def MemberAdd(
        self, request: pb.MemberAddRequest, context: Context
    ) -> pb.MemberChangeResponse:
        await self._allow(context, "MemberAdd", lambda a: require_admin(a, "MemberAdd"))
        try:
            member = new_member(request)
            timeout_s = change_timeout_s(request.timeout_ms)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        membership = self.node.membership
        return await self._change(context, lambda: membership.add_member(member, timeout_s))

    async def MemberPromote(
        self, request: pb.MemberPromoteRequest, context: Context
    ) -> pb.MemberChangeResponse:
        promote = self.node.membership.promote_member
        return await self._change_of(context, "MemberPromote", request, promote)

    async def MemberRemove(
        self, request: pb.MemberRemoveRequest, context: Context
    ) -> pb.MemberChangeResponse:
        remove = self.node.membership.remove_member
        return await self._change_of(context, "MemberRemove", request, remove)

    async def _change_of(
        self,
        context: Context,
        method: str,
        request: pb.MemberPromoteRequest | pb.MemberRemoveRequest,
        op: Callable[[int, float], Awaitable[int]],
    ) -> pb.MemberChangeResponse:
        """A change of one member by id (promote, remove): admin right, checked input."""
        await self._allow(context, method, lambda a: require_admin(a, method))
        try:
            node_id = check_node_id(request.id)
            timeout_s = change_timeout_s(request.timeout_ms)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return await self._change(context, lambda: op(node_id, timeout_s))

    async def _change(
        self, context: Context, change: Callable[[], Awaitable[int]]
    ) -> pb.MemberChangeResponse:
        """Run one membership change on the leader and map how it ended."""
        if not self.node.is_leader():
            await self._redirect(context)
        try:
            index = await change()
        except NotLeader:  # lost the leadership meanwhile: nothing was appended
            await self._redirect(context)
        except MembershipError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TimeoutError as exc:
            why = f"{exc or 'not committed in time'}; it may still commit (`dledger member list`)"
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, why)
        members = self.node.membership.members() if self.node.is_leader() else []
        return pb.MemberChangeResponse(config_index=index, members=members_pb(members))


def check_node_id(node_id: int) -> int:
    if not 1 <= node_id <= MAX_NODE_ID:
        raise ValueError(f"node id {node_id}: ids are 1..{MAX_NODE_ID}")
    return node_id


def change_timeout_s(timeout_ms: int) -> float:
    if timeout_ms < 0:
        raise ValueError(f"timeout_ms {timeout_ms} is negative")
    return (timeout_ms or DEFAULT_CHANGE_TIMEOUT_MS) / 1000


def new_member(request: pb.MemberAddRequest) -> Member:
    """The member an add request names (ValueError: a bad id or address)."""
    node_id = check_node_id(request.id)
    for what, address in (("raft", request.raft), ("client", request.client)):
        try:
            parse_address(address)
        except ConfigError:
            why = f"{what} address {address!r} of node {node_id} is not HOST:PORT"
            raise ValueError(why) from None
    return Member(node_id, request.raft, request.client, learner=request.learner)


def members_pb(members: Sequence[MemberStatus]) -> list[pb.Member]:
    return [member_pb(m) for m in sorted(members, key=lambda m: m.id)]


def member_pb(m: MemberStatus) -> pb.Member:
    return pb.Member(
        id=m.id, raft=m.raft, client=m.client, role=m.role, match_index=m.match, lag=m.lag
    )
