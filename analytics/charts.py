"""PNG charts of the jobs' tables (matplotlib, no display and no pyplot needed).

`write_chart` draws a table (`chart_figure` builds the matplotlib figure):

- rate: two stacked panels, messages/s and body bytes/s, on a UTC time axis;
  every bucket from the first to the last is drawn, an empty one as 0 (the grid
  is `rate_series`: longer spans are drawn in coarser buckets); y from 0;
  each topic has its own colour, line style and marker;
- sizes: p50, p90, p99 and max per topic, with value labels in bytes;
- top keys: one panel per topic, bars with their counts;
- lag: per queue, the age of the oldest unconsumed message (s) next to the lag
  (messages), and the "now" the ages were measured against.

The chart is chosen by the table's columns; any other table is drawn as a bar
per row of its last numeric column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analytics.jobs import UTC, Table, rate_series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SIZE_STATS = ("p50", "p90", "p99", "max")


def write_chart(table: Table, path: str | Path) -> Path:
    """Render `table` as a PNG at `path` (matplotlib, no display needed)."""
    out = Path(path)
    fig = chart_figure(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def chart_figure(table: Table) -> Figure:
    """The chart of a job's table (by its columns), as a matplotlib figure (no pyplot)."""
    headers = set(table.headers)
    if table.chart == "lines" and {"minute", "topic", "messages", "bytes"} <= headers:
        return _rate_figure(table)
    if {"topic", *SIZE_STATS} <= headers:
        return _sizes_figure(table)
    if {"topic", "key", "messages"} <= headers:
        return _top_keys_figure(table)
    if {"topic", "queue", "lag"} <= headers:
        return _lag_figure(table)
    return _plain_figure(table)


_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_GAP_COLOR = "0.88"


def series_style(k: int) -> dict[str, Any]:
    """The k-th series' colour, line style and marker: 40 distinct combinations."""
    return {
        "color": _COLORS[k % len(_COLORS)],
        "linestyle": _LINESTYLES[k % len(_LINESTYLES)],
        "marker": _MARKERS[k % len(_MARKERS)],
    }


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _no_data(fig: Figure, title: str) -> Figure:
    ax = fig.subplots()
    ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=14, transform=ax.transAxes)
    ax.set_axis_off()
    fig.suptitle(title)
    return fig


def _rate_figure(table: Table) -> Figure:
    import matplotlib.dates as mdates
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    s = rate_series(table)
    fig = _new_figure(12, 7.5)
    if not s.starts:
        return _no_data(fig, "message rate per topic")
    ax_m, ax_b = fig.subplots(2, 1, sharex=True)
    days = mdates.date2num([*s.starts, s.end])  # type: ignore[no-untyped-call]
    edges = np.array(days, dtype=np.float64)  # bucket edges, in matplotlib's date numbers
    mids = (edges[:-1] + edges[1:]) / 2
    peak_bytes = max(max(s.per_s(b)) for b in s.body_bytes.values())
    unit, scale = _byte_unit(peak_bytes)
    every = max(1, len(s.starts) // 40)  # markers: at most ~40 per series
    handles: list[Any] = []
    for k, topic in enumerate(s.messages):
        style = series_style(k)
        panels = (
            (ax_m, s.per_s(s.messages[topic])),
            (ax_b, [v / scale for v in s.per_s(s.body_bytes[topic])]),
        )
        for ax, values in panels:
            ax.plot(
                edges,
                [*values, values[-1]],
                drawstyle="steps-post",
                color=style["color"],
                linestyle=style["linestyle"],
                linewidth=1.6,
            )
            ax.plot(
                mids,
                values,
                linestyle="none",
                marker=style["marker"],
                markevery=every,
                markersize=5,
                color=style["color"],
            )
        handles.append(Line2D([], [], linewidth=1.6, label=topic, **style))
    gaps = _runs(s.empty)
    for i, j in gaps:
        for ax in (ax_m, ax_b):
            span = (float(edges[i]), float(edges[j]))
            ax.axvspan(*span, color=_GAP_COLOR, zorder=0, linewidth=0, gid="gap")
    if gaps:
        handles.append(Patch(color=_GAP_COLOR, label="no messages\n(any topic)"))
    for ax in (ax_m, ax_b):
        ax.set_ylim(bottom=0)
        if ax.get_ylim()[1] <= 0:
            ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
    ax_m.set_ylabel("messages/s")
    ax_b.set_ylabel(f"body {unit}/s")
    ax_b.xaxis_date(tz=UTC)
    locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
    ax_b.xaxis.set_major_locator(locator)
    concise = mdates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
    ax_b.xaxis.set_major_formatter(concise)
    ax_b.set_xlim(float(edges[0]), float(edges[-1]))
    ax_b.set_xlabel("store time (UTC)")
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(len(handles), 6), title="topic"
    )
    total = sum(sum(c) for c in s.messages.values())
    size = sum(sum(b) for b in s.body_bytes.values())
    shown = f"{s.starts[0]:%Y-%m-%d %H:%M} to {s.end:%Y-%m-%d %H:%M} UTC"
    fig.suptitle(
        f"Message rate per topic: mean per {_duration(s.bucket_s)} bucket of store time\n"
        f"{shown}; {total:,} messages, {_human_bytes(size)} of bodies; empty buckets drawn as 0",
    )
    return fig


def _runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """The [i, j) runs of True in `flags`."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _sizes_figure(table: Table) -> Figure:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    h = table.headers
    rows = table.rows
    fig = _new_figure(12, max(3.5, 1.8 + 1.2 * len(rows)))
    title = "Message body size per topic: p50 / p90 / p99 / max"
    if not rows:
        return _no_data(fig, title)
    ax = fig.subplots()
    values = [[_number(r[h.index(stat)]) for stat in SIZE_STATS] for r in rows]
    positive = [v for vs in values for v in vs if v > 0]
    log = bool(positive) and max(positive) / min(positive) >= 100
    colors = ("#9ecae1", "#4292c6", "#08519c", "#d62728")
    height = 0.2
    for j, stat in enumerate(SIZE_STATS):
        ys = [i + (j - 1.5) * height for i in range(len(rows))]
        xs = [vs[j] for vs in values]
        bars = ax.barh(ys, xs, height=height * 0.9, color=colors[j], label=stat)
        labels = [f"{stat} {_human_bytes(x)}" for x in xs]
        ax.bar_label(bars, labels=labels, padding=3, fontsize=8)
    ticks = []
    for r in rows:
        text = f"{r[0]}"
        if "messages" in h:
            text += f"\n{_number(r[h.index('messages')]):,.0f} msgs"
        if "min" in h:
            text += f"\nmin {_human_bytes(_number(r[h.index('min')]))}"
        ticks.append(text)
    ax.set_yticks(range(len(rows)), ticks)
    ax.invert_yaxis()
    if log:  # ticks at powers of 4: 1 B, 4 B, ..., 1 KiB, 4 KiB, ...
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=4, numticks=12))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _human_bytes(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(min(positive) / 2, max(positive) * 8)
        ax.set_xlabel("message body size (log scale; KiB = 1024 B)")
    else:
        ax.set_xlim(0, max(positive or [1.0]) * 1.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlabel("message body size (bytes)")
    ax.set_ylabel("topic")
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(loc="outside right upper", title="statistic")
    fig.suptitle(f"{title}\n(exact percentiles, linear interpolation between ranks)")
    return fig


def _top_keys_figure(table: Table) -> Figure:
    from matplotlib.ticker import MaxNLocator

    h = table.headers
    ti, ki, ni = h.index("topic"), h.index("key"), h.index("messages")
    groups: dict[str, list[tuple[str, float]]] = {}
    for r in table.rows:  # rows come in rank order within a topic
        groups.setdefault(str(r[ti]), []).append((_short(r[ki]), _number(r[ni])))
    title = f"{table.title}: messages carrying each key (a message may carry several)"
    if not groups:
        return _no_data(_new_figure(10, 4), title)
    ncols = 1 if len(groups) == 1 else 2
    nrows = math.ceil(len(groups) / ncols)
    longest = max(len(items) for items in groups.values())
    fig = _new_figure(7 * ncols, nrows * (1.3 + 0.34 * longest) + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for k, (ax, (topic, items)) in enumerate(zip(axes, groups.items(), strict=False)):
        ys = list(range(len(items)))
        counts = [n for _, n in items]
        bars = ax.barh(ys, counts, color=_COLORS[k % len(_COLORS)])
        ax.bar_label(bars, labels=[f"{n:,.0f}" for n in counts], padding=3, fontsize=9)
        ax.set_yticks(ys, [key for key, _ in items])
        ax.set_ylim(longest - 0.5, -0.5)  # rank 1 on top; panels share the bar height
        ax.set_xlim(0, max(counts or [1.0]) * 1.2 or 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"topic {topic}", fontsize=11)
        ax.set_xlabel("messages")
        ax.grid(True, axis="x", alpha=0.3)
    for ax in axes[len(groups) :]:
        ax.set_axis_off()
    fig.suptitle(title)
    return fig


def _lag_figure(table: Table) -> Figure:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    h = table.headers
    rows = table.rows
    group = table.notes.get("group")
    now = table.notes.get("now")
    who = f"consumer group {group!r}" if group is not None else table.title
    when = (
        f"now = {now} (UTC; this host's clock when the lag was read)"
        if now
        else "now: not recorded with this table"
    )
    title = (
        f"{who}: age of the oldest unconsumed message per queue\n"
        f"{when}\nage = now minus the store time of the message at the group's offset"
    )
    fig = _new_figure(12, max(3.5, 2.0 + 0.38 * len(rows)))
    if not rows:
        return _no_data(fig, title)
    ax_age, ax_lag = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
    ti, qi, li = h.index("topic"), h.index("queue"), h.index("lag")
    ai = h.index("oldest_unconsumed_s") if "oldest_unconsumed_s" in h else None
    ys = list(range(len(rows)))
    lags = [_number(r[li]) for r in rows]
    ages = [_number(r[ai]) if ai is not None else 0.0 for r in rows]
    age_labels = [
        "caught up" if not lg else (_age(r[ai]) if ai is not None else "age unknown")
        for r, lg in zip(rows, lags, strict=True)
    ]
    bars = ax_age.barh(ys, ages, color="#d62728")
    ax_age.bar_label(bars, labels=age_labels, padding=3, fontsize=9)
    ax_age.set_xlim(0, max(ages) * 1.35 or 1)
    ax_age.set_xlabel("age of the oldest unconsumed message (s)")
    bars = ax_lag.barh(ys, lags, color="#1f77b4")
    ax_lag.bar_label(bars, labels=[f"{n:,.0f}" for n in lags], padding=3, fontsize=9)
    ax_lag.set_xlim(0, max(lags) * 1.3 or 1)
    ax_lag.set_xlabel("lag (committed messages not consumed)")
    ax_lag.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_age, ax_lag):
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax_age.set_yticks(ys, [f"{r[ti]}/{r[qi]}" for r in rows])
    ax_age.set_ylim(len(rows) - 0.5, -0.5)
    ax_age.set_ylabel("topic/queue")
    for ax in (ax_age, ax_lag):
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title)
    return fig


def _plain_figure(table: Table) -> Figure:
    """Any other table: a bar per row of its last numeric column."""
    fig = _new_figure(10, max(3.5, 1.5 + 0.3 * len(table.rows)))
    if not table.rows:
        return _no_data(fig, table.title)
    k = max(
        (i for i, v in enumerate(table.rows[0]) if isinstance(v, int | float)),
        default=len(table.headers) - 1,
    )
    ax: Axes = fig.subplots()
    labels = [" / ".join(str(v) for v in r[:k]) or str(i) for i, r in enumerate(table.rows)]
    values = [_number(r[k]) for r in table.rows]
    bars = ax.barh(range(len(values)), values)
    ax.bar_label(bars, labels=[f"{v:,.6g}" for v in values], padding=3)
    ax.set_yticks(range(len(values)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(table.headers[k])
    fig.suptitle(table.title)
    return fig


def _number(value: Any) -> float:
    """A table cell as a number to draw: None and NaN as 0."""
    if value is None:
        return 0.0
    number = float(value)
    return 0.0 if math.isnan(number) else number


def _short(key: Any, width: int = 32) -> str:
    text = str(key) if key is not None else "(none)"
    if not text:
        return "(empty)"
    return text if len(text) <= width else text[: width - 1] + "…"


_BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _byte_unit(peak: float) -> tuple[str, int]:
    """The unit to show values up to `peak` bytes in (B below 1 KiB)."""
    for unit, scale in _BYTE_UNITS:
        if peak >= scale:
            return unit, scale
    return "B", 1


def _human_bytes(n: float) -> str:
    """Bytes as text, to 0.1 of the unit: 150 B, 150.5 B, 1.9 KiB, 64.0 MiB."""
    unit, scale = _byte_unit(abs(n))
    text = f"{n / scale:.1f}"
    return f"{text.removesuffix('.0') if scale == 1 else text} {unit}"


def _duration(seconds: float) -> str:
    for name, size in (("week", 604800), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count}-{name}"
    return f"{seconds:g}-second"


def _age(value: Any) -> str:
    if value is None:
        return "age unknown"
    seconds = float(value)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds:,.0f} s ({seconds / 60:.1f} min)"
    if seconds < 172800:
        return f"{seconds:,.0f} s ({seconds / 3600:.1f} h)"
    return f"{seconds:,.0f} s ({seconds / 86400:.1f} d)"
