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
another. In a multi-Raft cluster each data group is a log of its own: queues,
slices and pieces name their `group` (1 by default), queue ids and commit-log
offsets are only comparable within a group, and a queue's key is (topic, queue
id) in group 1, (topic, queue id, group) in any other (`QueueKey`);
`analytics.shard_stores` reads every group.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from analytics.codec import COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa


SYSTEM_TOPIC_PREFIX = "%SYS%"  # dispatch's system topics (consumer offsets): not user data

# A queue's key in planning and offsets: (topic, queue id) in group 1, (topic, queue id,
# group) in any other, so that a single-group read's keys (and the checkpoints holding
# them) are what they always were. A queue's reference in offsets JSON (`QueueRef`): the
# queue id (group 1) or (group, queue id), written "Q" or "G:Q" (`parse_queue_ref`).
QueueKey = tuple[str, int] | tuple[str, int, int]
QueueRef = int | tuple[int, int]
METADATA_COLUMNS: Final = {"shard": "int"}  # asked for by name only (docs/analytics.md)


def queue_key(topic: str, queue_id: int, group: int = 1) -> QueueKey:
    return (topic, queue_id) if group == 1 else (topic, queue_id, group)


def key_parts(key: QueueKey) -> tuple[str, int, int]:
    """(topic, queue id, group) of a key."""
    topic, queue_id, *rest = key
    return topic, queue_id, rest[0] if rest else 1


def ref_key(topic: str, ref: QueueRef) -> QueueKey:
    """The key of a topic's queue named by an offsets JSON."""
    if isinstance(ref, int):
        return (topic, ref)
    group, queue_id = ref
    return queue_key(topic, queue_id, group)


def parse_queue_ref(text: str) -> QueueRef | None:
    """ "Q" (queue Q of group 1) or "G:Q" (queue Q of group G; "1:Q" is "Q"); None if
    `text` is neither."""
    group, sep, queue = text.partition(":")
    if not sep:
        return int(text) if text.isdigit() else None
    if not (group.isdigit() and queue.isdigit()) or int(group) < 1:
        return None
    return int(queue) if int(group) == 1 else (int(group), int(queue))


def queue_name(key: QueueKey, grouped: bool | None = None) -> str:
    """How messages and offsets JSON name a queue: "Q" in group 1, else "G:Q" (always
    "G:Q" when `grouped`, never when it is False and the group is 1)."""
    _, queue_id, group = key_parts(key)
    if grouped is None:
        grouped = group != 1
    return f"{group}:{queue_id}" if grouped else str(queue_id)


def queue_label(key: QueueKey) -> str:
    """ "topic/Q" or "topic/G:Q", for messages."""
    return f"{key[0]}/{queue_name(key)}"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int  # one past the last committed message
    group: int = 1  # the Raft group holding the queue (its queue ids are its own)

    @property
    def key(self) -> QueueKey:
        return queue_key(self.topic, self.queue_id, self.group)


@dataclass(frozen=True, slots=True)
class GroupOffset:
    topic: str
    queue_id: int
    offset: int  # the next offset the group will consume; -1: nothing committed


@dataclass(frozen=True, slots=True)
class Slice:
    """Queue offsets [start, end) of one queue."""

    topic: str
    queue_id: int
    start: int
    end: int
    group: int = 1

    @property
    def key(self) -> QueueKey:
        return queue_key(self.topic, self.queue_id, self.group)


@dataclass(frozen=True, slots=True)
class LogPiece:
    """The messages of `queues` (each within its offsets) at commit-log offsets
    [start, end): what one Spark partition reads when the log is cut by range."""

    start: int
    end: int
    queues: tuple[Slice, ...]  # all of one Raft group (a piece never spans groups)

    @property
    def group(self) -> int:
        return self.queues[0].group if self.queues else 1


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
