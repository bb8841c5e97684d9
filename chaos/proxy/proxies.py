"""Proxies and toxics as the fault proxy's API sees them: fields, checks, listeners.

A `Proxy` is a named listener that forwards each accepted connection to its upstream
through a `datapath.Connection` carrying the proxy's toxics; toxics added, updated or
removed on the proxy reach its live connections too. The functions here turn request
bodies into values with Toxiproxy's checks, in its order and with its messages; an
`ApiError` carries the message and HTTP status (400 bad input, 500 when a listener
cannot bind).

Invariants: a proxy is `enabled` exactly while it listens; disabling it (`stop`, a
partition) closes its listener and every connection, and a connection accepted by an
earlier listener is aborted; enabling it listens again on the same address.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from chaos.proxy.datapath import TOXIC_TYPES, Connection, Direction, Json, ToxicSpec

__all__ = [
    "ApiError",
    "Proxy",
    "as_object",
    "as_toxicity",
    "bad_body",
    "bind_hostport",
    "bool_field",
    "format_hostport",
    "merge_attributes",
    "missing",
    "parse_toxic",
    "split_hostport",
    "str_field",
]

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S: Final = 10.0


class ApiError(Exception):
    """An API failure carrying Toxiproxy's message and HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def body(self) -> dict[str, Json]:
        return {"error": self.message, "status": self.status}


def bad_body(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def missing(what: str) -> ApiError:
    return ApiError(f"missing required field: {what}", 400)


# --------------------------------------------------------------------------- addresses


def split_hostport(address: str) -> tuple[str, int]:
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


def format_hostport(sockname: Any) -> str:
    host, port = str(sockname[0]), int(sockname[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _bind(address: str) -> socket.socket:
    """A listening, non-blocking socket on one resolved address (port 0 = any free port)."""
    try:
        host, port = split_hostport(address)
    except ValueError as exc:
        raise ApiError(f"listen tcp {exc}", 500) from None
    return await bind_hostport(host, port, address)


async def bind_hostport(host: str, port: int, address: str) -> socket.socket:
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


# --------------------------------------------------------------------------- request bodies


def _as_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_body(f"attribute {key!r} must be an integer")
    if isinstance(value, float) and not value.is_integer():
        raise bad_body(f"attribute {key!r} must be an integer")
    return int(value)


def as_toxicity(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_body("toxicity must be a number")
    return float(value)


def merge_attributes(base: Mapping[str, int], given: object) -> dict[str, int]:
    if given is None:
        return dict(base)
    if not isinstance(given, dict):
        raise bad_body("attributes must be an object")
    merged = dict(base)
    for key in base:  # unknown attributes are ignored, as Toxiproxy's JSON decoding does
        if key in given:
            merged[key] = _as_int(key, given[key])
    return merged


def parse_toxic(body: Json) -> ToxicSpec:
    """Validate a toxic-create body the way Toxiproxy's AddToxicJson does (same order)."""
    if not isinstance(body, dict):
        raise bad_body("expected a JSON object")
    stream = body.get("stream", "downstream")
    if not isinstance(stream, str):
        raise bad_body("stream must be a string")
    direction = stream.lower()
    if direction not in ("upstream", "downstream"):
        raise ApiError("stream was invalid, can be either upstream or downstream", 400)
    kind = body.get("type", "")
    name = body.get("name") or f"{kind}_{stream}"
    if not isinstance(kind, str) or not isinstance(name, str):
        raise bad_body("name and type must be strings")
    if kind not in TOXIC_TYPES:
        raise ApiError("invalid toxic type", 400)
    toxicity = as_toxicity(body.get("toxicity", 1.0))
    return ToxicSpec(
        name=name,
        type=kind,
        stream=stream,
        direction="upstream" if direction == "upstream" else "downstream",
        toxicity=toxicity,
        attributes=merge_attributes(TOXIC_TYPES[kind], body.get("attributes")),
    )


def str_field(body: Mapping[str, Json], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise bad_body(f"{key} must be a string")
    return value


def bool_field(body: Mapping[str, Json], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise bad_body(f"{key} must be a boolean")
    return value


def as_object(body: Json) -> dict[str, Json]:
    if not isinstance(body, dict):
        raise bad_body("expected a JSON object")
    return body


# --------------------------------------------------------------------------- proxies


@dataclass(eq=False)
class Proxy:
    """A named listener forwarding to `upstream` through its toxics (see the module doc)."""

    name: str
    listen: str
    upstream: str
    enabled: bool = False
    toxics: dict[str, ToxicSpec] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _generation: int = 0
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    _conns: set[Connection] = field(default_factory=set)

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

    def specs(self, direction: Direction) -> list[ToxicSpec]:
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
        self.listen = format_hostport(sock.getsockname())
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
            host, port = split_hostport(self.upstream)
            async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                upstream = await asyncio.open_connection(host, port)
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("proxy %s: cannot reach upstream %s: %s", self.name, self.upstream, exc)
            writer.transport.abort()
            return
        except BaseException:
            writer.transport.abort()
            raise
        peer = writer.get_extra_info("peername")
        name = f"{self.name}/{format_hostport(peer) if peer else '?'}"
        specs: dict[Direction, list[ToxicSpec]] = {
            "upstream": self.specs("upstream"),
            "downstream": self.specs("downstream"),
        }
        conn = Connection(name, (reader, writer), upstream, specs)
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)

    # -- toxics

    def add_toxic(self, spec: ToxicSpec) -> None:
        self.toxics[spec.name] = spec
        for conn in list(self._conns):
            conn.links[spec.direction].add_toxic(spec)

    def update_toxic(self, spec: ToxicSpec) -> None:
        self.toxics[spec.name] = spec
        for conn in list(self._conns):
            conn.links[spec.direction].update_toxic(spec)

    def remove_toxic(self, name: str) -> None:
        spec = self.toxics.pop(name)
        for conn in list(self._conns):
            conn.links[spec.direction].remove_toxic(name)
