"""StoreCheckpoint and the abort marker: what recovery trusts about the last run.

The checkpoint is one fixed 64-byte big-endian record with a CRC:

    magic u32 ("DLCP") | version i32 | physicMsgTimestamp i64
    | logicsMsgTimestamp i64 | indexMsgTimestamp i64 | dispatchedPosition i64
    | committedPosition i64 | flushedPosition i64 | reserved i32 | crc u32

`crc` is CRC32 of every byte before it. Timestamps are store timestamps in ms
(RocketMQ's three checkpoint timestamps); positions are commit-log byte offsets.

Invariants: the file on disk is always a complete record, old or new. A write
goes to a temporary file that is fsynced and renamed over the checkpoint, then
the directory is fsynced, so a crash at any point leaves one or the other. A
missing file means a fresh store; a record that fails its checks raises
CorruptEntry rather than being silently reset. Writers (`StoreCheckpoint.flush`,
`AbortMarker`) block on fsync: call them off the event loop.

The abort marker is an empty file created when the store opens and removed on a
clean shutdown; finding it at start means the last run crashed and recovery
must scan and reconcile rather than trust the files as they are.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from store.errors import CorruptEntry
from store.fileio import fsync_dir, write_atomically

__all__ = [
    "CHECKPOINT_SIZE",
    "AbortMarker",
    "Checkpoint",
    "StoreCheckpoint",
    "decode_checkpoint",
    "encode_checkpoint",
    "read_checkpoint",
    "write_checkpoint",
]

_MAGIC = 0x444C4350  # "DLCP"
_VERSION = 1
_BODY = struct.Struct(">IiqqqqqqI")
_CRC = struct.Struct(">I")
CHECKPOINT_SIZE = _BODY.size + _CRC.size
assert CHECKPOINT_SIZE == 64


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The recovery hints of the store; all zero for a fresh store."""

    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    dispatched_position: int = 0
    committed_position: int = 0
    flushed_position: int = 0

    @property
    def min_timestamp_ms(self) -> int:
        """The earliest of the three timestamps: where a timestamp-based recovery starts."""
        return min(
            self.physic_msg_timestamp_ms,
            self.logics_msg_timestamp_ms,
            self.index_msg_timestamp_ms,
        )


def encode_checkpoint(cp: Checkpoint) -> bytes:
    body = _BODY.pack(
        _MAGIC,
        _VERSION,
        cp.physic_msg_timestamp_ms,
        cp.logics_msg_timestamp_ms,
        cp.index_msg_timestamp_ms,
        cp.dispatched_position,
        cp.committed_position,
        cp.flushed_position,
        0,
    )
    return body + _CRC.pack(zlib.crc32(body))


def decode_checkpoint(raw: bytes, where: str = "checkpoint") -> Checkpoint:
    if len(raw) != CHECKPOINT_SIZE:
        raise CorruptEntry(where, 0, f"{len(raw)} bytes, expected {CHECKPOINT_SIZE}")
    body = raw[: _BODY.size]
    (crc,) = _CRC.unpack_from(raw, _BODY.size)
    if zlib.crc32(body) != crc:
        raise CorruptEntry(where, 0, "CRC mismatch")
    magic, version, phy_ts, logics_ts, index_ts, dispatched, committed, flushed, _ = _BODY.unpack(
        body
    )
    if magic != _MAGIC:
        raise CorruptEntry(where, 0, f"bad magic {magic:#010x}")
    if version != _VERSION:
        raise CorruptEntry(where, 0, f"unsupported version {version}")
    return Checkpoint(phy_ts, logics_ts, index_ts, dispatched, committed, flushed)


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint | None:
    """The checkpoint at `path`; None when there is none (a fresh store)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return None
    return decode_checkpoint(raw, str(p))


def write_checkpoint(path: str | os.PathLike[str], cp: Checkpoint) -> None:
    """Replace the checkpoint at `path` atomically and durably (blocks on fsync)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(p, encode_checkpoint(cp))


class StoreCheckpoint:
    """The in-memory checkpoint: `update` as positions advance, `flush` to persist."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        loaded = read_checkpoint(self.path)
        self.fresh = loaded is None
        self._current = loaded or Checkpoint()
        self._written = self._current if loaded is not None else None

    @property
    def current(self) -> Checkpoint:
        return self._current

    def update(
        self,
        *,
        physic_msg_timestamp_ms: int | None = None,
        logics_msg_timestamp_ms: int | None = None,
        index_msg_timestamp_ms: int | None = None,
        dispatched_position: int | None = None,
        committed_position: int | None = None,
        flushed_position: int | None = None,
    ) -> Checkpoint:
        """Change the given fields in memory; returns the new value (not yet durable)."""
        cur = self._current
        self._current = replace(
            cur,
            physic_msg_timestamp_ms=_pick(physic_msg_timestamp_ms, cur.physic_msg_timestamp_ms),
            logics_msg_timestamp_ms=_pick(logics_msg_timestamp_ms, cur.logics_msg_timestamp_ms),
            index_msg_timestamp_ms=_pick(index_msg_timestamp_ms, cur.index_msg_timestamp_ms),
            dispatched_position=_pick(dispatched_position, cur.dispatched_position),
            committed_position=_pick(committed_position, cur.committed_position),
            flushed_position=_pick(flushed_position, cur.flushed_position),
        )
        return self._current

    def flush(self) -> bool:
        """Persist the current value if it changed since the last write; True if it wrote."""
        snapshot = self._current
        if snapshot == self._written:
            return False
        write_checkpoint(self.path, snapshot)
        self._written = snapshot
        return True


def _pick(new: int | None, old: int) -> int:
    return old if new is None else new


class AbortMarker:
    """An empty file that exists exactly while the store runs (or after it crashed)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> bool:
        """Create the marker durably; True if it was already there (the last run crashed)."""
        crashed = self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.path.parent)
        return crashed

    def remove(self) -> None:
        """Remove the marker durably at a clean shutdown (after every other flush)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.path.parent)
