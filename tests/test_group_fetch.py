"""A group's fetch on one in-process node (a lone voter, its leader-side services and its
client service, called with a stand-in for the gRPC context): the compact answer
(DeliveryRun) decodes to exactly what the per-message answer says, field by field;
a waiting fetch sleeps through acks and other commits and wakes for its queues'
news; an orderly run's last ack wakes it; filters run on the server; a fetch is
bounded in bytes. The consumers over real clusters are tests/test_consumer_groups*.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest

from dledger_commitlog.client.groups import _delivery, run_deliveries
from dledger_commitlog.client.values import stored_message
from dledger_commitlog.log.commitlog import Draft
from dledger_commitlog.messaging import group_fetch
from dledger_commitlog.messaging.group_state import GroupState, Settings
from dledger_commitlog.messaging.groups import GroupService
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.service.client_service import ClientService
from proto import dledger_pb2 as pb
from tests.lone_node import lone_config, lone_leader

QUEUES = 4
ALL = {"T": ("TAG", "*")}


class Context:
    """What a handler uses of its call (service.base.Context), for calls made here."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise AssertionError(f"aborted: {code} {details}")

    def invocation_metadata(self) -> None:
        return None

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    async def send_initial_metadata(self, metadata: object) -> None:
        pass

    async def write(self, message: object) -> None:
        pass

    def time_remaining(self) -> float:
        return 10.0

    def peer(self) -> str:
        return "test"


Body = Callable[[RaftNode, GroupService, ClientService], Awaitable[None]]


def run_node(tmp_path: Path, body: Body, **settings: object) -> None:
    async def main() -> None:
        cfg = lone_config(
            tmp_path, queues_per_topic=QUEUES, group_session_timeout_ms=600, **settings
        )
        async with lone_leader(cfg) as (node, services, metrics):
            service = ClientService(cfg, node, services, metrics=metrics)
            try:
                await body(node, services.groups, service)
            finally:
                await service.close()

    asyncio.run(main())


_PUTS = itertools.count()


async def put(node: RaftNode, topic: str, body: bytes, queue_id: int, **kw: Any) -> None:
    spec = node.prepare(Draft(topic, body, f"u{next(_PUTS)}", queue_id=queue_id, **kw))
    await node.put([spec], 5.0)
    await node.wait_dispatched(node.committed_pos, 5.0)


async def join(groups: GroupService, group: str, subs: Any = None, **settings: Any) -> GroupState:
    """Join `group` as member "m" and wait until it holds its queues (the grace period of
    a new leader and the first tick)."""
    await groups.heartbeat(group, "m", "host", subs or ALL, Settings(**settings), [])
    async with asyncio.timeout(5):
        while True:
            state = await groups.state_of(group)
            assert state is not None
            if state.leases_of("m"):
                return state
            await asyncio.sleep(0.02)
            await groups.heartbeat(group, "m", "host", subs or ALL, Settings(**settings), [])


async def fetch_all(service: ClientService, group: str, runs: bool) -> pb.GroupFetchResponse:
    request = pb.GroupFetchRequest(
        group=group, member_id="m", max_messages=256, wait_ms=1000, runs=runs
    )
    reply: pb.GroupFetchResponse = await service.GroupFetch(request, Context())
    return reply


def test_a_run_decodes_to_what_the_per_message_answer_says_field_by_field(tmp_path: Path) -> None:
    bodies = [bytes(range(256)) * 3 + b"\x00\xff", b"", "grüße ☃".encode(), b"plain"]

    async def body(node: RaftNode, groups: GroupService, service: ClientService) -> None:
        await put(
            node,
            "T",
            bodies[0],
            0,
            keys=["k1", "k2"],
            tags="TagA",
            flag=7,
            properties={"città": "Zürich ☃", "emoji": "🎉", "n": "5"},
        )
        await put(node, "T", bodies[1], 0)
        retried = {"RECONSUME_TIMES": "3", "RETRY_TOPIC": "orig"}
        await put(node, "T", bodies[2], 1, tags="Ü", properties=retried)
        await put(node, "T", bodies[3], 3, keys=["only"])
        for group in ("new", "old"):
            await join(groups, group)
        compact = await fetch_all(service, "new", runs=True)
        legacy = await fetch_all(service, "old", runs=False)
        assert not compact.deliveries and not legacy.runs
        assert len(compact.runs) == 3  # one per queue that had messages
        got = sorted(
            (d for run in compact.runs for d in run_deliveries(run)),
            key=lambda d: d.message.commitlog_offset,
        )
        want = sorted(map(_delivery, legacy.deliveries), key=lambda d: d.message.commitlog_offset)
        assert [d.message.body for d in got] == bodies
        for new, old in zip(got, want, strict=True):
            assert new.message == old.message  # every field of StoredMessage
            by_id = await service.Get(pb.GetRequest(msg_id=new.message.msg_id), Context())
            assert stored_message(by_id.message) == new.message
            assert (new.reconsume_times, new.origin_topic, new.delivery_count) == (
                old.reconsume_times,
                old.origin_topic,
                old.delivery_count,
            )
        assert (got[2].reconsume_times, got[2].origin_topic) == (3, "orig")
        assert got[0].message.properties == {"città": "Zürich ☃", "emoji": "🎉", "n": "5"}
        assert (got[0].message.keys, got[0].message.tags, got[0].message.flag) == (
            ("k1", "k2"),
            "TagA",
            7,
        )

    run_node(tmp_path, body)


def _counting_plans(state: GroupState) -> list[int]:
    plans = [0]
    plan = state.plan_fetch

    def counted(*args: Any, **kw: Any) -> Any:
        plans[0] += 1
        return plan(*args, **kw)

    state.plan_fetch = counted  # type: ignore[method-assign]
    return plans


def test_a_waiting_fetch_sleeps_through_acks_and_other_commits(tmp_path: Path) -> None:
    async def body(node: RaftNode, groups: GroupService, service: ClientService) -> None:
        state = await join(groups, "g")
        await put(node, "T", b"a", 0)
        await put(node, "T", b"b", 1)
        first = await groups.fetch("g", "m", 32, 1.0)
        assert sorted(len(r.messages) for r in first.runs) == [1, 1]
        plans = _counting_plans(state)
        waiting = asyncio.create_task(groups.fetch("g", "m", 32, 5.0))
        await asyncio.sleep(0.3)
        before = plans[0]
        assert before >= 1 and not waiting.done()
        run = first.runs[0]
        await groups.ack("g", "m", [(run.topic, run.queue_id, 0, run.epoch, 1)])
        await put(node, "Other", b"x", 0)  # another topic: a commit and a dispatch
        await asyncio.sleep(0.3)  # and the acked frontier's offset commit meanwhile
        assert plans[0] == before and not waiting.done()
        started = time.monotonic()
        await put(node, "T", b"c", 2)
        news = await asyncio.wait_for(waiting, 2.0)
        assert time.monotonic() - started < 1.0
        assert [(r.queue_id, len(r.messages)) for r in news.runs] == [(2, 1)]
        assert plans[0] == before + 1

    run_node(tmp_path, body)


def test_an_orderly_run_that_ends_wakes_the_fetch_waiting_for_its_queue(tmp_path: Path) -> None:
    async def body(node: RaftNode, groups: GroupService, service: ClientService) -> None:
        await join(groups, "o", orderly=True)
        await put(node, "T", b"1", 0)
        (run,) = (await groups.fetch("o", "m", 32, 1.0)).runs
        waiting = asyncio.create_task(groups.fetch("o", "m", 32, 5.0))
        await put(node, "T", b"2", 0)  # news, but its queue's run is in flight
        await asyncio.sleep(0.3)
        assert not waiting.done()
        started = time.monotonic()
        await groups.ack("o", "m", [(run.topic, run.queue_id, 0, run.epoch, 0)])
        (after,) = (await asyncio.wait_for(waiting, 2.0)).runs
        assert time.monotonic() - started < 1.0
        assert _bodies(after.messages) == [b"2"] and after.counts == [1]

    run_node(tmp_path, body)


def test_an_orderly_dead_letter_is_not_delivered_again_while_it_is_put(tmp_path: Path) -> None:
    """The nack that ends an orderly message's retries puts it to the dead-letter topic;
    its queue stays paused until that put returns, even past the nack's delay, so the
    message is not delivered once more meanwhile (the put made slow here)."""

    async def body(node: RaftNode, groups: GroupService, service: ClientService) -> None:
        await join(groups, "o", orderly=True, max_reconsume=1)
        await put(node, "T", b"poison", 0)
        (run,) = (await groups.fetch("o", "m", 32, 1.0)).runs
        pause_s = groups.levels[0] / 1000
        stored = groups.log.put

        async def slow_put(specs: Any, timeout_s: float) -> Any:
            await asyncio.sleep(pause_s + 0.5)  # a dead-letter put slower than the pause
            return await stored(specs, timeout_s)

        groups.log.put = slow_put  # type: ignore[method-assign]
        handle = (run.topic, run.queue_id, 0, run.epoch)
        nacking = asyncio.create_task(groups.nack("o", "m", handle, 1))
        during = await groups.fetch("o", "m", 32, pause_s + 0.3)  # past the pause's end
        assert not during.runs, "delivered again while its dead letter was being put"
        assert (await nacking).outcome == "dead-letter"
        after = await groups.fetch("o", "m", 32, 0.3)
        assert not after.runs
        (lease,) = [x for ref, x in (await join(groups, "o")).leases.items() if ref == ("T", 0)]
        assert lease.frontier == 1

    run_node(tmp_path, body, delay_levels="200ms 400ms 800ms")


def test_filters_run_on_the_server_and_what_they_drop_counts_as_acked(tmp_path: Path) -> None:
    async def body(node: RaftNode, groups: GroupService, service: ClientService) -> None:
        tags = ["A", "B", "C", None, "A", "B"]
        for i, tag in enumerate(tags):
            await put(node, "T", f"m{i}".encode(), i % 2, tags=tag, properties={"amount": str(i)})
        subs = {"T": ("TAG", "A || C")}
        state = await join(groups, "tags", subs)
        tagged = await groups.fetch("tags", "m", 32, 1.0)
        assert sorted(m for r in tagged.runs for m in _bodies(r.messages)) == [b"m0", b"m2", b"m4"]
        for r in tagged.runs:
            lease = state.leases[(r.topic, r.queue_id)]
            acked_all = [(r.topic, r.queue_id, lease.frontier, r.epoch, lease.cursor)]
            await groups.ack("tags", "m", acked_all)
        assert {(ref, x.frontier) for ref, x in state.leases.items() if ref[0] == "T"} == {
            (("T", 0), 3),
            (("T", 1), 3),
            (("T", 2), 0),
            (("T", 3), 0),
        }
        await join(groups, "sql", {"T": ("SQL92", "amount > 2 AND (TAGS IS NULL OR TAGS <> 'B')")})
        chosen = await groups.fetch("sql", "m", 32, 1.0)
        assert sorted(m for r in chosen.runs for m in _bodies(r.messages)) == [b"m3", b"m4"]

    run_node(tmp_path, body)


def _bodies(messages: list[bytes]) -> list[bytes]:
    return [
        run_deliveries(pb.DeliveryRun(messages=m, delivery_counts=[1]))[0].message.body
        for m in messages
    ]


def test_a_fetch_is_bounded_in_bytes_and_the_rest_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_fetch, "MAX_FETCH_BYTES", 3000)

    async def body(node: RaftNode, groups: GroupService, service: ClientService) -> None:
        state = await join(groups, "g")
        for i in range(12):
            await put(node, "T", bytes([i]) * 900, i % 2)
        seen: list[bytes] = []
        async with asyncio.timeout(10):
            while len(seen) < 12:
                got = await groups.fetch("g", "m", 256, 0.5)
                sizes = [len(m) for r in got.runs for m in r.messages]
                assert 1 <= len(sizes) <= 3 and sum(sizes) <= 3000  # each about 1 KB stored
                for r in got.runs:
                    seen += _bodies(r.messages)
                    lease = state.leases[(r.topic, r.queue_id)]
                    await groups.ack(
                        "g", "m", [(r.topic, r.queue_id, lease.frontier, r.epoch, lease.cursor)]
                    )
        assert sorted(seen) == sorted(bytes([i]) * 900 for i in range(12))

    run_node(tmp_path, body)
