"""Raft's hard state on disk: term, vote, commit index and membership, one record.

Written atomically and fsynced (`store.fileio.write_atomically`) whenever the
term, the vote or the committed configuration changes, before any message that
depends on them leaves the node; the commit index rides along lazily (Raft does
not need it durable, but a restart that remembers it applies less again). A torn
or corrupt record is a `CorruptEntry`, never a silent reset to term 0 (that would
allow a double vote). The record: `magic i32 | term i64 | vote i64 | commit i64 |
conf_index i64 | conf_len i32 | conf | crc u32`; the record of nodes before
membership change (no conf fields, magic "RAFT") is still read.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
import zlib
from pathlib import Path

from raft.types import HardState
from store.errors import CorruptEntry
from store.fileio import write_atomically

_OLD = struct.Struct(">iqiqI")  # magic, term, vote (0: none), commit, crc
_OLD_MAGIC = 0x52414654  # "RAFT"
_HEAD = struct.Struct(">iqqqqi")  # magic, term, vote (0: none), commit, conf index, conf len
_MAGIC = 0x52414632  # "RAF2"


class RaftStateFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.saved = self.load()
        self._lock = threading.Lock()  # the driver and the checkpointer both write

    def load(self) -> HardState:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return HardState()
        if len(raw) < 8 or zlib.crc32(raw[:-4]) != int.from_bytes(raw[-4:]):
            raise CorruptEntry(str(self.path), 0, f"raft state of {len(raw)} bytes fails its CRC")
        magic = int.from_bytes(raw[:4], signed=True)
        if magic == _OLD_MAGIC and len(raw) == _OLD.size:
            _, term, vote, commit, _ = _OLD.unpack(raw)
            return HardState(term, vote or None, commit)
        if magic != _MAGIC or len(raw) < _HEAD.size + 4:
            raise CorruptEntry(str(self.path), 0, "not a raft state record")
        _, term, vote, commit, conf_index, conf_len = _HEAD.unpack_from(raw)
        if conf_len != len(raw) - _HEAD.size - 4:
            raise CorruptEntry(str(self.path), 0, "raft state record of the wrong length")
        conf = raw[_HEAD.size : _HEAD.size + conf_len]
        return HardState(term, vote or None, commit, conf_index, conf)

    def needs_sync(self, hs: HardState) -> bool:
        """Term, vote or committed configuration changed: must be durable before
        dependent messages are sent."""
        saved = self.saved
        return (hs.term, hs.vote, hs.conf_index) != (saved.term, saved.vote, saved.conf_index)

    def save(self, hs: HardState) -> None:
        """Blocking (fsync): call from a worker thread."""
        with self._lock:
            self._write(dataclasses.replace(hs, commit=max(hs.commit, self.saved.commit)))

    def save_commit(self, commit: int) -> None:
        """Record a higher commit index under the current term and vote (blocking)."""
        with self._lock:
            if commit > self.saved.commit:
                self._write(dataclasses.replace(self.saved, commit=commit))

    def lower_commit(self, commit: int) -> None:
        """Bring the recorded commit index down to `commit` (blocking): only for a
        rollback of a committed tail the cluster lost (see RaftNode)."""
        with self._lock:
            if self.saved.commit > commit:
                self._write(dataclasses.replace(self.saved, commit=commit))

    def _write(self, hs: HardState) -> None:
        head = _HEAD.pack(_MAGIC, hs.term, hs.vote or 0, hs.commit, hs.conf_index, len(hs.conf))
        body = head + hs.conf
        write_atomically(self.path, body + struct.pack(">I", zlib.crc32(body)))
        self.saved = hs
