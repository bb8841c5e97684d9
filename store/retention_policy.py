"""Commit-log retention policy: when to clean, which segments may go, when to refuse writes.

Pure helpers, as RocketMQ's CleanCommitLogService decides them, with no knowledge
of Raft or of the files themselves (the caller lists segments and deletes them):

- Cleaning runs at the scheduled hour (`delete_when_hour`, local time), when the
  disk is at or past `force_clean_ratio`, or when an operator forces it.
- A segment may be deleted once it is older than `file_reserved_hours` (by its
  mtime), or at any age when the disk is past the force ratio or the operator
  forces it (`ignore_age`).
- Whatever the age, a segment goes only if it ends at or before the caller's
  safe offset (committed, dispatched and not needed by a lagging peer), segments
  go oldest first with no gap, and the newest segment always stays.
- At or past `refuse_ratio` the store refuses writes until cleaning frees space.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = ["RetentionPolicy", "deletable_segments", "disk_usage_ratio"]

_SECONDS_PER_HOUR = 3600


def disk_usage_ratio(path: str | os.PathLike[str]) -> float:
    """Used fraction of the filesystem holding `path`, as `df` computes Use%.

    used = (blocks - free) and avail = blocks available to unprivileged users, so
    the blocks reserved for root count as neither: used / (used + avail).
    """
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    total = used + avail
    return used / total if total > 0 else 0.0


def _ratio(value: float, limit: float) -> str:
    """`value` to two decimals, or more where rounding would show it below `limit`."""
    text = f"{value:.2f}"
    return text if float(text) >= limit else f"{value:.6g}"


def _hour_of(now_local: datetime | time.struct_time) -> int:
    return now_local.hour if isinstance(now_local, datetime) else now_local.tm_hour


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    file_reserved_hours: float = 72.0
    delete_when_hour: int = 4
    force_clean_ratio: float = 0.85
    refuse_ratio: float = 0.95

    def __post_init__(self) -> None:
        if not self.file_reserved_hours >= 0:
            raise ValueError(f"file_reserved_hours must be >= 0, not {self.file_reserved_hours}")
        if not 0 <= self.delete_when_hour <= 23:
            raise ValueError(f"delete_when_hour must be in 0..23, not {self.delete_when_hour}")
        if not 0 < self.force_clean_ratio <= self.refuse_ratio <= 1:
            raise ValueError(
                "need 0 < force_clean_ratio <= refuse_ratio <= 1, not "
                f"{self.force_clean_ratio} and {self.refuse_ratio}"
            )

    def should_clean(
        self, now_local: datetime | time.struct_time, usage_ratio: float, forced: bool
    ) -> str | None:
        """Why a cleaning pass should run now, or None: 'forced', the disk usage, or the
        scheduled hour, in that order of precedence."""
        if forced:
            return "forced"
        if usage_ratio >= self.force_clean_ratio:
            usage = _ratio(usage_ratio, self.force_clean_ratio)
            return f"disk usage {usage} >= force ratio {self.force_clean_ratio:g}"
        if _hour_of(now_local) == self.delete_when_hour:
            return "scheduled hour"
        return None

    def expired(self, segment_mtime_s: float, now_s: float, ignore_age: bool) -> bool:
        """Whether a segment last modified at `segment_mtime_s` is old enough to delete."""
        if ignore_age:
            return True
        return now_s - segment_mtime_s >= self.file_reserved_hours * _SECONDS_PER_HOUR

    def ignores_age(self, usage_ratio: float, forced: bool) -> bool:
        """Whether age limits are waived: the disk is past the force ratio, or an
        operator forces cleaning."""
        return forced or usage_ratio >= self.force_clean_ratio

    def refuses_writes(self, usage_ratio: float) -> str | None:
        """An error message when the disk is too full to accept writes, else None."""
        if usage_ratio < self.refuse_ratio:
            return None
        return (
            f"disk usage {_ratio(usage_ratio, self.refuse_ratio)} >= refuse ratio "
            f"{self.refuse_ratio:g}: "
            "writes are refused until retention frees space"
        )


def deletable_segments(
    segments: Sequence[tuple[int, int, float]],
    safe_offset: int,
    now_s: float,
    policy: RetentionPolicy,
    ignore_age: bool,
) -> list[int]:
    """Start offsets of the oldest segments that may be deleted now, oldest first.

    `segments` are (start_offset, end_offset, mtime_s) of the commit-log segments,
    oldest first. A segment may go when it ends at or before `safe_offset` and has
    expired (see `RetentionPolicy.expired`); the run stops at the first one that
    may not, and the newest segment never goes.
    """
    for (start, _, _), (following, _, _) in itertools.pairwise(segments):
        if following <= start:
            raise ValueError(f"segments must be oldest first: {following} after {start}")
    found: list[int] = []
    for start, end, mtime_s in segments[:-1]:
        if end > safe_offset or not policy.expired(mtime_s, now_s, ignore_age):
            break
        found.append(start)
    return found
