"""A power loss while index files are sealed but not flushed: recovery gives the index
a rebuild from the log gives, byte for byte and answer for answer.

Dispatch (the event loop) never flushes an index file; a file that fills is sealed
and flushed by the next checkpoint (`Dispatcher.persist`). The disk model here
keeps, of each index file, its bytes as of its last flush (zeros before the
first) and, of what was written since, any subset of 512-byte sectors: what a
power loss may leave. Messages go through the real put path and entry store
(tests/test_dispatch.py's `LocalLog`).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from dispatch.dispatcher import Dispatcher
from store.index_file import IndexFile
from tests.dispatch_helpers import LAYOUT, LocalLog, files_of, messages

SECTOR = 512


class Disk:
    """What each index file's flushes made durable (recorded as they happen)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.durable: dict[Path, bytes] = {}
        self.flushes = 0
        flush = IndexFile.flush

        def recording(f: IndexFile) -> None:
            flush(f)
            self.flushes += 1
            self.durable[f.path] = f.path.read_bytes()

        monkeypatch.setattr(IndexFile, "flush", recording)

    def power_loss(self, directory: Path, rng: random.Random) -> int:
        """Each sector written since its file's last flush survives or not; returns how
        many sectors went back to their durable bytes."""
        lost = 0
        for path in sorted(directory.iterdir()):
            now = path.read_bytes()
            old = self.durable.get(path, bytes(len(now)))
            torn = bytearray(now)
            for at in range(0, len(now), SECTOR):
                if now[at : at + SECTOR] != old[at : at + SECTOR] and rng.random() < 0.5:
                    torn[at : at + SECTOR] = old[at : at + SECTOR]
                    lost += 1
            path.write_bytes(bytes(torn))
        return lost


def index_of(root: Path) -> dict[str, bytes]:
    return {name: raw for name, raw in files_of(root).items() if name.startswith("index")}


def answers(d: Dispatcher, seeds: list[int]) -> list[list[int]]:
    """Every key the messages of `seeds` indexed, queried in every topic."""
    keys = {f"k{i}" for i in range(200)} | {f"user{i}" for i in range(7)}
    keys |= {f"U{seed}-{i}" for seed in seeds for i in range(200)}
    return [
        d.query_offsets(f"t{t}", key, 0, 1 << 62, 1000) for t in range(3) for key in sorted(keys)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_a_sealed_unflushed_index_file_after_a_power_loss_is_what_a_rebuild_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    disk = Disk(monkeypatch)
    log = LocalLog(tmp_path / "node")
    try:
        d = log.dispatcher()
        d.recover(log.cl.committed_pos)
        seeds = [seed * 10 + k for k in range(3)]
        log.put(messages(30, seed=seeds[0]))
        d.catch_up()
        d.persist(d.snapshot())
        # A file fills (sealed, not flushed by dispatch); the checkpoint flushes it.
        log.put(messages(100, seed=seeds[1]))
        flushes = disk.flushes
        d.catch_up()
        assert disk.flushes == flushes, f"seed {seed}: dispatch flushed an index file"
        sealed = d.index.flush_plan().sealed
        assert sealed, f"seed {seed}: no index file filled"
        d.persist(d.snapshot())
        assert all(disk.durable[f.path] == f.path.read_bytes() for f in sealed), f"seed {seed}"
        # More files fill past the checkpoint; then the power goes.
        log.put(messages(120, seed=seeds[2]))
        d.catch_up()
        assert d.index.flush_plan().sealed, f"seed {seed}: no index file filled"
        d.close(clean=False)
        assert disk.power_loss(log.root / "index", rng), f"seed {seed}: nothing to lose"
        again = log.dispatcher()
        assert again.recover(log.cl.committed_pos).crashed, f"seed {seed}"
        again.catch_up()
        again.persist(again.snapshot())
        recovered = answers(again, seeds)
        again.close(clean=True)

        rebuilt = tmp_path / "rebuilt"
        shutil.copytree(
            log.root,
            rebuilt,
            ignore=shutil.ignore_patterns(
                "consumequeue", "index", "checkpoint", "consumer_offsets.json", "abort"
            ),
        )
        fresh = Dispatcher(
            rebuilt,
            log.cl,
            units_per_file=LAYOUT["cq_units_per_file"],
            index_slots=LAYOUT["index_slots"],
            index_entries=LAYOUT["index_entries"],
        )
        fresh.recover(log.cl.committed_pos)
        fresh.catch_up()
        fresh.persist(fresh.snapshot())
        assert recovered == answers(fresh, seeds), f"seed {seed}"
        assert any(recovered), f"seed {seed}: no key was found at all"
        fresh.close(clean=True)
        assert index_of(rebuilt) == index_of(log.root), f"seed {seed}"
    finally:
        log.close()
