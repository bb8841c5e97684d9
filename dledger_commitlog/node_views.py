"""What the client service sees of a node (`ports`), answered by the part that knows.

`NodeViews` is the base of `node.RaftNode`: one-line properties and methods over
its Raft core, commit log, entry store, dispatcher and leader-side services, so
that the node satisfies every protocol in `ports` and the service never reaches
through it. Nothing here holds state or logic of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from raft import Role

if TYPE_CHECKING:
    from dispatch.dispatcher import Dispatcher, GroupKey
    from raft import RaftCore
    from raft.progress import PeerProgress
    from store.consume_queue import ConsumeQueue
    from store.mapped_file import MappedFileQueue
    from store.message import Message as StoredMessage

    from .commitlog import DLedgerCommitLog, PutResult, PutSpec
    from .config import NodeConfig
    from .entry_store import EntryStore
    from .retention import Retention
    from .schedule import ScheduleService
    from .system_log import SystemLog
    from .transactions import CheckRegistry, CheckRequest, Ended, TransactionService


class NodeViews:
    """The node's answers to the client service's questions (see `ports`)."""

    cfg: NodeConfig
    core: RaftCore
    commitlog: DLedgerCommitLog
    store: EntryStore
    dispatcher: Dispatcher
    retention: Retention
    schedule: ScheduleService
    system_log: SystemLog
    transactions: TransactionService
    checks: CheckRegistry

    def leader_client_address(self) -> str | None:
        leader = self.core.leader_id
        for p in self.cfg.peers:
            if p.id == leader:
                return p.client
        return None

    @property
    def leader_id(self) -> int | None:
        return self.core.leader_id

    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    @property
    def role(self) -> Role:
        return self.core.role

    @property
    def term(self) -> int:
        return self.core.term

    @property
    def progress(self) -> dict[int, PeerProgress]:
        return self.core.progress

    @property
    def write_refusal(self) -> str | None:
        return self.retention.refusal

    @property
    def delay_levels(self) -> tuple[int, ...]:
        return self.schedule.levels

    def prepare(self, topic: str, body: bytes, **fields: Any) -> PutSpec:
        """DLedgerCommitLog.prepare (`ports.Writes` types the fields)."""
        return self.commitlog.prepare(topic, body, **fields)

    def put(
        self, specs: Sequence[PutSpec], timeout_s: float
    ) -> Coroutine[Any, Any, list[PutResult]]:
        return self.commitlog.put(specs, timeout_s)  # its own coroutine: no extra frame per put

    def message_at(self, commitlog_offset: int) -> StoredMessage | None:
        return self.system_log.message_at(commitlog_offset)

    def end_transaction(
        self, transaction_id: str, half_offset: int, commit: bool, by: str = "producer"
    ) -> Coroutine[Any, Any, Ended]:
        return self.transactions.end(transaction_id, half_offset, commit, by=by)

    def open_checks(self, group: str) -> asyncio.Queue[CheckRequest]:
        return self.checks.open(group)

    def close_checks(self, group: str, checks: asyncio.Queue[CheckRequest]) -> None:
        self.checks.close(group, checks)

    @property
    def committed_index(self) -> int:
        return self.commitlog.committed_index

    @property
    def committed_pos(self) -> int:
        return self.commitlog.committed_pos

    @property
    def min_offset(self) -> int:
        return self.commitlog.min_offset

    def get_by_offset(self, commitlog_offset: int) -> tuple[StoredMessage, int]:
        return self.commitlog.get_by_offset(commitlog_offset)

    def read_message(self, commitlog_offset: int, size: int = 0) -> bytes:
        return self.commitlog.read_message(commitlog_offset, size)

    def read_range(
        self, from_offset: int, max_messages: int, max_bytes: int
    ) -> tuple[list[bytes], int]:
        return self.commitlog.read_range(from_offset, max_messages, max_bytes)

    def first_index(self) -> int:
        return self.store.first_index()

    def last_index(self) -> int:
        return self.store.last_index()

    @property
    def flushed_position(self) -> int:
        return self.store.flushed_position

    @property
    def last_chain_crc(self) -> int:
        return self.store.last_chain_crc

    @property
    def data_queue(self) -> MappedFileQueue:
        return self.store.data_queue

    @property
    def dispatched_pos(self) -> int:
        return self.dispatcher.dispatched_pos

    @property
    def group_offsets(self) -> dict[GroupKey, int]:
        return self.dispatcher.offsets

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.dispatcher.queue(topic, queue_id)

    def queue_offsets(self, topic: str = "") -> list[tuple[str, int, int, int]]:
        return self.dispatcher.queue_offsets(topic)

    def query_offsets(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]:
        return self.dispatcher.query_offsets(topic, key, begin_ms, end_ms, max_count)
