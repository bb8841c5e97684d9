"""Elections: the election timer, (pre-)campaigns, votes and the leader lease.

Owns: `Elections`, the part of `RaftCore` that decides who leads (a mixin over
`CoreState`, raft/state.py, calling only it and the objects it composes). A
follower or candidate whose randomized timeout runs out campaigns: with
pre-vote first as a pre-candidate at term + 1 without changing its term, then
for real. The votes are recorded and tallied by the `ProgressTracker`
(raft/tracker.py), over the voters of the configuration in effect.

Invariants kept here:
- a node votes at most once per term (`_vote`, persisted before the answer
  leaves: it rides in the same Ready), and only for a log at least as
  up to date as its own; a pre-vote changes neither term nor vote.
- only a voter of the configuration in effect campaigns (a learner, a joining or
  a removed node never does; a node whose own removal is not committed yet still
  may, if it votes in the last committed one), and only voters' answers count;
  a node that may not campaign leaves its last leader's lease all the same;
- a node does not campaign while its log is being restored from a snapshot,
  while it lacks entries it knew were committed (`catch_up_to`, which also
  keeps it from granting any vote), or while the driver forbids it.
- with check-quorum, a node that heard from a live leader within an election
  timeout ignores a stray candidate of a higher term (the lease); a leadership
  transfer bypasses the lease.
"""

from __future__ import annotations

from raft.messages import RequestVote, VoteResponse
from raft.quorum import VoteResult
from raft.state import CoreState
from raft.types import Role


class Elections(CoreState):
    def _in_lease(self) -> bool:
        return (
            self._cfg.check_quorum
            and self._leader_id is not None
            and self._election_elapsed < self._cfg.election_ticks
        )

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._election_elapsed >= self._timeout and self._may_be_elected():
            self._election_elapsed = 0
            self._campaign(transfer=False)
        # A node that may not campaign lets its timer run on: it leaves its last
        # leader's lease, so that it can vote for a candidate (a learner whose
        # promotion the old leader appended may be a voter the candidate needs).

    def _may_be_elected(self) -> bool:
        """A voter of the configuration in effect; or, while that one is uncommitted, of
        the last committed one (Raft thesis 4.2.2: a leader that removed itself and
        stepped down may be the only node whose log can still be elected)."""
        if self._id in self._trk.voters:
            return True
        log = self._log
        return bool(log.confs.pending_after(log.committed)) and (
            self._id in log.confs.at(log.committed)[1].voters
        )

    def _campaign(self, transfer: bool) -> None:
        if not self._may_be_elected():
            return  # a learner, a joining or a removed node: it has no vote to seek
        if self._log.snapshot is not None:
            return  # our log is not in storage yet: wait for the driver's restore
        if self._catch_up_to:
            return  # we lack entries that may be committed: a leader must restore them
        if not self.may_campaign and len(self._trk.voters) > 1:
            return  # the driver knows this node could not serve its log as a leader
        pre_vote = self._cfg.pre_vote and not transfer
        if pre_vote:
            self._become_pre_candidate()
            term = self._term + 1
        else:
            self._become_candidate()
            term = self._term
        self._record_vote(self._id, granted=True)
        if self._role is Role.LEADER or (pre_vote and self._role is not Role.PRE_CANDIDATE):
            return  # a one-node cluster already decided
        last_index, last_term = self._log.last_index(), self._log.last_term()
        for p in self._trk.vote_peers:
            self._send(RequestVote(self._id, p, term, last_index, last_term, pre_vote, transfer))

    def _record_vote(self, voter: int, granted: bool) -> None:
        self._trk.record_vote(voter, granted)
        match self._trk.tally_votes():
            case VoteResult.WON:
                if self._role is Role.PRE_CANDIDATE:
                    self._campaign(transfer=True)  # a real election, no second pre-vote
                else:
                    self._become_leader()
            case VoteResult.LOST:
                self._become_follower(self._term, None)
            case VoteResult.PENDING:
                pass

    def _handle_vote_request(self, m: RequestVote) -> None:
        can_vote = not self._catch_up_to and (
            self._vote == m.src
            or (self._vote is None and self._leader_id is None)
            or (m.pre_vote and m.term > self._term)
        )
        if can_vote and self._log.is_up_to_date(m.last_index, m.last_term):
            self._send(VoteResponse(self._id, m.src, m.term, True, m.pre_vote))
            if not m.pre_vote:
                self._election_elapsed = 0
                self._vote = m.src
        else:
            self._send(VoteResponse(self._id, m.src, self._term, False, m.pre_vote))
