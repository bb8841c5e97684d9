"""Checks on a message from a peer before the core sees it (pure: no I/O).

Owns: `check_peer_message`, the bounds every Raft message must keep, and
`InvalidPeerMessage`, the error that names which and why. The core trusts its
inputs (a term it adopts is persisted; an append's entries go to the log), so
the driver calls this first and drops what fails, never stepping the core.

Invariants enforced here:
- the sender is a configured member other than this node, the receiver is this node;
- every term and index lies in [0, MAX_TERM): a term the core adopts can always be
  incremented and still fit a signed 64-bit field on disk and on the wire;
- no message carries a term more than MAX_TERM_JUMP above this node's: with
  pre-vote a real peer is never that far ahead, while a node that adopted such a
  term would have every answer refused by the others for good;
- an append's entries are consecutive from prev_index + 1, their terms
  non-decreasing between prev_term and the message's term, each at most
  `max_entry_bytes`, and each configuration entry holds a membership: a
  malformed batch never reaches the log;
- a snapshot names a membership, from an entry at or below its commit index.
"""

from __future__ import annotations

from collections.abc import Collection

from raft.membership import Membership
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
from raft.types import EntryKind

MAX_TERM = 1 << 62
MAX_INDEX = 1 << 62
# Without pre-vote a partitioned node adds about one term per election timeout: a
# million elections is weeks of a flapping link, far more than any real gap.
MAX_TERM_JUMP = 1 << 20


class InvalidPeerMessage(ValueError):
    """A peer's message breaks the protocol's bounds; `membership` if it came from
    (or was meant for) a node that is not who it should be."""

    def __init__(self, reason: str, *, membership: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.membership = membership


def check_peer_message(
    msg: Message,
    *,
    me: int,
    peers: Collection[int],
    term: int,
    max_entry_bytes: int,
) -> None:
    """Raise InvalidPeerMessage unless `msg` may be stepped by node `me` at `term`."""
    kind = type(msg).__name__
    if msg.src == me or msg.src not in peers:
        raise InvalidPeerMessage(f"{kind} from node {msg.src}, not a member", membership=True)
    if msg.dst != me:
        raise InvalidPeerMessage(
            f"{kind} for node {msg.dst}, not this node ({me})", membership=True
        )
    if not 0 <= msg.term < MAX_TERM:
        raise InvalidPeerMessage(f"{kind} from node {msg.src}: term {msg.term} out of range")
    if msg.term > term + MAX_TERM_JUMP:
        raise InvalidPeerMessage(
            f"{kind} from node {msg.src}: term {msg.term} jumps more than {MAX_TERM_JUMP} "
            f"past this node's {term}"
        )
    match msg:
        case AppendEntries():
            _check_append(msg, max_entry_bytes)
        case Snapshot():
            _indexes(msg, msg.index, msg.commit, msg.conf_index)
            _log_term(msg, msg.log_term)
            if msg.index > msg.commit or msg.conf_index > msg.commit:
                raise InvalidPeerMessage(
                    f"snapshot from node {msg.src}: index {msg.index} or "
                    f"configuration {msg.conf_index} beyond its commit "
                    f"{msg.commit}"
                )
            if msg.conf:
                _membership(msg, msg.conf)
        case Heartbeat():
            _indexes(msg, msg.commit)
        case RequestVote():
            _indexes(msg, msg.last_index)
            _log_term(msg, msg.last_term)
        case AppendResponse():
            _indexes(msg, msg.index, msg.hint_index)
            _log_term(msg, msg.hint_term)
        case ReadIndexResponse():
            _indexes(msg, msg.index)
        case HeartbeatResponse() | VoteResponse() | TimeoutNow() | ReadIndexRequest():
            pass


def _indexes(msg: Message, *values: int) -> None:
    for v in values:
        if not 0 <= v < MAX_INDEX:
            raise InvalidPeerMessage(
                f"{type(msg).__name__} from node {msg.src}: index {v} out of range"
            )


def _log_term(msg: Message, log_term: int) -> None:
    if not 0 <= log_term <= msg.term:
        raise InvalidPeerMessage(
            f"{type(msg).__name__} from node {msg.src}: log term {log_term} not in [0, {msg.term}]"
        )


def _check_append(msg: AppendEntries, max_entry_bytes: int) -> None:
    _indexes(msg, msg.prev_index, msg.commit, msg.prev_index + len(msg.entries))
    _log_term(msg, msg.prev_term)
    index, term = msg.prev_index, msg.prev_term
    for e in msg.entries:
        index += 1
        if e.index != index:
            raise InvalidPeerMessage(
                f"append from node {msg.src}: entry {e.index} where {index} belongs"
            )
        if not term <= e.term <= msg.term:
            raise InvalidPeerMessage(
                f"append from node {msg.src}: entry {e.index} has term "
                f"{e.term}, not in [{term}, {msg.term}]"
            )
        if len(e.data) > max_entry_bytes:
            raise InvalidPeerMessage(
                f"append from node {msg.src}: entry {e.index} of {len(e.data)} bytes, over the "
                f"{max_entry_bytes} this node stores (do the nodes' store.max_message_bytes "
                "differ?)"
            )
        term = e.term
        if e.kind is EntryKind.CONFIG:
            _membership(msg, e.data)


def _membership(msg: Message, data: bytes) -> None:
    try:
        Membership.decode(data)
    except ValueError as exc:
        raise InvalidPeerMessage(
            f"{type(msg).__name__} from node {msg.src}: bad configuration: {exc}"
        ) from None
