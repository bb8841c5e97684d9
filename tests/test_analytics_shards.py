"""The `dledger` source over several shards, its pure parts: queue keys and offsets
JSON by shard and queue, per-shard planning and partitions, the `shard` column (also
under its old name, raft_group, in `columns` or a user schema), a node directory's
shards. (Reads of real multi-shard clusters: test_spark_shards.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, InputPartition
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from analytics.datasource import DLedgerFilteringBatchReader
from analytics.errors import OptionError, retried
from analytics.offsets import (
    Narrowing,
    Offsets,
    choose,
    from_json,
    ranges,
    resolve,
    resolve_start,
    stream_ranges,
    time_query,
    to_json,
)
from analytics.options import parse_offsets, parse_options, schema_columns
from analytics.partitions import by_shard, log_pieces, shares, split
from analytics.shard_stores import ShardedStore, file_shards, with_shard
from analytics.sources import QueueInfo, Slice, parse_queue_ref, queue_key

# "orders" in shards 1 and 2 (queue ids 0 and 1 in each), "pay" in shard 3 only.
QUEUES = [
    QueueInfo("orders", 0, 0, 10),
    QueueInfo("orders", 1, 0, 12),
    QueueInfo("orders", 0, 2, 20, shard=2),
    QueueInfo("orders", 1, 0, 5, shard=2),
    QueueInfo("pay", 0, 0, 7, shard=3),
]
SERVERS = {"servers": "127.0.0.1:7001"}


def test_queue_keys_keep_group_one_as_it_was() -> None:
    assert QUEUES[0].key == ("orders", 0) == queue_key("orders", 0, 1)
    assert QUEUES[2].key == ("orders", 0, 2)
    assert Slice("t", 3, 0, 1, shard=5).key == ("t", 3, 5)
    assert [parse_queue_ref(t) for t in ("0", "12", "1:4", "2:0", "30:7")] == [
        0,
        12,
        4,
        (2, 0),
        (30, 7),
    ]
    for bad in ("", "x", "-1", "2:", ":3", "0:1", "2:x", "1:2:3", " 1"):
        assert parse_queue_ref(bad) is None, bad


def test_offsets_json_single_group_unchanged_and_grouped_as_group_colon_queue() -> None:
    single: Offsets = {("orders", 0): 3, ("orders", 1): 9}
    assert to_json(single) == {"orders": {"0": 3, "1": 9}}  # what checkpoints always held
    assert from_json({"orders": {"0": 3, "1": 9}}) == single
    sharded: Offsets = {("orders", 0): 3, ("orders", 0, 2): 4, ("pay", 0, 3): 1}
    doc = to_json(sharded)
    assert doc == {"orders": {"1:0": 3, "2:0": 4}, "pay": {"3:0": 1}}
    assert from_json(json.loads(json.dumps(doc))) == sharded  # a checkpoint round trip
    assert from_json({"orders": {"0": 3, "2:0": 4}}) == {("orders", 0): 3, ("orders", 0, 2): 4}
    for bad in ({"orders": {"2-0": 1}}, {"orders": {"a:b": 1}}, {"orders": {"0:1": 1}}):
        with pytest.raises(OptionError, match=r"neither a queue id nor \"shard:queue id\""):
            from_json(bad)


def test_starting_offsets_name_queues_of_any_group() -> None:
    spec = parse_offsets('{"orders": {"0": 4, "2:0": 6, "2:1": -1}}', "startingOffsets")
    assert spec == {"orders": {0: 4, (2, 0): 6, (2, 1): -1}}
    got = resolve(spec, QUEUES, "startingOffsets")
    assert got == {
        ("orders", 0): 4,
        ("orders", 1): 0,
        ("orders", 0, 2): 6,
        ("orders", 1, 2): 5,
        ("pay", 0, 3): 0,
    }
    with pytest.raises(OptionError, match=r"orders has no queue 3:0 \(queues: \['1:0', "):
        resolve(parse_offsets('{"orders": {"3:0": 1}}', "x"), QUEUES, "startingOffsets")
    with pytest.raises(OptionError, match=r"of orders/2:0 is below its first retained offset 2"):
        resolve(parse_offsets('{"orders": {"2:0": 1}}', "x"), QUEUES, "startingOffsets")
    with pytest.raises(OptionError, match=r"queue id '2-0' of 'orders' is not a number, nor"):
        parse_offsets('{"orders": {"2-0": 1}}', "startingOffsets")


def test_assign_and_timestamps_by_group() -> None:
    opts = parse_options({**SERVERS, "assign": '{"orders": [1, "2:0"]}'}, streaming=False)
    assert [q.key for q in choose(QUEUES, opts)] == [("orders", 1), ("orders", 0, 2)]
    bad = parse_options({**SERVERS, "assign": '{"orders": ["4:0"]}'}, streaming=False)
    with pytest.raises(OptionError, match=r"assign: orders has no queue\(s\) \['4:0'\]"):
        choose(QUEUES, bad)
    asked: list[Any] = []

    def lookup(queries: Any) -> list[int]:
        asked.extend(queries)
        return [3 for _ in queries]

    ts = parse_options(
        {**SERVERS, "startingOffsetsByTimestamp": '{"orders": {"2:0": 77}}'}, streaming=False
    )
    start = resolve_start(ts, QUEUES, lookup)
    assert asked == [("orders", 0, 77, 2)]  # shard 1 would be ("orders", 0, 77)
    assert start[("orders", 0, 2)] == 3 and start[("orders", 0)] == 0
    assert time_query(("orders", 0), 5) == ("orders", 0, 5)


def test_ranges_and_partitions_never_span_shards() -> None:
    start = resolve("earliest", QUEUES, "startingOffsets")
    end = resolve("latest", QUEUES, "endingOffsets")
    slices = ranges(start, end)
    assert [(s.topic, s.shard, s.queue_id, s.start, s.end) for s in slices] == [
        ("orders", 1, 0, 0, 10),
        ("orders", 2, 0, 2, 20),
        ("orders", 1, 1, 0, 12),
        ("orders", 2, 1, 0, 5),
        ("pay", 3, 0, 0, 7),
    ]
    shards = by_shard(slices)
    assert list(shards) == [1, 2, 3]
    assert {s.shard for s in shards[2]} == {2}
    cut = split(shards[2], 6)
    assert all(s.shard == 2 for s in cut) and sum(s.end - s.start for s in cut) == 23
    pieces = log_pieces(shards[2], (0, 1000, 1000), 3, None, exact=True)
    assert len(pieces) == 3 and all(p.shard == 2 for p in pieces)
    # Log pieces shared by bytes, at least one a shard.
    assert shares(8, [300, 100]) == [6, 2]
    assert shares(4, [1000, 1]) == [4, 1]
    assert shares(5, [10]) == [5] and shares(0, [10]) == [1]
    # A stream's new queue of another shard starts at its earliest offset.
    begin: Offsets = {("orders", 0): 5}
    got = stream_ranges(begin, end, QUEUES)
    assert Slice("orders", 0, 2, 20, 2) in got and Slice("orders", 0, 5, 10) in got


def test_shard_is_a_metadata_column() -> None:
    opts = parse_options({**SERVERS, "columns": "msg_id,shard"}, streaming=False)
    assert opts.columns == ("msg_id", "shard")
    with pytest.raises(OptionError, match="shard"):  # the list of columns names it
        parse_options({**SERVERS, "columns": "nope"}, streaming=False)
    batch = pa.record_batch({"queue_id": pa.array([0, 1], pa.int32()), "msg_id": ["a", "b"]})
    out = list(with_shard(iter([batch]), ["shard", "msg_id"], 3))
    assert out[0].schema.names == ["shard", "msg_id"]
    assert out[0].column(0).to_pylist() == [3, 3] and out[0].column(0).type == pa.int32()
    assert list(with_shard(iter([batch]), ["msg_id", "queue_id"], 3)) == [batch]


def test_the_old_column_name_raft_group_reads_the_shard_column_with_a_warning() -> None:
    warns = pytest.warns(FutureWarning, match="column raft_group is now shard")
    with warns:
        opts = parse_options({**SERVERS, "columns": "msg_id,raft_group"}, streaming=False)
    assert opts.columns == ("msg_id", "shard")
    # A user schema (`.schema("raft_group int, msg_id string")`) the same way.
    with warns:
        assert schema_columns([("raft_group", "int"), ("msg_id", "string")]) == ["shard", "msg_id"]
    with warns:
        assert schema_columns([("raft_group", "int")], ("shard",)) == ["shard"]
    with warns, pytest.raises(OptionError, match="raft_group is int, not string"):
        schema_columns([("raft_group", "string")])
    with warns, pytest.raises(OptionError, match="shard and raft_group are both column shard"):
        schema_columns([("shard", "int"), ("raft_group", "int")])
    with pytest.raises(OptionError, match="'nope' is not a column"):
        schema_columns([("nope", "int")])


class OneBatch:
    """A store that reads one batch of the columns asked for (shard 2's messages)."""

    def read(self, piece: Slice, columns: list[str], local: object) -> Iterator[pa.RecordBatch]:
        data = {"shard": pa.array([2, 2], pa.int32()), "msg_id": pa.array(["a", "b"])}
        yield pa.record_batch({c: data[c] for c in columns})

    def close(self) -> None:
        pass


def test_a_schema_naming_raft_group_gets_the_shard_under_that_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reader decodes `shard` and hands Spark the rows under the schema's names;
    a filter on the old name selects shards as one on `shard` does."""
    schema = StructType(
        [StructField("raft_group", IntegerType()), StructField("msg_id", StringType())]
    )
    with pytest.warns(FutureWarning, match="column raft_group is now shard"):
        reader = DLedgerFilteringBatchReader(parse_options(SERVERS, streaming=False), schema)
    assert reader.columns == ["shard", "msg_id"]
    monkeypatch.setattr(reader, "_store", lambda *args: OneBatch())
    part = InputPartition(("queue", Slice("orders", 0, 0, 2, shard=2), 0, None))
    (batch,) = reader.read(part)
    assert batch.schema.names == ["raft_group", "msg_id"]
    assert batch.column(0).to_pylist() == [2, 2] and batch.column(0).type == pa.int32()
    assert list(reader.pushFilters([EqualTo(("raft_group",), 3)])) == []  # pushed, exactly
    assert [q.key for q in reader.narrowing.queues(QUEUES)] == [("pay", 0, 3)]


def test_a_node_directory_holds_shard_one_at_its_root_and_the_others_under_groups(
    tmp_path: Path,
) -> None:
    for rel in (
        "commitlog/data",
        "groups/0/commitlog/data",
        "groups/2/commitlog/data",
        "groups/3/commitlog/data",
        "groups/junk/commitlog/data",
        "groups/4",
    ):
        (tmp_path / rel).mkdir(parents=True)
    assert file_shards(tmp_path) == [1, 2, 3]  # 0 holds routes only; 4 holds no log
    assert ShardedStore.files(str(tmp_path)).shards() == [1, 2, 3]
    assert file_shards(tmp_path / "groups" / "2") == [1]  # a shard's own directory: one log
    store = ShardedStore.files(str(tmp_path))
    try:
        assert store.queues() == []  # no consume queues yet
    finally:
        store.close()


def test_shard_filters_select_shards() -> None:
    n = Narrowing().with_shards([2, 3], "in").with_shards([2, 1], "eq")
    assert [q.key for q in n.queues(QUEUES)] == [("orders", 0, 2), ("orders", 1, 2)]
    assert Narrowing().with_shards([1], "eq").queues(QUEUES) == QUEUES[:2]


def test_a_process_that_does_not_host_a_shard_sends_the_read_to_another() -> None:
    assert retried("UNAVAILABLE", None)
    assert retried("NOT_FOUND", "this node process hosts shards 0, 1, not shard 2")
    assert not retried("NOT_FOUND", "queue offset 7 of t/0 was deleted by retention")
    assert retried("FAILED_PRECONDITION", "node 2's process does not host shard 0 (the routes)")
    # a server of the release before shards had their name
    assert retried("NOT_FOUND", "this node process hosts shards 0, 1, not shard 2")
    assert retried("FAILED_PRECONDITION", "node 2's process does not host shard 0 (the routes)")
    assert not retried("FAILED_PRECONDITION", "this is cluster a, not b")
