"""What the disk-fault tests (tests/test_disk_faults*.py) share: the segment sizes of
their stores and a one-node RaftNode on a data directory, started, led and fed puts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dledger_commitlog.log.commitlog import Draft
from dledger_commitlog.node.config import NodeConfig, Peer
from dledger_commitlog.node.node import RaftNode
from raft import Role

ISEG = 32 * 64
# A node's segments must hold its largest message (NodeConfig checks): 34 KiB
# holds a 1 KiB body with the most properties a message may carry.
NODE_SEG = 34 * 1024
NODE_MAX_MESSAGE = 1024


def single_config(
    root: Path, flush_mode: str = "async", settings: dict[str, Any] | None = None
) -> NodeConfig:
    """A lone voter on `root` with small segments; `settings` override any field."""
    return NodeConfig(
        **{
            "node_id": 1,
            "data_dir": str(root),
            "peers": (Peer(1, "127.0.0.1:1", "127.0.0.1:2"),),
            "flush_mode": flush_mode,
            "tick_ms": 5,
            "data_segment_bytes": NODE_SEG,
            "index_segment_bytes": ISEG,
            "max_message_bytes": NODE_MAX_MESSAGE,
            "cq_units_per_file": 64,
            "index_slots": 64,
            "index_entries": 256,
            **(settings or {}),
        }
    )


def single_node(
    root: Path, flush_mode: str = "async", settings: dict[str, Any] | None = None
) -> RaftNode:
    """A lone voter on `root`, opened but not started (`single_config`)."""
    return RaftNode(single_config(root, flush_mode, settings))


async def lead(node: RaftNode) -> None:
    """Wait (10 s at most) until a lone voter has elected itself, a few ticks."""
    async with asyncio.timeout(10):
        for _ in range(1000):
            if node.core.role is Role.LEADER:
                return
            await asyncio.sleep(0.01)


async def put_some(node: RaftNode, n: int, tag: str) -> None:
    """Start `node`, put `n` messages keyed `<tag><i>` (about 1 KiB each), wait until
    they are dispatched, close it."""
    await node.start()
    try:
        await lead(node)
        async with asyncio.timeout(10):
            for i in range(n):
                body = b"%s-%d-" % (tag.encode(), i) * 100  # about 1 KiB an entry
                spec = node.commitlog.prepare(Draft("rb", body, f"{tag}{i}"))
                await node.commitlog.put([spec], 5.0)
            await node.wait_dispatched(node.commitlog.committed_pos, 5.0)
    finally:
        await node.close()
