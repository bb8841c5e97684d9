"""The rows a read decodes: consume-queue units of several queues, one row per message.

A read first gathers the units (20 bytes: commit-log offset, size, tags code) of
the queue ranges it serves (`Units`), then turns them into `Rows`: each row's
commit-log offset and size with what the message there must be (topic, queue id,
queue offset; `analytics.codec.Expected`), in log order (one pass over the
bytes) or in queue order. Rows are decoded in record batches of about
`BATCH_ROWS` (`batch_slices`). Both stores use these, whether the units came
from the files (`file_store`) or from ReadUnits (`server_store`), and both
estimate the commit-log range of queue slices from the units at their ends
(`span_from_ends`, for cutting the log into pieces).

Invariant: the arrays of `Rows` are aligned, row k of each describing the same
message, and reordering (log order) permutes them together.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from analytics.codec import Expected, Int64s, Ints
from store.entry_format import HEADER_SIZE

BATCH_ROWS: Final = 262_144  # rows per record batch: Spark ingests big batches faster
npt_units = np.ndarray[Any, Any]  # a structured array of store.consume_queue.UNIT_DTYPE


class Units:
    """Consume-queue units of several queues, one row per message, with what each row
    is expected to be (queue, offset, topic)."""

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = tuple(topics)
        self._code = {t: i for i, t in enumerate(self.topics)}
        self._parts: list[tuple[int, int, int, npt_units]] = []

    def add(self, topic: str, queue_id: int, first: int, units: npt_units) -> None:
        if len(units):
            self._parts.append((self._code[topic], queue_id, first, units))

    def arrays(self) -> tuple[Int64s, Ints, Ints, Ints, Int64s]:
        """offsets, sizes, topic codes, queue ids, queue offsets (in the order added)."""
        if not self._parts:
            z64, z32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
            return z64, z32, z32, z32, z64
        offsets = np.concatenate([u["commitlog_offset"] for *_, u in self._parts]).astype(np.int64)
        sizes = np.concatenate([u["size"] for *_, u in self._parts]).astype(np.int32)
        codes = np.concatenate([np.full(len(u), c, np.int32) for c, _, _, u in self._parts])
        qids = np.concatenate([np.full(len(u), q, np.int32) for _, q, _, u in self._parts])
        qoffs = np.concatenate(
            [np.arange(f, f + len(u), dtype=np.int64) for _, _, f, u in self._parts]
        )
        return offsets, sizes, codes, qids, qoffs


@dataclass(slots=True)
class Rows:
    """Rows to decode, in the order they will be read."""

    offsets: Int64s
    sizes: Ints
    expected: Expected = field(repr=False)

    @classmethod
    def of(cls, units: Units, order: str = "log") -> Rows:
        offsets, sizes, codes, qids, qoffs = units.arrays()
        if order == "log" and len(offsets):
            perm = np.argsort(offsets, kind="stable")
            offsets, sizes, codes, qids, qoffs = (
                offsets[perm],
                sizes[perm],
                codes[perm],
                qids[perm],
                qoffs[perm],
            )
        exp = Expected(
            sizes=sizes,
            commitlog_offsets=offsets,
            topics=units.topics,
            topic_codes=codes,
            queue_ids=qids,
            queue_offsets=qoffs,
        )
        return cls(offsets, sizes, exp)

    def __len__(self) -> int:
        return len(self.offsets)


def batch_slices(n: int, rows: int = BATCH_ROWS) -> Iterator[slice]:
    """Row ranges of about `rows` (a short tail joins the batch before it)."""
    lo = 0
    while lo < n:
        hi = n if n - lo < rows + rows // 2 else lo + rows
        yield slice(lo, hi)
        lo = hi


def span_from_ends(ends: Any) -> tuple[int, int, int] | None:
    """(lowest offset, highest end, estimated bytes) over (slice, first unit, last unit)."""
    lo, hi, size = None, None, 0
    for s, first, last in ends:
        a = int(first["commitlog_offset"][0])
        b = int(last["commitlog_offset"][0]) + int(last["size"][0])
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
        mean = (int(first["size"][0]) + int(last["size"][0])) / 2 + HEADER_SIZE
        size += int((s.end - s.start) * mean)
    return None if lo is None or hi is None else (lo, hi, size)
