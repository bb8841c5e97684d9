"""Disk faults in real three-node clusters (slow): a flipped byte, a power loss.

A flipped byte in a follower's and in a leader's tail is cut at recovery, never
served, and repaired from the peers; a power loss of all three nodes in async mode
loses at most the puts acknowledged in the last flush interval (plus a stated
slack); kill -9 of all three in sync mode loses nothing. Random choices are seeded:
the seed is printed (set DLEDGER_TEST_SEED to replay it); kill timing is not under
the seed's control. The same faults on a store alone: tests/test_disk_faults_store.py.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chaos.disk import FlipReport, flip_byte, power_loss
from dledger_commitlog.cli.launcher import LocalCluster, converged
from dledger_commitlog.log.verify import verify_store
from dledger_commitlog.node.recovery import FLUSH_TRACE_ENV, ROLLBACK_FILE
from store.entry_format import HEADER_SIZE
from store.message import StoredMessage
from tests.conftest import CONVERGE_S, get_at, node_stubs, wait_converged, wait_until
from tests.workload import Acked, Writers, check_acked, leader_and_follower, read_all

FLUSH_INTERVAL_MS = 200
# How late after the flush interval an acknowledged put may still be unflushed: the
# fsync itself (slow on a busy shared disk) and the trace write after it.
POWER_LOSS_SLACK_S = 1.0


def _seed() -> int:
    seed = int(os.environ.get("DLEDGER_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (DLEDGER_TEST_SEED={seed} replays it)")
    return seed


class _TimedAcks(list[Acked]):
    """Writers.acked that also records when each put was acknowledged (wall clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Acked) -> None:
        self.times.append(time.time())  # under the Writers' lock, like the append
        super().append(item)


def _timed_writers(cluster: LocalCluster, topic: str, threads: int) -> tuple[Writers, _TimedAcks]:
    writers = Writers(cluster, topic, threads=threads)
    acks = _TimedAcks()
    writers.acked = acks
    return writers.start(), acks


def _more_acks(writers: Writers, n: int, timeout_s: float = 20.0) -> None:
    target = writers.count() + n
    wait_until(writers.count, timeout_s, f"{n} more acknowledged puts", ok=lambda c: c >= target)


def _kill_all_at_once(cluster: LocalCluster) -> float:
    """SIGKILL every node's process group in one go; returns the wall time of the kill."""
    pids = {s.id: cluster.pid(s.id) for s in cluster}
    killed_at = time.time()
    for pid in pids.values():
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
    for i in pids:
        cluster.kill(i)  # waits until it is gone
    return killed_at


def _flip_repaired(
    cluster: LocalCluster, victim: int, seed: int, acked: list[Acked], flip: FlipReport
) -> None:
    """The victim holds the same committed messages as every other node, byte for
    byte; the entry that was hit is there with the leader's bytes; verify passes."""
    where = f"seed {seed}, node {victim}, {flip}"
    wait_converged(cluster, CONVERGE_S)
    log = Path(cluster.specs[victim].log_path).read_text(errors="replace")
    assert "cutting the log there" in log, f"{where}: recovery did not report the cut"
    with node_stubs(cluster) as stubs:
        views: dict[int, dict[int, StoredMessage]] = {s.id: read_all(stubs[s.id]) for s in cluster}
    mine = views[victim]
    for i, theirs in views.items():
        assert mine == theirs, f"{where}: node {i} serves other committed messages"
    hit = flip.entry_pos + HEADER_SIZE
    assert hit in mine, f"{where}: the entry that was hit is gone"
    check_acked(acked, mine, where)
    cluster.stop(victim)
    report = verify_store(Path(cluster.specs[victim].data_dir))
    assert report.ok, f"{where}: {report.problems}"


def _served_before_repair(cluster: LocalCluster, victim: int, flip: FlipReport) -> object:
    """What the restarted victim serves at the hit offset right away (None: nothing yet)."""
    with node_stubs(cluster) as stubs:
        try:
            return get_at(stubs[victim], flip.entry_pos + HEADER_SIZE)
        except Exception:  # not replicated back yet, or the node is still starting
            return None


def _check_flip(cluster: LocalCluster, victim: int, seed: int, topic: str) -> None:
    rng = random.Random(seed)
    writers, _ = _timed_writers(cluster, topic, threads=4)
    try:
        _more_acks(writers, 150)
        cluster.kill(victim)
        flip = flip_byte(cluster.specs[victim].data_dir, rng)
        print(f"flipped {flip}")
        cluster.start(victim)
        early = _served_before_repair(cluster, victim, flip)
        _more_acks(writers, 100)
    finally:
        acked = writers.join(stop=True)
    with cluster.client() as client:  # the cluster accepts puts
        client.put(topic, b"after the flip")
    if early is not None:  # served right after the restart: then the leader's bytes
        with node_stubs(cluster) as stubs:
            leader = cluster.wait_for_leader(timeout_s=10.0)
            want = get_at(stubs[leader], flip.entry_pos + HEADER_SIZE)
        assert early == want, f"seed {seed}: node {victim} served damaged bytes"
    _flip_repaired(cluster, victim, seed, acked, flip)


@pytest.mark.slow
def test_a_flipped_byte_in_a_follower_tail_is_repaired_from_the_leader(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    seed = _seed()
    cluster = make_cluster("flipf")
    _, follower = leader_and_follower(cluster)
    _check_flip(cluster, follower, seed, "ff")


@pytest.mark.slow
def test_a_flipped_byte_in_the_leader_tail_is_repaired_after_failover(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    seed = _seed()
    cluster = make_cluster("flipl")
    leader, _ = leader_and_follower(cluster)
    _check_flip(cluster, leader, seed, "fl")


def _messages_everywhere(cluster: LocalCluster) -> dict[int, dict[int, StoredMessage]]:
    with node_stubs(cluster) as stubs:
        return {s.id: read_all(stubs[s.id]) for s in cluster}


def _crash_all_under_load(
    cluster: LocalCluster, topic: str, between: Callable[[], Any] | None = None
) -> tuple[list[Acked], list[float], float]:
    writers, acks = _timed_writers(cluster, topic, threads=4)
    started = time.time()
    try:
        _more_acks(writers, 300)
        wait_until(time.time, 10, "2.5 s of load", ok=lambda t: t - started >= 2.5)
        writers._stop.set()  # no new puts; those in flight fail or land after the restart
        killed_at = _kill_all_at_once(cluster)
        if between is not None:
            between()
        for spec in cluster:
            cluster.start(spec.id)
        cluster.wait_for_leader(timeout_s=20.0)
    finally:
        acked = writers.join(stop=True)
    return acked, list(acks.times), killed_at


def _restart_rolled_back_until_converged(cluster: LocalCluster, timeout_s: float) -> list[int]:
    """The chaos harness as an operator's supervisor: a node that stopped because
    the cluster lost entries it held as committed (LogDiverged, async flush) left a
    rollback marker; start it again (it rolls back and rejoins). Returns the nodes
    restarted so, once all nodes hold the same committed log."""
    restarted: list[int] = []
    deadline = time.monotonic() + timeout_s
    statuses: object = None
    while time.monotonic() < deadline:
        for spec in cluster:
            if cluster.is_running(spec.id):
                continue
            marker = Path(spec.data_dir) / ROLLBACK_FILE
            assert marker.exists(), (
                f"node {spec.id} stopped without a rollback marker:\n{cluster.log_tail(spec.id)}"
            )
            log = Path(spec.log_path).read_text(errors="replace")
            assert "LOST COMMITTED ENTRIES" in log, f"node {spec.id}: no loud error logged"
            print(f"node {spec.id} stopped on lost committed entries: {marker.read_text()}")
            cluster.start(spec.id)
            restarted.append(spec.id)
        statuses = cluster.statuses(timeout_s=1.0)
        if converged(statuses) and all(cluster.is_running(s.id) for s in cluster):
            for spec in cluster:
                assert not (Path(spec.data_dir) / ROLLBACK_FILE).exists(), spec.id
            return restarted
        time.sleep(0.2)
    raise AssertionError(f"no convergence within {timeout_s}s: {statuses}")


@pytest.mark.slow
def test_async_power_loss_loses_at_most_the_last_flush_interval(
    make_cluster: Callable[..., LocalCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FLUSH_TRACE_ENV, "1")
    cluster = make_cluster("power", flush_mode="async", flush_interval_ms=FLUSH_INTERVAL_MS)
    reports = {}

    def lose_power() -> None:
        for spec in cluster:
            reports[spec.id] = power_loss(spec.data_dir)

    acked, times, killed_at = _crash_all_under_load(cluster, "pw", lose_power)
    print(f"power loss: {reports}")
    assert all(r.trace_pos > 0 for r in reports.values()), "nothing was ever traced"
    with cluster.client() as client:
        client.put("pw", b"after the power loss")
    rolled_back = _restart_rolled_back_until_converged(cluster, 2 * CONVERGE_S)
    print(f"restarted after a rollback marker: {rolled_back or 'none'}")
    cutoff = killed_at - FLUSH_INTERVAL_MS / 1000 - POWER_LOSS_SLACK_S
    safe = [a for a, t in zip(acked, times, strict=True) if t < cutoff]
    window = [a for a, t in zip(acked, times, strict=True) if t >= cutoff]
    assert len(safe) > 100, f"only {len(safe)} puts were acknowledged before {cutoff}"
    views = _messages_everywhere(cluster)
    for i, messages in views.items():
        check_acked(safe, messages, f"node {i} (acknowledged before the loss window)")
    first = next(iter(views.values()))
    for i, messages in views.items():
        assert messages == first, f"node {i} serves other committed messages than the others"
    lost = [
        a for a in window if getattr(first.get(a.result.commitlog_offset), "body", None) != a.body
    ]
    print(
        f"{len(safe)} puts acknowledged before the window kept; {len(lost)} of "
        f"{len(window)} acknowledged within the last "
        f"{FLUSH_INTERVAL_MS / 1000 + POWER_LOSS_SLACK_S:.1f} s lost (allowed)"
    )


@pytest.mark.slow
def test_sync_mode_loses_nothing_when_every_node_is_killed_at_once(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("killall")
    acked, _, _ = _crash_all_under_load(cluster, "ka")
    with cluster.client() as client:
        client.put("ka", b"after the crash")
    wait_converged(cluster, CONVERGE_S)
    for i, messages in _messages_everywhere(cluster).items():
        check_acked(acked, messages, f"node {i}")
