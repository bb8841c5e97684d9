"""The Raft peer link (h2grpc), in one process over real loopback sockets.

Messages arrive whole and in order, with mTLS and peer tokens too; a bad stream is refused as
gRPC would refuse it, seen by a grpcio client as an outsider would use one (a batch
that does not parse is INVALID_ARGUMENT, one past 64 MiB RESOURCE_EXHAUSTED, a
sender of another wire version FAILED_PRECONDITION naming both); a stalled peer
neither blocks the loop nor grows a queue; a restarted peer is reached again within
an election timeout; a connection whose pings go unanswered is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import grpc
import pytest

import h2grpc
from dledger_commitlog.cli.certs import make_dev_pki
from h2grpc import connection as h2_connection
from h2grpc import frames as h2_frames
from netkit.channel import MAX_MESSAGE_BYTES
from netkit.peer_auth import NODE_AUTH, PeerAuth, PeerSecurity, TlsIdentity
from proto import dledger_pb2 as pb
from raft.messages import AppendEntries, Heartbeat, Message, RequestVote
from raft.types import Entry
from raftio import h2 as transport_h2
from raftio.link import PeerGate, PeerLink
from raftio.transport import PeerServer, open_link, open_peer_server
from raftio.wire import (
    BATCHES_READ,
    MAX_QUEUED,
    PEER_ID,
    WIRE,
    to_proto,
    to_wire,
)

CLUSTER = "c"
ELECTION_TIMEOUT_S = 0.5  # the default: 10 ticks of 50 ms (randomized up to twice that)
METHOD = "/dledger.v1.RaftPeer/Stream"


def messages(count: int, src: int = 1, dst: int = 2) -> list[Message]:
    """Heartbeats, appends with entries and votes, in one order."""
    out: list[Message] = []
    for i in range(count):
        match i % 3:
            case 0:
                out.append(Heartbeat(src, dst, 3, i))
            case 1:
                entries = (Entry(i, 3, bytes([i % 251]) * (i % 700)), Entry(i + 1, 3, b"x"))
                out.append(AppendEntries(src, dst, 3, i - 1, 3, entries, i - 2))
            case _:
                out.append(RequestVote(src, dst, 4, i, 3))
    return out


async def until(ok: Callable[[], object], timeout_s: float, what: str) -> None:
    """Await `ok()` on the running loop, failing after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def peer_server(gate: PeerGate, port: int = 0) -> AsyncIterator[int]:
    """A Raft port on 127.0.0.1, started; its port."""
    server: PeerServer = open_peer_server(gate)
    bound = server.bind(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield bound
    finally:
        await server.stop(grace_s=0)


@contextlib.asynccontextmanager
async def started(link: PeerLink) -> AsyncIterator[PeerLink]:
    link.start()
    try:
        yield link
    finally:
        await link.close()


def security(tmp_path: Path, node_id: int, *, tls: bool) -> PeerSecurity:
    """Node `node_id`'s identity: a peer token, and with `tls` its certificate."""
    peers = PeerAuth(CLUSTER, b"s" * 32)
    if not tls:
        return PeerSecurity(peers=peers)
    pki_dir = tmp_path / "pki"
    if not pki_dir.exists():
        make_dev_pki(pki_dir, [1, 2, 3], [])
    pems = (pki_dir / "ca.pem", pki_dir / f"node-{node_id}.pem", pki_dir / f"node-{node_id}.key")
    return PeerSecurity(tls=TlsIdentity(*(p.read_bytes() for p in pems)), peers=peers)


@pytest.mark.parametrize("tls", [False, True], ids=["token", "mtls"])
def test_messages_arrive_whole_and_in_order(tls: bool, tmp_path: Path) -> None:
    """Messages arrive whole and in order, with peer tokens and with mTLS."""
    sent = messages(3000)
    got: list[Message] = []
    rejects: list[str] = []

    async def main() -> None:
        mine = security(tmp_path, 2, tls=tls)
        gate = PeerGate(
            CLUSTER, got.append, me=2, members=(1, 2, 3), security=mine, on_reject=rejects.append
        )
        async with peer_server(gate) as port:
            link = open_link(
                CLUSTER, 2, f"127.0.0.1:{port}", me=1, security=security(tmp_path, 1, tls=tls)
            )
            async with started(link):
                for i in range(0, len(sent), 100):  # as Readies would, a few at a time
                    link.send([to_wire(m) for m in sent[i : i + 100]])
                    await asyncio.sleep(0)
                await until(lambda: len(got) >= len(sent), 10, "every message delivered")

    asyncio.run(main())
    assert got == sent
    assert rejects == []


def raw_batches(*raws: bytes) -> Callable[[], AsyncIterator[bytes]]:
    async def gen() -> AsyncIterator[bytes]:
        for raw in raws:
            yield raw

    return gen


def batch(cluster: str, msgs: Sequence[Message]) -> bytes:
    return pb.RaftBatch(cluster=cluster, messages=[to_proto(m) for m in msgs]).SerializeToString()


REFUSED = {
    # case: (claimed sender, token of, request bytes) -> (status, on_reject label)
    "unparsable": (1, 1, b"\x12\xff\xff\xff", "INVALID_ARGUMENT", "malformed"),
    "bad message": (1, 1, b"\x0a\x01c\x12\x02\x08\x63", "INVALID_ARGUMENT", "malformed"),
    "wrong cluster": (1, 1, batch("other", [Heartbeat(1, 2, 3, 0)]), "FAILED_PRECONDITION", None),
    "no token": (1, None, batch(CLUSTER, [Heartbeat(1, 2, 3, 0)]), "UNAUTHENTICATED", "token"),
    "not a member": (
        9,
        9,
        batch(CLUSTER, [Heartbeat(9, 2, 3, 0)]),
        "PERMISSION_DENIED",
        "membership",
    ),
    "posing": (1, 1, batch(CLUSTER, [Heartbeat(3, 2, 3, 0)]), "PERMISSION_DENIED", "membership"),
    "out of bounds": (
        1,
        1,
        batch(CLUSTER, [Heartbeat(1, 2, (1 << 62) + 1, 0)]),
        "INVALID_ARGUMENT",
        "invalid",
    ),
}


def checked_deliver(got: list[Message]) -> Callable[[Message], None]:
    """What the node's `deliver` does with a term past its bound: refuse it."""
    from raft.validate import InvalidPeerMessage

    def deliver(m: Message) -> None:
        if m.term > 1 << 62:
            raise InvalidPeerMessage("term past 2^62")
        got.append(m)

    return deliver


@pytest.mark.parametrize("case", REFUSED)
def test_a_bad_stream_is_refused_as_grpc_would(case: str) -> None:
    """A grpcio client (as an outsider would use) meets the status gRPC would answer;
    the refusal is counted, and nothing of the stream reaches the core."""
    claimed, token_of, raw, status, label = REFUSED[case]
    auth = PeerAuth(CLUSTER, b"s" * 32)
    got: list[Message] = []
    rejects: list[str] = []

    async def main() -> grpc.StatusCode:
        gate = PeerGate(
            CLUSTER,
            checked_deliver(got),
            me=2,
            members=(1, 2, 3),
            security=PeerSecurity(peers=auth),
            on_reject=rejects.append,
        )
        async with (
            peer_server(gate) as port,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            meta = [(PEER_ID, str(claimed))]
            if token_of is not None:
                meta.append((NODE_AUTH, auth.token(token_of, 2)))
            call = channel.stream_unary(METHOD, response_deserializer=pb.RaftAck.FromString)
            try:
                await call(raw_batches(raw)(), metadata=meta, timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    assert asyncio.run(main()).name == status
    assert rejects == ([label] if label else [])
    assert got == []


@pytest.mark.parametrize(
    ("wire", "status"),
    [
        ("2", "FAILED_PRECONDITION"),
        ("2,3", "FAILED_PRECONDITION"),
        ("1,2", "OK"),  # a newer node that still speaks version 1
        (None, "OK"),  # a node older than the field speaks version 1
    ],
)
def test_a_peer_of_another_wire_version_is_refused_naming_both(
    wire: str | None, status: str
) -> None:
    """The Raft stream's metadata says which wire versions the sender speaks (absent:
    1); a node refuses a stream it has no version in common with, and says why."""
    got: list[Message] = []
    rejects: list[str] = []

    async def main() -> tuple[grpc.StatusCode, str]:
        gate = PeerGate(CLUSTER, got.append, me=2, members=(1, 2, 3), on_reject=rejects.append)
        async with (
            peer_server(gate) as port,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            meta = [(PEER_ID, "1")] + ([(WIRE, wire)] if wire is not None else [])
            call = channel.stream_unary(METHOD, response_deserializer=pb.RaftAck.FromString)
            raw = batch(CLUSTER, [Heartbeat(1, 2, 3, 0)])
            try:
                await call(raw_batches(raw)(), metadata=meta, timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            return grpc.StatusCode.OK, ""

    code, details = asyncio.run(main())
    assert code.name == status
    if status == "OK":
        assert got == [Heartbeat(1, 2, 3, 0)] and rejects == []
    else:
        assert details == (
            f"node 1 speaks Raft wire version {wire}, node 2 speaks 1: "
            "they cannot run side by side (docs/upgrades.md)"
        )
        assert got == [] and rejects == ["wire"]


def test_a_batch_past_the_message_limit_is_refused() -> None:
    """RESOURCE_EXHAUSTED, as gRPC answers a message past its limit; h2grpc's side
    refuses it by its length prefix, before buffering it."""
    got: list[Message] = []

    async def main() -> grpc.StatusCode:
        gate = PeerGate(CLUSTER, got.append, me=2, members=(1, 2))
        async with (
            peer_server(gate) as port,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            call = channel.stream_unary(METHOD, response_deserializer=pb.RaftAck.FromString)
            entry = Entry(1, 3, bytes(MAX_MESSAGE_BYTES))
            big = batch(CLUSTER, [AppendEntries(1, 2, 3, 0, 3, (entry,), 0)])
            try:
                await call(raw_batches(big)(), timeout=20)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    assert asyncio.run(main()) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert got == []


@contextlib.asynccontextmanager
async def stalled_peer() -> AsyncIterator[tuple[int, list[asyncio.StreamWriter]]]:
    """A peer that accepts connections and never reads a byte (nor answers a ping)."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        for writer in accepted:
            writer.close()


def test_a_stalled_peer_holds_the_sender_and_bounds_the_queue() -> None:
    """HTTP/2 flow control holds the link's sender; the node's loop never waits and
    the link's queue stays at MAX_QUEUED, dropping the oldest."""

    async def main() -> None:
        async with stalled_peer() as (port, accepted):
            link = open_link(CLUSTER, 2, f"127.0.0.1:{port}", me=1)
            async with started(link):
                await until(lambda: link.connected, 5, "connected to the stalled peer")
                entry = (Entry(1, 3, bytes(16 << 10)),)
                slowest_s = 0.0
                for i in range(200):
                    t = time.perf_counter()
                    link.send([to_wire(AppendEntries(1, 2, 3, i, 3, entry, 0))] * 100)
                    await asyncio.sleep(0)
                    slowest_s = max(slowest_s, time.perf_counter() - t)
                assert len(link._queue) <= MAX_QUEUED
                assert link.dropped >= 200 * 100 - MAX_QUEUED - 256 * 4
                assert slowest_s < 0.5, f"the loop waited {slowest_s:.3f} s on a stalled peer"
                assert link.connected and len(accepted) == 1

    asyncio.run(main())


def test_an_unanswered_ping_replaces_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer gone silent (no FIN: a partition, a frozen host) is found by keepalive
    pings: the connection is closed and a new one opened."""
    monkeypatch.setattr(transport_h2, "KEEPALIVE_S", 0.2)
    monkeypatch.setattr(h2_connection, "KEEPALIVE_TIMEOUT_S", 0.3)

    async def main() -> None:
        async with stalled_peer() as (port, accepted):
            link = open_link(CLUSTER, 2, f"127.0.0.1:{port}", me=1)
            async with started(link):
                await until(lambda: len(accepted) >= 2, 5, "a second connection")

    asyncio.run(main())


def test_a_restarted_peer_is_reached_within_an_election_timeout() -> None:
    got: list[Message] = []
    reached_s: list[float] = []

    async def main() -> None:
        gate = PeerGate(CLUSTER, got.append, me=2, members=(1, 2))
        async with peer_server(gate) as port:
            link = open_link(CLUSTER, 2, f"127.0.0.1:{port}", me=1)
            async with started(link):
                link.send([to_wire(Heartbeat(1, 2, 3, 0))])
                await until(lambda: len(got) == 1, 5, "the first heartbeat")
        await until(lambda: not link.connected, 5, "the link saw its peer stop")
        await asyncio.sleep(0.2)  # down a while: the link is retrying
        async with started(link), peer_server(gate, port):
            back = time.monotonic()
            while len(got) == 1 and time.monotonic() - back < 5:
                link.send([to_wire(Heartbeat(1, 2, 3, 1))])  # the leader's heartbeats
                await asyncio.sleep(0.01)
            reached_s.append(time.monotonic() - back)

    asyncio.run(main())
    assert reached_s[0] < 2 * ELECTION_TIMEOUT_S, f"reached again after {reached_s[0]:.2f} s"


def test_a_link_refused_until_it_is_a_member_loses_nothing_sent_after() -> None:
    """A joining node's links are refused (PERMISSION_DENIED: not a member there) until
    the peer appends its addition; they retry at once, not after a pause, and a stream
    that was refused never takes a message queued for the next one (grpc.aio's consumer
    of a refused call outlived it and once ate a vote request: a transfer of leadership
    to a node just added then fell back to an election)."""
    auth = PeerAuth(CLUSTER, b"s" * 32)
    got: list[Message] = []
    members = {1, 2}  # node 4 is not a member of node 2's group yet

    async def main() -> None:
        gate = PeerGate(
            CLUSTER,
            checked_deliver(got),
            me=2,
            members=lambda: members,
            security=PeerSecurity(peers=auth),
        )
        async with peer_server(gate) as port:
            link = open_link(
                CLUSTER, 2, f"127.0.0.1:{port}", me=4, security=PeerSecurity(peers=auth)
            )
            async with started(link):
                await asyncio.sleep(0.3)  # refused a few times meanwhile
                assert not got
                members.add(4)
                sent = [to_wire(m) for m in messages(6, src=4)]
                started_s = time.monotonic()
                for wire in sent:
                    link.send([wire])
                    await asyncio.sleep(0.02)
                await until(lambda: len(got) == len(sent), 2.0, "every message delivered")
                assert time.monotonic() - started_s < 1.0  # no refusal pause of a second

    asyncio.run(main())
    assert got == messages(6, src=4)


def test_what_a_refused_stream_never_read_goes_on_the_next() -> None:
    """A message queued while the peer is refusing the stream it would travel on (the
    peer appended our addition between its check and our send) is not lost: the peer
    says how many batches it read, and the link sends the rest again on its next stream."""
    got: list[Message] = []
    sent = messages(6, src=4)
    checks: list[int] = []
    link_box: list[PeerLink] = []

    def members() -> set[int]:
        checks.append(1)
        if len(checks) > 1:
            return {1, 2, 4}
        # The refusal of this stream is decided: queue messages as it travels back.
        link_box[0].send([to_wire(m) for m in sent])
        return {1, 2}

    async def main() -> None:
        gate = PeerGate(
            CLUSTER,
            checked_deliver(got),
            me=2,
            members=members,
            security=PeerSecurity(peers=PeerAuth(CLUSTER, b"s" * 32)),
        )
        async with peer_server(gate) as port:
            link = open_link(
                CLUSTER,
                2,
                f"127.0.0.1:{port}",
                me=4,
                security=PeerSecurity(peers=PeerAuth(CLUSTER, b"s" * 32)),
            )
            link_box.append(link)
            async with started(link):
                await until(lambda: len(got) == len(sent), 3.0, "every message delivered")

    asyncio.run(main())
    assert got == sent
    assert len(checks) >= 2  # the first stream was refused


def test_a_batch_refused_for_membership_goes_again_in_open_mode() -> None:
    """Without peer tokens or TLS the stream opens for anyone, and the node refuses a
    non-member's message as it delivers it (PERMISSION_DENIED): that batch counts as
    not read, so once the sender is a member it arrives, whole and in order."""
    from raft.validate import InvalidPeerMessage

    got: list[Message] = []
    refused: list[Message] = []
    sent = messages(6, src=4)

    def deliver(m: Message) -> None:
        if not refused:
            refused.append(m)
            raise InvalidPeerMessage(f"node {m.src} is not a member", membership=True)
        got.append(m)

    async def main() -> None:
        gate = PeerGate(CLUSTER, deliver, me=2, members=lambda: {1, 2})
        async with peer_server(gate) as port:
            link = open_link(CLUSTER, 2, f"127.0.0.1:{port}", me=4)
            link.send([to_wire(m) for m in sent])
            async with started(link):
                await until(lambda: len(got) == len(sent), 3.0, "every message delivered")

    asyncio.run(main())
    assert refused == sent[:1] and got == sent


def test_a_link_sends_again_only_what_the_peer_never_read_and_keeps_little() -> None:
    """After a refusal that read `r` batches, the batches after them go first on the next
    stream, in their order and before what was queued since; a long stream keeps its
    last 64 batches at most, not everything it ever sent."""

    async def main() -> None:
        link = PeerLink(CLUSTER, 2, "127.0.0.1:1", me=1)
        sent = messages(3)
        batches = []
        for m in sent:
            link.send([to_wire(m)])
            batch = await link.next_batch()
            assert batch is not None
            batches.append(batch)
        later = messages(4)[3:]
        link.send([to_wire(m) for m in later])
        link._end_stream(read=1)  # the peer took batch 0 off the stream, never 1 and 2
        again = await link.next_batch()
        assert again is not None
        assert list(again.messages) == [to_proto(m) for m in sent[1:] + later]
        link._end_stream(read=None)  # broken, or a peer that does not say: nothing again
        for _ in range(200):
            link.send([to_wire(sent[0])])
            await link.next_batch()
        assert len(link._sent) == 64

    asyncio.run(main())


def test_nothing_after_a_refused_batch_is_delivered_even_in_the_same_read() -> None:
    """Three batches in one HTTP/2 DATA frame, the second from the wrong cluster: the h2
    port parses them in one read callback, delivers the first, refuses the second, and
    the third never reaches the core (the refusal says two batches were read: the refused
    one counts, as on grpc.aio, unless refused for membership)."""
    got: list[Message] = []

    async def main() -> h2grpc.Answer | None:
        gate = PeerGate(CLUSTER, got.append, me=2, members=(1, 2))
        good = [batch(CLUSTER, [Heartbeat(1, 2, 3, i)]) for i in (1, 3)]
        wrong = batch("other", [Heartbeat(1, 2, 3, 2)])
        async with peer_server(gate) as port:
            conn = await h2grpc.connect("127.0.0.1", port)
            try:
                stream = conn.open(METHOD, [(PEER_ID, "1")])
                stream.send_data(b"".join(map(h2_frames.prefixed, (good[0], wrong, good[1]))))
                await stream.wait_closed()
                return h2grpc.Answer.of(stream)
            finally:
                conn.close()

    answer = asyncio.run(main())
    assert answer is not None and answer.code_name == "FAILED_PRECONDITION"
    assert dict(answer.metadata)[BATCHES_READ] == "2"
    assert got == [Heartbeat(1, 2, 3, 1)]
