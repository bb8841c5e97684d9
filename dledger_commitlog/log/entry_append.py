"""The bytes an append writes: a batch of Raft entries encoded for the entry store.

Owns `encode_entries`: the data-file bytes (entry headers and bodies, and the
filler that closes a segment an entry does not fit in) and the index units of a
batch of entries appended after a given tail, with the chainCrc carried from
entry to entry. It writes nothing; `EntryStore.append_entries` writes what it
returns and moves its tail.

NORMAL entries whose body is a RocketMQ message get the message's physicalOffset
field set to `pos + 48` when `patch` is set (so replica files are byte-identical).
Invariant: the entries must follow the tail densely with non-decreasing terms and
each fit in one segment, else ValueError before anything is returned.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from raft.types import Entry, EntryKind
from store.entry_format import (
    CHAIN_FIELDS,
    ENTRY_MAGIC,
    FILLER,
    FILLER_MAGIC,
    FILLER_MIN,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
)
from store.message import MESSAGE_MAGIC_CODE, PHYSICAL_OFFSET_POS

_MSG_MAGIC = struct.pack(">i", MESSAGE_MAGIC_CODE)
_PHY = struct.Struct(">q")


class EncodedEntries(NamedTuple):
    """What `encode_entries` produced, for the store to write and remember."""

    data: bytearray  # for the data files, from the write position on
    units: bytearray  # for the index, one unit per entry
    stored: list[Entry]  # the entries as stored (physicalOffset patched)
    body_bytes: int  # the sum of their body lengths
    positions: list[int]  # where each entry starts
    last: tuple[int, int, int]  # the new tail: (last index, its term, its chainCrc)


def encode_entries(
    entries: Sequence[Entry],
    *,
    pos: int,
    left: int,
    segment_size: int,
    tail: tuple[int, int, int],
    patch: bool,
) -> EncodedEntries:
    """Encode `entries` to follow `tail` (last index, term, chainCrc), the first
    written at `pos` with `left` bytes left in its segment of `segment_size`."""
    seg_size = segment_size
    buf = bytearray()
    units = bytearray()
    prev_index, term, chain = tail
    positions: list[int] = []
    cached: list[Entry] = []
    cached_size = 0
    normal = EntryKind.NORMAL
    crc32, chain_pack, head_pack = zlib.crc32, CHAIN_FIELDS.pack, HEADER.pack
    unit_pack, phy_pack = INDEX_UNIT.pack, _PHY.pack
    for e in entries:
        index, eterm, body, kind = e.index, e.term, e.data, e.kind
        stored = e
        if index != prev_index + 1 or eterm < term:
            raise ValueError(f"entry {index} (term {eterm}) does not follow {prev_index}")
        blen = len(body)
        size = HEADER_SIZE + blen
        if size + FILLER_MIN > left:
            if size + FILLER_MIN > seg_size:
                raise ValueError(f"entry of {size} bytes exceeds the segment size {seg_size}")
            buf += FILLER.pack(FILLER_MAGIC, left)
            buf += bytes(left - FILLER_MIN)
            pos += left
            left = seg_size
        if patch and kind == normal and body.startswith(_MSG_MAGIC, 4):
            body = b"".join(
                (
                    body[:PHYSICAL_OFFSET_POS],
                    phy_pack(pos + HEADER_SIZE),
                    body[PHYSICAL_OFFSET_POS + 8 :],
                )
            )
            stored = Entry(index, eterm, body, kind)
        # entry_format.encode_entry, inlined: this loop is the append hot path (the
        # one decoder, decode_entry, verifies these bytes on every read and recovery).
        body_crc = crc32(body)
        chain = crc32(chain_pack(ENTRY_MAGIC, size, index, eterm, pos, kind, body_crc, blen), chain)
        buf += head_pack(ENTRY_MAGIC, size, index, eterm, pos, kind, chain, body_crc, blen)
        buf += body
        units += unit_pack(ENTRY_MAGIC, pos, size, index, eterm)
        cached.append(stored)
        cached_size += blen
        positions.append(pos)
        pos += size
        left -= size
        prev_index, term = index, eterm
    return EncodedEntries(buf, units, cached, cached_size, positions, (prev_index, term, chain))
