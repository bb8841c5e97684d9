"""Named errors of the store: expected failures callers can catch and report.

Everything the store raises on bad input or bad data is a `StoreError`; broken
internal assumptions are `assert`s instead. Each error keeps its fields as
attributes (for callers and tests) and renders a readable one-line message.
"""

from __future__ import annotations

__all__ = [
    "ConflictingWrite",
    "CorruptEntry",
    "DirectoryInUse",
    "InvalidMessage",
    "OffsetOutOfRange",
    "StoreError",
]


class StoreError(Exception):
    """Base of every named error of the store."""


class DirectoryInUse(StoreError):
    """Another process holds the lock of a store's directory (a node already runs on it)."""

    def __init__(self, directory: str, holder: str) -> None:
        super().__init__(directory, holder)
        self.directory = directory
        self.holder = holder

    def __str__(self) -> str:
        return f"{self.directory} is in use by another process ({self.holder})"


class InvalidMessage(StoreError):
    """A message a client asked us to store breaks a rule of the format (the caller's fault)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"invalid message: {self.reason}"


class CorruptEntry(StoreError):
    """Bytes read back from disk (or from a peer) fail a check: magic, size, CRC, layout.

    `file` names where the bytes came from (a path, or a description such as
    "message" when decoding a buffer); `offset` is the position of the record
    in that file's logical address space.
    """

    def __init__(self, file: str | None, offset: int, reason: str) -> None:
        super().__init__(file, offset, reason)
        self.file = file
        self.offset = offset
        self.reason = reason

    def __str__(self) -> str:
        where = f"{self.file} " if self.file else ""
        return f"corrupt entry at {where}offset {self.offset}: {self.reason}"


class OffsetOutOfRange(StoreError):
    """A read or write names an offset outside what the store holds (or would leave a gap)."""

    def __init__(self, offset: int, min_offset: int, max_offset: int, what: str = "offset") -> None:
        super().__init__(offset, min_offset, max_offset, what)
        self.offset = offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.what = what

    def __str__(self) -> str:
        return f"{self.what} {self.offset} outside [{self.min_offset}, {self.max_offset})"


class ConflictingWrite(StoreError):
    """An idempotent re-write found different data already stored at that position."""

    def __init__(self, file: str | None, offset: int, reason: str) -> None:
        super().__init__(file, offset, reason)
        self.file = file
        self.offset = offset
        self.reason = reason

    def __str__(self) -> str:
        where = f"{self.file} " if self.file else ""
        return f"conflicting write at {where}offset {self.offset}: {self.reason}"
