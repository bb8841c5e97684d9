"""Where the analytics read committed messages: what every store answers, and its values.

Every store answers the same questions:

- `queues(topic)`: every (topic, queue id) with its [min, max) queue offsets, where
  max is the committed (dispatched) end on the replica or directory asked;
- `read(topic, queue_id, start, end, columns)`: the messages at queue offsets
  [start, end) of one queue, as Arrow record batches (`analytics.codec`);
- `read_piece(piece, columns)`: the messages of several queues (each with its
  own offset range) that lie in one commit-log range [piece.start, piece.end):
  how a read of most of the log goes, one pass over the bytes, in log order;
- `unit_span(slices)`: the commit-log range the messages of `slices` occupy
  (for cutting the log into pieces);
- `offsets_for_times(queries)`: per (topic, queue, timestamp), the first queue
  offset stored at or after it (binary search on store timestamps).

Every message is checked against what it was read for (size, commit-log offset,
topic, queue id, queue offset, layout: `analytics.codec`) before it becomes a
row; anything else raises `CorruptEntry`.

Two stores answer them: `analytics.file_store.OfflineStore` reads a node's data
directory (a stopped node's, or a live replica's on this host below the bounds it
reported) and `analytics.server_store.ServerStore` a cluster over gRPC (or a
same-host replica's files, when it may); `stores.open_store` picks one. The values here
are what planning and the Spark partitions pass around: queue offsets are
half-open ranges [start, end), commit-log offsets are byte positions, and both
are the same on every replica, so a read planned on one replica can be served by
another. In a multi-shard cluster each data shard is a log of its own: queues,
slices and pieces name their `shard` (1 by default), queue ids and commit-log
offsets are only comparable within a shard, and a queue's key is (topic, queue
id) in shard 1, (topic, queue id, shard) in any other (`QueueKey`);
`analytics.shard_stores` reads every shard.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from analytics.codec import COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa


SYSTEM_TOPIC_PREFIX = "%SYS%"  # dispatch's system topics (consumer offsets): not user data

# A queue's key in planning and offsets: (topic, queue id) in shard 1, (topic, queue id,
# shard) in any other, so that a single-shard read's keys (and the checkpoints holding
# them) are what they always were. A queue's reference in offsets JSON (`QueueRef`): the
# queue id (shard 1) or (shard, queue id), written "Q" or "G:Q" (`parse_queue_ref`).
QueueKey = tuple[str, int] | tuple[str, int, int]
QueueRef = int | tuple[int, int]
METADATA_COLUMNS: Final = {"shard": "int"}  # asked for by name only (docs/analytics.md)


def queue_key(topic: str, queue_id: int, shard: int = 1) -> QueueKey:
    return (topic, queue_id) if shard == 1 else (topic, queue_id, shard)


def key_parts(key: QueueKey) -> tuple[str, int, int]:
    """(topic, queue id, shard) of a key."""
    topic, queue_id, *rest = key
    return topic, queue_id, rest[0] if rest else 1


def ref_key(topic: str, ref: QueueRef) -> QueueKey:
    """The key of a topic's queue named by an offsets JSON."""
    if isinstance(ref, int):
        return (topic, ref)
    shard, queue_id = ref
    return queue_key(topic, queue_id, shard)


def parse_queue_ref(text: str) -> QueueRef | None:
    """ "Q" (queue Q of shard 1) or "G:Q" (queue Q of shard G; "1:Q" is "Q"); None if
    `text` is neither."""
    shard, sep, queue = text.partition(":")
    if not sep:
        return int(text) if text.isdigit() else None
    if not (shard.isdigit() and queue.isdigit()) or int(shard) < 1:
        return None
    return int(queue) if int(shard) == 1 else (int(shard), int(queue))


def queue_name(key: QueueKey, sharded: bool | None = None) -> str:
    """How messages and offsets JSON name a queue: "Q" in shard 1, else "G:Q" (always
    "G:Q" when `sharded`, never when it is False and the shard is 1)."""
    _, queue_id, shard = key_parts(key)
    if sharded is None:
        sharded = shard != 1
    return f"{shard}:{queue_id}" if sharded else str(queue_id)


def queue_label(key: QueueKey) -> str:
    """ "topic/Q" or "topic/G:Q", for messages."""
    return f"{key[0]}/{queue_name(key)}"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int  # one past the last committed message
    shard: int = 1  # the shard holding the queue (its queue ids are its own)

    @property
    def key(self) -> QueueKey:
        return queue_key(self.topic, self.queue_id, self.shard)


@dataclass(frozen=True, slots=True)
class GroupOffset:
    topic: str
    queue_id: int
    offset: int  # the next offset the shard will consume; -1: nothing committed


@dataclass(frozen=True, slots=True)
class Slice:
    """Queue offsets [start, end) of one queue."""

    topic: str
    queue_id: int
    start: int
    end: int
    shard: int = 1

    @property
    def key(self) -> QueueKey:
        return queue_key(self.topic, self.queue_id, self.shard)


@dataclass(frozen=True, slots=True)
class LogPiece:
    """The messages of `queues` (each within its offsets) at commit-log offsets
    [start, end): what one Spark partition reads when the log is cut by range."""

    start: int
    end: int
    queues: tuple[Slice, ...]  # all of one shard (a piece never spans shards)

    @property
    def shard(self) -> int:
        return self.queues[0].shard if self.queues else 1


class MessageStore(Protocol):
    """What the export reads of a store (both stores answer it)."""

    def queues(self, topic: str = "") -> list[QueueInfo]: ...

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = COLUMNS,
    ) -> Iterator[pa.RecordBatch]: ...

    def close(self) -> None: ...


__all__ = [
    "METADATA_COLUMNS",
    "SYSTEM_TOPIC_PREFIX",
    "GroupOffset",
    "LogPiece",
    "MessageStore",
    "QueueInfo",
    "QueueKey",
    "QueueRef",
    "Slice",
    "key_parts",
    "parse_queue_ref",
    "queue_key",
    "queue_label",
    "queue_name",
    "ref_key",
]
