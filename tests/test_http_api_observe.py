"""What the console shows of messages in flight, over real HTTP against a real cluster.

The trace of a message (`GET /messages/{id}/trace`): one delivered, nacked on delay
level 1, retried and acked shows those events in time order with the member and the
level; one whose retries ran out shows it dead-lettered with its reason and, after
a resend, resent. The members are raw client ops (`tests.console_helpers.
nack_and_retry`), so the test decides every ack and nack.

Delayed messages waiting (`GET /backlog`) are counted per level with the age of the
oldest, and a half message per producer group.

A group behind on a topic shows the age of its oldest unconsumed message (at least
the time since the put, at most the time since just before it) in `GET /groups`,
per queue in `GET /groups/{group}`, and in the samples of its history.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dledger_commitlog.client import Client
from tests.conftest import wait_until
from tests.console_helpers import Http, nack_and_retry

pytestmark = pytest.mark.slow


def kinds(events: list[dict[str, Any]], group: str) -> list[str]:
    return [e["kind"] for e in events if e["group"] in ("", group)]


def test_a_nacked_retried_and_acked_message_traces_in_order(api: Http, client: Client) -> None:
    put = api.put("trace-ok", b"work", "?queue=0").json
    member = nack_and_retry(client, "trace-g1", "trace-ok", then_ack=True)
    got = api.get(f"/messages/{put['msg_id']}/trace")
    assert got.status == 200, got.body
    events = got.json["events"]
    assert kinds(events, "trace-g1") == [
        "stored",
        "delivered",
        "nacked",
        "retry",
        "retry_stored",
        "delivered",
        "acked",
    ]
    stored, first, nack, retry, requeued, again, ack = events
    assert (stored["topic"], stored["queue_offset"]) == ("trace-ok", put["queue_offset"])
    assert stored["time_ms"] == put["store_timestamp_ms"] and stored["time"].endswith("Z")
    assert first["member_id"] == nack["member_id"] == ack["member_id"] == member
    assert first["delivery_count"] == 1 and first["topic"] == "trace-ok"
    assert (nack["outcome"], nack["delay_level"]) == ("retry", 1)
    assert (retry["delay_level"], retry["reconsume_times"]) == (1, 1)
    assert requeued["topic"] == again["topic"] == ack["topic"] == "%RETRY%trace-g1"
    assert requeued["time_ms"] >= retry["due_ms"] >= nack["time_ms"] + 1000
    times = [e["time_ms"] for e in events]
    assert times == sorted(times)
    [group] = got.json["groups"]
    assert group["group"] == "trace-g1" and group["history_complete"] is True
    assert group["consumed"] is True


def test_a_dead_letter_shows_its_reason_and_its_resend(api: Http, client: Client) -> None:
    put = api.put("trace-dlq", b"poison", "?queue=0").json
    nack_and_retry(client, "trace-g2", "trace-dlq", then_ack=False)
    path = f"/messages/{put['msg_id']}/trace"
    events = api.get(path).json["events"]
    assert kinds(events, "trace-g2")[-2:] == ["nacked", "dead_lettered"]
    dead = events[-1]
    assert (dead["reason"], dead["topic"]) == ("retries", "%DLQ%trace-g2")
    assert events[-2]["outcome"] == "dead-letter"
    assert api.get(path).json["groups"][0]["consumed"] is False
    assert api.post_json("/groups/trace-g2/dlq/resend", {}).status == 200
    doc = api.get(path).json
    assert kinds(doc["events"], "trace-g2")[-2:] == ["dead_lettered", "resent"]
    assert doc["events"][-1]["topic"] == "%RETRY%trace-g2"


def test_a_trace_of_a_bad_or_unknown_id_is_refused(api: Http) -> None:
    assert api.get("/messages/nope/trace").error["field"] == "msg_id"
    put = api.put("trace-ok", b"x", "?queue=0").json
    unknown = put["msg_id"][:-8] + "7FFFFFF0"
    got = api.get(f"/messages/{unknown}/trace")
    assert got.status == 404, got.body


def test_the_oldest_unconsumed_age_and_the_group_history(api: Http, client: Client) -> None:
    before_ms = time.time() * 1000
    for i in range(2):
        assert api.put("age-t", f"m{i}".encode(), "?queue=0").status == 200
    put_ms = time.time() * 1000
    client.commit_offset("age-g", "age-t", 0, 0)  # a group that consumed nothing yet

    def row() -> dict[str, Any]:
        rows: list[dict[str, Any]] = api.get("/groups").json["groups"]
        [found] = [r for r in rows if r["group"] == "age-g"]
        return found

    seen = wait_until(row, 10.0, "an age of 0.3 s", lambda r: r["oldest_unconsumed_age_ms"] > 300)
    assert seen["lag"] == 2
    assert before_ms <= seen["oldest_unconsumed_ms"] <= put_ms
    assert seen["oldest_unconsumed_age_ms"] <= time.time() * 1000 - before_ms
    [shard] = api.get("/groups/age-g").json["shards"]
    [queue] = [q for q in shard["queues"] if q["topic"] == "age-t" and q["queue_id"] == 0]
    assert queue["oldest_unconsumed_ms"] == seen["oldest_unconsumed_ms"]
    assert queue["oldest_unconsumed_age_ms"] >= seen["oldest_unconsumed_age_ms"]
    history = wait_until(
        lambda: (row(), api.get("/groups/age-g/history").json["samples"])[1],
        10.0,
        "two samples",
        lambda samples: len(samples) >= 2,
    )
    assert [s["lag"] for s in history] == [2] * len(history)
    ages = [s["oldest_unconsumed_age_ms"] for s in history]
    assert ages == sorted(ages) and ages[-1] > ages[0]
    assert api.get("/groups/no-such-g/history").status == 404


def test_the_backlog_counts_delayed_and_half_messages_and_their_age(
    api: Http, client: Client
) -> None:
    before_ms = time.time() * 1000
    for i in range(2):
        assert api.put("wait-t", f"later{i}".encode(), "?delay_level=5").status == 200
    client.put_half("wait-t", b"undecided", producer_group="wait-pg")
    put_ms = time.time() * 1000

    def waiting() -> tuple[dict[str, Any], dict[str, Any]]:
        doc = api.get("/backlog").json
        [level] = [d for d in doc["delayed"] if d["level"] == 5]
        [half] = [h for h in doc["halves"] if h["producer_group"] == "wait-pg"]
        return level, half

    level, half = wait_until(
        waiting, 10.0, "2 delayed, 1 half", lambda x: (x[0]["messages"], x[1]["messages"]) == (2, 1)
    )
    assert level["delay_ms"] == 60_000 and level["shard"] == 1
    for w in (level, half):
        assert before_ms <= w["oldest_stored_ms"] <= put_ms
        assert 0 <= w["oldest_age_ms"] <= time.time() * 1000 - before_ms
    level, half = wait_until(  # the half was put last: both ages grow past 0.3 s
        waiting, 10.0, "ages of 0.3 s", lambda x: min(w["oldest_age_ms"] for w in x) > 300
    )
    assert (level["messages"], half["messages"]) == (2, 1)
