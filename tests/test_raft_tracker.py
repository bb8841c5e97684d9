"""The `ProgressTracker` (raft/tracker.py) on its own: configuration, progress, votes."""

from __future__ import annotations

from raft.confchange import tracker_config
from raft.membership import Member, Membership
from raft.progress import ProgressState
from raft.quorum import VoteResult
from raft.tracker import ProgressTracker, TrackerConfig


def conf(*voters: int, learners: tuple[int, ...] = ()) -> Membership:
    return Membership.of(
        [*(Member(i) for i in voters), *(Member(i, learner=True) for i in learners)]
    )


def tracker(me: int, membership: Membership) -> ProgressTracker:
    trk = ProgressTracker(me, max_inflight_msgs=4, max_inflight_bytes=1 << 20)
    trk.set_config(tracker_config(membership, me))
    return trk


def test_the_configuration_views() -> None:
    trk = tracker(2, conf(1, 2, 3, learners=(4,)))
    assert trk.voters == (1, 2, 3)
    assert trk.learners == (4,)
    assert trk.others == (1, 3, 4)
    assert trk.vote_peers == (1, 3)
    assert not trk.is_sole_voter()
    assert tracker(1, conf(1, learners=(2,))).is_sole_voter()
    assert not tracker(2, conf(1, learners=(2,))).is_sole_voter()


def test_votes_count_only_voters() -> None:
    trk = tracker(1, conf(1, 2, 3, learners=(4, 5)))
    trk.record_vote(1, True)
    assert trk.tally_votes() is VoteResult.PENDING
    trk.record_vote(4, True)
    trk.record_vote(5, True)
    assert trk.tally_votes() is VoteResult.PENDING  # learners' grants do not count
    trk.record_vote(2, False)
    assert trk.tally_votes() is VoteResult.PENDING
    trk.record_vote(3, True)
    assert trk.tally_votes() is VoteResult.WON


def test_a_lost_election_and_the_last_answer_counts() -> None:
    trk = tracker(1, conf(1, 2, 3))
    trk.record_vote(1, True)
    trk.record_vote(2, False)
    trk.record_vote(3, False)
    assert trk.tally_votes() is VoteResult.LOST
    trk.record_vote(3, True)  # a voter's later answer replaces its earlier one
    assert trk.tally_votes() is VoteResult.WON
    trk.reset_votes()
    assert trk.votes == {}
    assert trk.tally_votes() is VoteResult.PENDING


def test_start_leading_tracks_peers_in_id_order() -> None:
    trk = tracker(2, conf(1, 2, 3))
    me = trk.start_leading([3, 2, 1, 7], next_index=5)
    assert list(trk.progress) == [1, 2, 3, 7]
    assert trk.progress[2] is me
    assert trk.replicas == (1, 3, 7)
    assert all(pr.next == 5 and pr.match == 0 for pr in trk.progress.values())
    assert all(
        pr.state is ProgressState.PROBE and not pr.recent_active for pr in trk.progress.values()
    )
    assert trk.progress[1].inflights.max_msgs == 4


def test_reset_forgets_progress_and_votes_not_the_configuration() -> None:
    trk = tracker(1, conf(1, 2, 3))
    trk.start_leading([1, 2, 3], next_index=1)
    trk.record_vote(2, True)
    trk.reset()
    assert trk.progress == {} and trk.votes == {} and trk.replicas == ()
    assert trk.voters == (1, 2, 3)


def test_new_members_are_tracked_as_active_and_appended_in_order() -> None:
    trk = tracker(1, conf(1, 3))
    trk.start_leading([1, 3], next_index=4)
    trk.set_config(tracker_config(conf(1, 3, learners=(2,)), 1))
    assert list(trk.replicas) == [3]  # set_config alone does not touch the progress
    trk.track_new_members(next_index=9)
    assert list(trk.replicas) == [3, 2]  # the order of tracking: the order a leader sends in
    assert trk.progress[2].next == 9 and trk.progress[2].recent_active
    assert not trk.progress[3].recent_active
    trk.progress[3].recent_active = True
    trk.track_new_members(next_index=11)  # nothing new: nobody is reset
    assert trk.progress[2].next == 9 and trk.progress[3].recent_active


def test_removed_members_are_untracked_with_their_match() -> None:
    trk = tracker(1, conf(1, 2, 3, learners=(4,)))
    trk.start_leading([1, 2, 3, 4], next_index=1)
    trk.progress[3].maybe_update(6)
    trk.set_config(tracker_config(conf(1, 2), 1))
    assert trk.has_removed()
    assert list(trk.replicas) == [2, 3, 4]  # until the leader drops them
    assert trk.untrack_removed() == [(3, 6), (4, 0)]
    assert list(trk.replicas) == [2] and not trk.has_removed()
    assert trk.untrack_removed() == []


def test_a_removed_leader_keeps_its_own_progress() -> None:
    trk = tracker(1, conf(1, 2, 3))
    trk.start_leading([1, 2, 3], next_index=1)
    trk.set_config(tracker_config(conf(2, 3), 1))
    assert trk.others == (2, 3) and trk.vote_peers == (2, 3)
    assert trk.untrack_removed() == []
    assert list(trk.progress) == [1, 2, 3]


def test_match_indexes() -> None:
    trk = tracker(1, conf(1, 2, 3))
    trk.start_leading([1, 2, 3], next_index=1)
    trk.progress[1].maybe_update(5)
    trk.progress[3].maybe_update(2)
    assert trk.match_indexes() == {1: 5, 2: 0, 3: 2}


def test_quorum_active_counts_voters_heard_from() -> None:
    trk = tracker(1, conf(1, 2, 3, learners=(4, 5)))
    trk.start_leading([1, 2, 3, 4, 5], next_index=1)
    trk.progress[1].recent_active = True
    assert not trk.quorum_active()
    trk.progress[4].recent_active = trk.progress[5].recent_active = True
    assert not trk.quorum_active()  # learners are no quorum
    trk.progress[3].recent_active = True
    assert trk.quorum_active()
    trk.reset_recent_active()
    assert trk.progress[1].recent_active  # the leader always hears from itself
    assert not any(trk.progress[p].recent_active for p in (2, 3, 4, 5))
    assert not trk.quorum_active()


def test_an_empty_config_until_set() -> None:
    trk = ProgressTracker(1, 1, 1)
    assert trk.config == TrackerConfig()
    assert trk.voters == () and trk.replicas == ()
