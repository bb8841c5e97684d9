"""`ServerStore`: the committed messages of a cluster, read over gRPC from any replica.

It uses the DLedgerClient service directly (its own stubs: no leader discovery
is needed, since every replica serves its committed prefix). Planning asks
`QueueOffsets`. A piece is read with `ReadUnits` (the units of its queues within
the piece's range) then `ReadLog`: for a read without the `body` column, the
heads of its messages (each without its body, a batch a call), else the raw
entries (streamed in 4 MiB chunks, decoded here: `analytics.log_stream`); a
one-queue read uses `Pull(raw=True)`.
When a replica runs on this host and the caller may read its files (the answer
to QueueOffsets says where they are, `LocalFiles`; same boot id, same directory
by device and inode), its files are read directly instead
(`analytics.file_store`), below the bounds that replica reported; the planner
hands the files it was offered to the partitions, which ask the servers only
when those are not on their host or not far enough.

shards: a store reads one shard (`shard`; 1 by default, as a single-shard
cluster's), every call naming it in its metadata (`dledger-group`; none for
shard 1); `for_shard` gives another shard's store over the same channels, and
`shard_count` asks a node (`Route`) how many data shards the cluster has (1 from
a server without `Route`). `analytics.shard_stores` reads every shard through these.

Replicas answer only below their committed position; one that is behind the
planned end is waited for (committed data reaches every replica) and an
unreachable one is failed over (`fail_over`: the next server is tried first).
Queue offsets and commit-log positions are the same on every replica, so a read
resumes on another server where it stopped.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from analytics.codec import COLUMNS, Expected, Int64s, decode, decode_heads, walk
from analytics.errors import RpcFailed, SourceError, retried
from analytics.file_store import LocalFiles, NotHere, OfflineStore, this_boot_id
from analytics.log_stream import LogStream
from analytics.rows import BATCH_ROWS, Rows, Units, batch_slices, span_from_ends
from analytics.sources import GroupOffset, LogPiece, QueueInfo, Slice
from netkit.reconnect import reconnect_options
from store.consume_queue import UNIT_DTYPE
from store.entry_format import HEADER_SIZE
from store.message import FIXED_PART_SIZE

if TYPE_CHECKING:
    from dledger_commitlog.client import Access

_PULL_BYTES = 8 << 20
_PULL_MESSAGES = 65_536
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    *reconnect_options(100, 1000),
]
_FLUSH_WAIT_S = 3.0  # a local replica's files lag its committed end by about a flush interval


class ServerStore:
    """Reads committed messages from the servers (any replica; see the module doc)."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        timeout_s: float = 30.0,
        prefer: int = 0,
        pull_bytes: int = _PULL_BYTES,
        access: Access | None = None,
        local_reads: bool = True,
        shard: int = 1,
    ) -> None:
        """`access`: TLS and credentials of a secured cluster (default: neither);
        `local_reads`: read a replica on this host from its files (default);
        `shard`: the shard read (see the module doc)."""
        # lazily: grpc only when reading servers
        from dledger_commitlog.client import Access
        from dledger_commitlog.client.retry import ReplicaReads

        self.access = access or Access()
        self.servers = [s.strip() for s in servers if s.strip()]
        if not self.servers:
            raise SourceError("no servers: give the `servers` option (host:port,...) or a path")
        self.timeout_s = timeout_s
        self.pull_bytes = pull_bytes
        self.local_reads = local_reads
        self._replicas = ReplicaReads(self.servers, prefer)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}
        self.shard = shard
        self.metadata = self.access.shard_metadata(shard)  # a call's, by RPC name
        self.last_path = ""  # how the last piece was read: "files", "rpc" or "pull"
        self.offered: LocalFiles | None = None  # by the last QueueOffsets of every queue

    def for_shard(self, shard: int) -> ServerStore:
        """A store of shard `shard` sharing this one's channels (close this one)."""
        other = copy.copy(self)
        other._replicas = type(self._replicas)(self.servers, self.servers.index(self.current))
        other.shard = shard
        other.metadata = self.access.shard_metadata(shard)
        other.offered = None
        other.last_path = ""
        return other

    def shard_count(self) -> int:
        """How many data shards the cluster has (shards 1..N): a node's `Route` answer;
        1 from a server without `Route`."""
        from proto import dledger_pb2 as pb

        try:
            response = self._call("Route", pb.RouteRequest(), "Route")
        except RpcFailed as exc:
            if exc.code == "UNIMPLEMENTED":
                return 1
            raise SourceError(str(exc)) from None
        return max(1, int(response.data_groups))

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            from proto import dledger_pb2_grpc as pb_grpc

            channel = self.access.channel(address, _CHANNEL_OPTIONS)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.DLedgerClientStub(channel)
        return stub

    def channel(self, address: str) -> Any:
        """The gRPC channel to `address` (opened on first use)."""
        self._stub(address)
        return self._channels[address]

    @property
    def current(self) -> str:
        """The server tried first: the last that answered, unless failed over since."""
        return self._replicas.current

    def fail_over(self) -> None:
        """Try the next server first from now on."""
        self._replicas.fail_over()

    def _call(self, method: str, request: Any, what: str, attempt_s: float = 10.0) -> Any:
        """One RPC on the preferred server, failing over to the others until the deadline."""
        return self._attempts(
            lambda stub, timeout: getattr(stub, method)(
                request, timeout=timeout, metadata=self.metadata(method)
            ),
            what,
            attempt_s,
        )

    def _attempts(self, call: Callable[[Any, float], Any], what: str, attempt_s: float) -> Any:
        """`call(stub, timeout)` on one replica after another (`client.retry.ReplicaReads`)
        until one answers, a refusal not worth another replica, or the deadline."""
        from dledger_commitlog.client.retry import ReplicaRefused, ReplicasExhausted

        try:
            return self._replicas.call(
                lambda address, timeout: call(self._stub(address), timeout),
                what,
                timeout_s=self.timeout_s,
                attempt_s=attempt_s,
                retried=lambda f: retried(f.code, f.details),
            )
        except ReplicaRefused as exc:
            raise RpcFailed(str(exc), exc.failure.code) from None
        except ReplicasExhausted as exc:
            raise SourceError(str(exc)) from None

    def queues(self, topic: str = "") -> list[QueueInfo]:
        from proto import dledger_pb2 as pb

        response = self._call("QueueOffsets", pb.QueueOffsetsRequest(topic=topic), "QueueOffsets")
        if not topic:
            self.offered = LocalFiles.of(response)
        found = [
            QueueInfo(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in response.queues
        ]
        return sorted(found, key=lambda q: (q.topic, q.queue_id))

    def group_offsets(self, group: str, topic: str) -> list[GroupOffset]:
        from proto import dledger_pb2 as pb

        request = pb.FetchOffsetRequest(group=group, topic=topic, queue_id=-1)
        response = self._call("FetchOffset", request, f"FetchOffset {group} {topic}")
        return [GroupOffset(o.topic, o.queue_id, o.offset) for o in response.offsets]

    def offsets_for_times(self, queries: Sequence[tuple[str, int, int]]) -> list[int]:
        from proto import dledger_pb2 as pb

        if not queries:
            return []
        request = pb.OffsetsForTimesRequest(
            queries=[pb.TimeQuery(topic=t, queue_id=q, timestamp_ms=ts) for t, q, ts in queries]
        )
        return list(self._call("OffsetsForTimes", request, "OffsetsForTimes").offsets)

    # -- local replicas ---------------------------------------------------------------

    def local_replica(
        self, need: Sequence[Slice] = (), hint: LocalFiles | None = None
    ) -> OfflineStore | None:
        """The files of a replica on this host that has dispatched `need`, if the caller
        may read them (see the module doc); None: read through the RPCs. `hint`: the
        files the planner was offered (tried first, without asking any server)."""
        if not self.local_reads or this_boot_id() is None:
            return None
        if hint is not None:
            local = hint.open(need)
            if local is not None:
                return local
        import grpc

        from proto import dledger_pb2 as pb

        for address in self._replicas.in_order():
            try:
                response = self._stub(address).QueueOffsets(
                    pb.QueueOffsetsRequest(),
                    timeout=5,
                    metadata=self.metadata("QueueOffsets"),
                )
            except grpc.RpcError:  # not this one
                continue
            offered = LocalFiles.of(response)
            local = offered.open(need) if offered is not None else None
            if local is not None:
                return local
        return None

    def _local_rows(
        self, piece: LogPiece, hint: LocalFiles | None
    ) -> tuple[OfflineStore, Rows] | None:
        """A local replica and the rows of `piece` its files hold now (waiting briefly for
        its flush to reach them), or None."""
        deadline = time.monotonic() + _FLUSH_WAIT_S
        while True:
            local = self.local_replica(piece.queues, hint)
            if local is None:
                return None
            try:
                return local, local.piece_rows(piece)
            except (NotHere, OSError):
                local.close()
                if time.monotonic() >= deadline:
                    return None
            hint = None  # ask the servers for fresher bounds
            time.sleep(0.05)

    # -- reading ----------------------------------------------------------------------

    def read_piece(
        self, piece: LogPiece, columns: Sequence[str], hint: LocalFiles | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The messages of a log piece: from a local replica's files, else ReadUnits +
        ReadLog, else (a caller who may not read every topic) Pull per queue."""
        found = self._local_rows(piece, hint)
        if found is not None:
            local, rows = found
            self.last_path = "files"
            try:
                yield from local.read_rows(rows, columns)
            finally:
                local.close()
            return
        rows = self._piece_rows(piece)
        try:
            self.last_path = "rpc"
            yield from self._read_rows(rows, columns)
        except RpcFailed as exc:
            if exc.code != "PERMISSION_DENIED":
                raise SourceError(str(exc)) from None
            self.last_path = "pull"  # no right to the raw log: one queue at a time
            for s, a, b in _queue_ranges(rows, piece):
                yield from self.read(s.topic, s.queue_id, a, b, columns)

    def _piece_rows(self, piece: LogPiece) -> Rows:
        """The units of `piece` (ReadUnits), from a replica that has dispatched its queues'
        planned ends (waiting for a lagging one)."""
        from proto import dledger_pb2 as pb

        wanted = [s for s in piece.queues if s.start < s.end]
        request = pb.ReadUnitsRequest(
            queues=[
                pb.QueueRange(
                    topic=s.topic, queue_id=s.queue_id, start_offset=s.start, end_offset=s.end
                )
                for s in wanted
            ],
            from_pos=piece.start,
            to_pos=piece.end,
        )
        by_key = {(s.topic, s.queue_id): s for s in wanted}
        deadline = time.monotonic() + self.timeout_s
        while True:
            answers = self._attempts(
                lambda stub, timeout: list(
                    stub.ReadUnits(request, timeout=timeout, metadata=self.metadata("ReadUnits"))
                ),
                f"ReadUnits for commit-log range [{piece.start}, {piece.end})",
                attempt_s=30.0,
            )
            units = Units(sorted({s.topic for s in wanted}))
            behind = None
            for a in answers:
                s = by_key[(a.topic, a.queue_id)]
                if a.max_offset < s.end:
                    behind = f"{a.topic}/{a.queue_id} ends at {a.max_offset}, planned {s.end}"
                    break
                if a.min_offset > s.start:
                    raise SourceError(
                        f"{a.topic}/{a.queue_id}: offsets {s.start}..{a.min_offset - 1} were "
                        "deleted by retention before this query read them"
                    )
                units.add(a.topic, a.queue_id, a.first_offset, np.frombuffer(a.units, UNIT_DTYPE))
            if behind is None:
                return Rows.of(units, order="log")
            if time.monotonic() > deadline:
                raise SourceError(
                    f"no replica reached the planned end in {self.timeout_s:g}s ({behind})"
                )
            self.fail_over()
            time.sleep(0.1)

    def _read_rows(self, rows: Rows, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Rows in log order, a batch at a time: without a `body` column, their heads
        (ReadLog's `message_offsets`: each message without its body; the next batch's
        asked while one is decoded); else, or from a server that does not send heads, their
        bytes streamed by ReadLog into one buffer."""
        if not len(rows):
            return
        parts = list(batch_slices(len(rows)))
        ends = [int(rows.offsets[p][-1] + rows.sizes[p][-1]) for p in parts]
        pool = ThreadPoolExecutor(1, "heads") if "body" not in columns else None
        pending: Future[tuple[bytes, bytes, bytes] | None] | None = None
        if pool is not None:
            pending = pool.submit(self._heads, rows.offsets[parts[0]], ends[0])
        stream: LogStream | None = None
        try:
            for k, part in enumerate(parts):
                offsets = rows.offsets[part]
                exp = rows.expected if part == slice(0, len(rows)) else rows.expected.take(part)
                if pending is not None:
                    got = pending.result()
                    pending = None
                    if got is not None:
                        if pool is not None and k + 1 < len(parts):
                            nxt = rows.offsets[parts[k + 1]]
                            pending = pool.submit(self._heads, nxt, ends[k + 1])
                        where = f"ReadLog heads from {int(offsets[0])}"
                        yield decode_heads(*got, offsets, columns, exp, where=where)
                        continue
                first = int(offsets[0]) - HEADER_SIZE
                if stream is None:
                    stream = LogStream(self, first, ends[-1])
                data = stream.fill(first, ends[k])
                yield decode(data, offsets - first, columns, exp, where=f"ReadLog from {first}")
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            if stream is not None:
                stream.close()

    def _heads(self, offsets: Int64s, end: int) -> tuple[bytes, bytes, bytes] | None:
        """(heads, tails, tail offsets) of the messages at `offsets` (ending at `end`), from
        a replica that has committed them; None from a server that does not send heads (it
        answers the span's raw bytes: the call is cancelled at its first chunk)."""
        from proto import dledger_pb2 as pb

        request = pb.ReadLogRequest(
            from_pos=int(offsets[0]) - HEADER_SIZE,
            end_pos=end,
            message_offsets=offsets.astype("<i8").tobytes(),
        )

        def collect(stub: Any, timeout: float) -> list[Any] | None:
            call = stub.ReadLog(request, timeout=timeout, metadata=self.metadata("ReadLog"))
            got = []
            for answer in call:
                if answer.data and not answer.heads:
                    call.cancel()
                    return None
                got.append(answer)
            return got

        what = f"ReadLog heads from {int(offsets[0])}"
        answers = self._attempts(collect, what, attempt_s=max(60.0, self.timeout_s))
        if answers is None:
            return None
        ends, base, count = [np.zeros(1, "<i4")], 0, 0
        for a in answers:
            chunk = np.frombuffer(a.tail_offsets, "<i4")
            n = len(a.heads) // FIXED_PART_SIZE
            if count >= len(offsets) or a.pos != offsets[count] or len(chunk) != n + 1:
                raise SourceError(f"{what}: an answer at {a.pos} is not the one due")
            ends.append(chunk[1:] + np.int32(base))
            base += len(a.tails)
            count += n
        if count != len(offsets):
            raise SourceError(f"{what}: {count} heads answered for {len(offsets)} messages")
        heads = b"".join(a.heads for a in answers)
        tails = b"".join(a.tails for a in answers)
        return heads, tails, np.concatenate(ends).astype("<i4").tobytes()

    def _pull_request(
        self, topic: str, queue_id: int, start: int, end: int, wait_ms: int = 0
    ) -> Any:
        from proto import dledger_pb2 as pb

        return pb.PullRequest(
            topic=topic,
            queue_id=queue_id,
            queue_offset=start,
            max_messages=min(end - start, _PULL_MESSAGES),
            tag_expression="*",
            wait_ms=wait_ms,
            raw=True,
            max_bytes=self.pull_bytes,
            end_offset=end,
        )

    def _send_pull(self, request: Any) -> Callable[[], Any]:
        """Send a Pull now; the function returned waits for its answer (failing over if need be).

        Reads keep one Pull in flight while they decode the previous answer.
        """
        import grpc

        what = f"Pull {request.topic}/{request.queue_id} at {request.queue_offset}"
        attempt_s = 10.0 + request.wait_ms / 1000
        address = self.current
        try:
            future = self._stub(address).Pull.future(
                request, timeout=attempt_s, metadata=self.metadata("Pull")
            )
        except grpc.RpcError:
            future = None

        def answer() -> Any:
            if future is not None:
                try:
                    return future.result()
                except grpc.RpcError as exc:
                    code = getattr(exc.code(), "name", str(exc.code()))
                    if not retried(code, exc.details()):
                        details = exc.details() or code
                        raise SourceError(f"{what}: {address} answered {code}: {details}") from None
                    self.fail_over()
            return self._call("Pull", request, what, attempt_s=attempt_s)

        return answer

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = COLUMNS,
        hint: LocalFiles | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """One queue's messages [start, end): a local replica's files, else Pull."""
        if start >= end:
            return
        local = self.local_replica([Slice(topic, queue_id, start, end)], hint)
        if local is not None:
            try:
                batches = local.read(topic, queue_id, start, end, columns)
            except (NotHere, OSError):  # its files do not hold it all yet: the servers
                batches = None
            if batches is not None:
                self.last_path = "files"
                try:
                    yield from batches
                finally:
                    local.close()
                return
            local.close()
        self.last_path = "pull"
        yield from self._pull(topic, queue_id, start, end, columns)

    def _pull(
        self, topic: str, queue_id: int, start: int, end: int, columns: Sequence[str]
    ) -> Iterator[pa.RecordBatch]:
        q = start
        waited_since: float | None = None
        held: list[tuple[bytes, Int64s]] = []  # answers not yet decoded: one batch of several
        held_rows = 0
        pending = self._send_pull(self._pull_request(topic, queue_id, q, end))
        while q < end:
            response = pending()
            raw = response.raw_messages
            if not raw:
                # This replica has not committed (dispatched) up to `end` yet: the
                # planner saw a replica further ahead. Long-poll, then try another.
                now = time.monotonic()
                if waited_since is None:
                    waited_since = now
                elif now - waited_since > self.timeout_s:
                    raise SourceError(
                        f"{topic}/{queue_id}: no replica served queue offset {q} within "
                        f"{self.timeout_s:g}s, though it was planned as committed"
                    )
                self.fail_over()
                pending = self._send_pull(self._pull_request(topic, queue_id, q, end, 500))
                continue
            if q < response.next_offset < end:  # the next answer travels while this decodes
                nxt = response.next_offset
                pending = self._send_pull(self._pull_request(topic, queue_id, nxt, end))
            waited_since = None
            where = f"Pull {topic}/{queue_id} at {q}"
            starts = walk(raw, where)
            if len(starts) > end - q:  # a server that ignored end_offset
                starts = starts[: end - q]
            if response.next_offset != q + len(starts) and len(starts) < end - q:
                raise SourceError(
                    f"{where}: {len(starts)} messages but next offset {response.next_offset}"
                )
            held.append((raw, starts))
            held_rows += len(starts)
            q += len(starts)
            if held_rows >= BATCH_ROWS or q >= end:
                yield _decode_held(held, topic, queue_id, q - held_rows, columns)
                held, held_rows = [], 0

    def unit_span(self, slices: Sequence[Slice]) -> tuple[int, int, int] | None:
        """As OfflineStore.unit_span, from the units at the ends of each slice (ReadUnits)."""
        from proto import dledger_pb2 as pb

        wanted = [s for s in slices if s.start < s.end]
        if not wanted:
            return None
        ranges = []
        for s in wanted:
            ranges.append(
                pb.QueueRange(
                    topic=s.topic, queue_id=s.queue_id, start_offset=s.start, end_offset=s.start + 1
                )
            )
            ranges.append(
                pb.QueueRange(
                    topic=s.topic, queue_id=s.queue_id, start_offset=s.end - 1, end_offset=s.end
                )
            )
        request = pb.ReadUnitsRequest(queues=ranges)
        answers = self._attempts(
            lambda stub, timeout: list(
                stub.ReadUnits(request, timeout=timeout, metadata=self.metadata("ReadUnits"))
            ),
            "ReadUnits (planning)",
            attempt_s=30.0,
        )
        got = [np.frombuffer(a.units, UNIT_DTYPE) for a in answers if a.units]
        if len(got) != len(ranges):  # a replica behind the planner, or retention
            return None
        return span_from_ends((s, got[2 * k], got[2 * k + 1]) for k, s in enumerate(wanted))


def _queue_ranges(rows: Rows, piece: LogPiece) -> Iterator[tuple[Slice, int, int]]:
    """Per queue of the piece, the queue offsets [a, b) its rows cover."""
    exp = rows.expected
    assert exp.topics is not None and exp.topic_codes is not None
    assert exp.queue_ids is not None and exp.queue_offsets is not None
    for s in piece.queues:
        code = exp.topics.index(s.topic) if s.topic in exp.topics else -1
        mine = (exp.topic_codes == code) & (exp.queue_ids == s.queue_id)
        if mine.any():
            offs = exp.queue_offsets[mine]
            yield s, int(offs.min()), int(offs.max()) + 1


def _decode_held(
    held: list[tuple[bytes, Int64s]], topic: str, queue_id: int, first: int, columns: Sequence[str]
) -> pa.RecordBatch:
    """Several Pull answers (consecutive in the queue) as one record batch."""
    where = f"Pull {topic}/{queue_id} from {first}"
    expected = Expected(topic=topic, queue_id=queue_id, first_queue_offset=first)
    if len(held) == 1:
        raw, starts = held[0]
        return decode(raw, starts, columns, expected, where)
    shifted, base = [], 0
    for raw, starts in held:
        shifted.append(starts + base)
        base += len(raw)
    return decode(b"".join(r for r, _ in held), np.concatenate(shifted), columns, expected, where)
