"""The consumer groups' figures over time, as this console sampled them.

Owns `GroupHistory` (per group a bounded series of samples: the lag, the age of the
oldest unconsumed message, retries and dead letters, summed or maxed over the data
shards) and `GET /api/v1/groups/{group}/history`, which serves one group's series.
Samples are taken from what `GET /api/v1/groups` reads (the Groups page polls it
every 2 s while it is shown), at most one per `min_interval_ms` per group: the
console holds no right of its own (with an ACL it reads as its callers), so it has
no poller of its own; a history has gaps while nobody looks at the groups.

Invariants: memory only, lost when the console stops; at most `keep_ms` of samples
per group (`max_samples`), at most `max_groups` groups (the least recently sampled
dropped first); a caller is served the history of a group only if it may read that
group now (the cluster checks its rights at a `GroupDescribe` of shard 1: 403 else).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dledger_commitlog.console.api import PREFIX, call
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import ApiError, Request, Response, Router, json_response
from dledger_commitlog.console.params import Params, group_name

MIN_INTERVAL_MS = 1_000
KEEP_MS = 30 * 60_000
MAX_SAMPLES = 1_800
MAX_GROUPS = 1_024


class GroupHistory:
    """Samples of each group's figures (see the module docstring)."""

    def __init__(
        self,
        min_interval_ms: int = MIN_INTERVAL_MS,
        keep_ms: int = KEEP_MS,
        max_samples: int = MAX_SAMPLES,
        max_groups: int = MAX_GROUPS,
    ) -> None:
        self.min_interval_ms = min_interval_ms
        self.keep_ms = keep_ms
        self.max_samples = max_samples
        self.max_groups = max_groups
        self._series: dict[str, collections.deque[dict[str, int]]] = {}

    def record(self, rows: Sequence[Mapping[str, Any]], now_ms: int | None = None) -> None:
        """Sample the rows of `GET /groups` (one per group and data shard)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        totals: dict[str, dict[str, int]] = {}
        for row in rows:
            t = totals.setdefault(
                row["group"],
                {"lag": 0, "oldest_unconsumed_age_ms": 0, "retries": 0, "dead_letters": 0},
            )
            for key in ("lag", "retries", "dead_letters"):
                t[key] += int(row[key])
            age = int(row["oldest_unconsumed_age_ms"])
            t["oldest_unconsumed_age_ms"] = max(t["oldest_unconsumed_age_ms"], age)
        for group, figures in totals.items():
            series = self._series.pop(group, None)  # re-inserted last: the latest sampled
            if series is None:
                if len(self._series) >= self.max_groups:
                    del self._series[next(iter(self._series))]
                series = collections.deque(maxlen=self.max_samples)
            if not series or now - series[-1]["time_ms"] >= self.min_interval_ms:
                series.append({"time_ms": now, **figures})
            while series and series[0]["time_ms"] < now - self.keep_ms:
                series.popleft()
            self._series[group] = series

    def samples(self, group: str) -> list[dict[str, int]]:
        return list(self._series.get(group, ()))


class GroupHistoryApi:
    def __init__(self, callers: Callers, history: GroupHistory) -> None:
        self.callers = callers
        self.history = history

    def register(self, router: Router) -> None:
        router.add("GET", PREFIX + "/groups/{group}/history", self.series)

    async def series(self, request: Request) -> Response:
        group = group_name(request.params["group"])
        Params(request, ())
        samples = self.history.samples(group)
        if not samples:
            raise ApiError(404, "not_found", f"no samples of group {group!r} yet")
        client = (await self.callers.caller(request)).client
        try:  # the caller may read the group (its rights are checked before anything else)
            await call(client.client(1).group_describe(group))
        except ApiError as exc:
            if exc.status != 404:  # not on shard 1: still, the rights were checked
                raise
        doc = {
            "group": group,
            "min_interval_ms": self.history.min_interval_ms,
            "keep_ms": self.history.keep_ms,
            "samples": samples,
        }
        return json_response(200, doc)
