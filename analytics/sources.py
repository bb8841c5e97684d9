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
another.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from analytics.codec import COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa


SYSTEM_TOPIC_PREFIX = "%SYS%"  # dispatch's system topics (consumer offsets): not user data


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int  # one past the last committed message


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


@dataclass(frozen=True, slots=True)
class LogPiece:
    """The messages of `queues` (each within its offsets) at commit-log offsets
    [start, end): what one Spark partition reads when the log is cut by range."""

    start: int
    end: int
    queues: tuple[Slice, ...]


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
    "SYSTEM_TOPIC_PREFIX",
    "GroupOffset",
    "LogPiece",
    "MessageStore",
    "QueueInfo",
    "Slice",
]
