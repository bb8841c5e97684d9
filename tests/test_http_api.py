"""The console's JSON API (docs/http-api.md) over real HTTP, against a real cluster.

One three-node cluster and one `dledger console` process serve the module. A put
and a get round-trip (text and binary bodies, the raw bytes), a query by key and by
queue and offset, the views; every bad input of the table is its 4xx naming the
field, and stores nothing (the topic's queue offsets are unchanged after it); an
unknown message, topic, group or member is 404; a cross-site form's content type
is refused; an idempotency key given twice stores one message. The web console's
page carries its strict Content-Security-Policy and serves only its own files; the
event stream sends snapshots of the cluster and topics views (the pages in a
browser: tests/test_console_pages.py), two streams open at once the same snapshots
(one poller: tests/test_console_events.py). The cluster view has each node's disk use
and put latency (its metrics port) and each replica's lag in seconds, which grows
while a follower is paused.
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client
from tests.conftest import MAX_MESSAGE_BYTES, wait_until
from tests.console_helpers import Http

pytestmark = pytest.mark.slow


def stored(client: Client, topic: str) -> list[tuple[int, int]]:
    return sorted((q.queue_id, q.max_offset) for q in client.queue_offsets(topic))


def test_a_put_and_a_get_round_trip(api: Http) -> None:
    reply = api.put("orders", b"hello", "?key=o-1&key=o-2&tag=new&property=region%3Deu")
    assert reply.status == 200, reply.body
    put = reply.json
    assert {"msg_id", "queue_id", "queue_offset", "commitlog_offset", "uniq_key"} <= put.keys()
    assert put["shard"] == 1 and put["duplicate"] is False
    got = api.get(f"/messages/{put['msg_id']}")
    assert got.status == 200
    m = got.json
    assert m["body"] == "hello" and "body_encoding" not in m
    assert m["keys"] == ["o-1", "o-2"] and m["tags"] == "new"
    assert m["properties"] == {"region": "eu"} and m["store_timestamp_ms"] > 0
    assert (m["queue_id"], m["queue_offset"]) == (put["queue_id"], put["queue_offset"])
    assert m["uniq_key"] == put["uniq_key"]


def test_headers_stand_for_the_query_parameters(api: Http) -> None:
    reply = api.put(
        "orders",
        b"by headers",
        **{"X-Dledger-Key": "h-1", "X-Dledger-Tag": "t", "X-Dledger-Property": "a=b"},
    )
    assert reply.status == 200, reply.body
    m = api.get(f"/messages/{reply.json['msg_id']}").json
    assert (m["keys"], m["tags"], m["properties"]) == (["h-1"], "t", {"a": "b"})


def test_a_binary_body_comes_back_as_base64_and_raw(api: Http) -> None:
    body = bytes(range(256)) + os.urandom(64)
    put = api.put("bin", body).json
    m = api.get(f"/messages/{put['msg_id']}").json
    assert m["body_encoding"] == "base64"
    import base64

    assert base64.b64decode(m["body"]) == body
    for path in (f"/messages/{put['msg_id']}?raw=1", f"/messages/{put['msg_id']}/raw"):
        raw = api.get(path)
        assert raw.status == 200 and raw.body == body
        assert raw.headers["content-type"] == "application/octet-stream"


def test_every_response_has_the_strict_headers(api: Http) -> None:
    for reply in (api.get("/cluster"), api.get("/messages/00"), api.get("/nowhere")):
        assert reply.headers["content-security-policy"].startswith("default-src 'none'")
        assert reply.headers["x-content-type-options"] == "nosniff"


def test_query_by_key_and_by_queue_and_offset(api: Http) -> None:
    puts = [api.put("search", f"s{i}".encode(), "?key=k-7&queue=1").json for i in range(3)]
    api.put("search", b"other", "?key=k-8&queue=1")
    found = api.get("/topics/search/messages?key=k-7").json["messages"]
    assert sorted(m["body"] for m in found) == ["s0", "s1", "s2"]
    first = puts[0]["queue_offset"]
    page = api.get(f"/topics/search/messages?queue=1&offset={first}&count=2").json
    assert [m["body"] for m in page["messages"]] == ["s0", "s1"]
    assert page["next_offset"] == first + 2 and page["max_offset"] == first + 4
    empty = api.get("/topics/search/messages?key=k-7&end_ms=1").json
    assert empty["messages"] == []


def test_an_idempotency_key_stores_one_message(api: Http, client: Client) -> None:
    first = api.put("idem", b"once", **{"Idempotency-Key": "order-42-v1"})
    before = stored(client, "idem")
    again = api.put("idem", b"once", **{"Idempotency-Key": "order-42-v1"})
    assert first.status == again.status == 200
    assert again.json["duplicate"] is True and again.json["msg_id"] == first.json["msg_id"]
    assert stored(client, "idem") == before


BAD_PUTS = [
    # (topic, query, body, headers, field)
    ("bad%20topic", "", b"x", {}, "topic"),
    ("a" * 300, "", b"x", {}, "topic"),
    ("badin", "?key=a%20b", b"x", {}, "key"),
    ("badin", "?key=%FF%FE", b"x", {}, "key"),
    ("badin", "?key=", b"x", {}, "key"),
    ("badin", "?tag=%C3", b"x", {}, "tag"),
    ("badin", "?delay_level=soon", b"x", {}, "delay_level"),
    ("badin", "?delay_level=-1", b"x", {}, "delay_level"),
    ("badin", "?queue=1x", b"x", {}, "queue"),
    ("badin", "?queue=0&sharding_key=k", b"x", {}, "queue"),
    ("badin", "?property=noequals", b"x", {}, "property"),
    ("badin", "?delay=3", b"x", {}, "delay"),
    ("badin", "", b"x" * (MAX_MESSAGE_BYTES + 1), {}, "body"),
    ("badin", "", b"x", {"Idempotency-Key": "has space"}, "uniq_key"),
    ("badin", "", b"x", {"X-Dledger-Key": "\udcff"}, "key"),
]


@pytest.mark.parametrize(("topic", "query", "body", "headers", "field"), BAD_PUTS)
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(
    api: Http,
    client: Client,
    topic: str,
    query: str,
    body: bytes,
    headers: dict[str, str],
    field: str,
) -> None:
    api.put("badin", b"seed")
    before = stored(client, "badin")
    sent = {k: v.encode("utf-8", "surrogateescape").decode("latin-1") for k, v in headers.items()}
    reply = api.put(topic, body, query, **sent)
    assert reply.status == 400, reply.body
    assert reply.error["code"] == "invalid_argument" and reply.error["field"] == field
    assert reply.error["message"]
    assert stored(client, "badin") == before


def test_a_cross_site_form_cannot_put(api: Http, client: Client) -> None:
    api.put("csrf", b"seed")
    before = stored(client, "csrf")
    for kind in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data"):
        reply = api.request("POST", "/topics/csrf/messages", b"a=b", {"Content-Type": kind})
        assert reply.status == 415 and reply.error["field"] == "content-type"
    assert stored(client, "csrf") == before
    marked = api.request("POST", "/topics/csrf/messages", b"ok", {"X-Dledger-Request": "1"})
    assert marked.status == 200


@pytest.mark.parametrize(
    ("path", "status", "field"),
    [
        ("/messages/not-an-id", 400, "msg_id"),
        ("/messages/7F00000100007206FFFFFFFF00000060", 404, None),
        ("/topics/never-put-here", 404, None),
        ("/topics/orders/messages?queue=99999&offset=0", 400, "queue"),
        ("/topics/orders/messages?queue=0&offset=x", 400, "offset"),
        ("/topics/orders/messages", 400, "key"),
        ("/groups/no-such-group", 404, None),
        ("/groups/g/members/nobody/messages", 404, None),
        ("/nowhere", 404, None),
    ],
)
def test_unknown_and_malformed_reads(api: Http, path: str, status: int, field: str | None) -> None:
    reply = api.get(path)
    assert reply.status == status, reply.body
    assert reply.error.get("field") == field


def test_a_wrong_method_is_405_with_allow(api: Http) -> None:
    reply = api.request("DELETE", "/topics/orders/messages")
    assert reply.status == 405 and "POST" in reply.headers["allow"]


def test_the_views(api: Http, shared_cluster: LocalCluster) -> None:
    api.put("viewed", b"v", "?queue=2")
    cluster = api.get("/cluster").json
    (shard,) = cluster["shards"]
    assert shard["shard"] == 1 and shard["leader"] == shared_cluster.leader_id()
    assert len(shard["nodes"]) == 3 and {n["role"] for n in shard["nodes"]} >= {"leader"}
    assert all(n["committed_index"] >= 1 for n in shard["nodes"])
    assert set(shard["replicas"]) == {"1", "2", "3"}
    assert cluster["acl"] is False and cluster["tls"] is False
    topics = {t["topic"]: t for t in api.get("/topics").json["topics"]}
    assert topics["viewed"]["messages"] >= 1
    one = api.get("/topics/viewed").json
    queue = next(q for q in one["queues"] if q["queue_id"] == 2)
    assert queue["max_offset"] - queue["min_offset"] == queue["messages"] >= 1


def root_of(api: Http) -> str:
    return api.base.removesuffix("/api/v1") + "/"


def test_the_page_and_its_files_carry_a_strict_policy(api: Http) -> None:
    root = Http(root_of(api).rstrip("/"))
    index = root.get("/")
    assert index.status == 200 and index.headers["content-type"].startswith("text/html")
    policy = index.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "default-src 'none'" in policy
    assert b'<script type="module" src="/static/app.js"></script>' in index.body
    script = root.get("/static/app.js")
    assert script.status == 200 and script.headers["content-type"].startswith("text/javascript")
    for path in ("/static/nope.js", "/static/../api.py", "/static/index.html"):
        assert root.get(path).status == 404, path
    reply = api.get("/cluster")
    assert reply.headers["content-security-policy"].startswith("default-src 'none'")


class EventStream:
    """An open `GET /events` stream, read a snapshot at a time."""

    def __init__(self, api: Http) -> None:
        self.conn = http.client.HTTPConnection(api.host, api.port, timeout=10)
        self.conn.request("GET", api.prefix + "/events")
        self.reply = self.conn.getresponse()
        assert self.reply.status == 200
        assert self.reply.getheader("content-type") == "text/event-stream"

    def snapshot(self) -> dict[str, Any]:
        event = ""
        while True:
            line = self.reply.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "snapshot":
                doc: dict[str, Any] = json.loads(line.removeprefix("data: "))
                return doc

    def close(self) -> None:
        self.conn.close()


def read_snapshot(api: Http) -> dict[str, Any]:
    stream = EventStream(api)
    try:
        return stream.snapshot()
    finally:
        stream.close()


def test_events_stream_snapshots_of_the_cluster_and_topics(api: Http) -> None:
    assert api.put("pages-events", b"one").status == 200
    doc = read_snapshot(api)
    assert doc["errors"] == [] and doc["time_ms"] > 0
    assert 1 in {s["shard"] for s in doc["cluster"]["shards"]}
    assert doc["cluster"]["tls"] is False and doc["cluster"]["acl"] is False
    assert "pages-events" in {t["topic"] for t in doc["topics"]}


def test_the_cluster_view_has_disk_use_put_latency_and_lag_in_seconds(
    api: Http, shared_cluster: LocalCluster
) -> None:
    """Disk and put latency from the nodes' metrics ports (the puts of the window
    between two scrapes), the replicas' lag in seconds (0: caught up; a lagging one:
    tests/test_console_figures.py and the browser's killed leader)."""
    leader = shared_cluster.leader_id()
    api.get("/cluster")  # a first scrape: the puts below fall in the next one's window
    for i in range(5):
        assert api.put("figures", f"f{i}".encode()).status == 200

    def of_leader() -> dict[str, Any]:
        rows = api.get("/cluster").json["node_metrics"]
        return next(r for r in rows if r["node_id"] == leader)

    got = wait_until(of_leader, 10, "the leader's put latency", lambda r: r["puts"] >= 5)
    assert 0 < got["put_p50_ms"] <= got["put_p99_ms"] and got["window_s"] > 0
    cluster = api.get("/cluster").json
    rows = cluster["node_metrics"]
    assert sorted(r["node_id"] for r in rows) == sorted(shared_cluster.specs)
    assert all(0 < r["disk_usage_ratio"] < 1 and "error" not in r for r in rows), rows
    assert {r["metrics"] for r in rows} == {s.metrics for s in shared_cluster}

    def lags() -> list[Any]:
        shard = api.get("/cluster").json["shards"][0]
        cells = [c["lag_seconds"] for c in shard["replicas"].values()]
        return cells + [m["lag_seconds"] for m in shard["members"]]

    wait_until(lags, 10, "every replica caught up", lambda s: s == [0.0] * 6)


def test_two_streams_get_the_same_snapshots(api: Http) -> None:
    """One poller for both: they see the same snapshots (the same `time_ms`), where two
    pollers would each read the cluster at times of their own."""
    first, second = EventStream(api), EventStream(api)
    try:
        seen = [(first.snapshot()["time_ms"], second.snapshot()["time_ms"]) for _ in range(2)]
    finally:
        first.close()
        second.close()
    firsts, seconds = {a for a, _ in seen}, {b for _, b in seen}
    assert firsts & seconds, seen
