"""A fake disk for one simulated node: a durable log plus a durable hard state.

Owns: what survives a crash. Writes happen in the driver's order (raft/ready.py:
with a snapshot, its hard state first, with the commit no higher than the log
before the restore, then the restore; then entries, then hard state, then
sync); `persist` models a completed sync, `persist_torn` a crash part-way: the
snapshot's hard state and then its restore either happened or not (each
atomic, the restore only after the hard state), then only a prefix of the
entries reaches the disk (the last one torn away), and the hard state only if
every entry made it. `compact` models retention dropping an applied prefix.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from raft import Entry, HardState, MemoryStorage, SnapshotMeta


class FakeDisk:
    def __init__(self) -> None:
        self.storage = MemoryStorage()
        self.hard_state = HardState()
        self.syncs = 0

    def persist(
        self,
        snapshot: SnapshotMeta | None,
        entries: Sequence[Entry],
        hard_state: HardState | None,
    ) -> None:
        if snapshot is not None:
            self._save_before_restore(hard_state)
            self.storage.restore(snapshot.index, snapshot.term, snapshot.data)
        if entries:
            self.storage.append(entries)
        if hard_state is not None:
            self.hard_state = hard_state
        self.syncs += 1
        self._check()

    def persist_torn(
        self,
        snapshot: SnapshotMeta | None,
        entries: Sequence[Entry],
        hard_state: HardState | None,
        rng: random.Random,
    ) -> None:
        if snapshot is not None:
            if rng.random() < 0.5:
                return  # the crash came before the snapshot's hard state was saved
            self._save_before_restore(hard_state)
            if rng.random() < 0.5:
                return  # ... or before the restore
            self.storage.restore(snapshot.index, snapshot.term, snapshot.data)
        kept = rng.randrange(len(entries) + 1)
        if kept:
            self.storage.append(entries[:kept])
        if kept == len(entries) and hard_state is not None and rng.random() < 0.5:
            self.hard_state = hard_state
        self._check()

    def _save_before_restore(self, hard_state: HardState | None) -> None:
        """The snapshot's hard state (its membership) before the restore, its commit the
        one recorded before (raft/ready.py: the old log may hold uncommitted entries)."""
        if hard_state is not None:
            commit = self.hard_state.commit
            self.hard_state = dataclasses.replace(hard_state, commit=commit)

    def compact(self, index: int) -> None:
        """Retention: drop the entries up to `index` (applied, hence committed)."""
        self.storage.compact(index)
        self._check()

    def _check(self) -> None:
        assert self.hard_state.commit <= self.storage.last_index(), (
            f"durable commit {self.hard_state.commit} beyond durable log "
            f"{self.storage.last_index()}"
        )
