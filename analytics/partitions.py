"""How a read's queue ranges are cut into Spark partitions: pure functions, no Spark.

A read covers [start, end) of each queue. How it is cut into partitions
(`partitioning`): `queue`: each queue's range into pieces of at most
`messagesPerPartition` (fewer when `minPartitions` asks for more partitions);
`log`: the commit-log range the messages occupy into about `minPartitions`
(default: this host's cores) ranges of bytes, each read in one pass over the
log by a partition; `auto` (default): `log` when the messages read fill at
least 40% of the log range they span (every topic, most topics, any read of
files), else `queue` (a few topics of many over the servers).

A multi-shard cluster's shards are separate logs (each with its own commit-log
offsets): a read is planned per shard (`by_shard`), each shard's slices cut as
above, the log pieces shared among the shards in proportion to their bytes
(`shares`); a partition never spans shards, and Spark runs the partitions of every
shard side by side.

Invariant: the partitions cover every message of the ranges exactly once, by
queue offsets (`split`) or by commit-log range (`log_pieces`: each piece reads
its queues' messages that lie in [start, end), and the pieces tile the span).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Sequence
from typing import Final

from analytics.options import ReadOptions
from analytics.sources import LogPiece, Slice

LOG_MODE_DENSITY: Final = 0.4  # auto: a log-range read when the messages fill this much
MIN_PIECE_BYTES: Final = 4 << 20  # log ranges are not cut finer than this
MAX_PIECE_BYTES: Final = 1 << 30  # nor left larger


def split(slices: Iterable[Slice], per_partition: int, min_partitions: int = 1) -> list[Slice]:
    """Cut each range into pieces of at most `per_partition` (smaller for `min_partitions`)."""
    slices = list(slices)
    total = sum(s.end - s.start for s in slices)
    size = per_partition
    if min_partitions > 1 and total:
        size = max(1, min(size, math.ceil(total / min_partitions)))
    out = []
    for s in slices:
        for lo in range(s.start, s.end, size):
            out.append(Slice(s.topic, s.queue_id, lo, min(s.end, lo + size), s.shard))
    return out


def use_log_ranges(partitioning: str, files: bool, span: tuple[int, int, int] | None) -> bool:
    """Cut by commit-log range? (see the module doc; `span`: store.unit_span)."""
    if span is None or partitioning == "queue":
        return False
    if partitioning == "log" or files:
        return True
    lo, hi, size = span
    return hi > lo and size >= LOG_MODE_DENSITY * (hi - lo)


def log_pieces(
    slices: Sequence[Slice],
    span: tuple[int, int, int],
    partitions: int,
    segment_bytes: int | None,
    exact: bool = False,
) -> list[LogPiece]:
    """The range [lo, hi) the slices' messages occupy, cut into about `partitions` pieces of
    equal bytes (none over MAX_PIECE_BYTES; unless `exact`, none under MIN_PIECE_BYTES
    but the only one), cuts moved onto data-segment boundaries when one is close."""
    lo, hi, _ = span
    size = hi - lo
    count = max(1, partitions if exact else min(partitions, math.ceil(size / MIN_PIECE_BYTES)))
    count = max(count, math.ceil(size / MAX_PIECE_BYTES))
    step = size / count
    cuts = {lo, hi}
    for k in range(1, count):
        cut = lo + round(k * step)
        if segment_bytes:
            boundary = round(cut / segment_bytes) * segment_bytes
            if abs(boundary - cut) <= step / 8 and lo < boundary < hi:
                cut = boundary
        cuts.add(cut)
    bounds = sorted(cuts)
    queues = tuple(s for s in slices if s.start < s.end)
    return [LogPiece(a, b, queues) for a, b in itertools.pairwise(bounds) if a < b]


def by_shard(slices: Iterable[Slice]) -> dict[int, list[Slice]]:
    """The non-empty slices of each shard, shards in order."""
    out: dict[int, list[Slice]] = {}
    for s in slices:
        if s.start < s.end:
            out.setdefault(s.shard, []).append(s)
    return dict(sorted(out.items()))


def shares(count: int, sizes: Sequence[int]) -> list[int]:
    """`count` pieces shared in proportion to `sizes` (bytes of each shard's read), at
    least one each: shards read side by side, each in about its share of the pieces."""
    total = sum(sizes)
    if len(sizes) <= 1 or total <= 0:
        return [max(1, count)] * len(sizes)
    return [max(1, math.ceil(count * size / total)) for size in sizes]


def default_partitions(opts: ReadOptions) -> int:
    """Log ranges: `minPartitions` if given, else this host's cores (Spark's default
    parallelism in local mode)."""
    return opts.min_partitions if opts.min_partitions_given else max(1, os.cpu_count() or 1)
