"""What the leader's system services (schedule, transactions) need from the node.

Owns `SystemLog`, the node (its facade, `node.RaftNode`) as services that act
on the committed log through Raft see it: they read consume-queue units and messages of system
topics, look a message up by topic and UNIQ_KEY in the key index, remember
their progress as consumer-group offsets (replicated like any group's), and put
messages. Every decision a service takes is recorded in the log, so a new
leader continues from what the old one committed:

- `settle` makes the view complete before a decision: a read-index round (so
  the leader has committed an entry of its term, and with it every entry an
  old leader left that will ever commit) and then dispatch up to that point
  (so the key index and the queues hold all of it);
- `find` answers "is this message in the log?" from the key index, checked
  against the stored message (hash collisions), which is how delivery and
  commit stay exactly-once across failover: a message is put only if its
  deterministic UNIQ_KEY is not already in its topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

from dispatch.dispatcher import OFFSETS_TOPIC, encode_offset_commit
from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.log import reads
from dledger_commitlog.log.commitlog import Draft, OutcomeUnknown, Overloaded, PutFailed, PutSpec
from dledger_commitlog.log.message_layout import msg_id_of
from dledger_commitlog.node.node import RaftNode
from raft import NotLeader
from store.consume_queue import CqUnit
from store.errors import CorruptEntry, OffsetOutOfRange
from store.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    StoredMessage,
    decode_message,
    split_keys,
)

_FOREVER_MS = 1 << 62
_INTERRUPTIONS = (NotLeader, OutcomeUnknown, PutFailed, TimeoutError)
_OVERLOAD_BACKOFF_S = 1.0
QUIET_MAX_S = 1.0  # how long a service with nothing to do waits for a commit at most
log = logging.getLogger(__name__)


async def run_passes(
    what: str,
    node_id: int,
    pass_once: Callable[[], Awaitable[object]],
    wakeup: asyncio.Event,
    poll_s: float,
    interrupted: Callable[[], None],
    busy: Callable[[], bool] = lambda: True,
    quiet: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """A leader-side service's loop: `pass_once` every `poll_s` (or on `wakeup`).

    While `busy()` says there is nothing to do (not the leader, or nothing stored
    that waits for the service), the loop waits for `quiet()` (the next commit here:
    a put, or this node's first entry as a leader), at most QUIET_MAX_S, instead of
    polling: an idle node's loop does not wake for it. A pass cut short by a lost
    leadership or a put whose outcome is unknown calls `interrupted` (the service
    settles again before its next decision); a put refused as Overloaded (nothing
    proposed) waits a second, no settling needed; anything else (a bug, a damaged
    entry) is logged and retried after a second: a system service never stops the
    node."""
    while True:
        if quiet is not None and not busy():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(QUIET_MAX_S):
                    await quiet()
        try:
            async with asyncio.timeout(poll_s):
                await wakeup.wait()
        except TimeoutError:
            pass
        wakeup.clear()
        try:
            await pass_once()
        except _INTERRUPTIONS as exc:
            if not isinstance(exc, NotLeader):
                log.info(
                    "node %d: %s pass interrupted (%s); the next one resumes", node_id, what, exc
                )
            interrupted()
        except Overloaded as exc:  # the puts in flight must drain first
            log.info("node %d: %s pass waits %g s: %s", node_id, what, _OVERLOAD_BACKOFF_S, exc)
            await asyncio.sleep(_OVERLOAD_BACKOFF_S)
        except Exception:
            log.exception("node %d: %s pass failed; retrying in 1 s", node_id, what)
            interrupted()
            await asyncio.sleep(1.0)


def offset_commit_draft(group: str, topic: str, queue_id: int, offset: int) -> Draft:
    """The message recording `group`'s offset of a queue (a system queue's put)."""
    return Draft(
        OFFSETS_TOPIC,
        encode_offset_commit(group, topic, queue_id, offset),
        uuid.uuid4().hex.upper(),
        keys=[group],
        queue_id=0,
        born_timestamp_ms=int(time.time() * 1000),
    )


class SystemLog:
    """The node as its leader-side services see it (only through its facade)."""

    def __init__(self, node: RaftNode) -> None:
        self._node = node

    @property
    def node_id(self) -> int:
        return self._node.node_id

    def leading_term(self) -> int | None:
        """The term this node leads in, or None."""
        return self._node.leading_term()

    async def settle(self, timeout_s: float) -> None:
        """Wait until this leader's view holds everything committed so far (see above)."""
        node = self._node
        await node.read_index(timeout_s)
        await node.wait_dispatched(node.committed_pos, timeout_s)

    async def next_commit(self) -> None:
        """Return at the next commit applied here (a put; a new leader's first entry)."""
        await self._node.wait_for_commit()

    async def next_dispatch(self, timeout_s: float) -> bool:
        """Wait for the next batch dispatched here (True) or the timeout (False)."""
        return await self._node.wait_for_dispatch(timeout_s)

    @property
    def dispatched_pos(self) -> int:
        """Commit-log position up to which the consume queues are built."""
        return self._node.dispatched_pos

    def queue_view(self, topic: str, queue_id: int) -> reads.QueueView | None:
        """A queue's bounds and files now, to read it in another thread (None: no queue)."""
        return self._node.committed.queue_view(topic, queue_id)

    def log_view(self) -> reads.LogView:
        """The committed log's bounds and files now, to read it in another thread."""
        return self._node.committed.log_view()

    async def caught_up(self, timeout_s: float) -> None:
        """Wait until dispatch covers everything committed now (our own last puts too)."""
        node = self._node
        await node.wait_dispatched(node.committed_pos, timeout_s)

    def queue_end(self, topic: str, queue_id: int) -> int:
        q = self._node.committed.queue_view(topic, queue_id)
        return 0 if q is None else q.max_offset

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue ((0, 0): no such queue yet)."""
        q = self._node.committed.queue_view(topic, queue_id)
        return (0, 0) if q is None else (q.min_offset, q.max_offset)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset of a queue stored at or after `timestamp_ms`."""
        q = self._node.committed.queue_view(topic, queue_id)
        if q is None:
            return 0
        return reads.offset_for_time(q, self._node.committed.log_view(), timestamp_ms)

    def group_offsets(self) -> Mapping[tuple[str, str, int], int]:
        """Every group's committed offsets: (group, topic, queue) -> offset."""
        return self._node.committed.group_offsets

    def units(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[CqUnit]:
        """Dispatched units of a queue from `offset` (fewer at its end or past retention)."""
        return self._node.committed.queue_units(topic, queue_id, offset, max_count)

    def message(self, unit: CqUnit) -> StoredMessage:
        data = self._node.committed.read_message(unit.commitlog_offset, unit.size)
        return decode_message(data)

    def message_at(self, commitlog_offset: int) -> StoredMessage | None:
        """The committed message at a commit-log offset, None if there is none."""
        try:
            return self._node.committed.get_by_offset(commitlog_offset)[0]
        except (OffsetOutOfRange, CorruptEntry, KeyError):
            return None

    def find(self, topic: str, uniq_key: str) -> tuple[int, StoredMessage] | None:
        """The committed message of `topic` whose UNIQ_KEY is `uniq_key` (its offset too)."""
        offsets = self._node.committed.query_offsets(topic, uniq_key, 0, _FOREVER_MS, 64)
        for offset in offsets:
            msg = self.message_at(offset)
            if msg is not None and msg.topic == topic and msg.uniq_key == uniq_key:
                return offset, msg
        return None

    def result_of(self, commitlog_offset: int) -> PutResult:
        """The put result of the committed message at `commitlog_offset` (a duplicate's)."""
        node = self._node
        msg, size = node.committed.get_by_offset(commitlog_offset)
        data = node.committed.read_message(commitlog_offset, size)
        return PutResult(
            msg_id_of(data, commitlog_offset),
            commitlog_offset,
            msg.queue_id,
            msg.queue_offset,
            msg.store_timestamp_ms,
            True,
        )

    def group_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self._node.committed.group_offset(group, topic, queue_id)

    def prepare(
        self,
        topic: str,
        body: bytes,
        properties: Mapping[str, str],
        *,
        uniq_key: str,
        queue_id: int | None,
        born_timestamp_ms: int = 0,
        flag: int = 0,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
    ) -> PutSpec:
        """A put of `body` with a stored message's `properties` (KEYS, TAGS and
        UNIQ_KEY taken apart into the draft's fields)."""
        extra = {
            k: v
            for k, v in properties.items()
            if k not in (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY)
        }
        return self._node.prepare(
            Draft(
                topic,
                body,
                uniq_key,
                keys=split_keys(properties.get(PROPERTY_KEYS)),
                tags=properties.get(PROPERTY_TAGS),
                properties=extra,
                queue_id=queue_id,
                born_timestamp_ms=born_timestamp_ms or int(time.time() * 1000),
                flag=flag,
                born_host=born_host,
            )
        )

    def offset_commit(self, group: str, topic: str, queue_id: int, offset: int) -> PutSpec:
        """A put recording `group`'s offset in a system queue (replicated progress)."""
        return self._node.prepare(offset_commit_draft(group, topic, queue_id, offset))

    async def put(self, specs: Sequence[PutSpec], timeout_s: float) -> list[PutResult]:
        return await self._node.put(specs, timeout_s)
