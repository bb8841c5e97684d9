"""Drain and rolling restarts (docs/upgrades.md), on one three-node cluster of real processes.

A drained node hands over what it leads (the term moves by one: a transfer, not an
election), campaigns for nothing, takes no transfer, and says so in `dledger status`;
its metrics and Status name its software and wire versions. A drain that would leave
the shard without a voter that may lead is refused and changes nothing. A rolling
restart under load makes no election (the terms move by its transfers only), fails
no put, stalls none past an election timeout, and loses nothing acknowledged.
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.launcher import LocalCluster, answered
from dledger_commitlog.cli.maintenance import Clients, drain_node, rolling_restart, undrain_node
from dledger_commitlog.client import ChangeRefused, Client, NodeStatus
from dledger_commitlog.node.versions import software_version
from tests.conftest import node_stubs, wait_until
from tests.workload import Writers, check_acked, read_all

# The longest election timeout of the nodes' default settings (10 ticks of 50 ms,
# randomized up to twice that): a put that took longer may have waited for an election.
ELECTION_TIMEOUT_S = 1.0


def clients_of(cluster: LocalCluster) -> Clients:
    def clients(shard: int) -> Client:
        return cluster.client(shard=shard)

    return clients


def statuses(cluster: LocalCluster) -> dict[int, NodeStatus]:
    got = answered(cluster.statuses(timeout_s=2.0))
    assert len(got) == len(cluster.specs), f"every node answers: {sorted(got)}"
    return got


def metric_samples(address: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A node's metrics port: each metric's (labels, value) samples."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def refused_transfer(cluster: LocalCluster, target: int) -> str:
    """The refusal of a transfer to `target` ("" if it was not refused)."""
    with cluster.client(timeout_s=3.0) as client:
        try:
            client.transfer_leadership(target, timeout_ms=1000)
        except ChangeRefused as exc:
            return exc.message
    return ""


def test_a_drained_leader_hands_over_and_leads_nothing_until_undrained(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    leader = cluster.leader_id()
    term = statuses(cluster)[leader].term
    assert (
        cli.main(["node", "drain", "--node", str(leader), "--cluster", str(cluster.cluster_file)])
        == 0
    )
    out = capsys.readouterr().out
    after = statuses(cluster)
    new = next(s.node_id for s in after.values() if s.role == "leader")
    assert f"shard 1: leadership moved to node {new}" in out and new != leader
    assert [s.drained for s in after.values()].count(True) == 1 and after[leader].drained
    assert {s.term for s in after.values()} == {term + 1}, "one transfer, no election"
    assert {(s.version, s.wire_versions) for s in after.values()} == {(software_version(), (1,))}
    assert cli.main(["status", "--cluster", str(cluster.cluster_file)]) == 0
    assert "sync, drained" in capsys.readouterr().out
    why = wait_until(
        lambda: refused_transfer(cluster, leader), 5.0, "a transfer to the drained node refused"
    )
    assert why == f"node {leader} takes no leadership now (drained)"
    samples = metric_samples(cluster.specs[leader].metrics)
    build = {"version": software_version(), "wire": "1", "shard": "1"}
    assert samples["dledger_build_info"] == [(build, 1.0)]
    assert samples["dledger_drained"] == [({"shard": "1"}, 1.0)]

    assert (
        cli.main(["node", "undrain", "--node", str(leader), "--cluster", str(cluster.cluster_file)])
        == 0
    )
    assert not statuses(cluster)[leader].drained
    with cluster.client() as client:  # once its next heartbeat answer says it may lead
        back = wait_until(lambda: client.transfer_leadership(leader), 5.0, "a transfer back")
    assert back == leader


def test_a_drain_that_would_leave_no_leader_is_refused_and_changes_nothing(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    leader = cluster.leader_id()
    followers = [i for i in cluster.specs if i != leader]
    clients = clients_of(cluster)
    try:
        for f in followers:
            assert drain_node(clients, f) == [{"shard": 1, "moved": False, "leader": leader}]
        before = statuses(cluster)
        code = cli.main(
            ["node", "drain", "--node", str(leader), "--cluster", str(cluster.cluster_file)]
        )
        err = capsys.readouterr().err
        assert code == 1
        assert f"node {leader} cannot be drained, nothing changed: shard 1: no other voter" in err
        after = statuses(cluster)
        assert after[leader].role == "leader" and not after[leader].drained
        assert {s.term for s in after.values()} == {before[leader].term}
        with pytest.raises(ChangeRefused, match="no other voter can lead"):
            drain_node(clients, leader)
    finally:
        for f in followers:
            undrain_node(clients, f)
    assert not any(s.drained for s in statuses(cluster).values())


def test_a_rolling_restart_under_load_makes_no_election_and_loses_nothing(
    cluster: LocalCluster,
) -> None:
    terms = {s.term for s in statuses(cluster).values()}
    assert len(terms) == 1
    writers = Writers(cluster, "roll", threads=2).start()
    try:
        writers.wait_for_more(50, 10.0, "puts acknowledged before the roll")
        report = rolling_restart(cluster, wait_s=30.0)
        writers.wait_for_more(50, 10.0, "puts after the roll")
    finally:
        acked = writers.join(stop=True)
    moved = sum(len(r["moved"]) for r in report)
    after = statuses(cluster)
    assert moved == 1, report  # the leader went last: one hand-over
    assert {s.term for s in after.values()} == {terms.pop() + moved}, "no election"
    assert writers.errors == []
    slowest = max(a.seconds for a in acked)
    assert slowest < ELECTION_TIMEOUT_S, f"a put took {slowest:.3f}s"
    with node_stubs(cluster) as stubs:
        for i, stub in stubs.items():
            check_acked(acked, read_all(stub), f"node {i}")
