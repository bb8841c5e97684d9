"""A leader's ReadIndex requests: held, then confirmed by heartbeat acks.

Owns: `ReadOnly`, the two queues of a leader's linearizable reads (etcd's
`readOnly`): the reads held until the leader has committed an entry of its own
term (before that its commit index may be stale), and the FIFO of reads, each
with the commit index it was given, waiting for a quorum of heartbeat
responses. The core decides when a read is held, queued or answered at once
(raft/replication.py); this object keeps the queues and says which reads a
quorum has confirmed.

Invariants: requests are released in the order they were added; an ack for a
request's ctx from a quorum also releases every earlier request (their
heartbeat rounds started no later); a ctx is queued at most once (the first
request wins). Bounded by the number of distinct ctxs the application has
outstanding; both queues are cleared whenever the leader's term or role changes.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from raft.quorum import has_quorum


@dataclass(slots=True)
class ReadRequest:
    ctx: bytes
    index: int  # the leader's commit index when the request arrived
    requester: int  # node id that asked (the leader itself for local reads)
    acks: set[int] = field(default_factory=set)


class ReadOnly:
    __slots__ = ("_held", "_pending")

    def __init__(self) -> None:
        self._pending: dict[bytes, ReadRequest] = {}  # insertion-ordered
        self._held: list[tuple[bytes, int]] = []  # (ctx, requester) until a commit in the term

    def __len__(self) -> int:
        """How many reads wait for heartbeat acks (held ones not counted)."""
        return len(self._pending)

    def hold(self, ctx: bytes, requester: int) -> None:
        """Keep a read until the leader has committed an entry of its term."""
        self._held.append((ctx, requester))

    def take_held(self) -> list[tuple[bytes, int]]:
        """The held reads, in the order they arrived; none are held afterwards."""
        held, self._held = self._held, []
        return held

    def add(self, ctx: bytes, index: int, requester: int, self_id: int) -> bool:
        """Queue a request; False if `ctx` is already pending (the first one wins)."""
        if ctx in self._pending:
            return False
        self._pending[ctx] = ReadRequest(ctx, index, requester, {self_id})
        return True

    def last_ctx(self) -> bytes:
        """The newest pending ctx (b"" if none): what a heartbeat should carry."""
        if not self._pending:
            return b""
        return next(reversed(self._pending))

    def recv_ack(self, src: int, ctx: bytes, voters: Collection[int]) -> list[ReadRequest]:
        """Record `src`'s heartbeat ack of `ctx`; return the requests now confirmed."""
        req = self._pending.get(ctx)
        if req is None:
            return []
        req.acks.add(src)
        if not has_quorum(voters, req.acks):
            return []
        released: list[ReadRequest] = []
        for key in list(self._pending):
            released.append(self._pending.pop(key))
            if key == ctx:
                break
        return released

    def reset(self) -> None:
        """Forget every read, held or queued (the leader's term or role changed)."""
        self._pending.clear()
        self._held = []
