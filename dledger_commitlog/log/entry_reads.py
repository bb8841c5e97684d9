"""Commit-log reads by position, in the read pool: a run of entries (ReadRange) and one
message where the key index points (QueryByKey).

Both read through `reads.read_log_checked` with a `reads.LogView` the loop took,
so `reads`' thread-safety rules and checks hold: descriptors of the call's own,
committed bytes only, every entry served checked (magic, position, size, body
CRC), a damaged one a `CorruptEntry`, never served. A run of entries shares the
service's `VerifiedRanges` with ReadLog (committed bytes never change: a range
checked once is served again without a second CRC pass). QueryByKey's reads are
scattered single entries: they are checked each time and recorded nowhere (a
range per message would only crowd the ranges ReadLog keeps).

A new module rather than more of `reads` (which would pass 600 lines): it uses
only `reads`' public functions.
"""

from __future__ import annotations

from typing import Final

from dledger_commitlog.log.reads import LogView, VerifiedRanges, read_log_checked
from raft.types import EntryKind
from store.entry_format import ENTRY_MAGIC, FILLER, FILLER_MAGIC, FILLER_MIN, HEADER, HEADER_SIZE
from store.errors import CorruptEntry, InvalidMessage, OffsetOutOfRange

_CHUNK_BYTES: Final = 1 << 20  # read and checked at once by a run of entries


def entries_from(
    view: LogView, verified: VerifiedRanges, pos: int, max_entries: int, max_bytes: int
) -> tuple[list[bytes], int]:
    """The bodies of the messages among at most `max_entries` entries from `pos`, and
    where the last of those entries ends (`pos` if none).

    `pos` is where an entry or a segment's filler starts (where one the caller read
    ends). Whole entries only, fillers skipped, as long as their span from `pos`
    stays within `max_bytes` (none if the first alone is bigger); nothing at or
    beyond the committed position. Read (and checked) a chunk at a time; only the
    entries served must be intact. No entry where one must start is damage
    (CorruptEntry); a file retention deleted since the view is OffsetOutOfRange.
    """
    bodies: list[bytes] = []
    at, end, count, need = pos, pos, 0, HEADER_SIZE
    careful = False  # damage met in a chunk: an entry a read, to serve the ones before it
    while count < max_entries and at < view.committed:
        if at + need > view.committed:
            raise CorruptEntry(view.where(at), at, "the committed log ends inside an entry")
        want = need if careful else max(need, min(max_bytes - (at - pos), _CHUNK_BYTES))
        try:
            buf = read_log_checked(view, verified, at, want, view.committed)
        except InvalidMessage as exc:  # `at` ends a checked entry: no entry there is damage
            raise CorruptEntry(view.where(at), at, str(exc)) from None
        except CorruptEntry:
            if careful:
                raise
            careful = True
            continue
        off = 0
        while count < max_entries and off + FILLER_MIN <= len(buf):
            magic, size = FILLER.unpack_from(buf, off)
            if magic == FILLER_MAGIC:
                off += size
                continue
            if off + size > len(buf):  # cut where a range checked before ends: read it whole
                break
            if at + off + size - pos > max_bytes:
                return bodies, end
            _, _, _, _, _, channel, _, _, body_len = HEADER.unpack_from(buf, off)
            if channel == EntryKind.NORMAL and body_len:
                bodies.append(buf[off + HEADER_SIZE : off + size])
            count += 1
            off += size
            end = at + off
        rest = len(buf) - off
        need = FILLER.unpack_from(buf, off)[1] if rest >= FILLER_MIN else HEADER_SIZE
        at += off
    return bodies, end


def message_at(view: LogView, offset: int) -> bytes | None:
    """The message at commit-log `offset` (where the key index says one lies), its entry
    checked; None if retention deleted it (below the view, or its file gone since)."""
    start = offset - HEADER_SIZE
    if start < view.min_pos:
        return None
    try:
        buf = read_log_checked(view, VerifiedRanges(), start, HEADER_SIZE, view.committed)
        magic, size, _, _, _, channel, _, _, body_len = HEADER.unpack_from(buf)
        if magic == ENTRY_MAGIC and channel == EntryKind.NORMAL and body_len:
            return buf[HEADER_SIZE:size]
    except OffsetOutOfRange:
        return None  # retention deleted its file since the view was taken
    except InvalidMessage:
        pass
    raise CorruptEntry(view.where(start), start, "no message starts where the key index points")
