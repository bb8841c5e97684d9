"""The console process: one asyncio loop, a client of the cluster, serving HTTP/1.1.

Owns `ConsoleSettings` (where to listen, TLS, the body limit, how to reach the
cluster), `check_bind` (a non-loopback address needs TLS unless `insecure`),
`build_router` (the JSON API's endpoints, its server-sent events, and the web
console's page at `/`), `Console` (those parts on a loop: start, stop; what a node
process with `[listen] console` runs too), `serve` (listen, announce the URL, run
until cancelled, then close members and clients) and `run`, the entry point of
`dledger console`.

Invariants: the console never listens on a non-loopback address in plaintext
unless told `insecure`; on SIGINT/SIGTERM the HTTP members leave their groups
(their unanswered messages go to other members) before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass

from dledger_commitlog.console.api import MessageApi
from dledger_commitlog.console.backlog import BacklogApi
from dledger_commitlog.console.callers import Callers, ClusterAccess
from dledger_commitlog.console.cluster_admin import ClusterAdminApi
from dledger_commitlog.console.events import Events
from dledger_commitlog.console.group_admin import GroupAdminApi
from dledger_commitlog.console.group_history import GroupHistory, GroupHistoryApi
from dledger_commitlog.console.http import HttpServer, Limits, Router
from dledger_commitlog.console.members import MemberApi
from dledger_commitlog.console.node_metrics import NodeMetricsScraper
from dledger_commitlog.console.pages import Pages
from dledger_commitlog.console.trace import TraceApi

DEFAULT_PORT = 7480


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    access: ClusterAccess
    bind: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: any free port (the one taken is announced)
    tls_cert: str | None = None  # PEM certificate and key: serve HTTPS
    tls_key: str | None = None
    insecure: bool = False  # allow plaintext on a non-loopback address
    max_body_bytes: int = 4 << 20  # the cluster's largest message

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: ConsoleSettings) -> None:
    """ValueError if the settings would serve plaintext beyond this host."""
    if not is_loopback(settings.bind) and not settings.tls and not settings.insecure:
        raise ValueError(
            f"refusing to serve plaintext HTTP on {settings.bind}: give the console TLS "
            "(a cluster with TLS, or --tls-cert/--tls-key), bind 127.0.0.1, or pass --insecure"
        )


def build_router(message_api: MessageApi, member_api: MemberApi, callers: Callers) -> Router:
    """The JSON API, its server-sent events, and the web console's page."""
    router = Router()
    history = GroupHistory()
    message_api.on_groups = history.record
    GroupHistoryApi(callers, history).register(router)
    message_api.register(router)
    member_api.register(router)
    GroupAdminApi(callers).register(router)
    TraceApi(callers).register(router)
    BacklogApi(callers).register(router)
    ClusterAdminApi(callers).register(router)
    Events(callers, message_api).register(router)
    Pages().register(router)
    return router


def ssl_context(settings: ConsoleSettings) -> ssl.SSLContext | None:
    if settings.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    context.set_alpn_protocols(["http/1.1"])
    return context


class Console:
    """The console's parts on the running loop: its clients, members and HTTP server.

    Made (the bind rule checked: ValueError) before it listens; `start` listens,
    `stop` stops listening, then the HTTP members leave and the clients close. Both
    `serve` (the `dledger console` process) and a node process with `[listen]
    console` run it; it holds no process-wide state (no signal handler, no logging
    set-up), so it can share a loop with other servers."""

    def __init__(self, settings: ConsoleSettings) -> None:
        check_bind(settings)
        self.settings = settings
        self._callers = Callers(settings.access)
        self._members = MemberApi(self._callers, settings.access)
        metrics = dict(settings.access.metrics)
        scraper = NodeMetricsScraper(metrics) if metrics else None
        views = MessageApi(self._callers, tls=settings.tls, scraper=scraper)
        router = build_router(views, self._members, self._callers)
        limits = Limits(body_bytes=settings.max_body_bytes)
        self._server = HttpServer(router, limits, ssl_context(settings))

    async def start(self) -> str:
        """Listen (OSError if it cannot); the API's base URL."""
        port = await self._server.start(self.settings.bind, self.settings.port)
        self._members.start()
        scheme = "https" if self.settings.tls else "http"
        bind = self.settings.bind
        host = f"[{bind}]" if ":" in bind else bind
        return f"{scheme}://{host}:{port}/api/v1"

    async def stop(self) -> None:
        await self._server.stop()
        await self._members.close()
        await self._callers.close()


async def serve(settings: ConsoleSettings, announce: Callable[[str], None] = print) -> None:
    """Serve until cancelled; `announce` gets the API's base URL once listening."""
    console = Console(settings)
    url = await console.start()
    announce(f"console: serving {url}")
    try:
        await asyncio.Event().wait()
    finally:
        await console.stop()


def run(settings: ConsoleSettings) -> None:
    """`dledger console`: serve until SIGINT or SIGTERM, on uvloop where it is installed
    (as a node runs), logging to stderr."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s console %(levelname)s %(name)s: %(message)s"
    )

    async def main() -> None:
        task = asyncio.create_task(serve(settings, _announce))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _announce(line: str) -> None:
    print(line, flush=True)
    sys.stdout.flush()
