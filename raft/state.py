"""What one node's Raft core is made of, and the only ways its role changes.

Owns: `CoreState`, the base of `RaftCore` (raft/core.py): every field of the
state machine with its start value, the role transitions and `_send`, the one
way a message leaves. The protocol itself is split by concern into mixins over
this class, after etcd-io/raft's seams:

- raft/election.py   campaigns, pre-votes and votes, the leader lease;
- raft/replication.py  appends, acks, heartbeats as probes, commit, snapshots;
- raft/leadership.py   the leader's clock (check-quorum, heartbeats), ReadIndex,
                       leadership transfer;
- raft/core.py       the public API: inputs, message routing per role, `Ready`.

The few methods one part calls in another are declared below as abstract
methods: the seams between the parts, listed in one place, so each part
type-checks on its own and a missing one fails at construction.

Invariants kept here:
- the role changes only in `_become_follower/_become_pre_candidate/
  _become_candidate/_become_leader`; a term change always clears the vote.
- every role change clears what the previous role was doing: votes, progress,
  pending reads, a pending transfer, pending broadcasts.
- a leader starts with its own log counted only up to what is stable (and, with
  async storage writes, persisted), and appends a no-op of its term at once.
- messages leave only through `_send`, in the order they were produced; an
  acknowledgement replaces the one just before it when it covers it.
- `_voters`, `_others` and a leader's progress always follow the configuration in
  effect, the last one in the log (`_sync_conf`, raft/membership.py): a leader
  tracks every member (learners too, which never count for commit or votes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from raft.config import Config
from raft.log import RaftLog
from raft.membership import Membership
from raft.messages import AppendResponse, Heartbeat, Message
from raft.progress import Progress
from raft.readonly import ReadOnly
from raft.ready import Ready
from raft.storage import LogStorage
from raft.types import Entry, EntryKind, HardState, ReadState, Rng, Role, SnapshotMeta

_FRESH = HardState()


class CoreState(ABC):
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
        self._conf = self._log.confs.current
        self._voters: tuple[int, ...] = ()
        self._others: tuple[int, ...] = ()  # every other member
        # Leader: where it replicates and heartbeats; every other member, and a member
        # being removed until its removal commits (so that it learns of it).
        self._replicas: tuple[int, ...] = ()
        self._vote_peers: tuple[int, ...] = ()  # every other voter: where a candidate asks
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
        self._sync_conf()
        lacking = catch_up_to > self._log.last_index() and len(self._voters) > 1
        self._catch_up_to = catch_up_to if lacking else 0
        # The driver may forbid campaigns (a log it cannot read in full): the node
        # still votes and follows. A lone voter campaigns regardless.
        self.may_campaign = True
        self._become_follower(self._term, None)

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
        self._replicas = ()
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
        log = self._log
        peers = {*self._others, self._id}
        if log.confs.pending_after(log.committed):  # members being removed: they must learn it
            peers.update(log.confs.at(log.committed)[1].ids)
        for p in sorted(peers):
            self._progress[p] = Progress(nxt, cfg.max_inflight_msgs, cfg.max_inflight_bytes)
        self._replicas = tuple(p for p in self._progress if p != self._id)
        me = self._progress[self._id]
        me.become_replicate()
        me.match = self._log.stable_index()
        if self._cfg.async_storage_writes:
            me.match = min(me.match, self._log.persisted)
        me.next = nxt
        me.recent_active = True
        self._log.append([Entry(nxt, self._term, b"", EntryKind.NOOP)])
        self._bcast_pending = True

    # --- membership ---

    def _sync_conf(self) -> None:
        """Follow the configuration in effect (the log's last); cheap when unchanged."""
        conf = self._log.confs.current
        if conf is self._conf and self._voters:
            return
        self._conf = conf
        me = self._id
        self._voters = conf.voters
        self._others = tuple(i for i in conf.ids if i != me)
        self._vote_peers = tuple(i for i in self._voters if i != me)
        if self._role is not Role.LEADER:
            return
        cfg, nxt = self._cfg, self._log.last_index() + 1
        for p in self._others:
            if p not in self._progress:
                pr = Progress(nxt, cfg.max_inflight_msgs, cfg.max_inflight_bytes)
                pr.recent_active = True  # a new member gets an election timeout to answer
                self._progress[p] = pr
        self._drop_removed()
        if self._transferee is not None and self._transferee not in self._voters:
            self._transferee = None
        self._conf_changed_as_leader()
        self._bcast_pending = True

    def _drop_removed(self) -> None:
        """Leader: stop replicating to removed members once their removal commits (until
        then they get the entries, the configuration that removes them included)."""
        log, me, ids = self._log, self._id, self._conf.ids
        if log.confs.index <= log.committed:
            for p in [p for p in self._progress if p != me and p not in ids]:
                # A last word: the commit index, so that it applies its removal too.
                commit = min(self._progress.pop(p).match, log.committed)
                self._send(Heartbeat(me, p, self._term, commit))
        self._replicas = tuple(p for p in self._progress if p != me)

    # --- the one way out ---

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

    # --- seams: what one part calls in another ---

    @abstractmethod
    def _send_appends(self, peer: int, force_empty: bool = False) -> None:
        """raft/replication.py: fill `peer`'s append window (used by a transfer)."""

    @abstractmethod
    def _bcast_heartbeat(self) -> None:
        """raft/replication.py: one heartbeat to every follower (the leader's clock)."""

    @abstractmethod
    def _maybe_send_timeout_now(self, peer: int) -> bool:
        """raft/leadership.py: tell the transfer target to campaign once caught up."""

    @abstractmethod
    def _hand_over(self) -> None:
        """raft/leadership.py: a removed leader transfers to the most caught-up voter."""

    @abstractmethod
    def _conf_changed_as_leader(self) -> None:
        """raft/replication.py: the voters changed under a leader: commit may move."""

    @abstractmethod
    def _release_waiting_reads(self) -> None:
        """raft/leadership.py: the first commit of a term lets held reads proceed."""
