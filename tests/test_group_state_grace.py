"""GroupState after an election (dledger_commitlog/messaging/group_state.py): for the
grace period a new leader grants no queue and serves no fetch, and adopts the queues
members claim in their heartbeats (with what they still have in flight; the claim of
the newer epoch wins); after it, the usual allocation, and a claimed queue planned
for another member is revoked like any other. The rules a review added are in
tests/test_group_state_progress.py.
"""

from __future__ import annotations

import pytest

from dledger_commitlog.messaging.group_state import Claim, StaleLease
from tests.group_state_helpers import ACK_WAIT_MS, ALL_A, ALL_AB, SESSION_MS, join, state, where

# -- the grace period after an election ----------------------------------------------


def test_no_grants_during_the_grace_period_then_the_usual_allocation() -> None:
    s = state(term=2, grace_until_ms=SESSION_MS)
    assert join(s, "m1", 0, ALL_A) == []
    assert s.plan_fetch("m1", 10, 100) == []
    assert not s.tick(SESSION_MS - 1)
    assert all(x.owner is None for x in s.leases.values())
    join(s, "m1", SESSION_MS - 1, ALL_A)
    assert s.tick(SESSION_MS)
    assert len(s.leases_of("m1")) == 5 and all(x.epoch > 2 << 32 for x in s.leases.values())


def test_claims_are_adopted_with_their_in_flight_offsets() -> None:
    old_epoch = (1 << 32) + 7
    s = state(term=2, grace_until_ms=SESSION_MS, committed={("A", 1): 3})
    claims = (
        Claim("A", 1, old_epoch, next_offset=10, in_flight=2, unacked_from=6),
        Claim("A", 2, old_epoch, next_offset=4, in_flight=0, unacked_from=4),
    )
    held = join(s, "m1", 100, ALL_A, claims=claims)
    assert held == [("A", 1), ("A", 2)]
    lease = s.leases[("A", 1)]
    # below 6 the member had acked all; [6, 10) it may still have (in flight, and it
    # does not say which of them it acked since)
    assert (lease.frontier, lease.cursor) == (6, 10)
    assert sorted(lease.in_flight) == [6, 7, 8, 9]
    assert set(lease.in_flight.values()) == {100 + ACK_WAIT_MS}
    assert lease.tenure_epoch == old_epoch and lease.epoch > 2 << 32
    assert s.ack("m1", "A", 1, old_epoch, 6, 8, 10) == 2  # its old epoch is still good
    assert s.ack("m1", "A", 1, lease.epoch, 8, 0, 10) == 1  # and the new one
    for never_held in (old_epoch - 1, old_epoch + 1, lease.epoch - 1, lease.epoch + 1):
        with pytest.raises(StaleLease):  # a bug fixed: all between the two were good
            s.ack("m1", "A", 1, never_held, 9, 0, 10)
    other = s.leases[("A", 2)]
    assert (other.frontier, other.cursor, other.in_flight) == (4, 4, {})
    assert s.unflushed() == [("A", 1, 9), ("A", 2, 4)]
    # nothing is served during grace (a newer claim may still come), then the adopted
    assert s.plan_fetch("m1", 10, 200) == []
    reads = {(r.topic, r.queue_id) for r in s.plan_fetch("m1", 10, SESSION_MS)}
    assert reads == {("A", 1), ("A", 2)}


def test_claims_of_a_settled_queue_or_after_grace_or_of_this_term_are_ignored() -> None:
    s = state(term=2, grace_until_ms=SESSION_MS)
    old = Claim("A", 0, (1 << 32) + 1, next_offset=5, in_flight=0, unacked_from=5)
    assert join(s, "m1", 0, ALL_A, claims=(old,)) == [("A", 0)]
    # a second claim of the same queue under the same epoch: the first stays
    assert join(s, "m2", 10, ALL_A, claims=(old,)) == []
    assert s.leases[("A", 0)].owner == "m1"
    # a claim with an epoch this leader gave
    mine = Claim("A", 3, (2 << 32) + 10**6, next_offset=5, in_flight=0, unacked_from=5)
    assert ("A", 3) not in join(s, "m2", 20, ALL_A, claims=(mine,))
    # after grace
    late = Claim("B", 0, (1 << 32) + 1, next_offset=5, in_flight=0, unacked_from=5)
    join(s, "m1", SESSION_MS, ALL_AB, claims=(late,))
    assert s.leases[("B", 0)].frontier == 0


def test_the_newest_claim_of_a_queue_wins() -> None:
    s = state(term=3, grace_until_ms=SESSION_MS)
    stale = Claim("A", 0, (1 << 32) + 5, next_offset=4, in_flight=2, unacked_from=2)
    newer = Claim("A", 0, (2 << 32) + 1, next_offset=9, in_flight=1, unacked_from=8)
    join(s, "m1", 0, ALL_A, claims=(stale,))
    join(s, "m2", 10, ALL_A, claims=(newer,))
    assert s.leases[("A", 0)].owner == "m2"


def test_claimed_queue_planned_elsewhere_is_revoked_like_any_other() -> None:
    s = state(term=2, grace_until_ms=SESSION_MS)
    join(s, "m2", 0, ALL_A)
    claim = Claim("A", 0, (1 << 32) + 1, next_offset=3, in_flight=1, unacked_from=2)
    join(s, "m1", 10, ALL_A, claims=(claim,))  # the plan gives A/0 to m1: kept
    claim3 = Claim("A", 3, (1 << 32) + 2, next_offset=3, in_flight=1, unacked_from=2)
    join(s, "m1", 20, ALL_A, claims=(claim3,))  # A/3 is m2's in the plan
    lease = s.leases[("A", 3)]
    assert where(lease)[:2] == ("m1", None)  # nothing moves in the grace period
    join(s, "m1", SESSION_MS, ALL_A)
    assert where(lease)[:2] == ("m1", "m2")  # then it is revoked
    for now in range(SESSION_MS + 1000, ACK_WAIT_MS + 20, 1000):
        join(s, "m1", now, ALL_A)
        join(s, "m2", now, ALL_A)
        assert lease.owner == "m1", now
    join(s, "m1", 20 + ACK_WAIT_MS, ALL_A)
    join(s, "m2", 20 + ACK_WAIT_MS, ALL_A)
    assert lease.owner == "m2" and lease.cursor == 2
