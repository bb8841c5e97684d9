"""Safety checkers for the simulation, kept apart from the code under test.

They look at the cores only through public read-only views (role, term,
commit_index, log_slice, log_term), at what the driver persisted (FakeDisk)
and at what it applied and sent. Invariants:
- at most one leader per term;
- log matching: two logs with an entry of the same index and term agree on
  every entry up to it (over the indexes both still hold: logs start at their
  first retained index, and the committed log counts as one of them);
- compaction and snapshots: the point a log restarts after (the term of
  first_index - 1) is a committed entry, and a snapshot a node restores is one;
- state machine safety: every applied entry equals the canonical committed
  entry at its index (the first node to apply an index defines it); a node's
  applied sequence is contiguous except where a snapshot jumps it forward;
- commit never goes back: per core lifetime, and the durable commit never
  decreases across crashes and restarts;
- leader completeness: a new leader's log holds every entry committed in an
  earlier term (bounded by the term of the node that first applied it);
- Ready contract: a message is only sent once the hard state and entries it
  promises are on disk.
- reads: a ReadState's index covers everything applied anywhere before the
  read was issued (linearizability).
Membership (raft/membership.py), with configuration entries committed like any:
- along every log (the committed one included), consecutive configurations differ
  by one member at most, by one voter at most, and any majority of the one meets
  any majority of the other (`majorities_overlap`); a core's membership is the
  last configuration of its log, or a newer one from its hard state (a power
  loss cut the entries beyond a committed configuration, or the snapshot whose
  hard state recorded it was not restored yet);
- only a voter of the configuration in effect on it becomes candidate,
  pre-candidate or leader, or, while that configuration is not committed, a voter
  of the last committed one (Raft thesis 4.2.2: a leader that removed itself and
  stepped down may hold the only log that can still be elected); a node that
  committed the configuration removing it never does again in that life, nor in
  any later one once its durable hard state records it (it learnt of its removal);
- a leader's commit index only counts voters: when it advances, a majority of the
  voters of the leader's configuration have acknowledged the entry in its term;
- the committed configuration a hard state records is the committed entry at
  its index; a node's configuration is never older than the last committed one
  within its commit index, and is that one when it is itself committed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from raft import (
    AppendEntries,
    AppendResponse,
    Entry,
    EntryKind,
    Message,
    RaftCore,
    ReadState,
    RequestVote,
    Role,
    SnapshotMeta,
    VoteResponse,
)
from raft.membership import Membership, majorities_overlap
from tests.sim.disk import FakeDisk

_CAMPAIGNING = (Role.PRE_CANDIDATE, Role.CANDIDATE, Role.LEADER)


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class LogView:
    """A log as the checker sees it: it restarts after `base_index` (whose term is
    `base_term`; 0, 0 for a log that was never compacted) with `entries`."""

    base_index: int
    base_term: int
    entries: list[Entry]
    conf: Membership | None = None  # a live core's membership (None: not a core's log)
    conf_index: int = 0  # ... and the index of its configuration entry


def _fail(msg: str) -> None:
    raise InvariantViolation(msg)


class Checker:
    def __init__(self, bootstrap: Sequence[int] = ()) -> None:
        """`bootstrap`: the first voters (the membership before any configuration entry)."""
        self.bootstrap = Membership.voters_only(bootstrap) if bootstrap else None
        self.leaders: dict[int, int] = {}  # term -> leader id
        self.canon: list[Entry] = []  # canon[i - 1] is the committed entry at index i
        self.canon_term: list[int] = []  # term of the node that first applied canon[i - 1]
        self.commit_seen: dict[int, int] = {}  # node -> commit of its current core
        self.durable_commit: dict[int, int] = {}  # node -> highest durable commit
        self.applied_upto: dict[int, int] = {}  # node -> last applied index this lifetime
        self.reads_issued: dict[bytes, int] = {}  # ctx -> len(canon) when issued
        self.verified_leaders: set[tuple[int, int]] = set()  # (term, id)
        self.committed_conf = self.bootstrap  # the last committed configuration
        self.conf_indexes: list[int] = []  # indexes of the committed configuration entries
        self.confs: list[Membership] = []  # ... and their memberships
        self.removed_at: dict[int, int] = {}  # id -> index of the committed conf removing it
        self.learnt_removal: set[int] = set()  # durably knows a committed conf removed it
        self.knows_removal: set[int] = set()  # this life committed the conf that removed it
        self.roles: dict[int, tuple[Role, int]] = {}  # node -> (role, term) last seen
        self.acked: dict[tuple[int, int], int] = {}  # (node, term) -> highest index acked
        self._decoded: dict[bytes, Membership] = {}

    # --- per-step checks ---

    def check_node(self, node_id: int, core: RaftCore, disk: FakeDisk) -> None:
        prev_commit = self.commit_seen.get(node_id, 0)
        self._check_role(node_id, core, disk)
        if core.role is Role.LEADER and core.commit_index > prev_commit:
            self._check_commit_quorum(node_id, core)
        if core.role is Role.LEADER:
            holder = self.leaders.setdefault(core.term, node_id)
            if holder != node_id:
                _fail(f"two leaders in term {core.term}: {holder} and {node_id}")
            if (core.term, node_id) not in self.verified_leaders:
                self.verified_leaders.add((core.term, node_id))
                self._check_leader_complete(node_id, core)
        commit = core.commit_index
        if commit < self.commit_seen.get(node_id, 0):
            _fail(f"node {node_id} commit went back {self.commit_seen[node_id]} -> {commit}")
        self.commit_seen[node_id] = commit
        dc = disk.hard_state.commit
        if dc < self.durable_commit.get(node_id, 0):
            _fail(f"node {node_id} durable commit went back to {dc}")
        self.durable_commit[node_id] = dc
        if commit < dc:
            _fail(f"node {node_id} commit {commit} below its durable commit {dc}")

    def _check_role(self, node_id: int, core: RaftCore, disk: FakeDisk) -> None:
        """Only voters campaign; nobody who learnt of its removal ever again (in this
        life once it committed the removal, in every later one once its hard state
        recorded it)."""
        hs = disk.hard_state
        removed = self.removed_at.get(node_id)
        if removed is not None and hs.conf_index >= removed:
            self.learnt_removal.add(node_id)
        if removed is not None and core.commit_index >= removed:
            self.knows_removal.add(node_id)
        if 0 < hs.conf_index <= len(self.canon):
            e = self.canon[hs.conf_index - 1]
            if e.kind is not EntryKind.CONFIG or e.data != hs.conf:
                _fail(
                    f"node {node_id}'s hard state records configuration {hs.conf!r} at "
                    f"{hs.conf_index} but {e} was committed there"
                )
        seen = (core.role, core.term)
        if seen[0] in _CAMPAIGNING and self.roles.get(node_id) != seen:
            conf = core.membership
            if node_id not in conf.voters and not self._votes_in_committed(node_id, core):
                _fail(
                    f"node {node_id} became {core.role.value} in term {core.term} but is no "
                    f"voter of its configuration (voters {conf.voters}, learners "
                    f"{conf.learners}, entry {core.conf_index}), nor of the committed one "
                    "while that is pending"
                )
            if node_id in self.learnt_removal or node_id in self.knows_removal:
                _fail(
                    f"node {node_id} became {core.role.value} in term {core.term} after it "
                    f"learnt that the configuration at {removed} removed it"
                )
        self.roles[node_id] = seen
        self._check_conf_current(node_id, core)

    def _votes_in_committed(self, node_id: int, core: RaftCore) -> bool:
        """The node's configuration is not committed and it is a voter of the last
        committed one at its commit index (unknown yet where the committed log ends
        before that: taken as yes)."""
        if core.conf_index <= core.commit_index:
            return False
        if core.commit_index > len(self.canon):
            return True
        k = bisect.bisect_right(self.conf_indexes, core.commit_index)
        committed = self.confs[k - 1] if k else self.bootstrap
        return committed is None or node_id in committed.voters

    def _check_conf_current(self, node_id: int, core: RaftCore) -> None:
        """The configuration in effect on a node (the last of its log) is not older than
        the last committed one within its commit index, and is it if it is committed."""
        upto = min(core.commit_index, len(self.canon))
        k = bisect.bisect_right(self.conf_indexes, upto)
        last = self.conf_indexes[k - 1] if k else 0
        mine = core.conf_index
        if mine < last or (mine <= upto and mine != last):
            _fail(
                f"node {node_id} is in the configuration of entry {mine} "
                f"({core.membership}) but the one committed at {last} is in effect at "
                f"its commit index {core.commit_index}"
            )

    @property
    def confs_committed(self) -> int:
        """How many configuration entries the committed log holds."""
        return len(self.conf_indexes)

    def _check_commit_quorum(self, node_id: int, core: RaftCore) -> None:
        """The leader's new commit index is held by a majority of its voters: each
        acknowledged it in this term (the leader counts itself if it is a voter)."""
        commit, term, voters = core.commit_index, core.term, core.membership.voters
        holders = [v for v in voters if v == node_id or self.acked.get((v, term), 0) >= commit]
        if 2 * len(holders) <= len(voters):
            _fail(
                f"leader {node_id} (term {term}) committed {commit} but only {holders} of its "
                f"voters {voters} hold it"
            )

    def _check_leader_complete(self, node_id: int, core: RaftCore) -> None:
        """Entries committed in a term below the leader's must be in its log. The
        term of the node that first applied an entry bounds its commit term from
        above (a stale leader of an old term may legitimately lack newer ones)."""
        n = max((i + 1 for i, t in enumerate(self.canon_term) if t < core.term), default=0)
        if n == 0:
            return
        if core.last_index < n:
            _fail(f"leader {node_id} (term {core.term}) lacks committed entries {core.last_index}+")
        first = core.first_index
        if first <= n and core.log_slice(first, n + 1) != self.canon[first - 1 : n]:
            _fail(f"leader {node_id} (term {core.term}) log disagrees with committed prefix")
        base = min(first - 1, n)
        if base > 0 and core.log_term(base) != self.canon[base - 1].term:
            _fail(f"leader {node_id} (term {core.term}) disagrees with the term at {base}")

    # --- events ---

    def on_restart(self, node_id: int, core: RaftCore) -> None:
        self.commit_seen[node_id] = core.commit_index
        self.roles.pop(node_id, None)
        self.knows_removal.discard(node_id)
        self.applied_upto[node_id] = core.applied

    def on_snapshot(self, node_id: int, snap: SnapshotMeta) -> None:
        """A node restored its log (and so its state machine) from a snapshot:
        its applied sequence jumps to `snap.index`, which must be committed."""
        upto = self.applied_upto.get(node_id, 0)
        if snap.index <= upto:
            _fail(f"node {node_id} restored a snapshot at {snap.index} after applying {upto}")
        if snap.index > len(self.canon):
            _fail(f"node {node_id} restored a snapshot at uncommitted index {snap.index}")
        if self.canon[snap.index - 1].term != snap.term:
            _fail(f"node {node_id} restored {snap} but {self.canon[snap.index - 1]} was committed")
        self.applied_upto[node_id] = snap.index

    def on_apply(self, node_id: int, term: int, entries: tuple[Entry, ...]) -> None:
        if not entries:
            return
        upto = self.applied_upto.get(node_id, 0)
        if entries[0].index != upto + 1:
            _fail(f"node {node_id} applied {entries[0].index} after {upto}")
        canon = self.canon
        for e in entries:
            if e.index <= len(canon):
                if canon[e.index - 1] != e:
                    _fail(f"node {node_id} applied {e} but {canon[e.index - 1]} was committed")
            else:
                assert e.index == len(canon) + 1
                canon.append(e)
                self.canon_term.append(term)
                if e.kind is EntryKind.CONFIG:
                    self._committed_conf(e)
        self.applied_upto[node_id] = entries[-1].index

    def _committed_conf(self, e: Entry) -> None:
        """Configuration entry `e` joined the committed log: who left the group."""
        new = self._decode(e.data)
        self.conf_indexes.append(e.index)
        self.confs.append(new)
        old = self.committed_conf
        if old is not None:
            for i in set(old.ids) - set(new.ids):
                self.removed_at.setdefault(i, e.index)
        self.committed_conf = new

    def _decode(self, data: bytes) -> Membership:
        conf = self._decoded.get(data)
        if conf is None:
            try:
                conf = self._decoded[data] = Membership.decode(data)
            except ValueError as exc:
                _fail(f"a configuration entry holds no membership: {exc}")
                raise
        return conf

    def on_read_issued(self, ctx: bytes) -> None:
        self.reads_issued[ctx] = len(self.canon)

    def on_read_state(self, node_id: int, rs: ReadState) -> None:
        floor = self.reads_issued.get(rs.ctx)  # duplicates may arrive: the network copies
        if floor is None:
            _fail(f"node {node_id} answered a read nobody issued: {rs.ctx!r}")
        elif rs.index < floor:
            _fail(f"read {rs.ctx!r} at {rs.index} misses entries committed up to {floor}")

    def on_send(self, node_id: int, m: Message, disk: FakeDisk) -> None:
        """The Ready contract: m may only promise what is already durable."""
        hs = disk.hard_state
        match m:
            case RequestVote(pre_vote=True):
                ok = hs.term >= m.term - 1
            case RequestVote():  # a later term on disk also rules out a second vote
                ok = hs.term > m.term or (hs.term == m.term and hs.vote == node_id)
            case VoteResponse(granted=True, pre_vote=False):
                ok = hs.term > m.term or (hs.term == m.term and hs.vote == m.dst)
            case VoteResponse(granted=True, pre_vote=True):
                ok = True
            case AppendResponse(reject=False):
                ok = hs.term >= m.term and disk.storage.last_index() >= m.index
            case _:
                ok = hs.term >= m.term
        if not ok:
            _fail(
                f"node {node_id} sent {m} before persisting (disk {hs}, "
                f"last {disk.storage.last_index()})"
            )
        if isinstance(m, AppendEntries) and m.entries:
            assert m.entries[0].index == m.prev_index + 1
        self.on_ack(m)

    def on_ack(self, m: Message) -> None:
        """Record an acknowledgement that leaves a node (for `_check_commit_quorum`)."""
        if isinstance(m, AppendResponse) and not m.reject:
            key = (m.src, m.term)
            if m.index > self.acked.get(key, 0):
                self.acked[key] = m.index

    # --- periodic, more expensive checks ---

    def check_log_matching(self, logs: dict[int, LogView]) -> None:
        """Pairwise log matching over the indexes both logs hold, the committed
        log (as node 0) included; a compacted log must restart after a committed entry."""
        canon = self.canon
        for node_id, view in logs.items():
            b = view.base_index
            if b > 0 and (b > len(canon) or canon[b - 1].term != view.base_term):
                _fail(f"node {node_id} log restarts after ({b}, {view.base_term}): not committed")
        logs = {0: LogView(0, 0, canon), **logs}
        ids = sorted(logs)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                _check_pair(a, logs[a], b, logs[b])
        for node_id, view in logs.items():
            self._check_configurations(node_id, view)

    def _check_configurations(self, node_id: int, view: LogView) -> None:
        """One change at a time along the log; a core's membership is its log's last."""
        prev = self.bootstrap if view.base_index == 0 else None
        prev_index = 0
        for e in view.entries:
            if e.kind is not EntryKind.CONFIG:
                continue
            conf = self._decode(e.data)
            if prev is not None:
                check_one_change(prev, conf, f"node {node_id}'s log at {prev_index} and {e.index}")
            prev, prev_index = conf, e.index
        if view.conf is None:
            return
        # A configuration newer than its log's last came from its hard state: fine.
        mine = view.conf_index
        if mine < prev_index or (mine == prev_index > 0 and view.conf != prev):
            _fail(
                f"node {node_id}'s membership {view.conf} (entry {mine}) is not its log's "
                f"last configuration {prev} (entry {prev_index})"
            )


def check_one_change(old: Membership, new: Membership, where: str) -> None:
    """`new` follows `old` by one single-server change at most."""
    moved = set(old.ids) ^ set(new.ids)
    voters = set(old.voters) ^ set(new.voters)
    if len(moved) > 1 or len(voters) > 1:
        _fail(f"{where}: configurations {old} and {new} differ by more than one member")
    if not majorities_overlap(old.voters, new.voters):
        _fail(f"{where}: voters {old.voters} and {new.voters} have disjoint majorities")


def _check_pair(a: int, va: LogView, b: int, vb: LogView) -> None:
    lo = max(va.base_index, vb.base_index) + 1
    hi = min(va.base_index + len(va.entries), vb.base_index + len(vb.entries)) + 1
    if lo >= hi:
        return
    la = va.entries[lo - va.base_index - 1 : hi - va.base_index - 1]
    lb = vb.entries[lo - vb.base_index - 1 : hi - vb.base_index - 1]
    if la == lb:
        return
    n = len(la)
    k = 0
    while k < n and la[k] == lb[k]:
        k += 1
    for j in range(k, n):
        if la[j].term == lb[j].term:
            _fail(
                f"log matching: nodes {a} and {b} differ before index {lo + j} "
                f"yet agree on its term {la[j].term}"
            )
