"""Static configuration of one Raft node, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass

from raft.membership import Membership


@dataclass(frozen=True, slots=True)
class Config:
    """Tunables of `RaftCore`. Times are in ticks; sizes in bytes of entry data.

    `peers` is the bootstrap voter set and includes `id`: the membership until the
    log or the hard state says otherwise (raft/membership.py). With `join` the node
    is joining a running group: `peers` are its members (the node itself, if
    listed, is ignored) and it learns its own membership from the leader's log.
    Election timeouts are drawn from [election_ticks, 2 * election_ticks).
    """

    id: int
    peers: tuple[int, ...]
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    max_append_entries: int = 512  # entries per AppendEntries message
    max_append_bytes: int = 1 << 20  # entry bytes per AppendEntries message
    max_inflight_msgs: int = 64  # pipelined AppendEntries per follower
    max_inflight_bytes: int = 32 << 20  # entry bytes in flight per follower
    check_quorum: bool = True
    pre_vote: bool = True
    preferred_leader: int | None = None
    # The driver reports durability separately (`RaftCore.persisted`) instead of
    # `advance` meaning "persisted": etcd's async storage writes.
    async_storage_writes: bool = False
    join: bool = False
    # A learner is promoted to voter only within this many entries of the leader's log.
    max_promote_lag: int = 1000
    # Catch-up throttle: entry bytes per tick per follower in appends of committed
    # entries only (a follower catching up; never what a commit waits for). 0: none.
    catch_up_bytes_per_tick: int = 0
    # This node is its fresh group's first leader: while its term is 0 and its log
    # empty it campaigns at every tick instead of after a randomized election
    # timeout (the other nodes keep theirs, so they hear from it first). A new
    # cluster then elects at once instead of waiting out a whole timeout.
    eager_campaign: bool = False

    def __post_init__(self) -> None:
        if self.id not in self.peers and not self.join:
            raise ValueError(f"id {self.id} is not in peers {self.peers}")
        if self.join and not set(self.peers) - {self.id}:
            raise ValueError("a joining node needs the ids of the group's members in peers")
        if len(set(self.peers)) != len(self.peers):
            raise ValueError(f"duplicate ids in peers {self.peers}")
        if self.heartbeat_ticks < 1 or self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("need 1 <= heartbeat_ticks < election_ticks")
        if min(self.max_append_entries, self.max_append_bytes, self.max_inflight_msgs) < 1:
            raise ValueError("append and inflight limits must be positive")
        if self.max_inflight_bytes < self.max_append_bytes:
            raise ValueError("max_inflight_bytes must be >= max_append_bytes")
        if self.preferred_leader is not None and self.preferred_leader not in self.peers:
            raise ValueError(f"preferred leader {self.preferred_leader} is not a peer")
        if self.max_promote_lag < 0 or self.catch_up_bytes_per_tick < 0:
            raise ValueError("max_promote_lag and catch_up_bytes_per_tick must be >= 0")

    def bootstrap(self) -> Membership:
        """The membership before any configuration entry (see the class docstring)."""
        voters = [p for p in self.peers if not (self.join and p == self.id)]
        return Membership.voters_only(voters)
