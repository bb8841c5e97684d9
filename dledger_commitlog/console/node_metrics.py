"""What the nodes' metrics ports say, for the Cluster page: disk use and put latency.

Owns `NodeMetricsScraper`: it reads each node's Prometheus text (the `metrics`
address `cluster.json` gives a node, plain HTTP as `node.metrics.serve_metrics`
serves it), parses it with prometheus_client's text parser, and keeps the recent
scrapes of each node. A node's figures: its disk usage ratio
(`dledger_disk_usage_ratio`, the fullest of the shards it hosts) and the p50 and p99
of `dledger_put_latency_seconds` over the last `window_s` (the puts the node led,
every shard's histogram added up; the difference between the newest scrape and the
oldest one kept, so the first minute of a console covers what it has seen since it
started), interpolated within a bucket as Prometheus's `histogram_quantile` does.

Invariants: a node is scraped at most once per `interval_s` however many views ask
(callers share the scrape in flight); a scrape has a deadline, and a node whose
metrics cannot be read is reported with its error, never an exception; what is kept
is bounded (the scrapes of the last `window_s`, per node).
"""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

PUT_LATENCY = "dledger_put_latency_seconds"
DISK_USAGE = "dledger_disk_usage_ratio"
WINDOW_S = 60.0
_MAX_TEXT_BYTES = 4 << 20

Buckets = dict[float, float]  # upper bound (math.inf last) -> cumulative count


@dataclass(frozen=True, slots=True)
class Scrape:
    """One read of a node's metrics: when (monotonic s), its put-latency buckets (every
    shard's added up) and its disk usage ratio (None: not reported)."""

    at: float
    buckets: Buckets
    disk_usage_ratio: float | None


def parse(text: str) -> tuple[Buckets, float | None]:
    """(put-latency buckets, disk usage ratio) of a node's Prometheus text."""
    buckets: Buckets = {}
    disk: float | None = None
    for family in text_string_to_metric_families(text):
        if family.name == PUT_LATENCY:
            for s in family.samples:
                if s.name == PUT_LATENCY + "_bucket":
                    bound = float(s.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + s.value
        elif family.name == DISK_USAGE:
            for s in family.samples:
                disk = s.value if disk is None else max(disk, s.value)
    return buckets, disk


def quantile(q: float, buckets: Buckets) -> float | None:
    """The `q` quantile (0..1) of cumulative `buckets`, interpolated linearly within the
    bucket it falls in (the lowest bucket from 0); the highest finite bound when it falls
    in the +Inf bucket; None when the buckets count nothing."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def difference(newer: Buckets, older: Buckets) -> Buckets:
    """What was counted between two scrapes (a node that restarted counts from zero:
    then the newer scrape alone)."""
    if any(newer.get(b, 0.0) < c for b, c in older.items()):
        return dict(newer)
    return {b: c - older.get(b, 0.0) for b, c in newer.items()}


def figures(scrapes: Sequence[Scrape]) -> dict[str, Any]:
    """A node's figures from its scrapes, oldest first (see the module doc)."""
    newest = scrapes[-1]
    window = difference(newest.buckets, scrapes[0].buckets) if len(scrapes) > 1 else {}
    p50, p99 = quantile(0.5, window), quantile(0.99, window)
    return {
        "disk_usage_ratio": newest.disk_usage_ratio,
        "puts": int(max(window.values(), default=0.0)),
        "put_p50_ms": None if p50 is None else round(p50 * 1000, 3),
        "put_p99_ms": None if p99 is None else round(p99 * 1000, 3),
        "window_s": round(newest.at - scrapes[0].at, 1),
    }


class NodeMetricsScraper:
    """The nodes' figures (see the module doc); `addresses`: client address -> metrics
    address (HOST:PORT) of each node that serves metrics."""

    def __init__(
        self,
        addresses: Mapping[str, str],
        *,
        interval_s: float = 1.0,
        window_s: float = WINDOW_S,
        timeout_s: float = 1.0,
    ) -> None:
        self.addresses = dict(addresses)
        self.interval_s = interval_s
        self.window_s = window_s
        self.timeout_s = timeout_s
        self._scrapes: dict[str, deque[Scrape]] = {a: deque() for a in self.addresses}
        self._errors: dict[str, str] = {}
        self._last = -math.inf
        self._running: asyncio.Task[None] | None = None

    async def figures(self) -> dict[str, dict[str, Any]]:
        """Per client address: the node's metrics address and figures, or its `error`."""
        if time.monotonic() - self._last >= self.interval_s:
            if self._running is None or self._running.done():
                self._running = asyncio.create_task(self._scrape_all())
            await asyncio.shield(self._running)
        out: dict[str, dict[str, Any]] = {}
        for address, metrics in self.addresses.items():
            kept = self._scrapes[address]
            doc: dict[str, Any] = {"metrics": metrics}
            if address in self._errors:
                doc["error"] = self._errors[address]
            if kept:
                doc.update(figures(kept))
            out[address] = doc
        return out

    async def _scrape_all(self) -> None:
        await asyncio.gather(*(self._scrape(a, m) for a, m in self.addresses.items()))
        self._last = time.monotonic()

    async def _scrape(self, address: str, metrics: str) -> None:
        try:
            text = await asyncio.to_thread(_read, f"http://{metrics}/metrics", self.timeout_s)
            buckets, disk = parse(text)
        except (OSError, ValueError) as exc:
            self._errors[address] = f"metrics at {metrics}: {exc}"
            return
        self._errors.pop(address, None)
        now = time.monotonic()
        kept = self._scrapes[address]
        kept.append(Scrape(now, buckets, disk))
        while len(kept) > 1 and now - kept[0].at > self.window_s:
            kept.popleft()


def _read(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return str(reply.read(_MAX_TEXT_BYTES).decode("utf-8"))
