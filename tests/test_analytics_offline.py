"""Offline reads of a node's data directory: exactly the committed messages, checked, read-only.

`SyntheticNode` writes a data directory the way a node lays it out (the entry
store under commitlog/, consume queues under consumequeue/) without running a
node, so these tests need no processes; the Spark and cluster tests read real
nodes' directories too.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from analytics.codec import COLUMNS
from analytics.errors import SourceError
from analytics.file_store import OfflineStore
from analytics.sources import QueueInfo
from dledger_commitlog.log.entry_store import EntryStore
from raft.types import Entry
from store.consume_queue import ConsumeQueue
from store.errors import CorruptEntry
from store.message import StoredMessage, encode_message, make_properties, tags_hash_code
from tests.test_analytics_codec import expected_row

HEADER = 48  # entry header before each message: physical offset = entry pos + 48
STORE_HOST = ("127.0.0.1", 7001)


class SyntheticNode:
    """A node's data directory written directly through the store classes."""

    def __init__(
        self,
        root: Path,
        segment_bytes: int = 1 << 16,
        units_per_file: int = 64,
        step_ms: int = 1000,
    ) -> None:
        self.root = root
        self.step_ms = step_ms
        self.segment_bytes = segment_bytes
        self.units_per_file = units_per_file
        self.rows: list[dict[str, Any]] = []
        self._next: dict[tuple[str, int], int] = {}
        self._k = 0

    def append(
        self, count: int, topics: Iterable[str] = ("orders", "pay"), queues: int = 2
    ) -> None:
        store = EntryStore(
            self.root / "commitlog",
            data_segment_bytes=self.segment_bytes,
            index_segment_bytes=32 * 1024,
            preallocate=False,
        )
        entries, placed = [], []
        index = store.last_index()
        topics = list(topics)
        for _ in range(count):
            k = self._k
            self._k += 1
            topic = topics[k % len(topics)]
            queue_id = (k // len(topics)) % queues
            offset = self._next.get((topic, queue_id), 0)
            self._next[(topic, queue_id)] = offset + 1
            msg = StoredMessage(
                topic=topic,
                body=f"{topic} message {k}".encode() * (1 + k % 3),
                properties=make_properties(
                    tags="even" if k % 2 == 0 else None,
                    keys=[f"key{k % 7}", f"id{k}"],
                    uniq_key=f"{k:032X}",
                    extra={"seq": str(k)},
                ),
                queue_id=queue_id,
                queue_offset=offset,
                born_timestamp_ms=1_700_000_000_000 + k,
                store_timestamp_ms=1_700_000_000_000 + self.step_ms * k,
                store_host=STORE_HOST,
            )
            index += 1
            entries.append(Entry(index, 1, encode_message(msg)))
            placed.append(msg)
        positions = store.append_entries(entries)
        store.flush()
        store.close()
        for msg, pos, entry in zip(placed, positions, entries, strict=True):
            phy = pos + HEADER
            cq = ConsumeQueue(
                self.root, msg.topic, msg.queue_id, units_per_file=self.units_per_file
            )
            cq.append(msg.queue_offset, phy, len(entry.data), tags_hash_code(msg.tags))
            cq.flush()
            cq.close()
            self.rows.append(expected_row(msg.with_positions(msg.queue_offset, phy)))

    def rows_of(self, topic: str, queue_id: int) -> list[dict[str, Any]]:
        return [r for r in self.rows if (r["topic"], r["queue_id"]) == (topic, queue_id)]


def plain(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as `expected_row` shapes them (maps as dicts, timestamps as ms), from Arrow or Spark."""
    out = []
    for row in rows:
        r = dict(row)
        if "properties" in r:
            p = r["properties"]
            r["properties"] = dict(p.items() if isinstance(p, dict) else p)
        for name in ("born_timestamp", "store_timestamp"):
            if name in r:
                r[name + "_ms"] = to_ms(r.pop(name))
        out.append(r)
    return out


def to_ms(ts: Any) -> int:
    if ts.tzinfo is None:  # Spark hands back naive datetimes in the session time zone (UTC)
        import datetime as dt

        ts = ts.replace(tzinfo=dt.UTC)
    return round(float(ts.timestamp()) * 1000)


def read_all(store: OfflineStore, columns: Any = COLUMNS) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for q in store.queues():
        for batch in store.read(q.topic, q.queue_id, q.min_offset, q.max_offset, columns):
            out += plain(batch.to_pylist())
    return out


def tree_digest(root: Path) -> dict[str, tuple[str, int, float]]:
    return {
        str(p.relative_to(root)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_size,
            p.stat().st_mtime,
        )
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def node(tmp_path: Path) -> SyntheticNode:
    n = SyntheticNode(tmp_path / "node", segment_bytes=1 << 15)
    n.append(700)  # several data segments; queue files of 64 units: several per queue
    return n


def key(r: dict[str, Any]) -> tuple[str, int, int]:
    return (r["topic"], r["queue_id"], r["queue_offset"])


def test_reads_every_committed_message_of_every_queue(node: SyntheticNode) -> None:
    assert len(list((node.root / "commitlog" / "data").iterdir())) > 3
    store = OfflineStore(node.root)
    assert store.queues() == [
        QueueInfo("orders", 0, 0, 175),
        QueueInfo("orders", 1, 0, 175),
        QueueInfo("pay", 0, 0, 175),
        QueueInfo("pay", 1, 0, 175),
    ]
    assert store.queues("pay") == store.queues()[2:]
    assert sorted(read_all(store), key=key) == sorted(node.rows, key=key)


def test_reads_any_offset_range_of_a_queue(node: SyntheticNode) -> None:
    store = OfflineStore(node.root)
    batches = list(store.read("pay", 1, 60, 130, ["queue_offset", "body"]))
    got = [r for b in batches for r in b.to_pylist()]
    want = [{"queue_offset": r["queue_offset"], "body": r["body"]} for r in node.rows_of("pay", 1)][
        60:130
    ]
    assert got == want
    assert list(store.read("pay", 1, 5, 5)) == []


def test_reading_never_changes_the_directory(node: SyntheticNode) -> None:
    before = tree_digest(node.root)
    store = OfflineStore(node.root)
    assert len(read_all(store)) == 700
    store.close()
    assert tree_digest(node.root) == before


def test_the_queue_ends_at_its_first_empty_unit(node: SyntheticNode) -> None:
    """Preallocated zeros after the last unit are not data, whatever lies beyond them."""
    qdir = node.root / "consumequeue" / "orders" / "0"
    last = sorted(qdir.iterdir())[-1]
    units = np.fromfile(last, dtype=np.uint8)
    assert len(units) == 64 * 20  # a preallocated file, partly used
    store = OfflineStore(node.root)
    assert store.queues("orders")[0].max_offset == 175
    with pytest.raises(SourceError, match="queue offset 175 is beyond the end"):
        list(store.read("orders", 0, 170, 180))


def test_a_unit_pointing_at_the_wrong_bytes_is_refused(node: SyntheticNode) -> None:
    qdir = node.root / "consumequeue" / "pay" / "0"
    first = sorted(qdir.iterdir())[0]
    data = bytearray(first.read_bytes())
    good = bytes(data[40:60])
    data[40:48] = (int.from_bytes(good[:8], "big") + 8).to_bytes(8, "big")  # unit 2: offset + 8
    first.write_bytes(bytes(data))
    store = OfflineStore(node.root)
    assert list(store.read("pay", 0, 0, 2))  # units before it are fine
    with pytest.raises(CorruptEntry):
        list(store.read("pay", 0, 0, 10))
    data[40:60] = good
    data[48:52] = (int.from_bytes(good[8:12], "big") - 1).to_bytes(4, "big")  # size - 1
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptEntry, match="totalSize differs"):
        list(OfflineStore(node.root).read("pay", 0, 0, 10))


def test_zeroed_commit_log_bytes_are_refused_not_returned(node: SyntheticNode) -> None:
    """A unit whose message bytes were lost (say, a torn tail) never yields a row."""
    row = node.rows_of("orders", 1)[100]
    data = node.root / "commitlog" / "data"
    segments = sorted((int(p.name), p) for p in data.iterdir())
    start, path = next((s, p) for s, p in reversed(segments) if s <= row["commitlog_offset"])
    with path.open("r+b") as f:
        f.seek(row["commitlog_offset"] - start)
        f.write(bytes(100))
    store = OfflineStore(node.root)
    assert len(list(store.read("orders", 1, 0, 100))) >= 1
    with pytest.raises(CorruptEntry, match="message 0"):
        list(store.read("orders", 1, 100, 101))


def test_messages_deleted_by_retention_are_out_of_range(node: SyntheticNode) -> None:
    data = node.root / "commitlog" / "data"
    first = sorted(data.iterdir())[0]
    floor = int(sorted(data.iterdir())[1].name)
    first.unlink()
    store = OfflineStore(node.root)
    queues = {(q.topic, q.queue_id): q for q in store.queues()}
    for (topic, queue_id), q in queues.items():
        kept = [r for r in node.rows_of(topic, queue_id) if r["commitlog_offset"] >= floor]
        assert q.min_offset == kept[0]["queue_offset"]
        got = plain(
            r
            for b in store.read(topic, queue_id, q.min_offset, q.max_offset)
            for r in b.to_pylist()
        )
        assert got == kept
    q = queues[("orders", 0)]
    with pytest.raises(SourceError, match="retention deleted"):
        list(store.read("orders", 0, q.min_offset - 1, q.max_offset))


def test_a_directory_that_is_not_a_node_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not a dledger data directory"):
        OfflineStore(tmp_path)
    (tmp_path / "commitlog" / "data").mkdir(parents=True)
    assert OfflineStore(tmp_path).queues() == []  # a node that never stored a message


def test_batches_are_arrow_record_batches_with_the_asked_columns(node: SyntheticNode) -> None:
    store = OfflineStore(node.root)
    batches = list(store.read("orders", 0, 0, 175, ["msg_id", "tags"]))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert {tuple(b.schema.names) for b in batches} == {("msg_id", "tags")}
    assert sum(b.num_rows for b in batches) == 175
    assert os.path.isdir(node.root / "consumequeue")


# ---------------------------------------------------------------- a live replica's files


def test_a_live_replicas_files_are_read_only_below_what_it_reported(node: SyntheticNode) -> None:
    """What a replica said in QueueOffsets bounds a read of its files: queue ends, and the
    commit-log position below which its files hold every byte; beyond: `NotHere`."""
    from analytics.file_store import LiveBounds, LocalFiles, NotHere, this_boot_id
    from analytics.sources import LogPiece, Slice

    full = {(q.topic, q.queue_id): q for q in OfflineStore(node.root).queues()}
    reported = {k: QueueInfo(q.topic, q.queue_id, q.min_offset, 100) for k, q in full.items()}
    rows = sorted(node.rows, key=lambda r: r["commitlog_offset"])
    file_end = rows[-1]["commitlog_offset"] + 1000
    live = OfflineStore(node.root, LiveBounds(reported, file_end))
    assert [q.max_offset for q in live.queues()] == [100] * 4
    assert len(list(live.read("pay", 1, 0, 100))) >= 1
    with pytest.raises(NotHere):
        live.read("pay", 1, 0, 101)  # beyond the reported end: refused before reading
    slices = tuple(Slice(t, q, 0, 100) for t, q in sorted(reported))
    span = live.unit_span(slices)
    assert span is not None
    got = [
        r
        for b in live.read_piece(LogPiece(span[0], span[1], slices), COLUMNS)
        for r in plain(b.to_pylist())
    ]
    assert sorted(got, key=key) == sorted(
        (r for r in node.rows if r["queue_offset"] < 100), key=key
    )
    # The files do not hold every byte yet (a flush behind): refused, not read.
    behind = OfflineStore(node.root, LiveBounds(reported, rows[10]["commitlog_offset"]))
    with pytest.raises(NotHere):
        behind.piece_rows(LogPiece(span[0], span[1], slices))
    # Offered files open only on the same host, in the very directory.
    st = os.stat(node.root)
    here = LocalFiles(
        str(node.root), this_boot_id() or "", st.st_dev, st.st_ino, LiveBounds(reported, file_end)
    )
    assert here.open(slices) is not None
    assert (
        LocalFiles(
            str(node.root), "another-host", st.st_dev, st.st_ino, LiveBounds(reported, file_end)
        ).open(slices)
        is None
    )
    assert (
        LocalFiles(
            str(node.root),
            this_boot_id() or "",
            st.st_dev,
            st.st_ino + 1,
            LiveBounds(reported, file_end),
        ).open(slices)
        is None
    )
    assert here.open([Slice("pay", 1, 0, 101)]) is None  # more than the replica reported
