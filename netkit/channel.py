"""A gRPC message's limit on either port, and a grpc.aio channel to a node.

`MAX_MESSAGE_BYTES` bounds one gRPC message, sent or received, on the client port
and on the Raft port alike. `open_channel` is how a node calls another node's
client port (a follower forwards a client's call to the leader): TLS with this
node's certificate when configured, with `GRPC_OPTIONS` (the message limit,
keepalive, and a reconnect backoff short enough that a restarted node is
reachable again within an election timeout).
"""

from __future__ import annotations

import grpc

from netkit.peer_auth import PeerSecurity
from netkit.reconnect import reconnect_options

MAX_MESSAGE_BYTES = 64 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # gRPC's default reconnect backoff (1 s growing to 120 s, shared between channels
    # through the global subchannel pool) would keep a forwarded call waiting for
    # seconds after the leader restarts.
    *reconnect_options(50, 300),
    ("grpc.use_local_subchannel_pool", 1),
]


def open_channel(address: str, security: PeerSecurity) -> grpc.aio.Channel:
    """An aio channel to a node: TLS (with this node's certificate) when configured."""
    if security.tls is None:
        return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    return grpc.aio.secure_channel(
        address, security.tls.channel_credentials(), options=GRPC_OPTIONS
    )
