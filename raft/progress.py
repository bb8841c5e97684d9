"""What a leader knows about each follower's log, and the append flow control.

Owns: `Progress` (match/next, probe, replicate or snapshot state, recent
activity) and `Inflights` (the bounded window of pipelined AppendEntries).

Invariants: match < next; in PROBE at most one append is outstanding
(`probe_sent`); in REPLICATE `next` is optimistic (last sent + 1) and the
window holds at most `max_msgs` messages and (beyond its first message)
`max_bytes` bytes of entry data. Messages are released in order when an ack
with index >= their last index arrives. In SNAPSHOT one `Snapshot` message
(restart after `pending_snapshot`) is outstanding and nothing else is sent
until the follower acknowledges it or the leader gives up waiting.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass


class ProgressState(enum.Enum):
    PROBE = "probe"  # find the match point: one append at a time
    REPLICATE = "replicate"  # stream appends, bounded by the inflight window
    SNAPSHOT = "snapshot"  # a Snapshot is on its way: wait for its ack


class Inflights:
    """A FIFO of (last index, bytes) per AppendEntries in flight to one follower."""

    __slots__ = ("_q", "bytes", "max_bytes", "max_msgs")

    def __init__(self, max_msgs: int, max_bytes: int) -> None:
        self._q: deque[tuple[int, int]] = deque()
        self.max_msgs = max_msgs
        self.max_bytes = max_bytes
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._q)

    def full(self) -> bool:
        return len(self._q) >= self.max_msgs or self.bytes >= self.max_bytes

    def add(self, last_index: int, size: int) -> None:
        assert not self._q or self._q[-1][0] < last_index, "inflights must grow"
        assert not self.full(), "window overflow"
        self._q.append((last_index, size))
        self.bytes += size

    def free_le(self, index: int) -> None:
        """Release every message whose last index is <= `index`."""
        q = self._q
        while q and q[0][0] <= index:
            self.bytes -= q.popleft()[1]

    def free_first_one(self) -> None:
        """Make room for one message: the follower is alive but the window is
        stuck (messages lost); the next send will reveal where it stands."""
        if self._q:
            self.bytes -= self._q.popleft()[1]

    def reset(self) -> None:
        self._q.clear()
        self.bytes = 0


class Progress:
    """The leader's view of one peer (the leader keeps one for itself too)."""

    __slots__ = (
        "budget",
        "inflights",
        "match",
        "may_lead",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "sent_commit",
        "snapshot_wait",
        "state",
    )

    def __init__(self, next_index: int, max_msgs: int, max_bytes: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.recent_active = False
        # Whether the peer's last heartbeat answer said it may campaign (None: no answer
        # yet in this leadership): a transfer goes only to a peer known to take it.
        self.may_lead: bool | None = None
        self.sent_commit = 0  # the highest commit index sent to the peer
        self.pending_snapshot = 0  # SNAPSHOT: the index the follower restarts after
        self.snapshot_wait = 0  # SNAPSHOT: heartbeat responses seen without its ack
        self.inflights = Inflights(max_msgs, max_bytes)
        self.budget = 0  # catch-up throttle: entry bytes of committed entries it may get

    def __repr__(self) -> str:
        return f"Progress({self.state.value} match={self.match} next={self.next})"

    def become_probe(self) -> None:
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflights.reset()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflights.reset()

    def become_snapshot(self, index: int) -> None:
        """A Snapshot restarting the follower's log after `index` was sent."""
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        self.snapshot_wait = 0
        self.next = index + 1
        self.probe_sent = False
        self.inflights.reset()

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.SNAPSHOT:
            return True
        return self.inflights.full()

    def sent_entries(self, last_index: int, count: int, size: int) -> None:
        """Record an AppendEntries carrying `count` entries ending at `last_index`."""
        if self.state is ProgressState.REPLICATE:
            if count:
                self.next = last_index + 1
                self.inflights.add(last_index, size)
        else:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """An ack for `index`; returns whether match advanced."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def lost_log(self, last_index: int) -> None:
        """The follower's log ends at `last_index`, below its match: start over from there."""
        self.match = last_index
        self.next = last_index + 1
        self.become_probe()

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of prev_index `rejected`; returns whether it was not stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:  # in SNAPSHOT no append is outstanding
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True


@dataclass(frozen=True, slots=True)
class PeerProgress:
    """A read-only copy of the leader's replication state for one peer."""

    match: int
    next: int
    state: ProgressState
    recent_active: bool
    pending_snapshot: int = 0  # in SNAPSHOT: the index the follower restarts after
    may_lead: bool | None = None  # its last heartbeat answer: it may campaign (None: no answer)
