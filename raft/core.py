"""The sans-I/O Raft state machine: elections, replication, commit, transfer, reads.

Owns: `RaftCore`, one node's protocol state (the `Ready` it hands out and its
contract live in raft/ready.py). Inputs are `tick`, `step`, `propose`, `transfer_leadership` and
`read_index`; output is `ready()` and its acknowledgement `advance()`. The core
never reads the clock, the network, the disk or the global `random`.

Invariants kept here:
- role changes only in `_become_follower/_become_pre_candidate/_become_candidate/
  _become_leader`; a term change always clears the vote.
- every message that depends on a hard state or entries leaves in the same
  `Ready` that carries them, or a later one (never an earlier one).
- a leader counts its own log in the quorum only up to what the driver has
  persisted (`advance`), and commits only entries of its own term.
- a leader that is transferring leadership or has lost its quorum accepts no proposal.
- a follower behind the leader's first retained entry gets a `Snapshot`; the
  core never touches its storage for it, the driver restores the storage from
  `Ready.snapshot`; until then the node does not campaign.
- a node started with `catch_up_to` beyond its log (its disk lost entries it had
  acknowledged or knew committed) neither campaigns nor grants votes or pre-votes
  until a leader's replication has made its log match the leader's up to that
  index: with such a vote a quorum could elect a leader lacking committed entries.
- a follower never truncates or overwrites an entry at or below its commit index,
  and acknowledges only what an append proves matches. A leader's append or
  snapshot that differs from its committed prefix (possible only after a majority
  lost acknowledged entries: async flush and a power loss) raises `LogDiverged`
  from `step` before anything changes the log; the driver rolls back or stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from raft import quorum
from raft.config import Config
from raft.errors import Compacted, LogDiverged, NotLeader, ProposalDropped
from raft.log import RaftLog
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
from raft.progress import PeerProgress, Progress, ProgressState
from raft.readonly import ReadOnly
from raft.ready import Ready
from raft.storage import LogStorage, data_size
from raft.types import Entry, EntryKind, HardState, ReadState, Rng, Role, SnapshotMeta

_FRESH = HardState()


class RaftCore:
    """One Raft node's protocol state machine (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        storage: LogStorage,
        hard_state: HardState = _FRESH,
        *,
        rng: Rng,
        applied: int = 0,
        catch_up_to: int = 0,
    ) -> None:
        """`catch_up_to`: this node's log lost entries up to that index which it knows
        (or must presume) were committed or acknowledged; it stays out of elections
        until a leader has replicated its log up to there (0: nothing is missing)."""
        self._cfg = config
        self._id = config.id
        self._peers = tuple(sorted(config.peers))
        self._others = tuple(p for p in self._peers if p != self._id)
        self._rng = rng
        self._log = RaftLog(storage, hard_state.commit, applied)
        self._term = hard_state.term
        self._vote = hard_state.vote
        self._persisted_hs = hard_state
        self._role = Role.FOLLOWER
        self._leader_id: int | None = None
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._progress: dict[int, Progress] = {}
        self._votes: dict[int, bool] = {}
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = config.election_ticks
        self._transferee: int | None = None
        self._reads = ReadOnly()
        self._reads_waiting: list[tuple[bytes, int]] = []  # until a commit in this term
        self._bcast_pending = False  # leader: new entries or commit to send at ready()
        self._heartbeat_pending = False  # leader: a read needs a heartbeat round
        self._outstanding: Ready | None = None
        self._unsent_snapshot: SnapshotMeta | None = None  # for the next Ready
        # Out of elections until a leader's log matches ours up to here (0: not gated).
        # A lone voter has nobody to catch up from: its lost entries are simply gone.
        lacking = catch_up_to > self._log.last_index() and len(self._peers) > 1
        self._catch_up_to = catch_up_to if lacking else 0
        # The driver may forbid campaigns (a log it cannot read in full): the node
        # still votes and follows. A lone voter campaigns regardless.
        self.may_campaign = True
        self._become_follower(self._term, None)

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
        return HardState(self._term, self._vote, self._log.committed)

    @property
    def progress(self) -> dict[int, PeerProgress]:
        """Per-peer replication state; empty unless this node is the leader."""
        return {
            p: PeerProgress(pr.match, pr.next, pr.state, pr.recent_active, pr.pending_snapshot)
            for p, pr in self._progress.items()
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

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to `target` once it is caught up; aborts after an
        election timeout. Proposals are refused while the transfer is pending."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if target not in self._peers:
            raise ValueError(f"{target} is not a peer")
        if target in (self._id, self._transferee):
            return
        self._transferee = target
        self._election_elapsed = 0
        if self._progress[target].match == self._log.last_index():
            self._send(TimeoutNow(self._id, target, self._term))
        else:
            self._send_appends(target)

    def read_index(self, ctx: bytes) -> None:
        """Ask for a linearizable read position; the answer comes out as a
        `ReadState(ctx, index)` in a later Ready. `ctx` must be unique."""
        if self._role is Role.LEADER:
            self._leader_read_index(ctx, self._id)
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
                self._step_leader(m)
            case Role.PRE_CANDIDATE | Role.CANDIDATE:
                self._step_candidate(m)
            case Role.FOLLOWER:
                self._step_follower(m)

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
            pr = self._progress[self._id]
            if pr.maybe_update(index) and self._maybe_commit():
                self._bcast_pending = True

    def _apply_limit(self) -> int | None:
        """With async storage writes only durable entries are applied (etcd's rule):
        a node never serves an entry its own disk may still lose."""
        return self._log.persisted if self._cfg.async_storage_writes else None

    # --- role transitions ---

    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader_id = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        e = self._cfg.election_ticks
        self._timeout = self._rng.randrange(e, 2 * e)
        self._transferee = None
        self._votes = {}
        self._progress = {}
        self._reads.reset()
        self._reads_waiting = []
        self._bcast_pending = False
        self._heartbeat_pending = False

    def _become_follower(self, term: int, leader: int | None) -> None:
        self._reset(term)
        self._leader_id = leader
        self._role = Role.FOLLOWER

    def _become_pre_candidate(self) -> None:
        assert self._role is not Role.LEADER, "a leader does not pre-campaign"
        self._votes = {}
        self._leader_id = None
        self._role = Role.PRE_CANDIDATE

    def _become_candidate(self) -> None:
        assert self._role is not Role.LEADER, "a leader does not campaign"
        self._reset(self._term + 1)
        self._vote = self._id
        self._role = Role.CANDIDATE

    def _become_leader(self) -> None:
        assert self._role is Role.CANDIDATE, self._role
        self._reset(self._term)
        self._leader_id = self._id
        self._role = Role.LEADER
        cfg = self._cfg
        nxt = self._log.last_index() + 1
        for p in self._peers:
            self._progress[p] = Progress(nxt, cfg.max_inflight_msgs, cfg.max_inflight_bytes)
        me = self._progress[self._id]
        me.become_replicate()
        me.match = self._log.stable_index()
        if self._cfg.async_storage_writes:
            me.match = min(me.match, self._log.persisted)
        me.next = nxt
        me.recent_active = True
        self._log.append([Entry(nxt, self._term, b"", EntryKind.NOOP)])
        self._bcast_pending = True

    # --- elections ---

    def _in_lease(self) -> bool:
        return (
            self._cfg.check_quorum
            and self._leader_id is not None
            and self._election_elapsed < self._cfg.election_ticks
        )

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._election_elapsed >= self._timeout:
            self._election_elapsed = 0
            self._campaign(transfer=False)

    def _campaign(self, transfer: bool) -> None:
        if self._log.snapshot is not None:
            return  # our log is not in storage yet: wait for the driver's restore
        if self._catch_up_to:
            return  # we lack entries that may be committed: a leader must restore them
        if not self.may_campaign and len(self._peers) > 1:
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
        for p in self._others:
            self._send(RequestVote(self._id, p, term, last_index, last_term, pre_vote, transfer))

    def _record_vote(self, voter: int, granted: bool) -> None:
        self._votes[voter] = granted
        match quorum.vote_result(self._peers, self._votes):
            case quorum.VoteResult.WON:
                if self._role is Role.PRE_CANDIDATE:
                    self._campaign(transfer=True)  # a real election, no second pre-vote
                else:
                    self._become_leader()
            case quorum.VoteResult.LOST:
                self._become_follower(self._term, None)
            case quorum.VoteResult.PENDING:
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

    # --- follower side of replication ---

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
            snap = SnapshotMeta(m.index, m.log_term, m.data)
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
        self._send(HeartbeatResponse(self._id, m.src, self._term, m.ctx))

    # --- leader ---

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._cfg.election_ticks:
            self._election_elapsed = 0
            active = [p for p, pr in self._progress.items() if pr.recent_active]
            for p in self._others:
                self._progress[p].recent_active = False
            if self._cfg.check_quorum and not quorum.has_quorum(self._peers, active):
                self._become_follower(self._term, None)
                return
            self._transferee = None  # a transfer that took an election timeout failed
        if self._heartbeat_elapsed >= self._cfg.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._bcast_heartbeat()
            self._maybe_transfer_to_preferred()

    def _maybe_transfer_to_preferred(self) -> None:
        pref = self._cfg.preferred_leader
        if pref is None or pref == self._id or self._transferee is not None:
            return
        pr = self._progress[pref]
        if pr.recent_active and pr.match == self._log.last_index():
            self.transfer_leadership(pref)

    def _step_leader(self, m: Message) -> None:
        match m:
            case AppendResponse():
                self._handle_append_response(m)
            case HeartbeatResponse():
                self._handle_heartbeat_response(m)
            case ReadIndexRequest():
                self._leader_read_index(m.ctx, m.src)
            case AppendEntries() | Heartbeat() | Snapshot():
                raise AssertionError(f"two leaders in term {self._term}: {m}")
            case _:
                pass  # late votes, stray TimeoutNow, read answers for a follower

    def _handle_append_response(self, m: AppendResponse) -> None:
        pr = self._progress[m.src]
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
        if m.src == self._transferee and pr.match == self._log.last_index():
            self._send(TimeoutNow(self._id, m.src, self._term))

    def _handle_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self._progress[m.src]
        pr.recent_active = True
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
        if m.ctx:
            for req in self._reads.recv_ack(m.src, m.ctx, self._peers):
                self._answer_read(req.ctx, req.index, req.requester)

    def _maybe_commit(self) -> bool:
        match = {p: pr.match for p, pr in self._progress.items()}
        index = quorum.committed_index(self._peers, match)
        log = self._log
        if index <= log.committed or log.term(index) != self._term:
            return False
        first_in_term = log.term(log.committed) != self._term
        log.commit_to(index)
        if first_in_term and self._reads_waiting:
            waiting, self._reads_waiting = self._reads_waiting, []
            for ctx, requester in waiting:
                self._leader_read_index(ctx, requester)
        return True

    def _leader_read_index(self, ctx: bytes, requester: int) -> None:
        log = self._log
        if log.term(log.committed) != self._term:
            self._reads_waiting.append((ctx, requester))
        elif len(self._peers) == 1:
            self._answer_read(ctx, log.committed, requester)
        elif self._reads.add(ctx, log.committed, requester, self._id):
            self._heartbeat_pending = True

    def _answer_read(self, ctx: bytes, index: int, requester: int) -> None:
        if requester == self._id:
            self._read_states.append(ReadState(ctx, index))
        else:
            self._send(ReadIndexResponse(self._id, requester, self._term, ctx, index))

    def _flush(self) -> None:
        """Send what inputs left pending, once per Ready: this batches many
        proposals into one AppendEntries and many reads into one heartbeat round."""
        if self._role is not Role.LEADER:
            self._bcast_pending = self._heartbeat_pending = False
            return
        if self._bcast_pending:
            self._bcast_pending = False
            for p in self._others:
                self._send_appends(p)
        if self._heartbeat_pending:
            self._heartbeat_pending = False
            self._bcast_heartbeat()

    def _bcast_heartbeat(self) -> None:
        ctx = self._reads.last_ctx()
        committed = self._log.committed
        for p in self._others:
            pr = self._progress[p]
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
            pr = self._progress[peer]
            if not pr.is_paused() and (force_empty or pr.sent_commit < self._log.committed):
                quiet = not force_empty and pr.state is ProgressState.REPLICATE
                self._maybe_send_append(peer, send_empty=True, quiet=quiet)

    def _maybe_send_append(self, peer: int, send_empty: bool, quiet: bool = False) -> bool:
        pr = self._progress[peer]
        if pr.is_paused():
            return False
        log = self._log
        cfg = self._cfg
        last = log.last_index()
        prev_index = pr.next - 1
        if pr.next < log.first_index():
            return self._send_snapshot(peer, pr)
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
        msg = AppendEntries(self._id, peer, self._term, prev_index, prev_term, tuple(ents),
                            log.committed, quiet and not ents)  # fmt: skip
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
        self._send(Snapshot(self._id, peer, self._term, index, term, log.committed, data))
        pr.become_snapshot(index)
        return True

    def _send(self, m: Message) -> None:
        msgs = self._msgs
        if type(m) is AppendResponse and not m.reject and msgs:
            # Acks coalesce: a success covers every index up to its own, so one to
            # the same leader in the same term replaces the one just before it.
            prev = msgs[-1]
            if (type(prev) is AppendResponse and not prev.reject and prev.dst == m.dst
                    and prev.term == m.term and prev.index <= m.index):  # fmt: skip
                msgs[-1] = m
                return
        msgs.append(m)
