"""The Raft peer link on grpcio (`grpc.aio`): the stack before h2grpc, kept for the A/B.

Owns `GrpcioLink` (a `PeerLink` whose stream is a grpc.aio call), `GrpcioPeerServer`
(the RaftPeer service on a grpc.aio server, every stream through the `PeerGate`),
`GRPC_OPTIONS` (message limits, keepalive, fast reconnect: the client port's
servers and channels use them too) and `open_channel` (an aio channel to a node,
TLS when configured; the client service forwards through it as well).

grpc.aio runs the HTTP/2 work on gRPC's own threads and hands every message across
to the event loop (three thread hops per message, measured in issue 21); the h2
stack (`transport_h2`) parses it in the loop's read callback. Both speak the same wire,
refuse alike (the gate's `Refusal`) and interoperate. Requests reach the handler
as bytes, parsed by the gate: a batch that does not parse is INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from raft.peer_auth import PeerSecurity, certificate_node
from raft.peer_link import (
    CONNECT_TIMEOUT_S,
    REFUSALS,
    LinkBroken,
    LinkRefused,
    PeerGate,
    PeerLink,
    Refusal,
    batches_read,
)
from raft.wire import BATCHES_READ, MAX_MESSAGE_BYTES

SERVICE = "dledger.v1.RaftPeer"
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # A peer that restarts must be reachable again within an election timeout: gRPC's
    # default reconnect backoff (1 s growing to 120 s, shared between channels through
    # the global subchannel pool) kept elections waiting for seconds.
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 300),
    ("grpc.use_local_subchannel_pool", 1),
]


class GrpcioLink(PeerLink):
    """The outgoing stream to one peer as a grpc.aio client stream."""

    async def _stream_once(self) -> None:
        channel = open_channel(self.address, self._security)
        try:
            # Connect first, with a short bound: a stream started on a channel that
            # is still connecting can sit for seconds before it fails or flows.
            # (asyncio.timeout: 3.11's wait_for can swallow close()'s cancel.)
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await channel.channel_ready()
            self.connected = True
            batches = self._batches(self.stream_id)
            await pb_grpc.RaftPeerStub(channel).Stream(batches, metadata=self.metadata())
        except grpc.aio.AioRpcError as exc:
            if exc.code().name in REFUSALS:
                read = batches_read(exc.trailing_metadata())
                raise LinkRefused(exc.code().name, exc.details() or "", read) from None
            raise LinkBroken(exc.code().name) from None
        finally:
            await channel.close(grace=None)

    async def _batches(self, stream: int) -> AsyncIterator[pb.RaftBatch]:
        """The batches of stream `stream`: grpc.aio consumes this iterator in a task of
        its own that outlives a refused call; it must end with its stream."""
        while (batch := await self.next_batch(stream)) is not None:
            yield batch


class GrpcioPeerServer:
    """The Raft port on a grpc.aio server: `bind`, then `start`; `stop` at the end."""

    def __init__(self, gate: PeerGate) -> None:
        self._gate = gate
        self._server = grpc.aio.server(options=GRPC_OPTIONS)
        handlers = {
            "Stream": grpc.stream_unary_rpc_method_handler(
                self._stream, response_serializer=pb.RaftAck.SerializeToString
            )
        }  # requests as bytes: the gate parses them
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self._server.add_registered_method_handlers(SERVICE, handlers)

    def bind(self, address: str) -> int:
        """Listen on `address` (RuntimeError if gRPC cannot); the port bound."""
        tls = self._gate.security.tls
        if tls is None:
            port: int = self._server.add_insecure_port(address)
        else:
            creds = tls.server_credentials(require_client_cert=True)
            port = self._server.add_secure_port(address, creds)
        return port

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace_s: float) -> None:
        await self._server.stop(grace=grace_s)

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> pb.RaftAck:
        gate, peer = self._gate, context.peer()
        read = 0
        try:
            meta: dict[str, Any] = dict(context.invocation_metadata() or ())
            tls_node = certificate_node(context.auth_context()) if gate.security.tls else None
            sender = gate.sender(meta, tls_node, peer)
            async for raw in requests:
                read += 1
                gate.receive(raw, sender, peer)
        except Refusal as exc:
            context.set_trailing_metadata(((BATCHES_READ, exc.batches_read(read)),))
            await context.abort(grpc.StatusCode[exc.code], exc.why)
        return pb.RaftAck()


def open_channel(address: str, security: PeerSecurity) -> grpc.aio.Channel:
    """An aio channel to a node: TLS (with this node's certificate) when configured."""
    if security.tls is None:
        return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    return grpc.aio.secure_channel(address, security.tls.channel_credentials(),
                                   options=GRPC_OPTIONS)  # fmt: skip
