"""Shard isolation of multi-Raft, in a seeded simulation (tests/sim/multiraft.py):
3 node processes each hosting 2-3 shards, every pair of nodes sharing one
ordered link for all shards' messages (as raftio/multiplex.py shares one stream).

- A partition of one shard only (every message of shard A to or from A's leader
  lost, the other shards' messages on the same links untouched) elects a new
  leader in A while every other shard, one of them led by that same node (its
  messages share the links A's are lost on), keeps committing throughout (a new
  entry at least every `GAP_MS`) and never changes leader. (Preferred leaders are
  off in this one: they would move that shard back to its preferred node.)
- A full partition of one node stalls no shard: the shards it did not lead keep
  committing throughout without a leader change; the shards it led elect a new
  leader among the other two and commit again within an election or two.
- After healing, every shard commits on every node again.

Each seed prints itself in a failure with how to replay it.
"""

from __future__ import annotations

import pytest

from dledger_commitlog.common.routes import preferred_leader
from raft import Message
from tests.sim.multiraft import MultiSim, leaders_between, move_leader, no_commit_gap, settle

SEEDS = 24
PARTITION_MS = 1500
GAP_MS = 60  # 6 ticks: a healthy shard commits every few ms (proposals every 3 ms)
ELECT_MS = 800  # a new leader: an election timeout (100-200 ms), pre-vote, maybe a retry


def sim_of(seed: int, test: str, *, preferred: bool = True) -> MultiSim:
    shards = (1, 2, 3) if seed % 2 else (1, 2)
    replay = f".venv/bin/python -m pytest tests/test_multiraft_sim.py -k '{test} and {seed}'"
    return MultiSim(seed, shards, replay=replay, preferred=preferred)


def converge_after_heal(sim: MultiSim) -> None:
    """Healed: every shard commits new entries, applied on every node."""
    sim.cut = lambda g, m: False
    marks = {g: sim.commit(g) for g in sim.shards}
    sim.run_until(sim.now + 1000)
    for g in sim.shards:
        if sim.commit(g) <= marks[g]:
            raise sim.failure(f"shard {g} committed nothing after healing")
        lagging = [n for n in sim.ids if sim.applied[n, g] < marks[g]]
        if lagging:
            raise sim.failure(f"shard {g}: nodes {lagging} did not apply the log after healing")


@pytest.mark.sim
@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_partition_of_one_shards_leader_stalls_no_other_shard(seed: int) -> None:
    sim = sim_of(seed, "one_shards_leader", preferred=False)
    settle(sim, 5000)
    a = sim.shards[seed % len(sim.shards)]
    old = sim.leader(a)
    assert old is not None
    # The hard case: another shard led by the same node, whose messages share the
    # very links (to and from that node) on which shard A's are lost.
    b = sim.shards[(seed + 1) % len(sim.shards)]
    move_leader(sim, b, old, sim.now + 5000)
    led = {g: sim.leader(g) for g in sim.shards}
    assert led[a] == led[b] == old

    def cut(g: int, m: Message) -> bool:
        return g == a and old in (m.src, m.dst)

    sim.cut = cut
    start = sim.now
    sim.run_until(start + PARTITION_MS)
    new = [who for who in leaders_between(sim, a, start, sim.now) if who not in (None, old)]
    if not new:
        raise sim.failure(f"shard {a} elected no leader besides node {old} while cut off")
    elected = next(t for t, who in sim.views[a].changes if t > start and who not in (None, old))
    if elected - start > ELECT_MS:
        raise sim.failure(f"shard {a} took {elected - start} ms to elect a new leader")
    no_commit_gap(sim, a, elected + ELECT_MS, sim.now, GAP_MS * 3)
    for g in sim.shards:
        if g == a:
            continue
        no_commit_gap(sim, g, start, sim.now, GAP_MS)
        seen = leaders_between(sim, g, start, sim.now)
        if seen != [led[g]]:
            raise sim.failure(f"shard {g} changed leader while shard {a} was cut: {seen}")
    assert sim.lost_to_cut > 0
    converge_after_heal(sim)


@pytest.mark.sim
@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_partitioned_node_stalls_no_shard_with_a_quorum_elsewhere(seed: int) -> None:
    sim = sim_of(seed, "partitioned_node")
    settle(sim, 5000)
    gone = sim.ids[seed % len(sim.ids)]
    led = [g for g in sim.shards if sim.leader(g) == gone]
    others = [g for g in sim.shards if g not in led]
    sim.cut = lambda g, m: gone in (m.src, m.dst)
    start = sim.now
    sim.run_until(start + PARTITION_MS)
    for g in others:
        no_commit_gap(sim, g, start, sim.now, GAP_MS)
        seen = leaders_between(sim, g, start, sim.now)
        if seen != [preferred_leader(g, sim.ids)]:
            raise sim.failure(f"shard {g} changed leader while node {gone} was cut: {seen}")
    for g in led:
        changes = [(t, who) for t, who in sim.views[g].changes if t > start]
        elected = [t for t, who in changes if who not in (None, gone)]
        if not elected or elected[0] - start > ELECT_MS:
            raise sim.failure(
                f"shard {g} (led by the cut node {gone}) had no new leader "
                f"within {ELECT_MS} ms: {changes}"
            )
        no_commit_gap(sim, g, elected[0] + ELECT_MS, sim.now, GAP_MS * 3)
    converge_after_heal(sim)


@pytest.mark.sim
def test_same_seed_same_history() -> None:
    a, b = sim_of(5, "same"), sim_of(5, "same")
    for sim in (a, b):
        settle(sim, 5000)
        sim.cut = lambda g, m: g == 1 and 2 in (m.src, m.dst)
        sim.run_until(sim.now + 500)
    assert [v.canon for v in a.views.values()] == [v.canon for v in b.views.values()]
    assert a.now == b.now and a.delivered == b.delivered
