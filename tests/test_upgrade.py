"""Mixed versions and an upgrade (docs/upgrades.md): two nodes of this commit and one
of an earlier release (tests/compat_commit.txt, installed by tests/compat_venv.py)
form one cluster under load, each side leading the other in turn; then the old node
is upgraded in place (stopped, started with this commit's code on its data
directory). Nothing acknowledged is lost, and the replicas end byte-identical.

The earlier release speaks wire version 1 without saying so (its streams carry no
wire metadata, its Status no version): this commit takes it for version 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger_commitlog.cli.launcher import LocalCluster, answered
from dledger_commitlog.client import NodeStatus
from dledger_commitlog.node.versions import software_version
from tests.compat_venv import CompatUnavailable, compat_commit, compat_python
from tests.conftest import (
    CONVERGE_S,
    SHARED_CONFIG,
    node_stubs,
    register,
    wait_converged,
    wait_until,
)
from tests.workload import Writers, check_acked, read_all

pytestmark = pytest.mark.slow
OLD = 3  # the node that runs the earlier release


@pytest.fixture(scope="module")
def old_python() -> Path:
    try:
        return compat_python()
    except CompatUnavailable as exc:
        pytest.skip(str(exc))


def status_of(cluster: LocalCluster, node: int) -> NodeStatus:
    got = answered(cluster.statuses(timeout_s=2.0))
    assert node in got, f"node {node} answers"
    return got[node]


def test_an_earlier_release_runs_beside_this_one_and_upgrades_in_place(
    request: pytest.FixtureRequest, tmp_path: Path, old_python: Path
) -> None:
    cluster = LocalCluster(tmp_path / "mixed", extra_config=SHARED_CONFIG)
    register(request.node, cluster)
    cluster.interpreters[OLD] = str(old_python)
    with cluster:
        cluster.up()
        old = status_of(cluster, OLD)
        assert (old.version, old.wire_versions) == ("", (1,)), f"{compat_commit()} runs node 3"
        assert status_of(cluster, 1).version == software_version()
        writers = Writers(cluster, "mixed", threads=2).start()
        try:
            for target in (OLD, 1):  # the old release leads the new ones, then the reverse
                with cluster.client() as client:
                    assert client.transfer_leadership(target) == target
                writers.wait_for_more(40, 10.0, f"puts under node {target}")
            cluster.stop(OLD)
            del cluster.interpreters[OLD]
            cluster.start(OLD)
            upgraded = wait_until(
                lambda: answered(cluster.statuses(timeout_s=1.0)).get(OLD),
                20.0,
                "the upgraded node answers",
            )
            assert upgraded is not None and upgraded.version == software_version()
            writers.wait_for_more(40, 10.0, "puts after the upgrade")
        finally:
            acked = writers.join(stop=True)
        assert acked and writers.errors == []
        wait_converged(cluster, CONVERGE_S)
        with node_stubs(cluster) as stubs:
            for i, stub in stubs.items():
                check_acked(acked, read_all(stub), f"node {i}")
