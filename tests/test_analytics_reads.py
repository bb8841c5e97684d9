"""The analytics RPCs on real nodes: ReadLog, ReadUnits, OffsetsForTimes, Pull off the loop.

ReadLog serves raw committed commit-log bytes (checked entry by entry, once per
process), ReadUnits raw consume-queue units below the dispatched ends,
OffsetsForTimes a binary search on store timestamps; all three, and Pull, do
their reads in a thread pool, never on the event loop that runs Raft
(`Status.loop_lag_max_ms` measures it). Rights: ReadLog needs SUB on every
topic (as ReadRange), ReadUnits and OffsetsForTimes SUB on each topic named.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from analytics.server_store import ServerStore
from analytics.sources import LogPiece, Slice
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Access, MessageSpec, NodeStatus
from dledger_commitlog.common.signing import sign
from dledger_commitlog.service.loop_probe import LoopLagProbe
from proto import dledger_pb2 as pb
from store.entry_format import HEADER, HEADER_SIZE
from store.message import decode_message
from tests.conftest import leader_cut_off, node_stubs, wait_until
from tests.test_analytics_server import dispatched_everywhere, fresh_topic
from tests.test_security import APP_SECRET, READER_SECRET, _acl_cluster

pytestmark = pytest.mark.slow

UNIT = struct.Struct(">qiq")


def read_log(stub: Any, start: int = 0, end: int = 0, chunk: int = 0, **kw: Any) -> bytes:
    """ReadLog's chunks joined, checked to be contiguous from `start` and committed."""
    out = bytearray()
    for c in stub.ReadLog(
        pb.ReadLogRequest(from_pos=start, end_pos=end, chunk_bytes=chunk), timeout=30, **kw
    ):
        assert c.pos == start + len(out), (c.pos, start, len(out))
        assert c.pos + len(c.data) <= c.committed_pos
        out += c.data
    return bytes(out)


def committed_pos(stub: Any) -> int:
    return int(stub.Status(pb.StatusRequest(), timeout=5).committed_pos)


def entries(raw: bytes, start: int) -> Iterator[tuple[int, int, bytes]]:
    """(position, index, body) of each entry in raw log bytes from `start` (fillers skipped)."""
    at = 0
    while at < len(raw):
        magic, size = struct.unpack_from(">ii", raw, at)
        if magic == -1:
            at += size
            continue
        _, size, index, _, pos, *_ = HEADER.unpack_from(raw, at)
        assert pos == start + at
        yield pos, index, raw[at + HEADER_SIZE : at + size]
        at += size


def specs(topic: str, count: int, start: int = 0) -> list[MessageSpec]:
    return [
        MessageSpec(topic, f"{topic} {k}".encode() * (1 + k % 7), tags="even" if k % 2 else "odd")
        for k in range(start, start + count)
    ]


def test_read_log_is_the_committed_log_byte_for_byte_in_any_chunks(cluster: LocalCluster) -> None:
    topic = fresh_topic("rl")
    with cluster.client() as client:
        acked = client.put_batch(specs(topic, 300))
    dispatched_everywhere(cluster, topic, 300)
    first = acked[0].commitlog_offset - HEADER_SIZE
    with node_stubs(cluster) as stubs:
        logs = {i: read_log(stub, first, chunk=4096 + 7 * i) for i, stub in stubs.items()}
        for i, raw in logs.items():  # to the committed end the replica had then, or beyond
            assert first + len(raw) <= committed_pos(stubs[i])
        shortest = min(len(raw) for raw in logs.values())
        assert len({raw[:shortest] for raw in logs.values()}) == 1  # byte-identical replicas
        raw = logs[1]
        bodies = {pos + HEADER_SIZE: body for pos, _, body in entries(raw, first)}
        for r in acked:
            msg = decode_message(bodies[r.commitlog_offset])
            assert (msg.topic, msg.queue_id, msg.queue_offset) == (
                topic,
                r.queue_id,
                r.queue_offset,
            )
        # Again (checked before: no second CRC pass), in bigger chunks: the same bytes.
        assert read_log(stubs[1], first, chunk=1 << 20)[: len(raw)] == raw
        # A range that starts and ends at entries: exactly those bytes.
        mid = acked[150].commitlog_offset - HEADER_SIZE
        stop = acked[200].commitlog_offset - HEADER_SIZE
        assert read_log(stubs[2], mid, stop) == raw[mid - first : stop - first]


def read_heads(stub: Any, offsets: list[int]) -> tuple[bytes, bytes, list[int]]:
    """ReadLog's heads of the messages at `offsets`: (fixed parts, tails, tail offsets)."""
    packed = struct.pack(f"<{len(offsets)}q", *offsets)
    request = pb.ReadLogRequest(
        from_pos=offsets[0] - HEADER_SIZE, end_pos=offsets[-1] + 1, message_offsets=packed
    )
    heads, tails, ends = b"", b"", [0]
    for c in stub.ReadLog(request, timeout=30):
        assert not c.data and c.pos == offsets[len(heads) // 88]
        chunk = struct.unpack(f"<{len(c.tail_offsets) // 4}i", c.tail_offsets)
        ends += [len(tails) + e for e in chunk[1:]]
        heads, tails = heads + c.heads, tails + c.tails
    return heads, tails, ends


def test_read_log_heads_are_the_messages_without_their_bodies(cluster: LocalCluster) -> None:
    """ReadLog with message_offsets: each message's fixed part, and what follows its body;
    the Spark reader uses them for reads without the body column, with the same rows."""
    topic = fresh_topic("heads")
    with cluster.client() as client:
        acked = client.put_batch(specs(topic, 300))
    dispatched_everywhere(cluster, topic, 300)
    first = acked[0].commitlog_offset - HEADER_SIZE
    offsets = [r.commitlog_offset for r in acked]
    with node_stubs(cluster) as stubs:
        raw = read_log(stubs[1], first)
        for stub in stubs.values():
            for asked in (offsets, offsets[1::3]):
                heads, tails, ends = read_heads(stub, asked)
                assert len(heads) == 88 * len(asked) and len(ends) == len(asked) + 1
                for k, off in enumerate(asked):
                    at = off - first
                    (total,) = struct.unpack_from(">i", raw, at)
                    (body_len,) = struct.unpack_from(">i", raw, at + 84)
                    assert heads[88 * k : 88 * k + 88] == raw[at : at + 88]
                    assert tails[ends[k] : ends[k + 1]] == raw[at + 88 + body_len : at + total]
        stub = stubs[1]
        for bad, code in (
            ([offsets[2] + 1], grpc.StatusCode.INVALID_ARGUMENT),  # not where a message starts
            ([offsets[3], offsets[2]], grpc.StatusCode.INVALID_ARGUMENT),  # falling
            ([committed_pos(stub) + HEADER_SIZE], grpc.StatusCode.UNAVAILABLE),  # not committed
        ):
            with pytest.raises(grpc.RpcError) as err:
                read_heads(stub, bad)
            assert err.value.code() == code, (bad, err.value.details())
    # The reader: without the body column, the same rows as with it, from the heads.
    columns = [
        "topic",
        "queue_id",
        "queue_offset",
        "msg_id",
        "keys",
        "tags",
        "properties",
        "store_timestamp",
        "body_size",
    ]
    store = ServerStore([s.client for s in cluster], local_reads=False)
    asked_heads: list[int] = []
    heads_of = store._heads

    def counted(offsets: Any, end: int) -> Any:
        asked_heads.append(len(offsets))
        return heads_of(offsets, end)

    store._heads = counted  # type: ignore[method-assign]
    try:
        queues = tuple(
            Slice(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in store.queues(topic)
        )
        piece = LogPiece(first, offsets[-1] + 4096, queues)
        got = [r for b in store.read_piece(piece, columns) for r in b.to_pylist()]
        assert asked_heads == [300]
        whole = [r for b in store.read_piece(piece, [*columns, "body"]) for r in b.to_pylist()]
        assert asked_heads == [300]
    finally:
        store.close()
    assert got == [{c: r[c] for c in columns} for r in whole] and len(got) == 300


def test_read_log_refuses_bad_positions(cluster: LocalCluster) -> None:
    topic = fresh_topic("rlbad")
    with cluster.client() as client:
        acked = client.put_batch(specs(topic, 5))
    dispatched_everywhere(cluster, topic, 5)
    leader = cluster.wait_for_leader()
    with node_stubs(cluster) as stubs:
        stub = stubs[leader]
        with pytest.raises(grpc.RpcError) as err:
            read_log(stub, acked[2].commitlog_offset)  # a message, not its entry
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no entry starts at commit-log position" in (err.value.details() or "")
        with pytest.raises(grpc.RpcError) as err:
            read_log(stub, -1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        committed = stub.Status(pb.StatusRequest(), timeout=5).committed_pos
        assert read_log(stub, committed + 1000) == b""  # nothing beyond the committed end


def test_read_units_are_the_queues_units_below_their_committed_ends(cluster: LocalCluster) -> None:
    topic = fresh_topic("ru")
    with cluster.client() as client:
        acked = client.put_batch(specs(topic, 200))
    dispatched_everywhere(cluster, topic, 200)
    by_queue: dict[int, list[Any]] = {}
    for r in acked:
        by_queue.setdefault(r.queue_id, []).append(r)
    with node_stubs(cluster) as stubs:
        stub = stubs[1]
        ranges = [pb.QueueRange(topic=topic, queue_id=q) for q in sorted(by_queue)]
        answers = list(stub.ReadUnits(pb.ReadUnitsRequest(queues=ranges), timeout=10))
        for a in answers:
            units = [UNIT.unpack_from(a.units, k) for k in range(0, len(a.units), 20)]
            want = sorted(by_queue[a.queue_id], key=lambda r: r.queue_offset)
            assert a.first_offset == 0 and a.max_offset == len(want) and a.min_offset == 0
            assert [u[0] for u in units] == [r.commitlog_offset for r in want]
        # Narrowed to a commit-log range: the units of messages inside it, exactly.
        lo, hi = acked[50].commitlog_offset, acked[120].commitlog_offset
        answers = list(
            stub.ReadUnits(pb.ReadUnitsRequest(queues=ranges, from_pos=lo, to_pos=hi), timeout=10)
        )
        got = sorted(
            UNIT.unpack_from(a.units, k)[0] for a in answers for k in range(0, len(a.units), 20)
        )
        assert got == sorted(r.commitlog_offset for r in acked[50:120])
        # Beyond the end: cut at the committed end; a bad queue: refused.
        far = pb.QueueRange(topic=topic, queue_id=0, start_offset=0, end_offset=10**9)
        (a,) = stub.ReadUnits(pb.ReadUnitsRequest(queues=[far]), timeout=10)
        assert len(a.units) // 20 == a.max_offset == len(by_queue[0])
        bad = pb.QueueRange(topic=topic, queue_id=99)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ReadUnits(pb.ReadUnitsRequest(queues=[bad]), timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def clock_past(ms: int) -> None:
    """Wait until this host's clock (the nodes' too) reads later than `ms`."""
    wait_until(time.time, 5, f"the clock to pass {ms}", ok=lambda t: t * 1000 > ms + 1)


def test_offsets_for_times_is_the_first_offset_stored_at_or_after(cluster: LocalCluster) -> None:
    topic = fresh_topic("oft")
    stamps: list[Any] = []
    with cluster.client() as client:
        for k in range(6):  # batches at least a few milliseconds apart
            stamps += client.put_batch(specs(topic, 20, start=20 * k))
            clock_past(stamps[-1].store_timestamp_ms)
    dispatched_everywhere(cluster, topic, 120)
    with node_stubs(cluster) as stubs:
        for probe in (0, stamps[30].store_timestamp_ms, stamps[-1].store_timestamp_ms + 1):
            queries = [pb.TimeQuery(topic=topic, queue_id=q, timestamp_ms=probe) for q in range(4)]
            got = stubs[2].OffsetsForTimes(pb.OffsetsForTimesRequest(queries=queries), timeout=10)
            for q, offset in zip(range(4), got.offsets, strict=True):
                mine = sorted((r for r in stamps if r.queue_id == q), key=lambda r: r.queue_offset)
                want = next(
                    (r.queue_offset for r in mine if r.store_timestamp_ms >= probe), len(mine)
                )
                assert offset == want, (probe, q)


def test_a_node_cut_off_from_its_quorum_serves_only_its_committed_log(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster()
    topic = fresh_topic("cut")
    with cluster.client() as client:
        client.put_batch(specs(topic, 40))
    dispatched_everywhere(cluster, topic, 40)
    with leader_cut_off(cluster, specs(topic, 10, start=1000)) as leader:
        st = wait_until(
            lambda: cluster.statuses()[leader],
            15,
            f"node {leader} to hold uncommitted entries",
            ok=lambda s: isinstance(s, NodeStatus) and s.last_index > s.committed_index,
        )
        assert isinstance(st, NodeStatus)
        with node_stubs(cluster) as stubs:
            stub = stubs[leader]
            first = stub.ReadLog(pb.ReadLogRequest(), timeout=10)
            chunks = list(first)
            assert chunks and all(c.committed_pos == chunks[0].committed_pos for c in chunks)
            served = chunks[-1].pos + len(chunks[-1].data)
            assert (
                served
                == chunks[0].committed_pos
                <= stub.Status(pb.StatusRequest(), timeout=5).committed_pos
            )
            indexes = [i for _, i, _ in entries(b"".join(c.data for c in chunks), chunks[0].pos)]
            assert max(indexes) <= stub.Status(pb.StatusRequest(), timeout=5).committed_index


def test_a_damaged_entry_is_never_served_raw(make_cluster: Callable[..., LocalCluster]) -> None:
    """A byte flipped below the entry checkpoint: ReadLog over it fails with DATA_LOSS
    (every entry is CRC-checked before it is first served), the rest is served."""
    cluster = make_cluster("damaged")
    topic = fresh_topic("dmg")
    with cluster.client() as client:
        acked = client.put_batch(specs(topic, 60))
    dispatched_everywhere(cluster, topic, 60)
    victim = next(s.id for s in cluster if s.id != cluster.leader_id())
    cluster.stop(victim)  # a clean stop: the entry checkpoint passes every entry
    hit = acked[10]
    data = Path(cluster.specs[victim].data_dir) / "commitlog" / "data"
    segments = sorted((int(p.name), p) for p in data.iterdir() if p.name.isdigit())
    start, path = next((s, p) for s, p in reversed(segments) if s <= hit.commitlog_offset)
    with path.open("r+b") as f:
        f.seek(hit.commitlog_offset - start + 100)  # inside the message body
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x5A]))
    cluster.start(victim)
    with node_stubs(cluster) as stubs:
        stub = stubs[victim]
        wait_until(lambda: stub.Status(pb.StatusRequest(), timeout=2), 20, "the node to serve")
        entry = hit.commitlog_offset - HEADER_SIZE
        with pytest.raises(grpc.RpcError) as err:
            read_log(stub, acked[0].commitlog_offset - HEADER_SIZE)
        assert err.value.code() == grpc.StatusCode.DATA_LOSS
        assert f"position {entry} is damaged" in (err.value.details() or "")
        after = acked[11].commitlog_offset - HEADER_SIZE
        tail = read_log(stub, after, acked[-1].commitlog_offset)
        healthy = next(i for i in stubs if i != victim)
        assert tail == read_log(stubs[healthy], after, acked[-1].commitlog_offset)
        # The heads of its messages (ReadLog's, without bodies) are refused as well.
        with pytest.raises(grpc.RpcError) as err:
            read_heads(stub, [r.commitlog_offset for r in acked[5:20]])
        assert err.value.code() == grpc.StatusCode.DATA_LOSS
        # Pull, which reads the message with its entry, refuses it as well.
        with pytest.raises(grpc.RpcError) as err:
            stub.Pull(
                pb.PullRequest(
                    topic=topic,
                    queue_id=hit.queue_id,
                    queue_offset=hit.queue_offset,
                    max_messages=1,
                    raw=True,
                ),
                timeout=10,
            )
        assert err.value.code() == grpc.StatusCode.DATA_LOSS


# ---------------------------------------------------------------- the event loop


def test_the_probe_sees_a_blocked_loop() -> None:
    """The probe behind Status.loop_lag_max_ms reports a loop held for 160 ms as such."""

    async def run() -> tuple[float, float]:
        probe = LoopLagProbe()
        probe.start()
        await asyncio.sleep(0.05)
        quiet = probe.max_ms(reset=True)
        time.sleep(0.16)  # noqa: ASYNC251 - what a Pull of 16k messages on the loop used to do
        await asyncio.sleep(0.03)
        blocked = probe.max_ms()
        await probe.stop()
        return quiet, blocked

    quiet, blocked = asyncio.run(run())
    assert blocked >= 140, blocked
    assert quiet < blocked


def test_the_probe_wakes_the_loop_often_only_while_measured() -> None:
    """Unwatched, the probe fires every 100 ms (an idle node's loop sleeps); after a
    reset (how every measurement starts) every 10 ms, so a short block is seen whole."""

    async def run() -> tuple[int, float]:
        probe = LoopLagProbe()
        fires: list[float] = []
        ten_more = asyncio.Event()
        fire = probe._fire

        def counted() -> None:
            fires.append(time.monotonic())
            if len(fires) >= watched + 10:
                ten_more.set()
            fire()

        watched = 1 << 30
        probe._fire = counted  # type: ignore[method-assign]
        probe.start()
        await asyncio.sleep(0.35)
        idle_fires, watched = len(fires), len(fires)
        probe.max_ms(reset=True)
        start = time.monotonic()
        await asyncio.wait_for(ten_more.wait(), timeout=5)
        await probe.stop()
        return idle_fires, fires[watched + 9] - start

    idle_fires, took_s = asyncio.run(run())
    assert idle_fires <= 4, idle_fires  # timers never fire early: at most 3 in 350 ms
    assert took_s < 0.6, took_s  # 10 fires: 0.1 s at the fine interval, 1 s at the idle one


PULL = 16_384
BIG_CONFIG = {"data_segment_bytes": 64 << 20, "index_segment_bytes": 32 * 65536}


@pytest.mark.serial  # timing: measured alone, after the parallel run
def test_a_16k_message_pull_does_not_block_the_nodes_loop(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Raw Pulls of 16,384 messages from a follower: its event loop (which runs Raft) is
    never late by 20 ms. Margin: the loop used to be held for the whole Pull (160 ms on
    this machine); scheduling noise on a loaded machine is random, a blocked loop is
    not, so the best of up to 5 trials must stay under 20 ms."""
    cluster = make_cluster("pull16k", **BIG_CONFIG)
    topic = fresh_topic("p16")
    with cluster.client() as client:
        for _ in range(0, 2 * PULL, 2048):
            client.put_batch([MessageSpec(topic, bytes(300), queue_id=0) for _ in range(2048)])
    dispatched_everywhere(cluster, topic, 2 * PULL)
    follower = next(s.id for s in cluster if s.id != cluster.leader_id())
    trials = []
    with node_stubs(cluster) as stubs:
        stub = stubs[follower]
        for _ in range(5):
            stub.Status(pb.StatusRequest(reset_loop_lag=True), timeout=5)
            took = []
            for offset in (0, PULL):
                t = time.perf_counter()
                r = stub.Pull(
                    pb.PullRequest(
                        topic=topic,
                        queue_id=0,
                        queue_offset=offset,
                        max_messages=PULL,
                        raw=True,
                        max_bytes=64 << 20,
                    ),
                    timeout=30,
                )
                took.append(time.perf_counter() - t)
                assert r.next_offset == offset + PULL
                assert len(r.raw_messages) > PULL * 300
            lag = stub.Status(pb.StatusRequest(reset_loop_lag=True), timeout=5).loop_lag_max_ms
            trials.append((lag, max(took) * 1000))
            if lag < 20:
                break
    print("trials (loop lag ms, pull ms):", trials)
    assert min(lag for lag, _ in trials) < 20, trials


# ---------------------------------------------------------------- rights


def test_the_analytics_rpcs_check_rights(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = _acl_cluster(make_cluster)
    leader = cluster.wait_for_leader()
    with cluster.client() as admin:
        admin.put_batch(specs("orders", 20) + specs("audit", 5))
        wait_until(
            lambda: admin.queue_offsets("orders", linearizable=True),
            20,
            "the puts to be dispatched",
            ok=lambda qs: sum(q.max_offset for q in qs) == 20,
        )
    orders = pb.QueueRange(topic="orders", queue_id=0)
    audit = pb.QueueRange(topic="audit", queue_id=0)
    when = pb.TimeQuery(topic="audit", queue_id=0, timestamp_ms=0)
    calls: list[tuple[str, Callable[..., Any], Any]] = []
    with node_stubs(cluster) as stubs:
        stub = stubs[leader]
        calls = [
            ("ReadLog", lambda **kw: list(stub.ReadLog(pb.ReadLogRequest(), **kw)), None),
            (
                "ReadUnits",
                lambda **kw: list(
                    stub.ReadUnits(pb.ReadUnitsRequest(queues=[orders, audit]), **kw)
                ),
                None,
            ),
            (
                "OffsetsForTimes",
                lambda **kw: stub.OffsetsForTimes(pb.OffsetsForTimesRequest(queries=[when]), **kw),
                None,
            ),
        ]
        for method, call, _ in calls:
            with pytest.raises(grpc.RpcError) as err:  # no credentials
                call(timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
            with pytest.raises(grpc.RpcError) as err:  # a reader of orders only
                call(timeout=5, metadata=sign("orders-reader", READER_SECRET, method))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, method
            with pytest.raises(grpc.RpcError) as err:  # a writer: no SUB at all
                call(timeout=5, metadata=sign("app", APP_SECRET, method))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, method
            call(timeout=5, metadata=sign("reader", READER_SECRET, method))  # SUB everywhere
        # What the narrow reader may read, it may: units of orders, not the files' place.
        narrow = sign("orders-reader", READER_SECRET, "ReadUnits")
        got = list(stub.ReadUnits(pb.ReadUnitsRequest(queues=[orders]), timeout=5, metadata=narrow))
        assert got and got[0].topic == "orders"
        narrow = sign("orders-reader", READER_SECRET, "QueueOffsets")
        offsets = stub.QueueOffsets(pb.QueueOffsetsRequest(), timeout=5, metadata=narrow)
        assert not offsets.HasField("local_files")
        wide = sign("reader", READER_SECRET, "QueueOffsets")
        everything = stub.QueueOffsets(pb.QueueOffsetsRequest(), timeout=5, metadata=wide)
        assert everything.local_files.data_dir == str(
            Path(cluster.specs[leader].data_dir).resolve()
        )
    # The analytics store of the narrow reader: no raw log for it, so one queue at a
    # time (Pull), and exactly its topic's messages.
    creds = cluster.directory / "orders-reader.credentials"
    creds.write_text(f'access_key = "orders-reader"\nsecret_key = "{READER_SECRET}"\n')
    access = Access.load(None, str(creds))
    store = ServerStore([s.client for s in cluster], access=access, timeout_s=10, local_reads=True)
    try:
        queues = store.queues()
        assert {q.topic for q in queues} == {"orders"}
        slices = tuple(Slice(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in queues)
        span = store.unit_span(slices)
        assert span is not None
        rows = sum(
            b.num_rows
            for b in store.read_piece(LogPiece(span[0], span[1], slices), ["topic", "body"])
        )
        assert rows == 20 and store.last_path == "pull"
    finally:
        store.close()


def test_analytics_reads_over_tls_and_acl(make_cluster: Callable[..., LocalCluster]) -> None:
    """The raw reads (ReadUnits + ReadLog) travel over TLS with a signed call."""
    cluster = make_cluster("tls", tls=True, acl=True)
    topic = fresh_topic("tls")
    with cluster.client() as client:
        client.put_batch(specs(topic, 50))
    access = Access.load(str(cluster.tls_ca), str(cluster.credentials_path))
    store = ServerStore([s.client for s in cluster], access=access, timeout_s=10, local_reads=False)
    try:
        queues = wait_until(
            lambda: store.queues(topic),
            20,
            "the messages to be dispatched",
            ok=lambda qs: sum(q.max_offset for q in qs) == 50,
        )
        slices = tuple(Slice(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in queues)
        span = store.unit_span(slices)
        assert span is not None
        batches = list(store.read_piece(LogPiece(span[0], span[1], slices), ["topic", "body"]))
        assert store.last_path == "rpc"
        bodies = sorted(b for batch in batches for b in batch.column("body").to_pylist())
        assert bodies == sorted(s.body for s in specs(topic, 50))
    finally:
        store.close()


def test_pull_keeps_its_limits(cluster: LocalCluster) -> None:
    """Pull, now read in a thread: max_messages, max_bytes (at least one message),
    end_offset, tag filters and next_offset are what they were."""
    topic = fresh_topic("lim")
    with cluster.client() as client:
        acked = client.put_batch(
            [
                MessageSpec(topic, bytes(100 + k), queue_id=0, tags="even" if k % 2 == 0 else "odd")
                for k in range(40)
            ]
        )
    dispatched_everywhere(cluster, topic, 40)
    sizes = {r.queue_offset: r for r in acked}
    assert len(sizes) == 40
    with node_stubs(cluster) as stubs:
        stub = stubs[1]

        def pull(**kw: Any) -> Any:
            request = pb.PullRequest(topic=topic, queue_id=0, raw=True, **kw)
            return stub.Pull(request, timeout=10)

        r = pull(queue_offset=0, max_messages=10)
        assert r.next_offset == 10 and r.max_offset == 40 and r.min_offset == 0
        one = pull(queue_offset=3, max_messages=10, max_bytes=1)  # at least one message
        assert one.next_offset == 4
        assert decode_message(one.raw_messages).queue_offset == 3
        some = pull(queue_offset=0, max_messages=40, max_bytes=3 * 400)
        assert 1 < some.next_offset < 40
        assert len(some.raw_messages) <= 3 * 400
        ended = pull(queue_offset=5, max_messages=40, end_offset=12)
        assert ended.next_offset == 12
        odd = pb.PullRequest(
            topic=topic, queue_id=0, queue_offset=0, max_messages=40, tag_expression="odd"
        )
        tagged = stub.Pull(odd, timeout=10)
        assert [m.queue_offset for m in tagged.messages] == list(range(1, 40, 2))
        assert all(m.tags == "odd" for m in tagged.messages)
        assert tagged.next_offset == 40
        with pytest.raises(grpc.RpcError) as err:
            pull(queue_offset=41)
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
