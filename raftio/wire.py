"""Raft messages on the wire: the only place that converts them to and from protobuf.

Owns the encoding of the peer link (`raftio.transport`): a `Message` as a
`RaftMessage` (`to_wire`, `to_proto`) and back (`from_proto`), the entries of an
append as one blob (`encode_entries`: a 24-byte head per entry, then its data, not
one protobuf object per entry), and the limits of a stream: `MAX_BATCH_BYTES` and
`MAX_BATCH` (what one `RaftBatch` carries), `MAX_QUEUED` (messages waiting for one
peer), all under gRPC's message limit (`netkit.channel.MAX_MESSAGE_BYTES`).

Invariants: `from_proto(to_proto(m)) == m` for every message; a blob that does not
decode whole is a ValueError, never a shorter list of entries; a batch of more than
one message stays under MAX_BATCH_BYTES, far below MAX_MESSAGE_BYTES.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from proto import dledger_pb2 as pb
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
from raft.types import KINDS, Entry

_ENTRY_HEAD = struct.Struct(">qqiI")
_T = pb.RaftMessage
PEER_ID = "dledger-peer-id"  # stream metadata: the node id the sender claims
# Stream metadata: the Raft wire versions the sender speaks, comma-separated. A stream
# without it speaks version 1 (nodes older than the field). A version is a set of
# messages and fields whose meaning a node relies on; fields that an older node may
# ignore (protobuf's unknown fields) do not make a new one (docs/upgrades.md).
WIRE = "dledger-wire"
WIRE_VERSIONS = (1,)  # the versions this node speaks
# A refusal's trailing metadata: how many batches of the stream the peer took off it
# (0 for a stream refused as it opened); the link sends the rest again.
BATCHES_READ = "dledger-batches-read"
MAX_QUEUED = 4096  # messages waiting for one peer; past it the oldest are dropped
MAX_BATCH = 256
# A stream message (RaftBatch) stays far below gRPC's 64 MiB limit: appends of
# large entries queued behind a slow stream must not add up past it, or every
# send of the batch would fail and replication would stall.
MAX_BATCH_BYTES = 16 << 20
_FIELDS_BOUND = 128  # a RaftMessage's fields besides its entries or snapshot bytes


def encode_entries(entries: Sequence[Entry]) -> bytes:
    head = _ENTRY_HEAD.pack
    parts: list[bytes] = []
    for e in entries:
        parts.append(head(e.index, e.term, int(e.kind), len(e.data)))
        parts.append(e.data)
    return b"".join(parts)


def decode_entries(blob: bytes) -> tuple[Entry, ...]:
    out: list[Entry] = []
    off, size = 0, len(blob)
    unpack = _ENTRY_HEAD.unpack_from
    hsize = _ENTRY_HEAD.size
    kinds = KINDS
    while off < size:
        if off + hsize > size:
            raise ValueError("truncated entry header in append")
        index, term, kind, n = unpack(blob, off)
        off += hsize
        if off + n > size:
            raise ValueError("truncated entry data in append")
        entry_kind = kinds.get(kind)
        if entry_kind is None:
            raise ValueError(f"unknown entry kind {kind} in append")
        out.append(Entry(index, term, blob[off : off + n], entry_kind))
        off += n
    return tuple(out)


def to_wire(m: Message) -> tuple[pb.RaftMessage, int]:
    """`m` as a proto, and a bound on its encoded size (for batching by bytes)."""
    match m:
        case AppendEntries():
            data = encode_entries(m.entries)
            return _T(
                type=_T.APPEND,
                src=m.src,
                dst=m.dst,
                term=m.term,
                index=m.prev_index,
                log_term=m.prev_term,
                commit=m.commit,
                entries=data,
                quiet=m.quiet,
            ), len(data) + _FIELDS_BOUND
        case Snapshot():
            return to_proto(m), len(m.data) + len(m.conf) + _FIELDS_BOUND
    return to_proto(m), _FIELDS_BOUND


def to_proto(m: Message) -> pb.RaftMessage:
    match m:
        case AppendEntries():
            return to_wire(m)[0]
        case AppendResponse():
            return _T(
                type=_T.APPEND_RESPONSE,
                src=m.src,
                dst=m.dst,
                term=m.term,
                index=m.index,
                reject=m.reject,
                hint_index=m.hint_index,
                hint_term=m.hint_term,
            )
        case Snapshot():
            return _T(
                type=_T.SNAPSHOT,
                src=m.src,
                dst=m.dst,
                term=m.term,
                index=m.index,
                log_term=m.log_term,
                commit=m.commit,
                snapshot=m.data,
                conf=m.conf,
                conf_index=m.conf_index,
            )
        case Heartbeat():
            return _T(
                type=_T.HEARTBEAT, src=m.src, dst=m.dst, term=m.term, commit=m.commit, ctx=m.ctx
            )
        case HeartbeatResponse():
            return _T(
                type=_T.HEARTBEAT_RESPONSE,
                src=m.src,
                dst=m.dst,
                term=m.term,
                ctx=m.ctx,
                no_lead=m.no_lead,
            )
        case RequestVote():
            return _T(
                type=_T.VOTE,
                src=m.src,
                dst=m.dst,
                term=m.term,
                index=m.last_index,
                log_term=m.last_term,
                pre_vote=m.pre_vote,
                transfer=m.transfer,
            )
        case VoteResponse():
            return _T(
                type=_T.VOTE_RESPONSE,
                src=m.src,
                dst=m.dst,
                term=m.term,
                granted=m.granted,
                pre_vote=m.pre_vote,
            )
        case TimeoutNow():
            return _T(type=_T.TIMEOUT_NOW, src=m.src, dst=m.dst, term=m.term)
        case ReadIndexRequest():
            return _T(type=_T.READ_INDEX, src=m.src, dst=m.dst, term=m.term, ctx=m.ctx)
        case ReadIndexResponse():
            return _T(
                type=_T.READ_INDEX_RESPONSE,
                src=m.src,
                dst=m.dst,
                term=m.term,
                ctx=m.ctx,
                index=m.index,
            )
    raise TypeError(f"not a raft message: {m!r}")


def from_proto(p: pb.RaftMessage) -> Message:
    t = p.type
    if t == _T.APPEND:
        return AppendEntries(
            p.src, p.dst, p.term, p.index, p.log_term, decode_entries(p.entries), p.commit, p.quiet
        )
    if t == _T.APPEND_RESPONSE:
        return AppendResponse(p.src, p.dst, p.term, p.index, p.reject, p.hint_index, p.hint_term)
    if t == _T.SNAPSHOT:
        return Snapshot(
            p.src, p.dst, p.term, p.index, p.log_term, p.commit, p.snapshot, p.conf, p.conf_index
        )
    if t == _T.HEARTBEAT:
        return Heartbeat(p.src, p.dst, p.term, p.commit, p.ctx)
    if t == _T.HEARTBEAT_RESPONSE:
        return HeartbeatResponse(p.src, p.dst, p.term, p.ctx, p.no_lead)
    if t == _T.VOTE:
        return RequestVote(p.src, p.dst, p.term, p.index, p.log_term, p.pre_vote, p.transfer)
    if t == _T.VOTE_RESPONSE:
        return VoteResponse(p.src, p.dst, p.term, p.granted, p.pre_vote)
    if t == _T.TIMEOUT_NOW:
        return TimeoutNow(p.src, p.dst, p.term)
    if t == _T.READ_INDEX:
        return ReadIndexRequest(p.src, p.dst, p.term, p.ctx)
    if t == _T.READ_INDEX_RESPONSE:
        return ReadIndexResponse(p.src, p.dst, p.term, p.ctx, p.index)
    raise ValueError(f"unknown raft message type {t}")
