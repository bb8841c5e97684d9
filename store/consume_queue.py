"""ConsumeQueue: one topic queue's fixed-size index into the commit log (RocketMQ layout).

Each unit is 20 big-endian bytes, `commitlogOffset i64 | size i32 | tagsCode i64`,
and queue offset `q` lives at byte `q * 20` of a MappedFileQueue under
`<root>/consumequeue/<topic>/<queueId>/`, 300,000 units per file by default (a
unit never straddles files since the file size is a multiple of 20).

Invariants:
- Units hold `[min_offset, max_offset)`; appends land exactly at `max_offset`
  (a gap is an error) and re-appending identical units below it is a no-op, so
  replaying dispatch after a crash is safe; a different unit there is an error.
- Units are dispatched in commit-log order: commit-log offsets strictly
  increase along queue offsets. Truncation and retention binary-search on that.
- A stored unit has `commitlogOffset >= 0` and `size > 0`; recovery on open
  scans the last files and takes the data to end at the first unit that is all
  zeros or breaks that rule, then zeroes whatever follows.
- `min_offset` moves up only through `delete_below_commitlog_offset`, which
  deletes whole files and never the one holding the newest unit (so
  `max_offset` survives a reopen). A reopen starts `min_offset` at the first
  unit of the first file; call `delete_below_commitlog_offset` again with the
  commit log's minimum (RocketMQ's correctMinOffset).
- A queue may start above offset 0 (a node whose commit log restarts later,
  after retention or a catch-up from a leader that deleted its prefix): when a
  queue with no live units gets a unit at `q0 > max_offset`, its files are
  dropped and the file holding `q0` is made again with the units before `q0`
  filled with blank units `(0, 0x7FFFFFFF, 0)`, as RocketMQ's fillPreBlank does.
  Blanks pass the recovery scan (so they are not mistaken for the end of data)
  and only ever form a prefix of the first file, which a reopen skips to find
  `min_offset`. The files are then those a queue built from `q0` on writes.
  Truncation that would leave no file at all makes the queue empty the same
  way (on a file boundary, with the whole previous file blank), so a reopen
  still finds it where it was.

Dispatch appends a batch of units as one numpy structured array (`UNIT_DTYPE`,
the unit layout itself) through `append_units`: checked as a whole and written
with one copy; `append_batch` takes (offset, size, tags code) tuples the same way.

Not thread-safe, except that `flush` may run in a worker thread beside the writer.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from store.errors import ConflictingWrite, OffsetOutOfRange
from store.mapped_file import MappedFileQueue

__all__ = [
    "BLANK_UNIT",
    "DEFAULT_UNITS_PER_FILE",
    "UNIT",
    "UNIT_DTYPE",
    "UNIT_SIZE",
    "ConsumeQueue",
    "CqUnit",
    "discover_queues",
    "encode_units",
    "units_array",
]

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size
assert UNIT_SIZE == 20
# The same layout as a numpy record: an array of them is the bytes of the units.
UNIT_DTYPE = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE
Units = npt.NDArray[np.void]
DEFAULT_UNITS_PER_FILE = 300_000
BLANK_UNIT = (0, 0x7FFFFFFF, 0)  # fills a first file below the queue's first unit
_BLANK = UNIT.pack(*BLANK_UNIT)
_FEW_UNITS = 16  # up to this many units per append are checked in Python (numpy's cost)
RECOVERY_FILES = 3  # as RocketMQ: the unflushed tail is at most this many files back

# Byte -> 1 if its top bit is set: finds negative big-endian fields with one translate().
_HIGH_BIT = bytes(1 if b & 0x80 else 0 for b in range(256))


class CqUnit(NamedTuple):
    commitlog_offset: int
    size: int
    tags_code: int


def encode_units(units: Iterable[tuple[int, int, int]]) -> bytes:
    pack = UNIT.pack
    return b"".join([pack(*u) for u in units])


def units_array(units: Iterable[tuple[int, int, int]]) -> Units:
    """(commit-log offset, size, tags code) tuples as a UNIT_DTYPE array."""
    return np.array(list(units), dtype=UNIT_DTYPE)


def _count_valid_units(data: bytes) -> int:
    """Units from the start of `data` before the first one that ends the data.

    A unit ends the data when its size is <= 0 (this covers all-zero units) or its
    commit-log offset is negative. Works on strided byte slices, not per unit.
    """
    n = len(data) // UNIT_SIZE
    if n == 0:
        return 0
    ends = [n]
    for column in (0, 8):  # sign bits of commitlogOffset and size
        i = data[column::UNIT_SIZE][:n].translate(_HIGH_BIT).find(1)
        if i >= 0:
            ends.append(i)
    size_bytes = 0
    for column in (8, 9, 10, 11):
        size_bytes |= int.from_bytes(data[column::UNIT_SIZE][:n], "big")
    i = size_bytes.to_bytes(n, "big").find(0)
    if i >= 0:
        ends.append(i)
    return min(ends)


def discover_queues(root: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """(topic, queue id) of every consume queue directory under `root`."""
    base = Path(root) / "consumequeue"
    if not base.is_dir():
        return []
    found = []
    for topic_dir in sorted(base.iterdir()):
        if topic_dir.is_dir():
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    found.append((topic_dir.name, int(queue_dir.name)))
    return found


class ConsumeQueue:
    def __init__(
        self,
        root: str | os.PathLike[str],
        topic: str,
        queue_id: int,
        *,
        units_per_file: int = DEFAULT_UNITS_PER_FILE,
        preallocate: bool = True,
    ) -> None:
        if units_per_file <= 0:
            raise ValueError(f"units_per_file must be positive, got {units_per_file}")
        self.topic = topic
        self.queue_id = queue_id
        self.directory = Path(root) / "consumequeue" / topic / str(queue_id)
        self._file_size = units_per_file * UNIT_SIZE
        self._files = MappedFileQueue(self.directory, self._file_size, preallocate=preallocate)
        self._recover()
        self._max = self._files.write_position // UNIT_SIZE
        self._floor = self._skip_blanks()  # the first unit on disk that is not a blank
        self._min = self._floor
        last = self._unit_or_none(self._max - 1)
        self._last_phy = last.commitlog_offset if last is not None else -1

    # -- recovery --------------------------------------------------------------

    def _recover(self) -> None:
        segments = self._files.segments()
        if not segments:
            return
        end = segments[0][0]
        for start, _path in segments[max(0, len(segments) - RECOVERY_FILES) :]:
            data = self._files.read_unchecked(start, self._file_size)
            valid = _count_valid_units(data)
            end = start + valid * UNIT_SIZE
            if valid * UNIT_SIZE < self._file_size:
                tail = data[valid * UNIT_SIZE :]
                if tail.count(0) == len(tail):
                    self._files.set_write_position(end)
                else:
                    self._files.truncate(end)  # stale units past the end: zero them too
                return
        self._files.set_write_position(end)

    def _skip_blanks(self) -> int:
        """The first queue offset of the first file that does not hold a blank unit."""
        low = self._files.min_offset // UNIT_SIZE
        high = min(self._max, low + self._file_size // UNIT_SIZE)
        while low < high:  # blanks are a prefix: binary search for its end
            mid = (low + high) // 2
            if self._files.read(mid * UNIT_SIZE, UNIT_SIZE) == _BLANK:
                low = mid + 1
            else:
                high = mid
        return low

    # -- positions ---------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """The smallest queue offset that can be read."""
        return self._min

    @property
    def max_offset(self) -> int:
        """The queue offset the next unit gets (one past the last unit)."""
        return self._max

    @property
    def max_commitlog_offset(self) -> int:
        """End (offset + size) in the commit log of the last unit; -1 for an empty queue."""
        last = self._unit_or_none(self._max - 1)
        return -1 if last is None else last.commitlog_offset + last.size

    def file_starts(self) -> list[int]:
        """Byte offsets (names) of the queue's files, oldest first."""
        return [start for start, _path in self._files.segments()]

    @property
    def flushed_offset(self) -> int:
        """Queue offsets below this one are durable."""
        return self._files.flushed_position // UNIT_SIZE

    # -- writing ---------------------------------------------------------------

    def append(self, queue_offset: int, commitlog_offset: int, size: int, tags_code: int) -> bool:
        """Store one unit at `queue_offset`; False if that identical unit was there already."""
        return self.append_batch(queue_offset, [(commitlog_offset, size, tags_code)]) == 1

    def append_batch(self, first_queue_offset: int, units: Sequence[tuple[int, int, int]]) -> int:
        """Store `units` at `first_queue_offset` onward; returns how many were new.

        Units already stored (a replay) must match byte for byte (ConflictingWrite
        otherwise); the rest extend the queue and must not leave a gap
        (OffsetOutOfRange) and must keep commit-log offsets increasing (ValueError).
        """
        if not units:
            return 0
        return self.append_units(first_queue_offset, units_array(units))

    def append_units(self, first_queue_offset: int, units: Units) -> int:
        """`append_batch` of a UNIT_DTYPE array (dispatch builds one per queue and batch):
        checked with array operations, written with one copy."""
        count = len(units)
        if not count:
            return 0
        if units.dtype is not UNIT_DTYPE and units.dtype != UNIT_DTYPE:
            units = units.astype(UNIT_DTYPE)  # e.g. host byte order (np.concatenate's)
        q = first_queue_offset
        if q > self._max and self._min == self._max:
            self._restart_at(q)
        if q < self._min or q > self._max:
            raise OffsetOutOfRange(q, self._min, self._max + 1, "consume queue append offset")
        overlap = min(count, self._max - q)
        if overlap > 0:
            self._check_replay(q, units[:overlap])
            units = units[overlap:]
            if not len(units):
                return 0
        last = self._check_order(units)
        data = units.tobytes()
        room = self._files.space_left_in_segment()
        if len(data) <= room:
            self._files.append(data)
        else:  # units never straddle files: the file size is a multiple of theirs
            view = memoryview(data)
            while view:
                self._files.append(view[:room])
                view = view[room:]
                room = self._files.space_left_in_segment()
        self._max += len(units)
        self._last_phy = last
        return len(units)

    def _check_order(self, units: Units) -> int:
        """The last unit's commit-log offset; ValueError unless offsets increase (from the
        queue's last) and sizes are positive. A few units in Python, more with arrays."""
        prev = self._last_phy
        if len(units) <= _FEW_UNITS:
            for phy, size, _tags in units.tolist():
                if phy <= prev or size <= 0:
                    break
                prev = phy
            else:
                return prev
        else:
            phys, sizes = units["commitlog_offset"], units["size"]
            wrong = sizes <= 0
            wrong[0] |= phys[0] <= prev
            wrong[1:] |= phys[1:] <= phys[:-1]
            if not wrong.any():
                return int(phys[-1])
            i = int(np.argmax(wrong))
            prev = int(phys[i - 1]) if i else prev
            phy, size = int(phys[i]), int(sizes[i])
        raise ValueError(
            f"unit ({phy}, {size}) after commit-log offset {prev}: "
            "offsets must increase and sizes be positive"
        )

    def _restart_at(self, q: int, *, remember: bool = False) -> None:
        """Make the queue empty at `q`: drop every file, and fill the units of `q`'s file
        below it with blanks, so that recovery reads the file as data up to `q`.

        On a file boundary there is nothing to fill; the next unit's file name records
        `q`. With `remember` (no unit follows) the file before it is filled instead,
        so that a reopen still finds the queue at `q`.
        """
        pos = q * UNIT_SIZE
        file_start = pos - pos % self._file_size
        if remember and pos == file_start and q > 0:
            file_start -= self._file_size
        self._files.reset(file_start)
        self._files.append(_BLANK * (q - file_start // UNIT_SIZE))
        self._min = self._max = self._floor = q
        self._last_phy = -1

    def _check_replay(self, q: int, units: Units) -> None:
        stored = self._files.read(q * UNIT_SIZE, len(units) * UNIT_SIZE)
        expected = units.tobytes()
        if stored != expected:
            i = next(
                k
                for k in range(len(units))
                if stored[k * UNIT_SIZE : (k + 1) * UNIT_SIZE]
                != expected[k * UNIT_SIZE : (k + 1) * UNIT_SIZE]
            )
            raise ConflictingWrite(
                str(self.directory),
                q + i,
                f"unit {CqUnit(*UNIT.unpack_from(stored, i * UNIT_SIZE))} is stored, "
                f"{CqUnit(*UNIT.unpack_from(expected, i * UNIT_SIZE))} was appended",
            )

    # -- reading ---------------------------------------------------------------

    def get(self, queue_offset: int) -> CqUnit:
        units = self.get_range(queue_offset, 1)
        if not units:
            raise OffsetOutOfRange(queue_offset, self._min, self._max, "consume queue offset")
        return units[0]

    def get_range(self, queue_offset: int, max_count: int) -> list[CqUnit]:
        """Up to `max_count` units from `queue_offset`; [] at `max_offset` (nothing new yet)."""
        if queue_offset < self._min or queue_offset > self._max:
            raise OffsetOutOfRange(queue_offset, self._min, self._max + 1, "consume queue offset")
        n = min(max_count, self._max - queue_offset)
        if n <= 0:
            return []
        data = self._files.read(queue_offset * UNIT_SIZE, n * UNIT_SIZE)
        return list(map(CqUnit._make, UNIT.iter_unpack(data)))

    def _unit_or_none(self, queue_offset: int) -> CqUnit | None:
        """The unit at `queue_offset` if it is still on disk (also below min_offset),
        None for a blank."""
        pos = queue_offset * UNIT_SIZE
        if queue_offset < self._floor or pos < self._files.min_offset:
            return None  # gone, or a blank
        if pos >= self._files.write_position:
            return None
        return CqUnit._make(UNIT.unpack(self._files.read(pos, UNIT_SIZE)))

    def _first_at_or_after(self, phy: int, low: int) -> int:
        """The first queue offset in [low, max) whose commit-log offset is >= phy (else max)."""
        high = self._max
        while low < high:
            mid = (low + high) // 2
            unit = self._unit_or_none(mid)
            assert unit is not None
            if unit.commitlog_offset >= phy:
                high = mid
            else:
                low = mid + 1
        return low

    # -- truncation and retention -------------------------------------------------

    def truncate_to_commitlog_offset(self, phy: int) -> int:
        """Drop every unit whose commit-log offset is >= `phy`; returns the new max_offset."""
        q = self._first_at_or_after(phy, self._floor)
        if q == self._max:
            return self._max
        if q * UNIT_SIZE <= self._files.min_offset and q > 0:
            self._restart_at(q, remember=True)  # no file would be left to record `q`
            return q
        self._files.truncate(q * UNIT_SIZE)
        self._max = q
        self._min = min(self._min, q)
        last = self._unit_or_none(q - 1)
        self._last_phy = last.commitlog_offset if last is not None else -1
        return q

    def delete_below_commitlog_offset(self, phy: int) -> int:
        """Forget units below commit-log offset `phy`; delete files holding only such units.

        `min_offset` moves to the first unit whose commit-log offset is >= `phy`, also
        inside a file (RocketMQ's correctMinOffset), and never back. Returns the new
        min_offset. The file holding the newest unit is kept.
        """
        q = max(self._first_at_or_after(phy, self._min), self._min)
        keep_from = q * UNIT_SIZE
        if self._max > 0:
            last_pos = (self._max - 1) * UNIT_SIZE
            keep_from = min(keep_from, last_pos - last_pos % self._file_size)
        self._files.delete_before(keep_from)
        self._floor = max(self._floor, self._files.min_offset // UNIT_SIZE)
        self._min = q
        return q

    # -- lifecycle -------------------------------------------------------------

    def flush(self) -> int:
        """fsync; returns the flushed queue offset. Blocking: call it off the event loop."""
        return self._files.flush() // UNIT_SIZE

    def close(self) -> None:
        self._files.close()
