"""What a process has cost so far, read from /proc (Linux): for the bench scripts."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_usage(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) process `pid` used so far, and the context
    switches (voluntary and not) of all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches" in line:
                    switches += int(line.split()[1])
    return cpu, switches


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"
