"""Several shards on one peer stream (raftio/multiplex.py), over a real gRPC port.

A process hosting several shards keeps one stream per peer process: each shard's
messages are stamped with their shard (shard 1's are not: a single-shard node's
stream is that of a link without shards), travel in the same batches, and the gate hands
each to its shard, in order. What the shards send in one loop iteration (their
heartbeats on an aligned tick) leaves as one batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from proto import dledger_pb2 as pb
from raft.messages import Heartbeat, Message
from raftio.link import PeerGate
from raftio.multiplex import LinkPool
from raftio.transport import open_link
from raftio.wire import to_wire
from tests.test_peer_link import CLUSTER, messages, peer_server, until


class CountingGate(PeerGate):
    """A gate that also keeps every batch it received, as parsed protobuf."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.batches: list[pb.RaftBatch] = []

    def receive(self, raw: bytes, sender: int | None, peer: str) -> None:
        self.batches.append(pb.RaftBatch.FromString(raw))
        super().receive(raw, sender, peer)


def delivered_by_shard(
    shards: tuple[int, ...],
) -> tuple[dict[int, list[Message]], Callable[..., object]]:
    got: dict[int, list[Message]] = {g: [] for g in shards}

    def deliver_of(shard: int) -> Callable[[Message], None] | None:
        return got[shard].append if shard in got else None

    return got, deliver_of


def test_three_shards_share_one_stream_each_message_reaching_its_shard_in_order() -> None:
    shards = (0, 1, 2)
    sent = {g: messages(300) for g in shards}
    got, deliver_of = delivered_by_shard(shards)

    async def main() -> CountingGate:
        gate = CountingGate(CLUSTER, lambda m: None, me=2, members=(1, 2, 3), shards=deliver_of)
        async with peer_server(gate) as port:
            pool = LinkPool(open_link)
            links = {g: pool.open(g, CLUSTER, 2, f"127.0.0.1:{port}", me=1) for g in shards}
            assert pool.links == 1  # one stream to the peer, whatever the shards
            for i in range(0, 300, 50):  # the shards' Readies interleave
                for g in shards:
                    links[g].send([to_wire(m) for m in sent[g][i : i + 50]])
                await asyncio.sleep(0)
            await until(lambda: all(len(got[g]) == 300 for g in shards), 10, "all delivered")
            for g in shards:
                await links[g].close()
            assert pool.links == 0  # closed with its last shard
        return gate

    gate = asyncio.run(main())
    assert got == sent
    stamped = {(p.HasField("group"), p.group) for b in gate.batches for p in b.messages}
    assert stamped == {(True, 0), (False, 0), (True, 2)}  # shard 1 travels unstamped


def test_what_the_shards_send_in_one_loop_iteration_leaves_as_one_batch() -> None:
    """Heartbeats of three shards ticking together: one RaftBatch to the peer, not three."""
    shards = (1, 2, 3)
    got, deliver_of = delivered_by_shard(shards)

    async def main() -> CountingGate:
        gate = CountingGate(CLUSTER, lambda m: None, me=2, members=(1, 2), shards=deliver_of)
        async with peer_server(gate) as port:
            pool = LinkPool(open_link)
            links = {g: pool.open(g, CLUSTER, 2, f"127.0.0.1:{port}", me=1) for g in shards}
            await until(lambda: links[1].connected, 10, "the stream is open")
            for tick in range(1, 21):
                for g in shards:  # one tick of every shard, no await between them
                    links[g].send([to_wire(Heartbeat(1, 2, tick, 0, b""))])
                await until(
                    lambda t=tick: all(len(got[g]) == t for g in shards),  # type: ignore[misc]
                    10,
                    f"tick {tick} delivered",
                )
            for g in shards:
                await links[g].close()
        return gate

    gate = asyncio.run(main())
    assert [len(b.messages) for b in gate.batches] == [3] * 20
    assert all([m.term for m in got[g]] == list(range(1, 21)) for g in shards)
