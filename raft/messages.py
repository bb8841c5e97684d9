"""The messages Raft nodes exchange. Plain frozen dataclasses of ints, bytes
and tuples of `Entry`, so the gRPC adapter can convert them field by field.

Every message carries `src`, `dst` and the sender's `term`. Pre-vote requests
carry the term the sender would campaign in (term + 1), not its current term.
"""

from __future__ import annotations

from dataclasses import dataclass

from raft.types import Entry


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """Leader -> follower: entries following (prev_index, prev_term).

    `quiet`: an entry-less append that only carries the commit index to a
    replicating follower; success is not answered (see raft/replication.py,
    `_send_appends`).
    """

    src: int
    dst: int
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """Follower -> leader. On success `index` is the last index now matching
    the leader's log. On reject `index` is the rejected prev_index and
    (hint_index, hint_term) is the follower's best guess at a matching point:
    the largest index <= min(prev_index, last) whose term <= the leader's prev_term.
    """

    src: int
    dst: int
    term: int
    index: int
    reject: bool = False
    hint_index: int = 0
    hint_term: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Leader -> follower whose next index is below the leader's first retained
    entry: "your log restarts after `index`, whose term is `log_term`". `data`
    is the leader storage's `snapshot_data()`, `commit` the leader's commit
    index. Answered by an `AppendResponse` (success, index >= `index` once the
    follower holds that point)."""

    src: int
    dst: int
    term: int
    index: int
    log_term: int
    commit: int
    data: bytes = b""
    conf: bytes = b""  # the membership in effect at `index` (raft/membership.py)
    conf_index: int = 0  # the index of its configuration entry (<= `index`)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Leader -> follower: keeps the lease; `ctx` confirms pending ReadIndex requests."""

    src: int
    dst: int
    term: int
    commit: int
    ctx: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """Follower -> leader: echoes the heartbeat's `ctx`; `no_lead`: the follower will
    not campaign now (drained, or a log it cannot serve), so no transfer goes to it."""

    src: int
    dst: int
    term: int
    ctx: bytes = b""
    no_lead: bool = False


@dataclass(frozen=True, slots=True)
class RequestVote:
    """(Pre-)candidate -> voter. `transfer` bypasses the leader lease (TimeoutNow)."""

    src: int
    dst: int
    term: int
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class VoteResponse:
    """Voter -> (pre-)candidate."""

    src: int
    dst: int
    term: int
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leader -> transfer target: campaign now, skipping pre-vote."""

    src: int
    dst: int
    term: int


@dataclass(frozen=True, slots=True)
class ReadIndexRequest:
    """Follower -> leader: a forwarded `read_index(ctx)`."""

    src: int
    dst: int
    term: int
    ctx: bytes


@dataclass(frozen=True, slots=True)
class ReadIndexResponse:
    """Leader -> follower: the confirmed read index for `ctx`."""

    src: int
    dst: int
    term: int
    ctx: bytes
    index: int


Message = (
    AppendEntries
    | AppendResponse
    | Snapshot
    | Heartbeat
    | HeartbeatResponse
    | RequestVote
    | VoteResponse
    | TimeoutNow
    | ReadIndexRequest
    | ReadIndexResponse
)
