"""The leader's ring of recent delivery events (messaging/deliveries.py), in memory.

A run of consecutive offsets is one event that answers for each of them; an ack of
a range likewise; a full ring drops its oldest and says from when it still knows
everything; a new leadership forgets all; past `max_groups` the least recently
written group is dropped and a group without a ring is known only from then.
"""

from __future__ import annotations

from dledger_commitlog.messaging.deliveries import DeliveryLog


def test_a_run_and_an_ack_answer_for_each_offset_they_cover() -> None:
    log = DeliveryLog(now_ms=1000)
    log.delivered("g", "m1", "t", 0, [5, 6, 7], [1, 2, 1])
    log.acked("g", "m1", "t", 0, 5, 7)
    log.nacked("g", "m1", "t", 0, 7, "retry", 3, 2000)
    assert [e.kind for e in log.events("g", "t", 0, 6)] == ["delivered", "acked"]
    [delivered, nacked] = log.events("g", "t", 0, 7)
    assert delivered.offsets == range(5, 8) and delivered.counts == (1, 2, 1)
    assert (nacked.outcome, nacked.delay_level, nacked.time_ms) == ("retry", 3, 2000)
    assert log.events("g", "t", 1, 6) == [] and log.events("other", "t", 0, 6) == []
    log.delivered("g", "m1", "t", 0, [9, 11], [1, 1])
    assert log.events("g", "t", 0, 10) == [] and log.events("g", "t", 0, 11)[0].offsets == (9, 11)


def test_a_full_ring_and_a_new_leadership_say_from_when_they_know() -> None:
    log = DeliveryLog(per_group=2, max_groups=2, now_ms=1000)
    assert log.history_since_ms("g") == 1000
    for offset in range(3):
        log.nacked("g", "m", "t", 0, offset, "retry", 1, 2000 + offset)
    assert log.events("g", "t", 0, 0) == []  # dropped
    assert log.history_since_ms("g") == 2001  # the oldest kept is from 2001
    log.nacked("h", "m", "t", 0, 0, "retry", 1, 3000)
    log.nacked("k", "m", "t", 0, 0, "retry", 1, 4000)  # a third group: "g" is dropped
    assert log.events("g", "t", 0, 2) == [] and log.history_since_ms("g") == 4000
    assert log.history_since_ms("h") == 1000
    log.reset(5000)
    assert log.events("h", "t", 0, 0) == [] and log.history_since_ms("h") == 5000
