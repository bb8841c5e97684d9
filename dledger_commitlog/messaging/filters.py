"""Message filters evaluated on the server: RocketMQ's TAG expressions and SQL92 property filters.

Owns `MessageFilter` (a compiled filter: kind, expression and `matches`),
`compile_filter` (the one way in: checks and compiles an expression once) and
`FilterError` (an expression that does not compile; an `InvalidMessage`, so the
service answers it as the client's fault). Pure: no I/O, no clock; a compiled
filter is a tree of closures that runs per message (comparisons of literals are
decided when compiling; `accepts_all` tells a filter that takes everything).

TAG (the kind "" too): `*` or empty takes every message, `TagA || TagB` takes a
message whose tag is one of them (`dispatch.dispatcher.parse_tag_expression`).

SQL92: RocketMQ's subset of SQL92 over a message's properties and tag; the
language, its evaluation and its limits are `messaging.sql92`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

from dispatch.dispatcher import parse_tag_expression
from dledger_commitlog.messaging.sql92 import FilterError as FilterError
from dledger_commitlog.messaging.sql92 import Predicate, always, compile_sql92
from store.errors import InvalidMessage

__all__ = ["KINDS", "FilterError", "MessageFilter", "compile_filter"]

KINDS: Final = ("TAG", "SQL92")


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """A compiled filter. Equal (and hashed) by kind and expression; `kind` is "TAG" or "SQL92"."""

    kind: str
    expression: str
    _predicate: Predicate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = _kind(self.kind)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "_predicate", _compile(kind, self.expression))

    def matches(self, tags: str | None, properties: Mapping[str, str]) -> bool:
        """Whether a message with this tag (None or "": none) and these properties passes."""
        return self._predicate(tags, properties)

    @property
    def accepts_all(self) -> bool:
        """Takes every message (TAG `*` or empty, SQL92 `TRUE`): the server may skip matching."""
        return self._predicate is always

    def __reduce__(self) -> tuple[type[MessageFilter], tuple[str, str]]:
        # the closures do not pickle; a filter is rebuilt from its expression
        return (MessageFilter, (self.kind, self.expression))


def compile_filter(kind: str, expression: str) -> MessageFilter:
    """kind "TAG" (case-insensitive; "" means TAG): `*` or "" = all, "A || B" = either tag;
    kind "SQL92": parsed once (FilterError on bad syntax, naming the column). Unknown kind:
    FilterError. Compiled filters are cached by (kind, expression)."""
    return _compile_cached(kind, expression)


@lru_cache(maxsize=1024)
def _compile_cached(kind: str, expression: str) -> MessageFilter:
    return MessageFilter(kind, expression)


def _kind(kind: str) -> str:
    norm = kind.strip().upper() or "TAG"
    if norm not in KINDS:
        raise FilterError(f"unknown filter kind {kind!r}: use TAG or SQL92")
    return norm


def _compile(kind: str, expression: str) -> Predicate:
    if kind == "TAG":
        try:
            tags = parse_tag_expression(expression)
        except InvalidMessage as exc:
            raise FilterError(f"TAG filter: {exc.reason}") from None
        if tags is None:
            return always
        return lambda t, _p: t in tags
    return compile_sql92(expression)
