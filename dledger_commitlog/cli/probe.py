"""`python -m dledger_commitlog.cli.probe [ADDRESS]`: is the node there? Exit 0 or 1.

A Kubernetes exec probe (deploy/kubernetes/overlays/tls-acl): asks the node's
client port for the standard gRPC health (`grpc.health.v1.Health/Check`, which
the node answers without credentials, also with the ACL on) and exits 0 when it
says SERVING, else 1 after one line on stderr. The kubelet's own gRPC probe does
the same where the port speaks plaintext, but it cannot speak TLS. This module
imports grpcio and the health stubs, not the CLI: a probe every few seconds costs
a tenth of the `dledger` command's start-up.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dledger_commitlog.cli.probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("address", nargs="?", default="127.0.0.1:7001", help="HOST:PORT")
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        default=os.environ.get("DLEDGER_TLS_CA"),
        help="speak TLS, trusting this CA (default: $DLEDGER_TLS_CA; none: plaintext)",
    )
    parser.add_argument("--service", default="", help="the health service name (default '')")
    parser.add_argument("--timeout", type=float, default=2.0, metavar="S")
    args = parser.parse_args(argv)

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if args.tls_ca:
        try:
            ca = Path(args.tls_ca).read_bytes()
        except OSError as exc:
            return _fail(f"{args.tls_ca}: {exc.strerror}")
        channel = grpc.secure_channel(args.address, grpc.ssl_channel_credentials(ca))
    else:
        channel = grpc.insecure_channel(args.address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            return _fail(f"{args.address}: {exc.code().name}: {exc.details()}")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return _fail(f"{args.address}: {status}")
    return 0


def _fail(message: str) -> int:
    print(f"probe: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
