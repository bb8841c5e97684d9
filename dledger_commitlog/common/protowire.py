"""Protobuf's wire format, read by hand where a parse would cost too much: the
varint every field key and length is written in. Shared by the service (which
finds the field a bad request broke) and analytics (which reads ReadLog chunks
without copying their bytes)."""

from __future__ import annotations


def read_varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """The varint starting at `at` in `data`, and where it ends (IndexError if `data`
    ends inside it)."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
