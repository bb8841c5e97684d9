"""Options of the `dledger` source, offsets in the manner of Kafka's, and partition planning."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from analytics.errors import OptionError, SourceError
from analytics.offsets import (
    Narrowing,
    cap,
    choose,
    from_json,
    ranges,
    resolve,
    resolve_end,
    resolve_start,
    select,
    stream_ranges,
    to_json,
    to_ms,
)
from analytics.options import parse_offsets, parse_options
from analytics.partitions import log_pieces, split, use_log_ranges
from analytics.sources import QueueInfo, Slice

QUEUES = [
    QueueInfo("orders", 0, 0, 100),
    QueueInfo("orders", 1, 10, 50),
    QueueInfo("pay", 0, 0, 7),
    QueueInfo("%SYS%OFFSETS", 0, 0, 3),
]
SERVERS = {"servers": "127.0.0.1:7001,127.0.0.1:7002"}


def test_defaults_for_batch_and_streaming() -> None:
    batch = parse_options(SERVERS, streaming=False)
    assert batch.servers == ("127.0.0.1:7001", "127.0.0.1:7002")
    assert (batch.starting, batch.ending, batch.topics, batch.path) == (
        "earliest",
        "latest",
        None,
        None,
    )
    assert batch.fail_on_data_loss and batch.max_offsets_per_trigger is None
    stream = parse_options({"path": "/d", "maxOffsetsPerTrigger": "5"}, streaming=True)
    assert (stream.starting, stream.path, stream.max_offsets_per_trigger) == ("latest", "/d", 5)


def test_option_names_are_case_insensitive_and_values_parsed() -> None:
    opts = parse_options(
        {
            "PATH": "/data",
            "Topics": " orders, pay ,orders",
            "startingoffsets": '{"orders": {"0": 5, "1": -2}}',
            "MESSAGESPERPARTITION": "10",
            "minPartitions": "3",
            "failOnDataLoss": "False",
            "timeoutSeconds": "2.5",
        },
        streaming=False,
    )
    assert opts.topics == ("orders", "pay")
    assert opts.starting == {"orders": {0: 5, 1: -2}}
    assert (opts.messages_per_partition, opts.min_partitions, opts.timeout_s) == (10, 3, 2.5)
    assert opts.fail_on_data_loss is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"servers": "a:1", "bogus": "1"}, "unknown option.*bogus"),
        ({}, "exactly one of the options `servers`"),
        ({"servers": "a:1", "path": "/d"}, "exactly one of the options"),
        ({"servers": "nohost"}, "'nohost' is not host:port"),
        ({"servers": "a:1", "topics": " , "}, "at least one topic"),
        ({"servers": "a:1", "startingOffsets": "{bad"}, "neither earliest, latest nor JSON"),
        ({"servers": "a:1", "startingOffsets": "[1]"}, "must be an object"),
        ({"servers": "a:1", "startingOffsets": '{"t": 3}'}, "must map queue ids"),
        ({"servers": "a:1", "startingOffsets": '{"t": {"x": 3}}'}, "queue id 'x'"),
        ({"servers": "a:1", "startingOffsets": '{"t": {"0": -3}}'}, "must be an integer >= 0"),
        ({"servers": "a:1", "startingOffsets": '{"t": {"0": "5"}}'}, "must be an integer"),
        ({"servers": "a:1", "startingOffsets": '{"t": {"0": true}}'}, "must be an integer"),
        ({"servers": "a:1", "startingOffsets": "latest"}, "cannot start at latest"),
        ({"servers": "a:1", "startingOffsets": '{"t": {"0": -1}}'}, "cannot start at latest"),
        ({"servers": "a:1", "endingOffsets": "earliest"}, "cannot end at earliest"),
        ({"servers": "a:1", "messagesPerPartition": "0"}, "below the minimum 1"),
        ({"servers": "a:1", "minPartitions": "two"}, "not an integer"),
        ({"servers": "a:1", "failOnDataLoss": "yes"}, "not true or false"),
        ({"servers": "a:1", "timeoutSeconds": "-1"}, "must be positive"),
        ({"servers": "a:1", "maxOffsetsPerTrigger": "10"}, "for streaming queries"),
    ],
)
def test_bad_batch_options_are_refused_clearly(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options(options, streaming=False)


def test_a_stream_takes_no_ending_offsets() -> None:
    with pytest.raises(OptionError, match="a stream has no end"):
        parse_options({**SERVERS, "endingOffsets": "latest"}, streaming=True)


def test_select_topics() -> None:
    assert {q.topic for q in select(QUEUES, None)} == {"orders", "pay"}  # no system topics
    assert [q.queue_id for q in select(QUEUES, ("orders",))] == [0, 1]
    assert len(select(QUEUES, ("%SYS%OFFSETS",))) == 1  # by name only
    with pytest.raises(OptionError, match=r"unknown topic\(s\) 'nope'.*orders, pay"):
        select(QUEUES, ("orders", "nope"))


def test_resolve_earliest_latest_and_json() -> None:
    queues = select(QUEUES, None)
    assert resolve("earliest", queues, "startingOffsets") == {
        ("orders", 0): 0,
        ("orders", 1): 10,
        ("pay", 0): 0,
    }
    assert resolve("latest", queues, "endingOffsets") == {
        ("orders", 0): 100,
        ("orders", 1): 50,
        ("pay", 0): 7,
    }
    spec = parse_offsets('{"orders": {"0": 40, "1": -1}}', "startingOffsets")
    assert resolve(spec, queues, "startingOffsets") == {
        ("orders", 0): 40,
        ("orders", 1): 50,
        ("pay", 0): 0,  # left out: earliest
    }
    ending = parse_offsets('{"orders": {"0": 60}}', "endingOffsets")
    assert resolve(ending, queues, "endingOffsets")[("orders", 1)] == 50  # left out: latest


@pytest.mark.parametrize(
    ("json", "message"),
    [
        ('{"nope": {"0": 1}}', "names topic 'nope', which is not read"),
        ('{"orders": {"7": 1}}', r"orders has no queue 7 \(queues: \[0, 1\]\)"),
        ('{"orders": {"0": 101}}', "beyond its committed end 100"),
        ('{"orders": {"1": 3}}', "below its first retained offset 10"),
    ],
)
def test_resolve_refuses_offsets_the_queues_cannot_serve(json: str, message: str) -> None:
    spec = parse_offsets(json, "startingOffsets")
    with pytest.raises(OptionError, match=message):
        resolve(spec, select(QUEUES, None), "startingOffsets")


def test_data_loss_can_be_tolerated() -> None:
    spec = parse_offsets('{"orders": {"1": 3}}', "startingOffsets")
    got = resolve(spec, select(QUEUES, None), "startingOffsets", False)
    assert got[("orders", 1)] == 10


def test_ranges_and_split() -> None:
    start = {("a", 0): 0, ("a", 1): 5, ("b", 0): 3}
    end = {("a", 0): 10, ("a", 1): 5, ("b", 0): 4}
    slices = ranges(start, end)
    assert slices == [Slice("a", 0, 0, 10), Slice("b", 0, 3, 4)]  # empty ranges dropped
    assert split(slices, 4) == [
        Slice("a", 0, 0, 4),
        Slice("a", 0, 4, 8),
        Slice("a", 0, 8, 10),
        Slice("b", 0, 3, 4),
    ]
    assert len(split(slices, 1000, min_partitions=6)) == 6  # 11 messages, pieces of 2
    with pytest.raises(OptionError, match="after the ending offset"):
        ranges({("a", 0): 9}, {("a", 0): 4})


def test_stream_ranges_start_new_queues_early_and_notice_lost_ones() -> None:
    start = {("orders", 0): 5, ("orders", 1): 3}
    end = {("orders", 0): 60, ("orders", 1): 40, ("pay", 0): 7}
    # pay/0 is new: from its earliest; orders/1's start (3) is below its minimum (10).
    with pytest.raises(SourceError, match=r"orders/1: offsets 3\.\.9 were deleted by retention"):
        stream_ranges(start, end, QUEUES)
    assert stream_ranges(start, end, QUEUES, fail_on_data_loss=False) == [
        Slice("orders", 0, 5, 60),
        Slice("orders", 1, 10, 40),
        Slice("pay", 0, 0, 7),
    ]


def test_cap_shares_the_budget_in_proportion() -> None:
    start = {("a", 0): 0, ("a", 1): 0, ("b", 0): 100}
    latest = {("a", 0): 900, ("a", 1): 90, ("b", 0): 110}
    assert cap(start, latest, None) == latest
    assert cap(start, latest, 10_000) == latest
    capped = cap(start, latest, 100)
    assert capped == {("a", 0): 90, ("a", 1): 9, ("b", 0): 101}
    assert sum(capped[k] - start[k] for k in start) <= 100


def test_offsets_round_trip_through_their_json_form() -> None:
    offsets = {("orders", 0): 5, ("orders", 12): 7, ("pay", 3): 0}
    doc = to_json(offsets)
    assert doc == {"orders": {"0": 5, "12": 7}, "pay": {"3": 0}}
    assert from_json(doc) == offsets
    with pytest.raises(OptionError, match="not a dledger offset"):
        from_json({"orders": 5})


# ---------------------------------------------------------------- Kafka parity, log ranges, filters


def test_kafka_style_options_parse() -> None:
    opts = parse_options(
        {
            **SERVERS,
            "subscribePattern": "ord.*",
            "startingTimestamp": "1700000000000",
            "endingOffsetsByTimestamp": '{"orders": {"1": 1700000005000}}',
            "startingOffsetsByTimestampStrategy": "LATEST",
            "partitioning": "Log",
            "localReads": "false",
            "columns": "topic, body_size",
            "timestampSlackMs": "0",
        },
        streaming=False,
    )
    assert (opts.pattern, opts.topics, opts.assign) == ("ord.*", None, None)
    assert opts.starting_ts == 1_700_000_000_000
    assert opts.ending_ts == {"orders": {1: 1_700_000_005_000}}
    assert (opts.ts_strategy, opts.partitioning, opts.local_reads) == ("latest", "log", False)
    assert opts.columns == ("topic", "body_size") and opts.timestamp_slack_ms == 0
    # A timestamp start is no "start at latest" for a batch query.
    assert parse_options({**SERVERS, "startingTimestamp": "5"}, streaming=False)
    stream = parse_options(
        {**SERVERS, "subscribe": "a,b", "minOffsetsPerTrigger": "100", "maxTriggerDelay": "30s"},
        streaming=True,
    )
    assert (stream.topics, stream.min_offsets_per_trigger) == (("a", "b"), 100)
    assert stream.max_trigger_delay_ms == 30_000
    assert parse_options(SERVERS, streaming=True).max_trigger_delay_ms == 15 * 60_000
    for text, ms in (("500ms", 500), ("2m", 120_000), ("1.5h", 5_400_000), ("250", 250)):
        got = parse_options({**SERVERS, "maxTriggerDelay": text}, streaming=True)
        assert got.max_trigger_delay_ms == ms


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingTimestamp": "soon"}, "startingTimestamp: 'soon' is not a number"),
        ({"startingOffsetsByTimestamp": "{"}, "startingOffsetsByTimestamp: '{' is not JSON"),
        ({"startingOffsetsByTimestamp": '{"t": 5}'}, "must map queue ids to timestamps"),
        ({"subscribePattern": "("}, r"subscribePattern: '\(' is not a regular expression"),
        ({"subscribe": "a", "subscribePattern": "b"}, "give at most one of subscribe"),
        ({"assign": '{"t": []}'}, "non-empty list of queue ids"),
        ({"assign": '{"t": [-1]}'}, "queue id -1 of 't' is not an integer >= 0"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, "neither error nor latest"),
        ({"partitioning": "segments"}, "partitioning: 'segments' is not one of"),
        ({"localReads": "maybe"}, "localReads: 'maybe' is not true or false"),
        ({"columns": ","}, "columns: none given"),
        ({"timestampSlackMs": "-1"}, "timestampSlackMs: -1 is below the minimum 0"),
        ({"minOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger is for streaming queries"),
    ],
)
def test_bad_kafka_style_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options({**SERVERS, **options}, streaming=False)


def test_bad_streaming_options_name_the_option() -> None:
    with pytest.raises(OptionError, match="maxTriggerDelay: 'soon' is not a duration"):
        parse_options({**SERVERS, "maxTriggerDelay": "soon"}, streaming=True)
    with pytest.raises(OptionError, match="endingTimestamp and endingOffsetsByTimestamp"):
        parse_options({**SERVERS, "endingTimestamp": "5"}, streaming=True)


def test_a_pattern_or_an_assignment_chooses_queues() -> None:
    def chosen(**options: str) -> list[tuple[str, int]]:
        opts = parse_options({**SERVERS, **options}, streaming=False)
        return [(q.topic, q.queue_id) for q in choose(QUEUES, opts)]

    assert chosen(subscribePattern="p.y|ord") == [("pay", 0)]  # the whole name must match
    assert chosen(subscribePattern=".*") == [("orders", 0), ("orders", 1), ("pay", 0)]
    assert chosen(assign='{"orders": [1]}') == [("orders", 1)]
    with pytest.raises(OptionError, match=r"assign: orders has no queue\(s\) \[3\]"):
        chosen(assign='{"orders": [1, 3]}')
    with pytest.raises(OptionError, match="unknown topic"):
        chosen(assign='{"nope": [0]}')


def test_timestamps_resolve_through_the_lookup() -> None:
    queues = select(QUEUES, None)  # orders/0 [0, 100), orders/1 [10, 50), pay/0 [0, 7)
    asked: list[tuple[str, int, int]] = []

    def lookup(queries: Any) -> list[int]:  # the store's binary search, faked
        asked.extend(queries)
        return [{"orders": 30, "pay": 7}[t] for t, _, _ in queries]

    opts = parse_options({**SERVERS, "startingTimestamp": "77"}, streaming=False)
    with pytest.raises(OptionError, match="no message of pay/0 was stored at or after 77"):
        resolve_start(opts, queues, lookup)
    assert asked == [("orders", 0, 77), ("orders", 1, 77), ("pay", 0, 77)]
    opts = replace(opts, ts_strategy="latest")
    assert resolve_start(opts, queues, lookup) == {
        ("orders", 0): 30,
        ("orders", 1): 30,
        ("pay", 0): 7,
    }
    ending = parse_options(
        {**SERVERS, "endingOffsetsByTimestamp": '{"orders": {"0": 9}}'}, streaming=False
    )
    assert resolve_end(ending, queues, lookup) == {
        ("orders", 0): 30,
        ("orders", 1): 50,  # left out: latest
        ("pay", 0): 7,
    }
    bad = parse_options(
        {**SERVERS, "endingOffsetsByTimestamp": '{"orders": {"4": 9}}'}, streaming=False
    )
    with pytest.raises(OptionError, match="endingOffsetsByTimestamp: orders has no queue 4"):
        resolve_end(bad, queues, lookup)


def test_log_pieces_cut_the_range_evenly_and_on_segment_ends() -> None:
    slices = [Slice("a", 0, 0, 10), Slice("b", 0, 5, 5)]
    mib = 1 << 20
    one = log_pieces(slices, (0, 3 * mib, 0), 4, None)
    assert [(p.start, p.end) for p in one] == [(0, 3 * mib)]  # too small to cut
    assert one[0].queues == (Slice("a", 0, 0, 10),)  # empty ranges left out
    four = log_pieces(slices, (100, 400 * mib, 0), 4, None)
    assert len(four) == 4 and four[0].start == 100 and four[-1].end == 400 * mib
    sizes = {p.end - p.start for p in four}
    assert max(sizes) - min(sizes) <= 1
    # A cut near a segment end (here 100 MiB segments) moves onto it.
    snapped = log_pieces(slices, (0, 410 * mib, 0), 4, 100 * mib)
    assert [p.end for p in snapped[:3]] == [100 * mib, 200 * mib, 300 * mib]
    exact = log_pieces(slices, (0, 1000, 0), 3, None, exact=True)  # minPartitions given
    assert [(p.start, p.end) for p in exact] == [(0, 333), (333, 667), (667, 1000)]
    big = log_pieces(slices, (0, 5 << 30, 0), 2, None)
    assert len(big) == 5  # never more than MAX_PIECE_BYTES a piece


def test_the_log_is_cut_by_range_when_the_messages_fill_it() -> None:
    assert use_log_ranges("auto", False, (0, 1000, 900))
    assert not use_log_ranges("auto", False, (0, 1000, 250))  # a topic of four
    assert use_log_ranges("auto", True, (0, 1000, 10))  # files: always
    assert use_log_ranges("log", False, (0, 1000, 10))
    assert not use_log_ranges("queue", True, (0, 1000, 1000))
    assert not use_log_ranges("log", True, None)


def test_narrowing_by_filters() -> None:
    n = Narrowing().with_topics(["orders", "pay"], "in").with_topics(["orders"], "eq")
    n = n.bounded("queue_id_range", 1, None, "gt").bounded("offset_range", 20, 30, "range")
    n = n.bounded("offset_range", None, 25, "lt")
    assert [(q.topic, q.queue_id) for q in n.queues(QUEUES)] == [("orders", 1)]
    start, end = n.offsets({("orders", 1): 10}, {("orders", 1): 50})
    assert (start, end) == ({("orders", 1): 20}, {("orders", 1): 25})
    # An empty window stays empty (no start after its end).
    start, end = n.offsets({("orders", 1): 40}, {("orders", 1): 50})
    assert start[("orders", 1)] == 40 and end[("orders", 1)] == 40
    timed = Narrowing().bounded("time_range", 1000, 2000, "ts")
    seen: list[tuple[str, int, int]] = []

    def lookup(queries: Any) -> list[int]:
        seen.extend(queries)
        return [15 if ts < 1500 else 35 for _, _, ts in queries]

    start, end = timed.times({("a", 0): 10}, {("a", 0): 50}, lookup, slack_ms=100)
    assert (start, end) == ({("a", 0): 15}, {("a", 0): 35})
    assert seen == [("a", 0, 900), ("a", 0, 2100)]  # widened by the slack
    assert to_ms(dt.datetime(2024, 1, 1, 0, 0, 0, 500, tzinfo=dt.UTC), up=True) == (
        1_704_067_200_001
    )
    assert to_ms(dt.datetime(2024, 1, 1, 0, 0, 0, 500), up=False) == 1_704_067_200_000
    assert to_ms("2024", up=False) is None
