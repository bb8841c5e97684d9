"""The election gate of a node whose disk lost committed entries (`catch_up_to`).

A node that recovered a log shorter than what it knows (or must presume) was
committed must neither vote nor campaign until a leader has replicated its log
back to that index: otherwise a quorum may elect a leader that lacks committed
entries. The scenario test shows the unsafe election happening without the gate.
"""

from __future__ import annotations

import random

from raft import (
    AppendResponse,
    Config,
    HardState,
    MemoryStorage,
    RaftCore,
    RequestVote,
    Role,
    VoteResponse,
)
from tests.sim.harness import Cluster, entries


def _lose_tail(c: Cluster, i: int, keep: int, catch_up_to: int) -> None:
    """Node i restarts with only entries 1..keep of its durable log (a cut tail)."""
    node = c.nodes[i]
    node.core = None
    c.mailbox = [m for m in c.mailbox if m.dst != i]
    node.storage = MemoryStorage(node.storage.all_entries()[:keep])
    hs = node.hard_state
    node.hard_state = HardState(hs.term, hs.vote, min(hs.commit, keep))
    node.core = RaftCore(
        c.config(i),
        node.storage,
        node.hard_state,
        rng=random.Random(i),
        catch_up_to=catch_up_to,
    )
    node.applied = []


def _committed_three_with_node_2_away(c: Cluster) -> None:
    """Entries 2 and 3 are committed by nodes 1 and 3 while node 2 is cut off."""
    c.campaign(1)
    c.isolate(2)
    c.propose(1, b"a", b"b")
    c.stabilize()
    assert c.core(1).commit_index == 3 and c.core(3).last_index == 3
    assert c.core(2).last_index == 1


def test_the_gate_is_off_when_nothing_is_missing() -> None:
    log = entries(1, 1, 1)
    core = RaftCore(
        Config(1, (1, 2, 3)),
        MemoryStorage(log),
        HardState(1, None, 3),
        rng=random.Random(0),
        catch_up_to=3,
    )
    assert core.catch_up_to == 0
    lone = RaftCore(
        Config(1, (1,)),
        MemoryStorage(log[:1]),
        HardState(1, None, 1),
        rng=random.Random(0),
        catch_up_to=3,
    )
    assert lone.catch_up_to == 0, "a lone voter has nobody to catch up from"


def test_a_gated_node_neither_campaigns_nor_votes() -> None:
    core = RaftCore(
        Config(3, (1, 2, 3)),
        MemoryStorage(entries(1)),
        HardState(1, None, 1),
        rng=random.Random(0),
        catch_up_to=5,
    )
    assert core.catch_up_to == 5
    for _ in range(100):
        core.tick()
    assert core.role is Role.FOLLOWER
    rd = core.ready()
    assert not rd.messages, "a gated node sent a (pre-)vote request"
    core.advance(rd)
    for pre_vote in (True, False):
        core.step(RequestVote(2, 3, 2, 9, 9, pre_vote, False))
        rd = core.ready()
        votes = [m for m in rd.messages if isinstance(m, VoteResponse)]
        assert len(votes) == 1 and not votes[0].granted, (pre_vote, votes)
        core.advance(rd)
    assert core.vote is None


def test_without_the_gate_a_leader_lacking_committed_entries_is_elected() -> None:
    """Why the gate exists: node 3 lost committed entries 2..3 and votes for node 2."""
    c = Cluster(3)
    _committed_three_with_node_2_away(c)
    c.crash(1)
    _lose_tail(c, 3, keep=1, catch_up_to=0)
    c.heal()
    c.campaign(2)
    assert c.leader() == 2
    datas = [e.data for e in c.core(2).log_slice(1, c.core(2).last_index + 1)]
    assert b"a" not in datas and b"b" not in datas, "the new leader lacks committed entries"


def test_with_the_gate_the_lost_entries_come_back_from_a_leader() -> None:
    c = Cluster(3)
    _committed_three_with_node_2_away(c)
    committed = c.core(1).log_slice(1, 4)
    c.crash(1)
    _lose_tail(c, 3, keep=1, catch_up_to=3)
    c.heal()
    # Node 2 (missing entries 2..3) cannot win: node 3 refuses it, node 1 is down.
    for _ in range(10):
        c.tick_all(25)
        assert c.leader() is None, "a leader was elected without the committed entries"
    assert c.core(3).term == c.core(3).hard_state.term
    assert not any(isinstance(m, RequestVote) and m.src == 3 for m in c.sent[-200:])
    # Node 1 comes back: it wins with node 2's vote and repairs node 3.
    c.restart(1)
    for _ in range(50):
        c.tick_all()
        if c.leader() == 1 and c.core(3).catch_up_to == 0:
            break
    assert c.leader() == 1
    assert c.core(3).catch_up_to == 0
    assert c.core(3).log_slice(1, 4) == committed
    assert c.core(3).commit_index >= 3


def test_the_gate_lifts_once_the_log_reaches_the_index() -> None:
    c = Cluster(3)
    c.campaign(1)
    c.propose(1, b"a", b"b", b"c")
    c.stabilize()
    _lose_tail(c, 3, keep=2, catch_up_to=4)
    assert c.core(3).catch_up_to == 4
    c.tick_all(3)  # heartbeats: the leader finds node 3 behind and replicates
    assert c.core(3).catch_up_to == 0
    assert c.core(3).last_index == c.core(1).last_index == 4


def test_a_leader_ignores_an_ack_beyond_its_own_log() -> None:
    """After a power loss of a majority (async flush) a follower may hold committed
    entries the new leader lost; its ack must neither count nor crash the leader."""
    c = Cluster(3)
    c.campaign(1)
    last = c.core(1).last_index
    c.core(1).step(AppendResponse(2, 1, c.core(1).term, last + 7))
    assert c.core(1).progress[2].match <= last
    c.propose(1, b"x")
    c.stabilize()
    assert c.core(1).commit_index == last + 1
