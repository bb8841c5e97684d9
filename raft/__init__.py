"""Raft consensus for dledger-py: a pure, sans-I/O core (`RaftCore`) in the
style of etcd-io/raft. See docs/raft.md for the driver contract."""

from raft.config import Config
from raft.core import RaftCore
from raft.errors import (
    Compacted,
    LogDiverged,
    NotLeader,
    ProposalDropped,
    RaftError,
    Unavailable,
)
from raft.messages import (
    AppendEntries,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    RequestVote,
    Snapshot,
    TimeoutNow,
    VoteResponse,
)
from raft.progress import PeerProgress, ProgressState
from raft.ready import Ready
from raft.storage import LogStorage, MemoryStorage
from raft.types import Entry, EntryKind, HardState, ReadState, Rng, Role, SnapshotMeta

__all__ = [
    "AppendEntries",
    "AppendResponse",
    "Compacted",
    "Config",
    "Entry",
    "EntryKind",
    "HardState",
    "Heartbeat",
    "HeartbeatResponse",
    "LogDiverged",
    "LogStorage",
    "MemoryStorage",
    "Message",
    "NotLeader",
    "PeerProgress",
    "ProgressState",
    "ProposalDropped",
    "RaftCore",
    "RaftError",
    "ReadIndexRequest",
    "ReadIndexResponse",
    "ReadState",
    "Ready",
    "RequestVote",
    "Rng",
    "Role",
    "Snapshot",
    "SnapshotMeta",
    "TimeoutNow",
    "Unavailable",
    "VoteResponse",
]
