"""The client port on grpclib: the same handlers as on grpc.aio, every message on the loop.

grpc.aio hands each message between its C-core threads and the event loop (three
thread hops per message); grpclib speaks HTTP/2 gRPC in pure asyncio, so a call is
parsed, handled and answered on the node's loop. This module serves the very
`grpc.RpcMethodHandler`s that `decoding.checked_handlers` makes for grpc.aio (the
client service, grpc_health's servicer), so nothing is written twice:

- requests are parsed by the handler's own deserializer (an `Undecodable` stays
  INVALID_ARGUMENT naming the field, `decoding`), answers by its serializer;
- each handler gets `_Context`, the part of grpc.aio.ServicerContext the service
  uses (`base.Context`, which mypy checks it against): abort with a status and a
  message (and the trailing metadata set, e.g. the leader hint), invocation
  metadata, initial metadata, the time remaining, the peer, `write`;
- a message over MAX_MESSAGE_BYTES (either way) is RESOURCE_EXHAUSTED, as grpc.aio
  with GRPC_OPTIONS says, and a request's length is checked before its body is
  read (grpclib itself has no limit);
- an unexpected exception is UNKNOWN "Unexpected <type>: <text>", as on grpc.aio;
  a call the client cancels (or whose deadline passes) cancels its handler.

Invariant: a call ends with at most one status (trailers), sent once: by `abort`,
OK when the handler returns, UNKNOWN when it raises, UNAVAILABLE when the server
stops under it, or grpclib's DEADLINE_EXCEEDED; a call the client reset gets none.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.server import Server, Stream
from h2.exceptions import StreamClosedError

from dledger_commitlog.node.config import NodeConfig
from dledger_commitlog.service.base import Context, Metadata
from dledger_commitlog.service.decoding import Services, checked_handlers

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20  # as raft.transport.GRPC_OPTIONS gives grpc.aio, both ways
_RESOURCE = grpc.StatusCode.RESOURCE_EXHAUSTED


class _Aborted(Exception):
    """The call was ended with a status (`_Context.abort`); nothing more is sent."""


class _Context:
    """A grpclib call seen as the part of grpc.aio.ServicerContext handlers use."""

    def __init__(self, stream: Stream[bytes, bytes], serialize: Callable[[Any], bytes]) -> None:
        self._stream = stream
        self._serialize = serialize
        self._trailing: Metadata = ()
        self.finished = False  # the status is sent

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        await self.end(code, details)
        raise _Aborted(details)

    def invocation_metadata(self) -> Metadata | None:
        meta = self._stream.metadata
        return tuple(meta.items()) if meta is not None else None

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailing = tuple(metadata)

    async def send_initial_metadata(self, metadata: Metadata) -> None:
        await self._stream.send_initial_metadata(metadata=list(metadata))

    async def write(self, message: Any) -> None:
        await self.send(message)

    def time_remaining(self) -> float | None:
        deadline = self._stream.deadline
        return None if deadline is None else deadline.time_remaining()

    def peer(self) -> str:
        addr = self._stream.peer.addr()
        if addr is None:
            return "unknown"
        host, port = addr[0], addr[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    # -- what the adapter itself uses ------------------------------------------------

    async def send(self, message: Any) -> None:
        data = self._serialize(message)
        if len(data) > MAX_MESSAGE_BYTES:
            await self.abort(_RESOURCE, f"Sent message larger than max "
                             f"({len(data)} vs. {MAX_MESSAGE_BYTES})")  # fmt: skip
        await self._stream.send_message(data)

    async def end(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        """Send the status (with the trailing metadata set), unless one was sent."""
        if self.finished:
            return
        self.finished = True
        with contextlib.suppress(StreamClosedError):  # the client is gone: nobody to tell
            await self._stream.send_trailing_metadata(
                status=Status(code.value[0]), status_message=details or None,
                metadata=list(self._trailing) or None,
            )  # fmt: skip

    async def receive(self) -> bytes | None:
        """The next request's bytes, None at the end of the request stream.

        Reads grpclib's HTTP/2 stream directly (`Stream._stream`, grpclib 0.4): its own
        `recv_message` reads a message of any length before anyone sees the length."""
        h2 = self._stream._stream
        head = await h2.recv_data(5)
        if not head:
            return None
        compressed, size = struct.unpack(">?I", head)
        if compressed:
            await self.abort(grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not accepted")
        if size > MAX_MESSAGE_BYTES:
            await self.abort(_RESOURCE, f"Received message larger than max "
                             f"({size} vs. {MAX_MESSAGE_BYTES})")  # fmt: skip
        data: bytes = await h2.recv_data(size)
        return data


class _Bytes(CodecBase):
    """grpclib's codec, bytes as they are: the handlers' own (de)serializers parse."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


class _Served:
    """The handlers of services as grpclib's `__mapping__` wants them; counts the calls
    in progress and, once draining, refuses new ones (UNAVAILABLE, as grpc.aio does)."""

    def __init__(self, services: Services) -> None:
        self.active = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._draining = False
        self._mapping: dict[str, Handler] = {}
        for service, handlers in checked_handlers(services):
            for name, handler in handlers.items():
                cardinality = next(
                    c for c in Cardinality
                    if c.value == (handler.request_streaming, handler.response_streaming)
                )  # fmt: skip
                self._mapping[f"/{service}/{name}"] = Handler(
                    _call(handler, self), cardinality, bytes, bytes
                )

    def __mapping__(self) -> dict[str, Handler]:
        return self._mapping

    def drain(self) -> None:
        self._draining = True

    def draining(self) -> bool:
        return self._draining


def _call(handler: Any, served: _Served) -> Callable[[Stream[bytes, bytes]], Any]:
    """The grpclib method of one grpc.RpcMethodHandler (see the module doc)."""
    streaming_in, streaming_out = handler.request_streaming, handler.response_streaming
    kind = ("stream_" if streaming_in else "unary_") + ("stream" if streaming_out else "unary")
    behavior = getattr(handler, kind)
    parse, serialize = handler.request_deserializer, handler.response_serializer
    yields = inspect.isasyncgenfunction(behavior)  # else a coroutine (that may `write`)
    if not (yields or inspect.iscoroutinefunction(behavior)):
        behavior = _unimplemented  # grpc_health's List: grpc.aio would run it in a thread

    async def requests(context: _Context) -> AsyncIterator[Any]:
        while (raw := await context.receive()) is not None:
            yield parse(raw)

    async def call(stream: Stream[bytes, bytes]) -> None:
        context = _Context(stream, serialize)
        handed: Context = context  # what handlers may use: mypy checks _Context provides it
        if served.draining():
            await context.end(grpc.StatusCode.UNAVAILABLE, "the node is shutting down")
            return
        served.active += 1
        served.idle.clear()
        try:
            if streaming_in:
                arg: Any = requests(context)
            else:
                raw = await context.receive()
                if raw is None:
                    await context.abort(grpc.StatusCode.INTERNAL, "no request message")
                arg = parse(raw)
            if yields:
                async for answer in behavior(arg, handed):
                    if context.finished:
                        break  # a request stream was aborted while answers came
                    await context.send(answer)
            else:
                answer = await behavior(arg, handed)
                if not (streaming_out or context.finished):
                    await context.send(answer)
            await context.end()
        except _Aborted:
            pass
        except asyncio.CancelledError:
            if served.draining():  # the server stops: the client is told, as by grpc.aio
                await context.end(grpc.StatusCode.UNAVAILABLE, "the node is shutting down")
            raise
        except Exception as exc:
            log.exception("a client call failed: %s", exc)
            await context.end(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        finally:
            served.active -= 1
            if served.active == 0:
                served.idle.set()

    return call


async def _unimplemented(request: Any, context: _Context) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")


class ClientServer:
    """A grpclib server of `services` ((generated add_*Servicer_to_server, servicer))."""

    def __init__(self, services: Services, tls: ssl.SSLContext | None) -> None:
        self._served = _Served(services)
        self._server = Server([self._served], codec=_Bytes())
        self._tls = tls
        self._started = False

    async def start(self, address: str) -> None:
        """Listen on `address` (HOST:PORT); OSError if it cannot."""
        host, _, port = address.rpartition(":")
        await self._server.start(host.strip("[]") or None, int(port), ssl=self._tls)
        self._started = True

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls; calls in progress get `grace_s` to end, then are cancelled."""
        if not self._started:
            return
        self._served.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._served.idle.wait(), grace_s)
        self._server.close()
        await self._server.wait_closed()


def ssl_context(cfg: NodeConfig) -> ssl.SSLContext:
    """The client port's TLS, from the node's PEM files: this node's certificate, HTTP/2
    by ALPN. A client certificate is not asked for: on this port a client proves who it
    is by signing its calls (the ACL); grpc.aio's port accepts one without checking it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context
