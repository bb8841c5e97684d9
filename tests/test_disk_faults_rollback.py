"""The rollback marker: what a node does after the cluster lost entries it held as
committed (LogDiverged).

In async flush mode the node writes the marker and stops; the next start cuts the
log, raft.state's commit, the entry checkpoint and the consume queues back to the
marker's index. In sync flush mode a diverged leader is fatal without a marker.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from dledger_commitlog.log.entry_records import read_record
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.verify import verify_store
from dledger_commitlog.node.recovery import ROLLBACK_FILE, read_rollback_marker
from raft import LogDiverged
from raft.types import EntryKind
from raftio.hard_state import RaftStateFile
from tests.disk_fault_helpers import ISEG, NODE_SEG, put_some, single_node


def test_a_rollback_marker_cuts_the_log_below_its_checkpoint_and_dispatch_with_it(
    tmp_path: Path,
) -> None:
    """What a node does at start after it stopped on LogDiverged (async flush):
    the log, raft.state's commit, the entry checkpoint and the consume queues all
    go back to the marker's index; the marker goes; verify passes; puts go on."""
    asyncio.run(put_some(single_node(tmp_path), 60, "old"))  # two segments
    store = EntryStore(
        tmp_path / "commitlog", data_segment_bytes=NODE_SEG, index_segment_bytes=ISEG
    )
    last = store.last_index()
    keep = last - 25
    end_of_keep = sum(store.locate(keep))
    assert end_of_keep // NODE_SEG < store.locate(last)[0] // NODE_SEG, "crosses a segment"
    kept = sum(1 for e in store.entries(1, keep + 1, 1 << 30) if e.kind is EntryKind.NORMAL)
    store.close()
    assert RaftStateFile(tmp_path / "raft.state").saved.commit == last
    assert read_record(tmp_path / "commitlog" / "entries.checkpoint")[0] == last  # type: ignore[index]
    (tmp_path / ROLLBACK_FILE).write_text(json.dumps({"roll_back_to": keep}))
    node = single_node(tmp_path)
    try:
        assert node.store.last_index() == keep
        assert node.commitlog.committed_index == keep
        assert node.dispatcher.dispatched_pos == end_of_keep
        assert sum(node.dispatcher.max_offsets().values()) == kept < 60
        assert RaftStateFile(tmp_path / "raft.state").saved.commit == keep
        assert read_record(tmp_path / "commitlog" / "entries.checkpoint")[0] == keep  # type: ignore[index]
        assert not (tmp_path / ROLLBACK_FILE).exists()
    finally:
        asyncio.run(node.close())
    report = verify_store(tmp_path)
    assert report.ok, report.problems
    asyncio.run(put_some(single_node(tmp_path), 5, "new"))  # it goes on from there
    report = verify_store(tmp_path)
    assert report.ok, report.problems


def test_the_node_writes_a_marker_and_stops_on_a_diverged_leader_in_async_mode(
    tmp_path: Path,
) -> None:
    node = single_node(tmp_path)
    stopped: list[bool] = []
    node.on_fatal = lambda: stopped.append(True)
    exc = LogDiverged(index=7, agree=6, committed=9, leader=2, term=5)
    node._on_diverged(exc)
    assert stopped and node.fatal is exc
    assert json.loads((tmp_path / ROLLBACK_FILE).read_text())["roll_back_to"] == 6
    node.diverged = None
    node._on_diverged(LogDiverged(index=9, agree=8, committed=9, leader=2, term=6))
    assert read_rollback_marker(tmp_path / ROLLBACK_FILE) == 6, "never moves up"
    asyncio.run(node.close())


def test_a_diverged_leader_in_sync_mode_is_fatal_without_a_marker(tmp_path: Path) -> None:
    node = single_node(tmp_path, flush_mode="sync")
    stopped: list[bool] = []
    node.on_fatal = lambda: stopped.append(True)
    node._on_diverged(LogDiverged(index=7, agree=6, committed=9, leader=2, term=5))
    assert stopped and isinstance(node.fatal, LogDiverged)
    assert not (tmp_path / ROLLBACK_FILE).exists()
    asyncio.run(node.close())
