"""The `@operation` descriptor: a client method written once for both clients.

Owns `operation`: the decorated function builds the call's `Op`, and the client
it is called on runs that Op with its own `_run` (`Client`: the result;
`AsyncClient`: a coroutine of it). `api.ClientBase`, `groups.GroupOps` and
`member_ops.MemberOps` declare their calls with it.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from dledger_commitlog.client.retry import Op

P = ParamSpec("P")
R = TypeVar("R")


class BlockingCalls:
    """A client whose operations return their results (`blocking.Client`)."""


class AsyncCalls:
    """A client whose operations return coroutines of their results (`aio.AsyncClient`)."""


class operation(Generic[P, R]):
    """A client method written once: the decorated function builds the call's `Op`,
    and the client it is called on runs it (`Client`: the result; `AsyncClient`: a
    coroutine of it). help() shows the builder's docstring and its signature, with
    the result the caller gets for the Op it builds."""

    def __init__(self, build: Callable[Concatenate[Any, P], Op[R]]) -> None:
        self._build = build
        self.__name__ = build.__name__
        self.__qualname__ = build.__qualname__
        self.__doc__ = build.__doc__
        signature = inspect.signature(build)
        result = str(signature.return_annotation).removeprefix("Op[").removesuffix("]")
        self.__signature__ = signature.replace(return_annotation=result)

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: BlockingCalls, owner: type[Any]) -> Callable[P, R]: ...
    @overload
    def __get__(
        self, client: AsyncCalls, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __get__(self, client: Any, owner: type[Any]) -> Any:
        return self if client is None else types.MethodType(self, client)

    def __call__(self, client: Any, *args: Any, **kwargs: Any) -> Any:
        return client._run(self._build(client, *args, **kwargs))
