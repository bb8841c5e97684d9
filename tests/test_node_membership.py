"""Membership change on real nodes: real files, real fsync, real gRPC peer ports on
loopback, several `RaftNode`s in one event loop, driven through the part of the node
membership callers are handed (`RaftNode.membership`: `add_member`, `promote_member`,
`remove_member`, `members`, `accepted`, `read_refusal`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from dledger_commitlog.cli.cluster_layout import free_ports
from dledger_commitlog.log.commitlog import Draft
from dledger_commitlog.node.config import NodeConfig, Peer, Route
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.service.admin import status_pb
from raft import NotLeader
from raft.errors import MembershipError
from raft.membership import Member
from raft.messages import Heartbeat
from raft.validate import InvalidPeerMessage
from raftio.link import PeerGate
from raftio.transport import PeerServer, open_peer_server
from tests.lone_node import SMALL

TOPIC = "members"
T = TypeVar("T")


class Shard:
    """Real nodes of one shard in this event loop; ids 1.. with ports picked once per id."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: dict[int, RaftNode] = {}
        self.servers: dict[int, PeerServer] = {}
        self.addrs: dict[int, Peer] = {}

    def peer(self, i: int) -> Peer:
        if i not in self.addrs:
            raft, client = free_ports(2)
            self.addrs[i] = Peer(i, f"127.0.0.1:{raft}", f"127.0.0.1:{client}")
        return self.addrs[i]

    def member(self, i: int, learner: bool = False) -> Member:
        p = self.peer(i)
        return Member(i, p.raft, p.client, learner)

    async def start(
        self, i: int, peers: list[int], join: bool = False, routes: tuple[Route, ...] = ()
    ) -> RaftNode:
        cfg = NodeConfig(
            node_id=i,
            data_dir=str(self.root / f"n{i}"),
            insecure=True,
            join=join,
            routes=routes,
            peers=tuple(self.peer(p) for p in sorted({*peers, i})),
            **{**SMALL, "tick_ms": 20, "election_ticks": 10},  # type: ignore[arg-type]
        )
        node = RaftNode(cfg)
        server = open_peer_server(
            PeerGate(cfg.cluster, node.deliver, me=i, members=lambda: node.membership.accepted)
        )
        server.bind(cfg.raft_address)
        await server.start()
        await node.start()
        self.nodes[i], self.servers[i] = node, server
        return node

    async def stop(self, i: int) -> None:
        await self.servers.pop(i).stop(grace_s=0.1)
        await self.nodes.pop(i).close()

    async def close(self) -> None:
        for i in list(self.nodes):
            await self.stop(i)

    async def leader(self, among: set[int] | None = None, timeout_s: float = 10.0) -> RaftNode:
        async def found() -> RaftNode | None:
            leaders = [
                n for i, n in self.nodes.items() if n.is_leader() and (among is None or i in among)
            ]
            return leaders[0] if len(leaders) == 1 else None

        return await until(found, timeout_s, "a leader")

    async def change(
        self, op: Callable[[RaftNode], Awaitable[int]], done: Callable[[RaftNode], bool]
    ) -> None:
        """`op` on the leader until `done` says the leader's configuration has it. After a
        leader change the next leader is asked first, as an operator would (`dledger
        member list`): a change the old leader appended may have committed there, and is
        never repeated blindly (a second add of a learner is refused)."""
        for _ in range(100):
            leader = await self.leader()
            if done(leader):
                return
            try:
                await op(leader)
                return
            except NotLeader:
                await asyncio.sleep(0.05)
        raise AssertionError("no leader took the change")

    async def add(self, i: int) -> None:
        """Node `i` a voter: added as a learner and promoted, or promoted only where a
        leader that lost its leadership had added it."""

        def op(n: RaftNode) -> Awaitable[int]:
            if n.core.membership.get(i) is None:
                return n.membership.add_member(self.member(i), 20.0)
            return n.membership.promote_member(i, 20.0)

        def done(n: RaftNode) -> bool:
            m = n.core.membership.get(i)
            return m is not None and not m.learner

        await self.change(op, done)

    async def remove(self, i: int) -> None:
        await self.change(
            lambda n: n.membership.remove_member(i, 20.0),
            lambda n: n.core.membership.get(i) is None,
        )

    async def put(self, body: bytes) -> None:
        for _ in range(100):
            leader = await self.leader()
            try:
                await leader.put([leader.prepare(Draft(TOPIC, body, body.hex()))], 5.0)
                return
            except NotLeader:
                await asyncio.sleep(0.05)
        raise AssertionError("no put went through")


async def until(probe: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    async with asyncio.timeout(timeout_s):
        while True:
            got = await probe()
            if got is not None and got is not False:
                return got
            await asyncio.sleep(0.02)
    raise AssertionError(what)  # pragma: no cover


def bodies(node: RaftNode) -> list[bytes]:
    out: list[bytes] = []
    for _, qid, lo, hi in node.committed.queue_offsets(TOPIC):
        for u in node.committed.queue_units(TOPIC, qid, lo, hi - lo):
            out.append(node.committed.get_by_offset(u.commitlog_offset)[0].body)
    return sorted(out)


def run(tmp_path: Path, body: Callable[[Shard], Awaitable[None]]) -> None:
    async def main() -> None:
        g = Shard(tmp_path)
        try:
            await body(g)
        finally:
            await g.close()

    asyncio.run(main())


async def caught_up(g: Shard, i: int) -> None:
    async def same() -> bool:
        leader = await g.leader()
        n = g.nodes[i]
        return (
            n.commitlog.committed_index == leader.commitlog.committed_index
            and n.dispatched_pos == n.committed_pos
            and n.membership.read_refusal is None
        )

    await until(same, 20.0, f"node {i} caught up")


def test_grow_three_to_five_then_shrink_back_loses_nothing(tmp_path: Path) -> None:
    async def body(g: Shard) -> None:
        for i in (1, 2, 3):
            await g.start(i, [1, 2, 3])
        await g.put(b"before")
        for i in (4, 5):
            await g.start(i, [1, 2, 3], join=True)
            # It serves no read before it caught up.
            assert g.nodes[i].membership.read_refusal is not None
            await g.add(i)
            await g.put(b"with %d" % i)
        leader = await g.leader()
        rows = {m.id: m for m in leader.membership.members()}
        assert sorted(rows) == [1, 2, 3, 4, 5] and {m.role for m in rows.values()} == {"voter"}
        assert rows[4].client == g.peer(4).client and rows[5].match >= 0
        for i in (4, 5):
            await caught_up(g, i)
            assert bodies(g.nodes[i]) == sorted([b"before", b"with 4", b"with 5"])
        # Two of five down: still a quorum.
        await g.stop(2)
        await g.stop(3)
        await g.put(b"three of five")
        await g.start(2, [1, 2, 3])
        await g.start(3, [1, 2, 3])
        for i in (5, 4):
            await g.remove(i)
        leader = await g.leader({1, 2, 3})
        assert [m.id for m in leader.membership.members()] == [1, 2, 3]
        await g.put(b"three again")
        for i in (1, 2, 3):
            await caught_up(g, i)
            assert bodies(g.nodes[i]) == sorted(
                [b"before", b"with 4", b"with 5", b"three of five", b"three again"]
            )
        removed = g.nodes[4]
        left = removed.membership
        await until(lambda: _async(left.read_refusal is not None), 10.0, "4 knows it left")
        assert "no longer a member" in (left.read_refusal or "")
        assert not removed.is_leader()
        assert left.removed and not leader.membership.removed
        status = status_pb(removed.status(), removed.cfg, removed=left.removed)
        assert status.role == "removed"  # not the follower it still is until it stops

    run(tmp_path, body)


def test_removing_the_leader_hands_over_and_membership_survives_restart(tmp_path: Path) -> None:
    async def body(g: Shard) -> None:
        for i in (1, 2, 3):
            await g.start(i, [1, 2, 3])
        await g.put(b"one")
        old = await g.leader()
        old_id = old.node_id
        await old.membership.remove_member(old_id, 10.0)
        rest = {1, 2, 3} - {old_id}
        leader = await g.leader(rest)
        await g.put(b"two")
        assert [m.id for m in leader.membership.members()] == sorted(rest)
        assert not old.is_leader()
        await until(lambda: _async(old.membership.removed), 10.0, f"{old_id} knows it left")
        # The removed node's messages are refused from now on (its token and certificate
        # are checked against the same set by the PeerGate).
        assert old_id not in leader.membership.accepted
        with pytest.raises(InvalidPeerMessage) as refused:
            leader.deliver(Heartbeat(old_id, leader.node_id, leader.term, 0))
        assert refused.value.membership
        # Restarted with their old config files (3 peers), they keep the new membership.
        for i in sorted(rest):
            await g.stop(i)
            await g.start(i, [1, 2, 3])
            assert sorted(m.id for m in g.nodes[i].membership.members()) == sorted(rest)
        await g.put(b"three")
        for i in rest:
            await caught_up(g, i)

    run(tmp_path, body)


def test_bad_changes_are_refused_and_change_nothing(tmp_path: Path) -> None:
    async def body(g: Shard) -> None:
        for i in (1, 2, 3):
            await g.start(i, [1, 2, 3])
        await g.put(b"x")
        leader = await g.leader()
        before = leader.core.last_index
        with pytest.raises(MembershipError, match="already a voter"):
            await leader.membership.add_member(g.member(2), 5.0)
        with pytest.raises(MembershipError, match="not a member"):
            await leader.membership.promote_member(9, 5.0)
        with pytest.raises(MembershipError, match="not a member"):
            await leader.membership.remove_member(9, 5.0)
        follower = next(n for n in g.nodes.values() if not n.is_leader())
        with pytest.raises(NotLeader):
            await follower.membership.remove_member(3, 5.0)
        await g.start(4, [1, 2, 3], join=True)
        first = asyncio.ensure_future(leader.membership.add_member(g.member(4, learner=True), 10.0))
        await asyncio.sleep(0)  # the first change is appended, not yet committed
        with pytest.raises(MembershipError, match="not committed yet"):
            await leader.membership.remove_member(3, 5.0)
        await first
        assert leader.core.last_index == before + 1  # only the one good change
        assert {m.id: m.role for m in leader.membership.members()}[4] == "learner"

    run(tmp_path, body)


def test_a_route_in_this_nodes_settings_wins_over_the_config_entrys_address(
    tmp_path: Path,
) -> None:
    """Node 1 reaches node 4 only through its route (the entry names a dead address):
    how a chaos run keeps a node added later behind its fault proxies."""

    async def body(g: Shard) -> None:
        real = g.peer(4)
        leader = await g.start(1, [1], routes=(Route(4, real.raft),))
        await g.put(b"before")
        joiner = await g.start(4, [1], join=True)
        dead = f"127.0.0.1:{free_ports(1)[0]}"
        await leader.membership.add_member(Member(4, dead, real.client, learner=True), 10.0)
        await caught_up(g, 4)
        assert bodies(joiner) == [b"before"]
        seen = {m.id: (m.raft, m.client) for m in leader.membership.members()}
        assert seen[4] == (real.raft, real.client)  # the route; the entry's client address

    run(tmp_path, body)


async def _async(value: T) -> T:
    return value


def test_a_node_says_how_long_since_it_heard_from_its_leader(tmp_path: Path) -> None:
    """`behind_ms` (a Route answer's age): -1 before any leader was heard, 0 on the
    leader, and on a follower the time since the leader's last message."""

    async def body(g: Shard) -> None:
        lone = await g.start(1, [1, 2, 3])
        assert lone.membership.behind_ms() == -1  # no leader since it started
        for i in (2, 3):
            await g.start(i, [1, 2, 3])
        leader = await g.leader()
        assert leader.membership.behind_ms() == 0
        await g.put(b"heard")
        for i, n in g.nodes.items():
            if n is not leader:

                async def lately(n: RaftNode = n) -> bool | None:
                    return 0 <= n.membership.behind_ms() < 1000 or None

                await until(lately, 10.0, f"node {i} to have heard its leader lately")

    run(tmp_path, body)
