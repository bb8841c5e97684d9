"""The consumer-group admin endpoints over real HTTP, against a real cluster.

A group that consumed a topic (an HTTP member: join, fetch, ack, leave) has its
offsets reset to the earliest, to an offset of one queue and to a time, and the
committed offsets `GET /groups/{group}` shows move; a reset while a member is live
is refused (409) unless forced; its dead letters are read and resent (none here:
resent 0). Bad input is a 400 naming the field, an unknown group a 404, and a POST
a cross-site form could send (no JSON content type, no X-Dledger-Request header)
is refused (415) and moves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from tests.conftest import wait_until
from tests.console_helpers import Http, committed, consume, running_console

pytestmark = pytest.mark.slow

GROUP = "admin-g"
TOPIC = "admin-t"
PUTS = 6


@pytest.fixture(scope="module")
def api(shared_cluster: LocalCluster) -> Iterator[Http]:
    shared_cluster.wait_for_leader(timeout_s=10.0)
    with running_console(shared_cluster) as http:
        for i in range(PUTS):
            assert http.put(TOPIC, f"m{i}".encode(), f"?queue={i % 2}").status == 200
        consume(http, GROUP, TOPIC, PUTS)
        wait_until(
            lambda: sum(committed(http, GROUP, TOPIC).values()),
            20.0,
            "the group's acks committed",
            lambda total: total == PUTS,
        )
        yield http


def reset(api: Http, doc: dict[str, Any], group: str = GROUP) -> Any:
    return api.post_json(f"/groups/{group}/reset-offsets", doc)


def test_a_reset_to_earliest_then_latest_moves_the_committed_offsets(api: Http) -> None:
    got = reset(api, {"topic": TOPIC, "to": "earliest"})
    assert got.status == 200, got.body
    assert got.json["to"] == "earliest"
    assert {r["offset"] for r in got.json["offsets"]} == {0}
    assert {r["queue"] for r in got.json["offsets"]} >= {0, 1}
    assert sum(committed(api, GROUP, TOPIC).values()) == 0
    lag = api.get(f"/groups/{GROUP}").json["shards"]
    assert sum(s["summary"]["lag"] for s in lag) == PUTS
    got = reset(api, {"topic": TOPIC, "to": "latest"})
    assert got.status == 200, got.body
    assert sum(committed(api, GROUP, TOPIC).values()) == PUTS


def test_a_reset_to_an_offset_of_one_queue_and_to_a_time(api: Http) -> None:
    got = reset(api, {"topic": TOPIC, "to": "offset", "offset": 1, "queue": 0})
    assert got.status == 200, got.body
    [row] = got.json["offsets"]
    assert (row["queue"], row["offset"]) == (0, 1)
    assert committed(api, GROUP, TOPIC)[(row["shard"], row["queue_id"])] == 1
    got = reset(api, {"topic": TOPIC, "to": "time", "time_ms": 0})
    assert got.status == 200, got.body
    assert {r["offset"] for r in got.json["offsets"]} == {0}


def test_a_reset_with_a_live_member_is_refused_unless_forced(api: Http) -> None:
    # to latest: the member gets nothing to hold
    assert reset(api, {"topic": TOPIC, "to": "latest"}).status == 200
    member = consume(api, GROUP, TOPIC, 0, leave=False)
    try:
        refused = reset(api, {"topic": TOPIC, "to": "earliest"})
        assert refused.status == 409, refused.body
        assert "force" in refused.error["message"]
        forced = reset(api, {"topic": TOPIC, "to": "latest", "force": True})
        assert forced.status == 200, forced.body
    finally:
        api.request("DELETE", f"/groups/{GROUP}/members/{member}")


def test_dead_letters_are_read_and_resent(api: Http) -> None:
    read = api.get(f"/groups/{GROUP}/dlq?max=10")
    assert read.status == 200, read.body
    assert read.json["shards"] and all(s["messages"] == [] for s in read.json["shards"])
    resent = api.post_json(f"/groups/{GROUP}/dlq/resend", {})
    assert resent.status == 200, resent.body
    assert resent.json["resent"] == 0
    assert all(s["max_offset"] == 0 for s in resent.json["shards"])


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"to": "earliest"}, "topic"),
        ({"topic": "bad topic", "to": "earliest"}, "topic"),
        ({"topic": TOPIC}, "to"),
        ({"topic": TOPIC, "to": "sideways"}, "to"),
        ({"topic": TOPIC, "to": "offset"}, "offset"),
        ({"topic": TOPIC, "to": "time", "time_ms": -1}, "time_ms"),
        ({"topic": TOPIC, "to": "earliest", "offset": 3}, "offset"),
        ({"topic": TOPIC, "to": "earliest", "queue": -1}, "queue"),
        ({"topic": TOPIC, "to": "earliest", "queue": 99}, "queue"),
        ({"topic": TOPIC, "to": "earliest", "force": "yes"}, "force"),
        ({"topic": TOPIC, "to": "earliest", "by": 1}, "by"),
    ],
)
def test_a_bad_reset_is_400_naming_the_field(api: Http, doc: dict[str, Any], field: str) -> None:
    before = committed(api, GROUP, TOPIC)
    got = reset(api, doc)
    assert (got.status, got.error.get("field")) == (400, field), got.body
    assert committed(api, GROUP, TOPIC) == before


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"offsets": [0]}, "shard"),
        ({"shard": 1, "offsets": "0"}, "offsets"),
        ({"shard": 1, "offsets": [-1]}, "offsets"),
        ({"shard": 1, "offsets": [0], "max": 3}, "offsets"),
        ({"shard": 0}, "shard"),
        ({"shard": 99}, "shard"),
        ({"max": 0}, "max"),
        ({"from_offset": "a"}, "from_offset"),
    ],
)
def test_a_bad_resend_is_400_naming_the_field(api: Http, doc: dict[str, Any], field: str) -> None:
    got = api.post_json(f"/groups/{GROUP}/dlq/resend", doc)
    assert (got.status, got.error.get("field")) == (400, field), got.body


def test_bad_input_outside_the_body_is_400_naming_it(api: Http) -> None:
    json_type = {"Content-Type": "application/json"}
    not_json = api.request("POST", f"/groups/{GROUP}/reset-offsets", b"{", json_type)
    assert (not_json.status, not_json.error.get("field")) == (400, "body")
    bad_group = reset(api, {"topic": TOPIC, "to": "earliest"}, group="bad%20group")
    assert (bad_group.status, bad_group.error.get("field")) == (400, "group")
    bad_max = api.get(f"/groups/{GROUP}/dlq?max=1000")
    assert (bad_max.status, bad_max.error.get("field")) == (400, "max")


def test_an_unknown_group_is_404(api: Http) -> None:
    assert reset(api, {"topic": TOPIC, "to": "earliest"}, group="no-such-g").status == 404
    assert api.get("/groups/no-such-g/dlq").status == 404
    assert api.post_json("/groups/no-such-g/dlq/resend", {}).status == 404
    assert api.get("/groups/no-such-g").status == 404  # the reset created nothing


def test_a_cross_site_post_is_refused_and_moves_nothing(api: Http) -> None:
    before = committed(api, GROUP, TOPIC)
    body = b'{"topic": "admin-t", "to": "latest"}'
    path = f"/groups/{GROUP}/reset-offsets"
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        got = api.request("POST", path, body, {"Content-Type": kind})
        assert (got.status, got.error.get("field")) == (415, "content-type"), kind
    resend = api.request(
        "POST", f"/groups/{GROUP}/dlq/resend", b"{}", {"Content-Type": "text/plain"}
    )
    assert resend.status == 415
    assert committed(api, GROUP, TOPIC) == before
    with_header = api.request("POST", path, body, {"X-Dledger-Request": "1"})
    assert with_header.status == 200, with_header.body
