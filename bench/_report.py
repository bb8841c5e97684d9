"""Shared output for bench scripts: a readable table and bench/results/NAME.json."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    cpus = os.cpu_count()
    return f"{platform.node()} {platform.machine()} {cpus} cpus, Python {platform.python_version()}"


def report(
    name: str,
    rows: list[tuple[str, str, str]],
    metrics: dict[str, float],
    *,
    out: Path | None = None,
) -> Path:
    """Print `rows` (label, value, note) as a table; write metrics + machine + when as
    JSON to `out` (default bench/results/NAME.json)."""
    width = max((len(r[0]) for r in rows), default=10)
    vwidth = max((len(r[1]) for r in rows), default=10)
    print(f"\n{name}")
    print("-" * (width + vwidth + 40))
    for label, value, note in rows:
        print(f"{label:<{width}}  {value:>{vwidth}}  {note}")
    out = RESULTS / f"{name}.json" if out is None else out
    out.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, float | str] = {k: round(v, 3) for k, v in metrics.items()}
    payload["machine"] = machine()
    payload["when"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    out.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return out
