"""One client port for every shard a process hosts: calls go to their shard.

A node process (docs/scaling.md) runs one client service per hosted shard
(`client_service.ClientService` over that shard's node). `shard_services` joins
them into one servicer table for the port: each RPC's handler reads the shard the
call names (metadata `dledger-group`, `common.protocol.SHARD_HEADER`; absent: shard
1) and runs that shard's handler (`Route` and `TopicUpdate` go to the process and
to shard 0 whatever they name, so a client of any shard can make them). A call for
a shard the process does not host is NOT_FOUND naming the shards it does host; a
shard header that is no number is INVALID_ARGUMENT. The request decoding
(`decoding`) wraps the joined handlers once, as it wraps a single service's.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from dledger_commitlog.common.protocol import SHARD_HEADER
from dledger_commitlog.service.decoding import Services, handler_table

Add = Callable[[Any, Any], None]
# RPCs whose shard is fixed: Route is the process's answer (any shard's service gives
# it), TopicUpdate a call of shard 0 (a process without shard 0: as any call).
_FIXED: dict[str, int | str] = {"Route": "any", "TopicUpdate": 0}


def shard_services(
    add: Add, servicers: Mapping[int, object], stopped: Mapping[int, str] | None = None
) -> Services:
    """The (add function, servicer) pair that registers `servicers`' handlers (one
    servicer per shard, all of one generated service `add`) as one dispatching table.
    `stopped`: the shards of the process that stopped (could not open, or failed), and
    why: a call for one is UNAVAILABLE saying so (the client tries another node)."""
    stopped = stopped if stopped is not None else {}
    tables = {g: handler_table(add, s) for g, s in servicers.items()}
    service = next(iter(tables.values()))[0]
    names = next(iter(tables.values()))[1].keys()
    hosted = ", ".join(str(g) for g in sorted(servicers))
    handlers = {}
    for name in names:
        by_shard = {g: table[1][name] for g, table in tables.items()}
        fixed = _FIXED.get(name)
        if fixed is not None:  # a call of the process, or of one shard, whatever it names
            shard = min(by_shard) if fixed == "any" else int(fixed)
            handlers[name] = by_shard.get(shard) or _dispatch(by_shard, hosted, stopped)
        else:
            handlers[name] = _dispatch(by_shard, hosted, stopped)

    def add_joined(_servicer: object, server: Any) -> None:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        server.add_registered_method_handlers(service, handlers)

    add_joined.__name__ = f"{add.__name__}_by_shard"
    return ((add_joined, None),)


async def _shard(
    context: Any, behaviors: Mapping[int, Any], hosted: str, stopped: Mapping[int, str]
) -> Any:
    """The behavior of the shard the call names, or abort."""
    shard = 1
    for key, value in context.invocation_metadata() or ():
        if key == SHARD_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            if not text.isdigit():
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{SHARD_HEADER} {text!r} is no shard id"
                )
            shard = int(text)
            break
    if stopped:
        why = stopped.get(shard)
        if why is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, why)
    if shard != 1:
        found = behaviors.get(shard)
        if found is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"this node process hosts shards {hosted}, not shard {shard}",
            )
        return found
    found = behaviors.get(1)
    if found is None:
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"this node process hosts shards {hosted}, not shard 1 (name "
            f"the shard in the {SHARD_HEADER} metadata)",
        )
    return found


def _dispatch(by_shard: Mapping[int, Any], hosted: str, stopped: Mapping[int, str]) -> Any:
    """One grpc.RpcMethodHandler that runs the handler of the call's shard."""
    first = next(iter(by_shard.values()))
    if first.request_streaming:
        kind = "stream_stream" if first.response_streaming else "stream_unary"
    else:
        kind = "unary_stream" if first.response_streaming else "unary_unary"
    behaviors = {g: getattr(h, kind) for g, h in by_shard.items()}
    if inspect.isasyncgenfunction(getattr(first, kind)):

        async def answers(request: Any, context: Any) -> AsyncIterator[Any]:
            behavior = await _shard(context, behaviors, hosted, stopped)
            async for answer in behavior(request, context):
                yield answer

        return first._replace(**{kind: answers})

    async def answer(request: Any, context: Any) -> Any:
        behavior = await _shard(context, behaviors, hosted, stopped)
        return await behavior(request, context)

    return first._replace(**{kind: answer})
