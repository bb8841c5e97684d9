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
`index * 32`: `magic i32 | pos i64 | size i32 | index i64 | term i64`. The entry
checkpoint and the log's base (`entries.checkpoint`, `entries.base`) are one
record each: `index i64 | term i64 | pos i64 | chainCrc u32 | crc u32` (CRC32 of
the fields before it).

One set of checks for every reader: `header_fault` (magic, size against body
length, the position the entry names), `body_fault` (body CRC, without copying
the body) and `is_filler`; `decode_entry` runs them on one entry, copies its body
out and can check the chain link; `entry_headers` and `header_faults` are the
header checks over many entries at once (numpy), for reads that take entries by
the thousand. Callers decide what a fault means to them (damage, or a caller's
position where no entry starts).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from store.arrays import Bools, I64s, U8s, windows
from store.errors import CorruptEntry

__all__ = [
    "CHAIN_FIELDS",
    "ENTRY_MAGIC",
    "FILLER",
    "FILLER_MAGIC",
    "FILLER_MIN",
    "HEADER",
    "HEADER_DTYPE",
    "HEADER_SIZE",
    "INDEX_DTYPE",
    "INDEX_UNIT",
    "INDEX_UNIT_SIZE",
    "RECORD",
    "StoredEntry",
    "body_fault",
    "chain_crc",
    "decode_entry",
    "decode_record",
    "encode_entry",
    "encode_record",
    "entry_headers",
    "header_fault",
    "header_faults",
    "is_filler",
]

ENTRY_MAGIC = struct.unpack(">i", b"\xca\xfe\xba\xbe")[0]
FILLER_MAGIC = -1
HEADER = struct.Struct(">iiqqqiIIi")
HEADER_SIZE = HEADER.size
CHAIN_FIELDS = struct.Struct(">iiqqqiIi")  # the header without chainCrc
FILLER = struct.Struct(">ii")  # magic, size: a filler, and the first 8 bytes of an entry
FILLER_MIN = FILLER.size
INDEX_UNIT = struct.Struct(">iqiqq")
INDEX_UNIT_SIZE = INDEX_UNIT.size
# INDEX_UNIT as a numpy record, to read many units at once.
INDEX_DTYPE = np.dtype(
    [("magic", ">i4"), ("pos", ">i8"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8")]
)
RECORD = struct.Struct(">qqqII")  # index, term, pos, chainCrc, CRC32 of the rest
# The header for many entries at once (numpy), the same fields as HEADER.
HEADER_DTYPE = np.dtype(
    [
        ("magic", ">i4"),
        ("size", ">i4"),
        ("index", ">i8"),
        ("term", ">i8"),
        ("pos", ">i8"),
        ("channel", ">i4"),
        ("chain_crc", ">u4"),
        ("body_crc", ">u4"),
        ("body_len", ">i4"),
    ]
)

assert HEADER_SIZE == HEADER_DTYPE.itemsize == 48
assert INDEX_UNIT_SIZE == INDEX_DTYPE.itemsize == 32
assert INDEX_UNIT_SIZE == 32

Buffer = bytes | bytearray | memoryview


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


def is_filler(magic: int, size: int, pos: int, segment_size: int) -> bool:
    """Whether `magic, size` (the first 8 bytes at log position `pos`) is the filler that
    pads its segment to the end."""
    return magic == FILLER_MAGIC and size == segment_size - pos % segment_size


def header_fault(magic: int, size: int, entry_pos: int, body_len: int, pos: int) -> str | None:
    """Why a header (these of its fields: `HEADER.unpack_from` gives them all) is not
    the header of an entry lying at log position `pos`: bad magic, a size that
    disagrees with the body length, another position; None when it is."""
    if magic != ENTRY_MAGIC:
        return f"bad magic {magic:#x}"
    if body_len < 0 or size != HEADER_SIZE + body_len:
        return f"size {size} disagrees with body length {body_len}"
    if entry_pos != pos:
        return f"entry says it lies at {entry_pos}"
    return None


def body_fault(body: Buffer, body_crc: int, index: int) -> str | None:
    """Why `body` is not the body the header of entry `index` vouches for (`body_crc`,
    its CRC32); None when it is. Pass a memoryview to check it without a copy."""
    if zlib.crc32(body) != body_crc:
        return f"body CRC mismatch in entry {index}"
    return None


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
    fault = header_fault(magic, size, epos, body_len, pos)
    if fault is not None:
        raise _Bad(fault)
    end = offset + size
    if end > len(buf):
        raise _Bad("truncated body")
    body = bytes(buf[offset + HEADER_SIZE : end])
    fault = body_fault(body, body_crc, index)
    if fault is not None:
        raise _Bad(fault)
    if (
        prev_chain is not None
        and chain_crc(prev_chain, size, index, term, pos, channel, body_crc) != chain
    ):
        raise _Bad(f"chain CRC mismatch in entry {index}")
    return StoredEntry(index, term, pos, channel, chain, body_crc, body)


# -- many entries at once ----------------------------------------------------------


def entry_headers(buf: bytes | mmap.mmap | U8s, offsets: I64s) -> npt.NDArray[np.void]:
    """The headers at `offsets` in `buf`, as one HEADER_DTYPE array (a copy: no view of
    `buf` outlives the call); CorruptEntry when one lies outside `buf`."""
    if not len(offsets):
        return np.zeros(0, HEADER_DTYPE)
    if int(offsets.min()) < 0 or int(offsets.max()) + HEADER_SIZE > len(buf):
        raise CorruptEntry(None, int(offsets.max()), "an entry header lies outside the file")
    arr: U8s = np.frombuffer(buf, np.uint8)
    return windows(arr, HEADER_SIZE)[offsets].view(HEADER_DTYPE)


def header_faults(
    heads: npt.NDArray[np.void], positions: I64s, body_lens: I64s | None = None
) -> Bools:
    """`header_fault` of many headers at once: which are not the headers of entries at
    `positions` (and, when given, with those body lengths)."""
    body_len = heads["body_len"].astype(np.int64)
    bad: Bools = (
        (heads["magic"] != ENTRY_MAGIC)
        | (body_len < 0)
        | (heads["size"] != HEADER_SIZE + body_len)
        | (heads["pos"] != positions)
    )
    if body_lens is not None:
        bad |= body_len != body_lens
    return bad


# -- checkpoint records -------------------------------------------------------------


def encode_record(index: int, term: int, pos: int, chain: int) -> bytes:
    """An `entries.checkpoint` or `entries.base` record."""
    body = RECORD.pack(index, term, pos, chain, 0)[:-4]
    return body + struct.pack(">I", zlib.crc32(body))


def decode_record(raw: bytes, where: str | None = None) -> tuple[int, int, int, int]:
    """(index, term, pos, chainCrc) of a record; CorruptEntry when it is not one."""
    if len(raw) != RECORD.size:
        raise CorruptEntry(where, 0, f"record of {len(raw)} bytes")
    index, term, pos, chain, crc = RECORD.unpack(raw)
    if zlib.crc32(raw[:-4]) != crc:
        raise CorruptEntry(where, 0, "record CRC mismatch")
    return index, term, pos, chain
