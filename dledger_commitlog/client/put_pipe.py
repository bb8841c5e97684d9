"""Client side of `PutFrames`: concurrent puts to one server coalesced into frames.

Owns `PutPipe`, one long-lived bidirectional stream to one server, on h2grpc (gRPC
over HTTP/2 parsed in the loop's own read callback: a frame's answer resolves its
callers' futures where it is read, with no thread or task between). Callers hand it
a message each (`put`); the messages of one loop pass leave as one frame (at most
`max_messages` / `max_bytes`) at the end of that pass, and while earlier frames are
still unanswered the pipe lingers for more, until they are all answered or
`linger_s` has passed, whichever comes first (Nagle's rule with a bound: a lone
sequential caller never waits, and what arrives while the server is busy goes
out as one frame; `linger_s=0` never lingers). At most `max_in_flight` messages wait in
the pipe or unanswered at the server; more callers wait for room, so a client that
puts faster than the cluster commits backs up in its own loop, where each caller's
deadline still applies, rather than in the server's queue.

Invariants: no frame is written before the server said it accepted the stream
(`PUT_FRAMES_ACCEPTED`), so a refused stream fails its puts with the server's own
status; a message is sent at most once per pipe (a retry is the caller's, through
a new attempt with the same uniq_key); a broken stream fails every unanswered put
with a retryable failure and the pipe is done (`broken`); a caller that gave up
before its message left is never sent; nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Sequence

import h2grpc
from dledger_commitlog.common.protocol import PUT_FRAMES_ACCEPTED
from h2grpc.frames import status_name
from proto import dledger_pb2 as pb

_PATH = "/dledger.v1.DLedgerClient/PutFrames"
MAX_IN_FLIGHT = 4096  # messages a pipe holds (queued or unanswered) before callers wait
CONNECT_TIMEOUT_S = 5.0
_Metadata = Sequence[tuple[str, str | bytes]] | None


class PipeFailure(Exception):
    """One put failed: `code` is the gRPC status name; `leader` the redirect, if any."""

    def __init__(self, code: str, details: str, leader: str | None = None) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.leader = leader


class PutPipe:
    def __init__(
        self,
        address: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        cluster: str = "",
        metadata: Callable[[], _Metadata] = lambda: None,
        linger_s: float = 0.001,
        max_messages: int = 256,
        max_bytes: int = 1 << 20,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._ssl = ssl_context
        self._cluster = cluster
        self._metadata = metadata
        self._linger_s = linger_s
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._max_in_flight = max_in_flight
        self._pending: list[tuple[pb.MessageData, asyncio.Future[pb.PutResult]]] = []
        self._unanswered: dict[int, list[asyncio.Future[pb.PutResult]]] = {}
        self._in_flight = 0  # messages pending or unanswered
        self._room: asyncio.Event | None = None  # set when a caller may add one
        self._seq = 0
        self._conn: h2grpc.ClientConnection | None = None
        self._stream: h2grpc.Stream | None = None  # once the server accepted it
        self._opening: asyncio.Task[None] | None = None
        self._flush_due: asyncio.Handle | None = None
        self.broken: PipeFailure | None = None
        self.frames_sent = 0
        self.messages_sent = 0

    async def put(self, message: pb.MessageData) -> pb.PutResult:
        """Send `message` in the next frame; its result, or PipeFailure."""
        while self._in_flight >= self._max_in_flight and self.broken is None:
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()
        if self.broken is not None:
            raise self.broken
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[pb.PutResult] = loop.create_future()
        self._pending.append((message, fut))
        self._in_flight += 1
        if self._stream is None:
            if self._opening is None:
                self._opening = loop.create_task(self._open(), name="put-pipe-open")
        elif self._flush_due is None:
            if not self._unanswered or self._linger_s <= 0:
                self._flush_due = loop.call_soon(self._flush)  # this pass's puts, one frame
            elif len(self._pending) >= self._max_messages:
                self._flush()
            else:
                self._flush_due = loop.call_later(self._linger_s, self._flush)
        return await fut

    async def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._opening
        self._fail(PipeFailure("CANCELLED", "the client closed"))

    # -- the stream ----------------------------------------------------------------

    async def _open(self) -> None:
        """Connect, open the stream, and wait for the server's word that it accepted it.
        If it refused it instead (no credentials, say, or UNIMPLEMENTED from a server
        without PutFrames), every put fails with the status the server gave."""
        try:
            conn = self._conn = await h2grpc.connect(
                self._host,
                self._port,
                ssl_context=self._ssl,
                server_hostname=self._host if self._ssl else None,
                timeout_s=CONNECT_TIMEOUT_S,
            )
        except (OSError, TimeoutError, h2grpc.ConnectionLost) as exc:  # nothing was sent
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self._fail(
                PipeFailure(
                    "UNAVAILABLE",
                    f"failed to connect to {self._host}:{self._port}: {why or 'timed out'}",
                )
            )
            return
        try:
            meta = [
                (k, v.decode() if isinstance(v, bytes) else v) for k, v in self._metadata() or ()
            ]
            stream = conn.open(_PATH, meta)
            stream.on_message = self._on_reply
            stream.on_event = self._on_event
            await stream.wait_headers()
        except h2grpc.ConnectionLost as exc:
            self._fail(PipeFailure("UNAVAILABLE", f"put stream: {exc}"))
            return
        if self.broken is None:
            if any(k == PUT_FRAMES_ACCEPTED for k, _ in stream.headers or ()):
                self._stream = stream
                self._flush()
            else:
                self._fail(self._ended(stream))

    def _on_event(self, stream: h2grpc.Stream) -> None:
        """The server answered, ended or reset the stream, or the connection ended."""
        if stream.error is not None or stream.trailers is not None or stream.remote_closed:
            self._fail(self._ended(stream))

    @staticmethod
    def _ended(stream: h2grpc.Stream) -> PipeFailure:
        answer = h2grpc.Answer.of(stream)
        if answer is None or answer.status == 0:
            return PipeFailure("UNAVAILABLE", "the server ended the put stream")
        return PipeFailure(answer.code_name, answer.message)

    def _flush(self) -> None:
        """Everything pending, in frames, onto the stream."""
        self._flush_due = None
        stream = self._stream
        if stream is None:
            return
        while self._pending:
            frame, futures = self._take_frame()
            if futures:
                self._unanswered[frame.seq] = futures
                stream.send_message(frame.SerializeToString())
                self.frames_sent += 1
                self.messages_sent += len(futures)

    def _take_frame(self) -> tuple[pb.PutFrame, list[asyncio.Future[pb.PutResult]]]:
        self._seq += 1
        frame = pb.PutFrame(seq=self._seq, cluster=self._cluster)
        futures: list[asyncio.Future[pb.PutResult]] = []
        size = 0
        taken = 0
        for message, fut in self._pending:
            if futures and (len(futures) >= self._max_messages or size >= self._max_bytes):
                break
            taken += 1
            if fut.done():
                continue  # its caller gave up before it left: never sent
            frame.messages.append(message)
            futures.append(fut)
            size += len(message.body) + 64
        del self._pending[:taken]
        self._left(taken - len(futures))
        return frame, futures

    def _on_reply(self, raw: bytes) -> None:
        reply = pb.PutFrameResult.FromString(raw)
        futures = self._unanswered.pop(reply.seq, [])
        leader = reply.leader or None  # FAILED_PRECONDITION: not the leader, or wrong cluster
        for fut, outcome in zip(futures, reply.outcomes, strict=False):
            if fut.done():
                continue
            if outcome.code == 0:
                fut.set_result(outcome.result)
            else:
                fut.set_exception(PipeFailure(status_name(outcome.code), outcome.error, leader))
        self._left(len(futures))
        if not self._unanswered and self._flush_due is not None:
            self._flush_due.cancel()  # nothing is unanswered now: what lingers goes at once
            self._flush()

    def _left(self, count: int) -> None:
        """`count` messages are no longer in the pipe: room for waiting callers."""
        self._in_flight -= count
        if self._room is not None and count:
            self._room.set()

    def _fail(self, failure: PipeFailure) -> None:
        """The stream is gone: every put not answered yet fails with `failure`."""
        if self.broken is None:
            self.broken = failure
        elif not (self._pending or self._unanswered or self._stream):
            return  # failed already (a reset below reports back here)
        if self._flush_due is not None:
            self._flush_due.cancel()
            self._flush_due = None
        waiting = [f for fs in self._unanswered.values() for f in fs]
        waiting += [f for _, f in self._pending]
        self._unanswered.clear()
        self._pending.clear()
        self._in_flight = 0
        if self._room is not None:
            self._room.set()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(failure)
                fut.exception()  # retrieved: a caller that gave up leaves no warning
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.reset()
        if self._conn is not None:
            self._conn.close()
