"""Leadership transfer, the preferred leader, a drained node, and ReadIndex."""

from __future__ import annotations

from typing import Any

import pytest

from raft import (
    AppendEntries,
    Heartbeat,
    HeartbeatResponse,
    NotLeader,
    ReadIndexRequest,
    ReadState,
    Role,
    TimeoutNow,
)
from tests.sim.harness import Cluster


def elected(n: int = 3, **overrides: Any) -> Cluster:
    c = Cluster(n, **overrides)
    c.campaign(1)
    assert c.core(1).role is Role.LEADER
    return c


# --- leadership transfer ---


def test_transfer_to_an_up_to_date_follower() -> None:
    c = elected()
    c.propose(1, b"a")
    c.stabilize()
    c.core(1).transfer_leadership(2)
    c.stabilize()
    assert c.core(2).role is Role.LEADER
    assert c.core(1).role is Role.FOLLOWER
    assert c.core(1).leader_id == 2
    with pytest.raises(NotLeader) as err:
        c.propose(1, b"b")
    assert err.value.leader_hint == 2
    c.propose(2, b"b")
    c.stabilize()
    assert c.applied_data(3) == [b"a", b"b"]


def test_transfer_first_brings_a_lagging_target_up_to_date() -> None:
    c = elected()
    c.isolate(3)
    c.propose(1, b"a", b"b")
    c.stabilize()
    c.heal()
    c.core(1).transfer_leadership(3)
    c.process_ready(1)
    assert not any(isinstance(m, TimeoutNow) for m in c.mailbox), "target is behind"
    c.tick_all(3)
    assert c.core(3).role is Role.LEADER
    assert c.applied_data(3) == [b"a", b"b"]
    timeout_now = [m for m in c.sent if isinstance(m, TimeoutNow)]
    assert len(timeout_now) == 1 and timeout_now[0].dst == 3


def test_leader_refuses_proposals_during_transfer_and_resumes_after_abort() -> None:
    c = elected()
    c.isolate(3)
    leader = c.core(1)
    leader.transfer_leadership(3)
    with pytest.raises(NotLeader) as err:
        leader.propose(b"x")
    assert err.value.leader_hint == 3
    for _ in range(10):  # one election timeout
        leader.tick()
        c.stabilize()
    assert leader.role is Role.LEADER
    assert leader.lead_transferee is None
    assert leader.propose(b"x")[0] > 0
    c.stabilize()
    assert c.applied_data(2) == [b"x"]


def test_transfer_to_self_or_on_follower() -> None:
    c = elected()
    c.core(1).transfer_leadership(1)
    assert c.core(1).lead_transferee is None
    with pytest.raises(NotLeader):
        c.core(2).transfer_leadership(3)
    with pytest.raises(ValueError):
        c.core(1).transfer_leadership(9)


def test_preferred_leader_takes_over_when_healthy_and_caught_up() -> None:
    c = elected(preferred_leader=2)
    c.isolate(2)
    c.propose(1, b"a")
    c.tick_all(3)
    assert c.core(1).role is Role.LEADER, "node 2 is unreachable: no transfer"
    c.heal()
    c.tick_all(5)
    assert c.core(2).role is Role.LEADER
    c.tick_all(30)
    assert c.core(2).role is Role.LEADER, "and it stays"
    c.propose(2, b"b")
    c.stabilize()
    assert c.applied_data(1) == [b"a", b"b"]


def test_a_node_that_may_not_campaign_gets_no_transfer_not_even_as_preferred() -> None:
    """A drained node (the driver forbids it campaigns) says so in its heartbeat answers:
    the leader neither hands over to it as the preferred leader nor on request, and its
    proposals never stall behind a transfer that could not finish."""
    c = elected(preferred_leader=2)
    c.core(2).may_campaign = False
    c.propose(1, b"a")
    c.tick_all(30)
    assert c.core(1).role is Role.LEADER, "no hand-over to a drained preferred leader"
    answers = [m for m in c.sent if isinstance(m, HeartbeatResponse) and m.src == 2]
    assert answers and all(m.no_lead for m in answers)
    assert c.core(1).progress[2].may_lead is False
    with pytest.raises(ValueError, match="node 2 takes no leadership now"):
        c.core(1).transfer_leadership(2)
    assert c.core(1).lead_transferee is None
    c.propose(1, b"b")
    c.core(2).may_campaign = True  # undrained: the preferred leader takes over again
    c.tick_all(10)
    assert c.core(2).role is Role.LEADER
    assert c.applied_data(3) == [b"a", b"b"]


# --- ReadIndex ---


def test_leader_read_index_after_a_heartbeat_quorum() -> None:
    c = elected()
    c.propose(1, b"a")
    c.stabilize()
    commit = c.core(1).commit_index
    c.core(1).read_index(b"r1")
    c.process_ready(1)
    assert any(isinstance(m, Heartbeat) and m.ctx == b"r1" for m in c.mailbox)
    assert c.nodes[1].read_states == []
    c.stabilize()
    assert c.nodes[1].read_states == [ReadState(b"r1", commit)]


def test_many_reads_share_one_heartbeat_round() -> None:
    c = elected()
    for k in range(5):
        c.core(1).read_index(b"r%d" % k)
    c.process_ready(1)
    assert sum(isinstance(m, Heartbeat) for m in c.mailbox) == 2
    c.stabilize()
    assert [rs.ctx for rs in c.nodes[1].read_states] == [b"r%d" % k for k in range(5)]


def test_follower_read_index_is_forwarded_to_the_leader() -> None:
    c = elected()
    c.propose(1, b"a")
    c.stabilize()
    c.core(3).read_index(b"f")
    c.process_ready(3)
    assert [type(m) for m in c.mailbox] == [ReadIndexRequest]
    c.stabilize()
    assert c.nodes[3].read_states == [ReadState(b"f", c.core(1).commit_index)]


def test_read_index_waits_for_a_commit_in_the_leaders_term() -> None:
    c = Cluster(3)
    leader = c.core(1)
    while leader.role is not Role.LEADER:
        leader.tick()
        c.process_all()
        c.deliver(lambda m: not isinstance(m, AppendEntries))
    leader.read_index(b"early")
    for _ in range(3):  # heartbeats flow, but the no-op is not committed yet
        leader.tick()
        c.process_all()
        c.deliver(lambda m: not isinstance(m, AppendEntries))
    assert c.nodes[1].read_states == []
    c.stabilize()  # the no-op commits, then the heartbeat round confirms the read
    assert c.nodes[1].read_states == [ReadState(b"early", leader.commit_index)]


def test_isolated_leader_never_answers_a_read() -> None:
    c = elected()
    c.isolate(1)
    c.core(1).read_index(b"r")
    for _ in range(30):
        c.core(1).tick()
        c.stabilize()
    assert c.nodes[1].read_states == []
    assert c.core(1).role is Role.FOLLOWER


def test_read_index_without_a_known_leader_raises() -> None:
    c = Cluster(3)
    with pytest.raises(NotLeader):
        c.core(2).read_index(b"r")
