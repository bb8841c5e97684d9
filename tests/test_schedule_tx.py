"""Delayed and transactional messages on a real node (in-process, real files, sync flush).

The services are driven pass by pass with a clock of the test's own, so "due"
and "check timeout" are exact; the node's own service instances run beside
them with the real clock but with delays and timeouts of hours, so they never
act during a test.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.log.commitlog import Draft, Overloaded
from dledger_commitlog.messaging.schedule import (
    PROPERTY_DELAY,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_GROUP,
    SCHEDULE_TOPIC,
    ScheduleService,
    schedule,
    scheduled_properties,
)
from dledger_commitlog.messaging.services import LeaderServices
from dledger_commitlog.messaging.system_log import SystemLog, run_passes
from dledger_commitlog.messaging.transactions import (
    HALF_KEY_PREFIX,
    HALF_TOPIC,
    OP_TOPIC,
    CheckRegistry,
    TransactionConflict,
    TransactionService,
    UnknownTransaction,
    half_properties,
)
from dledger_commitlog.node.config import NodeConfig, parse_levels
from dledger_commitlog.node.node import RaftNode
from store.errors import InvalidMessage
from store.message import StoredMessage
from tests.lone_node import lone_config, lone_leader

HOUR_MS = 3_600_000
LEVELS = "1h 2h"


def _config(root: Path) -> NodeConfig:
    return lone_config(
        root, delay_levels=LEVELS, check_timeout_ms=10 * HOUR_MS, check_interval_ms=HOUR_MS
    )


def run_node(tmp_path: Path, body: Callable[[RaftNode, LeaderServices], Awaitable[None]]) -> None:
    async def main() -> None:
        async with lone_leader(_config(tmp_path)) as (node, services, _metrics):
            await body(node, services)

    asyncio.run(main())


class Clock:
    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


async def put(node: RaftNode, topic: str, body: bytes, uniq: str, **kw: Any) -> PutResult:
    spec = node.prepare(Draft(topic, body, uniq, **kw))
    (result,) = await node.put([spec], 5.0)
    await node.wait_dispatched(node.committed_pos, 5.0)
    return result


async def put_delayed(
    node: RaftNode, topic: str, body: bytes, uniq: str, *, level: int = 0, at_ms: int = 0
) -> PutResult:
    placed = schedule(
        topic,
        None,
        uniq,
        delay_level=level,
        deliver_at_ms=at_ms,
        levels=parse_levels(LEVELS),
        max_timer_delay_s=3 * 24 * 3600,
        now_ms=int(time.time() * 1000),
    )
    props = scheduled_properties({"k": "v"}, placed)
    return await put(
        node,
        SCHEDULE_TOPIC,
        body,
        placed.uniq_key,
        queue_id=placed.queue_id,
        properties=props,
        tags="T",
    )


def messages(node: RaftNode, topic: str) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    system_log = SystemLog(node)
    for q in range(node.cfg.queues_per_topic):
        for unit in system_log.units(topic, q, 0, 1000):
            out.append(system_log.message(unit))
    return out


async def settled(node: RaftNode) -> None:
    await node.wait_dispatched(node.committed_pos, 5.0)


# -- delayed messages ------------------------------------------------------------------


def test_a_delayed_message_is_delivered_once_when_due_and_not_before(tmp_path: Path) -> None:
    async def body(node: RaftNode, services: LeaderServices) -> None:
        clock = Clock()
        svc = ScheduleService(services.system_log, parse_levels(LEVELS), clock_ms=clock)
        stored = await put_delayed(node, "orders", b"later", "U1", level=1)
        assert messages(node, "orders") == [], "invisible while it waits"
        clock.now = stored.store_timestamp_ms + HOUR_MS - 1
        assert await svc.pass_once() == 0
        clock.now += 1
        assert await svc.pass_once() == 1
        await settled(node)
        (msg,) = messages(node, "orders")
        assert (msg.body, msg.uniq_key, msg.tags, msg.properties["k"]) == (b"later", "U1", "T", "v")
        assert PROPERTY_REAL_TOPIC not in msg.properties and PROPERTY_DELAY not in msg.properties
        assert msg.store_timestamp_ms >= stored.store_timestamp_ms
        clock.now += 10 * HOUR_MS
        assert await svc.pass_once() == 0
        assert services.system_log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, 0) == 1
        assert len(messages(node, "orders")) == 1

    run_node(tmp_path, body)


def test_a_new_leadership_does_not_deliver_again_what_was_delivered(tmp_path: Path) -> None:
    """The old leader delivered but its progress never committed: the new one checks."""

    async def body(node: RaftNode, services: LeaderServices) -> None:
        clock = Clock()
        stored = await put_delayed(node, "orders", b"x", "U2", level=2)
        old = ScheduleService(services.system_log, parse_levels(LEVELS), clock_ms=clock)
        assert await old.pass_once() == 0  # not due yet: it only loads its state
        clock.now = stored.store_timestamp_ms + 2 * HOUR_MS
        units = services.system_log.units(SCHEDULE_TOPIC, 1, 0, 10)
        assert await old._deliver([services.system_log.message(u) for u in units]) == 1
        await settled(node)
        assert services.system_log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, 1) == 0
        new = ScheduleService(services.system_log, parse_levels(LEVELS), clock_ms=clock)
        assert await new.pass_once() == 0, "found in the key index: not put again"
        await settled(node)
        assert services.system_log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, 1) == 1
        assert len(messages(node, "orders")) == 1

    run_node(tmp_path, body)


def test_deliver_at_times_are_honoured_out_of_store_order(tmp_path: Path) -> None:
    async def body(node: RaftNode, services: LeaderServices) -> None:
        clock = Clock()
        svc = ScheduleService(services.system_log, parse_levels(LEVELS), clock_ms=clock)
        base = (clock.now // 1000) * 1000
        await put_delayed(node, "t", b"late", "A", at_ms=base + 3 * HOUR_MS)
        await put_delayed(node, "t", b"early", "B", at_ms=base + HOUR_MS)
        clock.now = base + HOUR_MS - 1
        assert await svc.pass_once() == 0
        clock.now = base + 2 * HOUR_MS
        assert await svc.pass_once() == 1
        await settled(node)
        assert [m.body for m in messages(node, "t")] == [b"early"]
        assert services.system_log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, 2) == 0, (
            "progress stays before the undelivered one"
        )
        clock.now = base + 3 * HOUR_MS
        assert await svc.pass_once() == 1
        await settled(node)
        assert sorted(m.body for m in messages(node, "t")) == [b"early", b"late"]
        assert services.system_log.group_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, 2) == 2
        assert svc.backlog() == 0

    run_node(tmp_path, body)


@pytest.mark.parametrize(
    ("level", "at", "why"),
    [
        (3, 0, "unknown delay level 3: the levels are 1..2 (1h, 2h)"),
        (1, 5_000, "not both"),
        (0, 999, "is not in the future"),
        (0, 10_000 + 4 * 24 * HOUR_MS, "more than 259200 s ahead"),
    ],
)
def test_bad_delays_are_refused_with_the_reason(level: int, at: int, why: str) -> None:
    with pytest.raises(InvalidMessage, match=re.escape(why)):
        schedule(
            "t",
            None,
            "U",
            delay_level=level,
            deliver_at_ms=at,
            levels=parse_levels(LEVELS),
            max_timer_delay_s=3 * 24 * 3600,
            now_ms=10_000,
        )


def test_levels_parse_and_refuse_nonsense() -> None:
    assert parse_levels("1s 5s 2m 1h 250ms") == (1000, 5000, 120_000, HOUR_MS, 250)
    for bad in ("", "5", "0s", "1w", "-1s"):
        with pytest.raises(ValueError):
            parse_levels(bad)


# -- transactions ----------------------------------------------------------------------


async def put_half(node: RaftNode, topic: str, body: bytes, tx: str) -> PutResult:
    props = half_properties({"k": "v"}, topic, None, "pg")
    return await put(node, HALF_TOPIC, body, HALF_KEY_PREFIX + tx, queue_id=0, properties=props)


def test_a_committed_half_becomes_visible_exactly_once(tmp_path: Path) -> None:
    async def body(node: RaftNode, services: LeaderServices) -> None:
        txs = services.transactions
        half = await put_half(node, "pay", b"debit", "T1")
        assert messages(node, "pay") == [], "a half message is invisible"
        done = await txs.end("T1", half.commitlog_offset, commit=True)
        assert (done.outcome, done.duplicate) == ("commit", False) and done.result is not None
        await settled(node)
        (msg,) = messages(node, "pay")
        assert (msg.body, msg.uniq_key, msg.properties["k"]) == (b"debit", "T1", "v")
        again = await txs.end("T1", half.commitlog_offset, commit=True)
        assert again.duplicate and again.result is not None
        assert again.result.commitlog_offset == done.result.commitlog_offset
        with pytest.raises(TransactionConflict, match="already committed"):
            await txs.end("T1", half.commitlog_offset, commit=False)
        await settled(node)
        assert len(messages(node, "pay")) == 1
        assert len(messages(node, OP_TOPIC)) == 1

    run_node(tmp_path, body)


def test_a_rolled_back_half_never_becomes_visible(tmp_path: Path) -> None:
    async def body(node: RaftNode, services: LeaderServices) -> None:
        txs = services.transactions
        half = await put_half(node, "pay", b"nope", "T2")
        done = await txs.end("T2", half.commitlog_offset, commit=False)
        assert (done.outcome, done.result) == ("rollback", None)
        with pytest.raises(TransactionConflict, match="already rolled back"):
            await txs.end("T2", half.commitlog_offset, commit=True)
        with pytest.raises(UnknownTransaction, match="no half message of transaction 'T9'"):
            await txs.end("T9", half.commitlog_offset, commit=True)
        with pytest.raises(UnknownTransaction):
            await txs.end("T2", half.commitlog_offset + 1, commit=True)
        await settled(node)
        assert messages(node, "pay") == []

    run_node(tmp_path, body)


def test_undecided_halves_are_checked_back_then_rolled_back(tmp_path: Path) -> None:
    async def body(node: RaftNode, services: LeaderServices) -> None:
        clock = Clock()
        registry = CheckRegistry()
        asked = registry.open("pg")
        svc = TransactionService(
            services.system_log,
            registry,
            check_timeout_ms=1000,
            check_interval_ms=1000,
            max_checks=2,
            clock_ms=clock,
        )
        half = await put_half(node, "pay", b"?", "T3")
        decided = await put_half(node, "pay", b"ok", "T4")
        await svc.end("T4", decided.commitlog_offset, commit=True)
        clock.now = half.store_timestamp_ms + 999
        assert await svc.pass_once() == 0 and svc.pending == 1
        clock.now += 1
        assert await svc.pass_once() == 1
        first = asked.get_nowait()
        assert (first.transaction_id, first.half_offset, first.topic, first.check_times) == (
            "T3",
            half.commitlog_offset,
            "pay",
            1,
        )
        assert await svc.pass_once() == 0, "the next check waits an interval"
        clock.now += 1000
        assert await svc.pass_once() == 1 and asked.get_nowait().check_times == 2
        # A new leader (a fresh service) knows the count: the checks are in the log.
        await settled(node)
        fresh = TransactionService(
            services.system_log,
            registry,
            check_timeout_ms=1000,
            check_interval_ms=1000,
            max_checks=2,
            clock_ms=clock,
        )
        clock.now += 1000
        assert await fresh.pass_once() == 1, "the limit: rolled back"
        assert asked.empty()
        with pytest.raises(TransactionConflict, match="rolled back"):
            await fresh.end("T3", half.commitlog_offset, commit=True)
        assert await fresh.pass_once() == 0 and fresh.pending == 0
        await settled(node)
        assert [m.body for m in messages(node, "pay")] == [b"ok"]
        assert services.system_log.group_offset("%SYS%TRANS", HALF_TOPIC, 0) == 2

    run_node(tmp_path, body)


def test_a_commit_whose_op_message_was_lost_is_repaired_not_rolled_back(tmp_path: Path) -> None:
    async def body(node: RaftNode, services: LeaderServices) -> None:
        clock = Clock()
        svc = TransactionService(
            services.system_log,
            CheckRegistry(),
            check_timeout_ms=0,
            check_interval_ms=0,
            max_checks=0,
            clock_ms=clock,
        )
        half = await put_half(node, "pay", b"real", "T5")
        await put(node, "pay", b"real", "T5")  # the commit's first put; its op was lost
        assert await svc.pass_once() == 1
        await settled(node)
        (op,) = messages(node, OP_TOPIC)
        assert b'"outcome": "commit"' in op.body
        with pytest.raises(TransactionConflict):
            await svc.end("T5", half.commitlog_offset, commit=False)
        assert [m.body for m in messages(node, "pay")] == [b"real"]

    run_node(tmp_path, body)


def test_a_pass_refused_as_overloaded_backs_off_without_resettling() -> None:
    """Overloaded means nothing was proposed: the service neither settles again nor
    hammers the node (a pass every poll); it waits a second for the puts to drain."""
    starts: list[float] = []
    settled: list[int] = []

    async def main() -> None:
        second = asyncio.Event()

        async def pass_once() -> None:
            starts.append(time.monotonic())
            if len(starts) == 1:
                raise Overloaded("4096 puts in flight (limit 4096)")
            second.set()

        task = asyncio.ensure_future(
            run_passes("test", 1, pass_once, asyncio.Event(), 0.01, lambda: settled.append(1))
        )
        try:
            async with asyncio.timeout(5.0):
                await second.wait()
        finally:
            task.cancel()

    asyncio.run(main())
    assert starts[1] - starts[0] >= 1.0 and settled == []


def test_a_service_with_nothing_to_do_waits_for_a_commit_not_the_poll() -> None:
    """Not busy, the loop waits for `quiet` (the next commit here), not every poll: an
    idle node's loop does not wake for it. Once something commits, passes resume."""
    passes: list[float] = []

    async def main() -> tuple[int, float]:
        committed, ran = asyncio.Event(), asyncio.Event()
        work = False

        async def pass_once() -> None:
            passes.append(time.monotonic())
            ran.set()

        task = asyncio.ensure_future(
            run_passes(
                "test",
                1,
                pass_once,
                asyncio.Event(),
                0.01,
                lambda: None,
                busy=lambda: work,
                quiet=committed.wait,
            )
        )
        try:
            await asyncio.sleep(0.3)  # 30 polls' worth
            idle_passes = len(passes)
            work = True
            committed.set()
            t = time.monotonic()
            async with asyncio.timeout(5.0):
                await ran.wait()
            return idle_passes, passes[-1] - t
        finally:
            task.cancel()

    idle_passes, resumed_s = asyncio.run(main())
    assert idle_passes == 0
    assert resumed_s < 0.5


def test_the_services_are_busy_only_while_something_waits_for_them(tmp_path: Path) -> None:
    async def body(node: RaftNode, services: LeaderServices) -> None:
        clock = Clock()
        sched = ScheduleService(services.system_log, parse_levels(LEVELS), clock_ms=clock)
        assert sched.busy(), "a new leadership loads its state first"
        await sched.pass_once()
        assert not sched.busy()
        stored = await put_delayed(node, "orders", b"later", "U9", level=1)
        assert sched.busy(), "a stored delayed message waits"
        clock.now = stored.store_timestamp_ms + HOUR_MS
        assert await sched.pass_once() == 1
        await settled(node)
        await sched.pass_once()  # reads its own delivery's progress
        assert not sched.busy()
        tx = services.transactions
        await tx.pass_once()
        assert not tx.busy()
        await put(
            node,
            HALF_TOPIC,
            b"half",
            HALF_KEY_PREFIX + "t9",
            queue_id=0,
            properties=half_properties({}, "orders", None, "pg"),
        )
        assert tx.busy(), "an undecided half waits"

    run_node(tmp_path, body)
