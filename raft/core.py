"""The sans-I/O Raft state machine: one node's `RaftCore`, and its public API.

Owns: `RaftCore`, one node's protocol state (the `Ready` it hands out and its
contract live in raft/ready.py). Inputs are `tick`, `step`, `propose`,
`transfer_leadership` and `read_index`; output is `ready()` and its
acknowledgement `advance()` (with async storage writes, durability comes
separately through `persisted()`). The core never reads the clock, the network,
the disk or the global `random`.

The core composes objects that own their state, after etcd-io/raft's
`tracker`, `quorum`, `confchange` and `readOnly`: the `RaftLog` (raft/log.py),
the `ProgressTracker` (raft/tracker.py: the configuration as the protocol sees
it, a leader's progress per peer, a candidate's votes), quorum arithmetic
(raft/quorum.py), configuration changes (raft/confchange.py) and a leader's
ReadIndex queues (raft/readonly.py). Its own fields and role transitions are
`CoreState` (raft/state.py); the protocol steps are two mixins over it that
never call each other: raft/election.py (campaigns, votes, the lease) and
raft/replication.py (the log's replication at both ends, commit, the leader's
clock, ReadIndex and transfer). This module holds what a driver calls, the
routing of each message by role (`step` -> `_step_leader/_step_candidate/
_step_follower`) and the following of the configuration in effect
(`_sync_conf`); each part's module states the invariants it keeps.

Invariants kept here:
- every message that depends on a hard state or entries leaves in the same
  `Ready` that carries them, or a later one (never an earlier one).
- a leader counts its own log in the quorum only up to what the driver has
  persisted (`advance`, or `persisted` with async storage writes), and with
  async storage writes only durable entries are applied.
- only a leader accepts proposals, and not while it is transferring leadership
  (a leader that lost its quorum steps down: raft/replication.py).
- a message of a higher term makes the node follow that term before it is
  handled (a pre-vote and a granted pre-vote answer excepted, and a vote request
  inside the leader lease is ignored); one of a lower term is answered only so
  that a stale leader or pre-candidate learns the term.
- a node restoring a snapshot does not campaign until the driver has restored
  it (`advance` of the Ready carrying it).
- membership is carried by the log (raft/membership.py): a configuration is in
  effect once appended, one change at a time (`propose_conf_change`, checked by
  raft/confchange.py), and the hard state records the last committed one.
- a node started with `catch_up_to` beyond its log (its disk lost entries it had
  acknowledged or knew committed) neither campaigns nor grants votes or pre-votes
  until a leader's replication has made its log match the leader's up to that
  index: with such a vote a quorum could elect a leader lacking committed entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from raft import confchange
from raft.election import Elections
from raft.errors import NotLeader, ProposalDropped
from raft.membership import ConfChange, Membership
from raft.messages import (
    AppendEntries,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    RequestVote,
    Snapshot,
    TimeoutNow,
    VoteResponse,
)
from raft.progress import PeerProgress
from raft.ready import Ready
from raft.replication import Replication
from raft.types import Entry, EntryKind, HardState, ReadState, Role


class RaftCore(Elections, Replication):
    """One Raft node's protocol state machine (see the module docstring).

    `RaftCore(config, storage, hard_state=HardState(), *, rng, applied=0,
    catch_up_to=0)`: the constructor and every field are in raft/state.py.
    """

    # --- read-only views ---

    @property
    def id(self) -> int:
        return self._id

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def vote(self) -> int | None:
        return self._vote

    @property
    def leader_id(self) -> int | None:
        return self._leader_id

    @property
    def commit_index(self) -> int:
        return self._log.committed

    @property
    def first_index(self) -> int:
        """The first index held in the log (entries below are compacted or
        covered by a snapshot)."""
        return self._log.first_index()

    @property
    def last_index(self) -> int:
        return self._log.last_index()

    @property
    def applied(self) -> int:
        return self._log.applied

    @property
    def catch_up_to(self) -> int:
        """The index this node must get back from a leader before it may vote or
        campaign (see the constructor); 0 once it has, or if it never lost anything."""
        return self._catch_up_to

    @property
    def lead_transferee(self) -> int | None:
        return self._transferee

    @property
    def hard_state(self) -> HardState:
        log = self._log
        conf_index, _, conf = log.confs.at(log.committed)
        return HardState(self._term, self._vote, log.committed, conf_index, conf)

    @property
    def membership(self) -> Membership:
        """The configuration in effect here: the last one in this node's log."""
        return self._conf

    @property
    def committed_membership(self) -> Membership:
        """The last committed configuration (the one in effect may be newer)."""
        return self._log.confs.at(self._log.committed)[1]

    @property
    def conf_index(self) -> int:
        """The index of the configuration entry in effect (0: the bootstrap)."""
        return self._log.confs.index

    @property
    def replicas(self) -> tuple[int, ...]:
        """Leader: the nodes it replicates to (the other members, and a member being
        removed until the removal commits); empty on other roles."""
        return self._trk.replicas

    @property
    def conf_pending(self) -> bool:
        """A configuration entry in the log is not committed yet."""
        return self._log.confs.pending_after(self._log.committed) > 0

    @property
    def progress(self) -> dict[int, PeerProgress]:
        """Per-peer replication state; empty unless this node is the leader."""
        return {
            p: PeerProgress(
                pr.match, pr.next, pr.state, pr.recent_active, pr.pending_snapshot, pr.may_lead
            )
            for p, pr in self._trk.progress.items()
        }

    def log_term(self, index: int) -> int:
        """Term of the entry at `index` (first_index - 1 <= index <= last_index)."""
        return self._log.term(index)

    def log_slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries [lo, hi) of this node's log, stable and unstable alike."""
        return self._log.entries(lo, hi, 1 << 62)

    # --- inputs ---

    def tick(self) -> None:
        """Advance logical time by one tick."""
        match self._role:
            case Role.LEADER:
                self._tick_heartbeat()
            case Role.FOLLOWER | Role.PRE_CANDIDATE | Role.CANDIDATE:
                self._tick_election()

    def propose(self, data: bytes | Sequence[bytes]) -> tuple[int, int]:
        """Append `data` (one entry, or one per item) and return (first, last) index."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if self._transferee is not None:
            raise NotLeader(self._transferee)
        if isinstance(data, bytes | bytearray | memoryview):
            data = (bytes(data),)  # one entry, not a sequence of ints
        batch: Sequence[bytes] = data
        if not batch:
            raise ProposalDropped("empty batch")
        first = self._log.last_index() + 1
        end = first + len(batch)
        self._log.append(list(map(Entry, range(first, end), repeat(self._term), batch)))
        self._bcast_pending = True
        return first, end - 1

    def propose_conf_change(self, change: ConfChange) -> int:
        """Append a configuration entry making `change`, in effect at once; its index.

        One change at a time: refused (MembershipError, nothing appended) while one is
        uncommitted, before this leader has committed an entry of its own term (the
        single-server change rule), for a change that does not apply to the
        membership in effect, and for a promotion of a learner more than
        `max_promote_lag` entries behind."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if self._transferee is not None:
            raise NotLeader(self._transferee)
        log = self._log
        new = confchange.propose(
            self._conf,
            change,
            pending=log.confs.pending_after(log.committed),
            term_committed=log.term(log.committed) == self._term,
            last_index=log.last_index(),
            match=self._trk.match_indexes(),
            max_promote_lag=self._cfg.max_promote_lag,
        )
        index = log.last_index() + 1
        log.append([Entry(index, self._term, new.encode(), EntryKind.CONFIG)])
        self._bcast_pending = True
        self._sync_conf()
        return index

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to `target` once it is caught up; aborts after an
        election timeout. Proposals are refused while the transfer is pending.
        ValueError for a target that is no voter, or that said it will not campaign."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if target not in self._trk.voters:
            raise ValueError(f"{target} is not a voter")
        if target in (self._id, self._transferee):
            return
        if self._trk.progress[target].may_lead is False:
            raise ValueError(f"node {target} takes no leadership now (drained)")
        self._start_transfer(target)

    def read_index(self, ctx: bytes) -> None:
        """Ask for a linearizable read position; the answer comes out as a
        `ReadState(ctx, index)` in a later Ready. `ctx` must be unique."""
        if self._role is Role.LEADER:
            self._handle_read_index(ctx, self._id)
        elif self._leader_id is None:
            raise NotLeader(None)
        else:
            self._send(ReadIndexRequest(self._id, self._leader_id, self._term, ctx))

    def step(self, m: Message) -> None:
        """Process one message addressed to this node (raises `LogDiverged`: see there)."""
        assert m.dst == self._id, (m, self._id)
        if m.term > self._term:
            if isinstance(m, RequestVote) and not m.transfer and self._in_lease():
                return  # a live leader exists: do not let a stray candidate disrupt it
            if isinstance(m, RequestVote) and m.pre_vote:
                pass  # a pre-vote does not change our term
            elif isinstance(m, VoteResponse) and m.pre_vote and m.granted:
                pass  # a granted pre-vote echoes the future term
            elif isinstance(m, AppendEntries | Heartbeat | Snapshot):
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, None)
        elif m.term < self._term:
            self._step_stale(m)
            return
        if isinstance(m, RequestVote):
            self._handle_vote_request(m)
            return
        match self._role:
            case Role.LEADER:
                if m.src in self._trk.progress:  # answers of a removed member are moot
                    self._step_leader(m)
            case Role.PRE_CANDIDATE | Role.CANDIDATE:
                self._step_candidate(m)
            case Role.FOLLOWER:
                self._step_follower(m)
        if self._log.confs.current is not self._conf:
            self._sync_conf()  # an append or a snapshot brought another configuration

    # --- output ---

    def has_ready(self) -> bool:
        """Whether `ready()` would hand out any work (never while a Ready is outstanding)."""
        if self._outstanding is not None:
            return False
        if self._bcast_pending or self._heartbeat_pending:
            self._flush()
        return bool(
            self._msgs
            or self._unsent_snapshot is not None
            or self._read_states
            or self._log.unstable
            or self._log.has_next_committed(self._apply_limit())
            or self._persisted_hs != self.hard_state
        )

    def ready(self) -> Ready:
        """Collect the work for the driver (see `Ready` for the order)."""
        assert self._outstanding is None, "advance() the previous Ready first"
        self._flush()
        hs = self.hard_state
        committed = self._log.next_committed(self._apply_limit())
        rd = Ready(
            entries=tuple(self._log.unstable),
            hard_state=None if hs == self._persisted_hs else hs,
            messages=tuple(self._msgs),
            committed_entries=tuple(committed),
            read_states=tuple(self._read_states),
            snapshot=self._unsent_snapshot,
        )
        self._unsent_snapshot = None
        self._msgs.clear()
        self._read_states.clear()
        if committed:
            self._log.applying = committed[-1].index
        self._outstanding = rd
        return rd

    def advance(self, rd: Ready) -> None:
        """The driver has persisted, sent and applied everything in `rd`."""
        assert rd is self._outstanding, "advance() takes the outstanding Ready"
        self._outstanding = None
        if rd.hard_state is not None:
            self._persisted_hs = rd.hard_state
        if rd.snapshot is not None:
            self._log.snapshot_persisted(rd.snapshot)
        if rd.entries and self._log.stable_to(rd.entries) and not self._cfg.async_storage_writes:
            self._on_durable(self._log.stable_index())
        if rd.committed_entries:
            self._log.applied_to(rd.committed_entries[-1].index)

    def persisted(self, index: int, term: int) -> None:
        """Async storage writes: the driver's storage holds the log up to `index`
        (whose term is `term`) durably. A report for an entry replaced since (a
        conflicting append truncated it) is ignored: its successor gets its own."""
        assert self._cfg.async_storage_writes, "advance() reports durability"
        log = self._log
        if index <= log.persisted or index > log.stable_index():
            return
        if not log.match_term(index, term):
            return
        self._on_durable(index)

    def _on_durable(self, index: int) -> None:
        """Entries up to `index` are durable here: they may be applied, and a leader
        counts its own log in the quorum up to there."""
        self._log.persisted = max(self._log.persisted, index)
        if self._role is Role.LEADER:
            pr = self._trk.progress[self._id]
            if pr.maybe_update(index) and self._maybe_commit():
                self._bcast_pending = True

    def _apply_limit(self) -> int | None:
        """With async storage writes only durable entries are applied (etcd's rule):
        a node never serves an entry its own disk may still lose."""
        return self._log.persisted if self._cfg.async_storage_writes else None

    # --- the configuration ---

    def _sync_conf(self) -> None:
        """Follow the configuration in effect (the log's last); cheap when unchanged."""
        conf = self._log.confs.current
        if conf is self._conf and self._trk.voters:
            return
        self._conf = conf
        self._trk.set_config(confchange.tracker_config(conf, self._id))
        if self._role is Role.LEADER:
            self._follow_conf_as_leader()

    # --- routing by role ---

    def _step_stale(self, m: Message) -> None:
        """A message from an older term: tell stale leaders and pre-candidates."""
        if isinstance(m, AppendEntries | Heartbeat | Snapshot):
            # Without this a leader cut off by check-quorum/pre-vote never learns the term.
            self._send(AppendResponse(self._id, m.src, self._term, 0, reject=True))
        elif isinstance(m, RequestVote) and m.pre_vote:
            self._send(VoteResponse(self._id, m.src, self._term, False, True))

    def _step_candidate(self, m: Message) -> None:
        match m:
            case AppendEntries():
                self._become_follower(m.term, m.src)
                self._handle_append(m)
            case Heartbeat():
                self._become_follower(m.term, m.src)
                self._handle_heartbeat(m)
            case Snapshot():
                self._become_follower(m.term, m.src)
                self._handle_snapshot(m)
            case VoteResponse():
                if m.pre_vote == (self._role is Role.PRE_CANDIDATE):
                    self._record_vote(m.src, m.granted)
            case _:
                pass  # nothing else concerns a candidate

    def _step_follower(self, m: Message) -> None:
        match m:
            case AppendEntries():
                self._election_elapsed = 0
                self._leader_id = m.src
                self._handle_append(m)
            case Heartbeat():
                self._election_elapsed = 0
                self._leader_id = m.src
                self._handle_heartbeat(m)
            case Snapshot():
                self._election_elapsed = 0
                self._leader_id = m.src
                self._handle_snapshot(m)
            case TimeoutNow():
                self._campaign(transfer=True)
            case ReadIndexResponse():
                self._read_states.append(ReadState(m.ctx, m.index))
            case _:
                pass  # e.g. votes from an old campaign, reads meant for a leader

    def _step_leader(self, m: Message) -> None:
        match m:
            case AppendResponse():
                self._handle_append_response(m)
            case HeartbeatResponse():
                self._handle_heartbeat_response(m)  # the follower is alive: probe if it lags
                self._handle_read_ack(m.src, m.ctx)  # and it confirms the reads before ctx
            case ReadIndexRequest():
                self._handle_read_index(m.ctx, m.src)
            case AppendEntries() | Heartbeat() | Snapshot():
                raise AssertionError(f"two leaders in term {self._term}: {m}")
            case _:
                pass  # late votes, stray TimeoutNow, read answers for a follower
