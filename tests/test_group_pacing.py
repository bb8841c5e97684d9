"""The consume side's bookkeeping, without a node: range acks on a lease equal the acks of
each offset, a consumer's acks merged into ranges, how much it fetches, and how the
coordinator shares a fetch among the queues that have something new.
"""

from __future__ import annotations

import random

import pytest

from dledger_commitlog.client.pacing import MAX_FETCH, FetchSize, ack_ranges
from dledger_commitlog.messaging.allocation import share_out
from dledger_commitlog.messaging.group_lease import Lease
from dledger_commitlog.messaging.group_state import (
    MAX_IN_FLIGHT_PER_QUEUE,
    Epochs,
    GroupState,
    QueueSource,
    Read,
    Settings,
)


def _lease_state(lease: Lease) -> tuple[object, ...]:
    return (
        lease.frontier,
        lease.cursor,
        sorted(lease.acked),
        dict(lease.in_flight),
        dict(lease.deliveries),
        dict(lease.attempts),
    )


@pytest.mark.parametrize("seed", range(40))
def test_a_range_ack_leaves_a_lease_as_acking_each_offset_does(seed: int) -> None:
    rng = random.Random(seed)
    one, each = Lease("t", 0, 5, 5, 5), Lease("t", 0, 5, 5, 5)
    for lease in (one, each):
        lease.cursor = 60
        lease.in_flight = {o: 1 for o in range(5, 60)}
        lease.deliveries = {o: 1 + o % 3 for o in range(5, 60)}
        lease.attempts = {o: 1 for o in range(5, 60, 7)}
    for _ in range(12):
        start = rng.randrange(0, 60)
        end = rng.randrange(start, 61)
        news = one.mark_range(start, end)
        assert news == sum(each.mark_acked(o) for o in range(start, end))
        assert _lease_state(one) == _lease_state(each), (start, end)


def test_a_range_from_the_frontier_moves_it_at_once() -> None:
    lease = Lease("t", 0, 10, 10, 10)
    lease.cursor = 300
    lease.in_flight = {o: 1 for o in range(10, 300)}
    lease.deliveries = dict.fromkeys(range(10, 300), 1)
    assert lease.mark_range(0, 200) == 190
    assert (lease.frontier, lease.acked) == (200, set())
    assert min(lease.in_flight) == 200 and min(lease.deliveries) == 200
    assert lease.mark_range(150, 250) == 50  # partly acked before: only the news count
    assert lease.mark_range(150, 250) == 0


def test_acks_go_as_ranges_of_consecutive_offsets_per_queue_and_epoch() -> None:
    handles = [
        ("a", 0, 5, 1),
        ("a", 0, 3, 1),
        ("a", 0, 4, 1),
        ("a", 0, 7, 1),
        ("a", 0, 4, 1),
        ("a", 1, 5, 1),
        ("a", 0, 6, 2),
        ("b", 0, 0, 1),
    ]
    assert ack_ranges(handles) == [
        ("a", 0, 3, 1, 6),
        ("a", 0, 7, 1, 8),
        ("a", 0, 6, 2, 7),
        ("a", 1, 5, 1, 6),
        ("b", 0, 0, 1, 1),
    ]
    assert ack_ranges([]) == []
    rng = random.Random(7)
    many = [("t", rng.randrange(3), rng.randrange(500), 9) for _ in range(400)]
    covered = {(t, q, o) for t, q, start, _e, end in ack_ranges(many) for o in range(start, end)}
    assert covered == {(t, q, o) for t, q, o, _e in many}


def test_a_fetch_asks_for_what_the_handlers_did_lately(monkeypatch: pytest.MonkeyPatch) -> None:
    assert FetchSize(7, 32).size(10**6) == 7  # a fixed batch is a fixed batch
    now = [100.0]
    monkeypatch.setattr("dledger_commitlog.client.pacing.time.monotonic", lambda: now[0])
    paced = FetchSize(None, 32)
    assert paced.size(0) == 32  # nothing measured yet: the least
    now[0] += 1.0
    assert paced.size(500) == 50  # 500/s: about 0.1 s of it
    now[0] += 0.01
    assert paced.size(600) == 50  # a window under 50 ms: the last rate still holds
    now[0] += 1.0
    assert paced.size(100_000) == MAX_FETCH
    now[0] += 1.0
    assert paced.size(100_010) == 32  # handlers that slowed down fetch little again


def test_share_out_is_even_fills_small_wants_and_rotates_the_remainder() -> None:
    assert share_out([1024] * 3, 9) == [3, 3, 3]
    assert share_out([1, 100, 2], 32) == [1, 29, 2]
    assert share_out([0, 5, 0], 32) == [0, 5, 0]
    assert sum(share_out([1024] * 9, 32)) == 32
    assert [share_out([5, 5, 5], 1, turn) for turn in range(3)] == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert share_out([], 10) == [] and share_out([3, 4], 0) == [0, 0]


def _state(queues: int) -> GroupState:
    source = QueueSource(lambda topic: queues, lambda group, topic, queue_id: 0)
    s = GroupState("g", source, Epochs(1), session_timeout_ms=3000, grace_until_ms=0)
    s.heartbeat("m", "h", {"T": ("TAG", "*")}, Settings(), (), 0)
    return s


def test_a_plan_reads_only_the_queues_with_something_new() -> None:
    s = _state(4)
    ends = {("T", 0): 0, ("T", 1): 3, ("T", 2): 0, ("T", 3): 100}
    plan = s.plan_fetch("m", 32, 10, lambda topic, q: ends.get((topic, q), 0))
    planned = [(r.topic, r.queue_id, r.start, r.count) for r in plan]
    assert planned == [("T", 1, 0, 3), ("T", 3, 0, 29)]
    assert s.plan_fetch("m", 32, 10, lambda topic, q: 0) == []


def test_a_plan_takes_redeliveries_due_and_no_more_than_a_queue_may_hold() -> None:
    s = _state(1)
    lease = s.leases[("T", 0)]
    (read,) = s.plan_fetch("m", 8, 0, lambda topic, q: 8 if topic == "T" else 0)
    assert s.record("m", read, list(range(8)), [], 8, 0) is not None
    due = s.settings.ack_wait_ms
    plan = s.plan_fetch("m", 5, due, lambda topic, q: 8 if topic == "T" else 0)
    assert plan == [Read("T", 0, lease.epoch, (0, 1, 2, 3, 4), 8, 0)]
    lease.in_flight = dict.fromkeys(range(MAX_IN_FLIGHT_PER_QUEUE), 10**9)
    assert s.plan_fetch("m", 5, due, lambda topic, q: 5000 if topic == "T" else 0) == []
