"""Static configuration of one Raft node, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Config:
    """Tunables of `RaftCore`. Times are in ticks; sizes in bytes of entry data.

    `peers` is the static voter set and includes `id`. Election timeouts are
    drawn from [election_ticks, 2 * election_ticks).
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

    def __post_init__(self) -> None:
        if self.id not in self.peers:
            raise ValueError(f"id {self.id} is not in peers {self.peers}")
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
