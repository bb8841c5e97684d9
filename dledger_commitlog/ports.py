"""What the client service sees of a node: one narrow interface per concern.

`service.ClientService` is handed these, never the node: it maps RPCs onto them
and knows nothing of the Raft core, the entry store, the dispatcher or the
leader-side services behind them. `node.RaftNode` satisfies every one
structurally (mypy checks it where `server.serve` hands the node over), with
properties and methods that answer the question rather than sub-objects to
reach through. A test double needs only what the RPCs under test use.

Invariants the service relies on: every read below is of committed data (the
commit log's reads stop at `committed_pos`, the consume queues' ends move only
when dispatch passes a committed message), and a write or read that needs the
leader raises `raft.NotLeader` on a follower.

Importing this module imports no part of the node (a test checks it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import asyncio

    from dispatch.dispatcher import GroupKey
    from raft import Role
    from raft.progress import PeerProgress
    from store.consume_queue import ConsumeQueue
    from store.mapped_file import MappedFileQueue
    from store.message import Message

    from .commitlog import PutResult, PutSpec
    from .transactions import CheckRequest, Ended


@runtime_checkable
class Leadership(Protocol):
    """Who leads, and what only the leader can confirm."""

    @property
    def leader_id(self) -> int | None: ...

    def is_leader(self) -> bool: ...

    def leader_client_address(self) -> str | None:
        """The client address of the leader this node knows (None: none known)."""

    async def read_index(self, timeout_s: float) -> int:
        """A read position confirmed by a quorum, once applied here (NotLeader, TimeoutError)."""

    async def transfer_leadership(self, target: int, timeout_s: float) -> int:
        """Hand leadership to `target`; its id once it leads (TimeoutError)."""


@runtime_checkable
class Writes(Protocol):
    """Puts: a message is validated and encoded (`prepare`), then proposed and awaited
    until committed (`put`: NotLeader, Overloaded, OutcomeUnknown, PutFailed)."""

    @property
    def write_refusal(self) -> str | None:
        """Why puts are refused now (a disk too full), None when they are not."""

    @property
    def delay_levels(self) -> tuple[int, ...]:
        """The delay levels' delays in ms (level 1 first)."""

    def prepare(
        self,
        topic: str,
        body: bytes,
        *,
        keys: Sequence[str] = ...,
        tags: str | None = ...,
        properties: dict[str, str] | None = ...,
        uniq_key: str = ...,
        queue_id: int | None = ...,
        born_timestamp_ms: int = ...,
        flag: int = ...,
    ) -> PutSpec: ...

    async def put(self, specs: Sequence[PutSpec], timeout_s: float) -> list[PutResult]: ...


@runtime_checkable
class Transactions(Protocol):
    """Transactional messages: ending one, and the producers' check streams (leader side)."""

    def message_at(self, commitlog_offset: int) -> Message | None:
        """The committed message at a commit-log offset, None if there is none."""

    async def end_transaction(
        self, transaction_id: str, half_offset: int, commit: bool, by: str = ...
    ) -> Ended: ...

    def open_checks(self, group: str) -> asyncio.Queue[CheckRequest]:
        """A check stream of producer group `group`: the checks of its undecided halves."""

    def close_checks(self, group: str, checks: asyncio.Queue[CheckRequest]) -> None: ...


@runtime_checkable
class LogReads(Protocol):
    """The committed commit log, read by offset or position."""

    @property
    def committed_pos(self) -> int:
        """End of the committed prefix: no read reaches it."""

    @property
    def min_offset(self) -> int:
        """Offset of the first retained message."""

    @property
    def flushed_position(self) -> int:
        """Bytes below this are in the data files."""

    @property
    def data_queue(self) -> MappedFileQueue:
        """The commit log's segments (for `reads.log_view`)."""

    def get_by_offset(self, commitlog_offset: int) -> tuple[Message, int]: ...

    def read_message(self, commitlog_offset: int) -> bytes: ...

    def read_range(
        self, from_offset: int, max_messages: int, max_bytes: int
    ) -> tuple[list[bytes], int]: ...


@runtime_checkable
class QueueReads(Protocol):
    """The dispatched side: consume queues, the key index, consumer groups' offsets."""

    @property
    def dispatched_pos(self) -> int: ...

    @property
    def group_offsets(self) -> Mapping[GroupKey, int]: ...

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None: ...

    def queue_offsets(self, topic: str = ...) -> list[tuple[str, int, int, int]]: ...

    def query_offsets(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]: ...

    async def wait_dispatched(self, pos: int, timeout_s: float) -> None: ...

    async def wait_for_dispatch(self, timeout_s: float) -> bool: ...


@runtime_checkable
class Status(Protocol):
    """What `Status` reports of the node."""

    @property
    def role(self) -> Role: ...

    @property
    def term(self) -> int: ...

    @property
    def leader_id(self) -> int | None: ...

    def leader_client_address(self) -> str | None: ...

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    @property
    def committed_index(self) -> int:
        """The last entry applied to the commit log."""

    @property
    def committed_pos(self) -> int: ...

    @property
    def flushed_position(self) -> int: ...

    @property
    def dispatched_pos(self) -> int: ...

    @property
    def last_chain_crc(self) -> int: ...

    @property
    def progress(self) -> Mapping[int, PeerProgress]:
        """Per-peer replication state; empty unless this node leads."""


@runtime_checkable
class Admin(Status, Protocol):
    """Status and maintenance (`dledger status`, `dledger admin clean-now`)."""

    async def clean_now(self, force: bool) -> tuple[int, int, str]: ...
