"""One call's HTTP/2 stream, the limits both sides keep, and the errors of a stream.

Owns `Stream` (what came on one stream: headers and gRPC messages, queued for
`Stream.read` or handed to a synchronous `Stream.on_message` as they are parsed;
what this side sends on it, held while the peer's windows are shut), the flow-
control and size limits (STREAM_WINDOW, CONN_WINDOW, MAX_FRAME, MAX_MESSAGE_BYTES,
keepalive) and the exceptions a call sees. `connection.Connection` parses the
frames and drives its streams (see that module for flow control and keepalive).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any, Protocol

from h2grpc import frames as f

STREAM_WINDOW = 4 << 20
CONN_WINDOW = 16 << 20
MAX_FRAME = 1 << 20  # the largest frame this side accepts
MAX_HEADER_LIST = 64 << 10
MAX_MESSAGE_BYTES = 64 << 20
KEEPALIVE_S = 10.0
KEEPALIVE_TIMEOUT_S = 5.0


class ConnectionLost(Exception):
    """The connection ended (closed, reset, GOAWAY) before the stream did."""


class StreamReset(Exception):
    """The peer reset the stream (RST_STREAM `code`)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"stream reset by the peer (HTTP/2 error {code})")
        self.code = code


class MessageRefused(Exception):
    """A message this side does not take: `status` (a gRPC code) and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status, self.why = status, why


class ProtocolError(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY `code`."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class Connection(Protocol):
    """What a stream uses of its connection (`connection.Connection` is the one)."""

    streams: dict[int, Stream]
    blocked: dict[int, Stream]  # streams whose bytes wait for a window
    peer_initial_window: int
    peer_max_frame: int
    send_window: int
    max_message_bytes: int
    paused: bool

    def write(self, data: bytes) -> None: ...
    def header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes: ...
    def forget(self, stream: Stream, error: BaseException | None) -> None: ...
    async def writable(self, stream: Stream) -> None: ...


class Stream:
    """One HTTP/2 stream: the headers and messages that came, what this side sends."""

    __slots__ = (
        "_credit",
        "_held",
        "_partial",
        "_pending",
        "_queued_bytes",
        "_waiter",
        "conn",
        "error",
        "headers",
        "id",
        "local_closed",
        "messages",
        "on_event",
        "on_message",
        "owner",
        "remote_closed",
        "send_window",
        "trailers",
    )

    def __init__(self, conn: Connection, stream_id: int) -> None:
        self.conn = conn
        self.id = stream_id
        self.send_window = conn.peer_initial_window
        self.headers: list[tuple[str, str]] | None = None
        self.trailers: list[tuple[str, str]] | None = None
        self.remote_closed = False  # END_STREAM came
        self.local_closed = False  # END_STREAM sent (or queued to be)
        self.error: BaseException | None = None  # reset, refused or connection lost
        # The consumer: a callback run in data_received for each message (it may raise
        # MessageRefused), or, without one, the queue that `read` takes from.
        self.on_message: Callable[[bytes], None] | None = None
        # Told when headers or trailers come, the peer ends its side, or the stream fails.
        self.on_event: Callable[[Stream], None] | None = None
        self.owner: Any = None  # what a side keeps of the stream (the server's call)
        self.messages: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._partial: bytearray | None = None  # a message not whole yet
        self._credit = 0  # taken by the consumer, not yet given back to the peer
        self._held = 0  # arrived while the queue was full: given back once it drains
        self._pending: collections.deque[tuple[int, bytes, bool]] = collections.deque()

    # -- receiving ---------------------------------------------------------------------

    def _data(self, data: bytes | bytearray | memoryview, start: int, end: int) -> None:
        """DATA payload bytes [start, end) of `data`: split into gRPC messages."""
        taken = end - start
        if self._partial is not None:
            self._partial += data[start:end]
            data, start, end = self._partial, 0, len(self._partial)
            self._partial = None
        unpack = f.MESSAGE_PREFIX.unpack_from
        while end - start >= 5:
            flag, size = unpack(data, start)
            if flag:
                raise MessageRefused(f.UNIMPLEMENTED, "compressed messages are not accepted")
            if size > self.conn.max_message_bytes:
                raise MessageRefused(
                    f.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({size} vs. {self.conn.max_message_bytes})",
                )
            stop = start + 5 + size
            if stop > end:
                break
            message = bytes(data[start + 5 : stop])
            start = stop
            on_message = self.on_message  # read each time: a consumer may stop taking
            if on_message is not None:
                on_message(message)
            else:
                self.messages.append(message)
                self._queued_bytes += size + 5
        if start < end:
            self._partial = bytearray(data[start:end])
        if self.on_message is not None or self._queued_bytes < STREAM_WINDOW:
            self._give_back(taken + self._held)
            self._held = 0
        elif self._held > STREAM_WINDOW:  # a peer that ignores the window it was given
            raise MessageRefused(f.RESOURCE_EXHAUSTED, "the stream's flow-control window overrun")
        else:
            self._held += taken
        if self.messages:
            self._wake()

    def _give_back(self, count: int) -> None:
        if self.remote_closed or not count:
            return
        self._credit += count
        if self._credit >= STREAM_WINDOW // 4:
            self.conn.write(f.window_update(self.id, self._credit))
            self._credit = 0

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _event(self) -> None:
        self._wake()
        if self.on_event is not None:
            self.on_event(self)

    async def read(self) -> bytes | None:
        """The next message; None once the peer ended its side (or the stream was reset
        or lost: then `error` says why, and `read` raises it)."""
        while not self.messages:
            if self.error is not None:
                raise self.error
            if self.remote_closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self.messages.popleft()
        self._queued_bytes -= len(message) + 5
        self._give_back(len(message) + 5)
        if self._held and self._queued_bytes < STREAM_WINDOW:
            self._give_back(self._held)
            self._held = 0
        return message

    async def wait_headers(self) -> None:
        """Until the peer's headers came (or the stream ended or failed)."""
        while self.headers is None and self.error is None and not self.remote_closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def wait_closed(self) -> None:
        """Until the peer ended its side, reset the stream, or the connection ended."""
        while self.error is None and not self.remote_closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # -- sending -----------------------------------------------------------------------

    def send_headers(self, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        if self.local_closed or self.error is not None:
            return
        self.local_closed = end_stream
        block = f.encode_headers(headers)
        if self._pending:
            self._pending.append((f.HEADERS, block, end_stream))
        else:
            self.conn.write(self.conn.header_frames(self.id, block, end_stream))
            self._maybe_done()

    def send_message(self, message: bytes, end_stream: bool = False) -> None:
        """Queue `message` (gRPC-prefixed) to leave as the windows allow (`drain`)."""
        self.send_data(f.prefixed(message), end_stream)

    def send_data(self, data: bytes, end_stream: bool = False) -> None:
        if self.local_closed or self.error is not None:
            return
        self.local_closed = end_stream
        conn = self.conn
        if not self._pending and len(data) <= min(
            conn.send_window, self.send_window, conn.peer_max_frame
        ):
            conn.send_window -= len(data)
            self.send_window -= len(data)
            flags = f.END_STREAM if end_stream else 0
            conn.write(f.frame_header(len(data), f.DATA, flags, self.id) + data)
            self._maybe_done()
            return
        self._pending.append((f.DATA, data, end_stream))
        self._flush()

    def end(self) -> None:
        """End this side of the stream (an empty DATA frame with END_STREAM)."""
        self.send_data(b"", end_stream=True)

    def reset(self, code: int = f.CANCEL) -> None:
        """Abandon the stream: RST_STREAM to the peer, unless it is over already."""
        conn = self.conn
        if conn.streams.get(self.id) is self:
            conn.write(f.rst_stream(self.id, code))
            conn.forget(self, ConnectionLost("the stream was reset by this side"))

    def _flush(self) -> None:
        """Send what waited for a window, in order, as far as the windows allow."""
        conn, pending = self.conn, self._pending
        while pending:
            kind, data, end = pending[0]
            if kind == f.HEADERS:
                pending.popleft()
                conn.write(conn.header_frames(self.id, data, end))
                continue
            room = min(conn.send_window, self.send_window, conn.peer_max_frame)
            if room <= 0 and data:
                conn.blocked[self.id] = self
                return
            chunk, rest = data[:room], data[room:]
            conn.send_window -= len(chunk)
            self.send_window -= len(chunk)
            last = not rest
            flags = f.END_STREAM if (last and end) else 0
            conn.write(f.frame_header(len(chunk), f.DATA, flags, self.id) + chunk)
            if last:
                pending.popleft()
            else:
                pending[0] = (kind, rest, end)
        conn.blocked.pop(self.id, None)
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.local_closed and self.remote_closed and not self._pending:
            self.conn.forget(self, None)

    @property
    def sending(self) -> bool:
        """Bytes of this stream wait for a window."""
        return bool(self._pending)

    async def drain(self) -> None:
        """Until this stream's bytes left (as far as the windows go) and the transport
        takes writes; ConnectionLost or StreamReset if the stream ends first."""
        while True:
            if self.error is not None:
                raise self.error
            if not self._pending and not self.conn.paused:
                return
            await self.conn.writable(self)
