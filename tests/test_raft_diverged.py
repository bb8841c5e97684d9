"""A leader whose log conflicts with a follower's committed prefix (`LogDiverged`).

Possible only after a majority lost acknowledged entries (async flush and a
power loss of a majority): a node outside the new majority may hold, as
committed, entries the new leader lacks, and the new leader writes other entries
at those indexes. Raft never truncates committed entries: the core must not
overwrite them, nor acknowledge them to the leader, and raises `LogDiverged`
(for the driver to roll back and rejoin) before anything changes its log.
"""

from __future__ import annotations

import random

import pytest

from raft import (
    AppendEntries,
    AppendResponse,
    Config,
    Entry,
    HardState,
    LogDiverged,
    MemoryStorage,
    RaftCore,
    Snapshot,
)
from tests.sim.harness import Cluster, entries
from tests.test_raft_catch_up import _lose_tail


def _follower(terms: list[int], commit: int, term: int = 2) -> RaftCore:
    """Node 3 holding `terms`, committed up to `commit`, in `term`."""
    storage = MemoryStorage(entries(*terms))
    return RaftCore(
        Config(id=3, peers=(1, 2, 3)), storage, HardState(term, None, commit), rng=random.Random(3)
    )


def _answers(core: RaftCore) -> list[AppendResponse]:
    rd = core.ready()
    core.advance(rd)
    return [m for m in rd.messages if isinstance(m, AppendResponse)]


def test_an_append_conflicting_at_or_below_the_commit_index_raises() -> None:
    core = _follower([1, 1, 1, 1, 1], commit=5)
    m = AppendEntries(1, 3, 3, 3, 1, (Entry(4, 3, b"x"), Entry(5, 3, b"y")), 0)
    with pytest.raises(LogDiverged) as info:
        core.step(m)
    e = info.value
    assert (e.index, e.agree, e.committed, e.leader, e.term) == (4, 3, 5, 1, 3)
    assert core.last_index == 5 and core.log_term(4) == 1, "the committed entries are untouched"
    assert core.commit_index == 5


def test_the_first_conflict_is_found_past_matching_entries() -> None:
    core = _follower([1, 1, 2, 2, 2, 2], commit=6)
    ents = (Entry(3, 2), Entry(4, 2), Entry(5, 4), Entry(6, 4), Entry(7, 4))
    with pytest.raises(LogDiverged) as info:
        core.step(AppendEntries(1, 3, 4, 2, 1, ents, 0))
    assert (info.value.index, info.value.agree) == (5, 4)


def test_a_snapshot_conflicting_with_the_committed_prefix_raises() -> None:
    core = _follower([1, 1, 1, 1], commit=4)
    with pytest.raises(LogDiverged) as info:
        core.step(Snapshot(1, 3, 3, 3, 2, 3))
    assert (info.value.index, info.value.agree) == (3, 2)


def test_a_matching_append_inside_the_committed_prefix_acks_only_what_it_proves() -> None:
    """Not our commit index: the leader's log may end before it (and lack those)."""
    core = _follower([1, 1, 1, 1, 1], commit=5)
    core.step(AppendEntries(1, 3, 3, 2, 1, (Entry(3, 1),), 0))
    assert [(a.index, a.reject) for a in _answers(core)] == [(3, False)]
    assert core.last_index == 5


def test_a_mismatched_prev_inside_the_committed_prefix_is_rejected_to_probe_back() -> None:
    """The leader probes back to where the logs agree; the conflict shows there."""
    core = _follower([1, 1, 2, 2, 2], commit=5)
    core.step(AppendEntries(1, 3, 4, 4, 3, (), 0))
    (ans,) = _answers(core)
    assert ans.reject and ans.hint_index <= 4, ans
    assert core.last_index == 5 and core.commit_index == 5


def test_normal_appends_past_the_commit_index_are_unaffected() -> None:
    core = _follower([1, 1, 1], commit=2)
    core.step(AppendEntries(1, 3, 2, 1, 1, (Entry(2, 1), Entry(3, 2), Entry(4, 2)), 4))
    assert core.log_term(3) == 2 and core.commit_index == 4
    rd = core.ready()
    assert [e.index for e in rd.entries] == [3, 4]
    assert [(m.index, m.reject) for m in rd.messages if isinstance(m, AppendResponse)] == [
        (4, False)
    ]


def test_a_new_majority_that_lost_committed_entries_makes_the_old_follower_diverge() -> None:
    """Nodes 1 and 2 lose entries 3..4 (unflushed) after node 3 recorded them as
    committed; node 2 leads a new term; its no-op at index 3 conflicts with node 3."""
    c = Cluster(3)
    c.campaign(1)
    c.propose(1, b"a", b"b", b"c")
    c.stabilize()
    c.tick_all(2)  # the commit index reaches node 3
    assert c.core(3).commit_index == 4
    c.isolate(3)
    _lose_tail(c, 1, keep=2, catch_up_to=0)
    _lose_tail(c, 2, keep=2, catch_up_to=0)
    c.campaign(2)
    assert c.leader() == 2 and c.core(2).last_index == 3
    c.heal()
    with pytest.raises(LogDiverged) as info:
        c.tick_all(3)
    assert (info.value.index, info.value.agree, info.value.committed) == (3, 2, 4)
    assert [e.data for e in c.core(3).log_slice(1, 5)][1:] == [b"a", b"b", b"c"]
