"""Configuration changes: whether a leader may make one, and what it makes.

Owns the rules between a `ConfChange` an operator asks for and the protocol's
view of the result (etcd's `confchange`); the membership itself and its codec
are raft/membership.py's, the configurations a log carries its `ConfLog`.

- `propose`: the membership after a change a leader was asked for, or the
  `MembershipError` that refuses it (nothing is appended then);
- `tracker_config`: the `TrackerConfig` (raft/tracker.py) of a membership, as
  one node sees it;
- `leader_peers`: whom a new leader tracks.

Invariants (single-server changes, raft/membership.py):
- at most one configuration entry is uncommitted at a time, and a leader
  proposes one only once it has committed an entry of its own term;
- a learner is promoted only within `max_promote_lag` entries of the leader;
- a new leader tracks every member of the configuration in effect and, while
  that one is not committed, every member of the last committed one: a member
  being removed gets the entries up to its removal, so that it learns of it.
"""

from __future__ import annotations

from collections.abc import Mapping

from raft.errors import MembershipError
from raft.membership import ChangeOp, ConfChange, Membership
from raft.tracker import TrackerConfig


def propose(
    conf: Membership,
    change: ConfChange,
    *,
    pending: int,
    term_committed: bool,
    last_index: int,
    match: Mapping[int, int],
    max_promote_lag: int,
) -> Membership:
    """The membership after `change` to `conf`, the one in effect on a leader.

    `pending`: the index of an uncommitted configuration entry (0: none);
    `term_committed`: the leader has committed an entry of its own term;
    `match`: the leader's match index of each member; `last_index`: its log's end.
    Refused (MembershipError) while another change is uncommitted, before the
    leader committed in its term, for a change that does not apply to `conf`, and
    for the promotion of a learner more than `max_promote_lag` entries behind."""
    if pending:
        raise MembershipError(
            f"another membership change (entry {pending}) is not committed yet; retry once it is"
        )
    if not term_committed:
        raise MembershipError(
            "the leader has not committed an entry of its term yet; retry in a moment"
        )
    new = conf.apply(change)
    if change.op is ChangeOp.PROMOTE:
        lag = last_index - match[change.node_id]
        if lag > max_promote_lag:
            raise MembershipError(
                f"learner {change.node_id} is {lag} entries behind the leader, more than "
                f"{max_promote_lag}: promote it once it has caught up"
            )
    return new


def tracker_config(conf: Membership, me: int) -> TrackerConfig:
    """`conf` as node `me` sees it (`me` need not be a member)."""
    voters = conf.voters
    return TrackerConfig(
        voters=voters,
        learners=conf.learners,
        others=tuple(i for i in conf.ids if i != me),
        vote_peers=tuple(i for i in voters if i != me),
    )


def leader_peers(me: int, current: Membership, committed: Membership | None) -> list[int]:
    """Whom a new leader tracks, itself included, in id order: the members of
    `current`, and those of `committed`, the last committed configuration, when
    `current` is not committed yet (None: it is)."""
    peers = {me, *current.ids}
    if committed is not None:
        peers.update(committed.ids)
    return sorted(peers)
