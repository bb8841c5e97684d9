"""The node's own console (`[listen] console`): docs/console.md's web console and
JSON API, served by the node process as `dledger console` serves them.

Owns `node_console`: the `console.server.Console` of a node's settings, a client
of the cluster like any other (the peers' client addresses, the cluster's name,
the node's CA; it signs with no credentials of its own: with an ACL each request
runs as the user who signs in), serving HTTPS with the node's certificate when
TLS is on, and reading the node's own metrics port for the Cluster page.

It runs on the node's event loop: the console is asyncio through and through
(llhttp over asyncio streams, grpc.aio clients like the ones the node forwards puts
with, the one blocking read, of a metrics port, in a worker thread), keeps no
process-wide state, and its work is a page's requests and one snapshot a second
while a page is open. A thread of its own would buy no CPU under the GIL and
would need a second loop for its gRPC clients.

Invariant: the console never listens on a non-loopback address in plaintext
unless the node is `insecure` (`console.server.check_bind`; `node.security.
check_exposure` also wants the ACL there), refused before the store opens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dledger_commitlog.node.config import ConfigError, NodeConfig, parse_address
from dledger_commitlog.node.security import NodeSecurity

if TYPE_CHECKING:
    from dledger_commitlog.console.server import Console


def node_console(cfg: NodeConfig, security: NodeSecurity) -> Console | None:
    """The console `cfg.listen_console` asks for (None: off); ConfigError, one line,
    when its address breaks the console's bind rule."""
    if not cfg.listen_console:
        return None
    # Only a node that serves the console loads it (and the client it is built on):
    # a fifth of a node's start-up CPU otherwise.
    from dledger_commitlog.console.callers import ClusterAccess
    from dledger_commitlog.console.server import Console, ConsoleSettings

    host, port = parse_address(cfg.listen_console)
    metrics = ((cfg.me.client, cfg.listen_metrics),) if cfg.listen_metrics else ()
    access = ClusterAccess(
        tuple(p.client for p in cfg.peers),
        cluster=cfg.cluster,
        tls_ca=security.tls.ca if security.tls is not None else None,
        acl=security.acl is not None,
        metrics=metrics,
    )
    settings = ConsoleSettings(
        access,
        bind=host.strip("[]"),
        port=port,
        tls_cert=cfg.tls_cert or None,
        tls_key=cfg.tls_key or None,
        insecure=cfg.insecure,
        max_body_bytes=cfg.max_message_bytes,
    )
    try:
        return Console(settings)
    except ValueError as exc:
        raise ConfigError(f"listen.console: {exc}") from None
    except OSError as exc:  # ssl.SSLError: the certificate and key do not load
        raise ConfigError(f"listen.console: tls.cert {cfg.tls_cert}: {exc}") from None
