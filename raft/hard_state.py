"""Raft's hard state on disk: term, vote and commit index, one small record.

Written atomically and fsynced (`store.fileio.write_atomically`) whenever the
term or the vote changes, before any message that depends on them leaves the
node; the commit index rides along lazily (Raft does not need it durable, but a
restart that remembers it applies less again). A torn or corrupt record is a
`CorruptEntry`, never a silent reset to term 0 (that would allow a double vote).
"""

from __future__ import annotations

import struct
import threading
import zlib
from pathlib import Path

from raft.types import HardState
from store.errors import CorruptEntry
from store.fileio import write_atomically

_RECORD = struct.Struct(">iqiqI")  # magic, term, vote (0: none), commit, crc
_MAGIC = 0x52414654  # "RAFT"


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
        if len(raw) != _RECORD.size:
            raise CorruptEntry(str(self.path), 0, f"raft state of {len(raw)} bytes")
        magic, term, vote, commit, crc = _RECORD.unpack(raw)
        if magic != _MAGIC or zlib.crc32(raw[:-4]) != crc:
            raise CorruptEntry(str(self.path), 0, "raft state fails its CRC")
        return HardState(term, vote or None, commit)

    def needs_sync(self, hs: HardState) -> bool:
        """Term or vote changed: must be durable before dependent messages are sent."""
        return (hs.term, hs.vote) != (self.saved.term, self.saved.vote)

    def save(self, hs: HardState) -> None:
        """Blocking (fsync): call from a worker thread."""
        with self._lock:
            self._write(HardState(hs.term, hs.vote, max(hs.commit, self.saved.commit)))

    def save_commit(self, commit: int) -> None:
        """Record a higher commit index under the current term and vote (blocking)."""
        with self._lock:
            if commit > self.saved.commit:
                self._write(HardState(self.saved.term, self.saved.vote, commit))

    def lower_commit(self, commit: int) -> None:
        """Bring the recorded commit index down to `commit` (blocking): only for a
        rollback of a committed tail the cluster lost (see RaftNode)."""
        with self._lock:
            if self.saved.commit > commit:
                self._write(HardState(self.saved.term, self.saved.vote, commit))

    def _write(self, hs: HardState) -> None:
        body = _RECORD.pack(_MAGIC, hs.term, hs.vote or 0, hs.commit, 0)[:-4]
        write_atomically(self.path, body + struct.pack(">I", zlib.crc32(body)))
        self.saved = hs
