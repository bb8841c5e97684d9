"""The pure-Python protobuf (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python, which some
platforms and some users' other packages force): a real cluster starts under it,
and a client under it puts, gets and consumes.

The nodes and the client both run in processes of their own with the variable set
(this process has the C implementation loaded already)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from tests.conftest import SHARED_CONFIG, register

pytestmark = pytest.mark.slow

PURE = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}

_CLIENT = textwrap.dedent(
    """
    import sys
    from google.protobuf.internal import api_implementation
    from dledger_commitlog.client import Client, Consumer

    assert api_implementation.Type() == "python", api_implementation.Type()
    servers = sys.argv[1].split(",")
    with Client(servers) as client:
        results = [client.put("pure", f"m{i}".encode(), keys=[f"k{i}"]) for i in range(20)]
        got = client.get(results[7].msg_id)
        assert got.body == b"m7" and got.keys == ("k7",), got
    bodies = set()
    consumer = Consumer(servers, "pure-group", ["pure"], lambda m: bodies.add(m.body))
    handled = consumer.run(max_messages=20, idle_exit_s=20.0)
    assert bodies == {f"m{i}".encode() for i in range(20)}, sorted(bodies)
    print("handled", handled)
    """
)


def test_a_cluster_and_client_under_the_pure_python_protobuf(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with LocalCluster(tmp_path / "pure", extra_config=SHARED_CONFIG, env=PURE) as cluster:
        register(request.node, cluster)
        cluster.up()
        cluster.wait_for_leader(timeout_s=20.0)
        servers = ",".join(spec.client for spec in cluster.specs.values())
        done = subprocess.run(
            [sys.executable, "-c", _CLIENT, servers],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **PURE},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "handled 20" in done.stdout, done.stdout
