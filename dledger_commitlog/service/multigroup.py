"""One client port for every Raft group a process hosts: calls go to their group.

A node process (docs/scaling.md) runs one client service per hosted group
(`client_service.ClientService` over that group's node). `group_services` joins
them into one servicer table for the port: each RPC's handler reads the group the
call names (metadata `dledger-group`, `common.protocol.GROUP_HEADER`; absent: group
1) and runs that group's handler (`Route` and `TopicUpdate` go to the process and
to group 0 whatever they name, so a client of any group can make them). A call for
a group the process does not host is NOT_FOUND naming the groups it does host; a
group header that is no number is INVALID_ARGUMENT. The request decoding
(`decoding`) wraps the joined handlers once, as it wraps a single service's.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from dledger_commitlog.common.protocol import GROUP_HEADER
from dledger_commitlog.service.decoding import Services, handler_table

Add = Callable[[Any, Any], None]
# RPCs whose group is fixed: Route is the process's answer (any group's service gives
# it), TopicUpdate a call of group 0 (a process without group 0: as any call).
_FIXED: dict[str, int | str] = {"Route": "any", "TopicUpdate": 0}


def group_services(
    add: Add, servicers: Mapping[int, object], stopped: Mapping[int, str] | None = None
) -> Services:
    """The (add function, servicer) pair that registers `servicers`' handlers (one
    servicer per group, all of one generated service `add`) as one dispatching table.
    `stopped`: the groups of the process that stopped (could not open, or failed), and
    why: a call for one is UNAVAILABLE saying so (the client tries another node)."""
    stopped = stopped if stopped is not None else {}
    tables = {g: handler_table(add, s) for g, s in servicers.items()}
    service = next(iter(tables.values()))[0]
    names = next(iter(tables.values()))[1].keys()
    hosted = ", ".join(str(g) for g in sorted(servicers))
    handlers = {}
    for name in names:
        by_group = {g: table[1][name] for g, table in tables.items()}
        fixed = _FIXED.get(name)
        if fixed is not None:  # a call of the process, or of one group, whatever it names
            group = min(by_group) if fixed == "any" else int(fixed)
            handlers[name] = by_group.get(group) or _dispatch(by_group, hosted, stopped)
        else:
            handlers[name] = _dispatch(by_group, hosted, stopped)

    def add_joined(_servicer: object, server: Any) -> None:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        server.add_registered_method_handlers(service, handlers)

    add_joined.__name__ = f"{add.__name__}_by_group"
    return ((add_joined, None),)


async def _group(
    context: Any, behaviors: Mapping[int, Any], hosted: str, stopped: Mapping[int, str]
) -> Any:
    """The behavior of the group the call names, or abort."""
    group = 1
    for key, value in context.invocation_metadata() or ():
        if key == GROUP_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            if not text.isdigit():
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{GROUP_HEADER} {text!r} is no group id")  # fmt: skip
            group = int(text)
            break
    if stopped:
        why = stopped.get(group)
        if why is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, why)
    if group != 1:
        found = behaviors.get(group)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"this node process hosts groups {hosted}, not "
                                f"group {group}")  # fmt: skip
        return found
    found = behaviors.get(1)
    if found is None:
        await context.abort(grpc.StatusCode.NOT_FOUND,
                            f"this node process hosts groups {hosted}, not group 1 (name "
                            f"the group in the {GROUP_HEADER} metadata)")  # fmt: skip
    return found


def _dispatch(by_group: Mapping[int, Any], hosted: str, stopped: Mapping[int, str]) -> Any:
    """One grpc.RpcMethodHandler that runs the handler of the call's group."""
    first = next(iter(by_group.values()))
    if first.request_streaming:
        kind = "stream_stream" if first.response_streaming else "stream_unary"
    else:
        kind = "unary_stream" if first.response_streaming else "unary_unary"
    behaviors = {g: getattr(h, kind) for g, h in by_group.items()}
    if inspect.isasyncgenfunction(getattr(first, kind)):

        async def answers(request: Any, context: Any) -> AsyncIterator[Any]:
            behavior = await _group(context, behaviors, hosted, stopped)
            async for answer in behavior(request, context):
                yield answer

        return first._replace(**{kind: answers})

    async def answer(request: Any, context: Any) -> Any:
        behavior = await _group(context, behaviors, hosted, stopped)
        return await behavior(request, context)

    return first._replace(**{kind: answer})
