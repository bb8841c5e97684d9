"""Log compaction and snapshots: a leader catches up a follower that is behind
its first retained entry with a `Snapshot`; the follower's core never touches
its storage for it, the driver restores it from `Ready.snapshot` first."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from raft import (
    AppendEntries,
    AppendResponse,
    Compacted,
    Config,
    Entry,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    MemoryStorage,
    RaftCore,
    RequestVote,
    Role,
    Snapshot,
    SnapshotMeta,
)
from raft.log import RaftLog
from raft.membership import Membership
from raft.progress import Progress, ProgressState
from tests.sim.harness import Cluster, entries

_BOOT = (0, Membership.voters_only([1]), b"")
_VOTERS_123 = Membership.voters_only([1, 2, 3]).encode()


def snapshots_to(c: Cluster, dst: int) -> list[Snapshot]:
    return [m for m in c.sent if isinstance(m, Snapshot) and m.dst == dst]


def lagging_follower(**overrides: Any) -> Cluster:
    """Node 1 leads; node 3 was down while 1 and 2 committed b0..b9 and
    compacted their logs up to what they applied."""
    c = Cluster(3, **overrides)
    c.campaign(1)
    assert c.core(1).role is Role.LEADER
    c.crash(3)
    for k in range(10):
        c.propose(1, b"b%d" % k)
        c.stabilize()
    c.tick_all(2)  # followers learn the final commit index
    c.compact(1)
    c.compact(2)
    assert c.core(1).first_index == 12 == c.core(1).commit_index + 1
    c.restart(3)
    return c


def state_of(c: Cluster, leader: int, peer: int) -> ProgressState:
    return c.core(leader).progress[peer].state


def catch_up(c: Cluster, ticks: int = 30) -> None:
    for _ in range(ticks):
        c.tick(1)
        c.stabilize()


# --- storage and log ---


def test_memory_storage_restore_empties_the_log_at_the_snapshot_point() -> None:
    s = MemoryStorage(entries(1, 1, 2, 2))
    assert s.snapshot_data() == b""
    s.restore(9, 3, b"where")
    assert (s.first_index(), s.last_index(), s.term(9)) == (10, 9, 3)
    assert s.all_entries() == []
    with pytest.raises(Compacted):
        s.term(8)
    s.append(entries(3, 4, start=10))
    assert [e.index for e in s.all_entries()] == [10, 11] and s.term(11) == 4


def test_raft_log_with_a_pending_snapshot_hides_the_storage() -> None:
    storage = MemoryStorage(entries(1, 1, 1, 2))
    log = RaftLog(storage, committed=2, applied=2, conf_base=_BOOT)
    log.append(entries(2, 2, start=5))  # unstable 5, 6
    snap = SnapshotMeta(8, 3, b"d")
    log.restore(snap)
    assert (log.first_index(), log.last_index(), log.term(8), log.committed) == (9, 8, 3, 8)
    assert log.unstable == [] and log.applied == 2 and not log.has_next_committed()
    with pytest.raises(Compacted):
        log.term(7)
    log.append(entries(3, 3, start=9))
    assert [e.index for e in log.entries(9, 11, 1 << 30)] == [9, 10]
    assert log.find_conflict_by_term(10, 2) == (8, 0)
    # Entries handed out before the restore are wiped by it: never stable.
    assert not log.stable_to(entries(3, 3, start=9))
    assert len(log.unstable) == 2
    log.snapshot_persisted(snap)
    assert log.snapshot is None and log.applied == 8
    storage.restore(8, 3, b"d")  # what the driver did
    storage.append(entries(3, 3, start=9))
    assert log.stable_to(entries(3, 3, start=9)) and log.unstable == []
    assert log.first_index() == 9 and log.last_index() == 10


def test_a_restart_between_restore_and_hard_state_recovers_the_commit() -> None:
    storage = MemoryStorage()
    storage.restore(20, 4, b"")
    core = RaftCore(
        Config(id=2, peers=(1, 2, 3)), storage, HardState(4, None, 3), rng=random.Random(0)
    )
    assert core.commit_index == 20 and core.applied == 20 and core.first_index == 21
    rd = core.ready()
    assert rd.hard_state == HardState(4, None, 20) and rd.committed_entries == ()


def test_progress_snapshot_state_pauses() -> None:
    pr = Progress(5, 4, 1 << 20)
    pr.become_snapshot(9)
    assert pr.state is ProgressState.SNAPSHOT and pr.is_paused()
    assert pr.next == 10 and pr.pending_snapshot == 9
    assert not pr.maybe_decr_to(rejected=4, match_hint=0), "no append is outstanding"


# --- the whole exchange ---


def test_leader_sends_a_snapshot_to_a_follower_behind_its_first_index() -> None:
    c = lagging_follower()
    catch_up(c)
    (snap,) = snapshots_to(c, 3)
    leader = c.core(1)
    assert (snap.src, snap.term, snap.index, snap.log_term, snap.data) == (1, 1, 11, 1, b"")
    assert snap.commit == 11
    follower = c.nodes[3]
    conf = Membership.voters_only([1, 2, 3])
    assert follower.snapshots == [SnapshotMeta(11, 1, b"", conf.encode(), 0)]
    assert (snap.conf, snap.conf_index) == (conf.encode(), 0)  # the bootstrap, spelt out
    assert follower.storage.first_index() == 12 and follower.storage.term(11) == 1
    assert c.core(3).commit_index == c.core(3).applied == leader.commit_index
    # It had applied the leader's first entry before it went down; the snapshot
    # covers 2..11, which are never handed out as committed entries.
    assert [e.index for e in follower.applied] == [1]
    pr = leader.progress[3]
    assert pr.state is ProgressState.REPLICATE and pr.match == leader.last_index


def test_after_the_snapshot_the_follower_receives_appends() -> None:
    c = lagging_follower()
    catch_up(c)
    c.propose(1, b"after1", b"after2")
    c.stabilize()
    c.tick_all(2)
    assert c.applied_data(3) == [b"after1", b"after2"]
    assert c.nodes[3].storage.all_entries() == c.nodes[1].storage.all_entries()
    assert c.core(3).commit_index == c.core(1).commit_index
    # ... and it can lead with its compacted log
    c.core(1).transfer_leadership(3)
    c.stabilize()
    assert c.core(3).role is Role.LEADER
    c.propose(3, b"from3")
    c.stabilize()
    c.tick_all(2)
    assert c.applied_data(1)[-1] == b"from3" == c.applied_data(2)[-1]


def test_a_lost_snapshot_is_sent_again_after_an_election_timeout() -> None:
    c = lagging_follower()
    lost = 0
    while not lost:  # the leader drains its window, probes, finds 3 behind
        c.tick(1)
        for _ in range(10):
            c.process_all()
            lost += len([m for m in c.mailbox if isinstance(m, Snapshot)])
            c.deliver(drop=lambda m: isinstance(m, Snapshot))
    for _ in range(5):
        c.tick(1)
        c.stabilize()
    assert len(snapshots_to(c, 3)) == 1
    assert c.core(1).progress[3].state is ProgressState.SNAPSHOT
    assert c.core(1).progress[3].pending_snapshot == 11
    appends = [m for m in c.sent if isinstance(m, AppendEntries) and m.dst == 3]
    sent_before = len(appends)
    c.propose(1, b"x")
    c.stabilize()
    appends = [m for m in c.sent if isinstance(m, AppendEntries) and m.dst == 3]
    assert len(appends) == sent_before, "paused while the snapshot is pending"
    catch_up(c, 10)
    assert len(snapshots_to(c, 3)) == 2
    assert c.core(1).progress[3].state is ProgressState.REPLICATE
    assert c.applied_data(3) == [b"x"]


def test_a_duplicate_snapshot_is_answered_without_a_second_restore() -> None:
    c = lagging_follower()
    catch_up(c)
    (snap,) = snapshots_to(c, 3)
    c.core(3).step(snap)
    rd = c.core(3).ready()
    assert rd.snapshot is None
    assert rd.messages == (AppendResponse(3, 1, 1, c.core(3).commit_index),)
    c.core(3).advance(rd)
    assert c.nodes[3].snapshots == [SnapshotMeta(11, 1, b"", _VOTERS_123, 0)]


def test_a_follower_leaves_the_snapshot_state_only_on_an_ack_covering_it() -> None:
    c = lagging_follower()
    catch_up(c, 3)  # heartbeats until the leader finds node 3 lags
    while not snapshots_to(c, 3):
        c.tick(1)
        c.process_all()
        c.deliver(where=lambda m: not isinstance(m, Snapshot))
    assert state_of(c, 1, 3) is ProgressState.SNAPSHOT
    c.core(1).step(AppendResponse(3, 1, 1, 0))  # an old ack
    assert state_of(c, 1, 3) is ProgressState.SNAPSHOT
    c.stabilize()  # delivers the snapshot
    assert state_of(c, 1, 3) is ProgressState.REPLICATE


# --- the follower side, one core at a time ---


def follower(log: Sequence[Entry], hs: HardState, **kw: Any) -> tuple[RaftCore, MemoryStorage]:
    storage = MemoryStorage(log)
    core = RaftCore(Config(id=2, peers=(1, 2, 3), **kw), storage, hs, rng=random.Random(1))
    return core, storage


class PoisonedStorage(MemoryStorage):
    """Fails any read while `poisoned`: the core must not read a storage the driver
    is restoring."""

    __slots__ = ("poisoned",)

    def __init__(self, ents: Sequence[Entry]) -> None:
        self.poisoned = False
        super().__init__(ents)

    def _check(self) -> None:
        assert not self.poisoned, "the core read the storage during a restore"

    def first_index(self) -> int:
        self._check()
        return super().first_index()

    def last_index(self) -> int:
        self._check()
        return super().last_index()

    def term(self, index: int) -> int:
        self._check()
        return super().term(index)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        self._check()
        return super().entries(lo, hi, max_bytes)


def test_ready_carries_the_snapshot_before_entries_and_the_ack() -> None:
    storage = PoisonedStorage(entries(1, 1, 2, 2, 2))  # a divergent term-2 tail
    core = RaftCore(
        Config(id=2, peers=(1, 2, 3)), storage, HardState(2, None, 2), rng=random.Random(1)
    )
    core.step(Snapshot(1, 2, 3, 10, 3, 12, b"pos"))
    storage.poisoned = True  # from here the driver owns the storage
    assert (core.first_index, core.last_index, core.log_term(10)) == (11, 10, 3)
    core.step(AppendEntries(1, 2, 3, 10, 3, tuple(entries(3, 3, start=11)), 12))
    rd = core.ready()
    assert rd.snapshot == SnapshotMeta(10, 3, b"pos")
    assert [e.index for e in rd.entries] == [11, 12]
    assert rd.hard_state == HardState(3, None, 12)
    assert [e.index for e in rd.committed_entries] == [11, 12], "never the snapshot's"
    # Acks coalesce: the one for 12 covers the snapshot's (10).
    assert rd.messages == (AppendResponse(2, 1, 3, 12),)
    # The core keeps working on its own view while the driver restores.
    core.step(Heartbeat(1, 2, 3, 12, b"c"))
    core.step(AppendEntries(1, 2, 3, 12, 3, tuple(entries(3, start=13)), 12))
    core.step(RequestVote(3, 2, 3, 20, 3))
    for _ in range(50):
        core.tick()
    assert core.role is Role.FOLLOWER, "no campaign with a pending snapshot"
    # The driver: restore first, then the entries, then the hard state.
    storage.poisoned = False
    snap = rd.snapshot
    storage.restore(snap.index, snap.term, snap.data)
    storage.append(rd.entries)
    core.advance(rd)
    assert core.applied == 12
    rd2 = core.ready()
    assert rd2.snapshot is None and [e.index for e in rd2.entries] == [13]
    assert HeartbeatResponse(2, 1, 3, b"c") in rd2.messages
    storage.append(rd2.entries)
    core.advance(rd2)
    assert storage.first_index() == 11 and storage.last_index() == 13


def test_a_snapshot_the_log_already_holds_only_advances_the_commit() -> None:
    core, storage = follower(entries(1, 1, 2, 2, 2), HardState(2, None, 1))
    core.step(Snapshot(1, 2, 2, 4, 2, 5, b""))
    rd = core.ready()
    assert rd.snapshot is None
    assert core.commit_index == 4 and storage.first_index() == 1
    assert [e.index for e in rd.committed_entries] == [1, 2, 3, 4]
    assert rd.messages == (AppendResponse(2, 1, 2, 4),)


def test_a_snapshot_at_or_below_the_commit_index_is_only_acknowledged() -> None:
    core, _ = follower(entries(1, 1, 2, 2, 2), HardState(2, None, 4))
    core.step(Snapshot(1, 2, 2, 3, 2, 4, b""))
    rd = core.ready()
    assert rd.snapshot is None and rd.messages == (AppendResponse(2, 1, 2, 4),)


def test_a_snapshot_from_a_stale_term_is_rejected() -> None:
    core, _ = follower(entries(1, 1), HardState(5, None, 1))
    core.step(Snapshot(1, 2, 4, 9, 4, 9, b""))
    rd = core.ready()
    assert rd.snapshot is None
    assert rd.messages == (AppendResponse(2, 1, 5, 0, reject=True),)
    assert core.commit_index == 1


def test_a_newer_snapshot_supersedes_a_pending_one() -> None:
    core, storage = follower(entries(1, 1), HardState(1, None, 1))
    core.step(Snapshot(1, 2, 2, 5, 2, 5, b"a"))
    rd = core.ready()
    core.step(Snapshot(1, 2, 2, 8, 2, 8, b"b"))  # before the driver finished
    storage.restore(5, 2, b"a")
    core.advance(rd)
    assert core.first_index == 9 and core.applied == 5
    rd2 = core.ready()
    assert rd2.snapshot == SnapshotMeta(8, 2, b"b")
    storage.restore(8, 2, b"b")
    core.advance(rd2)
    assert core.applied == 8 and core.commit_index == 8 and storage.first_index() == 9


def test_a_candidate_steps_down_on_a_snapshot_from_the_leader() -> None:
    core, _ = follower(entries(1), HardState(1, None, 1), pre_vote=False)
    for _ in range(30):
        core.tick()
    roles = [core.role]
    core.step(Snapshot(1, 2, core.term, 6, core.term, 6, b""))
    roles.append(core.role)
    assert roles == [Role.CANDIDATE, Role.FOLLOWER]
    assert core.leader_id == 1 and core.first_index == 7


# --- the wire ---


def test_snapshot_survives_the_wire() -> None:
    from proto import dledger_pb2 as pb
    from raftio.wire import from_proto, to_proto

    msg = Snapshot(1, 3, 7, 120, 6, 130, b"\x00pos\xff")
    wire = to_proto(msg).SerializeToString()
    p = pb.RaftMessage.FromString(wire)
    assert p.type == pb.RaftMessage.SNAPSHOT and p.snapshot == msg.data and p.index == 120
    assert from_proto(p) == msg


def test_a_follower_whose_log_was_wiped_is_caught_up_again() -> None:
    """A follower restarts with an empty log (its data directory was lost): the
    leader's heartbeat commit is beyond its log, it says where its log ends, and
    the leader counts only that and replicates everything again."""
    c = Cluster(3)
    c.campaign(1)
    for k in range(6):
        c.propose(1, b"w%d" % k)
        c.stabilize()
    c.tick_all(2)
    assert c.core(1).progress[3].match == c.core(1).last_index
    c.crash(3)
    c.nodes[3].storage = MemoryStorage(())
    c.nodes[3].hard_state = HardState()
    c.restart(3)
    c.tick_all(4)
    assert c.core(1).progress[3].match == c.core(1).last_index
    assert c.core(3).last_index == c.core(1).last_index
    assert c.log_terms(3) == c.log_terms(1)
