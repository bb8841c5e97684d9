"""Bulk reads for analytics: raw committed commit-log bytes, consume-queue units, and
offsets by time.

Owns `LogReadRpcs` (ReadLog, ReadUnits, OffsetsForTimes; Spark's reads over the
cluster, `analytics/`). The loop takes a snapshot of the committed bounds and the
read pool does the disk reads and checks (`log.reads`); ReadLog reads the next
chunk while the last one is sent. ReadLog with `message_offsets` answers those
messages' heads instead of raw bytes (`log.head_reads`: each without its body).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc

from dledger_commitlog.log import head_reads, reads
from dledger_commitlog.node.acl import Perm, require_topics
from dledger_commitlog.service.base import Context, ServiceBase, read_everything, read_failure
from proto import dledger_pb2 as pb
from store.errors import CorruptEntry, InvalidMessage, OffsetOutOfRange

_LOG_CHUNK = 4 << 20  # ReadLog: bytes per answer by default
_MAX_LOG_CHUNK = 8 << 20


class LogReadRpcs(ServiceBase):
    async def ReadLog(
        self, request: pb.ReadLogRequest, context: Context
    ) -> AsyncIterator[pb.ReadLogChunk]:
        """Raw committed commit-log bytes [from_pos, min(end_pos, committed)), in chunks read
        (and CRC-checked, once per process) in the read pool; with `message_offsets`,
        those messages without their bodies (`_heads`)."""
        await self._allow(context, "ReadLog", read_everything)
        r = request
        if r.from_pos < 0 or r.end_pos < 0 or r.chunk_bytes < 0:
            why = "from_pos, end_pos and chunk_bytes must not be negative"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        if r.message_offsets:
            async for answer in self._heads(r.message_offsets, context):
                yield answer
            return
        chunk = min(r.chunk_bytes or _LOG_CHUNK, _MAX_LOG_CHUNK)
        view = self.node.committed.log_view()
        end = view.committed if r.end_pos == 0 else min(r.end_pos, view.committed)
        pos = r.from_pos
        if pos < view.min_pos and pos < end:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"commit-log position {pos} is below the first retained position {view.min_pos}",
            )
        loop = asyncio.get_running_loop()

        def read(at: int, view: reads.LogView) -> asyncio.Future[pb.ReadLogChunk]:
            def work() -> pb.ReadLogChunk:
                data = reads.read_log_checked(view, self.verified, at, chunk, end)
                return pb.ReadLogChunk(
                    pos=at, data=data, committed_pos=view.committed, min_pos=view.min_pos
                )

            return loop.run_in_executor(self._reads, work)

        def after(answer: pb.ReadLogChunk) -> asyncio.Future[pb.ReadLogChunk] | None:
            at = answer.pos + len(answer.data)
            return read(at, self.node.committed.log_view()) if at < end else None

        if pos < end:
            async for answer in _read_ahead(context, read(pos, view), after):
                yield answer

    async def _heads(self, raw: bytes, context: Context) -> AsyncIterator[pb.ReadLogChunk]:
        """ReadLog with `message_offsets`: the heads of those messages, HEADS_PER_CHUNK a
        chunk, the next read while one is sent; a replica that has not committed them
        yet is UNAVAILABLE (the reader tries another)."""
        try:
            offsets = head_reads.parse_offsets(raw)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        view = self.node.committed.log_view()
        if int(offsets[-1]) >= view.committed:
            why = f"offset {offsets[-1]} is not committed here yet (committed: {view.committed})"
            await context.abort(grpc.StatusCode.UNAVAILABLE, why)
        loop = asyncio.get_running_loop()

        def read(lo: int, view: reads.LogView) -> asyncio.Future[pb.ReadLogChunk]:
            part = offsets[lo : lo + head_reads.HEADS_PER_CHUNK]

            def work() -> pb.ReadLogChunk:
                heads, tails, ends = head_reads.message_heads(view, part)
                return pb.ReadLogChunk(
                    pos=int(part[0]),
                    heads=heads,
                    tails=tails,
                    tail_offsets=ends,
                    committed_pos=view.committed,
                    min_pos=view.min_pos,
                )

            return loop.run_in_executor(self._reads, work)

        try:
            await self._in_thread(head_reads.check_span, view, self.verified, offsets)
        except (InvalidMessage, OffsetOutOfRange, CorruptEntry) as exc:
            await context.abort(*read_failure(exc))
        lo = 0

        def after(_answer: pb.ReadLogChunk) -> asyncio.Future[pb.ReadLogChunk] | None:
            nonlocal lo
            lo += head_reads.HEADS_PER_CHUNK
            return read(lo, self.node.committed.log_view()) if lo < len(offsets) else None

        async for answer in _read_ahead(context, read(lo, view), after):
            yield answer

    async def ReadUnits(
        self, request: pb.ReadUnitsRequest, context: Context
    ) -> AsyncIterator[pb.QueueUnits]:
        """Raw consume-queue units of the queues asked, below their committed ends (and of
        messages in [from_pos, to_pos) when given)."""
        r = request
        topics = sorted({q.topic for q in r.queues})
        await self._allow(context, "ReadUnits", lambda a: require_topics(a, topics, Perm.SUB))
        try:
            if r.from_pos < 0 or r.to_pos < 0:
                raise InvalidMessage("from_pos and to_pos must not be negative")
            for want in r.queues:
                self._check_queue(want.topic, want.queue_id)
                if want.start_offset < 0 or want.end_offset < 0:
                    raise InvalidMessage("start_offset and end_offset must not be negative")
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        for want in r.queues:
            queue = self.node.committed.queue_view(want.topic, want.queue_id)
            if queue is None:
                yield pb.QueueUnits(topic=want.topic, queue_id=want.queue_id)
                continue
            start = max(want.start_offset, queue.min_offset)
            end = queue.max_offset if want.end_offset == 0 else want.end_offset
            end = max(start, min(end, queue.max_offset))
            answer = pb.QueueUnits(
                topic=want.topic,
                queue_id=want.queue_id,
                min_offset=queue.min_offset,
                max_offset=queue.max_offset,
            )
            answer.first_offset = start
            try:
                if r.from_pos or r.to_pos:
                    start, end = await self._in_thread(
                        reads.units_between, queue, start, end, r.from_pos, r.to_pos
                    )
                    answer.first_offset = start
                if start >= end:
                    yield answer
                for lo in range(start, end, reads.MAX_UNITS_ANSWER):
                    hi = min(end, lo + reads.MAX_UNITS_ANSWER)
                    answer.first_offset = lo
                    answer.units = await self._in_thread(reads.units_chunk, queue, lo, hi)
                    yield answer
            except (OffsetOutOfRange, CorruptEntry) as exc:
                await context.abort(*read_failure(exc))

    async def OffsetsForTimes(
        self, request: pb.OffsetsForTimesRequest, context: Context
    ) -> pb.OffsetsForTimesResponse:
        """Per (queue, timestamp): the first offset stored at or after it (binary search)."""
        r = request
        topics = sorted({q.topic for q in r.queries})
        await self._allow(context, "OffsetsForTimes", lambda a: require_topics(a, topics, Perm.SUB))
        try:
            for q in r.queries:
                self._check_queue(q.topic, q.queue_id)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        views = [self.node.committed.queue_view(q.topic, q.queue_id) for q in r.queries]
        log_view = self.node.committed.log_view()

        def search() -> list[int]:
            return [
                0 if v is None else reads.offset_for_time(v, log_view, q.timestamp_ms)
                for q, v in zip(r.queries, views, strict=True)
            ]

        try:
            offsets = await self._in_thread(search)
        except (OffsetOutOfRange, CorruptEntry) as exc:
            await context.abort(*read_failure(exc))
        return pb.OffsetsForTimesResponse(offsets=offsets)


async def _read_ahead(
    context: Context,
    first: asyncio.Future[pb.ReadLogChunk],
    after: Callable[[pb.ReadLogChunk], asyncio.Future[pb.ReadLogChunk] | None],
) -> AsyncIterator[pb.ReadLogChunk]:
    """The chunks of a read in order, the next one (`after` the one just read: None at
    the end) read while this one is sent; each from a fresh snapshot of the files, as
    retention may move on. A read that fails aborts the call with its status."""
    pending: asyncio.Future[pb.ReadLogChunk] | None = first
    while pending is not None:
        try:
            answer = await pending
        except (InvalidMessage, OffsetOutOfRange, CorruptEntry) as exc:
            await context.abort(*read_failure(exc))
        pending = after(answer)
        try:
            yield answer
        except BaseException:
            if pending is not None:
                pending.cancel()
            raise
