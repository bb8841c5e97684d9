"""The real Ready driver, entry store and raft.state in the deterministic simulator
(tests/sim/driver_sim.py): sync flush mode with pipelined fsyncs, power losses that
tear what was not fsynced, partitions, lost messages.

A failure names its seed and the command that replays it (`python -m
tests.sim.driver_sim --seed N ...`). The fixed seeds run in the normal suite; the
random batch is marked `sim` (DRIVER_SIM_SEEDS sets its size). The EntryStore bugs
the simulation found are pinned in tests/test_entry_store.py.
"""

from __future__ import annotations

import bisect
import os
import random
from collections.abc import Sequence

import pytest

from raft import Message, NotLeader
from raft.driver import ReadyDriver
from raft.messages import AppendEntries
from tests.sim.driver_node import SimNode
from tests.sim.driver_sim import DriverSim
from tests.sim.power_loss import TEAR_MODES, tear
from tests.sim.simulation import SimFailure
from tests.sim.streams import NetProfile

STEPS = 2500
# (seed, nodes, write buffer): both cluster sizes, with and without the write buffer.
FIXED = [(1, 3, False), (2, 3, True), (3, 5, False), (4, 5, True), (5, 3, None), (6, 5, None)]
RANDOM_SEEDS = int(os.environ.get("DRIVER_SIM_SEEDS", "60"))
CHUNK = 10
FIRST_RANDOM = 1000


def _quiet(seed: int, nodes: int = 3, **kw: object) -> DriverSim:
    """No random faults or clients: a scripted scenario on a fast, lossless network."""
    opts: dict[str, object] = {
        "faults": False,
        "clients": False,
        "fsync_ms": (1, 1),
        "net": NetProfile(0.0, 1, 1),
        "compaction": False,
        "cluster_power_loss": False,
        "checkpoint_race": 0.0,
    }
    opts.update(kw)
    return DriverSim(seed, nodes, **opts)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seed", "nodes", "write_buffer"), FIXED)
def test_fixed_seed(seed: int, nodes: int, write_buffer: bool | None) -> None:
    DriverSim(seed, nodes, write_buffer=write_buffer).run(STEPS)  # SimFailure: replay line


@pytest.mark.sim
@pytest.mark.parametrize(
    "first",
    range(FIRST_RANDOM, FIRST_RANDOM + RANDOM_SEEDS, CHUNK),
    ids=lambda s: f"seeds{s}-{s + CHUNK - 1}",
)
def test_random_seeds(first: int) -> None:
    for seed in range(first, first + CHUNK):
        DriverSim(seed).run(3000)


def test_same_seed_same_history() -> None:
    runs = []
    for _ in range(2):
        sim = DriverSim(7, 5, record=True)
        sim.run(1500)
        runs.append((sim.checker.canon, dict(sim.stats), sim.now, sim.steps, sim.events))
    assert runs[0] == runs[1]


def test_the_simulation_exercises_its_faults() -> None:
    """Every fault and every path it is meant to reach is reached by a few seeds.

    Which seeds reach what shifts with any change to the order of events (a cluster
    power loss takes a 1-in-22 draw per fault): a failure after such a change may
    need another window of seeds, not a fix."""
    total: dict[str, int] = {}
    for seed in range(44, 52):
        sim = DriverSim(seed, cluster_power_loss=True, compaction=seed % 2 == 0)
        sim.run(STEPS)
        for key, value in sim.stats.items():
            total[key] = total.get(key, 0) + value
        assert len(sim.checker.canon) > 30, f"seed {seed} committed almost nothing"
    for key in (
        "crashes",
        "crashes_in_fsync",
        "cluster_power_losses",
        "torn_lost",
        "torn_prefix",
        "torn_garbage",
        "tail_cuts",
        "truncations",
        "appends_during_fsync",
        "checkpoints",
        "partitions",
        "stream_breaks",
        "compactions",
        "snapshots_restored",
        "crashes_unanchored",
    ):
        assert total.get(key, 0) > 0, (key, total)


# --- the pipeline ------------------------------------------------------------


def _first_at(events: Sequence[tuple[int, int, str, int]], node: int, what: str, index: int) -> int:
    """When `node` first logged `what` at or beyond `index`."""
    for t, n, w, i in events:
        if n == node and w == what and i >= index:
            return t
    raise AssertionError(f"node {node} never logged {what} >= {index}")


def test_acks_and_applies_wait_for_the_fsync_while_the_leader_keeps_appending() -> None:
    """Followers' fsyncs take 15 ms, the leader's 25 ms, the network 1-2 ms; the
    leader gets a proposal every 2 ms. A follower acknowledges an entry only after
    the fsync covering it completed (so never sooner than 15 ms after appending
    it) and applies it no sooner; the leader meanwhile appends further Readies with
    its own fsync outstanding and sends them on at once (its fsync overlaps the
    replication)."""
    seed = 11
    sim = _quiet(
        seed, 3, fsync_ms=(15, 15), net=NetProfile(0.0, 1, 2), checkpoints=False, record=True
    )
    try:
        sim.run_until(lambda: sim.leader() is not None, 3000, "leader")
        leader = sim.leader()
        assert leader is not None
        leader.node.fsync_ms = (25, 25)
        proposed = []
        for k in range(30):
            proposed.append(sim.propose(b"p%d" % k))
            start = sim.now
            sim.run_until(lambda: sim.now >= start + 2, 100, "time")  # noqa: B023
        last = proposed[-1]
        sim.run_until(
            lambda: all(n.life is not None and n.life.applied >= last for n in sim.nodes.values()),
            3000,
            "everything applied",
        )
        events = sim.events
        followers = [i for i in sim.nodes if i != leader.node.id]
        held = 0
        for t, node, what, index in events:
            if what == "ack" and node in followers:
                appended = _first_at(events, node, "append", index)
                durable = _first_at(events, node, "fsync_done", index)
                assert t >= durable >= appended + 15, (seed, node, index, appended, durable, t)
                held += 1
            if what == "apply":
                assert t >= _first_at(events, node, "fsync_done", index), (seed, node, index, t)
        assert held >= 10, f"seed {seed}: only {held} acknowledgements"
        # The leader appended while an fsync of its own was in flight, several times per
        # fsync, and sent those entries before its own disk had them.
        windows = leader.flusher.history
        starts = [w[0] for w in windows]
        during: dict[int, int] = {}
        for t, node, what, _ in events:
            if node == leader.node.id and what == "append":
                k = bisect.bisect_right(starts, t) - 1
                if k >= 0 and windows[k][0] < t < windows[k][1]:
                    during[k] = during.get(k, 0) + 1
        assert max(during.values(), default=0) >= 2, f"seed {seed}: no pipelined appends"
        early = sum(
            1
            for t, node, what, index in events
            if node == leader.node.id
            and what == "send_entries"
            and t < _first_at(events, node, "fsync_done", index)
        )
        assert early >= 10, f"seed {seed}: the leader waited for its own fsync ({early})"
    finally:
        sim.close()


def test_a_commit_notice_lingers_and_the_next_append_carries_it() -> None:
    """A leader holds each commit-only notice LINGER_MS: with proposals further apart
    it leaves then (and every follower applies everything); with proposals closer
    together the next append carries the commit and the notice is never sent."""
    sim = _quiet(12, 3, fsync_ms=(1, 1), net=NetProfile(0.0, 1, 1), checkpoints=False)
    try:
        sim.run_until(lambda: sim.leader() is not None, 3000, "leader")
        leader = sim.leader()
        assert leader is not None
        notices: list[tuple[int, int]] = []  # (time, commit) of each notice sent
        send = leader.driver._send

        def counted(messages: Sequence[Message]) -> None:
            notices.extend(
                (sim.now, m.commit) for m in messages if isinstance(m, AppendEntries) and m.quiet
            )
            send(messages)

        leader.driver._send = counted

        def propose_every(gap_ms: int, count: int) -> int:
            last = 0
            for k in range(count):
                last = sim.propose(b"p%d" % k)
                start = sim.now
                sim.run_until(lambda: sim.now >= start + gap_ms, 100, "time")  # noqa: B023
            lives = [n.life for n in sim.nodes.values()]
            sim.run_until(
                lambda: all(life is not None and life.applied >= last for life in lives),
                3000,
                "all applied",
            )
            return last

        propose_every(10, 20)
        apart = len(notices)
        assert apart >= 2 * 15, f"seed 12: {apart} notices for 20 puts 10 ms apart"
        notices.clear()
        propose_every(2, 40)  # without the linger: 49 notices
        assert len(notices) <= 20, f"seed 12: {len(notices)} notices for 40 puts 2 ms apart"
    finally:
        sim.close()


def test_a_flush_by_the_checkpointer_before_the_request_is_reported() -> None:
    """The entry checkpointer's flush lands between the driver's append and its
    flush request after every append: the flusher must answer a request for bytes
    already flushed (with no fsync of its own), or the driver's held acks never
    leave."""
    sim = DriverSim(8, 3, checkpoint_race=1.0, faults=False, compaction=False)
    sim.run(800)  # liveness at the end: every node applies a new entry
    assert sim.stats["checkpoint_races"] > 50


def _raft_state_scenario(sim: DriverSim) -> tuple[SimNode, int]:
    """F holds a durable, uncommitted suffix (term 1) that a new leader's entries
    replace; while F's fsync of the new entries is in flight F votes in a newer
    term (raft.state is saved). Returns F and the index its old suffix starts at."""
    sim.run_until(lambda: sim.leader() is not None, 3000, "leader")
    for k in range(5):
        sim.propose(b"base-%d" % k)
    nodes = list(sim.nodes.values())
    sim.run_until(lambda: all(n.life is not None and n.life.applied >= 6 for n in nodes), 2000, "6")
    sim.run_until(lambda: sim.now > 1200, 3000, "entry checkpoints")
    a = sim.leader()
    assert a is not None
    f, b = (n for n in nodes if n is not a.node)
    # A's appends reach F only, F's acknowledgements never reach A; A's own fsync is slow.
    sim.net.block([(a.node.id, b.id), (f.id, a.node.id)])
    a.node.fsync_ms = (80, 80)
    first = sim.propose(b"old-1")
    sim.propose(b"old-2")
    assert f.life is not None
    flife = f.life
    sim.run_until(lambda: flife.durable_last() >= first + 1, 100, "F's durable old suffix")
    sim.crash(a.node)  # A loses its unflushed suffix
    a.node.fsync_ms = None
    sim.net.heal()
    sim.net.block([(f.id, a.node.id), (a.node.id, f.id), (f.id, b.id), (b.id, f.id)])

    def new_leader() -> bool:
        life = sim.leader()
        return life is not None and life.node is not f and life.core.term > 1

    sim.run_until(new_leader, 5000, "a leader without F")
    new = [sim.propose(b"new-%d" % k) for k in range(3)]
    sim.run_until(
        lambda: all(n.life is not None and n.life.applied >= new[-1] for n in (a.node, b)),
        3000,
        "the new entries committed",
    )
    f.fsync_ms = (100, 100)
    sim.net.heal()
    truncations = sim.stats["truncations"]
    sim.run_until(
        lambda: sim.stats["truncations"] > truncations and flife.core.commit_index >= first,
        1000,
        "F replacing its old suffix",
    )
    leader = sim.leader()
    assert leader is not None and leader.node is not f
    other = next(n for n in nodes if n is not f and n is not leader.node)
    term = leader.core.term
    try:
        leader.core.transfer_leadership(other.id)
    except NotLeader as exc:
        raise AssertionError(f"seed {sim.seed}: scenario: the leader changed ({exc})") from exc
    leader.kick()
    sim.run_until(lambda: flife.state_file.saved.term > term, 80, "F's vote in a newer term")
    assert flife.flusher.in_flight is not None, "scenario: F's fsync is no longer in flight"
    return f, first


def _replace_a_suffix_during_its_fsync(sim: DriverSim) -> SimNode:
    """F appends an uncommitted suffix from leader A whose fsync takes 3 s; A loses
    it in a power loss; B leads a new term and its entries reach F while F's fsync
    is still in flight. Returns F once its log holds B's entries."""
    sim.run_until(lambda: sim.leader() is not None, 3000, "leader")
    sim.propose(b"base")
    sim.run_until(lambda: sim.now > 1200, 3000, "entry checkpoints")
    sim.checkpoints = False  # no flush but the driver's from here on
    a = sim.leader()
    assert a is not None
    f, b = (n for n in sim.nodes.values() if n is not a.node)
    sim.net.block([(a.node.id, b.id)])
    a.node.fsync_ms = f.fsync_ms = (3000, 3000)
    first = sim.propose(b"old")
    old_term = a.core.term
    flife = f.life
    assert flife is not None
    sim.run_until(
        lambda: flife.store.last_index() >= first and flife.flusher.in_flight is not None,
        100,
        "F's old suffix being fsynced",
    )
    assert flife.durable_last() < first
    sim.crash(a.node)
    a.node.fsync_ms = None
    sim.net.heal()

    def replaced() -> bool:
        return flife.store.last_index() >= first and flife.store.term(first) > old_term

    sim.run_until(replaced, 5000, "F taking the new leader's entries")
    return f


def test_a_follower_replaces_a_suffix_only_once_its_fsync_completed() -> None:
    sim = _quiet(3, 3)
    try:
        f = _replace_a_suffix_during_its_fsync(sim)
        assert f.life is not None and sim.stats["truncations"] == 1
        # The truncation waited for the 3 s fsync of the old suffix (SimStorage raises
        # an InvariantViolation for a truncation over bytes not yet durable).
        started, completed, _ = f.life.flusher.history[-1]
        assert completed - started == 3000 and completed <= sim.now
        sim.converge()
        sim.check_durability()
    finally:
        sim.close()


def test_raft_state_commit_never_covers_entries_not_yet_durable() -> None:
    """A restart applies raft.state's commit over the log it recovers: a commit saved
    with a vote must not cover entries whose fsync is in flight. If it did, a power
    loss now would bring the replaced suffix back (the truncation never reached the
    disk) and the node would apply it as committed."""
    sim = _quiet(0, 3, tear_modes=("lost",))
    try:
        f, first = _raft_state_scenario(sim)
        life = f.life
        assert life is not None
        assert life.state_file.saved.commit <= life.durable_last() < first
        sim.crash(f)
        sim.run_until(lambda: f.life is not None, 1000, "F's restart")
        sim.converge()
        sim.check_logs()
        sim.check_durability()
    finally:
        sim.close()


# --- the checkers catch a broken driver ----------------------------------------


def test_the_checkers_catch_acks_sent_before_the_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    def send_at_once(self: ReadyDriver, messages: Sequence[Message]) -> None:
        if messages:
            self._send(messages)

    monkeypatch.setattr(ReadyDriver, "_send_when_durable", send_at_once)
    with pytest.raises(SimFailure, match=r"acknowledged entries up to .* on disk"):
        DriverSim(1, 3).run(STEPS)


def test_the_checkers_catch_a_truncation_with_an_fsync_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def no_settle(self: ReadyDriver) -> None:
        return None

    monkeypatch.setattr(ReadyDriver, "settle", no_settle)
    sim = _quiet(3, 3)
    try:
        with pytest.raises(AssertionError, match=r"truncates its log at .* not yet durable"):
            _replace_a_suffix_during_its_fsync(sim)
    finally:
        sim.close()


def test_the_checkers_catch_a_commit_saved_beyond_the_durable_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The driver without its clamp: raft.state gets the core's commit as it is.
    no_clamp = property(lambda _: 1 << 62, lambda *_: None)
    monkeypatch.setattr(ReadyDriver, "_durable_index", no_clamp, raising=False)
    sim = _quiet(0, 3, tear_modes=("lost",))
    try:
        with pytest.raises(AssertionError, match=r"raft\.state's commit .* not yet on disk"):
            _raft_state_scenario(sim)
            sim.step()
    finally:
        sim.close()


# --- the power-loss model ------------------------------------------------------


def test_a_power_loss_keeps_every_byte_before_and_after_what_the_page_cache_changed() -> None:
    rng = random.Random(5)
    for _ in range(300):
        size = rng.choice((1024, 4096))
        old = bytearray(rng.randbytes(size) if rng.random() < 0.5 else bytes(size))
        cur = bytearray(old)
        lo = rng.randrange(size)
        hi = rng.randrange(lo + 1, size + 1)
        cur[lo:hi] = rng.randbytes(hi - lo)
        if cur == old:
            continue
        changed = [i for i in range(size) if cur[i] != old[i]]
        first, last = changed[0], changed[-1]
        for mode in TEAR_MODES:
            out = tear(bytes(cur), bytes(old), rng, mode)
            assert len(out) == size
            assert out[:first] == old[:first] and out[last + 1 :] == old[last + 1 :], mode
            if mode != "garbage":  # else one sector of the changed span holds junk
                assert all(out[i] in (cur[i], old[i]) for i in range(size)), mode
