"""Replication: batching, the pipelined window, fast backtracking, truncation,
the commit rules, the Ready contract and restarts."""

from __future__ import annotations

import random
from typing import Any

import pytest

from raft import (
    AppendEntries,
    AppendResponse,
    Config,
    Entry,
    HardState,
    MemoryStorage,
    ProposalDropped,
    RaftCore,
    RequestVote,
    Role,
    VoteResponse,
)
from tests.sim.harness import Cluster, entries


def elected(n: int = 3, **overrides: Any) -> Cluster:
    c = Cluster(n, **overrides)
    c.campaign(1)
    assert c.core(1).role is Role.LEADER
    return c


def appends_to(c: Cluster, dst: int) -> list[AppendEntries]:
    return [m for m in c.mailbox if isinstance(m, AppendEntries) and m.dst == dst]


def test_batch_propose_returns_the_index_range() -> None:
    c = elected()
    assert c.propose(1, b"a", b"b", b"c") == (2, 4)
    assert c.core(1).propose(b"d") == (5, 5)
    with pytest.raises(ProposalDropped):
        c.core(1).propose([])
    c.stabilize()
    assert c.applied_data(2) == [b"a", b"b", b"c", b"d"]


def test_many_proposals_go_out_as_one_append_per_follower() -> None:
    c = elected()
    for k in range(10):
        c.propose(1, b"%d" % k)
    c.process_ready(1)
    msgs = appends_to(c, 2)
    assert len(msgs) == 1 and len(msgs[0].entries) == 10


def test_appends_are_batched_by_count_and_bytes() -> None:
    c = elected(max_append_entries=4, max_append_bytes=10, max_inflight_msgs=100)
    c.propose(1, *[b"x" * 3 for _ in range(12)])  # 36 bytes
    c.process_ready(1)
    msgs = appends_to(c, 2)
    assert all(len(m.entries) <= 4 for m in msgs)
    assert all(sum(len(e.data) for e in m.entries) <= 10 for m in msgs)
    assert sum(len(m.entries) for m in msgs) == 12
    c.propose(1, b"y" * 50)  # one entry larger than the limit still goes alone
    c.process_ready(1)
    assert [len(m.entries) for m in appends_to(c, 2)][-1] == 1


def test_pipelined_window_is_bounded_by_count() -> None:
    c = elected(max_append_entries=1, max_inflight_msgs=3)
    c.propose(1, *[b"%d" % k for k in range(10)])
    c.process_ready(1)
    assert len(appends_to(c, 2)) == 3, "three appends in flight, no more"
    assert c.core(1).progress[2].next == 5
    c.stabilize()
    assert c.applied_data(2) == [b"%d" % k for k in range(10)]


def test_pipelined_window_is_bounded_by_bytes() -> None:
    c = elected(max_append_entries=1, max_append_bytes=100, max_inflight_bytes=250)
    c.propose(1, *[b"z" * 100 for _ in range(10)])
    c.process_ready(1)
    assert len(appends_to(c, 2)) == 3  # 300 bytes: the third fills the window past 250
    c.stabilize()
    assert len(c.applied_data(3)) == 10


def test_window_reopens_when_appends_are_lost() -> None:
    c = elected(max_append_entries=1, max_inflight_msgs=2)
    c.propose(1, *[b"%d" % k for k in range(6)])
    c.process_ready(1)
    c.deliver(drop=lambda m: isinstance(m, AppendEntries) and m.dst == 2)
    c.stabilize()
    assert c.core(2).last_index == 1
    c.tick_all(3)  # heartbeat responses free the stuck window and reveal the gap
    assert c.applied_data(2) == [b"%d" % k for k in range(6)]


def test_fast_backtracking_skips_a_whole_divergent_term() -> None:
    # Node 1 (leader of term 4) and node 3 share 5 entries of term 1; node 3 has 50 of term 2.
    logs = {1: entries(*[1] * 5, *[3] * 30), 2: entries(*[1] * 5, *[3] * 30)}
    logs[3] = entries(*[1] * 5, *[2] * 50)
    hs = {i: HardState(term=3, commit=5) for i in (1, 2, 3)}
    c = Cluster(3, logs=logs, hard_states=hs, max_append_entries=100)
    c.campaign(1)
    c.stabilize()
    rejects = [m for m in c.sent if isinstance(m, AppendResponse) and m.reject and m.src == 3]
    assert 1 <= len(rejects) <= 2, rejects
    assert c.log_terms(3) == c.log_terms(1)
    assert c.core(3).commit_index == c.core(1).commit_index == 36  # with the no-op


def test_follower_with_short_log_hints_its_last_index() -> None:
    logs = {1: entries(*[1] * 40), 2: entries(*[1] * 40), 3: entries(1, 1)}
    hs = {i: HardState(term=1, commit=2) for i in (1, 2, 3)}
    c = Cluster(3, logs=logs, hard_states=hs)
    c.campaign(1)
    rejects = [m for m in c.sent if isinstance(m, AppendResponse) and m.reject and m.src == 3]
    assert len(rejects) == 1 and rejects[0].hint_index == 2
    assert c.core(3).last_index == 41


def test_follower_truncates_a_conflicting_suffix_even_if_unpersisted() -> None:
    core = RaftCore(Config(id=3, peers=(1, 2, 3)), MemoryStorage(), rng=random.Random(0))
    core.step(AppendEntries(1, 3, 1, 0, 0, tuple(entries(1, 1, 1, 1, 1)), 0))
    assert core.last_index == 5  # still unstable: no ready() yet
    core.step(AppendEntries(2, 3, 2, 2, 1, (Entry(3, 2, b"new"),), 0))
    assert [e.term for e in core.log_slice(1, core.last_index + 1)] == [1, 1, 2]
    rd = core.ready()
    assert [(e.index, e.term) for e in rd.entries] == [(1, 1), (2, 1), (3, 2)]


def test_entries_replaced_while_being_persisted_are_handed_out_again() -> None:
    storage = MemoryStorage()
    core = RaftCore(Config(id=3, peers=(1, 2, 3)), storage, rng=random.Random(0))
    core.step(AppendEntries(1, 3, 1, 0, 0, tuple(entries(1, 1, 1, 1)), 0))
    rd = core.ready()  # the disk write of 1-4 (term 1) is in progress ...
    core.step(AppendEntries(2, 3, 2, 2, 1, (Entry(3, 2, b"new"),), 0))  # ... 3-4 replaced
    storage.append(rd.entries)
    core.advance(rd)
    rd = core.ready()
    assert rd.entries == (Entry(3, 2, b"new"),), "1-2 are stable; only the new entry is written"
    storage.append(rd.entries)
    core.advance(rd)
    assert [e.term for e in storage.all_entries()] == [1, 1, 2]


def test_follower_commit_is_capped_by_the_last_matching_entry() -> None:
    storage = MemoryStorage(entries(1, 1, 1))
    core = RaftCore(Config(id=3, peers=(1, 2, 3)), storage, HardState(term=1), rng=random.Random(0))
    # A term-2 leader matches index 1 only; entries 2-3 of node 3 are not yet confirmed.
    core.step(AppendEntries(1, 3, 2, 1, 1, (), 3))
    assert core.commit_index == 1


def test_duplicate_and_stale_appends_do_not_truncate() -> None:
    c = elected()
    c.propose(1, b"a", b"b")
    c.process_ready(1)
    stale = appends_to(c, 2)[0]
    c.stabilize()
    c.propose(1, b"c")
    c.stabilize()
    c.core(2).step(stale)
    assert c.core(2).last_index == 4
    c.stabilize()
    assert c.applied_data(2) == [b"a", b"b", b"c"]


def test_leader_counts_itself_only_after_persisting() -> None:
    c = elected()
    leader = c.core(1)
    c.propose(1, b"a")
    rd = leader.ready()
    assert leader.progress[1].match == 1
    c.nodes[1].storage.append(rd.entries)  # the driver persists, then advances
    leader.advance(rd)
    assert leader.progress[1].match == 2


def test_ready_carries_the_vote_with_the_request_and_the_entries_with_the_ack() -> None:
    core = RaftCore(Config(id=2, peers=(1, 2, 3)), MemoryStorage(), rng=random.Random(0))
    core.step(RequestVote(1, 2, 1, 0, 0))
    rd = core.ready()
    assert rd.hard_state == HardState(term=1, vote=1, commit=0)
    assert rd.messages == (VoteResponse(2, 1, 1, True),)
    core.advance(rd)
    core.step(AppendEntries(1, 2, 1, 0, 0, (Entry(1, 1, b"x"),), 0))
    rd = core.ready()
    assert rd.entries == (Entry(1, 1, b"x"),)
    assert rd.messages == (AppendResponse(2, 1, 1, 1),)
    assert not rd.committed_entries, "nothing is applied before it is committed"
    core.advance(rd)
    assert not core.has_ready()


def test_ready_must_be_advanced_before_the_next() -> None:
    core = RaftCore(Config(id=1, peers=(1, 2, 3)), MemoryStorage(), rng=random.Random(0))
    core.step(RequestVote(2, 1, 1, 0, 0))
    core.ready()
    with pytest.raises(AssertionError):
        core.ready()


def test_restart_keeps_term_vote_commit_and_log() -> None:
    c = elected()
    c.propose(1, b"a", b"b")
    c.stabilize()
    before = c.core(2).hard_state
    c.crash(2)
    c.restart(2)
    core = c.core(2)
    assert core.hard_state == before
    assert core.commit_index == 3 and core.applied == 0
    c.tick_all(2)
    assert c.applied_data(2) == [b"a", b"b"], "re-applied from the start after restart"


def test_single_node_cluster_commits_alone() -> None:
    c = Cluster(1)
    c.campaign(1)
    assert c.core(1).role is Role.LEADER
    c.propose(1, b"solo")
    c.stabilize()
    assert c.applied_data(1) == [b"solo"]


def test_leader_progress_view_reports_match_and_next() -> None:
    c = elected()
    c.propose(1, b"a")
    c.stabilize()
    prog = c.core(1).progress
    assert {p: (v.match, v.next) for p, v in prog.items()} == {1: (2, 3), 2: (2, 3), 3: (2, 3)}
    assert c.core(2).progress == {}


def test_a_commit_only_append_is_quiet_and_not_answered() -> None:
    """The commit reaches a replicating follower in an entry-less append that it
    does not answer: the acks of the entries before it said all there is."""
    c = elected()
    c.propose(1, b"x")
    c.process_ready(1)
    c.deliver()  # the entry to the followers
    c.process_all()
    c.deliver()  # their acks: the leader commits
    c.process_ready(1)
    (notice,) = appends_to(c, 2)
    assert notice.entries == () and notice.quiet and notice.commit == 2
    c.deliver(lambda m: isinstance(m, AppendEntries))
    c.process_all()
    assert c.core(2).commit_index == 2
    assert not [m for m in c.mailbox if isinstance(m, AppendResponse)]
    c.stabilize()
    assert c.applied_data(2) == c.applied_data(3) == [b"x"]


def test_an_append_carrying_entries_or_probing_is_never_quiet() -> None:
    c = elected(max_append_entries=1, max_inflight_msgs=2)
    c.propose(1, b"a", b"b", b"c")
    c.process_ready(1)
    assert [m.quiet for m in appends_to(c, 2)] == [False, False]
    # Lose them all: the heartbeat response reveals the lag and the leader probes
    # with an empty append that must be answered.
    c.deliver(drop=lambda m: isinstance(m, AppendEntries) and m.dst == 2)
    c.stabilize()
    sent_before = len(c.sent)
    c.tick_all(3)
    probes = [m for m in c.sent[sent_before:] if isinstance(m, AppendEntries) and m.dst == 2]
    assert probes and not any(m.quiet for m in probes)
    assert c.applied_data(2) == [b"a", b"b", b"c"]


def test_a_quiet_append_that_does_not_match_is_answered_with_a_reject() -> None:
    c = elected()
    c.propose(1, b"x")
    c.stabilize()
    core2 = c.core(2)
    leader = c.core(1)
    notice = AppendEntries(1, 2, leader.term, 5, leader.term, (), 5, quiet=True)
    core2.step(notice)  # prev_index 5 is beyond its log
    c.process_ready(2)
    (reply,) = [m for m in c.mailbox if isinstance(m, AppendResponse)]
    assert reply.reject and reply.hint_index == core2.last_index


def test_a_lost_ack_before_a_quiet_commit_notice_is_recovered() -> None:
    """The follower's ack of the entries is lost; the quiet notice that follows does
    not answer for it. The heartbeat round finds the follower's match behind and an
    answered probe brings the leader's view up to date."""
    c = elected()
    c.propose(1, b"x")
    c.process_ready(1)
    c.deliver()
    c.process_all()
    c.deliver(drop=lambda m: isinstance(m, AppendResponse) and m.src == 2)
    c.stabilize()  # node 3's ack committed the entry; node 2 got a quiet notice
    assert c.core(1).progress[2].match < c.core(1).last_index
    c.tick_all(3)
    assert c.core(1).progress[2].match == c.core(1).last_index
    assert c.core(2).commit_index == c.core(1).commit_index
