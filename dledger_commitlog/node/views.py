"""What the node's facade reports: plain values, built by `RaftNode.status` and
`RaftNode.members` at one moment and safe to hand to any thread."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raft import Role
from raft.progress import PeerProgress


@dataclass(frozen=True, slots=True)
class NodeState:
    """What `status()` reports: the node's Raft and store positions at one moment."""

    role: Role
    term: int
    leader_id: int | None
    leader_client_address: str | None
    first_index: int
    last_index: int
    committed_index: int  # the last entry applied to the commit log
    committed_pos: int
    flushed_pos: int
    dispatched_pos: int
    last_chain_crc: int
    progress: Mapping[int, PeerProgress]  # per peer; empty unless this node leads
    drained: bool = False  # out of elections, takes no leadership (node/drain.py)


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member as `dledger member list` shows it."""

    id: int
    role: str  # "voter" | "learner"
    raft: str
    client: str
    match: int  # the leader's match index for it (-1: unknown, this node does not lead)
    lag: int  # the leader's last index - match (-1: unknown)
