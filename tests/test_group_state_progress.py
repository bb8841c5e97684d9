"""GroupState: the rules a review of the coordinator added (each failed before its fix).

- the grace period after an election moves nothing, so the newer claim of a queue
  still wins after another member joined;
- an orderly run that makes progress (its acks) does not expire under its member;
- a message whose ack wait ran out more than `max_reconsume` times is handed to the
  caller to dead-letter (`poisoned`), never delivered again;
- retention skipping a queue's head forgets what it knew of the offsets skipped.
"""

from __future__ import annotations

from dledger_commitlog.messaging.group_state import Claim, Settings
from tests.group_state_helpers import (
    ACK_WAIT_MS,
    ALL_A,
    CONCURRENT,
    ORDERLY,
    SESSION_MS,
    deliver,
    join,
    state,
)

OLD, NEWER = (1 << 32) + 5, (1 << 32) + 9  # epochs of the old leader's term


def test_nothing_moves_in_the_grace_period_and_the_newer_claim_still_wins() -> None:
    s = state(term=2, grace_until_ms=SESSION_MS)
    # z lost A/0 before the election (older epoch); c holds it (newer epoch)
    join(s, "z", 0, ALL_A, claims=(Claim("A", 0, OLD, 10, 0, 10),))
    join(s, "a", 10, ALL_A)  # the plan may give A/0 to a: not in the grace period
    assert s.leases[("A", 0)].owner == "z"
    join(s, "c", 20, ALL_A, claims=(Claim("A", 0, NEWER, 15, 3, 12),))
    lease = s.leases[("A", 0)]
    assert lease.owner == "c" and lease.tenure_epoch == NEWER
    assert sorted(lease.in_flight) == [12, 13, 14]  # c's run, in flight here too
    assert s.plan_fetch("a", 32, 30) == []  # nothing served in the grace period


def test_an_orderly_run_that_acks_does_not_expire_under_its_member() -> None:
    s = state()
    join(s, "b", 0, ALL_A, ORDERLY)
    (offsets,) = [o for ref, o in deliver(s, "b", 0, end=8, batch=8).items() if ref == ("A", 0)]
    epoch = s.leases[("A", 0)].epoch
    # the run advances slowly: one ack per ack wait - 1 s, well past the first deadline
    now = 0
    for offset in offsets[:-1]:
        now += ACK_WAIT_MS - 1000
        assert s.ack("b", "A", 0, epoch, offset, 0, 8, now) == 1
        assert s.plan_fetch("b", 8, now) == [] or all(
            r.queue_id != 0 or r.topic != "A" for r in s.plan_fetch("b", 8, now)
        ), "the rest of the run is not delivered again while it advances"
    join(s, "a", now, ALL_A, ORDERLY)  # a joins: A/0 must not move under b's run
    lease = s.leases[("A", 0)]
    assert lease.owner == "b" and lease.in_flight == {offsets[-1]: now + ACK_WAIT_MS}


def test_a_message_past_its_ack_wait_too_often_is_poisoned_not_delivered_again() -> None:
    s = state()
    settings = Settings(max_reconsume=2, ack_wait_ms=ACK_WAIT_MS)
    join(s, "m", 0, ALL_A, settings)
    now = 0
    for n in range(3):  # delivered 3 times = max_reconsume + 1, never acked
        got = deliver(s, "m", now, end=1)
        assert got.get(("A", 0)) == [0], n
        now += ACK_WAIT_MS
        join(s, "m", now, ALL_A, settings)
    poisoned = s.poisoned(now)  # offset 0 of every queue the member holds
    assert sorted((x.ref, o) for x, o in poisoned) == sorted((ref, 0) for ref in s.leases)
    assert deliver(s, "m", now, end=1) == {}  # none of them a fourth time
    for lease, offset in poisoned:
        lease.mark_acked(offset)  # what the service does once the dead letter is put
    assert s.poisoned(now) == [] and s.leases[("A", 0)].frontier == 1


def test_orderly_mode_poisons_nothing() -> None:
    s = state()
    join(s, "m", 0, ALL_A, ORDERLY)
    deliver(s, "m", 0, end=1)
    assert s.poisoned(10 * ACK_WAIT_MS) == []  # in place: its retries count there


def test_retention_skipping_the_head_forgets_its_bookkeeping() -> None:
    s = state()
    join(s, "m", 0, ALL_A, CONCURRENT)
    deliver(s, "m", 0, end=6)
    lease = s.leases[("A", 0)]
    epoch = lease.epoch
    s.ack("m", "A", 0, epoch, 4, 0, 6)
    lease.skip_below(3)
    assert lease.frontier == 3 and min(lease.deliveries) >= 3
    assert all(o >= 3 for o in lease.in_flight)
