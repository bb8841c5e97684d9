"""Disk faults on a stopped node's data directory: a flipped byte, a power loss.

Plain functions for chaos runners and tests; the node must not be running.

- `flip_byte` flips one byte inside the body of one of the newest entries of the
  commit log (`<data_dir>/commitlog/data`). Recovery must detect it by CRC, cut
  the log there and get the entries back from the leader; they must never be
  served. By default only entries above the entry checkpoint are candidates; a
  bad entry below it (`above_checkpoint=False`) is not cut: it is reported once
  and never served, and the checkpointed entry itself is refused at start
  (docs/disk-faults.md, dledger_commitlog/entry_store.py).
- `power_loss` models a power failure after SIGKILL: with DLEDGER_FLUSH_TRACE=1
  the node appended its flushed commit-log position to `<data_dir>/flush.trace`
  after each fsync; everything the data files hold after the last traced
  position is dropped (zeroed in its segment, later segments deleted).

What `power_loss` leaves alone, and why (see docs/disk-faults.md):
raft.state, entries.checkpoint, entries.base, the dispatch checkpoint, the
consumer offsets and layout.json are replaced by `write_atomically` (temp file,
fsync, rename, fsync of the directory), so they survive as they are. The entry
index (`commitlog/index`) is buffered and fsynced only by the entry checkpoint,
so units above the checkpointed entry are zeroed here (recovery rebuilds them
from the data). Consume queues and the key index are fsynced before the dispatch
checkpoint; their unflushed tails lie beyond it and recovery cuts them back to
it anyway, so they are left as they are (a superset of what could survive).
Not modelled: a newly created segment file whose directory entry never reached
the disk (segment creation does not fsync the directory).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from dledger_commitlog.log.verify import read_layout
from store.entry_format import (
    FILLER,
    FILLER_MIN,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT_SIZE,
    decode_record,
    header_fault,
    is_filler,
)
from store.errors import CorruptEntry

TRACE_FILE = "flush.trace"
_SCAN_SEGMENTS = 3
_ZERO_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class FlipReport:
    file: str  # the segment file
    pos: int  # commit-log position of the flipped byte
    file_offset: int  # its offset inside `file`
    index: int  # the Raft index of the entry hit
    entry_pos: int  # where that entry starts
    old: int
    new: int
    checkpoint_index: int  # the entry checkpoint's index (0: none)


@dataclass(frozen=True, slots=True)
class PowerLossReport:
    trace_pos: int  # the last traced flushed position: everything below is kept
    zeroed_bytes: int  # non-zero bytes of the data files dropped
    deleted_segments: tuple[str, ...]
    index_zeroed_from: int | None  # entry-index byte offset zeroed from (None: untouched)


def _segments(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    return sorted(
        (int(p.name), p) for p in directory.iterdir() if len(p.name) == 20 and p.name.isdigit()
    )


def _checkpoint(log_dir: Path) -> tuple[int, int] | None:
    """(index, pos) of the entry checkpoint, if there is a valid one."""
    try:
        index, _, pos, _ = decode_record((log_dir / "entries.checkpoint").read_bytes())
    except (FileNotFoundError, CorruptEntry):
        return None
    return index, pos


def _scan(
    segments: list[tuple[int, Path]], seg_size: int, start: int
) -> list[tuple[int, int, int]]:
    """(pos, size, index) of the entries from `start` on, by headers (no CRC check),
    up to the first bytes that are no entry's header."""
    out: list[tuple[int, int, int]] = []
    for seg_start, path in segments:
        if seg_start + seg_size <= start:
            continue
        buf = path.read_bytes()
        off = max(0, start - seg_start)
        while off + FILLER_MIN <= len(buf):
            pos = seg_start + off
            magic, size = FILLER.unpack_from(buf, off)
            if is_filler(magic, size, pos, seg_size):
                break
            if off + HEADER_SIZE > len(buf):
                return out
            _, size, index, _, epos, _, _, _, body_len = HEADER.unpack_from(buf, off)
            if header_fault(magic, size, epos, body_len, pos) is not None or size > seg_size - off:
                return out
            out.append((pos, size, index))
            off += size
        else:
            return out
    return out


def flip_byte(
    data_dir: str | os.PathLike[str],
    rng: random.Random,
    last_entries: int = 20,
    *,
    above_checkpoint: bool = True,
) -> FlipReport:
    """Flip one byte in the body of one of the last `last_entries` entries (node stopped).

    With `above_checkpoint` only entries above the entry checkpoint are candidates
    (ValueError if none is). The byte is XORed with a random non-zero mask, written
    and fsynced.
    """
    root = Path(data_dir)
    log_dir = root / "commitlog"
    seg_size = read_layout(root)["data_segment_bytes"]
    segments = _segments(log_dir / "data")
    if not segments:
        raise ValueError(f"{log_dir / 'data'} holds no segment")
    cp = _checkpoint(log_dir)
    start = segments[max(0, len(segments) - _SCAN_SEGMENTS)][0]
    if cp is not None and cp[1] >= segments[0][0]:
        start = min(start, cp[1])
    entries = [e for e in _scan(segments, seg_size, start) if e[1] > HEADER_SIZE]
    entries = entries[-last_entries:]
    cp_index = cp[0] if cp is not None else 0
    if above_checkpoint:
        entries = [e for e in entries if e[2] > cp_index]
    if not entries:
        raise ValueError(
            f"no entry with a body among the last {last_entries} of {log_dir}"
            + (f" above the checkpointed entry {cp_index}" if above_checkpoint else "")
        )
    entry_pos, size, index = rng.choice(entries)
    pos = entry_pos + rng.randrange(HEADER_SIZE, size)
    seg_start = pos - pos % seg_size
    path = log_dir / "data" / f"{seg_start:020d}"
    offset = pos - seg_start
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, offset)[0]
        new = old ^ rng.randrange(1, 256)
        os.pwrite(fd, bytes([new]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return FlipReport(str(path), pos, offset, index, entry_pos, old, new, cp_index)


def read_trace(data_dir: str | os.PathLike[str]) -> list[int]:
    """The flushed positions the node traced, oldest first (a torn last record is ignored)."""
    raw = (Path(data_dir) / TRACE_FILE).read_bytes()
    return [int.from_bytes(raw[k : k + 8], "big") for k in range(0, len(raw) - 7, 8)]


def _zero_from(path: Path, offset: int) -> int:
    """Zero `path` from `offset` to its end; returns how many non-zero bytes it held."""
    nonzero = 0
    fd = os.open(path, os.O_RDWR)
    try:
        end = os.fstat(fd).st_size
        while offset < end:
            n = min(_ZERO_CHUNK, end - offset)
            chunk = os.pread(fd, n, offset)
            zeros = chunk.count(0)
            if zeros != len(chunk):
                nonzero += len(chunk) - zeros
                os.pwrite(fd, bytes(len(chunk)), offset)
            offset += n
        os.fsync(fd)
    finally:
        os.close(fd)
    return nonzero


def _drop_after(directory: Path, seg_size: int, pos: int) -> tuple[int, list[str]]:
    """Zero the segment holding `pos` from there on and delete every later segment."""
    zeroed, deleted = 0, []
    keep = pos - pos % seg_size
    for start, path in _segments(directory):
        if start > keep:
            zeroed += _zero_from(path, 0)  # counted, then gone
            path.unlink()
            deleted.append(path.name)
        elif start == keep:
            zeroed += _zero_from(path, pos - start)
    if deleted:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return zeroed, deleted


def power_loss(data_dir: str | os.PathLike[str]) -> PowerLossReport:
    """Drop what a power loss would have lost from a node killed with SIGKILL.

    Needs `<data_dir>/flush.trace` (the node ran with DLEDGER_FLUSH_TRACE=1);
    ValueError without it. No trace record at all means nothing was ever flushed.
    """
    root = Path(data_dir)
    if not (root / TRACE_FILE).exists():
        raise ValueError(f"{root / TRACE_FILE} is missing: run the node with DLEDGER_FLUSH_TRACE=1")
    trace = read_trace(root)
    pos = trace[-1] if trace else 0
    layout = read_layout(root)
    log_dir = root / "commitlog"
    zeroed, deleted = _drop_after(log_dir / "data", layout["data_segment_bytes"], pos)
    index_from = None
    cp = _checkpoint(log_dir)
    if cp is not None:
        index_from = (cp[0] + 1) * INDEX_UNIT_SIZE
        _drop_after(log_dir / "index", layout["index_segment_bytes"], index_from)
    return PowerLossReport(pos, zeroed, tuple(deleted), index_from)
