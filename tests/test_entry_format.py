"""The entry codec's checks: one entry at a time and many at once agree, and with
decode_entry; fillers; checkpoint records. (The store that writes entries:
tests/test_entry_store.py.)"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from store.entry_format import (
    FILLER,
    FILLER_MAGIC,
    HEADER,
    HEADER_SIZE,
    body_fault,
    decode_entry,
    decode_record,
    encode_entry,
    encode_record,
    entry_headers,
    header_fault,
    header_faults,
    is_filler,
)
from store.errors import CorruptEntry


def entries(n: int, seed: int) -> tuple[bytes, list[int]]:
    """`n` entries laid end to end from log position 1000, and where each starts."""
    rng = random.Random(seed)
    buf, starts, chain = b"", [], 0
    for i in range(n):
        body = rng.randbytes(rng.randrange(0, 80))
        starts.append(1000 + len(buf))
        header, chain = encode_entry(chain, i + 1, 1, starts[-1], 0, body)
        buf += header + body
    return buf, starts


# (what to overwrite in an entry's header, and the fault it must give)
DAMAGE = [
    (0, ">i", 0x12345678, "bad magic"),
    (4, ">i", 7, "disagrees with body length"),
    (44, ">i", -1, "disagrees with body length"),
    (24, ">q", 5, "entry says it lies at 5"),
]


@pytest.mark.parametrize(("at", "fmt", "value", "reason"), DAMAGE)
def test_one_header_and_many_agree_with_decode_entry(
    at: int, fmt: str, value: int, reason: str
) -> None:
    buf, starts = entries(20, seed=at)
    damaged = bytearray(buf)
    struct.pack_into(fmt, damaged, starts[7] - 1000 + at, value)
    offsets = np.asarray(starts, np.int64) - 1000
    bad = header_faults(entry_headers(bytes(damaged), offsets), offsets + 1000)
    assert np.flatnonzero(bad).tolist() == [7]
    for i, pos in enumerate(starts):
        magic, size, _, _, epos, _, _, _, body_len = HEADER.unpack_from(damaged, pos - 1000)
        fault = header_fault(magic, size, epos, body_len, pos)
        assert (fault is not None) == (i == 7)
        if i == 7:
            assert fault is not None and reason in fault
            with pytest.raises(CorruptEntry, match=reason):
                decode_entry(bytes(damaged), pos - 1000, pos)
        else:
            decode_entry(bytes(damaged), pos - 1000, pos)


def test_expected_body_lengths_and_body_crcs() -> None:
    buf, starts = entries(5, seed=1)
    offsets = np.asarray(starts, np.int64) - 1000
    heads = entry_headers(buf, offsets)
    lens = heads["body_len"].astype(np.int64)
    assert not header_faults(heads, offsets + 1000, lens).any()
    assert header_faults(heads, offsets + 1000, lens + 1).all()
    assert entry_headers(buf, offsets[:0]).shape == (0,)
    with pytest.raises(CorruptEntry, match="outside the file"):
        entry_headers(buf, np.asarray([len(buf) - HEADER_SIZE + 1], np.int64))
    _, size, index, _, _, _, _, body_crc, _ = HEADER.unpack_from(buf, 0)
    body = bytearray(buf[HEADER_SIZE:size])
    assert body_fault(memoryview(body), body_crc, index) is None
    body.append(0)
    assert body_fault(body, body_crc, index) == f"body CRC mismatch in entry {index}"


def test_a_filler_pads_its_segment_to_the_end() -> None:
    raw = FILLER.pack(FILLER_MAGIC, 96)
    magic, size = FILLER.unpack(raw)
    assert is_filler(magic, size, pos=4000, segment_size=4096)
    assert not is_filler(magic, size, pos=4001, segment_size=4096)
    assert not is_filler(0, size, pos=4000, segment_size=4096)


def test_checkpoint_records_round_trip_and_refuse_damage() -> None:
    raw = encode_record(7, 2, 4096, 0xDEADBEEF)
    assert decode_record(raw) == (7, 2, 4096, 0xDEADBEEF)
    with pytest.raises(CorruptEntry, match="record CRC mismatch"):
        decode_record(raw[:-1] + bytes([raw[-1] ^ 1]), "entries.checkpoint")
    with pytest.raises(CorruptEntry, match="record of 31 bytes"):
        decode_record(raw[:-1])
