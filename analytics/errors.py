"""Errors of the analytics package: each message says what is wrong and what to do."""

from __future__ import annotations


class AnalyticsError(Exception):
    """Base of the expected failures of the source, the export and the jobs."""


class OptionError(AnalyticsError, ValueError):
    """A bad option: unknown name, bad value, unknown topic, malformed offsets JSON."""


class SourceError(AnalyticsError):
    """The servers or the data directory could not give what was asked for."""


# gRPC status codes (by name) worth another server; any other refusal is `RpcFailed`.
RETRIED_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED"})
# service.shard_calls's NOT_FOUND and Route's FAILED_PRECONDITION (service.routes), in
# the words of this release and of servers before shards had their name.
_NOT_HOSTED = ("this node process hosts shards", "this node process hosts groups")
_NO_ROUTES = ("does not host shard 0", "does not host group 0")


def retried(code: str, details: str | None) -> bool:
    """Worth another server: a retried code, or a process that does not host the shard
    the call names (another process may)."""
    text = details or ""
    return (
        code in RETRIED_CODES
        or (code == "NOT_FOUND" and any(w in text for w in _NOT_HOSTED))
        or (code == "FAILED_PRECONDITION" and any(w in text for w in _NO_ROUTES))
    )


class RpcFailed(SourceError):
    """A server refused a call (not a failure worth another server)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
