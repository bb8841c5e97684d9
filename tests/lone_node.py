"""One in-process node that is its own quorum: its RaftNode and leader-side services,
started, leading, and closed again (for tests of the leader's services without a
cluster: tests/test_schedule_tx.py, tests/test_group_fetch.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from dledger_commitlog.messaging.services import LeaderServices
from dledger_commitlog.node.config import NodeConfig, Peer
from dledger_commitlog.node.metrics import NodeMetrics
from dledger_commitlog.node.node import RaftNode

# A lone voter on fast ticks, small files; a test adds what it needs (`lone_config`).
SMALL = dict(
    flush_mode="sync",
    tick_ms=10,
    election_ticks=3,
    heartbeat_ticks=1,
    data_segment_bytes=8 << 20,
    index_segment_bytes=32 * 4096,
    cq_units_per_file=64,
    index_slots=64,
    index_entries=256,
)


def lone_config(root: Path, **settings: object) -> NodeConfig:
    """Node 1 alone, in `root`/n1, on SMALL with `settings` on top."""
    peers = (Peer(1, "127.0.0.1:1", "127.0.0.1:2"),)
    return NodeConfig(node_id=1, data_dir=str(root / "n1"), peers=peers, **{**SMALL, **settings})  # type: ignore[arg-type]


@asynccontextmanager
async def lone_leader(
    cfg: NodeConfig,
) -> AsyncIterator[tuple[RaftNode, LeaderServices, NodeMetrics]]:
    """The node of `cfg` and its leader services, once it leads (within 10 s)."""
    metrics = NodeMetrics(cfg.node_id)
    node = RaftNode(cfg, metrics)
    services = LeaderServices(node, cfg, metrics)
    await node.start()
    services.start()
    try:
        async with asyncio.timeout(10):
            for _ in range(1000):  # a lone voter elects itself within a few ticks
                if node.is_leader():
                    break
                await asyncio.sleep(0.01)
        yield node, services, metrics
    finally:
        await services.close()
        await node.close()
