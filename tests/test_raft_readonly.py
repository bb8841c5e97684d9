"""A leader's ReadIndex queues (raft/readonly.py) on their own."""

from __future__ import annotations

from raft.readonly import ReadOnly

VOTERS = (1, 2, 3)


def test_a_read_is_confirmed_by_a_quorum_of_acks() -> None:
    ro = ReadOnly()
    assert ro.add(b"a", 5, requester=1, self_id=1)
    assert len(ro) == 1 and ro.last_ctx() == b"a"
    assert ro.recv_ack(4, b"a", VOTERS) == []  # a learner's ack is no quorum
    [req] = ro.recv_ack(2, b"a", VOTERS)
    assert (req.ctx, req.index, req.requester) == (b"a", 5, 1)
    assert len(ro) == 0 and ro.last_ctx() == b""


def test_an_ack_releases_every_earlier_read_in_order() -> None:
    ro = ReadOnly()
    for k, ctx in enumerate((b"a", b"b", b"c")):
        assert ro.add(ctx, 10 + k, requester=2 + k, self_id=1)
    assert ro.last_ctx() == b"c"
    released = ro.recv_ack(3, b"b", VOTERS)
    assert [(r.ctx, r.index, r.requester) for r in released] == [(b"a", 10, 2), (b"b", 11, 3)]
    assert len(ro) == 1 and ro.last_ctx() == b"c"
    assert ro.recv_ack(3, b"a", VOTERS) == []  # already answered


def test_acks_accumulate_and_an_unknown_ctx_is_ignored() -> None:
    ro = ReadOnly()
    ro.add(b"x", 3, requester=1, self_id=1)
    five = (1, 2, 3, 4, 5)
    assert ro.recv_ack(2, b"x", five) == []
    assert ro.recv_ack(2, b"x", five) == []  # the same voter twice is one ack
    assert ro.recv_ack(9, b"nope", five) == []
    assert [r.ctx for r in ro.recv_ack(4, b"x", five)] == [b"x"]


def test_the_first_request_for_a_ctx_wins() -> None:
    ro = ReadOnly()
    assert ro.add(b"a", 5, requester=1, self_id=1)
    assert not ro.add(b"a", 8, requester=3, self_id=1)
    [req] = ro.recv_ack(2, b"a", VOTERS)
    assert (req.index, req.requester) == (5, 1)


def test_held_reads_come_back_in_order_once() -> None:
    ro = ReadOnly()
    ro.hold(b"a", 2)
    ro.hold(b"b", 1)
    assert len(ro) == 0  # held reads wait for no ack yet
    assert ro.take_held() == [(b"a", 2), (b"b", 1)]
    assert ro.take_held() == []


def test_reset_forgets_held_and_queued_reads() -> None:
    ro = ReadOnly()
    ro.hold(b"h", 2)
    ro.add(b"q", 4, requester=1, self_id=1)
    ro.reset()
    assert len(ro) == 0 and ro.last_ctx() == b"" and ro.take_held() == []
    assert ro.recv_ack(2, b"q", VOTERS) == []
