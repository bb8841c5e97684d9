"""Retention policy: when to clean, which commit-log segments may go, when writes stop."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.retention_policy import RetentionPolicy, deletable_segments, disk_usage_ratio

HOUR = 3600.0
NOW = 1_700_000_000.0
POLICY = RetentionPolicy()


def test_defaults_are_rocketmq_s() -> None:
    policy = RetentionPolicy(
        file_reserved_hours=72.0, delete_when_hour=4, force_clean_ratio=0.85, refuse_ratio=0.95
    )
    assert policy == POLICY


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"file_reserved_hours": -1.0}, "file_reserved_hours"),
        ({"file_reserved_hours": float("nan")}, "file_reserved_hours"),
        ({"delete_when_hour": 24}, "delete_when_hour"),
        ({"delete_when_hour": -1}, "delete_when_hour"),
        ({"force_clean_ratio": 0.0}, "force_clean_ratio"),
        ({"force_clean_ratio": 0.96}, "force_clean_ratio <= refuse_ratio"),
        ({"refuse_ratio": 1.5}, "refuse_ratio <= 1"),
    ],
)
def test_invalid_policies_are_refused(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetentionPolicy(**fields)  # type: ignore[arg-type]


def test_disk_usage_ratio_is_df_s(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    used = st.f_blocks - st.f_bfree
    expected = used / (used + st.f_bavail) if used + st.f_bavail else 0.0
    assert disk_usage_ratio(tmp_path) == pytest.approx(expected, abs=0.01)
    assert 0.0 <= disk_usage_ratio(tmp_path) <= 1.0
    with pytest.raises(FileNotFoundError):
        disk_usage_ratio(tmp_path / "missing")


def test_disk_usage_ratio_leaves_root_s_reserve_out(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = os.statvfs_result((4096, 1024, 1000, 300, 200, 0, 0, 0, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: fake)
    # 700 blocks used, 200 available (100 reserved for root count as neither): 7/9.
    assert disk_usage_ratio("/anything") == pytest.approx(700 / 900)
    empty = os.statvfs_result((4096, 1024, 0, 0, 0, 0, 0, 0, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: empty)
    assert disk_usage_ratio("/anything") == 0.0


def test_should_clean_reasons_in_order_of_precedence() -> None:
    at_four = datetime(2024, 5, 1, 4, 30)
    at_noon = datetime(2024, 5, 1, 12, 0)
    assert POLICY.should_clean(at_noon, 0.5, forced=False) is None
    assert POLICY.should_clean(at_four, 0.5, forced=False) == "scheduled hour"
    assert POLICY.should_clean(at_noon, 0.91, forced=False) == (
        "disk usage 0.91 >= force ratio 0.85"
    )
    assert POLICY.should_clean(at_noon, 0.85, forced=False) == (
        "disk usage 0.85 >= force ratio 0.85"
    )
    assert POLICY.should_clean(at_noon, 0.8499, forced=False) is None
    assert POLICY.should_clean(at_four, 0.99, forced=True) == "forced"
    assert POLICY.should_clean(at_four, 0.99, forced=False) == (
        "disk usage 0.99 >= force ratio 0.85"
    )
    # A struct_time (time.localtime()) works as well as a datetime.
    assert POLICY.should_clean(time.struct_time((2024, 5, 1, 4, 0, 0, 2, 122, 0)), 0.1, False)
    assert RetentionPolicy(delete_when_hour=12).should_clean(at_noon, 0.1, False) == (
        "scheduled hour"
    )


def test_expired() -> None:
    assert not POLICY.expired(NOW - 72 * HOUR + 1, NOW, ignore_age=False)
    assert POLICY.expired(NOW - 72 * HOUR, NOW, ignore_age=False)
    assert POLICY.expired(NOW, NOW, ignore_age=True)
    assert POLICY.expired(NOW + HOUR, NOW, ignore_age=True)  # a clock step does not matter
    assert not POLICY.expired(NOW + HOUR, NOW, ignore_age=False)
    assert RetentionPolicy(file_reserved_hours=0.5).expired(NOW - 1800, NOW, ignore_age=False)


def test_ignores_age_under_pressure_or_when_forced() -> None:
    assert not POLICY.ignores_age(0.5, forced=False)
    assert POLICY.ignores_age(0.85, forced=False)
    assert POLICY.ignores_age(0.1, forced=True)


def test_refuses_writes() -> None:
    assert POLICY.refuses_writes(0.9499) is None
    assert POLICY.refuses_writes(0.95) == (
        "disk usage 0.95 >= refuse ratio 0.95: writes are refused until retention frees space"
    )
    message = RetentionPolicy(refuse_ratio=0.975).refuses_writes(0.98)
    assert message is not None and message.startswith("disk usage 0.98 >= refuse ratio 0.975")
    # Rounding never shows a usage below the limit it reached.
    assert RetentionPolicy(force_clean_ratio=0.8512, refuse_ratio=0.9).should_clean(
        datetime(2024, 5, 1, 12), 0.8513, forced=False
    ) == ("disk usage 0.8513 >= force ratio 0.8512")


def segments(*ages_h: float, size: int = 100) -> list[tuple[int, int, float]]:
    return [(i * size, (i + 1) * size, NOW - age * HOUR) for i, age in enumerate(ages_h)]


def test_deletable_segments() -> None:
    old = segments(100, 90, 80, 10, 1)
    assert deletable_segments(old, 500, NOW, POLICY, ignore_age=False) == [0, 100, 200]
    # Never beyond the safe offset: a segment must end at or before it.
    assert deletable_segments(old, 199, NOW, POLICY, ignore_age=False) == [0]
    assert deletable_segments(old, 200, NOW, POLICY, ignore_age=False) == [0, 100]
    assert deletable_segments(old, 0, NOW, POLICY, ignore_age=False) == []
    # Under pressure age does not count, but the newest segment always stays.
    assert deletable_segments(old, 500, NOW, POLICY, ignore_age=True) == [0, 100, 200, 300]
    assert deletable_segments(old, 1 << 40, NOW, POLICY, ignore_age=True) == [0, 100, 200, 300]
    # Oldest first without gaps: a young segment stops the run (an mtime can be touched).
    assert deletable_segments(segments(100, 1, 90, 1), 400, NOW, POLICY, False) == [0]
    assert deletable_segments(segments(1, 100, 90, 1), 400, NOW, POLICY, False) == []
    assert deletable_segments(segments(100), 100, NOW, POLICY, ignore_age=True) == []
    assert deletable_segments([], 100, NOW, POLICY, ignore_age=True) == []


def test_deletable_segments_refuses_an_unordered_list() -> None:
    with pytest.raises(ValueError, match="oldest first"):
        deletable_segments(list(reversed(segments(100, 90))), 500, NOW, POLICY, True)


@given(
    ages=st.lists(st.floats(0, 200), max_size=12),
    size=st.integers(1, 1000),
    safe=st.integers(0, 12_000),
    reserved=st.floats(0, 100),
    ignore_age=st.booleans(),
)
def test_deletable_segments_is_the_longest_safe_expired_prefix(
    ages: list[float], size: int, safe: int, reserved: float, ignore_age: bool
) -> None:
    policy = RetentionPolicy(file_reserved_hours=reserved)
    segs = segments(*ages, size=size)
    found = deletable_segments(segs, safe, NOW, policy, ignore_age)
    assert found == [start for start, _, _ in segs[: len(found)]]  # an oldest-first run
    assert len(found) < max(len(segs), 1)  # the newest stays
    for _start, end, mtime in segs[: len(found)]:
        assert end <= safe and (ignore_age or NOW - mtime >= reserved * HOUR)
    if len(found) < len(segs) - 1:  # it stopped at one that may not go
        _start, end, mtime = segs[len(found)]
        assert end > safe or not policy.expired(mtime, NOW, ignore_age)
