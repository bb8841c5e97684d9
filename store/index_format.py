"""The index file format: RocketMQ's on-disk hash index from `topic#key` to offsets.

An index file is a big-endian, memory-mapped, sparse file:

    header (40 bytes): beginTimestamp i64 | endTimestamp i64 | beginPhyOffset i64
                       | endPhyOffset i64 | hashSlotCount i32 | indexCount i32
    slot_count slots (4 bytes): the newest entry number whose key hashes there
    entry_count entries (20 bytes): keyHash i32 | phyOffset i64
                       | timeDiff i32 (seconds since beginTimestamp) | prevIndex i32

Entry numbers start at 1 (entry 0 is never used, 0 means "none"), so, as in
RocketMQ, a file of `entry_count` entries holds `entry_count - 1` keys; `indexCount`
is one more than the number of entries, `hashSlotCount` counts used slots. A key
hashes as `abs(java hashCode("topic#key"))` and lives in slot `hash % slot_count`;
each entry links to the previous entry of its slot, so a chain is newest first.

This module holds the layout (structs, sizes), how keys hash (one key, or a
batch's keys from their column hashes: `topic_key_hashes`), how store times
become time diffs, and the column readers the crash repair scans entries with.
`store.index_file` is one file (`IndexFile`), `store.index_service` the files of
a store (`IndexService`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence

import numpy as np

from store.arrays import I64s
from store.message import java_string_hash
from store.message_batch import POW31_U32

__all__ = [
    "DEFAULT_ENTRY_COUNT",
    "DEFAULT_SLOT_COUNT",
    "ENTRY",
    "ENTRY_DTYPE",
    "ENTRY_SIZE",
    "HEADER",
    "HEADER_SIZE",
    "I32_MAX",
    "INVALID_INDEX",
    "SLOT",
    "SLOT_SIZE",
    "build_key",
    "entry_column",
    "first_zero_entry",
    "index_key_hash",
    "time_diff_s",
    "time_diffs_s",
    "topic_key_hashes",
]

HEADER = struct.Struct(">qqqqii")
SLOT = struct.Struct(">i")
ENTRY = struct.Struct(">iqii")
ENTRY_DTYPE = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")]
)
HEADER_SIZE = HEADER.size
SLOT_SIZE = SLOT.size
ENTRY_SIZE = ENTRY.size
assert (HEADER_SIZE, SLOT_SIZE, ENTRY_SIZE) == (40, 4, 20) == (40, 4, ENTRY_DTYPE.itemsize)

DEFAULT_SLOT_COUNT = 5_000_000
DEFAULT_ENTRY_COUNT = 20_000_000
INVALID_INDEX = 0  # an entry number that names no entry
I32_MAX = 0x7FFFFFFF
SWAP = sys.byteorder == "little"  # array() is host order, the file big-endian


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def index_key_hash(key: str) -> int:
    """RocketMQ's indexKeyHashMethod: `Math.abs(key.hashCode())`, 0 for Integer.MIN_VALUE."""
    h = java_string_hash(key)
    return 0 if h == -0x80000000 else abs(h)


def topic_key_hashes(
    topics: Sequence[str], topic_index: I64s, key_hash: I64s, key_units: I64s
) -> I64s:
    """`index_key_hash(build_key(topics[t], key))` for keys given by the topic they go
    with, their Java hashCode (unsigned 32-bit) and their length in UTF-16 units:
    hashCode(a + b) = hashCode(a) * 31^len(b) + hashCode(b), mod 2^32."""
    prefix = np.array([java_string_hash(build_key(t, "")) & 0xFFFFFFFF for t in topics], np.uint32)
    whole = prefix[topic_index] * POW31_U32[key_units] + key_hash.astype(np.uint32)
    signed = whole.view(np.int32).astype(np.int64)
    hashes: I64s = np.where(signed == -(1 << 31), 0, np.abs(signed))
    return hashes


def time_diff_s(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    """An entry's timeDiff: whole seconds after the file's begin, clamped to [0, i32 max]."""
    return min(max((store_timestamp_ms - begin_timestamp_ms) // 1000, 0), I32_MAX)


def time_diffs_s(store_timestamps_ms: I64s, begin_timestamp_ms: int) -> I64s:
    """`time_diff_s` of each timestamp (in Python ints where int64 could overflow)."""
    limit = 1 << 61
    low, high = int(store_timestamps_ms.min()), int(store_timestamps_ms.max())
    if max(abs(begin_timestamp_ms), abs(low), abs(high)) >= limit:
        return np.array(
            [time_diff_s(t, begin_timestamp_ms) for t in store_timestamps_ms.tolist()], np.int64
        )
    diffs: I64s = np.minimum(
        np.maximum((store_timestamps_ms - begin_timestamp_ms) // 1000, 0), I32_MAX
    )
    return diffs


def entry_column(raw: bytes, at: int, code: str = "i") -> array[int]:
    """The big-endian field at byte `at` of every 20-byte entry in `raw`, in host order:
    `code` "i" for an i32, "q" for an i64."""
    n = len(raw) // ENTRY_SIZE
    width = 8 if code == "q" else 4
    col = bytearray(width * n)
    for j in range(width):
        col[j::width] = raw[at + j :: ENTRY_SIZE][:n]
    values = array(code, col)
    if SWAP:
        values.byteswap()
    return values


def first_zero_entry(raw: bytes) -> int:
    """Index of the first all-zero entry in `raw` (lost in a crash), else the count."""
    zero = bytes(ENTRY_SIZE)
    at = raw.find(zero)
    while at >= 0:
        if at % ENTRY_SIZE == 0:
            return at // ENTRY_SIZE
        at = raw.find(zero, at + ENTRY_SIZE - at % ENTRY_SIZE)
    return len(raw) // ENTRY_SIZE
