"""Raft messages between nodes: the peer transport, on the gRPC stack the node picks.

Each node keeps one outgoing client stream (`RaftPeer.Stream`) per peer and pushes
batches of messages on it in order; replies come back on the peer's own stream to
us. Entries of an append travel as one blob, not as protobuf objects (`wire`).

This module is the transport's surface: `open_link` (the stream to one peer) and
`open_peer_server` (the Raft port), each on one of TRANSPORTS, the node's
`raft_transport` setting: "h2" (h2grpc, `transport_h2`, the default: every frame
parsed in the loop's read callback, 3.0x grpc.aio's ping-pong rate in
bench/peer_link.py and 0.8x a plain asyncio stream's) or "grpcio" (grpc.aio,
`transport_grpcio`, whose C-core threads hand each message across). What both share
is written once: the encoding (`wire`), the bounded queue and its batches,
reconnecting, and the gate that checks who a stream comes from and what it
carries (`peer_link`). Invariants (kept on both stacks): messages to one peer
leave in the order they were queued; a broken stream loses what was queued for
it (Raft retransmits), never reorders; the outgoing queue per peer is bounded,
and overflow drops the oldest messages rather than blocking the node's
event loop.
"""

from __future__ import annotations

from typing import Protocol

from raft.peer_auth import PeerSecurity
from raft.peer_link import PeerGate as PeerGate  # open_peer_server's input
from raft.peer_link import PeerLink
from raft.transport_grpcio import GrpcioLink, GrpcioPeerServer
from raft.transport_h2 import H2Link, H2PeerServer
from raft.wire import TRANSPORTS

# The client port's servers and its forwarding to the leader use grpcio's channel
# settings and channels (`service/`), whatever stack the Raft port runs.
from raft.transport_grpcio import GRPC_OPTIONS as GRPC_OPTIONS  # isort: skip
from raft.transport_grpcio import open_channel as open_channel  # isort: skip


class PeerServer(Protocol):
    """The Raft port: `bind` (the port bound; OSError or RuntimeError naming no
    address: the caller names it), `start` once the node can take messages, `stop`."""

    def bind(self, address: str) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


def open_link(
    transport: str, cluster: str, peer_id: int, address: str, *, me: int,
    security: PeerSecurity | None = None,
) -> PeerLink:  # fmt: skip
    """The (not yet started) outgoing stream to peer `peer_id` at `address`."""
    kind = H2Link if _checked(transport) == "h2" else GrpcioLink
    return kind(cluster, peer_id, address, me=me, security=security)


def open_peer_server(transport: str, gate: PeerGate) -> PeerServer:
    """The Raft port's server, every stream through `gate` (not yet bound)."""
    if _checked(transport) == "h2":
        return H2PeerServer(gate)
    return GrpcioPeerServer(gate)


def _checked(transport: str) -> str:
    if transport not in TRANSPORTS:
        raise ValueError(f"raft transport {transport!r} is none of {', '.join(TRANSPORTS)}")
    return transport
