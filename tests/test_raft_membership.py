"""Membership change in the pure core: configurations carried by the log, learners,
one change at a time, a removed leader handing over, restart and snapshots."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from raft import AppendEntries, Entry, EntryKind, HardState, NotLeader, RaftCore, Role
from raft.errors import MembershipError
from raft.membership import (
    ChangeOp,
    ConfChange,
    ConfLog,
    Member,
    Membership,
    majorities_overlap,
)
from raft.validate import InvalidPeerMessage, check_peer_message
from raftio.hard_state import RaftStateFile
from store.errors import CorruptEntry
from tests.sim.harness import Cluster


def add(i: int) -> ConfChange:
    return ConfChange(ChangeOp.ADD_LEARNER, i, Member(i, f"127.0.0.1:{7000 + i}", f"h:{8000 + i}"))


def promote(i: int) -> ConfChange:
    return ConfChange(ChangeOp.PROMOTE, i)


def remove(i: int) -> ConfChange:
    return ConfChange(ChangeOp.REMOVE, i)


def led(n: int = 3, **overrides: object) -> Cluster:
    c = Cluster(n, **overrides)  # type: ignore[arg-type]
    c.campaign(1)
    assert c.core(1).role is Role.LEADER
    c.stabilize()
    return c


def elect_another(c: Cluster) -> int:
    """Tick the live nodes until one of them leads; its id."""
    for _ in range(100):
        c.tick_all(1)
        leader = c.leader()
        if leader is not None:
            return leader
    raise AssertionError("no leader")


def messages(c: Cluster, i: int) -> list[bytes]:
    """The application data node i applied since its (re)start, in order."""
    return [e.data for e in c.nodes[i].applied if e.kind is EntryKind.NORMAL and e.data]


def grow(c: Cluster, i: int) -> None:
    """Add node i as a learner, let it catch up, promote it (leader 1)."""
    c.add_node(i)
    c.core(1).propose_conf_change(add(i))
    c.stabilize()
    c.tick_all(2)
    c.core(1).propose_conf_change(promote(i))
    c.stabilize()


# --- the membership value and its codec ---


def test_membership_codec_round_trips_and_refuses_anything_else() -> None:
    m = Membership.of([Member(2, "a:1", "b:2"), Member(1), Member(3, learner=True)])
    assert m.ids == (1, 2, 3) and m.voters == (1, 2) and m.learners == (3,)
    assert Membership.decode(m.encode()) == m
    for bad in (
        b"",
        b"[]",
        b'{"members": []}',
        b'{"members": [[1, "", ""]]}',
        b'{"members": [[1, "", "", true]]}',
        b'{"members": [[0, "", "", false]]}',
        b'{"members": [[1, "", "", false], [1, "", "", false]]}',
        b'{"members": [["1", "", "", false]]}',
        b'{"members": [], "x": 1}',
        b"\xff" * 10,
    ):
        with pytest.raises(ValueError):
            Membership.decode(bad)


def test_each_change_moves_one_voter_at_most_and_refuses_what_does_not_apply() -> None:
    m = Membership.voters_only([1, 2, 3])
    m4 = m.apply(add(4))
    assert m4.learners == (4,) and m4.voters == (1, 2, 3)
    assert m4.apply(promote(4)).voters == (1, 2, 3, 4)
    with pytest.raises(MembershipError, match="already a voter"):
        m.apply(add(2))
    with pytest.raises(MembershipError, match="not a member"):
        m.apply(promote(9))
    with pytest.raises(MembershipError, match="a voter already"):
        m.apply(promote(2))
    with pytest.raises(MembershipError, match="last voter"):
        Membership.voters_only([1]).apply(remove(1))
    assert m.apply(remove(2)).voters == (1, 3)


def test_majorities_overlap_is_exact_on_small_sets() -> None:
    assert majorities_overlap([1, 2, 3], [1, 2, 3, 4])
    assert majorities_overlap([1, 2, 3], [1, 2])
    assert not majorities_overlap([1, 2, 3], [1, 4, 5])  # {1,2} vs {4,5}
    assert not majorities_overlap([1, 2, 3], [2, 3, 4, 5, 6])


def test_conf_log_follows_appends_and_truncations() -> None:
    m3, m4 = Membership.voters_only([1, 2, 3]), Membership.voters_only([1, 2, 3, 4])
    confs = ConfLog(0, m3)
    confs.appended([Entry(5, 1, m4.encode(), EntryKind.CONFIG), Entry(6, 1, b"x")])
    assert (confs.index, confs.current) == (5, m4)
    assert confs.at(4)[1] == m3 and confs.pending_after(4) == 5 and confs.pending_after(5) == 0
    confs.appended([Entry(5, 2, b"y")])  # a new leader replaced entry 5 on
    assert (confs.index, confs.current) == (0, m3)


# --- growing and shrinking a group ---


def test_a_learner_replicates_but_never_counts_for_commit_or_campaigns() -> None:
    c = led(3)
    c.add_node(4)
    c.core(1).propose_conf_change(add(4))
    c.stabilize()
    assert c.core(4).membership.learners == (4,)
    assert c.core(4).commit_index == c.core(1).commit_index  # it has the whole log
    c.crash(2)
    c.crash(3)
    c.propose(1, b"needs a voter")
    c.stabilize()
    last = c.core(1).last_index
    assert c.core(4).last_index == last and c.core(1).commit_index < last  # 4 does not count
    c.crash(1)
    c.tick(4, 50)
    assert c.core(4).role is Role.FOLLOWER  # a learner never campaigns


def test_grow_three_to_five_and_back_keeps_every_committed_entry() -> None:
    c = led(3)
    for i in (4, 5):
        grow(c, i)
        c.propose(1, b"with %d" % i)
        c.stabilize()
    assert c.core(1).membership.voters == (1, 2, 3, 4, 5)
    assert all(c.core(i).membership.voters == (1, 2, 3, 4, 5) for i in range(1, 6))
    c.crash(2)
    c.crash(3)  # 3 of 5 remain: still a quorum
    c.propose(1, b"five")
    c.stabilize()
    assert b"five" in messages(c, 4)
    c.restart(2)
    c.restart(3)
    c.stabilize()
    for i in (5, 4):
        c.core(1).propose_conf_change(remove(i))
        c.stabilize()
    assert c.core(1).membership.voters == (1, 2, 3)
    c.propose(1, b"three again")
    c.stabilize()
    assert messages(c, 1) == [b"with 4", b"with 5", b"five", b"three again"]
    for i in (2, 3):  # restarted: they applied the log again from its start
        assert messages(c, i) == messages(c, 1)


def test_one_change_at_a_time_and_bad_changes_change_nothing() -> None:
    c = led(3)
    c.add_node(4)
    core = c.core(1)
    last = core.last_index
    core.propose_conf_change(add(4))
    with pytest.raises(MembershipError, match="not committed yet"):
        core.propose_conf_change(remove(3))
    c.stabilize()
    for bad, why in (
        (add(2), "already a voter"),
        (promote(9), "not a member"),
        (remove(9), "not a member"),
    ):
        with pytest.raises(MembershipError, match=why):
            core.propose_conf_change(bad)
    assert core.last_index == last + 1  # only the one good change was appended
    with pytest.raises(NotLeader):
        c.core(2).propose_conf_change(remove(3))


def test_a_learner_far_behind_is_not_promoted() -> None:
    c = led(3, max_promote_lag=5)
    c.add_node(4)
    c.core(1).propose_conf_change(add(4))
    c.stabilize()
    c.crash(4)
    for k in range(10):
        c.propose(1, b"m%d" % k)
        c.stabilize()
    with pytest.raises(MembershipError, match="entries behind"):
        c.core(1).propose_conf_change(promote(4))
    c.restart(4)
    c.tick_all(15)  # a heartbeat frees one lost append of its window at a time
    assert c.core(4).last_index == c.core(1).last_index
    c.core(1).propose_conf_change(promote(4))  # caught up now


def test_a_new_leader_must_commit_in_its_term_before_a_change() -> None:
    c = led(3)
    c.crash(1)
    for _ in range(100):  # elect 2 or 3, but let no append through: its no-op stays
        for i in (2, 3):
            c.tick(i)
        c.process_all()
        c.deliver(drop=lambda m: isinstance(m, AppendEntries))
        if c.leader() is not None:
            break
    leader = c.leader()
    assert leader is not None
    core = c.core(leader)
    with pytest.raises(MembershipError, match="not committed an entry of its term"):
        core.propose_conf_change(remove(1))
    c.stabilize()  # the no-op commits: now it may
    core.propose_conf_change(remove(1))


def test_removing_the_leader_hands_leadership_over_after_the_commit() -> None:
    c = led(3)
    c.core(1).propose_conf_change(remove(1))
    c.stabilize()
    c.tick_all(3)
    leader = c.leader()
    assert leader in (2, 3)
    assert c.core(1).role is Role.FOLLOWER
    assert c.core(leader).membership.voters == (2, 3)
    c.propose(leader, b"after")
    c.stabilize()
    assert b"after" in c.applied_data(2) and b"after" in c.applied_data(3)
    c.tick(1, 100)  # the removed node never campaigns again
    assert c.core(1).role is Role.FOLLOWER and c.core(1).term == c.core(leader).term


def test_an_uncommitted_configuration_is_rolled_back_with_its_entry() -> None:
    c = led(3)
    c.add_node(4)
    c.isolate(1)
    c.core(1).propose_conf_change(add(4))
    c.process_all()
    c.mailbox.clear()
    assert c.core(1).membership.ids == (1, 2, 3, 4)  # in effect once appended
    c.heal()
    c.crash(1)
    leader = elect_another(c)
    c.propose(leader, b"x")
    c.stabilize()
    c.restart(1)
    c.tick_all(3)
    assert c.core(1).membership.ids == (1, 2, 3)  # the new leader's log replaced it


def test_membership_survives_a_restart_through_the_hard_state_and_the_log() -> None:
    c = led(3)
    grow(c, 4)
    c.core(1).propose_conf_change(remove(2))
    c.stabilize()
    c.tick_all(2)
    for i in (1, 3, 4):
        hs = c.nodes[i].hard_state
        assert hs.conf_index == c.core(i).conf_index and hs.conf
        c.crash(i)
        c.restart(i)
        assert c.core(i).membership.voters == (1, 3, 4)
    # From the log alone (a hard state of before the changes): replayed.
    core = RaftCore(
        c.config(3), c.nodes[3].storage, HardState(c.nodes[3].hard_state.term), rng=c.rng
    )
    assert core.membership.voters == (1, 3, 4)


def test_a_node_restored_from_a_snapshot_learns_the_membership() -> None:
    c = led(3)
    grow(c, 4)
    for k in range(5):
        c.propose(1, b"s%d" % k)
        c.stabilize()
    c.tick_all(2)
    c.compact(1)
    c.compact(2)
    c.compact(3)
    c.compact(4)
    c.add_node(5)
    c.core(1).propose_conf_change(add(5))
    c.stabilize()
    c.tick_all(3)
    assert c.nodes[5].snapshots and c.core(5).membership.ids == (1, 2, 3, 4, 5)
    assert c.core(5).commit_index == c.core(1).commit_index


def test_peer_validation_refuses_a_bad_configuration_entry() -> None:
    bad = AppendEntries(1, 2, 3, 0, 0, (Entry(1, 3, b"{nope", EntryKind.CONFIG),), 0)
    with pytest.raises(InvalidPeerMessage, match="bad configuration"):
        check_peer_message(bad, me=2, peers=(1, 2, 3), term=3, max_entry_bytes=1 << 20)


# --- the hard-state record ---


def test_the_hard_state_record_keeps_the_configuration_and_reads_the_old_one(
    tmp_path: Path,
) -> None:
    conf = Membership.voters_only([1, 2, 4]).encode()
    f = RaftStateFile(tmp_path / "raft.state")
    f.save(HardState(7, 2, 40, 33, conf))
    assert RaftStateFile(f.path).load() == HardState(7, 2, 40, 33, conf)
    assert f.needs_sync(HardState(7, 2, 41, 33, conf)) is False  # the commit rides along
    assert f.needs_sync(HardState(7, 2, 41, 39, conf)) is True  # a new configuration does not
    f.save_commit(50)
    assert RaftStateFile(f.path).load() == HardState(7, 2, 50, 33, conf)
    # A record written before membership change (magic "RAFT", no configuration).
    body = struct.pack(">iqiq", 0x52414654, 5, 3, 9)
    f.path.write_bytes(body + struct.pack(">I", zlib.crc32(body)))
    assert RaftStateFile(f.path).load() == HardState(5, 3, 9)
    f.path.write_bytes(f.path.read_bytes()[:-1] + b"\x00")
    with pytest.raises(CorruptEntry):
        RaftStateFile(f.path)


# --- the catch-up throttle ---


def test_a_follower_far_behind_catches_up_at_the_throttled_rate_and_commits_never_wait() -> None:
    rate, size = 200, 50
    c = Cluster(3, catch_up_bytes_per_tick=rate, max_append_entries=2)
    c.campaign(1)
    c.crash(3)
    for _ in range(30):
        c.propose(1, b"x" * size)
        c.stabilize()
    c.restart(3)
    per_tick: list[int] = []
    for k in range(200):
        first = len(c.sent)
        c.propose(1, b"live%d" % k)  # each tick a new entry: it commits at once
        c.tick_all(1)
        assert c.core(1).commit_index == c.core(1).last_index
        committed = c.core(1).commit_index
        per_tick.append(
            sum(
                len(e.data)
                for m in c.sent[first:]
                if isinstance(m, AppendEntries)
                and m.dst == 3
                and m.prev_index + len(m.entries) <= committed - 1
                for e in m.entries
            )
        )
        if c.core(3).last_index == c.core(1).last_index:
            break
    assert c.core(3).last_index == c.core(1).last_index  # it did catch up
    assert max(per_tick) <= rate + 2 * size  # a tick's budget, and the one append overdrawing it
    assert len(per_tick) >= 30 * size // (rate + 2 * size)  # so it took that many ticks
