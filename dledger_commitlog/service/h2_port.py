"""The client port on h2grpc: the handlers grpc.aio would serve, every frame parsed on the loop.

grpc.aio hands each message between its C-core threads and the event loop; h2grpc
parses a connection's frames in the loop's own read callback, so a call is parsed,
handled and answered on the node's loop with no thread between. This module serves
the very `grpc.RpcMethodHandler`s that `decoding.checked_handlers` makes for
grpc.aio (the client service, grpc_health's servicer), so nothing is written twice:

- requests are parsed by the handler's own deserializer (an `Undecodable` stays
  INVALID_ARGUMENT naming the field, `decoding`), answers by its serializer;
- each handler gets `_Context`, the part of grpc.aio.ServicerContext the service
  uses (`base.Context`, which mypy checks it against): abort with a status and a
  message (and the trailing metadata set, e.g. the leader hint), invocation
  metadata, initial metadata, the time remaining, the peer, `write`;
- a message over MAX_MESSAGE_BYTES either way is RESOURCE_EXHAUSTED (a request's by
  its length prefix, before its bytes are kept), as grpc.aio with GRPC_OPTIONS says;
- an unexpected exception is UNKNOWN "Unexpected <type>: <text>", as on grpc.aio; a
  call the client cancels (or whose connection ends) cancels its handler, and one
  whose deadline passes is DEADLINE_EXCEEDED.

Invariant: a call ends with at most one status, sent once (`ServerCall.finish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

import h2grpc
from dledger_commitlog.node.config import NodeConfig
from dledger_commitlog.service.base import Context, Metadata
from dledger_commitlog.service.decoding import Services, checked_handlers
from h2grpc.stream import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)


class _Aborted(Exception):
    """The call was ended with a status (`_Context.abort`); nothing more is sent."""


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Context:
    """An h2grpc call seen as the part of grpc.aio.ServicerContext handlers use."""

    __slots__ = ("_call", "_serialize", "_trailing")

    def __init__(self, call: h2grpc.ServerCall, serialize: Callable[[Any], bytes]) -> None:
        self._call = call
        self._serialize = serialize
        self._trailing: Metadata = ()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        self.end(code, details)
        raise _Aborted(details)

    def invocation_metadata(self) -> Metadata | None:
        return self._call.metadata

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailing = tuple(metadata)

    async def send_initial_metadata(self, metadata: Metadata) -> None:
        self._call.send_initial_metadata([(k, _text(v)) for k, v in metadata])

    async def write(self, message: Any) -> None:
        await self.send(message)

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    def peer(self) -> str:
        return self._call.peer()

    # -- what the adapter itself uses ------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._call.finished

    async def send(self, message: Any) -> None:
        data = self._serialize(message)
        if len(data) > MAX_MESSAGE_BYTES:
            await self.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(data)} vs. {MAX_MESSAGE_BYTES})",
            )
        call = self._call
        call.send_message(data)
        if call.stream.sending or call.conn.paused:
            await call.drain()

    def end(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        """Send the status (with the trailing metadata set), unless one was sent."""
        trailing = [(k, _text(v)) for k, v in self._trailing]
        self._call.finish(code.value[0], details, trailing)

    async def receive(self) -> bytes | None:
        """The next request's bytes, None at the end of the request stream."""
        return await self._call.read()


class _Served:
    """The handlers of services by path; counts the calls in progress and, once
    draining, refuses new ones (UNAVAILABLE, as grpc.aio does)."""

    def __init__(self, services: Services) -> None:
        self.active = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.draining = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._mapping: dict[str, Callable[[h2grpc.ServerCall], Any]] = {}
        for service, handlers in checked_handlers(services):
            for name, handler in handlers.items():
                self._mapping[f"/{service}/{name}"] = _runner(handler, self)

    def handle(self, call: h2grpc.ServerCall) -> None:
        """A call's headers came: its handler runs in a task of its own."""
        run = self._mapping.get(call.method)
        if run is None:
            call.finish(grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
            return
        if self.draining:
            call.finish(grpc.StatusCode.UNAVAILABLE.value[0], "the node is shutting down")
            return
        task = asyncio.get_running_loop().create_task(run(call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def cancelled(stream: h2grpc.Stream) -> None:
            if stream.error is not None and not call.finished:
                task.cancel()  # the client reset the call, or its connection ended

        call.stream.on_event = cancelled

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _runner(handler: Any, served: _Served) -> Callable[[h2grpc.ServerCall], Any]:
    """The coroutine that runs one grpc.RpcMethodHandler for a call (see the module doc)."""
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

    async def serve(call: h2grpc.ServerCall, context: _Context) -> None:
        handed: Context = context  # what handlers may use: mypy checks _Context provides it
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
        context.end()

    async def run(call: h2grpc.ServerCall) -> None:
        context = _Context(call, serialize)
        served.active += 1
        served.idle.clear()
        try:
            if call.deadline is None:
                await serve(call, context)
            else:
                async with asyncio.timeout_at(call.deadline):
                    await serve(call, context)
        except _Aborted:
            pass
        except TimeoutError:
            context.end(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except asyncio.CancelledError:
            if served.draining:  # the server stops: the client is told, as by grpc.aio
                context.end(grpc.StatusCode.UNAVAILABLE, "the node is shutting down")
            raise
        except h2grpc.ConnectionLost:
            pass  # the client is gone: nobody to answer
        except Exception as exc:
            log.exception("a client call failed: %s", exc)
            context.end(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        finally:
            served.active -= 1
            if served.active == 0:
                served.idle.set()

    return run


async def _unimplemented(request: Any, context: _Context) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")


class ClientServer:
    """An h2grpc server of `services` ((generated add_*Servicer_to_server, servicer))."""

    def __init__(self, services: Services, tls: ssl.SSLContext | None) -> None:
        self._served = _Served(services)
        self._server = h2grpc.Server(self._served.handle, ssl_context=tls)
        self._started = False

    async def start(self, address: str) -> int:
        """Listen on `address` (HOST:PORT; port 0: any free one); the port bound. OSError
        if it cannot."""
        sock = h2grpc.bind(address)
        await self._server.start(sock)
        self._started = True
        port: int = sock.getsockname()[1]
        return port

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls; calls in progress get `grace_s` to end, then are cancelled."""
        if not self._started:
            return
        self._served.draining = True
        self._server.drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self._served.idle.wait()
        self._served.cancel_all()
        await self._server.close(0.1)


def ssl_context(cfg: NodeConfig) -> ssl.SSLContext:
    """The client port's TLS, from the node's PEM files: this node's certificate, HTTP/2
    by ALPN. A client certificate is not asked for: on this port a client proves who it
    is by signing its calls (the ACL); grpc.aio's port accepts one without checking it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context
