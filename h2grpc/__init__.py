"""gRPC over HTTP/2 on asyncio protocols: every frame parsed on the loop, in `data_received`.

grpc.aio hands each message between gRPC's C-core threads and the event loop, and
grpclib runs the h2 state machine in Python per frame; this package speaks the same
wire with the least work per message: a call's request messages can be consumed
synchronously as they arrive (the Raft port delivers them to the core without a task
switch), answers leave in one write per frame group. It imports nothing of ours:
`frames` (the byte layouts), `stream` (one call's stream, the limits, the errors),
`connection` (one connection: frames, flow control, keepalive), `server` and
`client`. Interoperates with grpcio (and grpclib) peers.
"""

from h2grpc.client import Answer as Answer
from h2grpc.client import ClientConnection as ClientConnection
from h2grpc.client import connect as connect
from h2grpc.server import Server as Server
from h2grpc.server import ServerCall as ServerCall
from h2grpc.server import bind as bind
from h2grpc.stream import ConnectionLost as ConnectionLost
from h2grpc.stream import MessageRefused as MessageRefused
from h2grpc.stream import Stream as Stream
from h2grpc.stream import StreamReset as StreamReset

__all__ = [
    "Answer",
    "ClientConnection",
    "ConnectionLost",
    "MessageRefused",
    "Server",
    "ServerCall",
    "Stream",
    "StreamReset",
    "bind",
    "connect",
]
