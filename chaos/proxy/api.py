"""The fault proxy's control API: `FaultProxyServer`, a Toxiproxy 2.x HTTP API subset.

It serves what the `toxiproxy-python` client uses: ``GET /version``, ``POST /reset``,
``GET|POST /proxies``, ``POST /populate``, ``GET|POST|PATCH|DELETE /proxies/{proxy}``,
``GET|POST /proxies/{proxy}/toxics``,
``GET|POST|PATCH|DELETE /proxies/{proxy}/toxics/{toxic}``. Errors are
``{"error": message, "status": code}`` with Toxiproxy's codes and messages (400 bad
input, 404 unknown proxy/toxic, 409 duplicate name, 500 when a listener cannot bind).
Disabling a proxy (``POST /proxies/{name} {"enabled": false}``) closes its listener and
all its connections; enabling it listens again on the same address.

Invariants: all state lives on the event loop the server was started on; every change
to the set of proxies or their toxics runs under one lock, so requests apply one at a
time; a request body is at most `_MAX_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from dataclasses import replace
from types import TracebackType
from typing import Final

from chaos.proxy.datapath import Json
from chaos.proxy.proxies import (
    ApiError,
    Proxy,
    as_object,
    as_toxicity,
    bad_body,
    bind_hostport,
    bool_field,
    format_hostport,
    merge_attributes,
    missing,
    parse_toxic,
    split_hostport,
    str_field,
)

__all__ = [
    "TOXIPROXY_VERSION",
    "FaultProxyServer",
]

log = logging.getLogger(__name__)

TOXIPROXY_VERSION: Final = "2.12.0"
"""The Toxiproxy version whose API this server follows (reported by GET /version)."""

_MAX_BODY_BYTES: Final = 1 << 20
_PROXY_NOT_FOUND: Final = ("proxy not found", 404)
_TOXIC_NOT_FOUND: Final = ("toxic not found", 404)


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
        self._proxies: dict[str, Proxy] = {}
        self._lock = asyncio.Lock()
        self._api: asyncio.Server | None = None
        self._api_tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle

    async def start(self) -> None:
        if self._api is not None:
            raise RuntimeError("already started")
        try:
            sock = await bind_hostport(self._host, self._port, f"{self._host}:{self._port}")
        except ApiError as exc:
            raise OSError(exc.message) from None
        self._api = await asyncio.start_server(self._accept_api, sock=sock)
        self._host, self._port = split_hostport(format_hostport(sock.getsockname()))
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
            raise bad_body("expected a JSON array of proxies")
        wanted: list[tuple[Proxy, bool]] = []
        names: set[str] = set()
        for i, raw in enumerate(body, start=1):
            item = as_object(raw)
            name = str_field(item, "name", "")
            upstream = str_field(item, "upstream", "")
            if not name:
                raise missing(f"name at proxy {i}")
            if not upstream:
                raise missing(f"upstream at proxy {i}")
            if name in names:
                raise ApiError(f"duplicate proxy name {name!r}", 400)
            names.add(name)
            proxy = Proxy(name, str_field(item, "listen", ""), upstream)
            wanted.append((proxy, bool_field(item, "enabled", True)))
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

    def _proxy(self, name: str) -> Proxy:
        proxy = self._proxies.get(name)
        if proxy is None:
            raise ApiError(*_PROXY_NOT_FOUND)
        return proxy

    async def _create_proxy(self, body: Json) -> dict[str, Json]:
        body = as_object(body)
        name = str_field(body, "name", "")
        listen = str_field(body, "listen", "")
        upstream = str_field(body, "upstream", "")
        enabled = bool_field(body, "enabled", True)
        if not name:
            raise missing("name")
        if not upstream:
            raise missing("upstream")
        if name in self._proxies:
            raise ApiError("proxy already exists", 409)
        proxy = Proxy(name, listen, upstream)
        if enabled:
            await proxy.start()
        self._proxies[name] = proxy
        return proxy.to_json()

    async def _update_proxy(self, proxy: Proxy, body: Json) -> dict[str, Json]:
        body = as_object(body)
        listen = str_field(body, "listen", proxy.listen)
        upstream = str_field(body, "upstream", proxy.upstream)
        enabled = bool_field(body, "enabled", proxy.enabled)
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

    def _add_toxic(self, proxy: Proxy, body: Json) -> dict[str, Json]:
        spec = parse_toxic(body)
        if spec.name in proxy.toxics:
            raise ApiError("toxic already exists", 409)
        proxy.add_toxic(spec)
        return spec.to_json()

    def _update_toxic(self, proxy: Proxy, name: str, body: Json) -> dict[str, Json]:
        spec = proxy.toxics.get(name)
        if spec is None:
            raise ApiError(*_TOXIC_NOT_FOUND)
        body = as_object(body)
        spec = replace(
            spec,
            attributes=merge_attributes(spec.attributes, body.get("attributes")),
            toxicity=as_toxicity(body.get("toxicity", spec.toxicity)),
        )
        proxy.update_toxic(spec)
        return spec.to_json()

    # -- HTTP routing

    async def _dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Json]:
        parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]

        def parsed() -> Json:
            if not body.strip():
                raise bad_body("EOF")
            try:
                return json.loads(body)
            except (ValueError, UnicodeDecodeError) as exc:
                raise bad_body(str(exc)) from None

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
            if not 0 <= length <= _MAX_BODY_BYTES:
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
        if len(body) + size > _MAX_BODY_BYTES:
            raise ValueError("body too large")
        body += await reader.readexactly(size)
        await reader.readline()
