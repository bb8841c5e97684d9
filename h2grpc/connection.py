"""One HTTP/2 connection carrying gRPC calls, as an asyncio protocol: bytes in, calls out.

Owns `Connection`, the shared part of `server.ServerConnection` and
`client.ClientConnection`; its calls' streams are `stream.Stream`. Every frame is
parsed in `data_received`, on the loop, with no task or thread between the socket
and the call: a stream with a synchronous consumer (`Stream.on_message`) gets its
gRPC messages right there, in the order they arrived; others queue them for
`Stream.read`. What is written leaves in one `transport.write` per frame group.

Flow control (RFC 9113 section 5.2): this side advertises STREAM_WINDOW per stream and
CONN_WINDOW for the connection; the connection's window is given back as bytes
arrive, a stream's as its consumer takes them, but held while its queue of
unread messages is over STREAM_WINDOW, so a reader that does not keep up stops its
sender and no stream buffers without bound. Sending respects the peer's windows and
its maximum frame size: what does not fit waits, in order, for its WINDOW_UPDATE;
`drain` waits until a stream's bytes left and the transport is not paused.

Keepalive: a PING every `keepalive_s`; no answer within KEEPALIVE_TIMEOUT_S and the
connection is closed (every stream fails with ConnectionLost), as grpc's
keepalive does. A frame this side cannot accept (a bad header block, a frame past
the size it advertised, an overrun window) ends the connection with GOAWAY.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any, cast

import hpack

from h2grpc import frames as f
from h2grpc.stream import (
    CONN_WINDOW,
    KEEPALIVE_S,
    KEEPALIVE_TIMEOUT_S,
    MAX_FRAME,
    MAX_HEADER_LIST,
    MAX_MESSAGE_BYTES,
    STREAM_WINDOW,
    ConnectionLost,
    MessageRefused,
    ProtocolError,
    Stream,
    StreamReset,
)

log = logging.getLogger(__name__)


class Connection(asyncio.Protocol):
    """The part of an HTTP/2 connection both sides share (see the module docstring)."""

    client_side = False

    def __init__(self, *, keepalive_s: float = KEEPALIVE_S) -> None:
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.blocked: dict[int, Stream] = {}  # streams whose bytes wait for a window
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.send_window = f.DEFAULT_WINDOW
        self.max_message_bytes = MAX_MESSAGE_BYTES
        self.paused = False
        self.closed: BaseException | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST
        self._buf = bytearray()
        self._headers: tuple[int, int, bytearray] | None = None  # a block in progress
        self._credit = 0  # connection window to give back
        self._writable: asyncio.Future[None] | None = None
        self._keepalive_s = keepalive_s
        self._ping_timer: asyncio.TimerHandle | None = None
        self._ping_deadline: asyncio.TimerHandle | None = None
        self._ping_payload = b""
        self.goaway_received = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        out = [
            f.settings_frame(
                [
                    (f.SETTINGS_ENABLE_PUSH, 0),
                    (f.SETTINGS_MAX_CONCURRENT_STREAMS, 1000),
                    (f.SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                    (f.SETTINGS_MAX_FRAME_SIZE, MAX_FRAME),
                    (f.SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
                ]
            ),
            f.window_update(0, CONN_WINDOW - f.DEFAULT_WINDOW),
        ]
        if self.client_side:
            out.insert(0, f.PREFACE)
        else:
            self._buf_preface = True
        self.transport.write(b"".join(out))
        self._schedule_ping()

    _buf_preface = False  # a server waits for the client's preface first

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ConnectionLost(f"connection lost: {exc}" if exc else "connection closed"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_writers()

    def data_received(self, data: bytes) -> None:
        try:
            self._frames(data)
        except ProtocolError as exc:
            self.fail(exc.code, str(exc))
        except hpack.HPACKError as exc:
            self.fail(f.COMPRESSION_ERROR, f"bad header block: {exc}")

    def _frames(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            buf += data
            view: bytes | bytearray = buf
        else:
            view = data
        pos, n = 0, len(view)
        if self._buf_preface:
            if n < len(f.PREFACE):
                if view is data:
                    self._buf = bytearray(data)
                return
            if view[: len(f.PREFACE)] != f.PREFACE:
                raise ProtocolError(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._buf_preface = False
            pos = len(f.PREFACE)
        unpack = f.HEADER.unpack_from
        while n - pos >= 9 and self.closed is None:
            hi, lo, ftype, flags, sid = unpack(view, pos)
            length = (hi << 16) | lo
            end = pos + 9 + length
            if length > MAX_FRAME:
                raise ProtocolError(f.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            if end > n:
                break
            sid &= 0x7FFFFFFF
            if ftype == f.DATA:
                self._on_data(sid, flags, view, pos + 9, end)
            else:
                self._on_frame(ftype, flags, sid, bytes(view[pos + 9 : end]))
            pos = end
        if view is buf:
            del buf[:pos]
        elif pos < n:
            self._buf = bytearray(view[pos:])
        if self._credit >= CONN_WINDOW // 4:
            self.write(f.window_update(0, self._credit))
            self._credit = 0

    def _on_data(self, sid: int, flags: int, view: bytes | bytearray, start: int, end: int) -> None:
        if self._headers is not None:
            raise ProtocolError(f.PROTOCOL_ERROR, "DATA inside a header block")
        self._credit += end - start
        if flags & f.PADDED:
            pad = view[start]
            start, end = start + 1, end - pad
            if end < start:
                raise ProtocolError(f.PROTOCOL_ERROR, "padding longer than the frame")
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            return  # reset or ended here already: the connection window was counted
        try:
            stream._data(view, start, end)
        except MessageRefused as exc:
            self.refused(stream, exc)
            return
        except Exception:  # a consumer's own failure: that stream ends, the rest go on
            log.exception("HTTP/2 stream %d: its consumer failed", sid)
            stream.reset(f.INTERNAL_ERROR)
            return
        if flags & f.END_STREAM:
            self._remote_end(stream)

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._headers is not None and ftype != f.CONTINUATION:
            raise ProtocolError(f.PROTOCOL_ERROR, "a frame inside a header block")
        if ftype == f.HEADERS:
            self._on_headers(flags, sid, payload)
        elif ftype == f.CONTINUATION:
            if self._headers is None or self._headers[0] != sid:
                raise ProtocolError(f.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            self._headers[2].extend(payload)
            if flags & f.END_HEADERS:
                _, end_flags, block = self._headers
                self._headers = None
                self._header_block(sid, end_flags, bytes(block))
        elif ftype == f.SETTINGS:
            if not flags & f.ACK:
                self._on_settings(payload)
        elif ftype == f.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif ftype == f.PING:
            if len(payload) != 8:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "a PING of other than 8 bytes")
            if not flags & f.ACK:
                self.write(f.ping(payload, ack=True))
            elif payload == self._ping_payload:
                self._pong()
        elif ftype == f.RST_STREAM:
            stream = self.streams.get(sid)
            if stream is not None:
                self.forget(stream, StreamReset(f.u32(payload)))
        elif ftype == f.GOAWAY:
            self._on_goaway(f.u32(payload) & 0x7FFFFFFF, f.u32(payload, 4), payload[8:])
        # PRIORITY, PUSH_PROMISE (never enabled) and unknown types are ignored

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        start, end = 0, len(payload)
        if flags & f.PADDED:
            start, end = 1, end - payload[0]
        if flags & f.PRIORITY_FLAG:
            start += 5
        if end < start:
            raise ProtocolError(f.PROTOCOL_ERROR, "padding longer than the HEADERS frame")
        block = payload[start:end]
        if flags & f.END_HEADERS:
            self._header_block(sid, flags, block)
        else:
            self._headers = (sid, flags, bytearray(block))

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        headers = [(str(k), str(v)) for k, v in self._decoder.decode(block)]
        stream = self.streams.get(sid)
        if stream is None:
            stream = self.new_stream(sid, headers)
            if stream is None:
                return
        elif stream.headers is None:
            stream.headers = headers
        else:
            stream.trailers = headers
        if flags & f.END_STREAM:
            self._remote_end(stream)
        else:
            stream._event()

    def new_stream(self, sid: int, headers: list[tuple[str, str]]) -> Stream | None:
        """HEADERS for a stream this side does not know: the server's request."""
        return None

    def _remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        stream._event()
        stream._maybe_done()

    def _on_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "a SETTINGS frame of a bad length")
        for key, value in f.parse_settings(payload):
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ProtocolError(f.FLOW_CONTROL_ERROR, "an initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ProtocolError(f.PROTOCOL_ERROR, f"a maximum frame size of {value}")
                self.peer_max_frame = value
        self.write(f.SETTINGS_ACK)
        self._unblock()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        increment = f.u32(payload) & 0x7FFFFFFF
        if sid == 0:
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise ProtocolError(f.FLOW_CONTROL_ERROR, "the connection window overflowed")
        else:
            stream = self.streams.get(sid)
            if stream is None:
                return
            stream.send_window += increment
        self._unblock()

    def _unblock(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            stream._flush()
        self._wake_writers()

    def _on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.goaway_received = True
        why = ConnectionLost(
            f"the peer is going away (HTTP/2 error {code}"
            f"{': ' + debug.decode(errors='replace') if debug else ''})"
        )
        for stream in [s for sid, s in self.streams.items() if sid > last_stream_id]:
            self.forget(stream, why)

    # -- what both sides use -----------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.closed is None:
            self.transport.write(data)

    def header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        """HEADERS (and CONTINUATION frames if `block` is larger than a frame)."""
        size = self.peer_max_frame
        flags = f.END_STREAM if end_stream else 0
        if len(block) <= size:
            return f.frame_header(len(block), f.HEADERS, flags | f.END_HEADERS, sid) + block
        parts = [block[i : i + size] for i in range(0, len(block), size)]
        out = [f.frame_header(len(parts[0]), f.HEADERS, flags, sid), parts[0]]
        for i, part in enumerate(parts[1:], 1):
            last = f.END_HEADERS if i == len(parts) - 1 else 0
            out += [f.frame_header(len(part), f.CONTINUATION, last, sid), part]
        return b"".join(out)

    def forget(self, stream: Stream, error: BaseException | None) -> None:
        """The stream is over (`error`: why, if it did not end well)."""
        if self.streams.pop(stream.id, None) is None:
            return
        self.blocked.pop(stream.id, None)
        if error is not None and stream.error is None:
            stream.error = error
            stream._pending.clear()
        stream._event()
        self.stream_ended(stream)

    def stream_ended(self, stream: Stream) -> None:
        """A stream left the table (a side's hook)."""

    def refused(self, stream: Stream, exc: MessageRefused) -> None:
        """A message of `stream` this side does not take (a side's hook)."""
        stream.reset(f.CANCEL)

    def fail(self, code: int, why: str) -> None:
        """End the connection: GOAWAY naming `code`, then close."""
        log.warning("closing an HTTP/2 connection: %s", why)
        last = max(self.streams, default=0)
        self.write(f.goaway(last, code, why.encode()[:256]))
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._end(ConnectionLost("connection closed"))

    def _end(self, exc: BaseException) -> None:
        if self.closed is not None:
            return
        self.closed = exc
        for timer in (self._ping_timer, self._ping_deadline):
            if timer is not None:
                timer.cancel()
        for stream in list(self.streams.values()):
            self.forget(stream, exc)
        if not self.lost.done():
            self.lost.set_result(None)
        self._wake_writers()

    async def writable(self, stream: Stream) -> None:
        """Until a window opened or the transport resumed (or the connection ended)."""
        if self.closed is not None:
            raise self.closed
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._writable)

    def _wake_writers(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- keepalive ---------------------------------------------------------------------

    def _schedule_ping(self) -> None:
        if self._keepalive_s > 0 and self.closed is None:
            loop = asyncio.get_running_loop()
            self._ping_timer = loop.call_later(self._keepalive_s, self._ping)

    def _ping(self) -> None:
        self._ping_payload = os.urandom(8)
        self.write(f.ping(self._ping_payload))
        loop = asyncio.get_running_loop()
        self._ping_deadline = loop.call_later(KEEPALIVE_TIMEOUT_S, self._ping_unanswered)

    def _pong(self) -> None:
        if self._ping_deadline is not None:
            self._ping_deadline.cancel()
            self._ping_deadline = None
            self._schedule_ping()

    def _ping_unanswered(self) -> None:
        log.info("HTTP/2 peer did not answer a ping within %.0f s: closing", KEEPALIVE_TIMEOUT_S)
        if self.transport is not None:
            self.transport.abort()
        self._end(ConnectionLost("the peer did not answer a keepalive ping"))

    def peer_address(self) -> Any:
        return None if self.transport is None else self.transport.get_extra_info("peername")

    def peer_certificate(self) -> dict[str, Any] | None:
        """The peer's verified certificate (TLS with client certificates), as `ssl`
        gives it."""
        if self.transport is None:
            return None
        ssl_object = self.transport.get_extra_info("ssl_object")
        with contextlib.suppress(ValueError, AttributeError):
            cert: dict[str, Any] | None = ssl_object.getpeercert() if ssl_object else None
            return cert
        return None
