"""Raft messages between nodes: the peer transport's surface, on h2grpc.

Each node keeps one outgoing client stream (`RaftPeer.Stream`) per peer and pushes
batches of messages on it in order; replies come back on the peer's own stream to
us. Entries of an append travel as one blob, not as protobuf objects (`wire`).

`open_link` is the stream to one peer and `open_peer_server` the Raft port, both
on h2grpc (`raftio.h2`: every frame parsed in the loop's read callback). What a
link is apart from its stack is written once: the encoding (`wire`), the bounded
queue and its batches, reconnecting, and the gate that checks who a stream comes
from and what it carries (`link`). Invariants: messages to one peer leave in the
order they were queued; a broken stream loses what was queued for it (Raft
retransmits), never reorders; the outgoing queue per peer is bounded, and
overflow drops the oldest messages rather than blocking the node's event loop.
"""

from __future__ import annotations

from typing import Protocol

from netkit.peer_auth import PeerSecurity
from raftio.h2 import H2Link, H2PeerServer
from raftio.link import PeerGate as PeerGate  # open_peer_server's input
from raftio.link import PeerLink


class PeerServer(Protocol):
    """The Raft port: `bind` (the port bound; OSError or RuntimeError naming no
    address: the caller names it), `start` once the node can take messages, `stop`."""

    def bind(self, address: str) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


def open_link(
    cluster: str, peer_id: int, address: str, *, me: int, security: PeerSecurity | None = None
) -> PeerLink:
    """The (not yet started) outgoing stream to peer `peer_id` at `address`."""
    return H2Link(cluster, peer_id, address, me=me, security=security)


def open_peer_server(gate: PeerGate) -> PeerServer:
    """The Raft port's server, every stream through `gate` (not yet bound)."""
    return H2PeerServer(gate)
