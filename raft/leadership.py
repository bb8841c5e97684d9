"""Leadership: the leader's clock, linearizable reads (ReadIndex), and handing over.

Owns: `Leadership`, the part of `RaftCore` that keeps a leader honest about
being one (a mixin over `CoreState`, raft/state.py):
- the heartbeat tick: heartbeats every `heartbeat_ticks`, the catch-up throttle's
  refill every tick; every election timeout
  check-quorum (step down unless a quorum was heard from) and the end of a
  transfer that did not finish in time;
- ReadIndex: a read is answered with the commit index at the time it arrived,
  once a quorum has acknowledged a heartbeat sent after it (raft/readonly.py);
- leadership transfer: bring the target up to date, then `TimeoutNow`; and the
  preferred leader, to which a leader hands over once it is caught up.

Invariants kept here:
- a read is answered only once this leader has committed an entry of its own
  term (until then its commit index may be stale): reads arriving earlier wait
  in `_reads_waiting` and are released by that first commit.
- reads are answered in the order they arrived (raft/readonly.py).
- at most one transfer is pending; while it is, proposals are refused
  (`RaftCore.propose`); it ends when the target campaigns, or after an
  election timeout.
"""

from __future__ import annotations

from raft import quorum
from raft.messages import ReadIndexResponse, TimeoutNow
from raft.state import CoreState
from raft.types import ReadState


class Leadership(CoreState):
    # --- the leader's clock ---

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._cfg.election_ticks:
            self._election_elapsed = 0
            active = [p for p, pr in self._progress.items() if pr.recent_active]
            for p in self._replicas:
                self._progress[p].recent_active = False
            if self._cfg.check_quorum and not quorum.has_quorum(self._voters, active):
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
        for p in self._replicas:
            pr = self._progress[p]
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
        if peer != self._transferee or self._progress[peer].match != self._log.last_index():
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
        if pref not in self._voters:
            return
        pr = self._progress[pref]
        if pr.recent_active and pr.match == self._log.last_index():
            self._start_transfer(pref)

    # --- leaving the group ---

    def _removed_and_committed(self) -> bool:
        """This leader is no voter of a committed configuration: it must hand over."""
        return self._id not in self._voters and self._log.confs.index <= self._log.committed

    def _hand_over(self) -> None:
        """Transfer to the most up-to-date voter (it campaigns once caught up)."""
        if self._transferee is not None:
            return
        target = max(self._vote_peers, key=lambda p: self._progress[p].match, default=None)
        if target is not None:
            self._start_transfer(target)

    # --- ReadIndex ---

    def _handle_read_index(self, ctx: bytes, requester: int) -> None:
        log = self._log
        if log.term(log.committed) != self._term:
            self._reads_waiting.append((ctx, requester))
        elif self._voters == (self._id,):
            self._answer_read(ctx, log.committed, requester)
        elif self._reads.add(ctx, log.committed, requester, self._id):
            self._heartbeat_pending = True

    def _handle_read_ack(self, src: int, ctx: bytes) -> None:
        """`src` answered a heartbeat that carried `ctx` (b"": no read was pending)."""
        if ctx:
            for req in self._reads.recv_ack(src, ctx, self._voters):
                self._answer_read(req.ctx, req.index, req.requester)

    def _release_waiting_reads(self) -> None:
        if self._reads_waiting:
            waiting, self._reads_waiting = self._reads_waiting, []
            for ctx, requester in waiting:
                self._handle_read_index(ctx, requester)

    def _answer_read(self, ctx: bytes, index: int, requester: int) -> None:
        if requester == self._id:
            self._read_states.append(ReadState(ctx, index))
        else:
            self._send(ReadIndexResponse(self._id, requester, self._term, ctx, index))
