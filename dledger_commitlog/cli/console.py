"""`dledger console`: serve the JSON API (docs/http-api.md) as a client of a cluster.

Owns the command's options and how they become `console.server.ConsoleSettings`:
the cluster's servers, CA and ACL from `--cluster FILE` (or `--servers`,
`--tls-ca`), the nodes' metrics ports from the cluster file, the largest body from
the cluster's `max_message_bytes`, and the console's own certificate where the
cluster uses TLS: `--tls-cert/--tls-key`, else `console.pem`/`console.key` beside
the cluster's CA, issued from a local cluster's development CA on first use
(serverAuth only). A non-loopback `--bind`
without TLS is refused unless `--insecure` (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, cast

from dledger_commitlog.cli.commands import UsageError, command, security_files
from dledger_commitlog.client import Access
from dledger_commitlog.client.api import cluster_file_args
from dledger_commitlog.console.callers import ClusterAccess
from dledger_commitlog.console.server import DEFAULT_PORT, ConsoleSettings, check_bind
from dledger_commitlog.node.config import NodeConfig

_CONSOLE_CERT = "console"
# a node's default store.max_message_bytes (a cluster file may set another)
_DEFAULT_MAX_MESSAGE_BYTES = cast(int, NodeConfig.__dataclass_fields__["max_message_bytes"].default)


def _console_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bind", default="127.0.0.1", metavar="H", help="address to listen on")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="P", help="0: any free port")
    p.add_argument("--tls-cert", metavar="PEM", help="the console's certificate (HTTPS)")
    p.add_argument("--tls-key", metavar="PEM", help="its key")
    p.add_argument(
        "--insecure", action="store_true", help="allow plaintext HTTP on a non-loopback address"
    )


@command("console", "serve the HTTP JSON API of a cluster (docs/http-api.md)", _console_args)
def _console(args: argparse.Namespace) -> int:
    from dledger_commitlog.console import server  # lazily: asyncio server, httptools

    settings = console_settings(args)
    try:
        check_bind(settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    server.run(settings)
    return 0


def console_settings(args: argparse.Namespace) -> ConsoleSettings:
    cluster_file = args.cluster or os.environ.get("DLEDGER_CLUSTER")
    servers_text = args.servers or os.environ.get("DLEDGER_SERVERS")
    try:
        tls_ca, credentials = security_files(args)
        access = Access.load(tls_ca, credentials)
        doc: dict[str, Any] = {}
        if servers_text:
            servers = [s for s in servers_text.split(",") if s.strip()]
        elif cluster_file:
            servers, _ = cluster_file_args(cluster_file, {})
            doc = json.loads(Path(cluster_file).read_text())
        else:
            raise UsageError("no servers: pass --cluster FILE or --servers HOST:PORT,...")
    except OSError as exc:
        raise UsageError(f"{exc.filename}: {exc.strerror}") from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    security = doc.get("security") or {}
    extra = doc.get("extra_config") or {}
    max_body = int(extra.get("max_message_bytes") or _DEFAULT_MAX_MESSAGE_BYTES)
    cert, key = _certificate(args, tls_ca, args.bind)
    return ConsoleSettings(
        ClusterAccess(
            tuple(servers),
            cluster=args.cluster_name or doc.get("cluster") or "",
            tls_ca=access.tls_ca,
            credentials=access.credentials,
            acl=bool(security.get("acl")),
            timeout_s=args.timeout,
            metrics=_metrics_ports(doc, servers),
        ),
        bind=args.bind,
        port=args.port,
        tls_cert=cert,
        tls_key=key,
        insecure=args.insecure,
        max_body_bytes=max_body,
    )


def _metrics_ports(doc: dict[str, Any], servers: list[str]) -> tuple[tuple[str, str], ...]:
    """(client address, metrics address) of each node of the cluster file the console
    reaches (none without a cluster file, or for a node without a metrics port)."""
    nodes = doc.get("nodes") or []
    return tuple(
        (str(n["client"]), str(n["metrics"]))
        for n in nodes
        if n.get("metrics") and str(n.get("client")) in servers and not n.get("removed")
    )


def _certificate(
    args: argparse.Namespace, tls_ca: str | None, bind: str
) -> tuple[str | None, str | None]:
    """The console's certificate and key: given, else the cluster's (see the module doc)."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("give --tls-cert and --tls-key together")
    if args.tls_cert:
        return args.tls_cert, args.tls_key
    if not tls_ca:
        return None, None
    pki = Path(tls_ca).parent
    cert, key = pki / f"{_CONSOLE_CERT}.pem", pki / f"{_CONSOLE_CERT}.key"
    if cert.exists() and key.exists():
        return str(cert), str(key)
    if not (pki / "ca.key").exists():
        raise UsageError(
            f"the cluster uses TLS: give the console a certificate (--tls-cert/--tls-key; "
            f"no CA key in {pki} to issue one)"
        )
    from dledger_commitlog.cli.certs import make_server_cert

    try:
        made = make_server_cert(pki, _CONSOLE_CERT, [bind] if bind not in ("0.0.0.0", "::") else [])
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return str(made[0]), str(made[1])
