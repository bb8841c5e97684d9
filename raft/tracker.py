"""Who counts, who is replicated to and how far each has got: etcd's `tracker`.

Owns: `TrackerConfig`, the configuration in effect as the protocol sees it from
one node (its voters, learners, the other members, the voters it asks for
votes), derived from a `Membership` by raft/confchange.py; and
`ProgressTracker`, which holds that configuration together with a leader's
`Progress` per peer (raft/progress.py) and a candidate's votes, and answers the
quorum questions over them (raft/quorum.py): has the election been won or
lost, has a quorum been heard from recently.

Invariants:
- only voters count: a vote, a recent activity or a match index of a learner,
  of a removed member or of a non-member never makes a quorum;
- `replicas` is every peer with a `Progress` but this node, in the order they
  were first tracked (the order a leader sends in);
- `reset` forgets every `Progress` and vote (a role change), never the
  configuration; `set_config` changes the configuration, never the progress
  (a leader adds and drops peers with `track_new_members` and `untrack_removed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from raft import quorum
from raft.progress import Progress


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    """The configuration in effect, from one node's side (raft/confchange.py builds it)."""

    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()
    others: tuple[int, ...] = ()  # every member but this node
    vote_peers: tuple[int, ...] = ()  # every voter but this node: where a candidate asks


class ProgressTracker:
    """The configuration, a leader's progress per peer and a candidate's votes."""

    __slots__ = ("_max_bytes", "_max_msgs", "_me", "_replicas", "config", "progress", "votes")

    def __init__(self, me: int, max_inflight_msgs: int, max_inflight_bytes: int) -> None:
        self._me = me
        self._max_msgs = max_inflight_msgs
        self._max_bytes = max_inflight_bytes
        self.config = TrackerConfig()
        self.progress: dict[int, Progress] = {}
        self.votes: dict[int, bool] = {}
        self._replicas: tuple[int, ...] = ()

    # --- the configuration ---

    def set_config(self, config: TrackerConfig) -> None:
        self.config = config

    @property
    def voters(self) -> tuple[int, ...]:
        return self.config.voters

    @property
    def learners(self) -> tuple[int, ...]:
        return self.config.learners

    @property
    def others(self) -> tuple[int, ...]:
        return self.config.others

    @property
    def vote_peers(self) -> tuple[int, ...]:
        return self.config.vote_peers

    def is_sole_voter(self) -> bool:
        """This node is the only voter: its own say is a quorum."""
        return self.config.voters == (self._me,)

    # --- progress (a leader's) ---

    @property
    def replicas(self) -> tuple[int, ...]:
        """Every tracked peer but this node, in the order they were first tracked."""
        return self._replicas

    def reset(self) -> None:
        """A role change: no progress, no votes (the configuration stays)."""
        self.progress = {}
        self.votes = {}
        self._replicas = ()

    def start_leading(self, peers: Iterable[int], next_index: int) -> Progress:
        """Track `peers` (this node among them), each probed from `next_index`;
        returns this node's own `Progress`."""
        self.progress = {p: self._new(next_index) for p in sorted(peers)}
        self._replicas = tuple(p for p in self.progress if p != self._me)
        return self.progress[self._me]

    def track_new_members(self, next_index: int) -> None:
        """Track every member not tracked yet, probed from `next_index`; each counts
        as recently active (it gets an election timeout to answer)."""
        for p in self.config.others:
            if p not in self.progress:
                pr = self._new(next_index)
                pr.recent_active = True
                self.progress[p] = pr
        self._replicas = tuple(p for p in self.progress if p != self._me)

    def untrack_removed(self) -> list[tuple[int, int]]:
        """Stop tracking every peer that is no member; (peer, its match) of each."""
        me, members = self._me, self.config.others
        gone = [
            (p, self.progress.pop(p).match)
            for p in list(self.progress)
            if p != me and p not in members
        ]
        self._replicas = tuple(p for p in self.progress if p != me)
        return gone

    def has_removed(self) -> bool:
        """Some tracked peer is no member any more (its removal is not dropped yet)."""
        return len(self._replicas) != len(self.config.others)

    def match_indexes(self) -> dict[int, int]:
        """Each tracked peer's match index (this node's included)."""
        return {p: pr.match for p, pr in self.progress.items()}

    def committed(self) -> int:
        """The highest index a quorum of the voters holds (learners never count)."""
        return quorum.committed_index(self.config.voters, self.match_indexes())

    def quorum_active(self) -> bool:
        """The voters recently heard from (this node counts itself) make a quorum."""
        active = [p for p, pr in self.progress.items() if pr.recent_active]
        return quorum.has_quorum(self.config.voters, active)

    def reset_recent_active(self) -> None:
        """Start a new activity window for every peer but this node."""
        for p in self._replicas:
            self.progress[p].recent_active = False

    def _new(self, next_index: int) -> Progress:
        return Progress(next_index, self._max_msgs, self._max_bytes)

    # --- votes (a candidate's) ---

    def reset_votes(self) -> None:
        self.votes = {}

    def record_vote(self, voter: int, granted: bool) -> None:
        """`voter` granted or refused its vote (the last answer of each counts)."""
        self.votes[voter] = granted

    def tally_votes(self) -> quorum.VoteResult:
        """WON, LOST or PENDING over the voters (other answers do not count)."""
        return quorum.vote_result(self.config.voters, self.votes)
