"""Consumer groups on real clusters, through in-process consumers and the raw client
ops: retries on the delay levels through `%RETRY%<group>`, dead letters and their
resend, a stale owner fenced (its ack and its offset commit refused) and its
message delivered to the new owner, SQL92 filters, and the refusals of bad input.

The process-killing scenarios (rebalance bound, ordered consumption across
deaths) are in tests/test_consumer_groups.py. Every wait is a condition with a
deadline; every consumer is stopped at the end of its test, also on failure.
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import grpc
import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client
from dledger_commitlog.client.consumer import ConsumedMessage, Consumer, HandlerResult
from dledger_commitlog.client.errors import GroupRefused, InvalidArgument, NotFound
from dledger_commitlog.client.groups import Delivery, QueueLease, Subscription
from dledger_commitlog.messaging.filters import FilterError, compile_filter
from proto import dledger_pb2 as pb
from tests.conftest import node_stubs, wait_until

pytestmark = pytest.mark.slow

QUEUES: Final = 8
GROUP_CONFIG: Final[dict[str, Any]] = {
    "queues_per_topic": QUEUES,
    "delay_levels": "200ms 400ms 800ms 1s 2s 3s",
}
LEVELS_S: Final = (0.2, 0.4, 0.8, 1.0, 2.0, 3.0)
# the server stamps a retry's due time in whole ms: it may come up to 1 ms early
MS_ROUNDING_S: Final = 0.002
PROGRESS_S: Final = 60.0  # generous: progress on a loaded 2-core machine
LEASES_S: Final = 30.0  # a new leader grants nothing for one session (3 s) after it starts


@dataclass(frozen=True)
class Call:
    """One handler call, as the test's handler saw it."""

    body: str
    reconsume_times: int
    topic: str
    stored_topic: str
    started: float  # time.monotonic()
    ended: float
    ok: bool
    message: ConsumedMessage


class Recorder:
    """A handler that records its calls; `fail(body)` decides which fail."""

    def __init__(self, fail: Callable[[str, int], bool] = lambda body, nth: False) -> None:
        self.fail = fail
        self.calls: list[Call] = []
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, m: ConsumedMessage) -> HandlerResult:
        started = time.monotonic()
        body = m.body.decode()
        with self._lock:
            self._counts[body] += 1
            nth = self._counts[body]
        ok = not self.fail(body, nth)
        with self._lock:
            self.calls.append(
                Call(
                    body,
                    m.reconsume_times,
                    m.topic,
                    m.stored_topic,
                    started,
                    time.monotonic(),
                    ok,
                    m,
                )
            )
        return ok

    def of(self, body: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.body == body]

    def bodies(self) -> set[str]:
        with self._lock:
            return {c.body for c in self.calls}


@contextmanager
def consuming(
    cluster: LocalCluster, group: str, topics: Any, handler: Recorder, **kwargs: Any
) -> Iterator[Consumer]:
    """A started in-process consumer, stopped and joined on the way out."""
    servers = [s.client for s in cluster]
    consumer = Consumer(servers, group, topics, handler, cluster=cluster.cluster, **kwargs)
    consumer.start()
    try:
        yield consumer
    finally:
        consumer.stop()
        consumer.join(60)


# ------------------------------------------------------------------ orderly, slow handler


def test_an_orderly_run_slower_than_its_ack_wait_is_neither_overlapped_nor_repeated(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A run of one queue that outlives its ack wait is delivered again while the
    consumer still works on it: the new run waits for the old one and skips (acks
    again) what it handled, so one key's messages are handled once each, in order,
    one at a time."""
    cluster = make_cluster("slow-orderly", **GROUP_CONFIG)
    group, topic, count = "slow-group", "slow-topic", 16

    def slow(body: str, nth: int) -> bool:
        time.sleep(0.25)  # a fetch hands out a few of the queue: their run takes > 0.5 s
        return False

    handler = Recorder(fail=slow)  # never fails: `slow` only takes its time
    with cluster.client() as client:
        for i in range(count):
            client.put(topic, f"k:{i}", sharding_key="k")
        with consuming(cluster, group, [topic], handler, orderly=True, ack_wait_ms=500):
            wait_until(
                handler.bodies,
                PROGRESS_S,
                f"all {count} handled",
                ok=lambda seen: len(seen) == count,
            )
            # settled: every delivery acked, so nothing can come again
            wait_until(
                lambda: client.group_describe(group).queues,
                PROGRESS_S,
                "the group's queues acked to their ends",
                ok=lambda qs: all(q.lag == 0 and q.in_flight == 0 for q in qs),
            )
    calls = sorted(handler.calls, key=lambda c: c.started)
    assert [int(c.body.split(":")[1]) for c in calls] == list(range(count))
    for before, after in itertools.pairwise(calls):
        assert after.started >= before.ended, f"{after.body} overlapped {before.body}"


# ------------------------------------------------------------------ retries, DLQ


def test_failed_message_comes_back_through_the_retry_topic_on_the_delay_levels(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("retries", **GROUP_CONFIG)
    group, topic = "retry-group", "retry-topic"
    handler = Recorder(fail=lambda body, nth: body == "flaky" and nth <= 2)
    with (
        cluster.client() as client,
        consuming(cluster, group, [topic], handler, first_retry_level=1),
    ):
        for body in ["before", "flaky", "after"]:
            client.put(topic, body)
        wait_until(
            lambda: handler.of("flaky"),
            PROGRESS_S,
            "three calls with 'flaky'",
            ok=lambda calls: len(calls) >= 3,
        )
        wait_until(
            handler.bodies,
            PROGRESS_S,
            "'before' and 'after' handled",
            ok=lambda seen: {"before", "after"} <= seen,
        )
    calls = handler.of("flaky")
    assert [c.reconsume_times for c in calls] == [0, 1, 2]
    assert [c.ok for c in calls] == [False, False, True]
    assert all(c.topic == topic for c in calls), "a retry shows its producer's topic"
    assert [c.stored_topic for c in calls] == [topic] + [f"%RETRY%{group}"] * 2
    for n, (failed, again) in enumerate(itertools.pairwise(calls)):
        waited_s = again.started - failed.ended
        level_s = LEVELS_S[n]  # first_retry_level=1: level 1, then 2
        print(
            f"retry {n + 1}: {waited_s * 1000:.0f} ms after the failure (level {n + 1}: "
            f"{level_s * 1000:.0f} ms)"
        )
        assert waited_s >= level_s - MS_ROUNDING_S, (
            f"retry {n + 1} came {waited_s:.3f} s after the failure, before its delay {level_s} s"
        )
    assert len(handler.of("before")) == len(handler.of("after")) == 1


def group_summary(client: Client, group: str) -> Any:
    return next((s for s in client.group_list() if s.group == group), None)


def test_always_failing_message_lands_in_the_dlq_and_a_resend_delivers_it_again(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("dlq", **GROUP_CONFIG)
    group, topic = "dlq-group", "dlq-topic"
    healed = threading.Event()
    handler = Recorder(fail=lambda body, nth: body == "doomed" and not healed.is_set())
    with (
        cluster.client() as client,
        consuming(cluster, group, [topic], handler, max_reconsume=3, first_retry_level=1),
    ):
        client.put(topic, "doomed")
        client.put(topic, "fine")
        dead = wait_until(
            lambda: client.group_dlq(group).messages,
            PROGRESS_S,
            "a dead letter",
            ok=lambda ms: len(ms) >= 1,
        )
        assert [m.body for m in dead] == [b"doomed"]
        letter = dead[0]
        print(
            f"dead letter at {letter.topic}/{letter.queue_id}@{letter.queue_offset}: "
            f"{dict(letter.properties)}"
        )
        assert letter.topic == f"%DLQ%{group}"
        assert letter.properties.get("RECONSUME_TIMES") == "3"
        calls = handler.of("doomed")
        assert [c.reconsume_times for c in calls] == [0, 1, 2, 3]
        assert not any(c.ok for c in calls)
        summary = wait_until(
            lambda: group_summary(client, group),
            PROGRESS_S,
            "group_list to count the dead letter",
            ok=lambda s: s is not None and s.dead_letters >= 1,
        )
        assert summary.dead_letters == 1
        # the leader's metrics say the same (gauges refreshed every second)
        leader = cluster.specs[cluster.leader_id()]
        wait_until(
            lambda: group_metrics(leader.metrics, group),
            PROGRESS_S,
            "the leader's group gauges",
            ok=lambda g: (
                g.get("dledger_group_dead_letters_messages") == 1.0
                and g.get("dledger_group_retries_messages") == 3.0
                and g.get("dledger_group_members") == 1.0
            ),
        )

        healed.set()
        resent = client.group_dlq(group, resend=[letter.queue_offset])
        assert resent.resent == 1
        again = wait_until(
            lambda: handler.of("doomed"),
            PROGRESS_S,
            "the resent dead letter handled",
            ok=lambda cs: len(cs) > len(calls),
        )
        assert again[-1].ok
        assert again[-1].stored_topic == f"%RETRY%{group}"
        assert len(handler.of("fine")) == 1


def group_metrics(address: str, group: str) -> dict[str, float]:
    """The leader's `dledger_group_*` gauges of `group`, from its /metrics page."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("dledger_group_") and f'group="{group}"' in line:
            name, value = line.split("{")[0], line.rsplit(" ", 1)[1]
            found[name] = float(value)
    return found


# ------------------------------------------------------------------ stale owners


def leases_of(client: Client, group: str, member: str, topic: str) -> list[QueueLease]:
    """Heartbeat as `member`: its leases of `topic` (not of the group's retry topic)."""
    leases = client.group_heartbeat(group, member, [Subscription(topic)]).leases
    return [x for x in leases if x.topic == topic]


def holds_every_queue(client: Client, group: str, member: str, topic: str) -> None:
    """Heartbeat as `member` until it holds every queue of `topic` (a new leader grants
    nothing in its grace period, the first grant waits for the coordinator's tick)."""
    wait_until(
        lambda: leases_of(client, group, member, topic),
        LEASES_S,
        f"member {member} to hold every queue",
        ok=lambda ls: {x.queue_id for x in ls} == set(range(QUEUES)),
        interval_s=0.5,
    )


def test_stale_owner_is_fenced_and_its_message_goes_to_the_new_owner(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("fencing", **GROUP_CONFIG)
    group, topic = "fence-group", "fence-topic"
    every = set(range(QUEUES))
    with cluster.client() as client:
        client.put(topic, "unacked", queue_id=0)
        holds_every_queue(client, group, "A", topic)

        def fetch(member: str) -> tuple[Delivery, ...]:
            return client.group_fetch(group, member, 32, 500).deliveries

        got = wait_until(
            lambda: fetch("A"), PROGRESS_S, "A to fetch the message", ok=lambda ds: len(ds) == 1
        )
        delivery = got[0]
        assert delivery.message.body == b"unacked"
        old_epoch = delivery.epoch
        # A falls silent; B heartbeats until A's session ends and B holds A's queues
        wait_until(
            lambda: leases_of(client, group, "B", topic),
            LEASES_S,
            "member B to hold every queue once A's session ended",
            ok=lambda ls: {x.queue_id for x in ls} == every,
            interval_s=0.5,
        )
        with pytest.raises(GroupRefused):
            client.group_ack(group, "A", [delivery.handle])
        refused = refused_commit(cluster, group, topic, "A", old_epoch)
        print(f"A's commit after its session ended refused: {refused}")
        assert client.fetch_offset(group, topic, 0).get(0, -1) < 1

        def fetch_as_b() -> tuple[Delivery, ...]:
            leases_of(client, group, "B", topic)  # B stays alive
            return fetch("B")

        again = wait_until(
            fetch_as_b,
            PROGRESS_S,
            "B to receive the message A did not ack",
            ok=lambda ds: len(ds) == 1,
            interval_s=0.2,
        )
        assert again[0].message.queue_offset == delivery.message.queue_offset
        assert again[0].message.body == b"unacked"
        assert again[0].epoch > old_epoch
        assert client.group_ack(group, "B", [again[0].handle]) == 1

        # A comes back as a live member: its old epoch still does not commit, while
        # queue 0's owner commits with the epoch it holds now
        def split() -> dict[str, set[int]]:
            held = {m: {x.queue_id for x in leases_of(client, group, m, topic)} for m in "AB"}
            return held if all(held.values()) and set().union(*held.values()) == every else {}

        wait_until(split, LEASES_S, "A and B to split the queues", interval_s=0.5)
        refused = refused_commit(cluster, group, topic, "A", old_epoch)
        print(f"A's commit under its old epoch refused: {refused}")
        queue0 = next(
            q for q in client.group_describe(group).queues if q.topic == topic and q.queue_id == 0
        )
        commit(cluster, group, topic, queue0.owner, queue0.epoch)
        wait_until(
            lambda: client.fetch_offset(group, topic, 0).get(0),
            PROGRESS_S,
            "the owner's commit of queue 0",
            ok=lambda o: o == 1,
        )


def test_a_commit_right_after_a_failover_waits_for_the_members_claims(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A new leader knows no member before they heartbeat again: a plain CommitOffset
    that reaches it first waits out the grace period and is then refused, as the
    group's member came back meanwhile; a group without members takes one as is."""
    cluster = make_cluster("grace-commit", **GROUP_CONFIG)
    group, topic = "grace-group", "grace-topic"
    with cluster.client() as client:
        client.put(topic, "m", queue_id=0)
        holds_every_queue(client, group, "A", topic)
        old = cluster.leader_id()
        target = next(n for n in cluster.specs if n != old)
        assert client.transfer_leadership(target) == target
        outcomes: dict[str, Exception | None] = {}

        def plain_commit(name: str) -> None:
            try:
                client.commit_offset(name, topic, 0, 1)
                outcomes[name] = None
            except Exception as exc:  # recorded, asserted below
                outcomes[name] = exc

        committers = [threading.Thread(target=plain_commit, args=(g,)) for g in (group, "alone")]
        for t in committers:
            t.start()
        # the order of events: the commits reach the new leader first, A heartbeats again
        # a second later, inside its grace period (3 s)
        time.sleep(1.0)
        while any(t.is_alive() for t in committers):
            leases_of(client, group, "A", topic)
            for t in committers:
                t.join(0.3)
        assert isinstance(outcomes[group], GroupRefused), outcomes[group]
        assert client.fetch_offset(group, topic, 0).get(0, -1) < 1
        assert outcomes["alone"] is None, outcomes["alone"]
        assert client.fetch_offset("alone", topic, 0).get(0) == 1


def commit(cluster: LocalCluster, group: str, topic: str, member: str, epoch: int) -> None:
    """CommitOffset of queue 0 to offset 1 as `member` under `epoch`, at the leader (the
    client's `commit_offset` does not send a member or an epoch)."""
    request = pb.CommitOffsetRequest(
        group=group,
        topic=topic,
        queue_id=0,
        offset=1,
        cluster=cluster.cluster,
        member_id=member,
        epoch=epoch,
    )
    with node_stubs(cluster) as stubs:
        stubs[cluster.leader_id()].CommitOffset(request, timeout=5.0)


def refused_commit(cluster: LocalCluster, group: str, topic: str, member: str, epoch: int) -> str:
    """`commit` must be refused with FAILED_PRECONDITION: the refusal's message."""
    with pytest.raises(grpc.RpcError) as refused:
        commit(cluster, group, topic, member, epoch)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
    return str(refused.value.details())


# ------------------------------------------------------------------ filters, bad input

SQL: Final = "a > 5 AND region IN ('eu','us')"


def test_sql_filter_delivers_exactly_the_matching_messages_and_bad_input_is_refused(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("filters", **GROUP_CONFIG)
    group, topic = "sql-group", "sql-topic"
    handler = Recorder()
    expected: set[str] = set()
    with cluster.client() as client:
        # one queue: once the last (matching) message is handled, every earlier one
        # was either delivered or filtered out
        for a in range(11):
            for region in ["eu", "us", "asia"]:
                body = f"a={a},region={region}"
                client.put(topic, body, queue_id=0, properties={"a": str(a), "region": region})
                if a > 5 and region in ("eu", "us"):
                    expected.add(body)
        client.put(topic, "no-properties", queue_id=0)
        client.put(topic, "region-only", queue_id=0, properties={"region": "eu"})
        client.put(topic, "last", queue_id=0, properties={"a": "100", "region": "us"})
        expected.add("last")
        with consuming(cluster, group, [Subscription.sql(topic, SQL)], handler):
            wait_until(
                handler.bodies,
                PROGRESS_S,
                "every matching message handled",
                ok=lambda seen: expected <= seen,
            )
        assert handler.bodies() == expected, f"not matching: {handler.bodies() - expected}"

        bad = "a > 5 AND (region = 'eu'"
        with pytest.raises(FilterError) as local:
            compile_filter("SQL92", bad)
        column = local.value.column
        assert column is not None
        with pytest.raises(InvalidArgument) as refused:
            client.group_heartbeat("bad-sql-group", "m", [Subscription.sql(topic, bad)])
        print(f"bad SQL refused: {refused.value}")
        assert f"column {column}" in str(refused.value), refused.value

        with pytest.raises(NotFound):
            client.group_describe("nope")

        leases = wait_until(
            lambda: leases_of(client, "ack-group", "m", topic),
            LEASES_S,
            "a lease for the ack check",
            interval_s=0.5,
        )
        lease = leases[0]
        with pytest.raises(NotFound):
            client.group_ack("ack-group", "m", [(topic, lease.queue_id, 10_000, lease.epoch)])

        client.group_heartbeat("strategy-group", "s1", [Subscription(topic)], strategy="average")
        with pytest.raises(GroupRefused) as conflict:
            client.group_heartbeat(
                "strategy-group", "s2", [Subscription(topic)], strategy="consistent-hash"
            )
        print(f"second strategy refused: {conflict.value}")
