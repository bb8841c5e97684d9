"""`service.h2_port` in one process: a grpc.aio client against a scripted servicer
served on h2grpc, and the same servicer on grpc.aio, must see the same answers.

What the adapter promises (see its module doc): a status and message from `abort`
with the trailing metadata set; initial metadata; invocation metadata and the time
remaining; an `Undecodable` request is INVALID_ARGUMENT naming the field; an
unexpected exception is UNKNOWN with grpc.aio's words; a request over 64 MiB is
RESOURCE_EXHAUSTED and the server serves on; server and bidi streams.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from dledger_commitlog.service import h2_port
from dledger_commitlog.service.base import Context
from dledger_commitlog.service.decoding import checked_handlers
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 10.0
# gRPC core's grpc-timeout encoding "may round up arbitrarily" (timeout_encoding.h):
# a CI run saw 10.0988 s remaining of a 10 s call, so a server may see a little more.
WIRE_ROUNDING = 1.05


class Scripted(pb_grpc.DLedgerClientServicer):  # type: ignore[misc]
    """Answers that exercise every part of the context a handler may use."""

    async def Status(self, request: pb.StatusRequest, context: Context) -> pb.StatusResponse:
        meta = dict(context.invocation_metadata() or ())
        remaining = context.time_remaining()
        assert remaining is not None and 0 < remaining <= CALL_TIMEOUT_S * WIRE_ROUNDING
        return pb.StatusResponse(cluster=str(meta.get("who", "")), node_id=len(context.peer()))

    async def TransferLeadership(
        self, request: pb.TransferLeadershipRequest, context: Context
    ) -> pb.TransferLeadershipResponse:
        if request.target_node_id == 0:
            raise ValueError("boom")
        context.set_trailing_metadata((("dledger-leader", "elsewhere:1"),))
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the leader")

    async def Put(self, request: pb.PutRequest, context: Context) -> pb.PutResponse:
        return pb.PutResponse(result=pb.PutResult(msg_id=request.message.topic))

    async def ReadLog(
        self, request: pb.ReadLogRequest, context: Context
    ) -> AsyncIterator[pb.ReadLogChunk]:
        for pos in range(3):
            yield pb.ReadLogChunk(pos=pos, data=b"x" * (1 << 20))
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, "past the end")

    async def PutFrames(
        self, request_iterator: AsyncIterator[pb.PutFrame], context: Context
    ) -> AsyncIterator[pb.PutFrameResult]:
        await context.send_initial_metadata((("accepted", "1"),))
        async for frame in request_iterator:
            yield pb.PutFrameResult(seq=frame.seq)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _serving(stack: str, scenario: Callable[[str], Awaitable[None]]) -> None:
    address = f"127.0.0.1:{_free_port()}"
    services = ((pb_grpc.add_DLedgerClientServicer_to_server, Scripted()),)
    if stack == "h2":
        server = h2_port.ClientServer(services, None)
        await server.start(address)
        try:
            await scenario(address)
        finally:
            await server.stop(0.5)
    else:
        aio = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        for service, handlers in checked_handlers(services):  # as the node would register
            aio.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        aio.add_insecure_port(address)
        await aio.start()
        try:
            await scenario(address)
        finally:
            await aio.stop(0.5)


async def _failure(call: Awaitable[Any]) -> tuple[Any, str, dict[str, Any]]:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    err = failed.value
    return err.code(), err.details() or "", dict(err.trailing_metadata() or ())


def _answers(stack: str) -> list[Any]:
    seen: list[Any] = []

    async def scenario(address: str) -> None:
        options = [("grpc.max_receive_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(address, options) as channel:
            stub = pb_grpc.DLedgerClientStub(channel)
            status = await stub.Status(
                pb.StatusRequest(), metadata=(("who", "me"),), timeout=CALL_TIMEOUT_S
            )
            seen.append((status.cluster, status.node_id > len("ipv4:")))
            transfer = stub.TransferLeadership
            refused = pb.TransferLeadershipRequest(target_node_id=2)
            seen.append(await _failure(transfer(refused, timeout=CALL_TIMEOUT_S)))
            broken = pb.TransferLeadershipRequest(target_node_id=0)
            code, details, _ = await _failure(transfer(broken, timeout=CALL_TIMEOUT_S))
            seen.append((code, details))
            raw = channel.unary_unary("/dledger.v1.DLedgerClient/Put")
            bad = pb.PutRequest(message=pb.MessageData(topic="TopicZZ")).SerializeToString()
            bad = bad.replace(b"TopicZZ", b"\xffopicZZ")
            seen.append(await _failure(raw(bad, timeout=CALL_TIMEOUT_S)))
            huge = pb.PutRequest(message=pb.MessageData(topic="t", body=b"x" * (64 << 20)))
            code, details, _ = await _failure(stub.Put(huge, timeout=30))
            seen.append((code, "larger than max" in details))
            served = await stub.Put(pb.PutRequest(message=pb.MessageData(topic="after")))
            seen.append(served.result.msg_id)
            read = stub.ReadLog(pb.ReadLogRequest(), timeout=CALL_TIMEOUT_S)
            seen.append([(c.pos, len(c.data)) async for c in _until_failure(read, seen)])
            frames = stub.PutFrames(timeout=CALL_TIMEOUT_S)
            for seq in (1, 2, 3):
                await frames.write(pb.PutFrame(seq=seq))
            await frames.done_writing()
            seen.append(dict(await frames.initial_metadata()).get("accepted"))
            seen.append([r.seq async for r in frames])

    asyncio.run(_serving(stack, scenario))
    return seen


async def _until_failure(stream: Any, seen: list[Any]) -> AsyncIterator[Any]:
    try:
        async for answer in stream:
            yield answer
    except grpc.aio.AioRpcError as err:
        seen.append((err.code(), err.details()))


def test_h2_port_answers_as_grpc_aio_does() -> None:
    expected = [
        ("me", True),
        (grpc.StatusCode.FAILED_PRECONDITION, "not the leader", {"dledger-leader": "elsewhere:1"}),
        (grpc.StatusCode.UNKNOWN, "Unexpected <class 'ValueError'>: boom"),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "Error parsing message with type 'dledger.v1.PutRequest': "
            "field message.topic is not valid UTF-8",
            {},
        ),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, True),
        "after",
        (grpc.StatusCode.OUT_OF_RANGE, "past the end"),
        [(0, 1 << 20), (1, 1 << 20), (2, 1 << 20)],
        "1",
        [1, 2, 3],
    ]
    on_grpc_aio = _answers("grpcio")
    assert on_grpc_aio == expected
    assert _answers("h2") == on_grpc_aio
