"""The pure coordinator (dledger_commitlog/messaging/group_state.py): one test per rule of
its docstring (allocation among live members, session expiry, revocation waiting for the
owner's deliveries, epochs, stale leases and unknown messages, the frontier and its
flushing, redelivery after ack-wait, orderly mode, settings conflicts, leave). The grace
period after an election is tested in tests/test_group_state_grace.py, the seeded
randomized simulation in tests/test_group_state_sim.py; the shared helpers are in
tests/group_state_helpers.py.
"""

from __future__ import annotations

import pytest

from dledger_commitlog.messaging.group_state import (
    MAX_IN_FLIGHT_PER_QUEUE,
    NOBODY,
    Epochs,
    GroupConflict,
    Read,
    Settings,
    StaleLease,
    UnknownMessage,
)
from tests.group_state_helpers import (
    ACK_WAIT_MS,
    ALL_A,
    ALL_AB,
    ALL_B,
    ORDERLY,
    RETRY,
    deliver,
    join,
    owners,
    state,
    where,
)

# -- allocation ----------------------------------------------------------------------


def test_allocation_per_topic_among_its_subscribers_and_retry_among_all() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    join(s, "m2", 0, ALL_AB)
    # A's 4 queues between m1 and m2, B's 2 to m2 alone, the retry queue to m1 (sorted first)
    assert owners(s) == {
        ("A", 0): "m1",
        ("A", 1): "m1",
        ("A", 2): "m2",
        ("A", 3): "m2",
        ("B", 0): "m2",
        ("B", 1): "m2",
        (RETRY, 0): "m1",
    }
    epochs = [x.epoch for x in s.leases.values()]
    assert len(set(epochs)) == len(epochs)  # one epoch per grant
    assert all(x.tenure_epoch == x.epoch for x in s.leases.values())


def test_consistent_hash_strategy_covers_every_queue() -> None:
    s = state()
    for m in ("m1", "m2", "m3"):
        join(s, m, 0, ALL_AB, Settings(strategy="consistent-hash"))
    assert len(s.leases) == 7 and all(x.owner in s.members for x in s.leases.values())


def test_a_queue_nobody_subscribes_to_any_more_is_released() -> None:
    s = state()
    join(s, "m1", 0, ALL_AB)
    join(s, "m1", 10, ALL_A)  # B dropped: nothing of B in flight
    assert {ref for ref, o in owners(s).items() if o == "m1"} == {
        ("A", 0),
        ("A", 1),
        ("A", 2),
        ("A", 3),
        (RETRY, 0),
    }
    assert s.leases[("B", 0)].owner is None


def test_a_queue_nobody_subscribes_to_waits_for_its_deliveries_before_it_is_free() -> None:
    # a bug fixed: it was freed at once, and a member subscribing next got it while
    # the one that dropped the topic still had its messages in hand
    s = state()
    join(s, "m1", 0, ALL_AB)
    deliver(s, "m1", 0, end=2)
    epoch = s.leases[("B", 0)].epoch
    join(s, "m1", 10, ALL_A)  # B dropped with 2 of B/0 in flight
    lease = s.leases[("B", 0)]
    assert (lease.owner, lease.target) == ("m1", NOBODY)
    assert all((r.topic, r.queue_id) != ("B", 0) for r in s.plan_fetch("m1", 32, 20))
    join(s, "m2", 20, ALL_B)
    assert (lease.owner, lease.target) == ("m1", "m2")  # revoking, to m2 now
    s.ack("m1", "B", 0, epoch, 0, 2, 2)
    s.tick(30)
    assert lease.owner == "m2" and lease.frontier == 2
    s.leave("m2", 40)
    join(s, "m1", 40, ALL_AB)
    deliver(s, "m1", 40, end=4)
    join(s, "m1", 50, ALL_A)
    assert lease.target == NOBODY
    s.tick(40 + ACK_WAIT_MS)  # the ack-wait ran out: free
    assert where(lease) == (None, None, 2)


# -- session expiry ------------------------------------------------------------------


def test_a_silent_member_expires_and_its_queues_move_with_deliveries_redelivered() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    join(s, "m2", 0, ALL_A)
    assert deliver(s, "m1", 100, end=3)[("A", 0)] == [0, 1, 2]
    join(s, "m2", 2000, ALL_A)
    assert not s.tick(3000)  # m1 was seen 3000 ms ago: not more than the session
    assert s.leases[("A", 0)].owner == "m1"
    assert s.tick(3101)
    assert "m1" not in s.members
    assert all(x.owner == "m2" for x in s.leases.values())
    lease = s.leases[("A", 0)]
    assert lease.cursor == lease.frontier == 0 and not lease.in_flight  # rewound
    assert deliver(s, "m2", 3200, end=3)[("A", 0)] == [0, 1, 2]
    with pytest.raises(StaleLease, match="not a live member"):
        s.plan_fetch("m1", 10, 3200)


def test_fetches_keep_a_member_alive() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    s.plan_fetch("m1", 10, 2500)
    assert not s.tick(5000) and "m1" in s.members


# -- revocation ----------------------------------------------------------------------


def test_revocation_waits_for_the_owners_deliveries_to_be_acked() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    got = deliver(s, "m1", 10, end=2)
    assert got[("A", 3)] == [0, 1]
    epoch = s.leases[("A", 3)].epoch
    join(s, "m2", 20, ALL_A)  # A/2 and A/3 go to m2; each has 2 in flight with m1
    lease = s.leases[("A", 3)]
    assert lease.owner == "m1" and lease.target == "m2"
    assert s.leases[("A", 2)].target == "m2"
    fetched = {(r.topic, r.queue_id) for r in s.plan_fetch("m1", 10, 30)}
    assert fetched == {("A", 0), ("A", 1), (RETRY, 0)}  # m1 gets no more of a queue it is losing
    assert s.plan_fetch("m2", 10, 30) == []  # and m2 none of it yet
    assert s.ack("m1", "A", 3, epoch, 0, 1, 2) == 1  # acks still count while revoking
    s.tick(40)
    assert where(lease)[0] == "m1"
    assert s.ack("m1", "A", 3, epoch, 1, 2, 2) == 1
    assert s.tick(50)
    assert where(lease)[:2] == ("m2", None) and lease.epoch > epoch
    assert lease.frontier == lease.cursor == 2
    with pytest.raises(StaleLease, match="held by 'm2'"):
        s.ack("m1", "A", 3, epoch, 0, 1, 2)


def test_revocation_moves_the_queue_once_the_ack_wait_ran_out() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    deliver(s, "m1", 0, end=2)
    join(s, "m2", 1000, ALL_A)
    lease = s.leases[("A", 3)]
    for now in (2000, 3000, 4000, ACK_WAIT_MS - 1):
        join(s, "m1", now, ALL_A)
        join(s, "m2", now, ALL_A)
        assert lease.owner == "m1"
    assert s.tick(ACK_WAIT_MS)
    assert lease.owner == "m2" and not lease.in_flight and lease.cursor == 0  # redelivered


def test_a_read_planned_before_a_revocation_is_dropped() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    deliver(s, "m1", 0, end=1)
    reads = {(r.topic, r.queue_id): r for r in s.plan_fetch("m1", 32, 10)}
    join(s, "m2", 20, ALL_A)  # A/3 revoking (1 in flight), A/2 moved (1 in flight too)
    assert s.record("m1", reads[("A", 3)], [1], [], 2, 30) is None
    assert s.leases[("A", 3)].cursor == 1


def test_a_read_under_an_epoch_gone_is_dropped_even_for_the_same_owner() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    (read,) = [r for r in s.plan_fetch("m1", 32, 0) if (r.topic, r.queue_id) == ("A", 0)]
    s.leave("m1", 10)
    join(s, "m1", 20, ALL_A)  # the same member holds it again, under a new epoch
    assert s.leases[("A", 0)].epoch > read.epoch
    assert s.record("m1", read, [0, 1], [], 2, 30) is None
    assert s.leases[("A", 0)].cursor == 0


# -- epochs --------------------------------------------------------------------------


def test_epochs_grow_with_every_grant_and_across_terms() -> None:
    first = Epochs(1)
    seen = [first.next() for _ in range(1000)]
    assert seen == sorted(set(seen))
    second = Epochs(2)
    assert second.next() > seen[-1]
    assert Epochs(0).next() == 1


def test_each_move_of_a_queue_has_a_higher_epoch() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    history = [s.leases[("A", 3)].epoch]
    for now, member in ((10, "m2"), (20, None), (30, "m3")):
        if member is None:
            s.leave("m2", now)
        else:
            join(s, member, now, ALL_A)
        history.append(s.leases[("A", 3)].epoch)
    assert history == sorted(set(history)), history


# -- acks ----------------------------------------------------------------------------


def test_ack_refuses_a_stale_owner_and_an_offset_never_delivered() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    deliver(s, "m1", 0, end=3)
    epoch = s.leases[("A", 0)].epoch
    for bad in (epoch - 1, epoch + 1, 0):
        with pytest.raises(StaleLease, match="stale lease"):
            s.ack("m1", "A", 0, bad, 0, 1, 3)
    with pytest.raises(StaleLease, match="not a live member"):
        s.ack("nobody", "A", 0, epoch, 0, 1, 3)
    with pytest.raises(StaleLease, match="held by 'm1'"):
        join(s, "m2", 0, ALL_B)
        s.ack("m2", "A", 0, epoch, 0, 1, 3)
    with pytest.raises(UnknownMessage, match="offset 3 was delivered"):
        s.ack("m1", "A", 0, epoch, 3, 0, 3)
    with pytest.raises(UnknownMessage, match="offset 3 was delivered"):
        s.ack("m1", "A", 0, epoch, 1, 5, 3)  # a range that runs past what was delivered
    with pytest.raises(UnknownMessage, match="negative"):
        s.ack("m1", "A", 0, epoch, -1, 0, 3)
    assert s.ack("m1", "A", 0, epoch, 0, 3, 3) == 3
    assert s.ack("m1", "A", 0, epoch, 0, 3, 3) == 0  # again: nothing new
    assert s.leases[("A", 0)].frontier == 3


def test_nack_needs_an_open_delivery() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    deliver(s, "m1", 0, end=3)
    lease = s.leases[("A", 0)]
    s.delivered(lease, 1)
    s.ack("m1", "A", 0, lease.epoch, 2, 0, 3)
    with pytest.raises(UnknownMessage, match="acked already"):
        s.delivered(lease, 2)
    with pytest.raises(UnknownMessage, match="open: \\[0, 3\\)"):
        s.delivered(lease, 3)
    s.ack("m1", "A", 0, lease.epoch, 0, 0, 3)
    with pytest.raises(UnknownMessage, match="open: \\[1, 3\\)"):
        s.delivered(lease, 0)


# -- the frontier and its flushing ---------------------------------------------------


def test_frontier_is_the_lowest_offset_not_acked_and_flushing_tracks_it() -> None:
    s = state(committed={("A", 0): 5})
    join(s, "m1", 0, ALL_A)
    lease = s.leases[("A", 0)]
    assert lease.frontier == lease.cursor == lease.flushed == 5  # starts at the commit
    assert s.unflushed() == []
    assert deliver(s, "m1", 0, end=9)[("A", 0)] == [5, 6, 7, 8]
    s.ack("m1", "A", 0, lease.epoch, 6, 8, 9)  # 6, 7: 5 still open
    assert lease.frontier == 5 and lease.acked == {6, 7} and s.unflushed() == []
    s.ack("m1", "A", 0, lease.epoch, 5, 0, 9)
    assert lease.frontier == 8 and lease.acked == set()
    assert s.unflushed() == [("A", 0, 8)]
    s.flushed("A", 0, 7)  # an older flush landing late
    assert s.unflushed() == [("A", 0, 8)]
    s.flushed("A", 0, 8)
    s.flushed("A", 0, 6)  # never backwards
    assert s.unflushed() == [] and lease.flushed == 8
    s.flushed("Z", 0, 1)  # a queue it does not know: nothing


def test_skipped_offsets_count_as_acked() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    (read,) = [r for r in s.plan_fetch("m1", 40, 0) if (r.topic, r.queue_id) == ("A", 0)]
    assert s.record("m1", read, [1, 3], [0, 2, 4], 5, 0) == [1, 1]
    lease = s.leases[("A", 0)]
    assert lease.frontier == 1 and lease.cursor == 5 and set(lease.in_flight) == {1, 3}


def test_reset_moves_the_group_offset() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    deliver(s, "m1", 0, end=4)
    s.reset("A", 0, 2)
    lease = s.leases[("A", 0)]
    assert (lease.frontier, lease.cursor, lease.flushed, lease.in_flight) == (2, 2, 2, {})


# -- redelivery (concurrent) ---------------------------------------------------------


def test_in_flight_messages_are_delivered_again_after_the_ack_wait() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    assert deliver(s, "m1", 0, end=3)[("A", 0)] == [0, 1, 2]
    lease = s.leases[("A", 0)]
    s.ack("m1", "A", 0, lease.epoch, 1, 0, 3)
    assert deliver(s, "m1", ACK_WAIT_MS - 1, end=3) == {}  # nothing due, nothing new
    join(s, "m1", ACK_WAIT_MS - 1, ALL_A)
    got = deliver(s, "m1", ACK_WAIT_MS, end=5)
    assert got[("A", 0)] == [0, 2, 3, 4]  # the two due first, then what is new
    assert lease.deliveries == {0: 2, 1: 1, 2: 2, 3: 1, 4: 1}
    s.ack("m1", "A", 0, lease.epoch, 0, 0, 5)
    assert lease.deliveries == {2: 2, 3: 1, 4: 1}  # below the frontier: forgotten
    assert lease.in_flight[2] == 2 * ACK_WAIT_MS  # a new ack-wait from the redelivery


def test_a_rewound_queue_delivers_again_only_what_is_not_acked() -> None:
    # a bug fixed: the new owner got the acked offsets again, and they stayed in flight
    # for ever (an ack of an acked offset did not clear it): redelivered every ack-wait
    s = state()
    join(s, "m1", 0, ALL_A)
    deliver(s, "m1", 0, end=6)
    lease = s.leases[("A", 2)]
    s.ack("m1", "A", 2, lease.epoch, 1, 3, 6)  # 1, 2 (0 is still out)
    s.ack("m1", "A", 2, lease.epoch, 4, 0, 6)
    join(s, "m2", 0, ALL_A)
    s.tick(ACK_WAIT_MS)
    join(s, "m2", ACK_WAIT_MS, ALL_A)
    assert lease.owner == "m2" and (lease.frontier, lease.cursor) == (0, 0)
    reads = [r for r in s.plan_fetch("m2", 32, ACK_WAIT_MS) if r.queue_id == 2]
    assert [(r.start, r.count) for r in reads] == [(0, 1)]  # up to the first acked
    assert s.record("m2", reads[0], [0], [], 1, ACK_WAIT_MS) == [2]
    assert lease.cursor == 3  # past 1 and 2, acked
    got = deliver(s, "m2", ACK_WAIT_MS, end=6)
    assert got[("A", 2)] == [3]
    got = deliver(s, "m2", ACK_WAIT_MS, end=6)
    assert got[("A", 2)] == [5] and lease.cursor == 6
    assert sorted(lease.in_flight) == [0, 3, 5]
    assert s.ack("m2", "A", 2, lease.epoch, 0, 6, 6) == 3
    assert lease.frontier == 6 and lease.in_flight == {}


def test_an_ack_of_an_acked_offset_still_ends_its_delivery() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    deliver(s, "m1", 0, end=2)
    lease = s.leases[("A", 0)]
    s.ack("m1", "A", 0, lease.epoch, 1, 0, 2)
    lease.in_flight[1] = 10**9  # in flight and acked, as a claim may leave it
    assert s.ack("m1", "A", 0, lease.epoch, 1, 0, 2) == 0
    assert 1 not in lease.in_flight


def test_a_queue_with_too_much_in_flight_gets_nothing_new() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    end = MAX_IN_FLIGHT_PER_QUEUE + 50
    total = 0
    for _ in range(400):
        got = deliver(s, "m1", 0, end=end, batch=4096)
        total += len(got.get(("A", 0), []))
    assert total == MAX_IN_FLIGHT_PER_QUEUE
    assert len(s.leases[("A", 0)].in_flight) == MAX_IN_FLIGHT_PER_QUEUE


# -- orderly -------------------------------------------------------------------------


def test_orderly_serves_a_queue_only_with_nothing_in_flight() -> None:
    s = state()
    join(s, "m1", 0, ALL_A, ORDERLY)
    assert deliver(s, "m1", 0, end=3)[("A", 0)] == [0, 1, 2]
    lease = s.leases[("A", 0)]
    assert ("A", 0) not in deliver(s, "m1", 10, end=6)
    s.ack("m1", "A", 0, lease.epoch, 0, 2, 6)
    assert ("A", 0) not in deliver(s, "m1", 20, end=6)  # 2 still in flight
    s.ack("m1", "A", 0, lease.epoch, 2, 0, 6)
    assert deliver(s, "m1", 30, end=6)[("A", 0)] == [3, 4, 5]


def test_orderly_nack_retries_in_place_after_the_delay() -> None:
    s = state()
    join(s, "m1", 0, ALL_A, ORDERLY)
    deliver(s, "m1", 0, end=4)
    lease = s.leases[("A", 0)]
    s.ack("m1", "A", 0, lease.epoch, 0, 0, 4)
    s.delivered(lease, 1)
    assert s.retry_in_place(lease, 1, 1000, 100) == 1
    assert lease.cursor == 1 and not lease.in_flight and lease.suspended_until_ms == 1100
    assert ("A", 0) not in deliver(s, "m1", 1099, end=4)
    assert deliver(s, "m1", 1100, end=4)[("A", 0)] == [1, 2, 3]  # again, in order
    assert lease.deliveries[1] == 2
    assert s.retry_in_place(lease, 1, 1000, 1200) == 2  # the count of in-place retries
    with pytest.raises(UnknownMessage):
        s.ack("m1", "A", 0, lease.epoch, 2, 0, 4)  # rewound: 2 is not delivered now


def test_orderly_delivers_again_from_the_frontier_once_the_ack_wait_passed() -> None:
    # a bug fixed: nothing acked (say the fetch's answer was lost) stalled the queue for
    # as long as its owner lived
    s = state()
    join(s, "m1", 0, ALL_A, ORDERLY)
    deliver(s, "m1", 0, end=3)
    lease = s.leases[("A", 0)]
    s.ack("m1", "A", 0, lease.epoch, 0, 0, 3)
    assert ("A", 0) not in deliver(s, "m1", ACK_WAIT_MS - 1, end=3)
    join(s, "m1", ACK_WAIT_MS - 1, ALL_A, ORDERLY)
    assert deliver(s, "m1", ACK_WAIT_MS, end=4)[("A", 0)] == [1, 2, 3]
    assert lease.deliveries == {1: 2, 2: 2, 3: 1}


# -- settings, leave -----------------------------------------------------------------


def test_settings_must_agree_with_the_live_members() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    with pytest.raises(GroupConflict, match="concurrent mode with strategy 'average'"):
        join(s, "m2", 0, ALL_A, ORDERLY)
    with pytest.raises(GroupConflict, match="same strategy and mode"):
        join(s, "m2", 0, ALL_A, Settings(strategy="consistent-hash"))
    with pytest.raises(GroupConflict, match="unknown allocation strategy 'x'"):
        join(s, "m1", 0, ALL_A, Settings(strategy="x"))
    assert "m2" not in s.members
    join(s, "m2", 0, ALL_A, Settings(max_reconsume=3, ack_wait_ms=100))  # the rest may differ
    assert s.settings.ack_wait_ms == 100
    s.leave("m2", 1)
    join(s, "m1", 2, ALL_A, ORDERLY)  # the only member may change the group's mode
    assert s.settings.orderly


def test_leave_moves_the_queues_at_once() -> None:
    s = state()
    join(s, "m1", 0, ALL_A)
    join(s, "m2", 0, ALL_A)
    deliver(s, "m1", 0, end=3)
    s.leave("m1", 10)
    assert "m1" not in s.members
    assert all(x.owner == "m2" for x in s.leases.values())
    assert s.leases[("A", 0)].cursor == 0  # redelivered to m2
    s.leave("m1", 20)  # again: nothing
    s.leave("m2", 30)
    assert all(x.owner is None for x in s.leases.values()) and s.members == {}
    assert not s.tick(40)


def test_read_values() -> None:
    s = state()
    join(s, "m1", 0, ALL_B)
    assert s.plan_fetch("m1", 9, 0) == [
        Read(RETRY, 0, s.leases[(RETRY, 0)].epoch, (), 0, 3),
        Read("B", 0, s.leases[("B", 0)].epoch, (), 0, 3),
        Read("B", 1, s.leases[("B", 1)].epoch, (), 0, 3),
    ]
