"""Runs of several queues' messages read in one pass, in a worker thread: a group's fetch.

Owns `queue_runs` (and `Span`, what it is asked for). A consumer group's fetch
reads a little of each queue its member holds; the queues' messages lie
interleaved in the commit log, so the units of each queue are read in one read
and then the messages of all of them in one pass of `reads.read_messages` (one
map per commit-log segment, entry headers checked together; or one by one when
there are few), each checked against its entry as every read of messages is. A
fetch is bounded in bytes too (`max_bytes`): its answer is one gRPC message.

Thread safety and bounds: `reads`' rules. The views are taken on the loop; every
unit read lies within its queue's snapshot, every message below the committed
position of the log's (checked, not assumed).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dledger_commitlog.log.reads import Files, LogView, QueueView, read_messages, read_units
from store.consume_queue import UNIT_DTYPE

Span = tuple[QueueView, int, int, frozenset[int] | None]  # queue, start, end, tag hashes
I64s = npt.NDArray[np.int64]


def queue_runs(
    view: LogView, spans: list[Span], max_bytes: int
) -> list[tuple[list[int], list[bytes], int]]:
    """For each span (queue, start, end, tag hashes): the queue offsets in [start, end)
    whose unit's tag hash is one of the span's (None: every unit), the messages they
    point to, as stored, and where the units looked at end. At most about `max_bytes`
    of messages in all (the first message always): a span the budget ends in ends at
    its last message taken, one after it at `start`. OffsetOutOfRange outside a
    queue's [min, max] (a file retention deleted meanwhile too); a damaged entry
    CorruptEntry."""
    with Files() as files:
        picked: list[I64s] = []
        offsets: list[I64s] = []
        sizes: list[I64s] = []
        stops: list[int] = []
        left = max_bytes
        for q, start, end, tags_codes in spans:
            units = np.frombuffer(read_units(q, files, start, end), UNIT_DTYPE)
            chosen = np.arange(len(units))
            if tags_codes is not None:
                codes = np.fromiter(tags_codes, np.int64, len(tags_codes))
                chosen = np.flatnonzero(np.isin(units["tags_code"].astype(np.int64), codes))
            size = units["size"].astype(np.int64)[chosen]
            total = np.cumsum(size)
            keep = int(np.searchsorted(total, left, side="right"))
            if not keep and len(chosen) and left == max_bytes:
                keep = 1  # the first message, whatever its size
            stop = end
            if keep < len(chosen):
                stop = start + (int(chosen[keep - 1]) + 1 if keep else 0)
                chosen, size = chosen[:keep], size[:keep]
            left -= int(total[keep - 1]) if keep else 0
            picked.append(chosen + start)
            offsets.append(units["commitlog_offset"].astype(np.int64)[chosen])
            sizes.append(size)
            stops.append(stop)
        none = np.zeros(0, np.int64)
        at, size = np.concatenate([none, *offsets]), np.concatenate([none, *sizes])
        if len(at) and int((at + size).max()) > view.committed:
            raise AssertionError(f"a queue unit points beyond committed {view.committed}")
        order = np.argsort(at, kind="stable")  # rising, as read_messages reads them
        found = read_messages(view, files, at[order], size[order])
    messages: list[bytes] = [b""] * len(found)
    for i, data in zip(order.tolist(), found, strict=True):
        messages[i] = data
    out = []
    first = 0
    for queue_offsets, stop in zip(picked, stops, strict=True):
        last = first + len(queue_offsets)
        out.append((queue_offsets.tolist(), messages[first:last], stop))
        first = last
    return out
