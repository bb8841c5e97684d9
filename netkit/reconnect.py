"""How a channel to a node reconnects, as gRPC channel arguments.

gRPC takes `grpc.min_reconnect_backoff_ms` as the least time one connection attempt
is given (TCP, TLS, and the server's first SETTINGS frame), not only as a pause
between attempts. Set to 100 ms with the pauses, for a quick reconnect after a node
restarts, it failed a call at once ("connection attempt timed out before receiving
SETTINGS frame") whenever a node's loop was busy for a tenth of a second, or a TLS
handshake took longer than that (a link of 35 ms round trip). The pauses stay short
(`initial_ms` growing to `max_ms`); an attempt gets `CONNECT_TIMEOUT_MS`, bounded by
the call's own deadline as before.
"""

from __future__ import annotations

from typing import Final

CONNECT_TIMEOUT_MS: Final = 2_000


def reconnect_options(initial_ms: int, max_ms: int) -> list[tuple[str, int]]:
    """Channel arguments: reconnect after `initial_ms` (growing to `max_ms`), each
    attempt given CONNECT_TIMEOUT_MS."""
    return [
        ("grpc.initial_reconnect_backoff_ms", initial_ms),
        ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
        ("grpc.max_reconnect_backoff_ms", max_ms),
    ]
