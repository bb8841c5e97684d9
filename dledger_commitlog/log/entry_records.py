"""The entry store's small records, and where its log starts.

Owns the format of `entries.checkpoint` and `entries.base`: one record each,
(index, term, pos, chainCrc) then a CRC32 of those 28 bytes (the codec is
`store.entry_format`'s `encode_record`/`decode_record`), written atomically
(`write_record`). The checkpoint names a committed, flushed entry (pos: where it
starts) from which recovery scans; the base names the entry before the first of a
log that retention or a restore cut (pos: where it ends). A snapshot carries the
base without its CRC (`BASE_SIZE` bytes, `pack_base`/`unpack_base`).

Also the index slot of the entry before the first (`start_slot`), which recovery
and a restore both write: the zero sentinel of a log from index 1, else one
rebuilt from the base (position = its end, size 0; only its term is ever read).
Invariant: a record that does not pass its CRC is never taken for one
(CorruptEntry naming the file).
"""

from __future__ import annotations

from pathlib import Path

from store.entry_format import (
    ENTRY_MAGIC,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    RECORD,
    decode_record,
    encode_record,
)
from store.fileio import write_atomically
from store.mapped_file import MappedFileQueue, segment_name

# (index, term, pos, chainCrc) of one entry.
Record = tuple[int, int, int, int]

BASE_SIZE = RECORD.size - 4  # the record without its CRC
CHECKPOINT_FILE = "entries.checkpoint"
BASE_FILE = "entries.base"


def read_record(path: Path) -> Record | None:
    """A checkpoint or base record, CRC-checked; None if the file does not exist."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_record(raw, str(path))


def write_record(path: Path, record: Record) -> None:
    """Write a checkpoint or base record atomically (fsynced)."""
    write_atomically(path, encode_record(*record))


def pack_base(record: Record) -> bytes:
    """The record's fields without their CRC: how a snapshot carries the base."""
    return RECORD.pack(*record, 0)[:BASE_SIZE]


def unpack_base(data: bytes) -> Record:
    """The base at the start of a snapshot's data (ValueError if it is too short)."""
    if len(data) < BASE_SIZE:
        raise ValueError(f"snapshot data of {len(data)} bytes, expected >= {BASE_SIZE}")
    index, term, pos, chain, _ = RECORD.unpack(data[:BASE_SIZE] + bytes(4))
    return index, term, pos, chain


def start_slot(base: Record | None) -> bytes:
    """The index slot of the entry before the first: the sentinel or the base's."""
    if base is None:
        return bytes(INDEX_UNIT_SIZE)
    index, term, pos, _ = base
    return INDEX_UNIT.pack(ENTRY_MAGIC, pos, 0, index, term)


def start_slot_ok(base: Record | None, raw: bytes) -> bool:
    """Whether `raw` serves as the slot of the entry before the first: the sentinel,
    or the base entry's own slot (ending at the base's end) or one rebuilt from it."""
    if base is None or (base[0] == 0 and raw == bytes(INDEX_UNIT_SIZE)):
        return raw == bytes(INDEX_UNIT_SIZE)
    if len(raw) != INDEX_UNIT_SIZE:
        return False
    magic, pos, size, index, term = INDEX_UNIT.unpack(raw)
    b_index, b_term, b_end, _ = base
    return magic == ENTRY_MAGIC and (index, term, pos + size) == (b_index, b_term, b_end)


def segment_file(data: MappedFileQueue, pos: int) -> str:
    """The path of the data segment that holds position `pos` (for error messages)."""
    return str(data.directory / segment_name(pos - pos % data.segment_size))
