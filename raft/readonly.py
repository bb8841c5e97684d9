"""Pending ReadIndex requests on a leader, confirmed by heartbeat acks.

Owns: the FIFO of read requests waiting for a quorum of heartbeat responses.
Invariants: requests are released in the order they were added; an ack for a
request's ctx from a quorum also releases every earlier request (their
heartbeat rounds started no later). Bounded by the number of distinct ctxs
the application has outstanding; cleared whenever the leader's term or role
changes.
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
    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[bytes, ReadRequest] = {}  # insertion-ordered

    def __len__(self) -> int:
        return len(self._pending)

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
        self._pending.clear()
