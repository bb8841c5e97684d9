"""What a node has committed and dispatched, as readers see it: the part of the node
(`RaftNode.committed`) the client service and the leader-side services read through.

Owns `CommittedReads`: the committed log (positions, a message by offset, a range of
messages, the bounds and files for reads in another thread), the consume queues
(their units and offsets, the key index) and the consumer groups' committed
offsets. Every read is bounded by the committed position, or by the dispatched
one for the queues and the index: nothing that could be rolled back is seen.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatch.dispatcher import Dispatcher, GroupKey
from dledger_commitlog.log import reads
from dledger_commitlog.log.commitlog import DLedgerCommitLog
from store.consume_queue import CqUnit
from store.message import StoredMessage


class CommittedReads:
    """The committed log, its consume queues and the groups' offsets (see the module doc)."""

    def __init__(self, log: DLedgerCommitLog, dispatcher: Dispatcher, units_per_file: int) -> None:
        self._log = log
        self._dispatcher = dispatcher
        self._units_per_file = units_per_file

    @property
    def committed_pos(self) -> int:
        """End of the committed prefix: no read reaches it."""
        return self._log.committed_pos

    @property
    def min_offset(self) -> int:
        """Offset of the first retained message."""
        return self._log.min_offset

    def get_by_offset(self, commitlog_offset: int) -> tuple[StoredMessage, int]:
        """The committed message at a commit-log offset, and its encoded size."""
        return self._log.get_by_offset(commitlog_offset)

    def read_message(self, commitlog_offset: int, size: int = 0) -> bytes:
        """The first `size` bytes (0: all) of the committed message at an offset."""
        return self._log.read_message(commitlog_offset, size)

    def read_range(
        self, from_offset: int, max_messages: int, max_bytes: int
    ) -> tuple[list[bytes], int]:
        """Encoded committed messages from `from_offset` on, and the offset after them."""
        return self._log.read_range(from_offset, max_messages, max_bytes)

    def log_view(self) -> reads.LogView:
        """The committed log's bounds and files now, for reads in another thread."""
        return reads.log_view(self._log)

    @property
    def dispatched_pos(self) -> int:
        """Commit-log position up to which the consume queues and key index are built."""
        return self._dispatcher.dispatched_pos

    def queue_view(self, topic: str, queue_id: int) -> reads.QueueView | None:
        """One consume queue's bounds and files now (None: no such queue)."""
        return reads.queue_view(self._dispatcher, topic, queue_id, self._units_per_file)

    def queue_units(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[CqUnit]:
        """Dispatched units of a queue from `offset` (fewer at its end or past retention)."""
        cq = self._dispatcher.queue(topic, queue_id)
        if cq is None or offset >= cq.max_offset:
            return []
        return cq.get_range(max(offset, cq.min_offset), max_count)

    def queue_offsets(self, topic: str = "") -> list[tuple[str, int, int, int]]:
        """(topic, queue id, min offset, max offset) of every queue (of `topic`)."""
        return self._dispatcher.queue_offsets(topic)

    def query_offsets(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]:
        """Commit-log offsets of messages of `topic` indexed under `key` in a time range."""
        return self._dispatcher.query_offsets(topic, key, begin_ms, end_ms, max_count)

    def group_offset(self, group: str, topic: str, queue_id: int) -> int:
        """A consumer group's committed offset in a queue (0: none)."""
        return self._dispatcher.offsets.get((group, topic, queue_id), 0)

    @property
    def group_offsets(self) -> Mapping[GroupKey, int]:
        """Every consumer group's committed offsets: (group, topic, queue id) -> offset."""
        return self._dispatcher.offsets
