"""Requests that do not parse are INVALID_ARGUMENT, naming what is wrong, for every RPC.

gRPC parses a request before the handler runs; a protobuf `DecodeError` there
(bytes that are no such message, or a string field that is not UTF-8, which
proto3 refuses) would reach the client as UNKNOWN "Unexpected DecodeError", and
be logged as a servicer failure. `checked_handlers` gives a service's handlers
(as its generated `add_*Servicer_to_server` registers them) with two changes:

- the request deserializer answers an `Undecodable` instead of raising, saying
  why (`why_undecodable`: for bad UTF-8, the path of the field, found by walking
  the wire format once the parse failed);
- the handler is wrapped: an `Undecodable` request is aborted with
  INVALID_ARGUMENT before the servicer sees it. On a request stream the stream
  ends at the bad message (the servicer answers what came before, as at a
  half-close) and the call then fails with INVALID_ARGUMENT.

A good request pays one Python call around the parse and one await around the
handler: nothing per byte, no per-call handler lookup (an interceptor would be
both). Handlers must read request streams by iterating them, not `context.read()`.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from dledger_commitlog.common.protowire import read_varint

_MAX_DEPTH: Final = 100  # protobuf's own nesting limit
_BAD = grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A request that did not parse, and why (what the client is told)."""

    why: str


Services = tuple[tuple[Callable[[Any, Any], None], object], ...]


def checked_handlers(services: Services) -> list[tuple[str, dict[str, Any]]]:
    """Per (generated `add_*Servicer_to_server`, servicer): the service's full name and
    its grpc.RpcMethodHandlers by method name, requests decoded as the module doc says
    (what `h2_port` serves)."""
    out = []
    for add, servicer in services:
        service, handlers = handler_table(add, servicer)
        methods = descriptor_pool.Default().FindServiceByName(service).methods_by_name
        out.append(
            (service, {name: _checked(h, methods[name].input_type) for name, h in handlers.items()})
        )
    return out


def handler_table(add: Callable[[Any, Any], None], servicer: object) -> tuple[str, dict[str, Any]]:
    """The service name and the grpc.RpcMethodHandlers by method name that the
    generated `add` registers for `servicer` (as they are: not yet checked)."""
    table = _Table()
    add(servicer, table)
    assert table.service, f"{add.__name__} registered no method handlers"
    return table.service, dict(table.handlers)


class _Table:
    """Stands in for the server while generated code registers a service's handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        """The same handlers come again, by name, through the call below."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, dict(handlers)


def _checked(handler: Any, desc: Descriptor) -> Any:
    """`handler` (a grpc.RpcMethodHandler, its requests `desc` messages) with the
    request deserializer and the behavior wrapped (see the module doc); as it is if the
    behavior is not async (gRPC runs those in its thread pool: grpc_health's
    unimplemented List)."""
    if handler.request_streaming:
        kind = "stream_stream" if handler.response_streaming else "stream_unary"
    else:
        kind = "unary_stream" if handler.response_streaming else "unary_unary"
    behavior = getattr(handler, kind)
    if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        return handler
    parse = handler.request_deserializer

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError as exc:
            return Undecodable(why_undecodable(desc, raw, exc))

    wrap = _stream_requests if handler.request_streaming else _unary_request
    return handler._replace(request_deserializer=deserialize, **{kind: wrap(behavior)})


def _unary_request(behavior: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def answers(request: Any, context: Any) -> AsyncIterator[Any]:
            if type(request) is Undecodable:
                await context.abort(_BAD, request.why)
            async for answer in behavior(request, context):
                yield answer

        return answers

    async def answer(request: Any, context: Any) -> Any:
        if type(request) is Undecodable:
            await context.abort(_BAD, request.why)
        return await behavior(request, context)

    return answer


def _stream_requests(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def until_undecodable(
        requests: AsyncIterator[Any], bad: list[Undecodable]
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if type(request) is Undecodable:
                bad.append(request)
                return
            yield request

    if inspect.isasyncgenfunction(behavior):

        async def answers(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            bad: list[Undecodable] = []
            async for answer in behavior(until_undecodable(requests, bad), context):
                yield answer
            if bad:
                await context.abort(_BAD, bad[0].why)

        return answers

    async def answer(requests: AsyncIterator[Any], context: Any) -> Any:
        bad: list[Undecodable] = []
        result = await behavior(until_undecodable(requests, bad), context)
        if bad:
            await context.abort(_BAD, bad[0].why)
        return result

    return answer


def why_undecodable(desc: Descriptor, raw: bytes, exc: DecodeError) -> str:
    """What the client is told of a `desc` request that raised `exc`: the field that is
    not valid UTF-8 if one is, else protobuf's own words."""
    field = _bad_utf8(desc, raw, "", 0)
    if field is None:
        return str(exc)
    return f"Error parsing message with type {desc.full_name!r}: field {field} is not valid UTF-8"


def _bad_utf8(desc: Descriptor, data: bytes, path: str, depth: int) -> str | None:
    """The path of the first string field in `data` (a `desc` message on the wire) that
    is not UTF-8, None if none is (or the bytes stop making sense first)."""
    if depth > _MAX_DEPTH:
        return None
    seen: dict[int, int] = {}  # field number -> values of it so far (repeated fields)
    at = 0
    try:
        while at < len(data):
            key, at = read_varint(data, at)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, at = read_varint(data, at)
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
            elif wire == 2:
                size, at = read_varint(data, at)
                value, at = data[at : at + size], at + size
                field = desc.fields_by_number.get(number)
                if field is None:
                    continue
                name = path + field.name
                if field.is_repeated:
                    seen[number] = seen.get(number, -1) + 1
                    name += f"[{seen[number]}]"
                if field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        value.decode()
                    except UnicodeDecodeError:
                        return name
                elif field.message_type is not None:
                    found = _bad_utf8(field.message_type, value, name + ".", depth + 1)
                    if found is not None:
                        return found
            else:
                return None  # groups (never used here) or garbage
    except IndexError:
        return None
    return None
