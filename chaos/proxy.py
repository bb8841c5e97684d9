"""A small TCP fault proxy speaking (a subset of) the Toxiproxy 2.x HTTP API.

No Toxiproxy server or Docker engine is available everywhere the tests run, so this
module stands in for one: `FaultProxyServer` serves the Toxiproxy HTTP API that the
`toxiproxy-python` client uses, and forwards TCP connections through named proxies
whose "toxics" delay, throttle, blackhole, cut or reset the traffic.

It is asyncio and standard library only. Use it

* in-process from synchronous code: ``handle = start_in_thread()`` then ``handle.url``
  and ``handle.stop()`` (the server runs on its own event loop in its own thread);
* in-process from asyncio code: ``async with FaultProxyServer(port=0) as server: ...``;
* standalone: ``python -m chaos.proxy --listen 127.0.0.1:8474 [--config proxies.json]``.

HTTP API (as Toxiproxy 2.x): ``GET /version``, ``POST /reset``, ``GET|POST /proxies``,
``POST /populate``, ``GET|POST|PATCH|DELETE /proxies/{proxy}``,
``GET|POST /proxies/{proxy}/toxics``, ``GET|POST|PATCH|DELETE /proxies/{proxy}/toxics/{toxic}``.
Errors are ``{"error": message, "status": code}`` with Toxiproxy's codes and messages
(400 bad input, 404 unknown proxy/toxic, 409 duplicate name, 500 when a listener cannot bind).

Toxics (``stream`` "upstream" = client->server or "downstream" = server->client, and
``toxicity``: the probability, drawn per connection, that the toxic applies):

* ``latency`` {latency, jitter} ms: each chunk is delivered latency +/- jitter after it arrived;
* ``bandwidth`` {rate} KB/s (1 KB = 1000 bytes); rate 0 stalls the data, as in Toxiproxy;
* ``timeout`` {timeout} ms: all data is dropped; the connection is closed after `timeout`
  (0 = never). Removing the toxic closes the connections it was holding, as Toxiproxy
  does (their streams lost data);
* ``reset_peer`` {timeout} ms: on the next data (or end of stream), wait `timeout` then close
  both sockets with SO_LINGER 0, so the peers see ECONNRESET;
* ``limit_data`` {bytes}: pass that many bytes (counted per connection), then close;
* ``slow_close`` {delay} ms: delay the close that follows the end of the stream;
* ``slicer`` {average_size, size_variation, delay (µs)}: split chunks into smaller writes.

Toxics are added to, updated on and removed from live connections too. Disabling a proxy
(``POST /proxies/{name} {"enabled": false}``) closes its listener and all its connections;
enabling it listens again on the same address.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import random
import signal
import socket
import struct
import sys
import threading
import urllib.parse
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Final, Literal, TypeAlias

__all__ = [
    "TOXIC_TYPES",
    "TOXIPROXY_VERSION",
    "ApiError",
    "FaultProxyServer",
    "FaultProxyThread",
    "main",
    "start_in_thread",
]

log = logging.getLogger(__name__)

TOXIPROXY_VERSION: Final = "2.12.0"
"""The Toxiproxy version whose API this server follows (reported by GET /version)."""

# Attribute names and defaults per toxic type (Toxiproxy reports every attribute).
TOXIC_TYPES: Final[Mapping[str, Mapping[str, int]]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}

_READ_CHUNK: Final = 32 * 1024
_HIGH_WATER: Final = 4 * 1024 * 1024  # bytes a link holds before it stops reading its source
_CONNECT_TIMEOUT_S: Final = 10.0
_MAX_BODY: Final = 1 << 20
_MAX_LINE: Final = 64 * 1024

Direction: TypeAlias = Literal["upstream", "downstream"]
Json: TypeAlias = Any


class ApiError(Exception):
    """An API failure carrying Toxiproxy's message and HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def body(self) -> dict[str, Json]:
        return {"error": self.message, "status": self.status}


def _bad_body(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def _missing(what: str) -> ApiError:
    return ApiError(f"missing required field: {what}", 400)


_PROXY_NOT_FOUND: Final = ("proxy not found", 404)
_TOXIC_NOT_FOUND: Final = ("toxic not found", 404)


# --------------------------------------------------------------------------- addresses


def _split_hostport(address: str) -> tuple[str, int]:
    """ "host:port", "[v6]:port" or ":port" -> (host, port); ValueError when malformed.

    An empty address means any interface, any port (as Go's net.Listen).
    """
    host, sep, port_s = (address or ":0").rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"address {address}: invalid port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, port


def _format_hostport(sockname: Any) -> str:
    host, port = str(sockname[0]), int(sockname[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _bind(address: str) -> socket.socket:
    """A listening, non-blocking socket on one resolved address (port 0 = any free port)."""
    try:
        host, port = _split_hostport(address)
    except ValueError as exc:
        raise ApiError(f"listen tcp {exc}", 500) from None
    return await _bind_hostport(host, port, address)


async def _bind_hostport(host: str, port: int, address: str) -> socket.socket:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ApiError(f"listen tcp {address}: {exc}", 500) from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ApiError(f"listen tcp {address}: {exc.strerror or exc}", 500) from None
    return sock


# --------------------------------------------------------------------------- toxics


@dataclass(frozen=True)
class _ToxicSpec:
    name: str
    type: str
    stream: str  # as given by the client
    direction: Direction
    toxicity: float
    attributes: Mapping[str, int]

    def to_json(self) -> dict[str, Json]:
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
        }


def _as_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_body(f"attribute {key!r} must be an integer")
    if isinstance(value, float) and not value.is_integer():
        raise _bad_body(f"attribute {key!r} must be an integer")
    return int(value)


def _as_toxicity(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_body("toxicity must be a number")
    return float(value)


def _merge_attributes(base: Mapping[str, int], given: object) -> dict[str, int]:
    if given is None:
        return dict(base)
    if not isinstance(given, dict):
        raise _bad_body("attributes must be an object")
    merged = dict(base)
    for key in base:  # unknown attributes are ignored, as Toxiproxy's JSON decoding does
        if key in given:
            merged[key] = _as_int(key, given[key])
    return merged


def _parse_toxic(body: Json) -> _ToxicSpec:
    """Validate a toxic-create body the way Toxiproxy's AddToxicJson does (same order)."""
    if not isinstance(body, dict):
        raise _bad_body("expected a JSON object")
    stream = body.get("stream", "downstream")
    if not isinstance(stream, str):
        raise _bad_body("stream must be a string")
    direction = stream.lower()
    if direction not in ("upstream", "downstream"):
        raise ApiError("stream was invalid, can be either upstream or downstream", 400)
    kind = body.get("type", "")
    name = body.get("name") or f"{kind}_{stream}"
    if not isinstance(kind, str) or not isinstance(name, str):
        raise _bad_body("name and type must be strings")
    if kind not in TOXIC_TYPES:
        raise ApiError("invalid toxic type", 400)
    toxicity = _as_toxicity(body.get("toxicity", 1.0))
    return _ToxicSpec(
        name=name,
        type=kind,
        stream=stream,
        direction="upstream" if direction == "upstream" else "downstream",
        toxicity=toxicity,
        attributes=_merge_attributes(TOXIC_TYPES[kind], body.get("attributes")),
    )


def _slice_sizes(total: int, average: int, variation: int) -> list[int]:
    """Piece sizes for the slicer toxic: split in about halves until near `average`."""
    sizes: list[int] = []
    stack = [(0, total)]
    while stack:
        start, end = stack.pop()
        if (end - start) - average <= variation or end - start <= 1:
            if end > start:
                sizes.append(end - start)
            continue
        jitter = random.randrange(2 * variation) - variation if variation > 0 else 0
        mid = min(max(start + (end - start) // 2 + jitter, start + 1), end - 1)
        stack.append((mid, end))
        stack.append((start, mid))
    return sizes


@dataclass
class _Chunk:
    data: bytes
    ts: float  # loop time it entered the current stage


_Item: TypeAlias = _Chunk | None  # None = end of stream
_Queue: TypeAlias = "asyncio.Queue[_Item]"


class _Stage:
    """One toxic on one link: reads its input queue, writes the next stage's queue.

    Queues are unbounded, so emitting never blocks and a stage is only ever suspended
    in `_take` or in a toxic's own wait. A chunk taken from the input queue is held in
    `held` (in the same event-loop step) until it is emitted or dropped; interrupting the
    stage cancels its task and hands back `held`, so live re-wiring loses nothing.
    """

    def __init__(self, link: _Link, spec: _ToxicSpec | None) -> None:
        self.link = link
        self.spec = spec  # None: the link's head stage, a no-op
        self.inq: _Queue = asyncio.Queue()
        self.out: _Queue = link.tail
        self.held: _Chunk | None = None
        self.state: dict[str, int] = {}  # survives updates (limit_data's byte count)
        self.task: asyncio.Task[None] | None = None
        self.active = False
        self.closed = False  # it has emitted the end of stream

    # -- control (called from other tasks; all synchronous)

    def start(self) -> None:
        self.active = self.spec is not None and random.random() < self.spec.toxicity
        self.task = self.link.spawn(self._run(), f"{self.link.name}/{self.describe()}")

    def interrupt(self) -> _Chunk | None:
        """Stop the running toxic; return the chunk it was holding (not yet emitted)."""
        if self.task is not None:
            self.task.cancel()
            self.task = None
        held, self.held = self.held, None
        return held

    def describe(self) -> str:
        return "head" if self.spec is None else self.spec.name

    # -- helpers used by the running toxic (each checks it is still the current run)

    def _current(self) -> None:
        if self.task is None or asyncio.current_task() is not self.task:
            raise asyncio.CancelledError  # a stale run woke up after an interrupt

    async def _take(self) -> _Chunk | None:
        item = await self.inq.get()
        self._current()
        self.held = item
        return item

    def _emit(self, size: int | None = None) -> None:
        self._current()
        chunk = self.held
        assert chunk is not None
        now = asyncio.get_running_loop().time()
        if size is None or size >= len(chunk.data):
            self.out.put_nowait(_Chunk(chunk.data, now))
            self.held = None
        else:
            self.out.put_nowait(_Chunk(chunk.data[:size], now))
            self.held = _Chunk(chunk.data[size:], chunk.ts)

    def _drop(self) -> None:
        self._current()
        if self.held is not None:
            self.link.release(len(self.held.data))
            self.held = None

    def _finish(self) -> None:
        self._current()
        self.closed = True
        self.out.put_nowait(None)

    # -- toxics

    async def _run(self) -> None:
        spec = self.spec
        if spec is None or not self.active:
            await self._noop()
            return
        attrs = spec.attributes
        match spec.type:
            case "latency":
                await self._latency(attrs["latency"], attrs["jitter"])
            case "bandwidth":
                await self._bandwidth(attrs["rate"])
            case "timeout":
                await self._timeout(attrs["timeout"])
            case "reset_peer":
                await self._reset_peer(attrs["timeout"])
            case "limit_data":
                await self._limit_data(attrs["bytes"])
            case "slow_close":
                await self._slow_close(attrs["delay"])
            case "slicer":
                await self._slicer(attrs["average_size"], attrs["size_variation"], attrs["delay"])
            case _:  # pragma: no cover - types are validated on creation
                await self._noop()

    async def _noop(self) -> None:
        while await self._take() is not None:
            self._emit()
        self._finish()

    async def _latency(self, latency_ms: int, jitter_ms: int) -> None:
        loop = asyncio.get_running_loop()
        while (chunk := await self._take()) is not None:
            delay = latency_ms
            if jitter_ms > 0:
                delay += random.randrange(2 * jitter_ms) - jitter_ms
            wait = chunk.ts + delay / 1000 - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._emit()
        self._finish()

    async def _bandwidth(self, rate_kb_s: int) -> None:
        loop = asyncio.get_running_loop()
        release = loop.time()
        while await self._take() is not None:
            if rate_kb_s <= 0:  # Toxiproxy never lets data through at rate 0
                await loop.create_future()
            piece = rate_kb_s * 100  # bytes per 100 ms
            while self.held is not None:
                size = min(len(self.held.data), piece)
                release = max(release, loop.time()) + size / (rate_kb_s * 1000)
                await asyncio.sleep(max(0.0, release - loop.time()))
                self._emit(size)
        self._finish()

    async def _timeout(self, timeout_ms: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000 if timeout_ms > 0 else None
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await self._take()
            except TimeoutError:
                break
            if chunk is None:
                break
            self._drop()
        self._finish()

    async def _reset_peer(self, timeout_ms: int) -> None:
        if await self._take() is not None:
            self._drop()
        if timeout_ms > 0:
            await asyncio.sleep(timeout_ms / 1000)
        self._current()
        self.closed = True
        self.link.conn.reset()

    async def _limit_data(self, limit: int) -> None:
        while (chunk := await self._take()) is not None:
            sent = self.state.get("sent", 0)
            remaining = max(0, limit - sent)
            passed = min(remaining, len(chunk.data))
            if passed:
                self._emit(passed)
            self._drop()
            self.state["sent"] = sent + passed
            if limit - self.state["sent"] <= 0:
                break
        self._finish()

    async def _slow_close(self, delay_ms: int) -> None:
        while await self._take() is not None:
            self._emit()
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        self._finish()

    async def _slicer(self, average: int, variation: int, delay_us: int) -> None:
        while (chunk := await self._take()) is not None:
            if average <= 0:
                self._emit()
                continue
            for size in _slice_sizes(len(chunk.data), average, variation):
                self._emit(size)
                if delay_us > 0:
                    await asyncio.sleep(delay_us / 1_000_000)
        self._finish()


class _Link:
    """One direction of a connection: source reader -> stages -> destination writer."""

    def __init__(
        self,
        conn: _Connection,
        direction: Direction,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
        specs: Iterable[_ToxicSpec],
    ) -> None:
        self.conn = conn
        self.direction = direction
        self.name = f"{conn.proxy.name}/{conn.peer}/{direction}"
        self.source = source
        self.dest = dest
        self.tail: _Queue = asyncio.Queue()
        self.stages = [_Stage(self, None)]
        for spec in specs:
            self._append(spec)
        self.tasks: set[asyncio.Task[None]] = set()
        self.buffered = 0
        self.space = asyncio.Event()
        self.space.set()
        self.closed = False  # the connection is being torn down: start nothing new
        self.writer: asyncio.Task[None] | None = None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def start(self) -> None:
        for stage in self.stages:
            stage.start()
        self.spawn(self._read(), f"{self.name}/read")
        self.writer = self.spawn(self._write(), f"{self.name}/write")

    def release(self, size: int) -> None:
        self.buffered -= size
        if self.buffered < _HIGH_WATER:
            self.space.set()

    # -- toxic changes on the live link (synchronous: nothing interleaves)

    def _append(self, spec: _ToxicSpec) -> _Stage:
        stage = _Stage(self, spec)
        self.stages[-1].out = stage.inq
        self.stages.append(stage)
        return stage

    def _find(self, name: str) -> int | None:
        for i, stage in enumerate(self.stages):
            if stage.spec is not None and stage.spec.name == name:
                return i
        return None

    def add_toxic(self, spec: _ToxicSpec) -> None:
        if not self.closed:
            self._append(spec).start()

    def update_toxic(self, spec: _ToxicSpec) -> None:
        i = self._find(spec.name)
        if i is None:
            return
        stage = self.stages[i]
        stage.spec = spec
        if stage.closed or self.closed:
            return
        held = stage.interrupt()
        if held is not None:  # flushed without the toxic's effect, as Toxiproxy does
            stage.out.put_nowait(held)
        stage.start()

    def remove_toxic(self, name: str) -> None:
        i = self._find(name)
        if i is None:
            return
        stage = self.stages[i]
        held = stage.interrupt()
        pending: list[_Item] = [] if held is None else [held]
        while not stage.inq.empty():
            pending.append(stage.inq.get_nowait())
        timeout = stage.active and stage.spec is not None and stage.spec.type == "timeout"
        if stage.closed or timeout:
            # A closed stage passes nothing on. Removing an active timeout closes the
            # connection (Toxiproxy's TimeoutToxic.Cleanup): its stream has lost data.
            for item in pending:
                if item is not None:
                    self.release(len(item.data))
            if not stage.closed:
                stage.closed = True
                stage.out.put_nowait(None)
        else:
            for item in pending:
                stage.out.put_nowait(item)
        self.stages[i - 1].out = stage.out
        del self.stages[i]

    # -- pumps

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        head = self.stages[0]
        try:
            while True:
                while self.buffered >= _HIGH_WATER:
                    self.space.clear()
                    await self.space.wait()
                data = await self.source.read(_READ_CHUNK)
                if not data:
                    break
                self.buffered += len(data)
                head.inq.put_nowait(_Chunk(data, loop.time()))
        except OSError:
            pass
        head.inq.put_nowait(None)

    async def _write(self) -> None:
        try:
            while (chunk := await self.tail.get()) is not None:
                self.dest.write(chunk.data)
                await self.dest.drain()
                self.release(len(chunk.data))
        except OSError:
            pass
        self.dest.close()  # like Toxiproxy: the destination is closed, not half-closed


class _Connection:
    """A client connection and its upstream connection, joined by two links."""

    def __init__(
        self,
        proxy: _Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.writers = (client[1], upstream[1])
        peer = client[1].get_extra_info("peername")
        self.peer = _format_hostport(peer) if peer else "?"
        for writer in self.writers:
            # Like Go's synchronous writes: drain() waits until the kernel has the data.
            writer.transport.set_write_buffer_limits(0)
        self.links: dict[Direction, _Link] = {
            "upstream": _Link(self, "upstream", client[0], upstream[1], proxy.specs("upstream")),
            "downstream": _Link(
                self, "downstream", upstream[0], client[1], proxy.specs("downstream")
            ),
        }
        self.task: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        self.task = asyncio.current_task()
        try:
            for link in self.links.values():
                link.start()
            writers = [link.writer for link in self.links.values() if link.writer is not None]
            await asyncio.gather(*writers)
        finally:
            for link in self.links.values():
                link.closed = True
            tasks = [t for link in self.links.values() for t in link.tasks]
            for task in tasks:
                task.cancel()
            for writer in self.writers:
                writer.transport.abort()
            await _wait_out(tasks)

    def reset(self) -> None:
        """Close both sockets with SO_LINGER 0 (the peers get RST) and end the connection."""
        for writer in self.writers:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        if self.task is not None:
            self.task.cancel()


async def _wait_out(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Wait until the (already cancelled) tasks end, even if this wait is cancelled too."""
    pending = set(tasks)
    interrupted = False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError


# --------------------------------------------------------------------------- proxies


@dataclass(eq=False)
class _Proxy:
    name: str
    listen: str
    upstream: str
    enabled: bool = False
    toxics: dict[str, _ToxicSpec] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _generation: int = 0
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    _conns: set[_Connection] = field(default_factory=set)

    def to_json(self) -> dict[str, Json]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics_json(),
        }

    def toxics_json(self) -> list[dict[str, Json]]:
        return [t.to_json() for d in ("upstream", "downstream") for t in self.specs(d)]

    def specs(self, direction: Direction) -> list[_ToxicSpec]:
        return [t for t in self.toxics.values() if t.direction == direction]

    # -- listening

    async def start(self) -> None:
        if self.enabled:
            return
        sock = await _bind(self.listen)
        self._generation += 1
        accept = functools.partial(self._accept, self._generation)
        try:
            self._server = await asyncio.start_server(accept, sock=sock)
        except BaseException:
            sock.close()
            raise
        self.listen = _format_hostport(sock.getsockname())
        self.enabled = True
        log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    async def stop(self) -> None:
        """Close the listener and every connection (a partition)."""
        if not self.enabled:
            return
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        log.info("proxy %s stopped", self.name)

    def _accept(
        self, generation: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if not self.enabled or generation != self._generation:
            writer.transport.abort()  # accepted just before the listener was closed
            return
        task = asyncio.get_running_loop().create_task(
            self._serve(reader, writer), name=f"proxy {self.name} connection"
        )
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            host, port = _split_hostport(self.upstream)
            async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                upstream = await asyncio.open_connection(host, port)
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("proxy %s: cannot reach upstream %s: %s", self.name, self.upstream, exc)
            writer.transport.abort()
            return
        except BaseException:
            writer.transport.abort()
            raise
        conn = _Connection(self, (reader, writer), upstream)
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)

    # -- toxics

    def add_toxic(self, spec: _ToxicSpec) -> None:
        self.toxics[spec.name] = spec
        for conn in list(self._conns):
            conn.links[spec.direction].add_toxic(spec)

    def update_toxic(self, spec: _ToxicSpec) -> None:
        self.toxics[spec.name] = spec
        for conn in list(self._conns):
            conn.links[spec.direction].update_toxic(spec)

    def remove_toxic(self, name: str) -> None:
        spec = self.toxics.pop(name)
        for conn in list(self._conns):
            conn.links[spec.direction].remove_toxic(name)


# --------------------------------------------------------------------------- server


def _str_field(body: Mapping[str, Json], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise _bad_body(f"{key} must be a string")
    return value


def _bool_field(body: Mapping[str, Json], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise _bad_body(f"{key} must be a boolean")
    return value


def _object(body: Json) -> dict[str, Json]:
    if not isinstance(body, dict):
        raise _bad_body("expected a JSON object")
    return body


_REASONS: Final = {
    100: "Continue",
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    500: "Internal Server Error",
}


class FaultProxyServer:
    """The fault proxy: a Toxiproxy-compatible HTTP API plus the TCP proxies it manages.

    Create it inside a running event loop's thread; ``await start()`` binds the API
    (port 0 picks a free port, see `port`/`url`), ``await stop()`` closes the API, every
    proxy listener and every proxied connection. All state lives on that loop.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8474) -> None:
        self._host = host
        self._port = port
        self._proxies: dict[str, _Proxy] = {}
        self._lock = asyncio.Lock()
        self._api: asyncio.Server | None = None
        self._api_tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle

    async def start(self) -> None:
        if self._api is not None:
            raise RuntimeError("already started")
        try:
            sock = await _bind_hostport(self._host, self._port, f"{self._host}:{self._port}")
        except ApiError as exc:
            raise OSError(exc.message) from None
        self._api = await asyncio.start_server(self._accept_api, sock=sock)
        self._host, self._port = _split_hostport(_format_hostport(sock.getsockname()))
        log.info("fault proxy API listening on %s", self.url)

    async def stop(self) -> None:
        api, self._api = self._api, None
        if api is not None:
            api.close()
        tasks = list(self._api_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        async with self._lock:
            proxies = list(self._proxies.values())
            self._proxies.clear()
            await asyncio.gather(*(p.stop() for p in proxies))
        if api is not None:
            await api.wait_closed()

    async def __aenter__(self) -> FaultProxyServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    # -- operations (also usable directly from asyncio code; they return the API's JSON)

    async def populate(self, proxies: Json) -> list[dict[str, Json]]:
        """Create or replace proxies (POST /populate); return the resulting proxies."""
        async with self._lock:
            return await self._populate(proxies)

    async def _populate(self, body: Json) -> list[dict[str, Json]]:
        if not isinstance(body, list):
            raise _bad_body("expected a JSON array of proxies")
        wanted: list[tuple[_Proxy, bool]] = []
        names: set[str] = set()
        for i, raw in enumerate(body, start=1):
            item = _object(raw)
            name = _str_field(item, "name", "")
            upstream = _str_field(item, "upstream", "")
            if not name:
                raise _missing(f"name at proxy {i}")
            if not upstream:
                raise _missing(f"upstream at proxy {i}")
            if name in names:
                raise ApiError(f"duplicate proxy name {name!r}", 400)
            names.add(name)
            proxy = _Proxy(name, _str_field(item, "listen", ""), upstream)
            wanted.append((proxy, _bool_field(item, "enabled", True)))
        done: list[dict[str, Json]] = []
        for proxy, enabled in wanted:
            existing = self._proxies.get(proxy.name)
            if existing is not None:
                if existing.listen == proxy.listen and existing.upstream == proxy.upstream:
                    done.append(existing.to_json())
                    continue
                await existing.stop()
                del self._proxies[proxy.name]
            if enabled:
                await proxy.start()
            self._proxies[proxy.name] = proxy
            done.append(proxy.to_json())
        return done

    def _proxy(self, name: str) -> _Proxy:
        proxy = self._proxies.get(name)
        if proxy is None:
            raise ApiError(*_PROXY_NOT_FOUND)
        return proxy

    async def _create_proxy(self, body: Json) -> dict[str, Json]:
        body = _object(body)
        name = _str_field(body, "name", "")
        listen = _str_field(body, "listen", "")
        upstream = _str_field(body, "upstream", "")
        enabled = _bool_field(body, "enabled", True)
        if not name:
            raise _missing("name")
        if not upstream:
            raise _missing("upstream")
        if name in self._proxies:
            raise ApiError("proxy already exists", 409)
        proxy = _Proxy(name, listen, upstream)
        if enabled:
            await proxy.start()
        self._proxies[name] = proxy
        return proxy.to_json()

    async def _update_proxy(self, proxy: _Proxy, body: Json) -> dict[str, Json]:
        body = _object(body)
        listen = _str_field(body, "listen", proxy.listen)
        upstream = _str_field(body, "upstream", proxy.upstream)
        enabled = _bool_field(body, "enabled", proxy.enabled)
        if listen != proxy.listen or upstream != proxy.upstream:  # restart, as Toxiproxy
            await proxy.stop()
            proxy.listen, proxy.upstream = listen, upstream
        if enabled and not proxy.enabled:
            await proxy.start()
        elif not enabled and proxy.enabled:
            await proxy.stop()
        return proxy.to_json()

    async def _reset(self) -> None:
        for proxy in self._proxies.values():
            await proxy.start()
            for name in list(proxy.toxics):
                proxy.remove_toxic(name)

    def _add_toxic(self, proxy: _Proxy, body: Json) -> dict[str, Json]:
        spec = _parse_toxic(body)
        if spec.name in proxy.toxics:
            raise ApiError("toxic already exists", 409)
        proxy.add_toxic(spec)
        return spec.to_json()

    def _update_toxic(self, proxy: _Proxy, name: str, body: Json) -> dict[str, Json]:
        spec = proxy.toxics.get(name)
        if spec is None:
            raise ApiError(*_TOXIC_NOT_FOUND)
        body = _object(body)
        spec = replace(
            spec,
            attributes=_merge_attributes(spec.attributes, body.get("attributes")),
            toxicity=_as_toxicity(body.get("toxicity", spec.toxicity)),
        )
        proxy.update_toxic(spec)
        return spec.to_json()

    # -- HTTP routing

    async def _dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Json]:
        parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]

        def parsed() -> Json:
            if not body.strip():
                raise _bad_body("EOF")
            try:
                return json.loads(body)
            except (ValueError, UnicodeDecodeError) as exc:
                raise _bad_body(str(exc)) from None

        if parts == ["version"]:
            _allow(method, "GET")
            return 200, {"version": TOXIPROXY_VERSION}
        async with self._lock:
            if parts == ["reset"]:
                _allow(method, "POST")
                await self._reset()
                return 204, None
            if parts == ["populate"]:
                _allow(method, "POST")
                try:
                    return 201, {"proxies": await self._populate(parsed())}
                except ApiError as exc:
                    return exc.status, {**exc.body(), "proxies": []}
            if parts == ["proxies"]:
                _allow(method, "GET", "POST")
                if method == "GET":
                    return 200, {n: p.to_json() for n, p in self._proxies.items()}
                return 201, await self._create_proxy(parsed())
            if len(parts) == 2 and parts[0] == "proxies" and parts[1]:
                _allow(method, "GET", "POST", "PATCH", "DELETE")
                proxy = self._proxy(parts[1])
                if method == "GET":
                    return 200, proxy.to_json()
                if method == "DELETE":
                    await proxy.stop()
                    del self._proxies[proxy.name]
                    return 204, None
                return 200, await self._update_proxy(proxy, parsed())
            if len(parts) == 3 and parts[0] == "proxies" and parts[2] == "toxics":
                _allow(method, "GET", "POST")
                proxy = self._proxy(parts[1])
                if method == "GET":
                    return 200, proxy.toxics_json()
                return 200, self._add_toxic(proxy, parsed())
            if len(parts) == 4 and parts[0] == "proxies" and parts[2] == "toxics" and parts[3]:
                _allow(method, "GET", "POST", "PATCH", "DELETE")
                proxy = self._proxy(parts[1])
                if method in ("POST", "PATCH"):
                    return 200, self._update_toxic(proxy, parts[3], parsed())
                spec = proxy.toxics.get(parts[3])
                if spec is None:
                    raise ApiError(*_TOXIC_NOT_FOUND)
                if method == "GET":
                    return 200, spec.to_json()
                proxy.remove_toxic(spec.name)
                return 204, None
        raise ApiError("404 page not found", 404)

    # -- HTTP/1.1 plumbing

    def _accept_api(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._api is None:
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(
            self._serve_api(reader, writer), name="fault proxy API connection"
        )
        self._api_tasks.add(task)
        task.add_done_callback(self._api_tasks.discard)

    async def _serve_api(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._serve_request(reader, writer):
                pass
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.transport.abort()

    async def _serve_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; False when the connection should close."""
        line = await reader.readline()
        while line in (b"\r\n", b"\n"):
            line = await reader.readline()
        if not line:
            return False
        words = line.decode("latin-1").split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            await self._respond(writer, 400, ApiError("malformed request", 400).body(), False)
            return False
        method, target, version = words
        headers: dict[str, str] = {}
        while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
            if len(headers) > 100:
                raise ValueError("too many headers")
            key, _, value = header.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader)
        else:
            length = int(headers.get("content-length", "0") or "0")
            if not 0 <= length <= _MAX_BODY:
                await self._respond(writer, 413, ApiError("body too large", 413).body(), False)
                return False
            body = await reader.readexactly(length)
        path = urllib.parse.urlsplit(target).path or "/"
        try:
            status, payload = await self._dispatch(method.upper(), path, body)
        except ApiError as exc:
            status, payload = exc.status, exc.body()
        except Exception as exc:
            log.exception("fault proxy API: %s %s failed", method, path)
            status, payload = 500, ApiError(f"{type(exc).__name__}: {exc}", 500).body()
        await self._respond(writer, status, payload, keep)
        return keep

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter, status: int, payload: Json, keep: bool
    ) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
        data = b""
        if status != 204:
            data = json.dumps(payload).encode() + b"\n"
            lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
        if not keep:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
        await writer.drain()


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise ApiError(f"method {method} not allowed", 405)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readline()
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(body)
        if len(body) + size > _MAX_BODY:
            raise ValueError("body too large")
        body += await reader.readexactly(size)
        await reader.readline()


# --------------------------------------------------------------------------- threads


class FaultProxyThread:
    """A `FaultProxyServer` running on its own event loop in a daemon thread."""

    def __init__(self, host: str, port: int, proxies: Json = None) -> None:
        self._host = host
        self._port = port
        self._proxies = proxies
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._server: FaultProxyServer | None = None
        self.leftover_tasks: list[str] = []
        """Tasks still alive on the loop after the server stopped (empty when clean)."""
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    def _start(self, timeout_s: float) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.stop()
            raise RuntimeError("fault proxy did not start in time")
        if self._error is not None:
            self._thread.join(timeout_s)
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
            else:  # pragma: no cover - logged, the thread is ending anyway
                log.exception("fault proxy thread failed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = FaultProxyServer(self._host, self._port)
        await server.start()
        try:
            if self._proxies is not None:
                await server.populate(self._proxies)
            self._server = server
            self._ready.set()
            await self._stop.wait()
        finally:
            await server.stop()
            me = asyncio.current_task()
            self.leftover_tasks = [repr(t) for t in asyncio.all_tasks() if t is not me]

    @property
    def server(self) -> FaultProxyServer:
        assert self._server is not None
        return self._server

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (closing every socket) and join the thread. Idempotent."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already finished
                loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise RuntimeError("fault proxy thread did not stop in time")

    def __enter__(self) -> FaultProxyThread:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_in_thread(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    proxies: Sequence[Mapping[str, Json]] | None = None,
    timeout_s: float = 10.0,
) -> FaultProxyThread:
    """Start a fault proxy on its own loop in a daemon thread; return once it listens.

    `proxies` (the /populate format, e.g. docker/toxiproxy.json) are created first.
    Call ``.stop()`` (or use the handle as a context manager) to shut it down.
    """
    handle = FaultProxyThread(host, port, list(proxies) if proxies is not None else None)
    handle._start(timeout_s)
    return handle


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chaos.proxy``: serve until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m chaos.proxy",
        description="A Toxiproxy-compatible TCP fault proxy (Toxiproxy 2.x HTTP API subset).",
    )
    parser.add_argument(
        "--listen", default=None, help="API address HOST:PORT (default 127.0.0.1:8474)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="API host (without --listen)")
    parser.add_argument("--port", type=int, default=8474, help="API port (without --listen)")
    parser.add_argument("--config", default=None, help="JSON file of proxies to create at start")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    host, port = args.host, args.port
    if args.listen is not None:
        try:
            host, port = _split_hostport(args.listen)
        except ValueError as exc:
            parser.error(str(exc))
    proxies: Json = None
    if args.config is not None:
        with open(args.config, encoding="utf-8") as f:
            proxies = json.load(f)
    try:
        asyncio.run(_serve_cli(host, port, proxies))
    except OSError as exc:
        print(f"fault proxy: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve_cli(host: str, port: int, proxies: Json) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with FaultProxyServer(host, port) as server:
        if proxies is not None:
            try:
                created = await server.populate(proxies)
                log.info("populated %d proxies from config", len(created))
            except ApiError as exc:
                log.error("failed to populate proxies from config: %s", exc.message)
        print(f"fault proxy listening on {server.url}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    sys.exit(main())
