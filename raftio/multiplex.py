"""Several shards on one peer stream: the shards of a node process share its links.

A process that hosts several shards (docs/scaling.md) keeps one outgoing
stream per peer process, not one per shard and peer: `LinkPool` hands each
shard's member table (`node.members`) a `ShardLink`, a view of the shared
`PeerLink` to that peer's Raft address that stamps the shard on every message it
queues (`RaftMessage.group`). Messages of every shard to one peer then travel in
the same batches: the heartbeats of all shards that a tick produces leave as one
RaftBatch per pair of processes, one HTTP/2 message, not one per shard.

The receiving side is the peer port's gate (`link.PeerGate`), which hands
each message to the shard it names; a shard absent on the wire is shard 1, so
shard 1's messages are those of a link that knows no shards.

Invariants: one shared link per (peer id, Raft address), opened with its first
shard and closed with its last; a shard's messages keep their order (they share
the link's ordered queue); closing one shard's view never closes the link under
another shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from netkit.peer_auth import PeerSecurity
from proto import dledger_pb2 as pb
from raftio.link import PeerLink

OpenLink = Callable[..., PeerLink]


class ShardLink:
    """Shard `shard`'s view of a shared link: what `node.members` uses of a PeerLink."""

    def __init__(self, pool: LinkPool, key: tuple[int, str], link: PeerLink, shard: int) -> None:
        self._pool, self._key, self._link, self.shard = pool, key, link, shard
        self.peer_id, self.address = link.peer_id, link.address
        self._closed = False

    def start(self) -> None:
        """Started with the shared link (by the pool): nothing to do per shard."""

    def send(self, messages: Sequence[tuple[pb.RaftMessage, int]]) -> None:
        shard = self.shard
        if shard != 1:  # absent is shard 1
            for msg, _ in messages:
                msg.group = shard
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
        shard: int,
        cluster: str,
        peer_id: int,
        address: str,
        *,
        me: int,
        security: PeerSecurity | None = None,
    ) -> ShardLink:
        """Shard `shard`'s link to `peer_id` at `address` (the shared one, opened and
        started with the first shard that asks)."""
        key = (peer_id, address)
        held = self._links.get(key)
        if held is None:
            link = self._open(cluster, peer_id, address, me=me, security=security)
            link.start()
            held = (link, 0)
        self._links[key] = (held[0], held[1] + 1)
        return ShardLink(self, key, held[0], shard)

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
