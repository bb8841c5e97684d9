"""A node's view of its shard: who the members are, where they listen, and changes.

Owns `NodeMembers`: the live membership as the Raft core has it in effect (the
last configuration entry in the log, raft/membership.py), the address book (a
configuration entry's addresses; the bootstrap's from the node's `peers`; a
member's address in this node's own settings, `peers` or `routes`, wins), one
peer link per other member (opened when a member comes, closed when it goes),
the member ids the peer checks accept (`accepted`: `RaftNode.deliver` and the
PeerGate), the members as the leader sees them (`members`) and the membership
operations (`add_member`, `promote_member`, `remove_member`). Also the read gate
of a joining node (`read_refusal`): it serves no read until it has applied the
commit index it learnt from the leader when it joined. The node hands this part
out as `RaftNode.membership`; the service, the process and the tests use it there.

Invariants:
- `ids` and the links follow the configuration in effect after every Ready
  (`sync`): a removed member's messages are refused from then on, and its link
  closed; a new member's link opens before the leader's first append to it.
- an operation returns only once its configuration entry is committed (with the
  term it was proposed in), or raises: MembershipError and NotLeader before
  anything is appended, TimeoutError after (the change may still commit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from dledger_commitlog.node.config import NodeConfig
from dledger_commitlog.node.views import MemberStatus
from netkit.peer_auth import PeerSecurity
from raft import RaftCore, Role
from raft.errors import MembershipError
from raft.membership import ChangeOp, ConfChange, Member, Membership
from raft.messages import AppendEntries, Heartbeat, Message, Snapshot
from raftio.link import PeerLink
from raftio.multiplex import LinkPool, ShardLink
from raftio.transport import open_link

log = logging.getLogger(__name__)


class NodeMembers:
    """A node's membership: the part of the node it hands out (see the module doc)."""

    def __init__(
        self,
        cfg: NodeConfig,
        core: RaftCore,
        *,
        kick: Callable[[], None],
        wait_for_commit: Callable[[], Awaitable[None]],
        committed_index: Callable[[], int],
        links: LinkPool | None = None,
    ) -> None:
        self._cfg = cfg
        self._pool = links  # multi-Raft: this shard's links are views of the process's
        self._core = core
        self._kick = kick
        self._wait_for_commit = wait_for_commit
        self._committed_index = committed_index
        self._static = {p.id: Member(p.id, p.raft, p.client) for p in cfg.peers}
        self._routes = {r.id: r.raft for r in cfg.routes}
        self._known: dict[int, Member] = {}
        self._conf: Membership | None = None
        self.ids: frozenset[int] = frozenset()
        self.links: dict[int, PeerLink | ShardLink] = {}
        self._security: PeerSecurity | None = None
        self._started = False
        self._was_member = False
        self._synced: tuple[object, ...] = ()
        # Whose Raft messages this node takes: the members in effect, a member being
        # removed until that commits, a removed leader until another leads.
        self.accepted: frozenset[int] = frozenset()
        # A joining node: the leader's commit index when it first heard from it.
        self._join_commit: int | None = None if cfg.join else 0
        self._leader_heard_at: float | None = None  # monotonic time of a leader's last message
        self.sync()

    # -- the live membership ------------------------------------------------------

    def member(self, node_id: int) -> Member | None:
        """A member of the configuration in effect, with its addresses."""
        m = self._core.membership.get(node_id)
        if m is None:
            return None
        static = self._static.get(node_id)
        if static is not None:  # this node's own settings say how to reach it (a proxy, NAT)
            return dataclasses.replace(static, learner=m.learner)
        route = self._routes.get(node_id)
        if route is not None:  # only the Raft address: clients reach it where the entry says
            return dataclasses.replace(m, raft=route)
        return m

    def start(self, security: PeerSecurity) -> None:
        self._security = security
        self._started = True
        self._sync_links()

    def sync(self) -> None:
        """Follow the core (after every Ready; cheap when nothing changed): the members
        in effect, whose messages are taken, the links."""
        core = self._core
        if self._join_commit is None and core.role is Role.LEADER:
            # A joining node elected itself (after a restart, say): a leader's log holds
            # every committed entry, so it has nothing to wait for before serving reads.
            self._join_commit = 0
        key = (core.membership, core.committed_membership, core.leader_id, core.replicas)
        if key == self._synced:
            return
        self._synced = key
        conf, committed, leader, _ = key
        if conf is not self._conf:
            before, self._conf = self._conf, conf
            for m in conf.members:  # addresses outlive membership (see _sync_links)
                self._known[m.id] = self.member(m.id) or m
            self.ids = frozenset(conf.ids)
            self._was_member = self._was_member or self._cfg.node_id in self.ids
            if before is not None:
                log.info(
                    "node %d: members now %s (voters %s, learners %s)",
                    self._cfg.node_id,
                    list(conf.ids),
                    list(conf.voters),
                    list(conf.learners),
                )
        # A member being removed is still heard until its removal commits, and a removed
        # leader until another one leads (its last entries, its TimeoutNow).
        lead = () if leader is None else (leader,)
        self.accepted = frozenset((*conf.ids, *committed.ids, *lead))
        if self._started:
            self._sync_links()

    def _sync_links(self) -> None:
        me = self._cfg.node_id
        assert self._security is not None
        wanted = (self.accepted | set(self._core.replicas)) - {me}
        for node_id in wanted - self.links.keys():
            m = self.member(node_id) or self._known.get(node_id)  # a node leaving
            if m is None or not m.raft:
                log.error("node %d: no Raft address for member %d", me, node_id)
                continue
            cfg = self._cfg
            if self._pool is not None:
                self.links[node_id] = self._pool.open(
                    cfg.shard, cfg.cluster, node_id, m.raft, me=me, security=self._security
                )
                continue
            own = open_link(cfg.cluster, node_id, m.raft, me=me, security=self._security)
            own.start()
            self.links[node_id] = own
        for node_id in self.links.keys() - wanted:
            link = self.links.pop(node_id)
            asyncio.get_running_loop().create_task(link.close(), name=f"close-link-{node_id}")

    async def close(self) -> None:
        for link in self.links.values():
            await link.close()
        self.links.clear()

    # -- reads of a joining node ------------------------------------------------------

    def heard(self, msg: Message) -> None:
        """A message from a peer was accepted: a joining node learns the leader's commit;
        one from a leader is the latest word this node had of the shard's commit."""
        if isinstance(msg, AppendEntries | Heartbeat | Snapshot):
            self._leader_heard_at = time.monotonic()
            if self._join_commit is None:
                self._join_commit = msg.commit

    def behind_ms(self) -> int:
        """How old this node's knowledge of what the shard committed may be, in ms: 0 on
        its leader, the time since a leader's last message on a follower, -1 when none
        came since this node started (it cannot tell)."""
        if self._core.role is Role.LEADER:
            return 0
        if self._leader_heard_at is None:
            return -1
        return int((time.monotonic() - self._leader_heard_at) * 1000)

    @property
    def removed(self) -> bool:
        """This node was a member (or started as one, not joining) and the configuration
        in effect no longer has it: its status says `removed`."""
        return self._cfg.node_id not in self.ids and (self._was_member or not self._cfg.join)

    @property
    def read_refusal(self) -> str | None:
        """Why this node serves no read now (None: it does)."""
        me = self._cfg.node_id
        if self.removed:
            return f"node {me} is no longer a member of the shard"
        if self._join_commit is None:
            return f"node {me} is joining the shard and has not heard from its leader yet"
        if self._committed_index() < self._join_commit:
            return (
                f"node {me} is catching up: applied entry {self._committed_index()} of "
                f"{self._join_commit}"
            )
        return None

    # -- the view and the operations callers are handed --------------------------------

    def members(self) -> list[MemberStatus]:
        """Every member: id, role, addresses, and (on the leader) match index and lag."""
        core = self._core
        progress = core.progress
        last = core.last_index
        out = []
        for m in core.membership.members:
            full = self.member(m.id) or m
            pr = progress.get(m.id)
            match = pr.match if pr is not None else -1
            out.append(
                MemberStatus(
                    m.id,
                    m.role,
                    full.raft,
                    full.client,
                    match,
                    last - match if pr is not None else -1,
                )
            )
        return out

    async def change(self, change: ConfChange, timeout_s: float) -> int:
        """Propose `change` and wait for its commit; the configuration entry's index."""
        core = self._core
        index = core.propose_conf_change(change)
        term = core.term
        self._kick()
        log.info(
            "node %d: proposed %s of node %d at entry %d",
            self._cfg.node_id,
            change.op.value,
            change.node_id,
            index,
        )
        try:
            async with asyncio.timeout(timeout_s):
                while self._committed_index() < index:
                    await self._wait_for_commit()
        except TimeoutError:
            raise TimeoutError(
                f"the {change.op.value} of node {change.node_id} (entry {index}) "
                f"did not commit within {timeout_s}s; it may still"
            ) from None
        if index >= core.first_index and core.log_term(index) != term:
            raise TimeoutError(
                f"entry {index} of the {change.op.value} was replaced by a new "
                "leader's log: the change did not happen; retry"
            )
        return index

    async def add_member(self, member: Member, timeout_s: float) -> int:
        """Add `member` as a learner; unless it is to stay one, promote it once it has
        caught up (within the same `timeout_s`). The committed configuration entry's
        index (NotLeader, MembershipError, TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        change = ConfChange(
            ChangeOp.ADD_LEARNER, member.id, dataclasses.replace(member, learner=True)
        )
        index = await self.change(change, timeout_s)
        if member.learner:
            return index
        return await self.promote_member(member.id, max(0.0, deadline - time.monotonic()))

    async def promote_member(self, node_id: int, timeout_s: float) -> int:
        """Promote learner `node_id`, waiting (up to `timeout_s`) for it to catch up."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await self.change(
                    ConfChange(ChangeOp.PROMOTE, node_id), max(0.0, deadline - time.monotonic())
                )
            except MembershipError as exc:
                behind = "entries behind" in str(exc) or "not committed yet" in str(exc)
                if not behind or time.monotonic() >= deadline:
                    raise
            if self._core.role is not Role.LEADER:
                raise MembershipError(f"leadership moved while node {node_id} caught up; retry")
            await asyncio.sleep(self._cfg.tick_ms / 1000)

    async def remove_member(self, node_id: int, timeout_s: float) -> int:
        """Remove a member (the leader itself: it hands over after the commit)."""
        return await self.change(ConfChange(ChangeOp.REMOVE, node_id), timeout_s)
