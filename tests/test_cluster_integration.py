"""Integration tests of the service: real node processes, real gRPC, real files and fsync.

The cheap tests share one module-scoped cluster (`cluster`, from conftest); the
tests that stop or kill nodes start their own (`make_cluster`). Nothing sleeps
and hopes: every wait is a condition with a deadline (`wait_until`).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import (
    Client,
    ClientError,
    PutResult,
    StoredMessage,
    stored_message,
)
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.node.config import segment_bytes_for
from proto import dledger_pb2 as pb
from store.entry_format import HEADER_SIZE
from store.message import MAX_PROPERTIES_BYTES, MAX_TOPIC_BYTES, decode_message
from tests.conftest import (
    CONVERGE_S,
    MAX_MESSAGE_BYTES,
    SMALL_SEGMENTS,
    answered,
    get_at,
    node_stubs,
    summary,
    wait_converged,
    wait_until,
)
from tests.workload import (
    Writers,
    check_acked,
    leader_and_follower,
    read_all,
)

pytestmark = pytest.mark.slow

ELECTION_BOUND_S = 5.0  # kill -9 of the leader to a new leader, measured


# ---------------------------------------------------------------- the shared cluster


def test_put_get_round_trip(cluster: LocalCluster) -> None:
    body = bytes(range(256)) * 4  # binary, not UTF-8
    keys = ("order-1", "customer-7")
    props = {"color": "blue", "héllo": "wörld ✓", "trace": "a=b;c"}
    with cluster.client() as client:
        put = client.put("RoundTrip", body, keys=keys, tags="TagA", properties=props)
        assert not put.duplicate
        assert put.commitlog_offset > 0
        by_id = client.get(msg_id=put.msg_id)
        by_offset = client.get(offset=put.commitlog_offset)
        linearizable = client.get(offset=put.commitlog_offset, linearizable=True)
    for got in (by_id, by_offset, linearizable):
        check_round_trip(got, put, body, keys, props)

    # Every replica serves the same message once it has committed it; a linearizable
    # read on any of them sees it at once.
    with node_stubs(cluster) as stubs:
        for node, stub in stubs.items():
            request = pb.GetRequest(commitlog_offset=put.commitlog_offset, linearizable=True)
            confirmed = stub.Get(request, timeout=5.0).message
            assert stored_message(confirmed) == by_offset, node
            got_pb = wait_until(
                partial(get_at, stub, put.commitlog_offset),
                10.0,
                f"node {node} to serve the message at {put.commitlog_offset}",
            )
            assert stored_message(got_pb) == by_offset, node


def check_round_trip(
    got: StoredMessage, put: PutResult, body: bytes, keys: tuple[str, ...], props: dict[str, str]
) -> None:
    assert got.topic == "RoundTrip"
    assert got.body == body
    assert got.body_size == len(body)
    assert got.keys == keys
    assert got.tags == "TagA"
    assert dict(got.properties) == props
    assert got.msg_id == put.msg_id
    assert got.commitlog_offset == put.commitlog_offset
    assert (got.queue_id, got.queue_offset) == (put.queue_id, put.queue_offset)
    assert got.store_timestamp_ms == put.store_timestamp_ms
    assert got.uniq_key


def test_put_to_a_follower_is_forwarded(cluster: LocalCluster) -> None:
    leader, follower = leader_and_follower(cluster)
    term = answered(cluster.statuses())[leader].term
    address = cluster.specs[follower].client
    # The server forwards: a raw stub reaches the follower and nothing else.
    message = pb.MessageData(topic="Forwarded", body=b"raw-to-follower", uniq_key=uuid.uuid4().hex)
    with node_stubs(cluster) as stubs:
        request = pb.PutRequest(message=message, cluster=cluster.cluster)
        raw = stubs[follower].Put(request, timeout=10.0).result
    # A client given only the follower's address (it learns the leader from the follower).
    with Client([address], cluster=cluster.cluster) as client:
        via_client = client.put("Forwarded", b"client-to-follower")
    after = answered(cluster.statuses())
    assert after[follower].role == "follower" and after[follower].term == term, summary(after)

    with node_stubs(cluster) as stubs:
        for offset, body in (
            (raw.commitlog_offset, b"raw-to-follower"),
            (via_client.commitlog_offset, b"client-to-follower"),
        ):
            for node, stub in stubs.items():
                got = wait_until(
                    partial(get_at, stub, offset),
                    10.0,
                    f"node {node} to serve the forwarded put at {offset}",
                )
                assert (got.body, got.topic) == (body, "Forwarded"), node


def test_retry_with_the_same_uniq_key_is_idempotent(cluster: LocalCluster) -> None:
    key = uuid.uuid4().hex.upper()
    leader, follower = leader_and_follower(cluster)
    with cluster.client() as client:
        before = wait_converged(cluster, CONVERGE_S)[leader]
        first = client.put("Idempotent", b"only-once", uniq_key=key)
        after_first = client.status(cluster.specs[leader].client)
        again = client.put("Idempotent", b"only-once", uniq_key=key)
        after_again = client.status(cluster.specs[leader].client)
    assert not first.duplicate
    assert again.duplicate
    assert again.msg_id == first.msg_id
    assert (again.commitlog_offset, again.queue_id, again.queue_offset) == (
        first.commitlog_offset,
        first.queue_id,
        first.queue_offset,
    )
    assert after_first.last_index == before.last_index + 1, "the put added one entry"
    assert after_again.last_index == after_first.last_index, "the retry added an entry"

    # A retry that reaches a follower is forwarded and answered from the window too.
    with node_stubs(cluster) as stubs:
        retry = pb.MessageData(topic="Idempotent", body=b"only-once", uniq_key=key)
        via_follower = stubs[follower].Put(pb.PutRequest(message=retry), timeout=10.0).result
        assert via_follower.duplicate
        assert (via_follower.msg_id, via_follower.commitlog_offset) == (
            first.msg_id,
            first.commitlog_offset,
        )
        statuses = wait_converged(cluster, CONVERGE_S, at_least=after_again.committed_index)
        assert statuses[leader].last_index == after_first.last_index
        # The log holds the message once, on every replica.
        for node, stub in stubs.items():
            held = read_all(stub, first.commitlog_offset)
            assert [m.physical_offset for m in held.values() if m.uniq_key == key] == [
                first.commitlog_offset
            ], node


def test_idempotent_retry_after_a_leader_change_returns_the_same_msg_id(
    cluster: LocalCluster,
) -> None:
    """The retry of a put acknowledged by the old leader answers with the same msg id."""
    key = uuid.uuid4().hex.upper()
    leader, follower = leader_and_follower(cluster)
    with cluster.client() as client:
        first = client.put("IdempotentMoved", b"once", uniq_key=key)
        wait_converged(cluster, CONVERGE_S)
        assert client.transfer_leadership(follower) == follower
        wait_until(
            lambda: cluster.wait_for_leader(timeout_s=5.0),
            10.0,
            f"node {follower} to lead",
            ok=lambda leader_now: leader_now == follower,
        )
        again = client.put("IdempotentMoved", b"once", uniq_key=key)
        stored = client.get(offset=first.commitlog_offset)
    assert again.duplicate
    assert again.commitlog_offset == first.commitlog_offset
    assert stored.msg_id == first.msg_id
    assert again.msg_id == first.msg_id, (
        f"the retry's msg id {again.msg_id} names another store host than the original "
        f"{first.msg_id} (node {leader} stored it, node {follower} answered the retry)"
    )


# ---------------------------------------------------------------- clusters of their own


def test_replicas_hold_identical_committed_bytes(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("replication")
    writers = Writers(cluster, "Replicated", threads=4, body_bytes=3000).start(per_thread=100)
    acked = writers.join()
    assert not writers.errors, writers.errors[:3]
    assert len(acked) == 400
    statuses = wait_converged(cluster, CONVERGE_S, at_least=len(acked))
    committed_pos = {s.committed_pos for s in statuses.values()}.pop()
    committed_index = {s.committed_index for s in statuses.values()}.pop()
    assert committed_pos > SMALL_SEGMENTS["data_segment_bytes"], "the load spans two segments"
    cluster.down()

    stores = {s.id: EntryStore(Path(s.data_dir) / "commitlog", **SMALL_SEGMENTS) for s in cluster}
    try:
        for node, store in stores.items():
            assert store.last_index() == committed_index, node
            assert store.last_chain_crc == statuses[node].last_chain_crc, node
        raw = {node: store.read_raw(0, committed_pos) for node, store in stores.items()}
        reference = raw[1]
        for node, data in raw.items():
            assert len(data) == committed_pos, node
            if data != reference:
                at = next(k for k, (a, b) in enumerate(zip(data, reference, strict=True)) if a != b)
                pytest.fail(f"node {node}'s committed bytes differ from node 1's at {at}")
        entries = {
            node: store.stored_entries(1, committed_index + 1, committed_pos * 2)
            for node, store in stores.items()
        }
        assert entries[2] == entries[1] and entries[3] == entries[1]
        assert len(entries[1]) == committed_index
        # And every acknowledged put is in those bytes, where it was acknowledged.
        messages = {
            a.result.commitlog_offset: decode_message(reference, a.result.commitlog_offset)
            for a in acked
        }
        check_acked(acked, messages, "the offline replica")
    finally:
        for store in stores.values():
            store.close()


def test_leader_killed_during_load(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster("failover")
    old = cluster.wait_for_leader(timeout_s=10.0)
    writers = Writers(cluster, "Failover", threads=6).start()
    try:
        wait_until(
            writers.count, 20.0, "100 acknowledged puts before the kill", ok=lambda n: n >= 100
        )
        killed_at = time.monotonic()
        cluster.kill(old)  # SIGKILL; returns once the process is gone
        new = cluster.wait_for_leader(exclude=old, timeout_s=15.0)
        election_s = time.monotonic() - killed_at
        before = writers.count()
        wait_until(
            writers.count,
            20.0,
            "100 more acknowledged puts after the failover",
            ok=lambda n: n >= before + 100,
        )
    finally:
        acked = writers.join(stop=True)
    print(
        f"leader {old} killed: node {new} leads after {election_s:.2f}s; {len(acked)} puts "
        f"acknowledged, {len(writers.errors)} failed"
    )
    assert election_s < ELECTION_BOUND_S, f"new leader {new} after {election_s:.2f}s"

    live = [s.id for s in cluster if s.id != old]
    statuses = wait_converged(cluster, CONVERGE_S, at_least=len(acked), nodes=live)
    with node_stubs(cluster) as stubs:
        # Through the API, on the new leader: each acknowledged put at its offset.
        for a in acked:
            got = (
                stubs[new]
                .Get(pb.GetRequest(commitlog_offset=a.result.commitlog_offset), timeout=5.0)
                .message
            )
            assert (got.body, got.msg_id) == (a.body, a.result.msg_id), a
        for node in live:
            check_acked(acked, read_all(stubs[node]), f"node {node}")

        # The killed node comes back and catches up with the others' log.
        cluster.start(old)
        final = wait_converged(cluster, CONVERGE_S, at_least=statuses[new].committed_index)
        assert final[old].last_chain_crc == final[new].last_chain_crc
        check_acked(acked, read_all(stubs[old]), f"restarted node {old}")


@pytest.mark.parametrize(
    "which, what", [("client", "clients"), ("raft", "Raft peers"), ("metrics", "metrics")]
)
def test_a_port_in_use_stops_start_up_with_one_clear_line(
    which: str, what: str, make_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = make_cluster(f"port-{which}")
    with cluster.client() as client:
        bodies = [f"kept {i}".encode() for i in range(20)]
        acked = [client.put("PortInUse", body) for body in bodies]
    node = next(s.id for s in cluster if s.id != cluster.leader_id())
    cluster.stop(node)
    address = getattr(cluster.specs[node], which)
    host, _, port = address.rpartition(":")
    with socket.create_server((host, int(port))):  # another program holds the node's port
        log_size = cluster.specs[node].log_path.stat().st_size
        cluster.start(node)
        ended = partial(cluster.exit_code, node)
        code = wait_until(ended, 60.0, f"node {node} to exit", ok=lambda c: c is not None)
        with cluster.specs[node].log_path.open("rb") as log:
            log.seek(log_size)
            printed = log.read().decode(errors="replace")
    assert code == 1, printed
    assert f"dledger: cannot listen for {what} on {address}: Address already in use" in printed
    assert "Traceback" not in printed, printed
    # Nothing was lost: once the port is free the node starts and serves every put.
    cluster.start(node)
    wait_converged(cluster, CONVERGE_S, at_least=len(acked))
    with node_stubs(cluster) as stubs:
        for body, result in zip(bodies, acked, strict=True):
            assert get_at(stubs[node], result.commitlog_offset).body == body


def test_the_largest_message_fits_the_smallest_segment_the_config_allows(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A message as large as the settings allow (the whole body, a 127-byte topic,
    32767 bytes of properties) fills a segment of `segment_bytes_for` bytes; puts
    of it roll the log over each time and every node stays up to serve them."""
    segment = segment_bytes_for(MAX_MESSAGE_BYTES)
    cluster = make_cluster("largest", data_segment_bytes=segment)
    topic = "T" * MAX_TOPIC_BYTES
    results = []
    with cluster.client() as client:
        for i in range(3):
            uniq = f"largest-{i}"
            room = MAX_PROPERTIES_BYTES - len(f"UNIQ_KEY\x01{uniq}\x02") - len("big\x01\x02")
            body = bytes([i]) * MAX_MESSAGE_BYTES
            r = client.put(topic, body, properties={"big": "v" * room}, uniq_key=uniq)
            results.append((body, r))
    # Each fills a segment of its own from the start (the log rolls over each time).
    assert [r.commitlog_offset % segment for _, r in results] == [HEADER_SIZE] * 3
    assert len({r.commitlog_offset // segment for _, r in results}) == 3
    wait_converged(cluster, CONVERGE_S, at_least=3)
    assert all(cluster.is_running(s.id) for s in cluster)
    with node_stubs(cluster) as stubs:
        for node in stubs:
            for body, r in results:
                got = get_at(stubs[node], r.commitlog_offset)
                assert got.body == body and got.topic == topic
    with cluster.client() as client:  # one byte more is refused, and nothing breaks
        with pytest.raises(ClientError, match="at most"):
            client.put(topic, b"x" * (MAX_MESSAGE_BYTES + 1))
        with pytest.raises(ClientError, match="at most"):
            client.put(topic, b"x", properties={"big": "v" * (room + 1)}, uniq_key=uniq)
        client.put("After", b"still serving")


def test_a_second_copy_of_a_running_node_refuses_to_start(cluster: LocalCluster) -> None:
    """Its data directory is locked: the copy exits with one line before it opens
    (and would "recover") the running node's files; the node serves on."""
    spec = cluster.specs[1]
    cmd = [sys.executable, "-m", "dledger_commitlog", "serve", "--config", str(spec.config_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    line = f"dledger: {spec.data_dir} is in use by another process (pid {cluster.pid(1)})"
    assert proc.returncode == 1 and proc.stderr.strip() == line, proc.stderr
    with cluster.client() as client:
        put = client.put("SecondCopy", b"still one node")
    with node_stubs(cluster) as stubs:
        got = wait_until(
            lambda: get_at(stubs[1], put.commitlog_offset), 10.0, "node 1 to serve the put"
        )
        assert got.body == b"still one node"
