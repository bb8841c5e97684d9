"""Reads of messages: by id or offset, a queue from an offset, by key, a raw range.

Owns `ReadRpcs`. Pull, QueryByKey and ReadRange read, check, decode and encode in
the read pool (`_pull_reply`, `_query_reply`, `_range_reply`), never on the event
loop that also runs Raft; the loop takes the snapshot they read with
(`node.committed.log_view`, `node.committed.queue_view`) and does what must stay there (QueryByKey's
key-index lookup, ReadRange's first entry). Pull long-polls for new messages; every
read serves committed data only.
"""

from __future__ import annotations

import time

import grpc

from dispatch.dispatcher import parse_tag_expression
from dledger_commitlog.common.routes import shard_of_msg_id
from dledger_commitlog.log import entry_reads, reads
from dledger_commitlog.log.message_layout import offset_of_msg_id
from dledger_commitlog.node.acl import Perm, require_topics
from dledger_commitlog.service.base import (
    Context,
    ServiceBase,
    damaged,
    read_everything,
    read_failure,
    stored_message_pb,
)
from proto import dledger_pb2 as pb
from store.entry_format import HEADER_SIZE
from store.errors import CorruptEntry, InvalidMessage, OffsetOutOfRange
from store.message import check_name, decode_message

_DEFAULT_PULL = 32
_MAX_PULL = 1024  # messages per Pull or QueryByKey answer
_MAX_PULL_RAW = 65536  # raw pulls (analytics) are bounded by max_bytes instead
_DEFAULT_RANGE = 1024  # ReadRange: entries per answer unless asked
_DEFAULT_RANGE_BYTES = 4 << 20


class ReadRpcs(ServiceBase):
    async def Get(self, request: pb.GetRequest, context: Context) -> pb.GetResponse:
        """A message by id or by commit-log offset. An id that names no message (past the
        log, where none starts, deleted by retention) is NOT_FOUND; an offset given as
        such outside the log is OUT_OF_RANGE."""
        which = request.WhichOneof("key")
        account = await self._caller(context, "Get")
        try:
            if which == "msg_id":
                offset = offset_of_msg_id(request.msg_id)
                shard = shard_of_msg_id(request.msg_id)
                if shard != self.cfg.shard:  # multi-shard: the id names another shard
                    raise KeyError(
                        f"message id {request.msg_id} names shard {shard}, "
                        f"not shard {self.cfg.shard}"
                    )
            elif which == "commitlog_offset":
                offset = request.commitlog_offset
            else:
                raise InvalidMessage("give msg_id or commitlog_offset")
            if request.linearizable:
                await self._linearize(context)
            try:
                msg, size = self.node.committed.get_by_offset(offset)
            except (OffsetOutOfRange, KeyError) as exc:
                if which != "msg_id":
                    raise
                why = exc.args[0] if isinstance(exc, KeyError) else str(exc)
                raise KeyError(f"no message with id {request.msg_id}: {why}") from None
            await self._check(context, account, lambda a: require_topics(a, [msg.topic], Perm.SUB))
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except OffsetOutOfRange as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        except KeyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        except CorruptEntry as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, damaged(exc))
        return pb.GetResponse(message=stored_message_pb(msg, size))

    async def Pull(self, request: pb.PullRequest, context: Context) -> pb.PullResponse:
        """Messages of one queue from an offset; long-polls up to wait_ms for new ones.

        The reads and the answer's encoding run in the read pool (`_pull_reply`)."""
        r = request
        await self._allow(context, "Pull", lambda a: require_topics(a, [r.topic], Perm.SUB))
        try:
            self._check_queue(r.topic, r.queue_id)
            tags = parse_tag_expression(r.tag_expression)
            if r.max_messages < 0 or r.wait_ms < 0 or r.max_bytes < 0:
                raise InvalidMessage("max_messages, wait_ms and max_bytes must not be negative")
            if r.linearizable:
                await self._dispatched_linearizable(context)
            limit = _MAX_PULL_RAW if r.raw else _MAX_PULL
            max_messages = min(r.max_messages or _DEFAULT_PULL, limit)
            max_bytes = r.max_bytes or (4 << 20)
            wait_s = min(r.wait_ms / 1000, self._timeout(context))
            deadline = time.monotonic() + wait_s
            while True:
                queue = self.node.committed.queue_view(r.topic, r.queue_id)
                view = self.node.committed.log_view()
                reply = await self._in_thread(
                    _pull_reply, queue, view, r, max_messages, tags, max_bytes
                )
                remaining = deadline - time.monotonic()
                found = reply.raw_messages or reply.messages
                if found or reply.next_offset != r.queue_offset or remaining <= 0:
                    break
                await self.node.wait_for_dispatch(remaining)
        except (InvalidMessage, OffsetOutOfRange, CorruptEntry) as exc:
            await context.abort(*read_failure(exc))
        return reply

    async def QueryByKey(
        self, request: pb.QueryByKeyRequest, context: Context
    ) -> pb.QueryByKeyResponse:
        """Messages whose KEYS (or UNIQ_KEY) hold `key`, newest first, in [begin, end].

        The key index is looked up here, on the loop: its files have one writer, the
        loop, which writes a slot before the entry the slot names and closes the map of
        a file retention deletes, so a lookup in a thread could end a chain early (a
        short answer, silently) or read a closed map. A lookup reads a slot and the
        20-byte entries of its chain until it has the candidates it asks for (mapped
        files, no decoding). The messages are read, checked and decoded in the read
        pool (`_query_reply`)."""
        r = request
        await self._allow(context, "QueryByKey", lambda a: require_topics(a, [r.topic], Perm.SUB))
        try:
            check_name(r.topic)
            if not r.key:
                raise InvalidMessage("key must not be empty")
            if r.max_messages < 0 or r.begin_ms < 0 or r.end_ms < 0:
                raise InvalidMessage("max_messages, begin_ms and end_ms must not be negative")
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        end = r.end_ms or int(time.time() * 1000)
        limit = min(r.max_messages or _DEFAULT_PULL, _MAX_PULL)
        # Candidates include hash collisions: ask for more, keep the exact matches.
        candidates = self.node.committed.query_offsets(r.topic, r.key, r.begin_ms, end, 4 * limit)
        view = self.node.committed.log_view()  # after the lookup: it covers every candidate
        try:
            return await self._in_thread(_query_reply, view, candidates, r, end, limit)
        except CorruptEntry as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, damaged(exc))
        raise AssertionError("unreachable: abort raises")

    async def ReadRange(
        self, request: pb.ReadRangeRequest, context: Context
    ) -> pb.ReadRangeResponse:
        """Encoded committed messages from a commit-log offset on (from the first retained
        one if it lies below), at most `max_messages` entries, about `max_bytes`.

        The first entry is read here, through the commit log, which knows where the
        log starts and where messages start (NOT_FOUND inside one); the rest, from
        where it ends, in the read pool (`_range_reply`)."""
        await self._allow(context, "ReadRange", read_everything)
        r = request
        max_entries = max(1, r.max_messages or _DEFAULT_RANGE)
        max_bytes = r.max_bytes or _DEFAULT_RANGE_BYTES
        try:
            first, nxt = self.node.committed.read_range(r.from_offset, 1, max_bytes)
        except KeyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        except CorruptEntry as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, damaged(exc))
        view = self.node.committed.log_view()  # the same moment: the same committed end
        spent = HEADER_SIZE + sum(map(len, first))  # the first entry's size
        pos = nxt - HEADER_SIZE
        if max_entries > 1 and pos < view.committed and spent < max_bytes:
            try:
                return await self._in_thread(
                    _range_reply,
                    view,
                    self.verified,
                    first,
                    pos,
                    max_entries - 1,
                    max_bytes - spent,
                )
            except CorruptEntry as exc:
                await context.abort(grpc.StatusCode.DATA_LOSS, damaged(exc))
            except OffsetOutOfRange:
                pass  # retention deleted a file after the first entry: that one is the answer
        return _range_response(view, b"".join(first), pos)


def _query_reply(
    view: reads.LogView, candidates: list[int], r: pb.QueryByKeyRequest, end_ms: int, limit: int
) -> pb.QueryByKeyResponse:
    """QueryByKey's answer from the key index's candidates (newest first), in the read pool:
    the first `limit` whose message is of the topic, holds the key and lies in the time
    range (the index compares hashes and knows times to the second)."""
    out: list[pb.StoredMessage] = []
    for offset in candidates:
        raw = entry_reads.message_at(view, offset)
        if raw is None:
            continue  # deleted by retention since the index was read
        msg = decode_message(raw)
        if (
            msg.topic == r.topic
            and (r.key in msg.keys or msg.uniq_key == r.key)
            and r.begin_ms <= msg.store_timestamp_ms <= end_ms
        ):
            out.append(stored_message_pb(msg, len(raw)))
            if len(out) >= limit:
                break
    return pb.QueryByKeyResponse(messages=out)


def _range_reply(
    view: reads.LogView,
    verified: reads.VerifiedRanges,
    first: list[bytes],
    pos: int,
    max_entries: int,
    max_bytes: int,
) -> pb.ReadRangeResponse:
    """ReadRange's answer in the read pool: `first` (read on the loop), then the messages
    among up to `max_entries` entries from `pos` within `max_bytes`."""
    rest, pos = entry_reads.entries_from(view, verified, pos, max_entries, max_bytes)
    return _range_response(view, b"".join(first + rest), pos)


def _range_response(view: reads.LogView, messages: bytes, pos: int) -> pb.ReadRangeResponse:
    return pb.ReadRangeResponse(
        messages=messages,
        next_offset=pos + HEADER_SIZE,
        committed_offset=view.committed,
        min_offset=view.min_pos + HEADER_SIZE,
    )


def _pull_reply(
    queue: reads.QueueView | None,
    view: reads.LogView,
    r: pb.PullRequest,
    max_messages: int,
    tags: frozenset[str] | None,
    max_bytes: int,
) -> pb.PullResponse:
    """One Pull's answer, read and encoded in the read pool."""
    found = reads.pull_scan(
        queue,
        view,
        r.queue_offset,
        max_messages,
        tags,
        max_bytes=max_bytes,
        end_offset=r.end_offset,
    )
    reply = pb.PullResponse(
        next_offset=found.next_offset,
        min_offset=queue.min_offset if queue is not None else 0,
        max_offset=queue.max_offset if queue is not None else 0,
    )
    if r.raw:
        reply.raw_messages = b"".join(found.messages)
    else:
        reply.messages.extend(
            stored_message_pb(decode_message(d), size)
            for d, size in zip(found.messages, found.sizes, strict=True)
        )
    return reply
