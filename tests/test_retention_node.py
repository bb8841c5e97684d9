"""Retention on one in-process node (a lone voter): it deletes only what dispatch has
recorded durably, so an offset commit whose record it deleted is in the offsets file
(a crash, or a snapshot of the node, finds it there); a forced clean checkpoints first.
The policy's own rules are tests/test_retention.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dledger_commitlog.log.commitlog import Draft
from dledger_commitlog.messaging.system_log import offset_commit_draft
from dledger_commitlog.node.node import RaftNode
from tests.lone_node import lone_config, lone_leader

SEGMENT = 256 << 10
FILLER = b"f" * (60 << 10)


async def _put(node: RaftNode, drafts: list[Draft]) -> None:
    await node.put([node.prepare(d) for d in drafts], 10.0)
    await node.wait_dispatched(node.committed_pos, 10.0)


def test_retention_keeps_what_dispatch_has_not_recorded_durably(tmp_path: Path) -> None:
    cfg = lone_config(tmp_path, data_segment_bytes=SEGMENT, max_message_bytes=128 << 10)

    async def main() -> None:
        async with lone_leader(cfg) as (node, _services, _metrics):
            await _put(node, [offset_commit_draft("audit", "orders", 0, 3)])
            fillers = [Draft("filler", FILLER, f"f{i}") for i in range(24)]  # ~6 segments
            await _put(node, fillers)
            node.retention.run_pass(forced=True, ignore_age=True)  # no checkpoint first
            assert node.commitlog.min_pos <= node.dispatcher.persisted_pos
            deleted, _, reason = await node.clean_now(force=True)  # checkpoints, then cleans
            assert deleted > 0, reason
            assert node.commitlog.min_pos <= node.dispatcher.persisted_pos
            assert node.committed.group_offset("audit", "orders", 0) == 3
        reopened = RaftNode(cfg)  # the offset commit's record is gone from the log
        try:
            assert reopened.commitlog.min_pos > 0
            assert reopened.committed.group_offset("audit", "orders", 0) == 3
        finally:
            await reopened.close()

    asyncio.run(main())
