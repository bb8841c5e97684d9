"""Elections: leader election, pre-vote, check-quorum, stale leaders, figure 8."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from raft import (
    AppendEntries,
    EntryKind,
    HardState,
    NotLeader,
    RaftCore,
    RequestVote,
    Role,
    VoteResponse,
)
from tests.sim.harness import Cluster, entries


def test_campaign_elects_a_leader_that_commits_a_noop() -> None:
    c = Cluster(3)
    c.campaign(1)
    assert c.core(1).role is Role.LEADER
    assert c.core(1).term == 1
    for i in (1, 2, 3):
        assert c.core(i).leader_id == 1
        assert c.core(i).commit_index == 1
        assert [e.kind for e in c.nodes[i].applied] == [EntryKind.NOOP]


def test_election_timeouts_are_randomized_in_range() -> None:
    seen = set()
    for seed in range(30):
        c = Cluster(3, seed=seed)
        core = c.core(1)
        ticks = 0
        while core.role is Role.FOLLOWER:
            core.tick()
            ticks += 1
        seen.add(ticks)
    assert min(seen) >= 10 and max(seen) < 20
    assert len(seen) > 3


def _eager(c: Cluster, i: int) -> RaftCore:
    """Node i restarted as its group's eager first leader (`Config.eager_campaign`)."""
    node = c.nodes[i]
    cfg = dataclasses.replace(c.config(i), eager_campaign=True)
    node.core = RaftCore(cfg, node.storage, node.hard_state, rng=random.Random(0))
    return node.core


def test_a_fresh_groups_eager_node_campaigns_at_each_tick_until_it_leads() -> None:
    c = Cluster(3)
    core = _eager(c, 1)
    core.tick()
    assert core.role is Role.PRE_CANDIDATE
    c.process_all()
    c.mailbox.clear()  # its peers are not up yet: the pre-votes are lost
    core.tick()  # so it asks again at the next tick, not an election timeout later
    c.stabilize()
    assert c.core(1).role is Role.LEADER and c.core(1).term == 1
    assert all(c.core(i).leader_id == 1 for i in (1, 2, 3))
    assert c.core(2).role is Role.FOLLOWER  # the others kept their randomized timeouts


@pytest.mark.parametrize(
    "state",
    [
        pytest.param({"hard_states": {1: HardState(term=1)}}, id="a-term-was-seen"),
        pytest.param({"logs": {1: entries(1)}}, id="a-log-was-written"),
    ],
)
def test_an_eager_node_that_is_not_fresh_waits_its_election_timeout(state: dict[str, Any]) -> None:
    c = Cluster(3, **state)
    core = _eager(c, 1)
    ticks = 0
    while core.role is Role.FOLLOWER:
        core.tick()
        ticks += 1
    assert ticks >= 10


def test_propose_on_a_follower_raises_not_leader_with_hint() -> None:
    c = Cluster(3)
    c.campaign(1)
    with pytest.raises(NotLeader) as err:
        c.propose(2, b"x")
    assert err.value.leader_hint == 1


def test_candidate_with_stale_log_loses() -> None:
    logs = {1: entries(1), 2: entries(1, 2), 3: entries(1, 2)}
    hs = {i: HardState(term=2) for i in (1, 2, 3)}
    c = Cluster(3, logs=logs, hard_states=hs, pre_vote=False)
    c.campaign(1)
    assert c.core(1).role is not Role.LEADER
    assert c.leader() is None


def test_pre_vote_does_not_disrupt_a_healthy_leader() -> None:
    c = Cluster(3)
    c.campaign(1)
    term = c.core(1).term
    c.isolate(3)
    for _ in range(60):  # node 3 times out again and again
        c.tick_all()
    assert c.core(3).term == term, "pre-vote kept node 3 from inflating its term"
    assert c.core(3).role is Role.PRE_CANDIDATE
    c.heal()
    c.tick_all(5)
    assert c.core(1).role is Role.LEADER
    assert c.core(1).term == term
    assert c.core(3).leader_id == 1


def test_without_pre_vote_a_rejoining_node_forces_a_new_term() -> None:
    c = Cluster(3, pre_vote=False, check_quorum=False)
    c.campaign(1)
    c.isolate(3)
    for _ in range(40):
        c.tick_all()
    assert c.core(3).term > c.core(1).term
    c.heal()
    c.tick_all(3)
    assert c.core(1).term > 1  # the old leader was deposed: what pre-vote prevents


def test_check_quorum_leader_steps_down_and_refuses_proposals() -> None:
    c = Cluster(3)
    c.campaign(1)
    c.isolate(1)
    leader = c.core(1)
    for _ in range(10):  # acks from before the partition count for one timeout
        leader.tick()
        c.stabilize()
    assert c.core(1).role is Role.LEADER
    for _ in range(10):
        leader.tick()
        c.stabilize()
    assert c.core(1).role is Role.FOLLOWER
    with pytest.raises(NotLeader):
        leader.propose(b"x")


def test_leader_with_quorum_stays() -> None:
    c = Cluster(3)
    c.campaign(1)
    c.isolate(3)
    c.tick_all(35)
    assert c.core(1).role is Role.LEADER


def test_followers_in_lease_ignore_disruptive_vote_requests() -> None:
    c = Cluster(3, pre_vote=False)
    c.campaign(1)
    term = c.core(1).term
    c.core(2).step(RequestVote(3, 2, term + 5, 100, term + 5))
    assert c.core(2).term == term
    assert c.core(2).leader_id == 1


def test_paused_old_leader_never_commits_or_acknowledges() -> None:
    c = Cluster(3)
    c.campaign(1)
    c.propose(1, b"before")
    c.stabilize()
    old = c.core(1)
    # Pause node 1: it neither ticks nor receives; the others elect node 2.
    c.isolate(1)
    for _ in range(40):
        for i in (2, 3):
            c.core(i).tick()
        c.stabilize()
        if c.core(2).role is Role.LEADER or c.core(3).role is Role.LEADER:
            break
    new = 2 if c.core(2).role is Role.LEADER else 3
    c.propose(new, b"after")
    c.stabilize()
    # Node 1 resumes with stale state: it still believes it leads.
    c.heal()
    assert c.core(1).role is Role.LEADER
    first, _ = old.propose([b"stale"])
    applied_before = len(c.nodes[1].applied)
    c.stabilize()
    c.tick_all(5)
    assert c.core(1).role is Role.FOLLOWER
    assert old.term == c.core(new).term
    for i in (1, 2, 3):
        assert b"stale" not in c.applied_data(i)
        assert c.core(i).log_slice(first, first + 1)[0].data != b"stale"
    # What node 1 applied after resuming came from the new leader, in order.
    assert c.applied_data(1)[-1] == b"after"
    assert len(c.nodes[1].applied) > applied_before


def test_figure_8_old_term_entry_is_not_committed_by_counting_replicas() -> None:
    """Raft paper figure 8: S1 (term 4) replicates index 2 of term 2 to a
    majority; it must not commit it, since S5 (last term 3) can still win and
    overwrite it."""
    logs = {1: entries(1, 2), 2: entries(1, 2), 3: entries(1), 4: entries(1), 5: entries(1, 3)}
    hs = {i: HardState(term=3) for i in range(1, 6)}
    c = Cluster(
        5, logs=logs, hard_states=hs, max_append_entries=1, pre_vote=False, check_quorum=False
    )
    s1 = c.core(1)
    while s1.role is Role.FOLLOWER:
        s1.tick()
    c.process_ready(1)
    # S2, S3 and S4 vote for S1 (S5's log is newer); S1 becomes leader of term 4.
    c.deliver(lambda m: isinstance(m, RequestVote) and m.dst in (2, 3, 4))
    c.process_all()
    c.deliver(lambda m: isinstance(m, VoteResponse))
    assert s1.role is Role.LEADER and s1.term == 4
    # Only S2 and S3 hear from S1; S3 gets index 2 (term 2) but never the no-op.
    for _ in range(6):
        s1.tick()
        c.process_all()
        c.deliver(
            lambda m: m.dst in (1, 2, 3) and m.src in (1, 2, 3),
            drop=lambda m: (
                isinstance(m, AppendEntries) and m.dst == 3 and c.core(3).last_index >= 2
            ),
        )
    assert c.log_terms(3) == [1, 2]
    assert s1.progress[3].match == 2 and s1.progress[2].match == 3
    assert s1.commit_index < 2, "a term-2 entry was committed by counting replicas"
    # S1 crashes; S5 wins with S3 and S4 and overwrites index 2 everywhere it can.
    c.crash(1)
    c.mailbox.clear()
    c.campaign(5)  # term 4: S3 and S4 already voted for S1 in term 4
    if c.core(5).role is not Role.LEADER:
        c.campaign(5)  # term 5
    assert c.core(5).role is Role.LEADER
    c.propose(5, b"s5")
    c.stabilize()
    for i in (3, 4, 5):
        assert c.log_terms(i)[:2] == [1, 3]
    assert c.core(5).commit_index >= 3


def test_a_node_that_may_not_campaign_follows_and_votes_but_never_leads() -> None:
    """A node whose log holds damaged committed entries (the driver's call) stays out."""
    c = Cluster(3)
    c.core(1).may_campaign = False
    c.tick(1, 4 * c.config(1).election_ticks)
    assert c.core(1).role is Role.FOLLOWER and c.core(1).term == 0
    c.campaign(2)  # it still votes: the other two elect a leader with its vote too
    assert c.leader() == 2
    c.core(2).transfer_leadership(1)  # a transfer to it does not make it campaign either
    c.stabilize()
    assert c.core(1).role is Role.FOLLOWER
    c.core(3).may_campaign = False
    c.crash(2)  # nobody left who may lead: no election, no leader
    c.tick_all(4 * c.config(1).election_ticks)
    assert c.leader() is None
