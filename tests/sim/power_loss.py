"""The disk of the driver simulation (tests/sim/driver_sim.py): durable images and power loss.

The content of every data and index segment as of its last fsync is its durable
image (`PowerLossDisk`). A crash is a power loss: every segment keeps its durable
image plus some of what the page cache held beyond it, by 512-byte sectors (none,
all, a prefix, a prefix whose last sector is junk, any subset: `tear`); so a suffix
that was fsynced and then replaced may come back, and bytes buffered in the process
(write_buffer_bytes) are lost. Directory operations are taken as durable (segment
creation is fsynced; the deletion of segments by a truncation is not modelled as
reversible).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_SECTOR = 512
_SEGMENT_NAME = 20


@dataclass(frozen=True, slots=True)
class Capture:
    """Segment contents read at one moment (`seq` orders captures)."""

    seq: int
    files: dict[Path, tuple[int, bytes]]  # path -> (inode, content)


def _segments(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    return sorted(
        (int(name), directory / name)
        for name in os.listdir(directory)
        if len(name) == _SEGMENT_NAME and name.isdigit()
    )


def _read(path: Path) -> tuple[int, bytes]:
    with path.open("rb") as f:
        return os.fstat(f.fileno()).st_ino, f.read()


def _diff_range(a: bytes, b: bytes) -> tuple[int, int]:
    """[lo, hi): the span from the first to the last byte where a and b differ (a != b)."""
    n = len(a)
    chunk = 4096
    lo = 0
    while lo + chunk <= n and a[lo : lo + chunk] == b[lo : lo + chunk]:
        lo += chunk
    while a[lo] == b[lo]:
        lo += 1
    hi = n
    while hi - chunk >= lo and a[hi - chunk : hi] == b[hi - chunk : hi]:
        hi -= chunk
    while a[hi - 1] == b[hi - 1]:
        hi -= 1
    return lo, hi


TEAR_MODES = ("lost", "kept", "prefix", "garbage", "sectors")
_TEAR_WEIGHTS = (3, 1, 3, 2, 1)


def tear(cur: bytes, old: bytes, rng: random.Random, mode: str) -> bytes:
    """What a power loss leaves of a file whose page cache holds `cur` and whose disk
    holds `old` (its content as of its last fsync). A 512-byte sector reaches the
    disk whole or not at all, except (`garbage`) the one being written when the power
    went, whose new bytes are junk; bytes the page cache did not change are never
    touched (that would be a disk that loses fsynced data)."""
    lo, hi = _diff_range(cur, old)
    first = lo - lo % _SECTOR
    cut = min(hi, first + _SECTOR * rng.randint(0, (hi - first + _SECTOR - 1) // _SECTOR))
    cut = max(cut, lo)
    match mode:
        case "lost":  # nothing was written back
            return old
        case "kept":  # everything was
            return cur
        case "prefix":  # written back in order, up to a sector boundary
            return cur[:cut] + old[cut:]
        case "garbage":  # ... and the sector being written holds junk
            cut = min(cut, hi - 1)
            end = min(cut - cut % _SECTOR + _SECTOR, hi)
            return cur[:cut] + rng.randbytes(end - cut) + old[end:]
        case "sectors":  # written back in any order
            out = bytearray(old)
            for s in range(first, hi, _SECTOR):
                if rng.random() < 0.5:
                    out[s : s + _SECTOR] = cur[s : s + _SECTOR]
            return bytes(out)
    raise ValueError(mode)


class PowerLossDisk:
    """The durable image of one node's segment files, and what a power loss leaves.

    The image of a segment is its content as of the last fsync that covered it
    (a capture taken when the fsync started, committed when it completed). A
    segment without an image was created since (allocated and its name fsynced:
    it is durably all zeros), or re-created under the same name (the inode tells).
    """

    def __init__(self, dirs: dict[Path, int]) -> None:
        self.dirs = dirs  # segment directory -> segment size
        self._images: dict[Path, tuple[int, int, bytes]] = {}  # path -> (seq, inode, content)
        self._seq = 0

    def capture(self, directory: Path, from_pos: int = 0) -> Capture:
        """The page-cache content of `directory`'s segments that reach past `from_pos`."""
        self._seq += 1
        size = self.dirs[directory]
        files = {
            path: _read(path) for start, path in _segments(directory) if start + size > from_pos
        }
        return Capture(self._seq, files)

    def commit(self, cap: Capture) -> None:
        """An fsync that started at `cap` completed: its content is durable."""
        for path, (ino, data) in cap.files.items():
            old = self._images.get(path)
            if old is None or old[0] < cap.seq:
                self._images[path] = (cap.seq, ino, data)

    def sync_all(self) -> None:
        """Everything is fsynced now (an entry checkpoint flushes data and index)."""
        for directory in self.dirs:
            self.commit(self.capture(directory))
        self._images = {p: img for p, img in self._images.items() if p.exists()}

    def forget_from(self, directory: Path, pos: int) -> None:
        """A truncation at `pos` deleted the segments from the next boundary on."""
        size = self.dirs[directory]
        cut = pos if pos % size == 0 else pos - pos % size + size
        for path in [p for p in self._images if p.parent == directory and int(p.name) >= cut]:
            del self._images[path]

    def forget_all(self) -> None:
        self._images.clear()

    def durable(self, path: Path, ino: int, size: int) -> bytes:
        img = self._images.get(path)
        if img is None or img[1] != ino:
            return bytes(size)
        data = img[2]
        return data if len(data) == size else data[:size].ljust(size, b"\0")

    def plan_power_loss(
        self, rng: random.Random, stats: Counter[str], modes: Sequence[str] = TEAR_MODES
    ) -> dict[Path, bytes]:
        """What every segment holds after a power loss now (read before the process
        state is dropped: bytes still buffered in the process never reach the disk)."""
        plan: dict[Path, bytes] = {}
        for directory in self.dirs:
            for _, path in _segments(directory):
                ino, cur = _read(path)
                old = self.durable(path, ino, len(cur))
                if cur == old:
                    plan[path] = cur
                    continue
                weights = [_TEAR_WEIGHTS[TEAR_MODES.index(m)] for m in modes]
                mode = rng.choices(modes, weights)[0]
                stats[f"torn_{mode}"] += 1
                plan[path] = tear(cur, old, rng, mode)
        return plan

    def apply_power_loss(self, plan: dict[Path, bytes]) -> None:
        """Make the files what `plan` says (after the process is gone); that is durable."""
        for directory in self.dirs:
            for _, path in _segments(directory):
                if path not in plan:  # written by the dying process after the plan
                    path.unlink()
        self._images.clear()
        self._seq += 1
        for path, data in plan.items():
            with path.open("r+b") as f:
                f.write(data)
                f.truncate(len(data))
                ino = os.fstat(f.fileno()).st_ino
            self._images[path] = (self._seq, ino, data)
