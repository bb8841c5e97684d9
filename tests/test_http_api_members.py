"""Consumer-group members over HTTP, sharing a group with a Python consumer.

Against a real cluster and a real console: an HTTP member (what a curl loop does:
join, long-poll fetch, ack or nack, leave) and a Python `AsyncConsumer` in one
group divide the topic's queues, and every message put is handled (at least once,
none lost), also those the HTTP member fetched and never answered (its ack wait
passes and they come again) and one it nacked (retried through the group's retry
topic). A member holding deliveries leaves at once, and its messages go to the next
member. A member that makes no request for its idle timeout is dropped; a member
is seen only by the credentials that made it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import AsyncConsumer, ConsumedMessage
from dledger_commitlog.console.members import CONCURRENCY
from tests.conftest import wait_until
from tests.console_helpers import Http, running_console

pytestmark = pytest.mark.slow

GROUP = "shared-g"
TOPIC = "shared-t"
MESSAGES = 120


@pytest.fixture(scope="module")
def api(shared_cluster: LocalCluster) -> Iterator[Http]:
    shared_cluster.wait_for_leader(timeout_s=10.0)
    with running_console(shared_cluster) as http:
        yield http


class PythonMember:
    """An AsyncConsumer of GROUP in a thread of its own, recording what it handled."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.handled: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.consumer = AsyncConsumer(
            [s.client for s in cluster], GROUP, [TOPIC], self.handle, ack_wait_ms=3000
        )
        self.thread = threading.Thread(target=lambda: asyncio.run(self.consumer.run()))

    async def handle(self, m: ConsumedMessage) -> None:
        with self.lock:
            self.handled[m.body.decode()] += 1

    def __enter__(self) -> PythonMember:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.stop()
        self.thread.join(30)


def members_of(api: Http, group: str) -> dict[str, Any]:
    reply = api.get(f"/groups/{group}")
    if reply.status != 200:
        return {}
    (shard,) = reply.json["shards"]
    return {m["member_id"]: m for m in shard["members"]}


def test_an_http_member_and_a_python_consumer_share_a_group(
    api: Http, shared_cluster: LocalCluster
) -> None:
    joined = api.post_json(f"/groups/{GROUP}/members", {"topic": TOPIC, "ack_wait_ms": 2000})
    assert joined.status == 201, joined.body
    member = joined.json["member_id"]
    base = f"/groups/{GROUP}/members/{member}"
    http_handled: Counter[str] = Counter()
    with PythonMember(shared_cluster) as python:
        wait_until(
            lambda: members_of(api, GROUP),
            20,
            "both members hold queues of the topic",
            lambda m: (
                len(m) == 2
                and all(any(x["topic"] == TOPIC for x in v["leases"]) for v in m.values())
            ),
        )
        bodies = {f"m-{i}" for i in range(MESSAGES)}
        for body in sorted(bodies):
            assert api.put(TOPIC, body.encode()).status == 200
        dropped: list[str] = []  # fetched, never answered: delivered again after the ack wait
        nacked: list[str] = []
        deadline = time.monotonic() + 60
        while True:
            with python.lock:
                done = set(python.handled) | set(http_handled)
            if done >= bodies:
                break
            assert time.monotonic() < deadline, f"never handled: {sorted(bodies - done)[:10]}"
            got = api.get(f"{base}/messages?max=16&wait_ms=500")
            assert got.status == 200, got.body
            batch = got.json["messages"]
            if not batch:
                continue
            if not dropped:
                dropped = [m["body"] for m in batch]
                continue
            if not nacked:
                first, batch = batch[0], batch[1:]
                reply = api.post_json(f"{base}/nack", {"handles": [first["handle"]]})
                assert reply.status == 200 and reply.json["nacked"] == 1
                nacked.append(first["body"])
            if batch:
                reply = api.post_json(f"{base}/ack", {"handles": [m["handle"] for m in batch]})
                assert reply.status == 200, reply.body
                http_handled.update(m["body"] for m in batch)
        assert http_handled and python.handled, "the queues were not shared"
        assert dropped and nacked
        left = api.request("DELETE", base)
        assert left.status == 200 and left.json["left"] == member
        assert api.get(f"{base}/messages").status == 404
    with python.lock:
        handled = set(python.handled) | set(http_handled)
    assert handled >= bodies


def test_an_answered_handle_is_stale(api: Http) -> None:
    group = "stale-g"
    joined = api.post_json(f"/groups/{group}/members", {"topic": "stale-t"})
    base = f"/groups/{group}/members/{joined.json['member_id']}"
    api.put("stale-t", b"once")
    batch = wait_until(
        lambda: api.get(f"{base}/messages?max=1&wait_ms=1000").json["messages"], 20, "a delivery"
    )
    handles = {"handles": [batch[0]["handle"]]}
    assert api.post_json(f"{base}/ack", handles).status == 200
    again = api.post_json(f"{base}/ack", handles)
    assert again.status == 409 and again.error["code"] == "stale_lease"
    assert api.post_json(f"{base}/ack", {"handles": "x"}).status == 400
    assert api.request("DELETE", base).status == 200


def test_an_idle_member_is_dropped(api: Http) -> None:
    group = "idle-g"
    joined = api.post_json(f"/groups/{group}/members", {"topic": "idle-t", "idle_timeout_ms": 1000})
    assert joined.status == 201
    base = f"/groups/{group}/members/{joined.json['member_id']}"
    wait_until(lambda: members_of(api, group), 10, "the member in its group", bool)
    # the group view does not touch the member: only its own requests keep it alive
    wait_until(lambda: members_of(api, group), 10, "the idle member leaving", lambda m: not m)
    assert api.get(f"{base}/messages").status == 404


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({}, "topic"),
        ({"topic": "bad topic"}, "topic"),
        ({"topic": "t", "ack_wait_ms": "soon"}, "ack_wait_ms"),
        ({"topic": "t", "orderly": "yes"}, "orderly"),
        ({"topic": "t", "tag_expr": "a", "sql": "b > 1"}, "sql"),
    ],
)
def test_a_bad_join_is_a_400(api: Http, doc: dict[str, Any], field: str) -> None:
    reply = api.post_json("/groups/j-g/members", doc)
    assert reply.status == 400 and reply.error["field"] == field, reply.body


def test_a_member_holding_deliveries_leaves_at_once(api: Http) -> None:
    """Deliveries fetched and unanswered, others parked unfetched, and more in the
    consumers' fetches while they stop: the leave answers at once (not after the ack
    wait), and the next member gets every message again."""
    group, topic = "leave-g", "leave-t"
    joined = api.post_json(f"/groups/{group}/members", {"topic": topic, "ack_wait_ms": 60_000})
    base = f"/groups/{group}/members/{joined.json['member_id']}"
    wait_until(lambda: members_of(api, group), 10, "the member in its group", bool)
    bodies = {f"l{i}" for i in range(2 * CONCURRENCY + 8)}  # more than it may hold at once
    for body in sorted(bodies):
        assert api.put(topic, body.encode()).status == 200
    fetched = wait_until(
        lambda: api.get(f"{base}/messages?max=2&wait_ms=1000").json["messages"], 20, "a delivery"
    )
    assert fetched
    began = time.monotonic()
    left = api.request("DELETE", base, timeout_s=10)
    took = time.monotonic() - began
    assert left.status == 200, left.body
    assert took < 3.0, f"the leave took {took:.1f} s"
    again = api.post_json(f"/groups/{group}/members", {"topic": topic})
    base = f"/groups/{group}/members/{again.json['member_id']}"
    got: set[str] = set()

    def fetch() -> set[str]:
        batch = api.get(f"{base}/messages?max=16&wait_ms=500").json["messages"]
        if batch:
            api.post_json(f"{base}/ack", {"handles": [m["handle"] for m in batch]})
        got.update(m["body"] for m in batch)
        return got

    wait_until(fetch, 20, "every message again", lambda s: s >= bodies)
    assert api.request("DELETE", base).status == 200
