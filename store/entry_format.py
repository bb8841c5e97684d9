"""The DLedger entry format: one codec for writers, readers, recovery and tools.

An entry is a 48-byte big-endian header and a body:

    magic i32 | size i32 | index i64 | term i64 | pos i64 | channel i32
    | chainCrc u32 | bodyCrc u32 | bodyLen i32

`size` counts header and body. `bodyCrc` is CRC32 of the body. `chainCrc` is CRC32
of every other header field (magic, size, index, term, pos, channel, bodyCrc,
bodyLen) seeded with the previous entry's chainCrc (0 before the first entry), so
one value at the tail vouches for the whole log before it. DLedger leaves both at
zero; we compute and verify them.

An entry never straddles a segment: when it does not fit (with room to spare for
a filler), a filler `magic -1 | remaining i32` pads the segment and the entry
opens the next one. The entry index holds 32 bytes per Raft index at
`index * 32`: `magic i32 | pos i64 | size i32 | index i64 | term i64`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from store.errors import CorruptEntry

ENTRY_MAGIC = struct.unpack(">i", b"\xca\xfe\xba\xbe")[0]
FILLER_MAGIC = -1
HEADER = struct.Struct(">iiqqqiIIi")
HEADER_SIZE = HEADER.size
CHAIN_FIELDS = struct.Struct(">iiqqqiIi")  # the header without chainCrc
FILLER = struct.Struct(">ii")
FILLER_MIN = FILLER.size
INDEX_UNIT = struct.Struct(">iqiqq")
INDEX_UNIT_SIZE = INDEX_UNIT.size

assert HEADER_SIZE == 48
assert INDEX_UNIT_SIZE == 32


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """An entry as it lies on disk, header fields included."""

    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body: bytes

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.body)


def chain_crc(
    prev_chain: int, size: int, index: int, term: int, pos: int, channel: int, body_crc: int
) -> int:
    fields = CHAIN_FIELDS.pack(ENTRY_MAGIC, size, index, term, pos, channel, body_crc, size - 48)
    return zlib.crc32(fields, prev_chain)


def encode_entry(
    prev_chain: int, index: int, term: int, pos: int, channel: int, body: bytes
) -> tuple[bytes, int]:
    """Header bytes for `body` at `pos`, and the new chain CRC."""
    size = HEADER_SIZE + len(body)
    body_crc = zlib.crc32(body)
    chain = chain_crc(prev_chain, size, index, term, pos, channel, body_crc)
    header = HEADER.pack(ENTRY_MAGIC, size, index, term, pos, channel, chain, body_crc, len(body))
    return header, chain


def decode_entry(
    buf: bytes | memoryview,
    offset: int,
    pos: int,
    *,
    where: Callable[[int], str] | None = None,
    prev_chain: int | None = None,
) -> StoredEntry:
    """Decode and verify the entry at `buf[offset:]`, which should lie at log position `pos`.

    Raises CorruptEntry naming the file (`where(pos)`, called only on failure) and
    `pos` on any mismatch; checks the chain link only when `prev_chain` is given.
    """
    try:
        return _decode(buf, offset, pos, prev_chain)
    except _Bad as bad:
        raise CorruptEntry(where(pos) if where else None, pos, str(bad)) from None


class _Bad(Exception):
    pass


def _decode(buf: bytes | memoryview, offset: int, pos: int, prev_chain: int | None) -> StoredEntry:
    if len(buf) - offset < HEADER_SIZE:
        raise _Bad("truncated header")
    magic, size, index, term, epos, channel, chain, body_crc, body_len = HEADER.unpack_from(
        buf, offset
    )
    if magic != ENTRY_MAGIC:
        raise _Bad(f"bad magic {magic:#x}")
    if body_len < 0 or size != HEADER_SIZE + body_len:
        raise _Bad(f"size {size} disagrees with body length {body_len}")
    if epos != pos:
        raise _Bad(f"entry says it lies at {epos}")
    end = offset + size
    if end > len(buf):
        raise _Bad("truncated body")
    body = bytes(buf[offset + HEADER_SIZE : end])
    if zlib.crc32(body) != body_crc:
        raise _Bad(f"body CRC mismatch in entry {index}")
    if (
        prev_chain is not None
        and chain_crc(prev_chain, size, index, term, pos, channel, body_crc) != chain
    ):
        raise _Bad(f"chain CRC mismatch in entry {index}")
    return StoredEntry(index, term, pos, channel, chain, body_crc, body)
