"""Retention on one node: delete old commit-log segments, then what referred to them.

A pass (every `interval_s`, or `dledger admin clean-now`) deletes the oldest
commit-log segments when it is the configured hour, or at once when the disk
is fuller than the force ratio, or when an admin forces it. Above the refuse
ratio the node refuses puts with a clear error until space is freed.

Never deleted: anything at or beyond the committed position or the position
dispatch last recorded durably (its checkpoint, within a second of dispatching),
and the newest segment. On a leader (unless the disk is past the
force ratio) neither is what a recently active follower still needs; a follower
that falls behind the retained start anyway is caught up from the leader's
first retained entry (Raft snapshot). After the commit log, consume-queue and
index files that refer only to deleted offsets go too, so min offsets advance.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime

from dispatch.dispatcher import Dispatcher
from dledger_commitlog.log.commitlog import DLedgerCommitLog
from dledger_commitlog.log.entry_store import EntryStore
from raft import RaftCore, Role
from store.retention_policy import RetentionPolicy, deletable_segments, disk_usage_ratio

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CleanOutcome:
    deleted_segments: int
    min_offset: int
    reason: str


class Retention:
    def __init__(
        self,
        policy: RetentionPolicy,
        store: EntryStore,
        commitlog: DLedgerCommitLog,
        dispatcher: Dispatcher,
        core: RaftCore,
    ) -> None:
        self.policy = policy
        self._store = store
        self._commitlog = commitlog
        self._dispatcher = dispatcher
        self._core = core
        self.refusal: str | None = None  # why puts are refused now (disk too full)
        self.usage_ratio = 0.0

    def check_disk(self) -> float:
        self.usage_ratio = disk_usage_ratio(self._store.directory)
        self.refusal = self.policy.refuses_writes(self.usage_ratio)
        return self.usage_ratio

    def safe_offset(self, under_pressure: bool) -> int:
        """Commit-log position below which whole segments may go."""
        # What dispatch recorded durably, not only what it did: an offset commit deleted
        # before the offsets file holds it would be lost to a crash (and to a snapshot).
        safe = min(self._commitlog.committed_pos, self._dispatcher.persisted_pos)
        core = self._core
        if core.role is Role.LEADER and not under_pressure:
            for peer, pr in core.progress.items():
                if peer == core.id or not pr.recent_active:
                    continue
                need = pr.match + 1
                if need <= self._store.first_index():
                    return self._commitlog.min_pos
                if need <= self._store.last_index():
                    safe = min(safe, self._store.pos_of(need))
        return safe

    def run_pass(self, forced: bool = False, ignore_age: bool = False) -> CleanOutcome:
        """One cleanup (blocking file deletion; call from the node's loop thread)."""
        usage = self.check_disk()
        reason = self.policy.should_clean(datetime.now(), usage, forced)
        min_offset = self._commitlog.min_offset
        if reason is None:
            return CleanOutcome(0, min_offset, "not the delete hour and the disk has room")
        pressure = usage >= self.policy.force_clean_ratio
        safe = self.safe_offset(pressure)
        data = self._store.data_queue
        segments = [
            (start, start + data.segment_size, os.stat(path).st_mtime)
            for start, path in data.segments()
        ]
        starts = deletable_segments(
            segments, safe, time.time(), self.policy, ignore_age=ignore_age or pressure
        )
        if not starts:
            return CleanOutcome(0, min_offset, f"{reason}: no segment is old enough and safe")
        keep_from = starts[-1] + data.segment_size
        first_kept = self._store.get_by_pos(self._store.next_entry_pos(keep_from)).index
        self._store.delete_prefix(first_kept)
        self._dispatcher.delete_below(self._commitlog.min_offset)
        outcome = CleanOutcome(len(starts), self._commitlog.min_offset, reason)
        log.info(
            "retention (%s): deleted %d commit-log segments; the log now starts at %d",
            reason,
            outcome.deleted_segments,
            outcome.min_offset,
        )
        self.check_disk()
        return outcome
