"""Async storage writes (the node driver's pipeline) and coalesced acks.

With `Config.async_storage_writes` the driver appends a Ready's entries and
advances at once; durability arrives later through `RaftCore.persisted`. Only
then does a leader count its own log in the quorum, and only durable entries are
handed out for applying.
"""

from __future__ import annotations

import random

from raft import Config, HardState, MemoryStorage, RaftCore, Role
from raft.messages import AppendEntries, AppendResponse, Heartbeat, VoteResponse
from tests.sim.harness import entries


def _core(
    node: int = 1,
    peers: tuple[int, ...] = (1,),
    *,
    log_terms: tuple[int, ...] = (),
    term: int = 0,
    commit: int = 0,
) -> tuple[RaftCore, MemoryStorage]:
    storage = MemoryStorage(entries(*log_terms))
    cfg = Config(id=node, peers=peers, async_storage_writes=True)
    core = RaftCore(cfg, storage, HardState(term, None, commit), rng=random.Random(7))
    return core, storage


def _drive(core: RaftCore, storage: MemoryStorage) -> tuple[list[int], list[object]]:
    """One Ready carried out without reporting durability: (applied indexes, messages)."""
    rd = core.ready()
    if rd.entries:
        storage.append(rd.entries)
    core.advance(rd)
    return [e.index for e in rd.committed_entries], list(rd.messages)


def _elect_alone(core: RaftCore, storage: MemoryStorage) -> None:
    for _ in range(40):
        core.tick()
        if core.role is Role.LEADER:
            break
    assert core.role is Role.LEADER


def test_a_lone_leader_commits_only_what_the_driver_reports_durable() -> None:
    core, storage = _core()
    _elect_alone(core, storage)
    _drive(core, storage)  # the leader's no-op
    assert core.commit_index == 0, "appended is not durable"
    core.persisted(1, core.term)
    assert core.commit_index == 1
    first, last = core.propose([b"a", b"b"])
    applied, _ = _drive(core, storage)
    assert applied == [1] and core.commit_index == 1
    core.persisted(last, core.term)
    assert core.commit_index == last
    applied, _ = _drive(core, storage)
    assert applied == [first, last]


def test_a_follower_applies_only_durable_entries() -> None:
    core, storage = _core(2, (1, 2, 3))
    core.step(AppendEntries(1, 2, 1, 0, 0, tuple(entries(1, 1, 1)), 3))
    assert core.commit_index == 3
    applied, msgs = _drive(core, storage)
    assert applied == [], "committed by the leader, but not yet on this node's disk"
    assert msgs == [AppendResponse(2, 1, 1, 3)]  # the driver holds it until the fsync
    core.persisted(2, 1)
    applied, _ = _drive(core, storage)
    assert applied == [1, 2]
    core.persisted(3, 1)
    assert _drive(core, storage)[0] == [3]


def test_a_report_for_a_replaced_entry_is_ignored() -> None:
    core, storage = _core(2, (1, 2, 3))
    core.step(AppendEntries(1, 2, 1, 0, 0, tuple(entries(1, 1, 1)), 1))
    _drive(core, storage)
    core.persisted(1, 1)
    # A term-2 leader replaces entries 2-3 before their fsync completed.
    core.step(AppendEntries(3, 2, 2, 1, 1, tuple(entries(2, 2, start=2)), 1))
    _drive(core, storage)
    core.persisted(3, 1)  # the old entry 3's fsync: it no longer exists
    core.step(Heartbeat(3, 2, 2, 3))
    assert core.commit_index == 3
    assert _drive(core, storage)[0] == [], "entries 2-3 of term 2 are not durable yet"
    core.persisted(3, 2)
    assert _drive(core, storage)[0] == [2, 3]


def test_a_new_leader_counts_only_its_durable_log() -> None:
    core, storage = _core(1, (1, 2, 3), log_terms=(1, 1), term=1, commit=1)
    core.step(AppendEntries(2, 1, 1, 2, 1, tuple(entries(1, start=3)), 1))
    _drive(core, storage)  # entry 3 handed to storage, its fsync still running
    for _ in range(40):
        core.tick()
        if core.role is not Role.FOLLOWER:
            break
    _drive(core, storage)
    core.step(VoteResponse(2, 1, core.term, granted=True, pre_vote=True))
    _drive(core, storage)
    core.step(VoteResponse(2, 1, core.term, granted=True))
    assert core.role is Role.LEADER
    assert core.progress[1].match == 2, "entry 3 is not durable here yet"
    core.persisted(3, 1)
    assert core.progress[1].match == 3


def test_acks_to_one_leader_coalesce_within_a_ready() -> None:
    core = RaftCore(Config(id=2, peers=(1, 2, 3)), MemoryStorage(), rng=random.Random(3))
    core.step(AppendEntries(1, 2, 1, 0, 0, tuple(entries(1, 1)), 0))
    core.step(AppendEntries(1, 2, 1, 2, 1, tuple(entries(1, start=3)), 0))
    core.step(AppendEntries(1, 2, 1, 3, 1, tuple(entries(1, start=4)), 0))
    assert core.ready().messages == (AppendResponse(2, 1, 1, 4),)


def test_a_reject_never_coalesces() -> None:
    core = RaftCore(Config(id=2, peers=(1, 2, 3)), MemoryStorage(), rng=random.Random(3))
    core.step(AppendEntries(1, 2, 1, 0, 0, tuple(entries(1)), 0))
    core.step(AppendEntries(1, 2, 1, 5, 1, tuple(entries(1, start=6)), 0))  # a gap
    core.step(AppendEntries(1, 2, 1, 1, 1, tuple(entries(1, start=2)), 0))
    msgs = core.ready().messages
    assert [(m.index, m.reject) for m in msgs if isinstance(m, AppendResponse)] == [
        (1, False),
        (5, True),
        (2, False),
    ]
