"""The fault proxy's data path: the bytes of one proxied connection and what toxics do to them.

A `Connection` joins a client's socket to its upstream socket by two links, "upstream"
(client -> server) and "downstream" (server -> client). A link pumps its source through
a chain of stages, one per toxic on that direction, into its destination. What each
toxic does (``toxicity`` is the probability, drawn per connection, that it applies):

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

Toxics are added to, updated on and removed from live links too. Invariants: such a
change loses no byte that no toxic dropped, and reorders none (removing a `timeout`
closes the connection, as said above); a link stops reading its source while it holds
`_HIGH_WATER_BYTES` not yet written; a write counts as done once the kernel has the
data; the end of a stream closes the destination, never half-closes it. Nothing here
parses JSON or listens: `proxies` owns the listeners, `api` the HTTP surface.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

__all__ = [
    "TOXIC_TYPES",
    "Connection",
    "Direction",
    "Json",
    "ToxicSpec",
]

Direction: TypeAlias = Literal["upstream", "downstream"]
Json: TypeAlias = Any  # a decoded JSON value, as the API exchanges them

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

_READ_CHUNK_BYTES: Final = 32 * 1024
_HIGH_WATER_BYTES: Final = 4 * 1024 * 1024  # a link holding this much stops reading its source


@dataclass(frozen=True)
class ToxicSpec:
    """A toxic as the API created it; an update replaces it with a new one."""

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

    def __init__(self, link: _Link, spec: ToxicSpec | None) -> None:
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
        conn: Connection,
        direction: Direction,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
        specs: Iterable[ToxicSpec],
    ) -> None:
        self.conn = conn
        self.direction = direction
        self.name = f"{conn.name}/{direction}"
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
        if self.buffered < _HIGH_WATER_BYTES:
            self.space.set()

    # -- toxic changes on the live link (synchronous: nothing interleaves)

    def _append(self, spec: ToxicSpec) -> _Stage:
        stage = _Stage(self, spec)
        self.stages[-1].out = stage.inq
        self.stages.append(stage)
        return stage

    def _find(self, name: str) -> int | None:
        for i, stage in enumerate(self.stages):
            if stage.spec is not None and stage.spec.name == name:
                return i
        return None

    def add_toxic(self, spec: ToxicSpec) -> None:
        if not self.closed:
            self._append(spec).start()

    def update_toxic(self, spec: ToxicSpec) -> None:
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
                while self.buffered >= _HIGH_WATER_BYTES:
                    self.space.clear()
                    await self.space.wait()
                data = await self.source.read(_READ_CHUNK_BYTES)
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


class Connection:
    """A client connection and its upstream connection, joined by two links.

    `name` ("proxy/client address") prefixes its tasks' names; `specs` are the toxics
    each direction starts with.
    """

    def __init__(
        self,
        name: str,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        specs: Mapping[Direction, Iterable[ToxicSpec]],
    ) -> None:
        self.name = name
        self.writers = (client[1], upstream[1])
        for writer in self.writers:
            # Like Go's synchronous writes: drain() waits until the kernel has the data.
            writer.transport.set_write_buffer_limits(0)
        self.links: dict[Direction, _Link] = {
            "upstream": _Link(self, "upstream", client[0], upstream[1], specs["upstream"]),
            "downstream": _Link(self, "downstream", upstream[0], client[1], specs["downstream"]),
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
