"""Where the analytics read committed messages: a cluster (gRPC) or a stopped node's directory.

Both stores answer the same two questions, queue by queue:

- `queues(topic)`: every (topic, queue id) with its [min, max) queue offsets, where
  max is the committed (dispatched) end on the replica or directory asked;
- `read(topic, queue_id, start, end, columns)`: the messages at queue offsets
  [start, end) as Arrow record batches (`analytics.codec`), checked against the
  queue, offsets and sizes they were read for.

`ServerStore` uses the DLedgerClient service directly (its own stubs: no leader
discovery is needed, since every replica serves its committed prefix): planning
asks `QueueOffsets`, reading asks `Pull(raw=True, end_offset=...)`, which never
returns anything beyond the answering replica's committed position. A replica
that is behind the planned end is long-polled until it catches up (it holds
only committed data, and committed data reaches every replica), and an
unreachable one is failed over to the next server. Queue offsets are the same on
every replica, so a read resumes on another server exactly where it stopped.

`OfflineStore` reads a node's data directory without modifying it: consume-queue
files (20-byte units, only ever written for committed messages, the data ending
at the first unit with size <= 0) give each message's commit-log offset X and
size, and the message is `segment[X - start : X - start + size]` of the data
segment holding X, memory-mapped read-only. Every message is checked against its
unit (size, physical offset, topic, queue, queue offset) before it is returned.
Point it at a stopped node (or a copy): a live node may be mid-write.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from store.errors import CorruptEntry

from .codec import COLUMNS, Expected, Int64s, decode, walk
from .errors import SourceError

if TYPE_CHECKING:
    from dledger_commitlog.client import Access

SYSTEM_TOPIC_PREFIX = "%SYS%"  # dispatch's system topics (consumer offsets): not user data
UNIT_SIZE = 20
_UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
_UNITS_PER_READ = 1 << 16
_PULL_BYTES = 8 << 20
_PULL_MESSAGES = 65_536
_BATCH_ROWS = 65_536  # Spark ingests big Arrow batches faster than small ones
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_RETRIED_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED"})


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


class MessageStore(Protocol):
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


def open_store(
    servers: Sequence[str] = (),
    path: str | None = None,
    timeout_s: float = 30.0,
    prefer: int = 0,
    access: Access | None = None,
) -> ServerStore | OfflineStore:
    if path:
        return OfflineStore(path)
    return ServerStore(servers, timeout_s=timeout_s, prefer=prefer, access=access)


# ---------------------------------------------------------------- offline


class OfflineStore:
    """Reads a stopped node's data directory (see the module doc); never writes to it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path)
        data = self.root / "commitlog" / "data"
        if not data.is_dir():
            raise SourceError(
                f"{self.root} is not a dledger data directory (no commitlog/data/ in it)"
            )
        self._segments = sorted(
            (int(p.name), p) for p in data.iterdir() if p.name.isdigit() and len(p.name) == 20
        )
        self._starts = [s for s, _ in self._segments]
        self._maps: dict[int, pa.Buffer] = {}

    def close(self) -> None:
        self._maps.clear()

    # -- queues ------------------------------------------------------------------

    def _queue_files(self, topic: str, queue_id: int) -> list[tuple[int, Path, int]]:
        """(first unit, path, units) of each file of the queue, oldest first."""
        directory = self.root / "consumequeue" / topic / str(queue_id)
        files = []
        for p in directory.iterdir() if directory.is_dir() else ():
            if p.name.isdigit() and len(p.name) == 20:
                start = int(p.name)
                if start % UNIT_SIZE:
                    raise CorruptEntry(str(p), start, "file name is not a multiple of 20")
                files.append((start // UNIT_SIZE, p, p.stat().st_size // UNIT_SIZE))
        return sorted(files)

    def queues(self, topic: str = "") -> list[QueueInfo]:
        base = self.root / "consumequeue"
        out = []
        topics = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        for t in topics:
            if (t != topic) if topic else t.startswith(SYSTEM_TOPIC_PREFIX):
                continue
            ids = sorted(int(p.name) for p in (base / t).iterdir() if p.name.isdigit())
            for q in ids:
                info = self._bounds(t, q)
                if info is not None:
                    out.append(info)
        return out

    def _bounds(self, topic: str, queue_id: int) -> QueueInfo | None:
        files = self._queue_files(topic, queue_id)
        if not files:
            return None
        end = files[0][0]
        for first, path, count in reversed(files):
            units = _read_units(path, 0, count)
            valid = _count_valid(units)
            if valid:
                end = first + valid
                break
        lo = files[0][0]
        if self._starts and lo < end:
            # Units whose messages retention deleted do not count.
            floor = self._starts[0]
            first_units = self._units(topic, queue_id, lo, min(end, files[0][0] + files[0][2]))
            lo += int(np.searchsorted(first_units["offset"].astype(np.int64), floor))
        return QueueInfo(topic, queue_id, min(lo, end), end)

    def _units(self, topic: str, queue_id: int, start: int, end: int) -> np.ndarray[Any, Any]:
        parts = []
        for first, path, count in self._queue_files(topic, queue_id):
            lo, hi = max(start, first), min(end, first + count)
            if lo < hi:
                parts.append(_read_units(path, lo - first, hi - lo))
        units = np.concatenate(parts) if parts else np.zeros(0, _UNIT_DTYPE)
        if len(units) != end - start:
            raise CorruptEntry(
                f"consumequeue/{topic}/{queue_id}", start * UNIT_SIZE, "queue files have a gap"
            )
        return units

    # -- messages ----------------------------------------------------------------

    def _segment(self, index: int) -> pa.Buffer:
        buf = self._maps.get(index)
        if buf is None:
            with pa.memory_map(str(self._segments[index][1]), "r") as mm:
                buf = mm.read_buffer()
            self._maps = {index: buf}  # keep one segment mapped at a time
        return buf

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = COLUMNS,
    ) -> Iterator[pa.RecordBatch]:
        where = f"consumequeue/{topic}/{queue_id}"
        q = start
        while q < end:
            units = self._units(topic, queue_id, q, min(end, q + _UNITS_PER_READ))
            valid = _count_valid(units)
            if valid < len(units):
                raise SourceError(
                    f"{where}: queue offset {q + valid} is beyond the end of the queue's data"
                )
            offsets = units["offset"].astype(np.int64)
            sizes = units["size"].astype(np.int32)
            if not self._starts or offsets[0] < self._starts[0]:
                raise SourceError(
                    f"{where}: queue offset {q} points at commit-log offset {int(offsets[0])}, "
                    "which retention deleted"
                )
            seg = np.searchsorted(np.asarray(self._starts, np.int64), offsets, side="right") - 1
            cuts = np.flatnonzero(np.diff(seg)) + 1
            for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(units)], strict=True):
                index = int(seg[lo])
                base = self._starts[index]
                expected = Expected(
                    topic=topic,
                    queue_id=queue_id,
                    first_queue_offset=q + lo,
                    sizes=sizes[lo:hi],
                    commitlog_offsets=offsets[lo:hi],
                )
                yield decode(
                    self._segment(index),
                    offsets[lo:hi] - base,
                    columns,
                    expected,
                    where=str(self._segments[index][1]),
                )
            q += len(units)


def _read_units(path: Path, first: int, count: int) -> np.ndarray[Any, Any]:
    with path.open("rb") as f:
        f.seek(first * UNIT_SIZE)
        data = f.read(count * UNIT_SIZE)
    return np.frombuffer(data[: len(data) - len(data) % UNIT_SIZE], _UNIT_DTYPE)


def _count_valid(units: np.ndarray[Any, Any]) -> int:
    """Units before the first that ends the data (size <= 0, or a negative offset)."""
    bad = (units["size"] <= 0) | (units["offset"] < 0)
    return int(np.argmax(bad)) if bad.any() else len(units)


# ---------------------------------------------------------------- servers


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
    ) -> None:
        """`access`: TLS and credentials of a secured cluster (default: neither)."""
        from dledger_commitlog.client import Access  # lazily: grpc only when reading servers

        self.access = access or Access()
        self.servers = [s.strip() for s in servers if s.strip()]
        if not self.servers:
            raise SourceError("no servers: give the `servers` option (host:port,...) or a path")
        self.timeout_s = timeout_s
        self.pull_bytes = pull_bytes
        self._first = prefer % len(self.servers)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}

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

    def _call(self, method: str, request: Any, what: str, attempt_s: float = 10.0) -> Any:
        """One RPC on the preferred server, failing over to the others until the deadline."""
        import grpc

        deadline = time.monotonic() + self.timeout_s
        errors: dict[str, str] = {}
        backoff = 0.05
        while True:
            for k in range(len(self.servers)):
                address = self.servers[(self._first + k) % len(self.servers)]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    response = getattr(self._stub(address), method)(
                        request,
                        timeout=min(attempt_s, remaining),
                        metadata=self.access.metadata(method),
                    )
                except grpc.RpcError as exc:
                    code = getattr(exc.code(), "name", str(exc.code()))
                    details = exc.details() or code
                    if code not in _RETRIED_CODES:
                        raise SourceError(f"{what}: {address} answered {code}: {details}") from None
                    errors[address] = f"{code}: {details}"
                    continue
                self._first = (self._first + k) % len(self.servers)  # stick to what works
                return response
            if time.monotonic() + backoff >= deadline:
                tried = "; ".join(f"{a}: {e}" for a, e in errors.items()) or "no attempt"
                raise SourceError(f"{what}: no server answered in {self.timeout_s:g}s ({tried})")
            time.sleep(backoff + random.uniform(0, backoff))
            backoff = min(backoff * 2, 1.0)

    def queues(self, topic: str = "") -> list[QueueInfo]:
        from proto import dledger_pb2 as pb

        response = self._call("QueueOffsets", pb.QueueOffsetsRequest(topic=topic), "QueueOffsets")
        found = [
            QueueInfo(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in response.queues
        ]
        return sorted(found, key=lambda q: (q.topic, q.queue_id))

    def group_offsets(self, group: str, topic: str) -> list[GroupOffset]:
        from proto import dledger_pb2 as pb

        request = pb.FetchOffsetRequest(group=group, topic=topic, queue_id=-1)
        response = self._call("FetchOffset", request, f"FetchOffset {group} {topic}")
        return [GroupOffset(o.topic, o.queue_id, o.offset) for o in response.offsets]

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
        address = self.servers[self._first]
        try:
            future = self._stub(address).Pull.future(
                request, timeout=attempt_s, metadata=self.access.metadata("Pull")
            )
        except grpc.RpcError:
            future = None

        def answer() -> Any:
            if future is not None:
                try:
                    return future.result()
                except grpc.RpcError as exc:
                    code = getattr(exc.code(), "name", str(exc.code()))
                    if code not in _RETRIED_CODES:
                        details = exc.details() or code
                        raise SourceError(f"{what}: {address} answered {code}: {details}") from None
                    self._first = (self._first + 1) % len(self.servers)
            return self._call("Pull", request, what, attempt_s=attempt_s)

        return answer

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = COLUMNS,
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
                self._first = (self._first + 1) % len(self.servers)
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
            if held_rows >= _BATCH_ROWS or q >= end:
                yield _decode_held(held, topic, queue_id, q - held_rows, columns)
                held, held_rows = [], 0


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
