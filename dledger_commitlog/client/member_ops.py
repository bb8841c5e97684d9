"""A shard's administration calls, written once for both clients.

Owns `MemberOps` (a base of `api.ClientBase`): `transfer_leadership`, `drain` (one
node's, docs/upgrades.md) and the membership calls, `member_list`, `member_add`,
`member_promote`, `member_remove`, each an `operation.operation`. A membership
change's answer is awaited past its own timeout; a refusal is `ChangeRefused`, and a
timeout is never repeated (`OutcomeUnknown`: the change may still commit, see
`member_list`).
"""

from __future__ import annotations

from typing import Any

from dledger_commitlog.client.errors import ChangeRefused
from dledger_commitlog.client.operation import operation
from dledger_commitlog.client.retry import Op
from dledger_commitlog.client.values import (
    DrainResult,
    MemberChange,
    MemberInfo,
    member_change,
    member_infos,
)
from proto import dledger_pb2 as pb


class MemberOps:
    """Leadership and membership operations (a base of `api.ClientBase`)."""

    timeout_s: float  # the client's overall timeout (ClientBase sets it)

    @operation
    def transfer_leadership(self, target_node_id: int, timeout_ms: int = 5000) -> Op[int]:
        """Ask the leader to hand over to `target_node_id`; returns the new leader's id."""
        request = pb.TransferLeadershipRequest(target_node_id=target_node_id, timeout_ms=timeout_ms)
        return Op(
            "transfer_leadership",
            "TransferLeadership",
            request,
            lambda r: int(r.leader_id),
            floor_s=1 + timeout_ms / 1000,
            forgets_leader=True,
            refusal=ChangeRefused,  # the target is drained
        )

    @operation
    def drain(
        self, server: str, drained: bool = True, dry_run: bool = False, timeout_ms: int = 5000
    ) -> Op[DrainResult]:
        """Drain (`drained`) or undrain the node at `server` in this client's shard: it
        stops campaigning and, if it leads, hands the leadership to a voter that may
        lead. `dry_run`: only check. ChangeRefused: it would leave the shard without a
        voter that may lead (nothing changed)."""
        request = pb.DrainRequest(drained=drained, dry_run=dry_run, timeout_ms=timeout_ms)
        return Op(
            "drain",
            "Drain",
            request,
            lambda r: DrainResult(r.drained, int(r.leader_id), r.moved),
            pinned=server,
            floor_s=2 + timeout_ms / 1000,  # a new leader waits up to an election timeout
            timeout_s=2 + timeout_ms / 1000,
            refusal=ChangeRefused,
            forgets_leader=True,
        )

    @operation
    def member_list(self) -> Op[list[MemberInfo]]:
        """The shard's members as the leader sees them (voters, learners, match and lag)."""
        return Op(
            "member_list",
            "MemberList",
            pb.MemberListRequest(),
            lambda r: list(member_infos(r.members)),
        )

    @operation
    def member_add(
        self,
        node_id: int,
        raft: str,
        client: str,
        learner: bool = False,
        timeout_ms: int = 10_000,
    ) -> Op[MemberChange]:
        """Add node `node_id` (its Raft and client HOST:PORT), as a learner if `learner`:
        it receives the log and does not vote until promoted. ChangeRefused: refused as
        things stand (the id exists, a change is pending); OutcomeUnknown: not committed
        within `timeout_ms`, it may still be (see `member_list`)."""
        request = pb.MemberAddRequest(
            id=node_id, raft=raft, client=client, learner=learner, timeout_ms=timeout_ms
        )
        return self._change("member_add", "MemberAdd", request, timeout_ms)

    @operation
    def member_promote(self, node_id: int, timeout_ms: int = 10_000) -> Op[MemberChange]:
        """Make learner `node_id` a voter (ChangeRefused while it is too far behind)."""
        request = pb.MemberPromoteRequest(id=node_id, timeout_ms=timeout_ms)
        return self._change("member_promote", "MemberPromote", request, timeout_ms)

    @operation
    def member_remove(self, node_id: int, timeout_ms: int = 10_000) -> Op[MemberChange]:
        """Remove node `node_id` from the shard (ChangeRefused for the last voter)."""
        request = pb.MemberRemoveRequest(id=node_id, timeout_ms=timeout_ms)
        return self._change("member_remove", "MemberRemove", request, timeout_ms)

    def _change(self, name: str, method: str, request: Any, timeout_ms: int) -> Op[MemberChange]:
        """A membership change's Op: the leader's answer is awaited past its own timeout,
        a refusal is ChangeRefused, and a timeout is never repeated (OutcomeUnknown)."""
        return Op(
            name,
            method,
            request,
            member_change,
            write=True,
            floor_s=1 + timeout_ms / 1000,
            timeout_s=max(self.timeout_s, 2 + timeout_ms / 1000),
            refusal=ChangeRefused,
            unknown_on_timeout=True,
        )
