"""Unit tests of the small pieces: quorum arithmetic, storage, progress, log."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raft import Compacted, Config, Entry, MemoryStorage, Unavailable
from raft.log import RaftLog
from raft.membership import Membership
from raft.progress import Inflights, Progress, ProgressState
from raft.quorum import VoteResult, committed_index, has_quorum, majority, vote_result
from tests.sim.harness import entries

_BOOT = (0, Membership.voters_only([1]), b"")


def test_majority() -> None:
    assert [majority(range(n)) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_committed_index_is_the_quorum_match() -> None:
    assert committed_index((1, 2, 3), {1: 5, 2: 3, 3: 1}) == 3
    assert committed_index((1, 2, 3, 4, 5), {1: 9, 2: 9, 3: 2}) == 2
    assert committed_index((1, 2, 3), {}) == 0


@given(st.lists(st.integers(0, 100), min_size=1, max_size=7))
def test_committed_index_is_held_by_a_majority(matches: list[int]) -> None:
    voters = range(len(matches))
    c = committed_index(voters, dict(enumerate(matches)))
    assert sum(m >= c for m in matches) >= majority(voters)
    assert sum(m > c for m in matches) < majority(voters)


def test_vote_result() -> None:
    v = (1, 2, 3)
    assert vote_result(v, {1: True}) is VoteResult.PENDING
    assert vote_result(v, {1: True, 2: True}) is VoteResult.WON
    assert vote_result(v, {1: True, 2: False, 3: False}) is VoteResult.LOST
    assert vote_result((1, 2, 3, 4, 5), {1: True, 2: False, 3: False}) is VoteResult.PENDING
    assert has_quorum(v, [1, 3, 9]) and not has_quorum(v, [1, 9])


def test_only_voters_make_a_quorum() -> None:
    """Matches, votes and acks of non-voters (learners, removed members) never count."""
    v = (1, 2, 3)
    assert committed_index(v, {1: 9, 4: 9, 5: 9, 2: 1}) == 1
    assert vote_result(v, {1: True, 4: True, 5: True}) is VoteResult.PENDING
    assert vote_result(v, {2: False, 3: False, 4: True}) is VoteResult.LOST
    assert not has_quorum(v, [1, 4, 5, 6])
    assert has_quorum(v, [2, 2, 3])  # each voter counts once
    assert not has_quorum((1, 2), [1, 1])
    assert vote_result((1,), {1: True}) is VoteResult.WON
    assert vote_result((1, 2), {1: True, 2: False}) is VoteResult.LOST


def test_memory_storage_reads_and_limits() -> None:
    s = MemoryStorage()
    assert (s.first_index(), s.last_index(), s.term(0)) == (1, 0, 0)
    s.append([Entry(i, 1, b"x" * 10) for i in range(1, 11)])
    assert [e.index for e in s.entries(2, 6, 1000)] == [2, 3, 4, 5]
    assert [e.index for e in s.entries(2, 6, 25)] == [2, 3]
    assert [e.index for e in s.entries(2, 6, 5)] == [2], "at least one entry"
    with pytest.raises(Unavailable):
        s.term(11)
    s.append([Entry(4, 2, b"y")])  # conflict truncation
    assert s.last_index() == 4 and s.term(4) == 2
    assert [e.index for e in s.entries(1, 5, 21)] == [1, 2]
    s.compact(2)
    assert s.first_index() == 3 and s.term(2) == 1
    with pytest.raises(Compacted):
        s.term(1)
    assert [e.index for e in s.entries(3, 5, 11)] == [3, 4]


def test_inflights_bounds_and_release() -> None:
    f = Inflights(max_msgs=3, max_bytes=100)
    f.add(5, 10)
    f.add(8, 10)
    assert not f.full()
    f.add(9, 90)
    assert f.full() and len(f) == 3
    f.free_le(8)
    assert len(f) == 1 and f.bytes == 90 and not f.full()
    f.free_first_one()
    assert len(f) == 0 and f.bytes == 0


def test_progress_probe_and_replicate() -> None:
    pr = Progress(next_index=11, max_msgs=2, max_bytes=1000)
    assert pr.state is ProgressState.PROBE and not pr.is_paused()
    pr.sent_entries(12, 2, 10)
    assert pr.is_paused()
    assert not pr.maybe_decr_to(rejected=5, match_hint=3), "stale rejection"
    assert pr.maybe_decr_to(rejected=10, match_hint=3)
    assert pr.next == 4 and not pr.is_paused()
    assert pr.maybe_update(7)
    pr.become_replicate()
    assert pr.next == 8
    pr.sent_entries(9, 2, 10)
    pr.sent_entries(11, 2, 10)
    assert pr.next == 12 and pr.is_paused()
    assert not pr.maybe_decr_to(rejected=6, match_hint=0)
    assert pr.maybe_decr_to(rejected=9, match_hint=0) and pr.next == 8


def test_raft_log_combines_stable_and_unstable() -> None:
    storage = MemoryStorage(entries(1, 1, 2))
    log = RaftLog(storage, committed=2, applied=0, conf_base=_BOOT)
    log.append(entries(2, 3, start=4))
    assert log.last_index() == 5 and log.stable_index() == 3
    assert [e.index for e in log.entries(2, 6, 1 << 30)] == [2, 3, 4, 5]
    assert log.find_conflict_by_term(5, 2) == (4, 2)
    assert log.find_conflict_by_term(5, 1) == (2, 1)
    assert log.find_conflict_by_term(5, 0) == (0, 0)
    assert log.is_up_to_date(5, 3) and not log.is_up_to_date(9, 2)
    assert log.maybe_append(3, 1, entries(9, start=4)) is None, "prev term mismatch"
    assert log.maybe_append(3, 2, entries(2, 4, start=4)) == 5
    assert [e.term for e in log.entries(1, 6, 1 << 30)] == [1, 1, 2, 2, 4]
    assert log.stable_to(entries(2, 4, start=4)) and log.stable_index() == 3  # not written
    with pytest.raises(AssertionError):
        log.append(entries(7, start=2))  # below the commit index


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        Config(id=4, peers=(1, 2, 3))
    with pytest.raises(ValueError):
        Config(id=1, peers=(1, 2, 3), election_ticks=1, heartbeat_ticks=1)
    with pytest.raises(ValueError):
        Config(id=1, peers=(1, 2, 3), preferred_leader=7)
