"""A follower's lag in seconds: how long ago its leader had the entries it lacks.

Owns `LagClock`: per shard, the leader's last index as the console saw it grow (each
time it read the shard's Status: each snapshot of the event stream, each `GET
/cluster`), with when it saw it. A replica at index i lags by the age of the first
entry it lacks: now minus the time the console first saw the leader's log beyond i
(0 when it has the leader's last entry). The entry is older than that by at most the
interval between reads (about a second while a page is open), so the figure is a
floor of the true lag, and an entry older than what is kept (`window_s`) gives the
age of the oldest sample kept. Status gives no entry's time, and lag entries over
the commit rate is no figure while a shard is idle (a stopped follower of an idle
shard is behind by entries, not by a rate), which is why the console keeps its own
clock of the leader's log. `annotate` adds the figure to a shard's members and cells
of the cluster view (`lag_seconds`), from the lag in entries the view already has
(the leader's, from its match index, else the one against the most advanced replica).

Invariants: what is kept is bounded (per shard, the samples of the last `window_s`,
one per index the console saw); a shard's samples grow in time and in index (a new
leader whose log is shorter starts the shard's samples over).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from dledger_commitlog.client import NodeStatus, StatusError

WINDOW_S = 600.0


class LagClock:
    """See the module doc. Times are seconds of `time.monotonic` unless given."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: dict[int, deque[tuple[float, int]]] = {}  # shard -> (time, last index)

    def record(self, shard: int, last_index: int, now: float | None = None) -> None:
        """The shard's leader has `last_index` (read at `now`)."""
        now = time.monotonic() if now is None else now
        seen = self._seen.setdefault(shard, deque())
        if seen and last_index < seen[-1][1]:
            seen.clear()  # a leader with a shorter log: the old samples say nothing now
        if not seen or last_index > seen[-1][1]:
            seen.append((now, last_index))
        while len(seen) > 1 and now - seen[1][0] > self.window_s:
            seen.popleft()

    def seconds_behind(self, shard: int, index: int, now: float | None = None) -> float | None:
        """How long ago the shard's leader first had an entry beyond `index` (0.0: none
        it has; None: nothing seen of the shard yet)."""
        now = time.monotonic() if now is None else now
        seen = self._seen.get(shard)
        if not seen:
            return None
        if index >= seen[-1][1]:
            return 0.0
        i = bisect.bisect_right([last for _, last in seen], index)
        return round(max(0.0, now - seen[i][0]), 1)

    def annotate(
        self,
        shard: int,
        statuses: Mapping[int, NodeStatus | StatusError],
        members: Sequence[dict[str, Any]],
        cells: Mapping[str, dict[str, Any] | None],
    ) -> None:
        """Record the shard's leader's last index, and set `lag_seconds` of each member
        whose lag the leader knows (`members`, the view's member documents: a stopped
        one too) and of each replica that answered (`cells`); None while the shard has
        no leader."""
        leaders = [s for s in statuses.values() if isinstance(s, NodeStatus) and s.role == "leader"]
        leader = max(leaders, key=lambda s: s.term) if leaders else None
        if leader is not None:
            self.record(shard, leader.last_index)

        def behind(lag: int) -> float | None:
            return None if leader is None else self.seconds_behind(shard, leader.last_index - lag)

        known = {str(m["id"]): int(m["lag"]) for m in members if m["lag"] >= 0}
        for m in members:
            m["lag_seconds"] = behind(known[str(m["id"])]) if str(m["id"]) in known else None
        for node, cell in cells.items():
            if cell is not None:
                cell["lag_seconds"] = behind(known.get(node, cell["lag"]))
