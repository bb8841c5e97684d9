"""The client service's boundary: it sees the node through `ports` only.

`service` must not import the node; a `RaftNode` must provide every port (mypy
checks that statically in `server.serve` and in `_as_ports` below; the test
checks it at run time on a real, recovered node).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from dledger_commitlog import ports
from dledger_commitlog.config import NodeConfig, Peer
from dledger_commitlog.node import RaftNode
from dledger_commitlog.service import status_pb

_PORTS = (
    ports.Leadership,
    ports.Writes,
    ports.Transactions,
    ports.LogReads,
    ports.QueueReads,
    ports.Status,
    ports.Admin,
)


def _as_ports(
    node: RaftNode,
) -> tuple[
    ports.Leadership,
    ports.Writes,
    ports.Transactions,
    ports.LogReads,
    ports.QueueReads,
    ports.Status,
    ports.Admin,
]:
    """Never called: mypy checks here that a RaftNode is each port."""
    return node, node, node, node, node, node, node


def test_the_service_imports_no_part_of_the_node() -> None:
    code = (
        "import sys, dledger_commitlog.service, dledger_commitlog.ports\n"
        "assert 'dledger_commitlog.node' not in sys.modules, 'service imports the node'\n"
        "assert 'dledger_commitlog.server' not in sys.modules, 'service imports the server'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_raft_node_is_every_port_and_status_reads_it(tmp_path: Path) -> None:
    cfg = NodeConfig(
        node_id=1, data_dir=str(tmp_path / "n1"), flush_mode="sync", cluster="c1",
        peers=(Peer(1, "127.0.0.1:1", "127.0.0.1:2"),), tick_ms=10, election_ticks=3,
        heartbeat_ticks=1, data_segment_bytes=8 << 20, index_segment_bytes=32 * 4096,
        cq_units_per_file=64, index_slots=64, index_entries=256,
    )  # fmt: skip
    node = RaftNode(cfg)
    try:
        for port in _PORTS:
            assert isinstance(node, port), port.__name__
        status = status_pb(node, cfg)
        assert (status.node_id, status.cluster, status.flush_mode) == (1, "c1", "sync")
        assert (status.role, status.leader_id, status.leader_address) == ("follower", 0, "")
        assert status.committed_pos == node.commitlog.committed_pos
        assert status.dispatched_pos == node.dispatcher.dispatched_pos
        assert status.last_index == node.store.last_index()
    finally:
        asyncio.run(node.close())
