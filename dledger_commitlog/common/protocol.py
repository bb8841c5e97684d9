"""What a client and a node agree on beyond `proto/dledger.proto`.

Owns `PutResult` (what a put answers, on both sides of the wire: the node's
commit log builds it, the clients convert the proto into it) and the limit on a
message's size that both enforce: a put is one gRPC message (64 MiB limit on
client and server) and one Raft entry. Also the initial metadata by which a
server says it accepted a PutFrames stream (`PUT_FRAMES_ACCEPTED`), and the
metadata that names a call's shard (`SHARD_HEADER`), and what a consumer-group
delivery reads from the message it delivers (`origin_topic`, `reconsume_times`:
the coordinator writes those properties on a retry's copy, and a fetch's compact
answer, a DeliveryRun, leaves them to the message).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MAX_MESSAGE_BYTES_LIMIT = 32 << 20

# A server sends this initial metadata key once it has accepted a PutFrames stream
# (authenticated its caller); a refusal is a status alone, without it. A client
# writes no frame before it: a frame that races the refusal makes gRPC report the
# lost write (INTERNAL "Internal error from Core") instead of the server's status.
PUT_FRAMES_ACCEPTED = "dledger-put-frames-accepted"

# Multi-Raft (docs/scaling.md): the shard a call is for, in its metadata (the wire
# keeps the key's name). A call without it is for shard 1, the only shard of a
# single-shard cluster.
SHARD_HEADER = "dledger-group"


def shard_metadata(shard: int) -> tuple[tuple[str, str], ...]:
    """The metadata that names `shard` (none for shard 1, the shard of a call that
    names none)."""
    return () if shard == 1 else ((SHARD_HEADER, str(shard)),)


@dataclass(frozen=True, slots=True)
class PutResult:
    """Where a committed put lies: its id, commit-log offset, queue and queue offset."""

    msg_id: str
    commitlog_offset: int
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int
    duplicate: bool = False  # answered from the log: an earlier attempt stored it


PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"  # the producer's topic of a retried message
PROPERTY_RECONSUME_TIMES = "RECONSUME_TIMES"  # how many times it was retried
PROPERTY_DLQ_REASON = "DLQ_REASON"  # why a dead letter was dead-lettered


def origin_topic(topic: str, properties: Mapping[str, str]) -> str:
    """The producer's topic of a delivered message stored in `topic` (a retry's copy is
    stored in its group's retry topic)."""
    return properties.get(PROPERTY_RETRY_TOPIC, topic)


def reconsume_times(properties: Mapping[str, str]) -> int:
    """How many times a delivered message was retried through the retry topic (0: never;
    a value that is no number counts 0)."""
    try:
        return int(properties.get(PROPERTY_RECONSUME_TIMES, "0"))
    except ValueError:
        return 0
