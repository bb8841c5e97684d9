"""Errors of the analytics package: each message says what is wrong and what to do."""

from __future__ import annotations


class AnalyticsError(Exception):
    """Base of the expected failures of the source, the export and the jobs."""


class OptionError(AnalyticsError, ValueError):
    """A bad option: unknown name, bad value, unknown topic, malformed offsets JSON."""


class SourceError(AnalyticsError):
    """The servers or the data directory could not give what was asked for."""
