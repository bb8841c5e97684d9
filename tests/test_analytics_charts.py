"""The charts of the analytics jobs: the numbers each one draws, and the PNGs it writes.

The Spark tests (marked slow) run the jobs over small DataFrames built from known
rows and share the one Spark session of test_spark.py; the chart data
(`rate_series`), `lag` (over a store stub) and the drawing need no Spark.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from matplotlib.axes import Axes
from matplotlib.dates import ConciseDateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from pyspark.sql import SparkSession

from analytics import charts, jobs
from analytics.codec import TIMESTAMP
from analytics.sources import GroupOffset, QueueInfo
from tests.test_spark import spark

assert spark

T0 = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def minute(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%d %H:%M")


def x_of(when: dt.datetime) -> float:
    """`when` on a matplotlib date axis."""
    return float(date2num(when))  # type: ignore[no-untyped-call]


def assert_png(path: Path, fig: Figure, min_bytes: int = 20_000) -> None:
    """A PNG of the figure's size (100 dpi), drawn: not one flat colour."""
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert path.stat().st_size > min_bytes
    pixels = imread(path)
    width, height = fig.get_size_inches() * 100
    assert pixels.shape[:2] == (round(height), round(width))
    colours = np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)
    assert len(colours) > 100


def texts(ax: Axes) -> list[str]:
    return [t.get_text() for t in ax.texts]


def titled(fig: Figure) -> str:
    title = fig.get_suptitle()
    assert title
    return title


# ---------------------------------------------------------------- rate

# Two topics over five minutes; 12:02 has no message of either.
RATE_MESSAGES = [
    ("orders", 5, 100),
    ("orders", 59.999, 200),
    ("orders", 90, 300),
    ("orders", 180, 400),
    ("pay", 10, 1000),
    ("pay", 239.999, 20),
    ("pay", 240, 40),
]


@pytest.fixture
def new_york_local_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The driver's local time is not UTC (PySpark turns timestamps into local datetimes)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.slow
@pytest.mark.usefixtures("new_york_local_time")
def test_rate_buckets_a_gap_as_zero_and_draws_rates_from_zero(
    spark: SparkSession, tmp_path: Path
) -> None:
    no_keys: list[str] = []
    rows = [(topic, no_keys, at(s), size) for topic, s, size in RATE_MESSAGES]
    table = jobs.rate(spark.createDataFrame(rows, jobs.JOB_COLUMNS))
    assert table.rows == [
        (minute(0), "orders", 2, 300),
        (minute(0), "pay", 1, 1000),
        (minute(60), "orders", 1, 300),
        (minute(180), "orders", 1, 400),
        (minute(180), "pay", 1, 20),
        (minute(240), "pay", 1, 40),
    ]
    assert table.rows[0][0] == "2024-03-01 12:00"  # UTC, whatever the local time zone

    series = jobs.rate_series(table)
    assert series.bucket_s == 60
    assert series.starts == [at(60 * k) for k in range(5)]
    assert series.end == at(300)
    assert series.messages == {"orders": [2, 1, 0, 1, 0], "pay": [1, 0, 0, 1, 1]}
    assert series.body_bytes == {"orders": [300, 300, 0, 400, 0], "pay": [1000, 0, 0, 20, 40]}
    assert series.empty == [False, False, True, False, False]
    assert series.per_s(series.messages["orders"]) == [2 / 60, 1 / 60, 0, 1 / 60, 0]

    fig = charts.chart_figure(table)
    ax_m, ax_b = fig.axes
    assert ax_m.get_ylabel() == "messages/s" and ax_b.get_ylabel() == "body B/s"
    assert "UTC" in ax_b.get_xlabel() and "1-minute bucket" in titled(fig)
    for ax in (ax_m, ax_b):
        assert ax.get_ylim()[0] == 0
    formatter = ax_b.xaxis.get_major_formatter()
    assert isinstance(formatter, ConciseDateFormatter)
    # Ticks in UTC, though the local time zone is New York's.
    ticks = formatter.format_ticks([x_of(at(0)), x_of(at(60))])  # type: ignore[no-untyped-call]
    assert ticks == ["12:00", "12:01"]
    # The x axis spans the five buckets; the steps drop to 0 in the empty minute.
    assert ax_b.get_xlim() == pytest.approx((x_of(at(0)), x_of(at(300))), abs=1e-9)
    steps = {
        line.get_color(): list(np.asarray(line.get_ydata(), dtype=float))
        for line in ax_m.get_lines()
        if line.get_drawstyle() == "steps-post"
    }
    assert steps == {
        "#1f77b4": [2 / 60, 1 / 60, 0.0, 1 / 60, 0.0, 0.0],
        "#ff7f0e": [1 / 60, 0.0, 0.0, 1 / 60, 1 / 60, 1 / 60],
    }
    bytes_steps = [
        list(np.asarray(line.get_ydata(), dtype=float))
        for line in ax_b.get_lines()
        if line.get_drawstyle() == "steps-post"
    ]
    assert bytes_steps[1] == [1000 / 60, 0.0, 0.0, 20 / 60, 40 / 60, 40 / 60]
    # The minute without messages is shaded on both panels.
    for ax in (ax_m, ax_b):
        (gap,) = [p for p in ax.patches if p.get_gid() == "gap"]
        assert isinstance(gap, Rectangle)
        span = (gap.get_x(), gap.get_x() + gap.get_width())
        assert span == pytest.approx((x_of(at(120)), x_of(at(180))), abs=1e-9)
    # Topics differ in colour, line style and marker, and the legend names them.
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "orders",
        "pay",
        "no messages\n(any topic)",
    ]
    styles = [
        (h.get_color(), h.get_linestyle(), h.get_marker())
        for h in legend.legend_handles
        if isinstance(h, Line2D)
    ]
    assert len(styles) == 2
    for k in range(3):
        assert styles[0][k] != styles[1][k]

    png = charts.write_chart(table, tmp_path / "charts" / "rate.png")
    assert png == tmp_path / "charts" / "rate.png"
    assert_png(png, fig)


def rate_table(rows: list[tuple[Any, ...]]) -> jobs.Table:
    return jobs.Table("rate", ("minute", "topic", "messages", "bytes"), rows, "lines")


def test_a_long_span_is_drawn_in_coarser_buckets_that_keep_every_count() -> None:
    minutes = range(0, 3 * 24 * 60, 7)  # three days, a message every 7 minutes
    table = rate_table([(minute(60 * m), "a", 1, 10 + m) for m in minutes])
    series = jobs.rate_series(table)
    assert series.bucket_s == 600  # 5 minutes would need 865 buckets
    assert len(series.starts) == 432
    assert len(series.starts) <= jobs.MAX_CHART_BUCKETS
    assert all(int(s.timestamp()) % 600 == 0 for s in series.starts)
    want = [0] * 432
    size = [0] * 432
    for m in minutes:
        want[m // 10] += 1
        size[m // 10] += 10 + m
    assert series.messages["a"] == want
    assert series.body_bytes["a"] == size
    assert series.per_s(want)[0] == want[0] / 600
    assert "10-minute bucket" in titled(charts.chart_figure(table))
    # A grid with fewer buckets allowed gets coarser still.
    assert jobs.rate_series(table, max_buckets=100).bucket_s == 3600


def test_rate_chart_of_one_minute_and_of_no_data(tmp_path: Path) -> None:
    one = rate_table([("2024-03-01 12:00", "a", 30, 3 * 1024 * 60)])
    series = jobs.rate_series(one)
    assert (series.starts, series.messages, series.empty) == ([T0], {"a": [30]}, [False])
    fig = charts.chart_figure(one)
    assert fig.axes[1].get_ylabel() == "body KiB/s"  # 3 KiB/s
    assert_png(charts.write_chart(one, tmp_path / "one.png"), fig)
    empty = charts.chart_figure(rate_table([]))
    assert texts(empty.axes[0]) == ["no data"]


# ---------------------------------------------------------------- sizes


@pytest.mark.slow
def test_sizes_gives_exact_percentiles_and_draws_each_with_its_value(
    spark: SparkSession, tmp_path: Path
) -> None:
    known = {"a": list(range(0, 1001, 10)), "b": [200, 100], "c": [7]}
    no_keys: list[str] = []
    rows = [(topic, no_keys, T0, size) for topic, sizes in known.items() for size in sizes]
    table = jobs.sizes(spark.createDataFrame(rows, jobs.JOB_COLUMNS))
    assert table.headers == ("topic", "messages", "min", "p50", "p90", "p99", "max")
    assert table.rows == [
        ("a", 101, 0, 500.0, 900.0, 990.0, 1000),
        ("b", 2, 100, 150.0, 190.0, 199.0, 200),
        ("c", 1, 7, 7.0, 7.0, 7.0, 7),
    ]
    fig = charts.chart_figure(table)
    (ax,) = fig.axes
    assert texts(ax) == [
        *("p50 500 B", "p50 150 B", "p50 7 B"),
        *("p90 900 B", "p90 190 B", "p90 7 B"),
        *("p99 990 B", "p99 199 B", "p99 7 B"),
        *("max 1000 B", "max 200 B", "max 7 B"),
    ]
    widths = sorted(p.get_width() for p in ax.patches if isinstance(p, Rectangle))
    assert widths == sorted([500, 150, 7, 900, 190, 7, 990, 199, 7, 1000, 200, 7])
    assert ax.get_xscale() == "log"  # 7 B to 1000 B
    assert "log scale" in ax.get_xlabel() and "p50 / p90 / p99 / max" in titled(fig)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "a\n101 msgs\nmin 0 B",
        "b\n2 msgs\nmin 100 B",
        "c\n1 msgs\nmin 7 B",
    ]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["p50", "p90", "p99", "max"]
    assert_png(charts.write_chart(table, tmp_path / "sizes.png"), fig)


def test_sizes_axis_is_logarithmic_for_a_wide_range_else_linear_from_zero() -> None:
    table = jobs.Table(
        "sizes",
        ("topic", "messages", "min", "p50", "p90", "p99", "max"),
        [("a", 10, 1000, 1536.0, 2048.5, 4000.0, 5 * 1024 * 1024)],
        "bars",
    )
    (ax,) = charts.chart_figure(table).axes
    assert ax.get_xscale() == "log"  # 1.5 KiB to 5 MiB
    assert texts(ax) == ["p50 1.5 KiB", "p90 2.0 KiB", "p99 3.9 KiB", "max 5.0 MiB"]
    narrow = jobs.Table(
        table.title, table.headers, [("a", 3, 90, 100.0, 250.5, 299.5, 300)], "bars"
    )
    (ax,) = charts.chart_figure(narrow).axes
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    assert ax.get_xlabel() == "message body size (bytes)"
    assert texts(ax) == ["p50 100 B", "p90 250.5 B", "p99 299.5 B", "max 300 B"]


# ---------------------------------------------------------------- top keys


@pytest.mark.slow
def test_top_keys_draws_one_panel_per_topic_with_counts(
    spark: SparkSession, tmp_path: Path
) -> None:
    keys = {
        "a": [["k1"], ["k1"], ["k1", "k2"], ["k2"], ["k3"]],
        "b": [["x", "y"], ["x"], ["x"], ["x"], ["x"]],
    }
    rows = [(topic, k, T0, 1) for topic, messages in keys.items() for k in messages]
    table = jobs.top_keys(spark.createDataFrame(rows, jobs.JOB_COLUMNS), limit=2)
    assert table.rows == [("a", 1, "k1", 3), ("a", 2, "k2", 2), ("b", 1, "x", 5), ("b", 2, "y", 1)]
    fig = charts.chart_figure(table)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert [ax.get_title() for ax in panels] == ["topic a", "topic b"]
    assert [texts(ax) for ax in panels] == [["3", "2"], ["5", "1"]]
    assert [[t.get_text() for t in ax.get_yticklabels()] for ax in panels] == [
        ["k1", "k2"],
        ["x", "y"],
    ]
    for ax in panels:
        assert ax.get_xlabel() == "messages" and ax.get_xlim()[0] == 0
        assert ax.get_ylim() == (1.5, -0.5)  # rank 1 on top
    assert "top 2 keys per topic" in titled(fig)
    assert_png(charts.write_chart(table, tmp_path / "keys.png"), fig)


def test_top_keys_panels_fill_a_grid_and_shorten_long_keys() -> None:
    rows = [(t, 1, f"{t}-" + "k" * 40, 9) for t in ("a", "b", "c")]
    table = jobs.Table("top 1", ("topic", "rank", "key", "messages"), rows, "bars")
    fig = charts.chart_figure(table)
    assert len(fig.axes) == 4  # 2 x 2, the last one blank
    assert [ax.axison for ax in fig.axes] == [True, True, True, False]
    label = fig.axes[0].get_yticklabels()[0].get_text()
    assert label == "a-" + "k" * 29 + "…"


# ---------------------------------------------------------------- lag


class StubStore:
    """Queues, a group's offsets, and a store timestamp per message (offset k: `stored(k)`)."""

    def __init__(self, queues: list[QueueInfo], offsets: dict[tuple[str, int], int]) -> None:
        self._queues = queues
        self._offsets = offsets
        self.reads: list[tuple[str, int, int, int, list[str]]] = []
        self.asked: list[tuple[str, str]] = []

    @staticmethod
    def stored_us(topic: str, queue_id: int, offset: int) -> int:
        base = int(T0.timestamp()) * 1_000_000
        return base + queue_id * 1_000_000 + offset * 1_000_000 + (123 if topic == "pay" else 0)

    def queues(self, topic: str = "") -> list[QueueInfo]:
        return [q for q in self._queues if not topic or q.topic == topic]

    def group_offsets(self, group: str, topic: str) -> list[GroupOffset]:
        self.asked.append((group, topic))
        return [GroupOffset(t, q, offset) for (t, q), offset in self._offsets.items() if t == topic]

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        columns: Sequence[str] = ("store_timestamp",),
    ) -> Iterator[pa.RecordBatch]:
        self.reads.append((topic, queue_id, start, end, list(columns)))
        stamps = [self.stored_us(topic, queue_id, k) for k in range(start, end)]
        yield pa.RecordBatch.from_arrays([pa.array(stamps, TIMESTAMP)], ["store_timestamp"])


def lag_store() -> StubStore:
    return StubStore(
        [
            QueueInfo("orders", 0, 0, 10),
            QueueInfo("orders", 1, 0, 10),
            QueueInfo("pay", 0, 5, 8),
            QueueInfo("pay", 1, 3, 9),
        ],
        # orders/0 caught up; orders/1 at 4; pay/0 never committed; pay/1 behind retention
        {("orders", 0): 10, ("orders", 1): 4, ("pay", 0): -1, ("pay", 1): 1},
    )


NOW_MS = int(T0.timestamp()) * 1000 + 100_370  # 12:01:40.370


def test_lag_gives_the_age_of_the_oldest_unconsumed_message(tmp_path: Path) -> None:
    store = lag_store()
    table = jobs.lag(store, "billing", now_ms=NOW_MS)
    assert store.reads == [
        ("orders", 1, 4, 5, ["store_timestamp"]),
        ("pay", 0, 5, 6, ["store_timestamp"]),
        ("pay", 1, 3, 4, ["store_timestamp"]),
    ]
    assert table.headers == (
        "topic",
        "queue",
        "committed_end",
        "group_offset",
        "lag",
        "oldest_unconsumed_s",
        "oldest_unconsumed_at",
    )
    assert table.rows == [
        ("orders", 0, 10, 10, 0, None, None),
        # stored at 12:00:05.000 (offset 4 of queue 1): 95.37 s before now
        ("orders", 1, 10, 4, 6, 95.4, "2024-03-01T12:00:05.000Z"),
        # stored at 12:00:05.000123: 95.369877 s
        ("pay", 0, 8, None, 3, 95.4, "2024-03-01T12:00:05.000Z"),
        # offset 1 was deleted: the oldest unconsumed is the first kept (3), 96.369877 s
        ("pay", 1, 9, 1, 6, 96.4, "2024-03-01T12:00:04.000Z"),
    ]
    assert table.notes["now"] == "2024-03-01T12:01:40.370Z"
    assert table.title == "consumer group 'billing': lag per queue at 2024-03-01T12:01:40.370Z"
    assert table.records()[1]["oldest_unconsumed_s"] == 95.4

    fig = charts.chart_figure(table)
    ax_age, ax_lag = fig.axes
    title = titled(fig)
    assert "consumer group 'billing'" in title and "oldest unconsumed" in title
    assert "now = 2024-03-01T12:01:40.370Z" in title
    assert [t.get_text() for t in ax_age.get_yticklabels()] == [
        "orders/0",
        "orders/1",
        "pay/0",
        "pay/1",
    ]
    assert [p.get_width() for p in ax_age.patches if isinstance(p, Rectangle)] == [
        0,
        95.4,
        95.4,
        96.4,
    ]
    assert texts(ax_age) == ["caught up", "95.4 s", "95.4 s", "96.4 s"]
    assert texts(ax_lag) == ["0", "6", "3", "6"]
    assert ax_age.get_xlabel() == "age of the oldest unconsumed message (s)"
    assert ax_lag.get_xlabel() == "lag (committed messages not consumed)"
    assert_png(charts.write_chart(table, tmp_path / "lag.png"), fig)


def test_lag_of_some_topics_measured_against_the_clock() -> None:
    store = lag_store()
    before = time.time_ns() // 1_000_000
    table = jobs.lag(store, "g", ["pay"])
    after = time.time_ns() // 1_000_000
    assert store.asked == [("g", "pay")]
    assert [(r[0], r[1]) for r in table.rows] == [("pay", 0), ("pay", 1)]
    assert before <= table.notes["now_ms"] <= after
    stored_ms = StubStore.stored_us("pay", 0, 5) / 1000
    assert (
        (before - stored_ms) / 1000 - 0.05 <= table.rows[0][5] <= (after - stored_ms) / 1000 + 0.05
    )


def test_ages_of_hours_are_labeled_in_seconds_and_hours() -> None:
    store = lag_store()
    table = jobs.lag(store, "billing", ["orders"], now_ms=NOW_MS + 3 * 3600 * 1000)
    ax_age = charts.chart_figure(table).axes[0]
    assert table.rows[1][5] == 10_895.4
    assert texts(ax_age) == ["caught up", "10,895 s (3.0 h)"]


def test_tables_without_notes_still_draw(tmp_path: Path) -> None:
    """Tables built by hand (older callers): a lag table of six columns, no "now"."""
    lag = jobs.Table(
        "lag",
        ("topic", "queue", "committed_end", "group_offset", "lag", "oldest_unconsumed_s"),
        [("a", 0, 9, None, 9, 1.5)],
        "bars",
    )
    fig = charts.chart_figure(lag)
    assert "now: not recorded" in titled(fig)
    assert texts(fig.axes[0]) == ["1.5 s"]
    other = jobs.Table("other", ("name", "count"), [("x", 3), ("y", 5)], "bars")
    fig = charts.chart_figure(other)
    assert texts(fig.axes[0]) == ["3", "5"] and fig.axes[0].get_xlabel() == "count"
    assert_png(charts.write_chart(other, tmp_path / "other.png"), fig, min_bytes=5_000)
