"""`LogStream`: ReadLog's raw committed bytes, streamed into the ranges a read decodes.

A `ServerStore` reads a log piece by asking ReadUnits for its rows, then
streaming the commit-log range they span with ReadLog (chunks of 4 MiB) and
decoding each batch of rows from the bytes delivered. The stream parses each
chunk's two fields itself (`_chunk_fields`: no protobuf object, no copy) and
copies the data once, into a buffer reused from batch to batch.

Invariants: bytes are delivered in log order, each range starting where an
entry starts and at or after everything asked before; a stream broken, or
stopped short by a replica that lags the planned end, resumes at the first
entry of the range being filled, on the next server (waiting at most the
store's `timeout_s` for one that has it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from analytics.errors import RpcFailed, SourceError, retried
from dledger_commitlog.client import Access
from dledger_commitlog.common.protowire import read_varint

_LOG_CHUNK = 4 << 20


class Replicas(Protocol):
    """What a stream needs of the store it reads for (`server_store.ServerStore`): the
    replica it reads from now, a channel to it, and the next one when it fails."""

    timeout_s: float
    access: Access

    @property
    def current(self) -> str: ...

    def metadata(self, method: str) -> Any: ...

    def channel(self, address: str) -> Any: ...

    def fail_over(self) -> None: ...


class LogStream:
    """ReadLog from `start` to `end`, delivered into the byte ranges `fill` asks for.

    Chunks are taken off the wire undecoded (`_chunk_fields` finds the bytes in
    the message) and copied once, into a buffer reused from batch to batch (what
    `decode` builds never points into it). A broken stream is resumed on another
    server at the first entry of the range being filled; a replica whose
    committed end is short of `end` (it lags the planner) is waited for, then
    another is tried.
    """

    def __init__(self, store: Replicas, start: int, end: int) -> None:
        self.store = store
        self.end = end
        self._pos = start  # next byte the stream will deliver
        self._chunk: tuple[int, memoryview] | None = None  # received, not all consumed
        self._it: Iterator[bytes] | None = None
        self._call: Any = None
        self._waited_since: float | None = None
        self._buf = np.empty(0, np.uint8)

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._call = self._it = None

    def _open(self, pos: int) -> None:
        from proto import dledger_pb2 as pb

        self.close()
        store = self.store
        call = store.channel(store.current).unary_stream(
            "/dledger.v1.DLedgerClient/ReadLog",
            request_serializer=pb.ReadLogRequest.SerializeToString,
            response_deserializer=None,  # raw bytes: `_chunk_fields` reads them
        )
        request = pb.ReadLogRequest(from_pos=pos, end_pos=self.end, chunk_bytes=_LOG_CHUNK)
        self._call = call(
            request, timeout=max(60.0, store.timeout_s), metadata=store.metadata("ReadLog")
        )
        self._it = iter(self._call)
        self._pos = pos

    def _next(self, resume: int) -> tuple[int, memoryview]:
        """The next chunk; on a failure, resume at `resume` (an entry start)."""
        import grpc

        while True:
            if self._it is None:
                self._open(resume)
            assert self._it is not None
            try:
                raw = next(self._it)
            except StopIteration:
                # This replica's committed end came first: it lags. Wait, then another.
                self._lagging(f"ReadLog stopped at {self._pos} before {self.end}")
                self.close()
                continue
            except grpc.RpcError as exc:
                code = getattr(exc.code(), "name", str(exc.code()))
                address = self.store.current
                if not retried(code, exc.details()):
                    raise RpcFailed(
                        f"ReadLog: {address} answered {code}: {exc.details() or code}", code
                    ) from None
                self._lagging(f"ReadLog: {address}: {code}")
                self.close()
                continue
            self._waited_since = None
            pos, data = _chunk_fields(raw)
            self._pos = pos + len(data)
            return pos, data

    def _lagging(self, why: str) -> None:
        now = time.monotonic()
        if self._waited_since is None:
            self._waited_since = now
        elif now - self._waited_since > self.store.timeout_s:
            raise SourceError(f"{why}; no replica served it within {self.store.timeout_s:g}s")
        self.store.fail_over()
        time.sleep(0.1)

    def fill(self, first: int, end: int) -> pa.Buffer:
        """Bytes [first, end) of the log (`first`: where an entry starts, at or after
        everything asked before), valid until the next call."""
        size = end - first
        if len(self._buf) < size:
            self._buf = np.empty(max(size, 2 * len(self._buf)), np.uint8)
        buf = self._buf
        at = first  # [first, at) is filled
        while at < end:
            if self._chunk is None:
                self._chunk = self._next(resume=first)
            pos, data = self._chunk
            if pos > at:
                raise AssertionError(f"ReadLog delivered {pos} where {at} was due")
            if pos + len(data) <= at:  # before what is needed (a gap between batches)
                self._chunk = None
                continue
            n = min(end, pos + len(data)) - at
            buf[at - first : at - first + n] = np.frombuffer(data, np.uint8, n, at - pos)
            at += n
            if pos + len(data) <= end:
                self._chunk = None
        return pa.py_buffer(buf[:size])


def _chunk_fields(raw: bytes) -> tuple[int, memoryview]:
    """`pos` and `data` of a serialized ReadLogChunk, the bytes not copied."""
    pos, data, i = 0, memoryview(raw)[0:0], 0
    while i < len(raw):
        key, i = read_varint(raw, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(raw, i)
            if field == 1:
                pos = value
        elif wire == 2:
            n, i = read_varint(raw, i)
            if field == 2:
                data = memoryview(raw)[i : i + n]
            i += n
        else:
            raise SourceError(f"ReadLog answered a field of wire type {wire}: not ReadLogChunk")
    return pos, data
