"""Multi-Raft under faults, on real node processes (issue 24): 3 nodes, every node
process hosting data shards 1..3 and shard 0, all on 127.0.0.1.

- Leader kills in two shards at once under load. With 3 nodes, killing two node
  processes loses every shard's quorum, so "two shards at once" is one process
  leading two shards: leaders are moved (leadership transfer) so that one node
  leads two data shards, and that process is SIGKILLed while a writer per data
  shard puts; both shards elect new leaders among the other two nodes. The node is
  restarted and the same is done to another node and another pair of shards.
  Then every acknowledged put of every shard is read back, by message id and in a
  pull of its queue, from every node: zero acknowledged loss in each shard.
- A corrupt shard on one node (a flipped byte in the segment holding its
  checkpointed entry, or its store layout changed under it: recovery refuses
  either): that node's process stays up and serves its other shards (puts and
  reads through it), answers the corrupt shard's calls UNAVAILABLE naming why, and
  the cluster's copy of that shard keeps serving through the other two nodes.
- A single-shard cluster restarted with `dledger cluster up --groups 3` keeps its
  data as shard 1 (every message id unchanged) and gains shards 2, 3 and 0 (it
  says `--groups` and `groups status`, the old names of `--shards` and `shard
  status`, to show that they still work).
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from chaos.disk import flip_byte
from dledger_commitlog.cli.cluster_layout import shards_config
from dledger_commitlog.cli.launcher import LocalCluster, converged
from dledger_commitlog.client import Client, NodeStatus
from dledger_commitlog.common.protocol import shard_metadata
from dledger_commitlog.common.routes import shard_of_msg_id
from dledger_commitlog.log.verify import read_layout, write_layout
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from tests.conftest import SHARED_CONFIG, wait_until
from tests.multiraft_helpers import (
    Acked,
    servers,
    shard_leader,
    shard_leaders,
    shard_statuses,
    transfer,
    writer,
)

pytestmark = pytest.mark.slow

SHARDS = 3
DATA_SHARDS = (1, 2, 3)
CONVERGE_S = 30.0
COMMAND_TIMEOUT_S = 60.0


def multi(make_cluster: Callable[..., LocalCluster], name: str) -> LocalCluster:
    cluster = make_cluster(name, **shards_config(SHARDS))
    shard_leaders(cluster, range(SHARDS + 1))
    return cluster


def wait_shard_converged(cluster: LocalCluster, shard: int) -> None:
    wait_until(
        lambda: shard_statuses(cluster, shard),
        CONVERGE_S,
        f"shard {shard}'s replicas to commit the same log",
        ok=converged,
    )


def acked_progress(acked: dict[int, Acked], more: int) -> None:
    """Every writer has `more` acknowledged puts beyond what it has now."""
    marks = {g: len(a.puts) for g, a in acked.items()}
    wait_until(
        lambda: {g: len(a.puts) - marks[g] for g, a in acked.items()},
        60.0,
        f"every shard to acknowledge {more} more puts",
        ok=lambda d: min(d.values()) >= more,
    )


def pull_all(client: Client, topic: str, queue: int) -> dict[str, bytes]:
    """Every message of one queue of the client's shard: msg id -> body."""
    out: dict[str, bytes] = {}
    offset = 0
    while True:
        got = client.pull(topic, queue, offset, max_messages=256)
        for m in got.messages:
            out[m.msg_id] = m.body
        if not got.messages or got.next_offset >= got.max_offset:
            return out
        offset = got.next_offset


def check_no_loss(cluster: LocalCluster, acked: dict[int, Acked]) -> None:
    for g, a in acked.items():
        wait_shard_converged(cluster, g)
        for spec in cluster:
            with Client([spec.client], shard=g, timeout_s=10.0) as one:
                queues = {q: pull_all(one, a.topic, q) for q in (0, 1)}
                for msg_id, body, queue in a.puts:
                    assert shard_of_msg_id(msg_id) == g
                    assert queues[queue].get(msg_id) == body, (
                        f"shard {g}: acknowledged {msg_id} missing from queue {queue} "
                        f"on node {spec.id}"
                    )
                for msg_id, body, _ in a.puts[:: max(1, len(a.puts) // 50)]:
                    assert one.get(msg_id).body == body


def kill_two_leaders(cluster: LocalCluster, victim: int, pair: tuple[int, int]) -> None:
    """Move the leaders of shards `pair` to node `victim`, SIGKILL it, wait for both
    shards' new leaders among the others, restart it."""
    for g in pair:
        transfer(cluster, g, victim)
    cluster.kill(victim)
    rest = [s.id for s in cluster if s.id != victim]
    for g in pair:
        assert shard_leader(cluster, g, rest) != victim


@pytest.mark.parametrize("rounds", [((3, (2, 3)), (1, (1, 2)))], ids=["two-rounds"])
def test_leader_kills_in_two_shards_at_once_lose_no_acknowledged_put(
    make_cluster: Callable[..., LocalCluster],
    rounds: tuple[tuple[int, tuple[int, int]], ...],
) -> None:
    cluster = multi(make_cluster, "chaos")
    stop = threading.Event()
    with (
        writer(cluster, 1, "load", stop) as a1,
        writer(cluster, 2, "load", stop) as a2,
        writer(cluster, 3, "load", stop) as a3,
    ):
        acked = {1: a1, 2: a2, 3: a3}
        acked_progress(acked, 20)
        for victim, pair in rounds:
            kill_two_leaders(cluster, victim, pair)
            acked_progress(acked, 20)  # every shard, the two that lost their leader too
            cluster.start(victim)
            wait_until(
                lambda v=victim: cluster.statuses()[v],  # type: ignore[misc]
                30.0,
                f"node {victim} to answer again",
                ok=lambda s: isinstance(s, NodeStatus),
            )
            acked_progress(acked, 20)
    for g, a in acked.items():
        print(f"shard {g}: {len(a.puts)} acknowledged puts, {len(a.errors)} failed attempts")
        assert len(a.puts) >= 100, (g, len(a.puts), a.errors[-3:])
    check_no_loss(cluster, acked)


def corrupt(shard_dir: Path, how: str) -> str:
    """Damage a stopped node's shard directory so that recovery refuses it; what the
    refusal names."""
    if how == "segment":  # the checkpointed (last) entry: recovery's anchor
        flip_byte(shard_dir, random.Random(7), last_entries=1, above_checkpoint=False)
        return "corrupt entry at"
    layout = read_layout(shard_dir)
    write_layout(shard_dir, {**layout, "data_segment_bytes": 2 * layout["data_segment_bytes"]})
    return "data_segment_bytes"


@pytest.mark.parametrize("how", ["segment", "layout"])
def test_a_corrupt_shard_on_one_node_stops_alone(
    make_cluster: Callable[..., LocalCluster], how: str
) -> None:
    cluster = multi(make_cluster, "corrupt")
    bad_shard, victim = 2, 2
    before: dict[int, list[str]] = {}
    for g in DATA_SHARDS:
        with Client(servers(cluster), shard=g) as client:
            before[g] = [client.put("t", b"before-%d" % i).msg_id for i in range(5)]
    for g in DATA_SHARDS:
        wait_shard_converged(cluster, g)
    cluster.down()
    named = corrupt(Path(cluster.specs[victim].data_dir) / "groups" / str(bad_shard), how)
    cluster.up()
    for g in (0, 1, 3):
        shard_leader(cluster, g)
    rest = [s.id for s in cluster if s.id != victim]
    shard_leader(cluster, bad_shard, rest)
    assert cluster.is_running(victim)
    address = cluster.specs[victim].client
    # The victim's other shards serve through it: puts (forwarded to their leaders
    # when it follows) and reads of what was there before and after.
    for g in (1, 3):
        with Client([address], shard=g, timeout_s=15.0) as through:
            after = through.put("t", b"after-%d" % g)
            assert shard_of_msg_id(after.msg_id) == g
            for msg_id in [*before[g], after.msg_id]:
                got = wait_until(
                    lambda m=msg_id: through.get(m),  # type: ignore[misc]
                    15.0,
                    f"node {victim} to serve {msg_id} of shard {g}",
                )
                assert got.msg_id == msg_id
    # The corrupt shard answers UNAVAILABLE there, naming why.
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.DLedgerClientStub(channel)
        calls: list[tuple[str, object]] = [
            ("Get", pb.GetRequest(msg_id=before[bad_shard][0])),
            ("Status", pb.StatusRequest()),
            ("Put", pb.PutRequest(message=pb.MessageData(topic="t", body=b"x"))),
        ]
        for method, request in calls:
            with pytest.raises(grpc.RpcError) as err:
                getattr(stub, method)(request, metadata=shard_metadata(bad_shard), timeout=5.0)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
            why = err.value.details() or ""
            assert f"shard {bad_shard} is stopped on node {victim}" in why, why
            assert named in why, why
    # The cluster's shard 2 keeps serving through the other two nodes.
    others = [cluster.specs[i].client for i in rest]
    with Client(others, shard=bad_shard, timeout_s=15.0) as g2:
        new = [g2.put("t", b"still-%d" % i) for i in range(5)]
        for msg_id in [*before[bad_shard], *(r.msg_id for r in new)]:
            assert shard_of_msg_id(g2.get(msg_id).msg_id) == bad_shard
    log = cluster.log_tail(victim, 400)
    assert "Traceback" not in log.split("===")[-1], log


def dledger(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dledger_commitlog", *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


def test_a_single_shard_cluster_grows_shards_keeping_its_data(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("grow")
    with cluster.client() as client:
        put = [client.put("kept", b"kept-%d" % i) for i in range(20)]
    assert all(shard_of_msg_id(r.msg_id) == 1 for r in put)
    wait_until(cluster.statuses, CONVERGE_S, "shard 1 to converge", ok=converged)
    cluster.down()
    directory = cluster.specs[1].home.parent
    sets = [f"--set={k}={v}" for k, v in SHARED_CONFIG.items()]
    try:
        dledger("cluster", "up", "--dir", str(directory), "--groups", str(SHARDS), *sets)
        leaders = shard_leaders(cluster, range(SHARDS + 1))
        assert sorted(leaders) == [0, 1, 2, 3]
        with Client(servers(cluster), shard=1) as g1:
            for i, r in enumerate(put):
                got = g1.get(r.msg_id)
                assert got.body == b"kept-%d" % i and got.queue_offset == r.queue_offset
                assert got.commitlog_offset == r.commitlog_offset
        for g in (0, 2, 3):
            statuses = shard_statuses(cluster, g)
            assert all(isinstance(s, NodeStatus) for s in statuses.values()), statuses
        for g in (2, 3):
            with Client(servers(cluster), shard=g) as client:
                r = client.put("kept", b"new")
                assert shard_of_msg_id(r.msg_id) == g
                assert client.get(r.msg_id).body == b"new"
        status = dledger("groups", "status", "--cluster", str(directory / "cluster.json"))
        assert "leads:" in status
    finally:
        subprocess.run(
            [sys.executable, "-m", "dledger_commitlog", "cluster", "down", "--dir", str(directory)],
            capture_output=True,
            timeout=60,
            check=False,
        )
