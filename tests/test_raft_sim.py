"""Randomized deterministic simulation: 300 seeds with crashes, torn writes,
pauses, partitions, drops, duplicates, reordering, log compaction and the
snapshots it forces; safety checked after
every step, progress demanded after healing. A failure names its seed and the
command that replays it (`python -m tests.sim --seed N --steps S`)."""

from __future__ import annotations

import pytest

from tests.sim.simulation import Simulation

SEEDS = 300
STEPS = 2500
CHUNK = 10


@pytest.mark.sim
@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK), ids=lambda s: f"seeds{s}-{s + CHUNK - 1}")
def test_random_seeds(first: int) -> None:
    for seed in range(first, first + CHUNK):
        Simulation(seed).run(STEPS)  # raises SimFailure with the replay command


@pytest.mark.sim
def test_same_seed_same_history() -> None:
    a, b = Simulation(7), Simulation(7)
    a.run(1500)
    b.run(1500)
    assert a.checker.canon == b.checker.canon
    assert a.stats == b.stats
    assert a.now == b.now


@pytest.mark.sim
@pytest.mark.parametrize("nodes", [3, 5])
def test_the_simulation_exercises_faults(nodes: int) -> None:
    total: dict[str, int] = {}
    for seed in range(20):
        sim = Simulation(seed, nodes)
        sim.run(2500)
        for key, value in sim.stats.items():
            total[key] = total.get(key, 0) + value
        assert len(sim.checker.canon) > 10, f"seed {seed} committed almost nothing"
    keys = ("crashes", "torn_writes", "fault_pause", "fault_split", "fault_transfer")
    for key in (*keys, "compactions", "snapshots_sent", "snapshots_restored"):
        assert total.get(key, 0) > 0, key
    assert total["reads_answered"] > 100
