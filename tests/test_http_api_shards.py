"""The HTTP API over a cluster of several shards (docs/scaling.md).

A two-shard cluster and a console: puts spread over the shards (a message id
names its shard, and a get finds it there), a sharding key keeps one queue, a
query by key gathers every shard's matches, the topic's queues are numbered across
its shards in a query by queue and in the topics view (a configured route's too, in
its route's order), the cluster view shows each shard with its leader,
and an HTTP member takes messages of both shards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dledger_commitlog.cli.cluster_layout import shards_config
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import RoutedClient
from tests.conftest import SHARED_CONFIG, wait_until
from tests.console_helpers import Http, running_console
from tests.multiraft_helpers import shard_leaders

pytestmark = pytest.mark.slow

SHARDS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = {**SHARED_CONFIG, **shards_config(SHARDS)}
    with LocalCluster(tmp_path_factory.mktemp("shards"), extra_config=config) as made:
        made.up()
        shard_leaders(made, range(SHARDS + 1))
        yield made


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> Iterator[Http]:
    with running_console(cluster) as http:
        yield http


def test_puts_spread_over_the_shards_and_are_found_again(api: Http) -> None:
    puts = [api.put("spread", f"p{i}".encode(), "?key=same").json for i in range(8)]
    assert {p["shard"] for p in puts} == {1, 2}
    for p in puts:
        got = api.get(f"/messages/{p['msg_id']}").json
        assert got["shard"] == p["shard"] and got["msg_id"] == p["msg_id"]
    found = api.get("/topics/spread/messages?key=same").json["messages"]
    assert sorted(m["body"] for m in found) == sorted(f"p{i}" for i in range(8))
    keyed = {api.put("spread", b"k", "?sharding_key=cust-7").json["shard"] for _ in range(4)}
    assert len(keyed) == 1


def test_the_topics_queues_are_numbered_across_its_shards(api: Http) -> None:
    for i in range(8):
        api.put("numbered", f"n{i}".encode(), f"?queue={i}")
    topic = api.get("/topics/numbered").json
    assert sorted(q["queue"] for q in topic["queues"]) == list(range(8))
    assert {q["shard"] for q in topic["queues"]} == {1, 2}
    for q in topic["queues"]:
        page = api.get(f"/topics/numbered/messages?queue={q['queue']}&offset=0").json
        assert [m["body"] for m in page["messages"]] == [f"n{q['queue']}"]
        assert page["messages"][0]["shard"] == q["shard"]


def test_the_topics_view_numbers_a_configured_route_as_its_route_orders_the_shards(
    api: Http, cluster: LocalCluster
) -> None:
    with RoutedClient.from_cluster_file(cluster.cluster_file) as client:
        route = client.topic_update("create", "configured", {2: 1, 1: 2})
    assert route is not None and route.total_queues == 3
    for queue in range(3):
        assert api.put("configured", f"c{queue}".encode(), f"?queue={queue}").status == 200
    topics = {t["topic"]: t for t in api.get("/topics").json["topics"]}
    queues = topics["configured"]["queues"]
    assert sorted((q["queue"], q["shard"], q["queue_id"]) for q in queues) == [
        (n, *route.locate(n)) for n in range(3)
    ]
    assert topics["configured"]["messages"] == 3


def test_the_cluster_view_shows_every_shard(api: Http) -> None:
    shards = api.get("/cluster").json["shards"]
    assert [s["shard"] for s in shards] == [0, 1, 2]
    assert all(s["leader"] is not None for s in shards)


def test_an_http_member_takes_both_shards_messages(api: Http) -> None:
    joined = api.post_json("/groups/wide/members", {"topic": "wide"})
    assert joined.status == 201, joined.body
    base = f"/groups/wide/members/{joined.json['member_id']}"
    shards = {api.put("wide", f"w{i}".encode()).json["shard"] for i in range(6)}
    assert shards == {1, 2}
    seen: set[str] = set()

    def fetch() -> set[str]:
        batch = api.get(f"{base}/messages?max=16&wait_ms=500").json["messages"]
        if batch:
            api.post_json(f"{base}/ack", {"handles": [m["handle"] for m in batch]})
        seen.update(m["body"] for m in batch)
        return seen

    wait_until(fetch, 30, "all six messages", lambda s: len(s) == 6)
    assert api.request("DELETE", base).status == 200
