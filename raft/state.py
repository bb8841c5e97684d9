"""What one node's Raft core is made of, and the only ways its role changes.

Owns: `CoreState`, the base of `RaftCore` (raft/core.py): the core's own
fields (term, vote, role, leader, timers, the outgoing messages), the objects it
composes, the role transitions and `_send`, the one way a message leaves.

The objects composed here own their state, and the protocol only calls them:
- `_log`, a `RaftLog` (raft/log.py): the log, commit and apply positions and
  the configurations the log carries;
- `_trk`, a `ProgressTracker` (raft/tracker.py): the configuration in effect as
  the protocol sees it, a leader's progress per peer, a candidate's votes;
- `_reads`, a `ReadOnly` (raft/readonly.py): a leader's ReadIndex requests.
Configuration changes are checked and turned into the tracker's view by
raft/confchange.py. The protocol steps are in two mixins over this class, each
calling only what is here and the objects above, never each other:
raft/election.py (campaigns, votes, the lease) and raft/replication.py (the
log's replication at both ends, commit, and the leader's clock, reads and
transfers); raft/core.py composes them into `RaftCore`.

Invariants kept here:
- the role changes only in `_become_follower/_become_pre_candidate/
  _become_candidate/_become_leader`; a term change always clears the vote.
- every role change clears what the previous role was doing: votes, progress,
  pending reads, a pending transfer, pending broadcasts.
- a leader starts with its own log counted only up to what is stable (and, with
  async storage writes, persisted), and appends a no-op of its term at once.
- messages leave only through `_send`, in the order they were produced; an
  acknowledgement replaces the one just before it when it covers it.
- the tracker's configuration and a leader's progress always follow the
  configuration in effect, the last one in the log (`RaftCore._sync_conf`): a
  leader tracks every member (learners too, which never count for commit or votes).
"""

from __future__ import annotations

from raft import confchange
from raft.config import Config
from raft.log import RaftLog
from raft.membership import Membership
from raft.messages import AppendResponse, Message
from raft.readonly import ReadOnly
from raft.ready import Ready
from raft.storage import LogStorage
from raft.tracker import ProgressTracker
from raft.types import Entry, EntryKind, HardState, ReadState, Rng, Role, SnapshotMeta

_FRESH = HardState()


class CoreState:
    """The fields of `RaftCore` and its role transitions (see the module docstring)."""

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
        self._rng = rng
        if hard_state.conf:
            base = (hard_state.conf_index, Membership.decode(hard_state.conf), hard_state.conf)
        else:
            base = (0, config.bootstrap(), b"")
        self._log = RaftLog(storage, hard_state.commit, applied, base)
        self._conf = self._log.confs.current  # the membership `_trk` was configured from
        self._trk = ProgressTracker(config.id, config.max_inflight_msgs, config.max_inflight_bytes)
        self._term = hard_state.term
        self._vote = hard_state.vote
        self._persisted_hs = hard_state
        self._role = Role.FOLLOWER
        self._leader_id: int | None = None
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = config.election_ticks
        self._transferee: int | None = None
        self._reads = ReadOnly()
        self._bcast_pending = False  # leader: new entries or commit to send at ready()
        self._heartbeat_pending = False  # leader: a read needs a heartbeat round
        self._outstanding: Ready | None = None
        self._unsent_snapshot: SnapshotMeta | None = None  # for the next Ready
        self._trk.set_config(confchange.tracker_config(self._conf, self._id))
        # Out of elections until a leader's log matches ours up to here (0: not gated).
        # A lone voter has nobody to catch up from: its lost entries are simply gone.
        lacking = catch_up_to > self._log.last_index() and len(self._trk.voters) > 1
        self._catch_up_to = catch_up_to if lacking else 0
        # The driver may forbid campaigns (a log it cannot read in full): the node
        # still votes and follows. A lone voter campaigns regardless.
        self.may_campaign = True
        self._become_follower(self._term, None)
        if self._fresh_and_eager():
            self._timeout = 1

    def _fresh_and_eager(self) -> bool:
        """This node is its group's eager first leader (`Config.eager_campaign`) and
        nothing has happened yet: term 0, an empty log, not joining a running group."""
        cfg = self._cfg
        fresh = self._term == 0 and not self._log.last_index()
        return cfg.eager_campaign and not cfg.join and fresh

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
        self._trk.reset()
        self._reads.reset()
        self._bcast_pending = False
        self._heartbeat_pending = False

    def _become_follower(self, term: int, leader: int | None) -> None:
        self._reset(term)
        self._leader_id = leader
        self._role = Role.FOLLOWER

    def _become_pre_candidate(self) -> None:
        assert self._role is not Role.LEADER, "a leader does not pre-campaign"
        self._trk.reset_votes()
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
        log = self._log
        nxt = log.last_index() + 1
        committed = None  # members being removed must learn it: track them too
        if log.confs.pending_after(log.committed):
            committed = log.confs.at(log.committed)[1]
        me = self._trk.start_leading(confchange.leader_peers(self._id, self._conf, committed), nxt)
        me.become_replicate()
        me.match = log.stable_index()
        if self._cfg.async_storage_writes:
            me.match = min(me.match, log.persisted)
        me.next = nxt
        me.recent_active = True
        log.append([Entry(nxt, self._term, b"", EntryKind.NOOP)])
        self._bcast_pending = True

    # --- the one way out ---

    def _send(self, m: Message) -> None:
        msgs = self._msgs
        if type(m) is AppendResponse and not m.reject and msgs:
            # Acks coalesce: a success covers every index up to its own, so one to
            # the same leader in the same term replaces the one just before it.
            prev = msgs[-1]
            if (
                type(prev) is AppendResponse
                and not prev.reject
                and prev.dst == m.dst
                and prev.term == m.term
                and prev.index <= m.index
            ):
                msgs[-1] = m
                return
        msgs.append(m)
