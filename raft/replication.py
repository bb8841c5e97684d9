"""Replication: the log's flow from the leader to the followers, and the leader's duties.

Owns: `Replication`, the part of `RaftCore` that moves the log (a mixin over
`CoreState`, raft/state.py, calling only it and the objects it composes; the
election side is raft/election.py, and the two never call each other).

- The follower side answers appends, snapshots and heartbeats.
- The leader side fills each follower's window of pipelined appends from its
  `Progress` (probe, replicate, snapshot; raft/progress.py) in the
  `ProgressTracker` (raft/tracker.py), advances the commit index from the
  voters' match indexes (raft/quorum.py), and sends a `Snapshot` to a follower
  behind its first retained entry.
- The leader's clock: heartbeats every `heartbeat_ticks`, the catch-up
  throttle's refill every tick; every election timeout check-quorum (step down
  unless a quorum was heard from) and the end of a transfer that did not finish
  in time.
- ReadIndex: a read is answered with the commit index at the time it arrived,
  once a quorum has acknowledged a heartbeat sent after it; the queues are a
  `ReadOnly` (raft/readonly.py).
- Leadership transfer: bring the target up to date, then `TimeoutNow`; the
  preferred leader, to which a leader hands over once it is caught up and its
  heartbeat answers say it may campaign (`HeartbeatResponse.no_lead`: a drained
  node); and a removed leader's hand-over to the most caught-up voter.
- A configuration change under a leader (`_follow_conf_as_leader`): new members
  are tracked at once, removed ones once their removal commits.

Invariants kept here:
- a follower never truncates or overwrites an entry at or below its commit
  index, and acknowledges only what an append proves matches. A leader's append
  or snapshot that differs from its committed prefix (possible only after a
  majority lost acknowledged entries: async flush and a power loss) raises
  `LogDiverged` before anything changes the log; the driver rolls back or stops.
- a follower never commits beyond its own log, whatever the leader believes.
- a leader commits only entries of its own term, by a quorum of voters, and
  never counts a follower's ack beyond its own log.
- a follower behind the leader's first retained entry gets a `Snapshot`; the
  core never touches its storage for it, the driver restores the storage from
  `Ready.snapshot`.
- new entries and commits are sent once per Ready (`_flush`), not per input.
- with a catch-up throttle (`Config.catch_up_bytes_per_tick`) an append of
  committed entries only goes to a follower while its byte budget lasts (the
  leader's tick refills it); appends carrying what a commit waits for never wait.
- a read is answered only once this leader has committed an entry of its own
  term (until then its commit index may be stale): earlier reads are held in
  the `ReadOnly` and released by that first commit; reads are answered in the
  order they arrived.
- at most one transfer is pending; while it is, proposals are refused
  (`RaftCore.propose`); it ends when the target campaigns, or after an
  election timeout.
- a removed member stays tracked (and gets the entries, its removal included)
  until its removal commits; then it gets a last heartbeat carrying the commit
  index, so that it applies its removal too.
"""

from __future__ import annotations

from raft.errors import Compacted, LogDiverged
from raft.messages import (
    AppendEntries,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    ReadIndexResponse,
    Snapshot,
    TimeoutNow,
)
from raft.progress import Progress, ProgressState
from raft.state import CoreState
from raft.storage import data_size
from raft.types import ReadState, Role, SnapshotMeta


class Replication(CoreState):
    # --- follower side ---

    def _handle_append(self, m: AppendEntries) -> None:
        log = self._log
        if m.prev_index < log.first_index() - 1:
            # Below our retained log, all committed here: nothing to check or append.
            self._send(AppendResponse(self._id, m.src, self._term, log.committed))
            return
        if m.prev_index < log.committed and log.match_term(m.prev_index, m.prev_term):
            # Overlaps our committed prefix: it must agree with it (see LogDiverged).
            # We then acknowledge only what this append proves, never our commit
            # index: the leader's log may lack entries we hold as committed.
            conflict = log.committed_conflict(m.entries)
            if conflict is not None:
                raise LogDiverged(conflict, conflict - 1, log.committed, m.src, self._term)
        last_new = log.maybe_append(m.prev_index, m.prev_term, m.entries)
        if last_new is not None:
            log.commit_to(min(m.commit, last_new))
            self._caught_up_to(last_new)
            if not (m.quiet and not m.entries):
                self._send(AppendResponse(self._id, m.src, self._term, last_new))
            return
        hint_index, hint_term = log.find_conflict_by_term(
            min(m.prev_index, log.last_index()), m.prev_term
        )
        self._send(
            AppendResponse(self._id, m.src, self._term, m.prev_index, True, hint_index, hint_term)
        )

    def _handle_snapshot(self, m: Snapshot) -> None:
        """Restart the log after (m.index, m.log_term) unless it already holds it.
        Always answered with a successful AppendResponse: the point is committed."""
        log = self._log
        if m.index <= log.committed and not (
            m.index < log.first_index() - 1 or log.match_term(m.index, m.log_term)
        ):
            # The leader's committed prefix ends with another entry than ours there.
            raise LogDiverged(m.index, m.index - 1, log.committed, m.src, self._term)
        if m.index <= log.committed:
            index = log.committed  # stale or duplicate: we are already past it
        elif log.match_term(m.index, m.log_term):
            log.commit_to(m.index)  # we hold that entry: no restore needed
            index = m.index
        else:
            snap = SnapshotMeta(m.index, m.log_term, m.data, m.conf, m.conf_index)
            log.restore(snap)
            self._unsent_snapshot = snap
            index = m.index
        self._caught_up_to(index)
        self._send(AppendResponse(self._id, m.src, self._term, index))

    def _caught_up_to(self, index: int) -> None:
        """The leader's log and ours agree up to `index`: lift the election gate there."""
        if self._catch_up_to and index >= self._catch_up_to:
            self._catch_up_to = 0

    def _handle_heartbeat(self, m: Heartbeat) -> None:
        # The leader sends min(our match, its commit); after we lost our log (a wiped
        # data directory) its idea of our match is stale: never commit beyond our log.
        last = self._log.last_index()
        self._log.commit_to(min(m.commit, last))
        self._caught_up_to(self._log.committed)
        if m.commit > last:
            # Tell the leader where our log ends, as a rejected append would.
            self._send(AppendResponse(self._id, m.src, self._term, m.commit, True, last, 0))
        no_lead = not self.may_campaign or bool(self._catch_up_to)
        self._send(HeartbeatResponse(self._id, m.src, self._term, m.ctx, no_lead))

    # --- leader side: acknowledgements ---

    def _handle_append_response(self, m: AppendResponse) -> None:
        pr = self._trk.progress[m.src]
        pr.recent_active = True
        if m.reject:
            if m.hint_index < pr.match:
                # The follower holds less than it acknowledged: its disk was wiped or
                # lost an unflushed tail. Count only what it has now and probe from there.
                pr.lost_log(m.hint_index)
                self._send_appends(m.src)
                return
            probe = m.hint_index
            if m.hint_term > 0:
                probe, _ = self._log.find_conflict_by_term(m.hint_index, m.hint_term)
            if pr.maybe_decr_to(m.index, probe):
                if pr.state is not ProgressState.PROBE:
                    pr.become_probe()
                self._send_appends(m.src)
            return
        if m.index > self._log.last_index():
            # The follower holds (as committed) more than our whole log: only possible
            # after a majority lost acknowledged entries (async flush and a power loss).
            # Its log cannot be matched against ours; never count it (and never crash).
            return
        updated = pr.maybe_update(m.index)
        if pr.state is ProgressState.SNAPSHOT:
            if pr.match < pr.pending_snapshot and pr.match + 1 < self._log.first_index():
                return  # an older ack: still waiting for the snapshot's
            pr.become_replicate()
        elif not updated:
            return
        elif pr.state is ProgressState.PROBE:
            pr.become_replicate()
        else:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            self._bcast_pending = True
        self._send_appends(m.src)
        self._maybe_send_timeout_now(m.src)

    def _handle_heartbeat_response(self, m: HeartbeatResponse) -> None:
        """The follower is alive: probe it if it lags (its reads: `_handle_read_ack`)."""
        pr = self._trk.progress[m.src]
        pr.recent_active = True
        pr.may_lead = not m.no_lead
        pr.probe_sent = False
        if pr.state is ProgressState.SNAPSHOT:
            # The follower is alive but has not acknowledged the snapshot within
            # about an election timeout: presume it lost and probe again.
            pr.snapshot_wait += 1
            if pr.snapshot_wait * self._cfg.heartbeat_ticks >= self._cfg.election_ticks:
                pr.become_probe()
        if pr.match < self._log.last_index():
            # The follower lags. In replicate, treat the oldest append in flight
            # as lost (one per heartbeat, so a lost window drains); once nothing
            # is in flight, probe with an empty append to find where it stands.
            # Probing while appends are in flight would only reject the window.
            force = True
            if pr.state is ProgressState.REPLICATE:
                pr.inflights.free_first_one()
                force = len(pr.inflights) == 0
            self._send_appends(m.src, force_empty=force)

    def _maybe_commit(self) -> bool:
        trk = self._trk
        index = trk.committed()
        log = self._log
        if index <= log.committed or log.term(index) != self._term:
            return False
        first_in_term = log.term(log.committed) != self._term
        log.commit_to(index)
        if first_in_term:
            self._release_waiting_reads()
        if trk.has_removed():
            self._drop_removed()  # a removal committed
        if self._id not in trk.voters and log.confs.index <= index:
            self._hand_over()  # our removal committed: hand leadership to a voter
        return True

    # --- leader side: the configuration ---

    def _follow_conf_as_leader(self) -> None:
        """The configuration in effect changed under this leader (`_trk` has it):
        track new members at once, drop removed ones once their removal commits,
        and commit what fewer voters may already make a quorum of."""
        self._trk.track_new_members(self._log.last_index() + 1)
        self._drop_removed()
        if self._transferee is not None and self._transferee not in self._trk.voters:
            self._transferee = None
        self._maybe_commit()
        self._bcast_pending = True

    def _drop_removed(self) -> None:
        """Stop replicating to removed members once their removal commits (until
        then they get the entries, the configuration that removes them included)."""
        log, me = self._log, self._id
        if log.confs.index <= log.committed:
            for p, match in self._trk.untrack_removed():
                # A last word: the commit index, so that it applies its removal too.
                self._send(Heartbeat(me, p, self._term, min(match, log.committed)))

    # --- leader side: sending ---

    def _flush(self) -> None:
        """Send what inputs left pending, once per Ready: this batches many
        proposals into one AppendEntries and many reads into one heartbeat round."""
        if self._role is not Role.LEADER:
            self._bcast_pending = self._heartbeat_pending = False
            return
        if self._bcast_pending:
            self._bcast_pending = False
            for p in self._trk.replicas:
                self._send_appends(p)
        if self._heartbeat_pending:
            self._heartbeat_pending = False
            self._bcast_heartbeat()

    def _bcast_heartbeat(self) -> None:
        ctx = self._reads.last_ctx()
        committed = self._log.committed
        for p in self._trk.replicas:
            pr = self._trk.progress[p]
            commit = min(pr.match, committed)
            pr.sent_commit = max(pr.sent_commit, commit)
            self._send(Heartbeat(self._id, p, self._term, commit, ctx))

    def _send_appends(self, peer: int, force_empty: bool = False) -> None:
        """Fill `peer`'s window with new entries; send an empty append if the
        peer has nothing new but has not heard the current commit index.

        Eager, once per Ready (`_flush`): under load the commit rides on the next
        append anyway; a commit-only append per sequential put costs the leader
        about 15% more CPU, but followers (their reads, their queues, analytics on
        replica files) then trail the leader by a message, not by a tick.

        A commit-only append to a replicating follower is `quiet`: its success is
        not answered. It tells the leader nothing the acks of the entries before
        it do not (an empty append is not tracked in flight; on a reject the
        follower does answer), and if one of those acks is lost, the heartbeat
        response finds the lag and probes with an append that is answered."""
        sent_any = False
        while self._maybe_send_append(peer, send_empty=False):
            sent_any = True
        if not sent_any:
            pr = self._trk.progress[peer]
            if not pr.is_paused() and (force_empty or pr.sent_commit < self._log.committed):
                quiet = not force_empty and pr.state is ProgressState.REPLICATE
                self._maybe_send_append(peer, send_empty=True, quiet=quiet)

    def _maybe_send_append(self, peer: int, send_empty: bool, quiet: bool = False) -> bool:
        pr = self._trk.progress[peer]
        if pr.is_paused():
            return False
        log = self._log
        cfg = self._cfg
        last = log.last_index()
        prev_index = pr.next - 1
        if pr.next < log.first_index():
            return self._send_snapshot(peer, pr)
        rate = cfg.catch_up_bytes_per_tick
        if rate and pr.budget <= 0 and pr.next + cfg.max_append_entries <= log.committed:
            return False  # far behind (catching up), its budget spent: the tick refills it
        try:
            if pr.next <= last:
                hi = min(last + 1, pr.next + cfg.max_append_entries)
                ents = log.entries(pr.next, hi, cfg.max_append_bytes)
            elif send_empty:
                ents = []
            else:
                return False
            prev_term = log.term(prev_index)
        except Compacted:  # the storage dropped a prefix meanwhile
            return self._send_snapshot(peer, pr)
        size = data_size(ents)
        if rate and prev_index + len(ents) <= log.committed:
            pr.budget -= size
        msg = AppendEntries(
            self._id,
            peer,
            self._term,
            prev_index,
            prev_term,
            tuple(ents),
            log.committed,
            quiet and not ents,
        )
        self._send(msg)
        pr.sent_entries(prev_index + len(ents), len(ents), size)
        pr.sent_commit = max(pr.sent_commit, min(log.committed, prev_index + len(ents)))
        return True

    def _send_snapshot(self, peer: int, pr: Progress) -> bool:
        """`peer` needs entries the storage no longer holds: tell it to restart
        its log where ours starts, and wait for its ack."""
        log = self._log
        index = log.first_index() - 1
        assert index <= log.committed, f"storage dropped uncommitted entries ({index})"
        term = log.term(index)
        data = log.storage.snapshot_data()
        conf_index, conf, encoded = log.confs.at(index)
        self._send(
            Snapshot(
                self._id,
                peer,
                self._term,
                index,
                term,
                log.committed,
                data,
                encoded or conf.encode(),
                conf_index,
            )
        )
        pr.become_snapshot(index)
        return True

    # --- the leader's clock ---

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._cfg.election_ticks:
            self._election_elapsed = 0
            active = not self._cfg.check_quorum or self._trk.quorum_active()
            self._trk.reset_recent_active()
            if not active:
                self._become_follower(self._term, None)
                return
            self._transferee = None  # a transfer that took an election timeout failed
            if self._removed_and_committed():
                # Removed, and nobody took over within an election timeout: step down
                # (the voters elect among themselves) rather than lead from outside.
                self._become_follower(self._term, None)
                return
        rate = self._cfg.catch_up_bytes_per_tick
        if rate:
            self._refill_catch_up(rate)
        if self._heartbeat_elapsed >= self._cfg.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._bcast_heartbeat()
            self._maybe_transfer_to_preferred()

    def _refill_catch_up(self, rate: int) -> None:
        """A tick's worth of catch-up bytes for every follower (one tick's at most
        saved up); one whose budget was spent gets its next appends now."""
        for p in self._trk.replicas:
            pr = self._trk.progress[p]
            if pr.budget < rate:
                spent = pr.budget <= 0
                pr.budget = min(pr.budget + rate, rate)
                if spent and pr.budget > 0:
                    self._send_appends(p)

    # --- leadership transfer ---

    def _start_transfer(self, target: int) -> None:
        """Hand over to `target` (a peer, not us, not already the transferee)."""
        self._transferee = target
        self._election_elapsed = 0
        if not self._maybe_send_timeout_now(target):
            self._send_appends(target)

    def _maybe_send_timeout_now(self, peer: int) -> bool:
        if peer != self._transferee or self._trk.progress[peer].match != self._log.last_index():
            return False
        self._send(TimeoutNow(self._id, peer, self._term))
        return True

    def _maybe_transfer_to_preferred(self) -> None:
        pref = self._cfg.preferred_leader
        if pref is None or pref == self._id or self._transferee is not None:
            return
        if self._removed_and_committed():
            self._hand_over()
            return
        if pref not in self._trk.voters:
            return
        pr = self._trk.progress[pref]
        if pr.recent_active and pr.may_lead and pr.match == self._log.last_index():
            self._start_transfer(pref)

    # --- leaving the group ---

    def _removed_and_committed(self) -> bool:
        """This leader is no voter of a committed configuration: it must hand over."""
        return self._id not in self._trk.voters and self._log.confs.index <= self._log.committed

    def _hand_over(self) -> None:
        """Transfer to the most up-to-date voter (it campaigns once caught up)."""
        if self._transferee is not None:
            return
        trk = self._trk
        willing = [p for p in trk.vote_peers if trk.progress[p].may_lead is not False]
        target = max(willing or trk.vote_peers, key=lambda p: trk.progress[p].match, default=None)
        if target is not None:
            self._start_transfer(target)

    # --- ReadIndex ---

    def _handle_read_index(self, ctx: bytes, requester: int) -> None:
        log = self._log
        if log.term(log.committed) != self._term:
            self._reads.hold(ctx, requester)
        elif self._trk.is_sole_voter():
            self._answer_read(ctx, log.committed, requester)
        elif self._reads.add(ctx, log.committed, requester, self._id):
            self._heartbeat_pending = True

    def _handle_read_ack(self, src: int, ctx: bytes) -> None:
        """`src` answered a heartbeat that carried `ctx` (b"": no read was pending)."""
        if ctx:
            for req in self._reads.recv_ack(src, ctx, self._trk.voters):
                self._answer_read(req.ctx, req.index, req.requester)

    def _release_waiting_reads(self) -> None:
        """The first commit of this leader's term: the held reads proceed."""
        for ctx, requester in self._reads.take_held():
            self._handle_read_index(ctx, requester)

    def _answer_read(self, ctx: bytes, index: int, requester: int) -> None:
        if requester == self._id:
            self._read_states.append(ReadState(ctx, index))
        else:
            self._send(ReadIndexResponse(self._id, requester, self._term, ctx, index))
