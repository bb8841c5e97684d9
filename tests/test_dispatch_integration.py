"""Dispatch and reads on real node processes: Pull, long polling, tags, QueryByKey,
consumer groups, any-replica and linearizable reads, rebuild, verify, recovery.

Every wait is a condition with a deadline. The randomized kill test prints its
seed (set DLEDGER_TEST_SEED to replay it).
"""

from __future__ import annotations

import functools
import json
import operator
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, NodeStatus, OffsetOutOfRange, StoredMessage
from dledger_commitlog.log.verify import verify_store
from proto import dledger_pb2 as pb
from tests.conftest import CONVERGE_S, node_stubs, wait_converged, wait_until
from tests.workload import Writers, read_all

pytestmark = pytest.mark.slow


def pull_all(client: Client, topic: str, queue_id: int, tags: str = "*") -> list[StoredMessage]:
    out: list[StoredMessage] = []
    offset = 0
    while True:
        r = client.pull(topic, queue_id, offset, 256, tags)
        out.extend(r.messages)
        if r.next_offset >= r.max_offset:
            return out
        offset = r.next_offset


def wait_dispatched(cluster: LocalCluster, timeout_s: float = CONVERGE_S) -> None:
    """Every node has committed what any node has (a follower learns of the last commit
    with the leader's next message) and dispatched all of it."""

    def caught_up() -> bool:
        statuses = list(cluster.statuses(timeout_s=1.0).values())
        if not all(isinstance(s, NodeStatus) for s in statuses):
            return False
        known = [s for s in statuses if isinstance(s, NodeStatus)]
        top = max(s.committed_pos for s in known)
        return all(s.committed_pos == top and s.dispatched_pos == top for s in known)

    wait_until(caught_up, timeout_s, "every node to dispatch what it committed")


# ---------------------------------------------------------------- the shared cluster


def test_pull_serves_each_queue_in_order_with_tag_filters(cluster: LocalCluster) -> None:
    topic = f"pull{int(time.time() * 1000)}"
    with cluster.client() as client:
        sent = []
        for i in range(24):
            r = client.put(
                topic, f"m{i}", tags=("TagA", "TagB", "TagC")[i % 3], queue_id=i % 2, keys=[f"k{i}"]
            )
            sent.append(r)
        for q in (0, 1):
            got = pull_all(client, topic, q)
            assert [m.queue_offset for m in got] == list(range(12))
            assert [m.body for m in got] == [f"m{i}".encode() for i in range(q, 24, 2)]
            assert [m.commitlog_offset for m in got] == [
                r.commitlog_offset for r in sent if r.queue_id == q
            ]
        only_a = pull_all(client, topic, 0, "TagA")
        assert {m.tags for m in only_a} == {"TagA"} and len(only_a) == 4
        a_or_c = pull_all(client, topic, 1, "TagA || TagC")
        assert {m.tags for m in a_or_c} == {"TagA", "TagC"} and len(a_or_c) == 8
        offsets = {(q.queue_id, q.min_offset, q.max_offset) for q in client.queue_offsets(topic)}
        assert offsets == {(0, 0, 12), (1, 0, 12)}
        with pytest.raises(OffsetOutOfRange):
            client.pull(topic, 0, 13)


def test_long_poll_returns_as_soon_as_a_message_commits(cluster: LocalCluster) -> None:
    topic = f"poll{int(time.time() * 1000)}"
    with cluster.client() as client:
        client.put(topic, "first", queue_id=0)
        started = time.monotonic()
        empty = client.pull(topic, 0, 1, wait_ms=300)
        assert not empty.messages and time.monotonic() - started >= 0.25
        result: list[StoredMessage] = []

        def poll() -> None:
            with cluster.client() as c:
                result.extend(c.pull(topic, 0, 1, wait_ms=20_000).messages)

        t = threading.Thread(target=poll)
        t.start()
        started = time.monotonic()
        client.put(topic, "second", queue_id=0)
        t.join(timeout=20)
        assert [m.body for m in result] == [b"second"]
        assert time.monotonic() - started < 10, "the long poll waited out its time"


def test_query_by_key_finds_keys_and_uniq_keys(cluster: LocalCluster) -> None:
    topic = f"query{int(time.time() * 1000)}"
    with cluster.client() as client:
        r1 = client.put(topic, "one", keys=["order-1", "user-7"], uniq_key="U-ONE")
        client.put(topic, "two", keys=["order-2", "user-7"])
        client.put(f"{topic}x", "other", keys=["order-1"])
        wait_dispatched(cluster)
        by_order = client.query(topic, "order-1")
        assert [m.body for m in by_order] == [b"one"]
        assert by_order[0].msg_id == r1.msg_id
        assert sorted(m.body for m in client.query(topic, "user-7")) == [b"one", b"two"]
        assert [m.body for m in client.query(topic, "U-ONE")] == [b"one"]
        assert client.query(topic, "nobody") == []
        future = int(time.time() * 1000) + 3_600_000
        assert client.query(topic, "order-1", begin_ms=future, end_ms=future + 1) == []


def test_every_replica_serves_the_same_queues(cluster: LocalCluster) -> None:
    topic = f"replica{int(time.time() * 1000)}"
    with cluster.client() as client:
        for i in range(10):
            client.put(topic, f"r{i}", queue_id=0, keys=[f"key{i}"])
    wait_dispatched(cluster)
    answers = []
    with node_stubs(cluster) as stubs:
        for stub in stubs.values():
            r = stub.Pull(
                pb.PullRequest(topic=topic, queue_id=0, queue_offset=0, max_messages=100), timeout=5
            )
            answers.append([(m.commitlog_offset, m.body) for m in r.messages])
            q = stub.QueryByKey(pb.QueryByKeyRequest(topic=topic, key="key3"), timeout=5)
            assert [m.body for m in q.messages] == [b"r3"]
    assert len(answers[0]) == 10 and all(a == answers[0] for a in answers)


def test_linearizable_pull_on_a_follower_sees_an_acknowledged_put(cluster: LocalCluster) -> None:
    topic = f"lin{int(time.time() * 1000)}"
    leader = cluster.wait_for_leader(timeout_s=10.0)
    follower = next(s for s in cluster if s.id != leader)
    with cluster.client() as client, Client([follower.client]) as on_follower:
        for i in range(5):
            client.put(topic, f"l{i}", queue_id=0)
            got = on_follower.pull(topic, 0, i, linearizable=True)
            assert [m.body for m in got.messages] == [f"l{i}".encode()]


def test_bad_reads_get_clear_errors(cluster: LocalCluster) -> None:
    with node_stubs(cluster) as stubs:
        stub = next(iter(stubs.values()))
        cases = [
            (pb.PullRequest(topic="bad topic!", queue_id=0), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.PullRequest(topic="t", queue_id=99), grpc.StatusCode.INVALID_ARGUMENT),
            (
                pb.PullRequest(topic="t", queue_id=0, tag_expression="A ||"),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            (
                pb.PullRequest(topic="never-written", queue_id=0, queue_offset=5),
                grpc.StatusCode.OUT_OF_RANGE,
            ),
        ]
        for request, code in cases:
            with pytest.raises(grpc.RpcError) as err:
                stub.Pull(request, timeout=5)
            assert err.value.code() == code, request
            assert err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.QueryByKey(pb.QueryByKeyRequest(topic="t", key=""), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            stub.Put(
                pb.PutRequest(message=pb.MessageData(topic="%SYS%OFFSETS", body=b"x")), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reserved" in (err.value.details() or "")


def test_consume_cli_resumes_from_the_group_offset(cluster: LocalCluster, tmp_path: Path) -> None:
    topic = f"consume{int(time.time() * 1000)}"
    with cluster.client() as client:
        for i in range(6):
            client.put(topic, f"c{i}")

    def consume(n: int) -> list[str]:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "dledger_commitlog",
                "consume",
                "--servers",
                ",".join(s.client for s in cluster),
                "--group",
                "g1",
                "--topic",
                topic,
                "--max",
                str(n),
                "--idle-exit",
                "3",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return [json.loads(line)["body"] for line in out.stdout.splitlines()]

    first = consume(4)
    assert len(first) == 4
    with cluster.client() as client:
        client.put(topic, "c6")
    rest = consume(100)
    assert len(rest) == 3, rest
    assert sorted(first + rest) == sorted(f"c{i}" for i in range(7))


# ---------------------------------------------------------------- clusters of their own


def test_group_offsets_survive_leader_failover(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster("groups")
    with cluster.client() as client:
        client.put("orders", "x", queue_id=2)
        client.commit_offset("billing", "orders", 2, 1)
        client.commit_offset("billing", "orders", 0, 7)
        old = cluster.wait_for_leader(timeout_s=10.0)
        cluster.kill(old)
        cluster.wait_for_leader(exclude=old, timeout_s=15.0)
        offsets = client.fetch_offset("billing", "orders", linearizable=True)
        assert offsets == {0: 7, 1: -1, 2: 1, 3: -1}
        client.commit_offset("billing", "orders", 0, 9)
        cluster.start(old)
        wait_converged(cluster, CONVERGE_S)
    with Client([cluster.specs[old].client]) as on_old:
        wait_until(
            lambda: on_old.fetch_offset("billing", "orders", 0),
            15,
            "the old leader to learn the new offset",
            ok=lambda o: o == {0: 9},
        )


def test_rebuilt_queues_and_index_are_byte_identical(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster("rebuild", cq_units_per_file=64, index_slots=64, index_entries=200)
    assert Writers(cluster, "rb", threads=3, keyed=True).start(per_thread=120).join()
    with cluster.client() as client:
        client.commit_offset("g", "rb", 1, 5)
    wait_converged(cluster, CONVERGE_S)
    wait_dispatched(cluster)
    stop_all(cluster)
    for spec in cluster:
        data = Path(spec.data_dir)
        report = verify_store(data)
        assert report.ok, report.problems
        assert report.queues_checked >= 4 and report.index_files_checked >= 2
        saved = tmp_path / f"live{spec.id}"
        shutil.copytree(data, saved)
        shutil.rmtree(data / "consumequeue")
        shutil.rmtree(data / "index")
    for spec in cluster:
        cluster.start(spec.id)
    cluster.wait_for_leader(timeout_s=20.0)
    wait_converged(cluster, CONVERGE_S)
    wait_dispatched(cluster)
    stop_all(cluster)
    for spec in cluster:
        data, saved = Path(spec.data_dir), tmp_path / f"live{spec.id}"
        for sub in ("consumequeue", "index"):
            live = sorted(p.relative_to(saved) for p in (saved / sub).rglob("*") if p.is_file())
            again = sorted(p.relative_to(data) for p in (data / sub).rglob("*") if p.is_file())
            assert live == again, f"node {spec.id}: {sub} files differ after a rebuild"
            for rel in live:
                assert (saved / rel).read_bytes() == (data / rel).read_bytes(), rel
        offsets = [json.loads((d / "consumer_offsets.json").read_bytes()) for d in (saved, data)]
        assert offsets[0]["offsets"] == offsets[1]["offsets"] == [["g", "rb", 1, 5]]


def test_kills_and_pauses_under_load_then_queues_match_a_rebuild(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Concurrent puts while nodes are killed or cut off at random moments (seeded).

    The dispatch invariant is checked inside every node, per batch: a unit or index
    entry at or beyond the node's committed position stops that node (it would not
    converge or answer below). Afterwards every acknowledged put is readable through
    Pull and QueryByKey, and every store equals a rebuild from its log."""
    seed = int(os.environ.get("DLEDGER_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (DLEDGER_TEST_SEED={seed} replays it)")
    rng = random.Random(seed)
    cluster = make_cluster("kills", cq_units_per_file=128, index_slots=128, index_entries=512)
    writers = Writers(cluster, "kl", threads=4, keyed=True).start()
    try:
        for _ in range(4):
            wait_until(
                writers.count,
                20,
                "writers to make progress",
                ok=functools.partial(operator.lt, writers.count() + 20),
            )
            victim = rng.choice([s.id for s in cluster])
            time.sleep(rng.uniform(0.0, 0.5))  # a random moment in the load, not a wait
            if rng.random() < 0.5:
                cluster.kill(victim)
                cluster.start(victim)
            else:  # cut off (SIGSTOP) until the others have a leader without it
                cluster.pause(victim)
                cluster.wait_for_leader(exclude=victim, timeout_s=20.0)
                cluster.resume(victim)
            cluster.wait_for_leader(timeout_s=20.0)
    finally:
        acked = writers.join(stop=True)
    assert acked, f"seed {seed}: nothing was acknowledged"
    wait_converged(cluster, CONVERGE_S)
    wait_dispatched(cluster)
    with cluster.client() as client:
        by_queue: dict[int, dict[int, StoredMessage]] = {}
        for q in range(4):
            by_queue[q] = {m.queue_offset: m for m in pull_all(client, "kl", q)}
        for a in acked:
            got = by_queue[a.result.queue_id].get(a.result.queue_offset)
            assert got is not None and got.body == a.body, f"seed {seed}: lost {a}"
        sample = rng.sample(acked, min(20, len(acked)))
        for a in sample:
            found = client.query("kl", got_key(a.body))
            assert [m.commitlog_offset for m in found] == [a.result.commitlog_offset], seed
    stop_all(cluster)
    for spec in cluster:
        report = verify_store(Path(spec.data_dir))
        assert report.ok, f"seed {seed}, node {spec.id}: {report.problems}"


def stop_all(cluster: LocalCluster) -> None:
    """Stop every node cleanly (SIGTERM, final checkpoint)."""
    for spec in cluster:
        cluster.stop(spec.id)


def got_key(body: bytes) -> str:
    """The key Writers(keyed=True) gave a put: "w<writer>-<i>" from its body "topic/wW/I|..."."""
    _, w, i = body.split(b"|", 1)[0].decode().split("/")
    return f"{w}-{i}"


def test_a_wiped_node_is_rebuilt_from_the_leader(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("wiped")
    Writers(cluster, "wp", threads=2, keyed=True).start(per_thread=50).join()
    leader = cluster.wait_for_leader(timeout_s=10.0)
    victim = next(s for s in cluster if s.id != leader)
    cluster.kill(victim.id)
    shutil.rmtree(victim.data_dir)
    cluster.start(victim.id)
    wait_converged(cluster, CONVERGE_S)
    wait_dispatched(cluster)
    with node_stubs(cluster) as stubs:
        assert read_all(stubs[victim.id]) == read_all(stubs[leader])
        r = stubs[victim.id].Pull(
            pb.PullRequest(topic="wp", queue_id=0, max_messages=1000), timeout=5
        )
        assert len(r.messages) == r.max_offset > 0


def test_retention_deletes_old_segments_and_a_lagging_follower_catches_up(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """clean-now --force deletes what every replica has; min offsets advance on every
    node; reads below them are OUT_OF_RANGE; a follower that was down meanwhile is
    caught up from the leader's first retained entry."""
    cluster = make_cluster("retention", data_segment_bytes=256 * 1024, cq_units_per_file=100)
    Writers(cluster, "rt", threads=2, body_bytes=2000).start(per_thread=150).join()
    leader = cluster.wait_for_leader(timeout_s=10.0)
    lagging = next(s.id for s in cluster if s.id != leader)
    wait_converged(cluster, CONVERGE_S)
    wait_dispatched(cluster)
    cluster.stop(lagging)
    Writers(cluster, "rt", threads=2, body_bytes=2000).start(per_thread=150).join()
    with cluster.client() as client:
        for spec in cluster:
            if spec.id != lagging:
                r = client.clean_now(spec.client, force=True)
                assert r.deleted_segments > 0, (spec.id, r)
        leader_status = client.status(cluster.specs[leader].client)
        assert leader_status.first_index > 1
        low = client.queue_offsets("rt")
        assert any(q.min_offset > 0 for q in low), low
        with pytest.raises(OffsetOutOfRange):
            client.get(offset=HEADER)
        q0 = next(q for q in low if q.min_offset > 0)
        with pytest.raises(OffsetOutOfRange):
            client.pull("rt", q0.queue_id, q0.min_offset - 1)
        assert client.pull("rt", q0.queue_id, q0.min_offset).messages
    cluster.start(lagging)
    wait_converged(cluster, CONVERGE_S)
    wait_dispatched(cluster)
    with node_stubs(cluster) as stubs:
        on_lagging = read_all(stubs[lagging])
        on_leader = read_all(stubs[leader])
        assert on_lagging and set(on_lagging) <= set(on_leader)
        assert all(on_leader[k].body == m.body for k, m in on_lagging.items())


HEADER = 48  # the first message's commit-log offset (after the first entry header)
