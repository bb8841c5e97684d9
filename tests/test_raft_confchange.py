"""Configuration changes (raft/confchange.py) on their own: the proposal rules,
the tracker's view of a membership, whom a new leader tracks."""

from __future__ import annotations

from typing import Any

import pytest

from raft.confchange import leader_peers, propose, tracker_config
from raft.errors import MembershipError
from raft.membership import ChangeOp, ConfChange, Member, Membership
from raft.tracker import TrackerConfig


def conf(*voters: int, learners: tuple[int, ...] = ()) -> Membership:
    return Membership.of(
        [*(Member(i) for i in voters), *(Member(i, learner=True) for i in learners)]
    )


def ask(current: Membership, change: ConfChange, **over: Any) -> Membership:
    kw: dict[str, Any] = {
        "pending": 0,
        "term_committed": True,
        "last_index": 100,
        "match": {p: 100 for p in current.ids},
        "max_promote_lag": 10,
    }
    kw.update(over)
    return propose(current, change, **kw)


ADD_4 = ConfChange(ChangeOp.ADD_LEARNER, 4, Member(4, "h4:1", "h4:2"))


def test_the_three_changes() -> None:
    base = conf(1, 2, 3)
    added = ask(base, ADD_4)
    assert added.voters == (1, 2, 3) and added.learners == (4,)
    assert added.get(4) == Member(4, "h4:1", "h4:2", learner=True)
    promoted = ask(added, ConfChange(ChangeOp.PROMOTE, 4))
    assert promoted.voters == (1, 2, 3, 4) and promoted.learners == ()
    removed = ask(promoted, ConfChange(ChangeOp.REMOVE, 2))
    assert removed.voters == (1, 3, 4)
    assert ask(added, ConfChange(ChangeOp.REMOVE, 4)) == base


def test_one_change_at_a_time() -> None:
    with pytest.raises(MembershipError, match=r"entry 7\) is not committed"):
        ask(conf(1, 2, 3), ADD_4, pending=7)


def test_not_before_a_commit_of_the_leaders_term() -> None:
    with pytest.raises(MembershipError, match="not committed an entry of its term"):
        ask(conf(1, 2, 3), ADD_4, term_committed=False)


def test_the_pending_change_is_named_before_the_term() -> None:
    with pytest.raises(MembershipError, match="entry 7"):
        ask(conf(1, 2, 3), ADD_4, pending=7, term_committed=False)


@pytest.mark.parametrize(
    ("current", "change", "complaint"),
    [
        (conf(1, 2, 3), ConfChange(ChangeOp.ADD_LEARNER, 2, Member(2)), "already a voter"),
        (conf(1, learners=(2,)), ConfChange(ChangeOp.ADD_LEARNER, 2, Member(2)), "a learner"),
        (conf(1, 2, 3), ConfChange(ChangeOp.PROMOTE, 4), "not a member"),
        (conf(1, 2, 3), ConfChange(ChangeOp.PROMOTE, 2), "a voter already"),
        (conf(1, 2, 3), ConfChange(ChangeOp.REMOVE, 9), "not a member"),
        (conf(1, learners=(2,)), ConfChange(ChangeOp.REMOVE, 1), "the last voter"),
    ],
)
def test_a_change_that_does_not_apply_is_refused(
    current: Membership, change: ConfChange, complaint: str
) -> None:
    with pytest.raises(MembershipError, match=complaint):
        ask(current, change)


def test_a_promotion_waits_for_the_learner_to_catch_up() -> None:
    current = conf(1, 2, 3, learners=(4,))
    promote = ConfChange(ChangeOp.PROMOTE, 4)
    assert ask(current, promote, match={4: 90}).voters == (1, 2, 3, 4)  # 10 behind: ok
    with pytest.raises(MembershipError, match="learner 4 is 11 entries behind"):
        ask(current, promote, match={4: 89})
    assert ask(current, promote, match={4: 0}, max_promote_lag=100).learners == ()
    # Only promotions look at the lag.
    assert ask(current, ConfChange(ChangeOp.REMOVE, 4), match={}).learners == ()


def test_the_tracker_config_of_a_membership() -> None:
    m = conf(1, 3, 5, learners=(2, 4))
    assert tracker_config(m, 3) == TrackerConfig(
        voters=(1, 3, 5), learners=(2, 4), others=(1, 2, 4, 5), vote_peers=(1, 5)
    )
    learner_view = tracker_config(m, 2)
    assert learner_view.others == (1, 3, 4, 5) and learner_view.vote_peers == (1, 3, 5)
    outsider = tracker_config(m, 9)  # a joining or removed node
    assert outsider.others == m.ids and outsider.vote_peers == m.voters


def test_whom_a_new_leader_tracks() -> None:
    assert leader_peers(2, conf(3, 1, 2), None) == [1, 2, 3]
    # The configuration in effect removes 3 and is not committed: 3 stays tracked.
    assert leader_peers(1, conf(1, 2), conf(1, 2, 3)) == [1, 2, 3]
    # A leader that removed itself tracks itself all the same.
    assert leader_peers(1, conf(2, 3), conf(1, 2, 3)) == [1, 2, 3]
    assert leader_peers(1, conf(2, 3, learners=(4,)), None) == [1, 2, 3, 4]
