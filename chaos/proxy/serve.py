"""Running the fault proxy: on its own event loop in a thread, or as a process.

`start_in_thread()` returns a `FaultProxyThread` once the API listens (and the given
proxies exist); ``handle.stop()`` closes every socket and joins the thread, and
``handle.leftover_tasks`` then lists any task the server left alive (empty when clean).
`main` is ``python -m chaos.proxy --listen HOST:PORT [--config proxies.json]``: it
prints ``fault proxy listening on URL`` once ready and serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType

from chaos.proxy.api import FaultProxyServer
from chaos.proxy.datapath import Json
from chaos.proxy.proxies import ApiError, split_hostport

__all__ = [
    "FaultProxyThread",
    "main",
    "start_in_thread",
]

log = logging.getLogger(__name__)


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
            host, port = split_hostport(args.listen)
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
