"""Runs of entries read from the files at once: what a leader sends a lagging follower.

Owns `decode_run`: the Raft entries of a run of index units, read in one read of the
data files and checked as `entry_format.decode_entry` checks each entry (magic, size
against body length, position, the index's entry number, body CRC), its header
checks over all headers at once with numpy (`entry_headers`, `header_faults`), only
the body CRC and the `Entry` left per entry. A leader catching a follower up reads
the whole log this way, about a thousand entries per MB.

Invariant: it returns entries only when every one of them passes those checks, cut
by size exactly as `EntryStore.stored_entries` cuts them; otherwise None, and the
caller decodes them one by one, which raises the precise CorruptEntry (file,
position, reason). A damaged entry is never returned.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from raft.types import KINDS, Entry
from store.entry_format import HEADER_SIZE, INDEX_DTYPE, entry_headers, header_faults
from store.errors import CorruptEntry

RUN_MIN = 16  # fewer entries than this: one by one costs less than numpy's set-up


def decode_run(
    units_raw: bytes, read: Callable[[int, int], bytes], max_bytes: int
) -> list[Entry] | None:
    """The entries the index units `units_raw` point to (at least one, as many as lie
    within `max_bytes` of the first's start), read with `read(pos, size)` from the
    data files; None if one does not check out (see the module doc)."""
    units = np.frombuffer(units_raw, INDEX_DTYPE)
    pos = units["pos"].astype(np.int64)
    ends = pos + units["size"].astype(np.int64)
    start = int(pos[0])
    count = max(1, int(np.searchsorted(ends - start, max_bytes, side="right")))
    end = int(ends[count - 1])
    if end <= start or bool(np.any(np.diff(pos[:count]) <= 0)):
        return None  # a damaged index: the one-by-one reader says where
    buf = read(start, end - start)
    offsets = pos[:count] - start
    try:
        heads = entry_headers(buf, offsets)
    except CorruptEntry:
        return None
    sizes = heads["size"].astype(np.int64)
    bad = header_faults(heads, pos[:count]) | (heads["index"] != units["index"][:count])
    if bool(np.any(bad | (offsets + sizes > len(buf)))):
        return None
    out: list[Entry] = []
    crc32, kinds = zlib.crc32, KINDS
    for index, term, channel, body_crc, at, size in zip(
        heads["index"].tolist(),
        heads["term"].tolist(),
        heads["channel"].tolist(),
        heads["body_crc"].tolist(),
        offsets.tolist(),
        sizes.tolist(),
        strict=True,
    ):
        body = buf[at + HEADER_SIZE : at + size]
        kind = kinds.get(channel)
        if kind is None or crc32(body) != body_crc:
            return None
        out.append(Entry(index, term, body, kind))
    return out
