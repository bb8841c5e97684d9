"""The entry store's small records, and where its log starts.

Owns the format of `entries.checkpoint` and `entries.base`: one record each,
(index, term, pos, chainCrc) then a CRC32 of those 28 bytes (the codec is
`store.entry_format`'s `encode_record`/`decode_record`), written atomically
(`write_record`). The checkpoint names a committed, flushed entry (pos: where it
starts) from which recovery scans; the base names the entry before the first of a
log that retention or a restore cut (pos: where it ends). A snapshot carries the
base without its CRC (`BASE_SIZE` bytes, `pack_base`; `snapshot_base` reads it back
and holds the rules a restored base keeps).

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
    HEADER_SIZE,
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
MAX_POS = 1 << 62  # a base's end position stays below this (4 EiB of log)
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


def snapshot_base(index: int, term: int, data: bytes) -> Record:
    """The base at the start of a snapshot's data, if a log restarting after entry
    `index` of `term` may start there; ValueError naming the rule it breaks.

    The one statement of these rules: `EntryStore.restore` and the node's check of a
    peer's Snapshot (`log.snapshot_check`) both call this. The base names exactly
    (index, term); it ends at a position in [index * HEADER_SIZE, MAX_POS): every
    entry of a log that starts at position 0 takes a header at least, and a position
    (like an index slot, at index * INDEX_UNIT_SIZE) stays far inside an i64.
    """
    if len(data) < BASE_SIZE:
        raise ValueError(f"snapshot data of {len(data)} bytes, expected >= {BASE_SIZE}")
    b_index, b_term, pos, chain, _ = RECORD.unpack(data[:BASE_SIZE] + bytes(4))
    if (b_index, b_term) != (index, term):
        raise ValueError(f"snapshot of entry {index} (term {term}) describes {b_index}/{b_term}")
    if not 0 <= index * HEADER_SIZE <= pos < MAX_POS:
        raise ValueError(
            f"snapshot of entry {index} ends at position {pos}, not in "
            f"[{max(0, index) * HEADER_SIZE}, {MAX_POS})"
        )
    return b_index, b_term, pos, chain


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
