"""Options of the `dledger` source, offsets in the manner of Kafka's, and partition planning."""

from __future__ import annotations

import pytest

from analytics import plan
from analytics.errors import OptionError, SourceError
from analytics.plan import Slice
from analytics.sources import QueueInfo

QUEUES = [
    QueueInfo("orders", 0, 0, 100),
    QueueInfo("orders", 1, 10, 50),
    QueueInfo("pay", 0, 0, 7),
    QueueInfo("%SYS%OFFSETS", 0, 0, 3),
]
SERVERS = {"servers": "127.0.0.1:7001,127.0.0.1:7002"}


def test_defaults_for_batch_and_streaming() -> None:
    batch = plan.parse_options(SERVERS, streaming=False)
    assert batch.servers == ("127.0.0.1:7001", "127.0.0.1:7002")
    assert (batch.starting, batch.ending, batch.topics, batch.path) == (
        "earliest",
        "latest",
        None,
        None,
    )
    assert batch.fail_on_data_loss and batch.max_offsets_per_trigger is None
    stream = plan.parse_options({"path": "/d", "maxOffsetsPerTrigger": "5"}, streaming=True)
    assert (stream.starting, stream.path, stream.max_offsets_per_trigger) == ("latest", "/d", 5)


def test_option_names_are_case_insensitive_and_values_parsed() -> None:
    opts = plan.parse_options(
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
        plan.parse_options(options, streaming=False)


def test_a_stream_takes_no_ending_offsets() -> None:
    with pytest.raises(OptionError, match="a stream has no end"):
        plan.parse_options({**SERVERS, "endingOffsets": "latest"}, streaming=True)


def test_select_topics() -> None:
    assert {q.topic for q in plan.select(QUEUES, None)} == {"orders", "pay"}  # no system topics
    assert [q.queue_id for q in plan.select(QUEUES, ("orders",))] == [0, 1]
    assert len(plan.select(QUEUES, ("%SYS%OFFSETS",))) == 1  # by name only
    with pytest.raises(OptionError, match=r"unknown topic\(s\) 'nope'.*orders, pay"):
        plan.select(QUEUES, ("orders", "nope"))


def test_resolve_earliest_latest_and_json() -> None:
    queues = plan.select(QUEUES, None)
    assert plan.resolve("earliest", queues, "startingOffsets") == {
        ("orders", 0): 0,
        ("orders", 1): 10,
        ("pay", 0): 0,
    }
    assert plan.resolve("latest", queues, "endingOffsets") == {
        ("orders", 0): 100,
        ("orders", 1): 50,
        ("pay", 0): 7,
    }
    spec = plan.parse_offsets('{"orders": {"0": 40, "1": -1}}', "startingOffsets")
    assert plan.resolve(spec, queues, "startingOffsets") == {
        ("orders", 0): 40,
        ("orders", 1): 50,
        ("pay", 0): 0,  # left out: earliest
    }
    ending = plan.parse_offsets('{"orders": {"0": 60}}', "endingOffsets")
    assert plan.resolve(ending, queues, "endingOffsets")[("orders", 1)] == 50  # left out: latest


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
    spec = plan.parse_offsets(json, "startingOffsets")
    with pytest.raises(OptionError, match=message):
        plan.resolve(spec, plan.select(QUEUES, None), "startingOffsets")


def test_data_loss_can_be_tolerated() -> None:
    spec = plan.parse_offsets('{"orders": {"1": 3}}', "startingOffsets")
    got = plan.resolve(spec, plan.select(QUEUES, None), "startingOffsets", False)
    assert got[("orders", 1)] == 10


def test_ranges_and_split() -> None:
    start = {("a", 0): 0, ("a", 1): 5, ("b", 0): 3}
    end = {("a", 0): 10, ("a", 1): 5, ("b", 0): 4}
    slices = plan.ranges(start, end)
    assert slices == [Slice("a", 0, 0, 10), Slice("b", 0, 3, 4)]  # empty ranges dropped
    assert plan.split(slices, 4) == [
        Slice("a", 0, 0, 4),
        Slice("a", 0, 4, 8),
        Slice("a", 0, 8, 10),
        Slice("b", 0, 3, 4),
    ]
    assert len(plan.split(slices, 1000, min_partitions=6)) == 6  # 11 messages, pieces of 2
    with pytest.raises(OptionError, match="after the ending offset"):
        plan.ranges({("a", 0): 9}, {("a", 0): 4})


def test_stream_ranges_start_new_queues_early_and_notice_lost_ones() -> None:
    start = {("orders", 0): 5, ("orders", 1): 3}
    end = {("orders", 0): 60, ("orders", 1): 40, ("pay", 0): 7}
    # pay/0 is new: from its earliest; orders/1's start (3) is below its minimum (10).
    with pytest.raises(SourceError, match=r"orders/1: offsets 3\.\.9 were deleted by retention"):
        plan.stream_ranges(start, end, QUEUES)
    assert plan.stream_ranges(start, end, QUEUES, fail_on_data_loss=False) == [
        Slice("orders", 0, 5, 60),
        Slice("orders", 1, 10, 40),
        Slice("pay", 0, 0, 7),
    ]


def test_cap_shares_the_budget_in_proportion() -> None:
    start = {("a", 0): 0, ("a", 1): 0, ("b", 0): 100}
    latest = {("a", 0): 900, ("a", 1): 90, ("b", 0): 110}
    assert plan.cap(start, latest, None) == latest
    assert plan.cap(start, latest, 10_000) == latest
    capped = plan.cap(start, latest, 100)
    assert capped == {("a", 0): 90, ("a", 1): 9, ("b", 0): 101}
    assert sum(capped[k] - start[k] for k in start) <= 100


def test_offsets_round_trip_through_their_json_form() -> None:
    offsets = {("orders", 0): 5, ("orders", 12): 7, ("pay", 3): 0}
    doc = plan.to_json(offsets)
    assert doc == {"orders": {"0": 5, "12": 7}, "pay": {"3": 0}}
    assert plan.from_json(doc) == offsets
    with pytest.raises(OptionError, match="not a dledger offset"):
        plan.from_json({"orders": 5})
