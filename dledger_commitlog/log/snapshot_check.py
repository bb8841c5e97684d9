"""The check of a peer's Snapshot before it touches the store (pure: no I/O).

Owns `check_snapshot`, which `RaftNode.deliver` runs on every Snapshot after
`raft.validate.check_peer_message` (the bounds of its terms and indexes), as it
checks each entry of an append: a Snapshot that fails is refused with
InvalidPeerMessage (the stream ends INVALID_ARGUMENT, the refusal is counted) and
never stepped, so the driver never restores it.

A Snapshot's `data` is the leader's `EntryStore.snapshot_data()`: the base record
(`entry_records.pack_base`) then the node's extra (`snapshot_extra`). Each rule is
stated once, where its format lives: the base's in `entry_records.snapshot_base`
(which `EntryStore.restore` runs too), the extra's in `snapshot_extra.decode_extra`
(which the node's restore decodes with); the message's own is here: a leader only
sends a point it has committed, so `commit >= index`.
"""

from __future__ import annotations

from dledger_commitlog.log.entry_records import BASE_SIZE, snapshot_base
from dledger_commitlog.log.snapshot_extra import decode_extra
from raft.messages import Snapshot
from raft.validate import InvalidPeerMessage


def check_snapshot(msg: Snapshot) -> None:
    """Raise InvalidPeerMessage, naming the rule, unless `msg` may be restored from."""
    try:
        if msg.commit < msg.index:
            raise ValueError(f"commit {msg.commit} is below the snapshot's index {msg.index}")
        snapshot_base(msg.index, msg.log_term, msg.data)
        decode_extra(msg.data[BASE_SIZE:])
    except ValueError as exc:
        raise InvalidPeerMessage(f"snapshot from node {msg.src}: {exc}") from None
