"""Message heads for analytics, in the read pool: the messages at given commit-log
offsets, each without its body (ReadLog's `message_offsets`).

A Spark read that needs no `body` column checks and decodes only each message's
fixed part (88 bytes) and what follows its body (topic length, topic, properties
length, properties); sending only those instead of the raw entries cuts the bytes
such a read moves about threefold (256-byte bodies: ~455 bytes an entry, ~145 a
head), and with them the copies on both sides of the wire.

Checks, as ReadLog's: the entries of the span asked are checked once per process
(magic, position, size, body CRC: `reads.read_log_checked`, remembered in the
service's `VerifiedRanges`), and an offset asked must be where the message of an
entry starts (its header: magic, position, size), else `InvalidMessage`: within
checked entries that is the caller's mistake. What a message's own layout says is
not judged here: a tail that does not fit its entry is sent empty, and the
reader's layout checks refuse it. Nothing at or beyond the committed position is
read (the caller checks the last offset against its view).

Thread safety: `reads`' rules (a `LogView` taken on the loop, descriptors and maps
of the call's own, `reads.Files`).
"""

from __future__ import annotations

import itertools
from typing import Final

import numpy as np
import numpy.typing as npt

from dledger_commitlog.log.reads import Files, LogView, VerifiedRanges, read_log, read_log_checked
from store.arrays import windows
from store.entry_format import HEADER_SIZE, entry_headers, header_faults
from store.errors import InvalidMessage, OffsetOutOfRange
from store.message import FIXED_PART_SIZE, HEADER_DTYPE, MIN_MESSAGE_SIZE

MAX_HEADS: Final = 262_144  # offsets one request may ask for (2 MiB of them)
HEADS_PER_CHUNK: Final = 32_768  # messages per answer (about 5 MB of heads and tails)
_CHECK_BYTES: Final = 4 << 20  # a span not checked before is checked this much at a time
_ROW_WIDTH: Final = 256  # tails up to this long are gathered as the rows of a matrix
_COLUMNS: Final = np.arange(_ROW_WIDTH)

I64s = npt.NDArray[np.int64]


def parse_offsets(raw: bytes) -> I64s:
    """The offsets of a request (little-endian int64, rising, at most MAX_HEADS)."""
    if len(raw) % 8:
        raise InvalidMessage("message_offsets must be little-endian int64s (a multiple of 8 bytes)")
    offsets = np.frombuffer(raw, "<i8").astype(np.int64)
    if len(offsets) > MAX_HEADS:
        raise InvalidMessage(f"message_offsets: {len(offsets)} offsets, at most {MAX_HEADS}")
    if len(offsets) and int(offsets[0]) < HEADER_SIZE:
        raise InvalidMessage(f"message_offsets: {int(offsets[0])} is not a message's offset")
    if (np.diff(offsets) <= 0).any():
        raise InvalidMessage("message_offsets must rise")
    return offsets


def check_span(view: LogView, verified: VerifiedRanges, offsets: I64s) -> None:
    """Every entry from the one at `offsets[0]` to the one holding `offsets[-1]` checked,
    now or before (`verified`); the last offset lies below the committed position."""
    at, last = int(offsets[0]) - HEADER_SIZE, int(offsets[-1])
    if at < view.min_pos:
        raise OffsetOutOfRange(at, view.min_pos, view.committed, "commit-log position")
    while (at := verified.covering(at)) <= last:
        read_log_checked(view, verified, at, _CHECK_BYTES, min(view.committed, last + 1))


def message_heads(view: LogView, offsets: I64s) -> tuple[bytes, bytes, bytes]:
    """(fixed parts, tails end to end, tail offsets as little-endian int32) of the
    messages at `offsets` (in checked entries: `check_span`)."""
    heads: list[bytes] = []
    tails: list[npt.NDArray[np.uint8]] = []
    lengths: list[I64s] = []
    starts = offsets - HEADER_SIZE
    first = view.segments[0][0] if view.segments else 0
    group = (starts - first) // view.segment_size
    cuts = (np.flatnonzero(np.diff(group)) + 1).tolist()
    with Files() as files:
        for a, b in itertools.pairwise([0, *cuts, len(offsets)]):
            head, tail, length = _group(view, files, starts[a:b], int(group[a]))
            heads.append(head)
            tails.append(tail)
            lengths.append(length)
    ends = np.zeros(len(offsets) + 1, "<i4")
    np.cumsum(np.concatenate(lengths), out=ends[1:])
    return b"".join(heads), b"".join(t.tobytes() for t in tails), ends.tobytes()


def _group(
    view: LogView, files: Files, starts: I64s, index: int
) -> tuple[bytes, npt.NDArray[np.uint8], I64s]:
    """The heads and tails of the entries at `starts`, all in data segment `index`."""
    if not 0 <= index < len(view.segments):
        raise OffsetOutOfRange(int(starts[0]), view.min_pos, view.committed, "commit-log position")
    base, path = view.segments[index]
    last = read_log(view, files, int(starts[-1]), int(starts[-1]) + HEADER_SIZE)
    span_end = int(starts[-1]) + int(entry_headers(last, np.zeros(1, np.int64))["size"][0])
    if span_end <= view.file_end:
        arr = np.frombuffer(files.map(path, "commit log"), np.uint8)
    else:  # not all flushed yet: the span from the files and the store's buffers
        base = int(starts[0])
        arr = np.frombuffer(read_log(view, files, base, min(span_end, view.committed)), np.uint8)
    rel = starts - base
    entries = entry_headers(arr, rel)
    body_len = entries["body_len"].astype(np.int64)
    bad = header_faults(entries, starts) | (body_len < MIN_MESSAGE_SIZE)
    if bad.any():
        at = int(starts[np.argmax(bad)]) + HEADER_SIZE
        raise InvalidMessage(f"no message starts at commit-log offset {at}")
    msg = rel + HEADER_SIZE
    fixed = windows(arr, FIXED_PART_SIZE)[msg].view(HEADER_DTYPE)
    total = fixed["total_size"].astype(np.int64)
    body = fixed["body_length"].astype(np.int64)
    tail_start = msg + FIXED_PART_SIZE + body
    length = total - FIXED_PART_SIZE - body
    fits = (body >= 0) & (length >= 0) & (FIXED_PART_SIZE + body + length <= body_len)
    length = np.where(fits, length, 0)
    tail_start = np.where(fits, tail_start, 0)
    return fixed.tobytes(), _gather(arr, tail_start, length), length


def _gather(arr: npt.NDArray[np.uint8], starts: I64s, lengths: I64s) -> npt.NDArray[np.uint8]:
    """`arr[starts[i] : starts[i] + lengths[i]]` end to end. Short segments (the usual
    tails: topic and a few properties) as the rows of one fixed-width gather, cut by a
    mask; else byte by byte."""
    width = int(lengths.max()) if len(lengths) else 0
    if 0 < width <= _ROW_WIDTH and int(starts.max()) + width <= len(arr):
        matrix = windows(arr, width)[starts].view(np.uint8).reshape(len(starts), width)
        out: npt.NDArray[np.uint8] = matrix[_COLUMNS[:width] < lengths[:, None]]
        return out
    at = np.cumsum(lengths) - lengths  # where each segment goes
    take = np.repeat(starts - at, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    return arr[take]
