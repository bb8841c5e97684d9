"""Multi-Raft on one peer stream: the Raft groups of a node process share its links.

A process that hosts several Raft groups (docs/scaling.md) keeps one outgoing
stream per peer process, not one per group and peer: `LinkPool` hands each
group's member table (`node.members`) a `GroupLink`, a view of the shared
`PeerLink` to that peer's Raft address that stamps the group on every message it
queues (`RaftMessage.group`). Messages of every group to one peer then travel in
the same batches: the heartbeats of all groups that a tick produces leave as one
RaftBatch per pair of processes, one HTTP/2 message, not one per group.

The receiving side is the peer port's gate (`link.PeerGate`), which hands
each message to the group it names; a group absent on the wire is group 1, so
group 1's messages are those of a link that knows no groups.

Invariants: one shared link per (peer id, Raft address), opened with its first
group and closed with its last; a group's messages keep their order (they share
the link's ordered queue); closing one group's view never closes the link under
another group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from netkit.peer_auth import PeerSecurity
from proto import dledger_pb2 as pb
from raftio.link import PeerLink

OpenLink = Callable[..., PeerLink]


class GroupLink:
    """Group `group`'s view of a shared link: what `node.members` uses of a PeerLink."""

    def __init__(self, pool: LinkPool, key: tuple[int, str], link: PeerLink, group: int) -> None:
        self._pool, self._key, self._link, self.group = pool, key, link, group
        self.peer_id, self.address = link.peer_id, link.address
        self._closed = False

    def start(self) -> None:
        """Started with the shared link (by the pool): nothing to do per group."""

    def send(self, messages: Sequence[tuple[pb.RaftMessage, int]]) -> None:
        group = self.group
        if group != 1:  # absent is group 1
            for msg, _ in messages:
                msg.group = group
        self._link.send(messages)

    @property
    def connected(self) -> bool:
        return self._link.connected

    @property
    def dropped(self) -> int:
        return self._link.dropped

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._pool.release(self._key)


class LinkPool:
    """The shared outgoing links of one process, by (peer id, Raft address)."""

    def __init__(self, open_link: OpenLink) -> None:
        self._open = open_link
        self._links: dict[tuple[int, str], tuple[PeerLink, int]] = {}

    def open(
        self,
        group: int,
        cluster: str,
        peer_id: int,
        address: str,
        *,
        me: int,
        security: PeerSecurity | None = None,
    ) -> GroupLink:
        """Group `group`'s link to `peer_id` at `address` (the shared one, opened and
        started with the first group that asks)."""
        key = (peer_id, address)
        held = self._links.get(key)
        if held is None:
            link = self._open(cluster, peer_id, address, me=me, security=security)
            link.start()
            held = (link, 0)
        self._links[key] = (held[0], held[1] + 1)
        return GroupLink(self, key, held[0], group)

    async def release(self, key: tuple[int, str]) -> None:
        link, users = self._links[key]
        if users > 1:
            self._links[key] = (link, users - 1)
            return
        del self._links[key]
        await link.close()

    @property
    def links(self) -> int:
        """How many streams the process keeps open (one per peer process it talks to)."""
        return len(self._links)
