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


class RpcFailed(SourceError):
    """A server refused a call (not a failure worth another server)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
