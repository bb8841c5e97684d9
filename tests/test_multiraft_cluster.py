"""Multi-Raft routing on real node processes (issue 24): one 3-node cluster of 3 data
shards (and shard 0, the routes) for the module, every node process hosting every
shard, all on 127.0.0.1.

- `RoutedClient` puts to a topic routed over shards 2 and 3 land only there (the
  message id names the shard), round robin covers every queue of the route, a
  sharding key keeps one queue; `get` by message id reads from the id's shard,
  through every node.
- A route update is seen after a refresh; a put to a queue a shard no longer has
  is refused naming why, and a routed client with the old route refreshes and
  lands within the new one.
- `Route` is answered by every node; `TopicUpdate` on a follower of shard 0
  redirects to shard 0's leader.
- The CLI: `topic create/route/delete`, `shard status` and `groups balance` (the old
  name of `shard balance`, which still works) with --json.
- Consumers: `dledger consume` (a `RoutedConsumer`) joins the consumer group in
  every data shard and reads the topic from all of them, `--max` counting them all
  (never handed more), `--shard` one shard alone; `AsyncRoutedClient.consumers`
  run together with one member id.
- Metrics of a multi-shard node carry a `shard` label, one series per shard.
- A drained node hands over every shard it leads and follows in all of them; once
  undrained, the shards' preferred leaders take theirs back (docs/upgrades.md).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dledger_commitlog.cli.cluster_layout import shards_config
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.cli.maintenance import drain_node, undrain_node
from dledger_commitlog.client import (
    AsyncRoutedClient,
    Client,
    ConsumedMessage,
    InvalidArgument,
    NodeStatus,
    RoutedClient,
)
from dledger_commitlog.client.async_consumer import run_together
from dledger_commitlog.common.protocol import shard_metadata
from dledger_commitlog.common.routes import preferred_leader, shard_of_msg_id
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from tests.conftest import SHARED_CONFIG, register, wait_until
from tests.multiraft_helpers import leader_of, servers, shard_leaders, shard_statuses

pytestmark = pytest.mark.slow

SHARDS = 3
COMMAND_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def multi_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = {**SHARED_CONFIG, **shards_config(SHARDS)}
    with LocalCluster(tmp_path_factory.mktemp("multi"), extra_config=config) as cluster:
        cluster.up()
        shard_leaders(cluster, range(SHARDS + 1))
        yield cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest, multi_cluster: LocalCluster) -> LocalCluster:
    register(request.node, multi_cluster)
    return multi_cluster


def routed(cluster: LocalCluster) -> RoutedClient:
    return RoutedClient(servers(cluster), timeout_s=15.0)


def test_routed_puts_land_in_the_topics_shards_and_read_back(cluster: LocalCluster) -> None:
    with routed(cluster) as rc:
        made = rc.topic_update("create", "orders", {2: 2, 3: 3})
        assert made is not None and made.shards == ((2, 2), (3, 3)) and made.configured
        route = rc.route("orders")
        assert route.total_queues == 5
        spread = [rc.put("orders", b"rr-%d" % i) for i in range(10)]
        where = Counter((shard_of_msg_id(r.msg_id), r.queue_id) for r in spread)
        assert where == {route.locate(q): 2 for q in range(5)}  # every queue, in turn
        keyed = [rc.put("orders", b"k-%d" % i, sharding_key="customer-7") for i in range(6)]
        assert len({(shard_of_msg_id(r.msg_id), r.queue_id) for r in keyed}) == 1
        explicit = rc.put("orders", b"q4", queue=4)
        assert (shard_of_msg_id(explicit.msg_id), explicit.queue_id) == (3, 2)
        with pytest.raises(InvalidArgument, match="outside the 5 queues"):
            rc.put("orders", b"q5", queue=5)
        everything = [*spread, *keyed, explicit]
        for r in everything:
            got = rc.get(r.msg_id)
            assert got.msg_id == r.msg_id and got.topic == "orders"
            assert got.queue_id == r.queue_id and got.queue_offset == r.queue_offset
        # Every node serves the reads of every shard (the id names the shard).
        for spec in cluster:
            for r in everything[:: len(everything) // 4]:
                g = shard_of_msg_id(r.msg_id)
                with Client([spec.client], shard=g, timeout_s=10.0) as one:
                    got = wait_until(
                        lambda one=one, msg_id=r.msg_id: one.get(msg_id),  # type: ignore[misc]
                        10.0,
                        f"node {spec.id} to serve {r.msg_id} of shard {g}",
                    )
                    assert got.queue_offset == r.queue_offset
        # Shard 1 holds none of the topic's messages: its queues stay empty.
        with Client(servers(cluster), shard=1) as g1:
            assert all(q.max_offset == 0 for q in g1.queue_offsets("orders"))


def seen(rc: RoutedClient, topic: str, shards: tuple[tuple[int, int], ...]) -> None:
    """After a refresh, `rc` sees `shards` as `topic`'s route. Route is answered from
    the asked node's committed copy of shard 0, which may lag the change just made:
    refreshed until it shows it."""

    def refreshed() -> tuple[tuple[int, int], ...]:
        rc.refresh_routes()
        return rc.route(topic).shards

    wait_until(refreshed, 10.0, f"the route of {topic} to be {shards}", ok=lambda g: g == shards)


def test_a_route_update_is_seen_after_a_refresh_and_refuses_stale_queues(
    cluster: LocalCluster,
) -> None:
    with routed(cluster) as rc, routed(cluster) as stale:
        rc.topic_update("create", "moves", {2: 2, 3: 3})
        assert stale.route("moves").total_queues == 5
        rc.topic_update("update", "moves", {2: 1, 3: 1})
        seen(rc, "moves", ((2, 1), (3, 1)))
        # Shards 2 and 3 no longer have queues 1 and 2 of `moves`: a direct put there is
        # refused, naming the route, once the shard's leader applied the change (each
        # node applies its copy of shard 0 on its own: the stale client's puts below
        # wait for both, or one could land in a queue its shard's leader still has).
        for shard, queue in ((3, 2), (2, 1)):
            with Client(servers(cluster), shard=shard, max_retries=0) as direct:

                def attempt(direct: Client = direct, queue: int = queue) -> str:
                    try:
                        direct.put("moves", b"stale", queue_id=queue)
                    except InvalidArgument as exc:
                        return str(exc)
                    return "accepted"

                why = wait_until(
                    attempt,
                    10.0,
                    f"shard {shard} to refuse queue {queue} of moves",
                    ok=lambda why: why != "accepted",
                )
                assert "outside [0, 1)" in why and "moves" in why, why
        # The routed client with the old route lands in the new one after one refresh.
        for i in range(6):
            r = stale.put("moves", b"s-%d" % i)
            assert (shard_of_msg_id(r.msg_id), r.queue_id) in {(2, 0), (3, 0)}
        assert stale.route("moves").shards == ((2, 1), (3, 1))
        assert rc.topic_update("delete", "moves") is None
        seen(rc, "moves", ((1, 4), (2, 4), (3, 4)))
        assert not rc.route("moves").configured


def test_route_is_answered_by_every_node_and_topic_update_redirects(
    cluster: LocalCluster,
) -> None:
    with routed(cluster) as rc:
        rc.topic_update("create", "everywhere", {1: 1, 3: 4})
        version = rc.routes().version
    leader0 = leader_of(shard_statuses(cluster, 0))
    # Asked linearizable, every node answers at once with the table shard 0's leader
    # confirms (a node behind waits to catch up); an answer says how old it may be: 0
    # from shard 0's leader, since its last word elsewhere. Each asked itself (a
    # client's Route goes to its shard's leader).
    for spec in cluster:
        with grpc.insecure_channel(spec.client) as channel:
            stub = pb_grpc.DLedgerClientStub(channel)

            def route(linearizable: bool, stub: Any = stub) -> pb.RouteResponse:
                request = pb.RouteRequest(topic="everywhere", linearizable=linearizable)
                answer: pb.RouteResponse = stub.Route(request, timeout=5.0)
                return answer

            confirmed = route(True)
            assert confirmed.version >= version and confirmed.age_ms == 0, spec.id
            assert [(q.group, q.queues) for q in confirmed.routes[0].groups] == [(1, 1), (3, 4)]
            age = route(False).age_ms
            if spec.id == leader0:
                assert age == 0
            else:
                assert 0 <= age < 5000, (spec.id, age)
    for spec in cluster:
        with Client([spec.client], max_retries=0) as one:
            routes = wait_until(
                lambda: one.route("everywhere"),
                10.0,
                f"node {spec.id} to hold route version {version}",
                ok=lambda r: r.version >= version,
            )
        assert routes.shard_count == SHARDS
        assert routes.route("everywhere").shards == ((1, 1), (3, 4))
        assert sorted(routes.leaders) == list(range(SHARDS + 1))
    assert leader0 is not None
    follower = next(s for s in cluster if s.id != leader0)
    with grpc.insecure_channel(follower.client) as channel:
        stub = pb_grpc.DLedgerClientStub(channel)
        request = pb.TopicUpdateRequest(
            topic="elsewhere",
            op=pb.TopicUpdateRequest.CREATE,
            groups=[pb.GroupQueues(group=2, queues=1)],
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.TopicUpdate(request, metadata=shard_metadata(0), timeout=5.0)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        trailing = dict(err.value.trailing_metadata() or ())
        assert trailing.get("dledger-leader") == cluster.specs[leader0].client, trailing
    # A client that knows only the follower follows the redirect.
    with Client([follower.client], shard=0) as via_follower:
        made = via_follower.topic_update("create", "elsewhere", {2: 1})
        assert made is not None and made.shards == ((2, 1),)


def dledger(cluster: LocalCluster, *args: str) -> Any:
    """`dledger ARGS --json` as a user runs it; its JSON document (it must succeed)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dledger_commitlog",
            *args,
            "--servers",
            ",".join(servers(cluster)),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_cli_topic_and_shard_commands(cluster: LocalCluster) -> None:
    made = dledger(cluster, "topic", "create", "clitopic", "--queues", "2:1,3:2")
    assert made == {
        "topic": "clitopic",
        "configured": True,
        "shards": [{"shard": 2, "queues": 1}, {"shard": 3, "queues": 2}],
    }
    shown = dledger(cluster, "topic", "route", "clitopic")
    assert shown["shard_count"] == SHARDS
    assert made in shown["routes"]
    assert set(shown["leaders"]) == {str(g) for g in range(SHARDS + 1)}
    status = dledger(cluster, "shard", "status")
    assert set(status["shards"]) == {str(g) for g in range(SHARDS + 1)}
    for g, nodes in status["shards"].items():
        roles = sorted(n["role"] for n in nodes.values())
        assert roles == ["follower", "follower", "leader"], (g, nodes)
    assert sum(status["leads"].values()) == SHARDS + 1
    balanced = dledger(cluster, "groups", "balance")
    assert max(balanced["leads"].values()) <= -(-(SHARDS + 1) // 3)
    assert dledger(cluster, "topic", "delete", "clitopic") == {"deleted": "clitopic"}
    shown = dledger(cluster, "topic", "route", "clitopic")
    assert all(r["configured"] is False for r in shown["routes"] if r["topic"] == "clitopic")


def consume(cluster: LocalCluster, *args: str) -> list[dict[str, Any]]:
    """`dledger consume ARGS --json` as a user runs it (it must succeed): the messages."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dledger_commitlog",
            "consume",
            *args,
            "--servers",
            ",".join(servers(cluster)),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return [json.loads(line) for line in done.stdout.splitlines()]


def spread_topic(cluster: LocalCluster, topic: str, count: int) -> dict[int, set[str]]:
    """`count` messages put round robin to `topic`, routed over shards 1, 2 and 3 (one
    queue each): the message ids of each shard."""
    with routed(cluster) as rc:
        rc.topic_update("create", topic, {1: 1, 2: 1, 3: 1})
        seen(rc, topic, ((1, 1), (2, 1), (3, 1)))
        ids = [rc.put(topic, b"%s-%d" % (topic.encode(), i)).msg_id for i in range(count)]
    by_shard: dict[int, set[str]] = {}
    for msg_id in ids:
        by_shard.setdefault(shard_of_msg_id(msg_id), set()).add(msg_id)
    assert set(by_shard) == {1, 2, 3}, by_shard
    return by_shard


def test_cli_consume_reads_every_shard_and_max_counts_them_all(cluster: LocalCluster) -> None:
    by_shard = spread_topic(cluster, "feed", 12)
    every = set().union(*by_shard.values())
    got = consume(cluster, "--group", "all", "--topic", "feed", "--idle-exit", "3")
    assert sorted(m["msg_id"] for m in got) == sorted(every)
    assert all(m["topic"] == "feed" and m["reconsume_times"] == 0 for m in got)
    # --max: 5 between the three shards' members, never more, each message once.
    five = consume(cluster, "--group", "five", "--topic", "feed", "--max", "5")
    assert len(five) == 5 and len({m["msg_id"] for m in five}) == 5
    assert {m["msg_id"] for m in five} <= every
    # What the three fetched beyond the 5 was never acked: the group's next member
    # gets exactly the rest.
    rest = consume(cluster, "--group", "five", "--topic", "feed", "--idle-exit", "3")
    assert sorted(m["msg_id"] for m in rest) == sorted(every - {m["msg_id"] for m in five})
    # --shard: that shard's queues alone.
    two = consume(cluster, "--group", "two", "--topic", "feed", "--idle-exit", "3", "--shard", "2")
    assert {m["msg_id"] for m in two} == by_shard[2]
    # A group's offsets live in each shard: "all" consumed (and acked) everything.
    again = consume(cluster, "--group", "all", "--topic", "feed", "--idle-exit", "2")
    assert again == []


def test_routed_consumers_run_together_with_one_member_id(cluster: LocalCluster) -> None:
    by_shard = spread_topic(cluster, "feed-api", 9)
    got: list[ConsumedMessage] = []

    async def handle(m: ConsumedMessage) -> None:
        got.append(m)

    async def main() -> tuple[int, set[str]]:
        async with AsyncRoutedClient(servers(cluster), timeout_s=15.0) as arc:
            consumers = await arc.consumers("api", ["feed-api"], handle)
            assert len(consumers) == SHARDS
            handled = await run_together(consumers, max_messages=9, idle_exit_s=10.0)
            return handled, {c.member_id for c in consumers}

    handled, members = asyncio.run(main())
    assert handled == 9 and len(members) == 1
    assert sorted(m.msg_id for m in got) == sorted(set().union(*by_shard.values()))


def test_metrics_carry_the_shard_label(cluster: LocalCluster) -> None:
    spec = cluster.specs[1]
    text = urllib.request.urlopen(f"http://{spec.metrics}/metrics", timeout=5).read().decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    unlabelled = [s for s in samples if 'shard="' not in s.split(" ")[0]]
    assert not unlabelled, unlabelled[:5]
    for name in ("dledger_term", "dledger_commit_index", "dledger_role"):
        shards = {s.split('shard="')[1].split('"')[0] for s in samples if s.startswith(name + "{")}
        assert shards == {str(g) for g in range(SHARDS + 1)}, (name, shards)


def test_a_drained_node_hands_over_every_shard_it_leads(cluster: LocalCluster) -> None:
    shards, node = range(SHARDS + 1), 1
    led = {g for g, n in shard_leaders(cluster, shards).items() if n == node}
    assert led, "node 1 is some shard's preferred leader"

    def clients(shard: int) -> Client:
        return cluster.client(shard=shard)

    try:
        moves = drain_node(clients, node)
        assert [m["shard"] for m in moves] == list(shards)
        assert {m["shard"] for m in moves if m["moved"]} == led
        for g in shards:
            mine = shard_statuses(cluster, g)[node]
            assert isinstance(mine, NodeStatus) and mine.drained and mine.role == "follower"
    finally:
        assert undrain_node(clients, node) == list(shards)
    preferred = {g: preferred_leader(g, [s.id for s in cluster]) for g in shards}
    wait_until(
        lambda: shard_leaders(cluster, shards), 10.0, "the preferred leaders back", preferred.__eq__
    )
