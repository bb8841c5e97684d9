"""The Cluster page's figures that the console computes itself, without a cluster.

`node_metrics`: a node's Prometheus text (every shard's put-latency histogram added
up, the fullest shard's disk ratio), histogram quantiles interpolated as Prometheus's
`histogram_quantile` does, and a window's figures from two scrapes (a node that
restarted counts from zero). `lag_clock`: a replica's lag in seconds is the age of
the first entry it lacks, as the console saw the leader's log grow; a leader with a
shorter log starts the clock over. (Against a real cluster: tests/test_http_api.py.)
"""

from __future__ import annotations

import math

import pytest

from dledger_commitlog.console.lag_clock import LagClock
from dledger_commitlog.console.node_metrics import Scrape, difference, figures, parse, quantile

TEXT = """\
# HELP dledger_put_latency_seconds Put latency
# TYPE dledger_put_latency_seconds histogram
dledger_put_latency_seconds_bucket{le="0.001",shard="1"} 10.0
dledger_put_latency_seconds_bucket{le="0.01",shard="1"} 90.0
dledger_put_latency_seconds_bucket{le="+Inf",shard="1"} 100.0
dledger_put_latency_seconds_count{shard="1"} 100.0
dledger_put_latency_seconds_sum{shard="1"} 0.5
dledger_put_latency_seconds_bucket{le="0.001",shard="2"} 0.0
dledger_put_latency_seconds_bucket{le="0.01",shard="2"} 0.0
dledger_put_latency_seconds_bucket{le="+Inf",shard="2"} 0.0
# HELP dledger_disk_usage_ratio Disk used
# TYPE dledger_disk_usage_ratio gauge
dledger_disk_usage_ratio{shard="1"} 0.25
dledger_disk_usage_ratio{shard="2"} 0.5
"""


def test_a_nodes_text_is_its_shards_buckets_added_up_and_its_fullest_disk() -> None:
    buckets, disk = parse(TEXT)
    assert buckets == {0.001: 10.0, 0.01: 90.0, math.inf: 100.0}
    assert disk == 0.5
    assert parse("") == ({}, None)


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.05, 0.0005), (0.1, 0.001), (0.5, 0.001 + 0.009 * 40 / 80), (0.9, 0.01), (0.99, 0.01)],
)
def test_quantiles_interpolate_within_their_bucket(q: float, expected: float) -> None:
    assert quantile(q, {0.001: 10.0, 0.01: 90.0, math.inf: 100.0}) == pytest.approx(expected)


def test_no_count_is_no_quantile() -> None:
    assert quantile(0.5, {}) is None
    assert quantile(0.5, {0.01: 0.0, math.inf: 0.0}) is None


def test_a_window_is_the_difference_of_two_scrapes() -> None:
    old = Scrape(10.0, {0.001: 10.0, 0.01: 90.0, math.inf: 100.0}, 0.2)
    new = Scrape(40.0, {0.001: 10.0, 0.01: 190.0, math.inf: 200.0}, 0.3)
    got = figures([old, new])
    assert got["puts"] == 100 and got["window_s"] == 30.0 and got["disk_usage_ratio"] == 0.3
    assert got["put_p50_ms"] == pytest.approx(5.5) and got["put_p99_ms"] == pytest.approx(9.91)
    assert figures([new])["put_p50_ms"] is None  # one scrape: no window yet
    restarted = {0.001: 1.0, 0.01: 2.0, math.inf: 2.0}
    assert difference(restarted, old.buckets) == restarted


def test_a_replicas_lag_in_seconds_is_the_age_of_the_first_entry_it_lacks() -> None:
    clock = LagClock(window_s=100.0)
    assert clock.seconds_behind(1, 5) is None  # nothing seen of the shard
    for at, last in ((0.0, 10), (1.0, 10), (2.0, 12), (5.0, 20)):
        clock.record(1, last, now=at)
    assert clock.seconds_behind(1, 20, now=6.0) == 0.0
    assert clock.seconds_behind(1, 12, now=6.0) == 1.0  # 13 was first seen at 5.0
    assert clock.seconds_behind(1, 10, now=6.0) == 4.0
    assert clock.seconds_behind(1, 3, now=6.0) == 6.0  # older than what was seen: a floor
    clock.record(1, 15, now=7.0)  # a new leader with a shorter log
    assert clock.seconds_behind(1, 12, now=8.0) == 1.0


def test_the_clock_keeps_only_its_window() -> None:
    clock = LagClock(window_s=10.0)
    for at in range(100):
        clock.record(1, at, now=float(at))
    assert clock.seconds_behind(1, 0, now=99.0) == 11.0  # the oldest sample kept: at 88
