"""The process: its shards and its gRPC servers, from start to a clean shutdown.

`run` is `dledger serve`'s entry point; `serve` opens the shards the config says
the process hosts (`shards.Shards`: per shard a `RaftNode`, its leader-side
services and its client service; one shard, shard 1, unless the cluster is
multi-Raft), binds the Raft peer port (one for every shard), the client port (the
shards' client services, gRPC health; a request there that does not parse is
INVALID_ARGUMENT, see `decoding`), the metrics port and the console's
(`console_port`), starts them, and on
SIGTERM/SIGINT (or a fatal failure: of the node, or of every shard) stops them in
the reverse order.

A port that cannot be bound is a `ListenError` naming the address and the cause,
raised before the node serves anything; an address this host does not have (or a
port another process holds) is found before the store opens (`check_addresses`),
so such a start changes nothing on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dledger_commitlog.node.config import ListenError, NodeConfig
from dledger_commitlog.node.metrics import serve_metrics
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.node.security import NodeSecurity
from dledger_commitlog.process.console_port import node_console
from dledger_commitlog.process.shards import Shards
from dledger_commitlog.service import h2_port
from dledger_commitlog.service.decoding import Services
from netkit.peer_auth import TlsIdentity
from raftio.transport import PeerServer, open_peer_server

log = logging.getLogger(__name__)

_T = TypeVar("_T")


async def serve(cfg: NodeConfig, stop: asyncio.Event | None = None) -> BaseException | None:
    """Run a node process until `stop` is set (or SIGTERM/SIGINT); return what stopped
    it if fatal. It hosts the shards `cfg.host_shards` (one, shard 1, unless the
    cluster is multi-Raft: docs/scaling.md)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    security = NodeSecurity.load(cfg)  # before anything opens: a bad file is one line
    check_addresses(cfg)  # an address this host lacks: one line, before the store opens
    console = node_console(cfg, security)  # its bind rule: one line, before the store opens
    shards = Shards(cfg, stop, security)
    await shards.open()  # a shard that cannot open: the ones opened before it close again
    stop_metrics: Callable[[], None] | None = None
    raft_server: PeerServer | None = None
    client_server: ClientPort | None = None
    health_servicer: health.aio.HealthServicer | None = None
    try:
        _TERM.node = shards.first.node
        if security.tls is not None:
            expires = security.tls.expires_at()
            for hosted in shards.hosted.values():
                hosted.metrics.cert_expiry.set(expires)
        if cfg.listen_metrics:
            at = cfg.listen_metrics
            stop_metrics = _listen("metrics", at, lambda: serve_metrics(shards.registry(), at))
        tls = security.tls
        raft_server = open_peer_server(shards.gate())
        _listen_checked(raft_server.bind, "Raft peers", cfg.raft_address)
        shards.start_services()
        health_servicer = health.aio.HealthServicer()
        # Every request that does not parse is INVALID_ARGUMENT, naming the field.
        client_services = (
            *shards.client_services(),
            (health_pb2_grpc.add_HealthServicer_to_server, health_servicer),
        )
        client_server = ClientPort(cfg, client_services, tls)
        if console is not None:
            _check_port("the console", cfg.listen_console)
        await raft_server.start()
        await shards.start()
        await client_server.start()
        if console is not None:
            url = await _start("the console", cfg.listen_console, console.start)
            log.info("node %d serving the console on %s", cfg.node_id, url)
        # What start-up made (modules, classes, the recovered state) lives as long as
        # the process: out of the collector's sight, a full collection, which runs on
        # whatever thread allocates (the loop, most often), takes ~10 ms, not ~40.
        gc.freeze()
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set(
            "dledger.v1.DLedgerClient", health_pb2.HealthCheckResponse.SERVING
        )
        log.info(
            "node %d serving clients on %s (%s, %s), raft on %s (peers: %s)%s",
            cfg.node_id,
            cfg.client_address,
            "TLS" if tls else "plaintext",
            "ACL" if security.acl else "no client authentication",
            cfg.raft_address,
            security.peer_mode,
            shards.describe(),
        )
        if cfg.insecure:
            log.warning(
                "node %d runs with --insecure: %s",
                cfg.node_id,
                "; ".join(
                    why
                    for why, weak in (
                        ("Raft peers are not authenticated", not (security.peers or tls)),
                        ("clients are not authenticated", security.acl is None),
                        ("traffic is not encrypted", tls is None),
                    )
                    if weak
                )
                or "nothing is weakened",
            )
        await stop.wait()
    finally:  # also after a failed start: the recovered nodes close cleanly
        log.info("node %d shutting down", cfg.node_id)
        if console is not None:  # first: its HTTP members leave their groups
            await console.stop()
        if health_servicer is not None:
            await health_servicer.enter_graceful_shutdown()
        if client_server is not None:
            await client_server.stop(grace_s=1.0)
        await shards.close()
        if raft_server is not None:
            await raft_server.stop(grace_s=0.5)
        if stop_metrics is not None:
            stop_metrics()
    return shards.fatal


class ClientPort:
    """The client port on h2grpc (`h2_port`: every frame parsed on the loop)."""

    def __init__(self, cfg: NodeConfig, services: Services, tls: TlsIdentity | None) -> None:
        self._address = cfg.client_address
        _check_port("clients", self._address)  # the cause, before the loop's own error
        self._h2 = h2_port.ClientServer(services, h2_port.ssl_context(cfg) if tls else None)

    async def start(self) -> None:
        await _start("clients", self._address, lambda: self._h2.start(self._address))

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls; calls in progress get `grace_s` to end, then are cancelled."""
        await self._h2.stop(grace_s)


def _listen(what: str, address: str, bind: Callable[[], _T]) -> _T:
    """Run `bind`; a failure becomes a ListenError that names the address and the cause."""
    try:
        return bind()
    except (OSError, RuntimeError, ValueError) as exc:
        why = (exc.strerror if isinstance(exc, OSError) else None) or _bind_error(address)
        raise ListenError(f"cannot listen for {what} on {address}: {why or exc}") from None


async def _start(what: str, address: str, start: Callable[[], Awaitable[_T]]) -> _T:
    """`await start()`; an OSError becomes a ListenError that names the address."""
    try:
        return await start()
    except OSError as exc:
        raise ListenError(f"cannot listen for {what} on {address}: {exc.strerror or exc}") from None


def _listen_checked(bind: Callable[[str], object], what: str, address: str) -> None:
    """`bind(address)`, checked first (`_check_port`)."""
    _check_port(what, address)
    _listen(what, address, lambda: bind(address))


def _check_port(what: str, address: str) -> None:
    """A ListenError naming `address` and why it cannot be bound, found with a plain
    socket: that gives the cause, and it refuses a port another server holds with
    SO_REUSEPORT, which would share the port with a second copy of this node."""
    why = _bind_error(address)
    if why is not None:
        raise ListenError(f"cannot listen for {what} on {address}: {why}")


def check_addresses(cfg: NodeConfig) -> None:
    """Every host the node listens on is an address of this host, or a ListenError names
    the first that is not and why (an address of another host: the config was copied
    to the wrong host, or names an address this one does not have). Only the host is
    tried (port 0): a port in use is said at the bind, after the data directory's lock,
    so a second copy of a running node hears that its directory is in use."""
    for what, address in (
        ("clients", cfg.client_address),
        ("Raft peers", cfg.raft_address),
        ("metrics", cfg.listen_metrics),
        ("the console", cfg.listen_console),
    ):
        why = _bind_error(address.rpartition(":")[0] + ":0") if address else None
        if why is not None:
            raise ListenError(f"cannot listen for {what} on {address}: {why}")


def _bind_error(address: str) -> str | None:
    """Why binding `address` fails, found by trying (None: it binds)."""
    host, _, port = address.rpartition(":")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(where)
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"{host} is not an address of this host ({exc.strerror})"
        return exc.strerror or str(exc)
    except ValueError as exc:
        return str(exc)
    return None


class _TermFilter(logging.Filter):
    """Stamps every log record with the node's current Raft term."""

    def __init__(self) -> None:
        super().__init__()
        self.node: RaftNode | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        record.term = self.node.term if self.node is not None else 0
        return True


_TERM = _TermFilter()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The node's event loop: uvloop's where it is installed (the Raft link's messages
    are handled on it), asyncio's own elsewhere."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(cfg: NodeConfig) -> None:
    """Blocking entry point used by `dledger serve`: structured logs carry node and term."""
    handler = logging.StreamHandler()
    handler.addFilter(_TERM)
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s node={cfg.node_id} term=%(term)s %(levelname)s %(name)s: %(message)s"
        )
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        fatal = runner.run(serve(cfg))
    if fatal is not None:
        raise SystemExit(1)  # stopped by a failure: supervisors restart on a non-zero exit
