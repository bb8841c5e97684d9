"""Delayed and transactional messages on a real 3-node cluster, through the clients,
the CLI and a leader kill (docs/delayed-and-transactional.md).

Store timestamps come from the leaders' clocks, all this host's: "never early" is
checked exactly (no skew on one host), with 5 ms for the millisecond rounding.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import (
    AsyncClient,
    Client,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    StoredMessage,
    TransactionConflict,
    load_credentials,
)
from dledger_commitlog.client.tx_producer import (
    AsyncTransactionProducer,
    TransactionCheck,
    TransactionProducer,
)
from dledger_commitlog.common.signing import sign
from dledger_commitlog.node.acl import Account, Perm, write_acl
from proto import dledger_pb2 as pb

from .conftest import node_stubs, wait_until

pytestmark = pytest.mark.slow
SETTINGS: dict[str, Any] = {
    "delay_levels": "1s 2s",
    "check_timeout_ms": 800,
    "check_interval_ms": 800,
    "max_checks": 2,
    "queues_per_topic": 2,
}
QUEUES = 2


@pytest.fixture
def cl(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster("dtx", **SETTINGS)


def everything(client: Client, topic: str) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    for q in range(QUEUES):
        offset = 0
        while True:
            got = client.pull(topic, q, offset, max_messages=256)
            out.extend(got.messages)
            if not got.messages:
                break
            offset = got.next_offset
    return out


def by_uniq(msgs: list[StoredMessage]) -> dict[str, list[StoredMessage]]:
    out: dict[str, list[StoredMessage]] = {}
    for m in msgs:
        out.setdefault(m.uniq_key, []).append(m)
    return out


def test_delayed_messages_arrive_once_and_never_early(cl: LocalCluster) -> None:
    with cl.client() as c:
        stored = c.put(
            "later",
            b"one second",
            delay_level=1,
            uniq_key="L1",
            queue_id=1,
            tags="T",
            keys=["k1"],
            properties={"p": "v"},
        )
        at = (int(time.time() * 1000) // 1000 + 2) * 1000
        c.put("later", b"at a time", deliver_at_ms=at, uniq_key="L2")
        assert everything(c, "later") == [], "nothing is visible before its time"
        got = wait_until(
            lambda: by_uniq(everything(c, "later")),
            15.0,
            "both delivered",
            ok=lambda d: set(d) == {"L1", "L2"},
        )
        (first,) = got["L1"]
        (second,) = got["L2"]
        assert first.store_timestamp_ms >= stored.store_timestamp_ms + 1000 - 5
        assert second.store_timestamp_ms >= at - 5
        assert (first.queue_id, first.tags, first.keys, first.body) == (
            1,
            "T",
            ("k1",),
            b"one second",
        )
        assert first.properties == {"p": "v"}, "the schedule's properties are gone"
        # A retry of the delayed put is the same put: it is not delivered twice.
        again = c.put("later", b"one second", delay_level=1, uniq_key="L1", queue_id=1)
        assert again.duplicate and again.commitlog_offset == stored.commitlog_offset
        # A level delivers in the order its messages were put: once a marker put after
        # the retry is delivered, a second delivery of L1 would have come before it.
        c.put("later", b"marker", delay_level=1, uniq_key="M")
        got = wait_until(
            lambda: by_uniq(everything(c, "later")), 15.0, "the marker", ok=lambda d: "M" in d
        )
        assert {k: len(v) for k, v in got.items()} == {"L1": 1, "L2": 1, "M": 1}


def test_bad_delays_are_refused_with_the_reason(cl: LocalCluster) -> None:
    with cl.client() as c:
        with pytest.raises(InvalidArgument, match=r"unknown delay level 3: the levels are 1\.\.2"):
            c.put("t", b"x", delay_level=3)
        with pytest.raises(InvalidArgument, match="not in the future"):
            c.put("t", b"x", deliver_at_ms=int(time.time() * 1000) - 10)
        with pytest.raises(InvalidArgument, match="259200 s ahead"):
            c.put("t", b"x", deliver_at_ms=int(time.time() * 1000) + 4 * 86_400_000)
        with pytest.raises(InvalidArgument, match="reserved for delayed"):
            c.put("t", b"x", delay_level=1, properties={"REAL_TOPIC": "other"})
        with pytest.raises(InvalidArgument, match="delay_level must be"):
            c.put("t", b"x", delay_level=-1)


def test_a_transaction_commits_once_and_a_rollback_is_never_seen(cl: LocalCluster) -> None:
    with cl.client() as c:
        half = c.put_half("pay", b"debit", producer_group="pg", uniq_key="T1", queue_id=0)
        assert half.transaction_id == "T1"
        assert everything(c, "pay") == []
        done = c.end_transaction(half, commit=True)
        assert done.committed and not done.duplicate and done.result is not None
        again = c.end_transaction("T1", half.half_offset, commit=True)
        assert again.duplicate and again.result is not None
        assert again.result.commitlog_offset == done.result.commitlog_offset
        with pytest.raises(TransactionConflict, match="already committed"):
            c.end_transaction(half, commit=False)
        nope = c.put_half("pay", b"refund", producer_group="pg", uniq_key="T2")
        assert not c.end_transaction(nope, commit=False).committed
        with pytest.raises(TransactionConflict, match="already rolled back"):
            c.end_transaction(nope, commit=True)
        with pytest.raises(NotFound, match="no half message of transaction 'T3'"):
            c.end_transaction("T3", half.half_offset, commit=True)
        with pytest.raises(InvalidArgument, match="producer group"):
            c.put_half("pay", b"x", producer_group="")
        msgs = wait_until(lambda: everything(c, "pay"), 5.0, "the commit", ok=bool)
        assert [(m.uniq_key, m.body) for m in msgs] == [("T1", b"debit")]


def decided(client: Client) -> dict[str, str]:
    """Transaction id -> outcome, from the op messages (a system topic: read, no ACL here)."""
    out: dict[str, str] = {}
    offset = 0
    while True:
        got = client.pull("%SYS%TRANS_OP", 0, offset, max_messages=256)
        for m in got.messages:
            doc = json.loads(m.body)
            if "outcome" in doc:
                out[doc["tx"]] = doc["outcome"]
        if not got.messages:
            return out
        offset = got.next_offset


def test_undecided_transactions_are_checked_back_or_rolled_back(cl: LocalCluster) -> None:
    decisions = {"A": True, "B": False}
    asked: list[TransactionCheck] = []

    def check(request: TransactionCheck) -> bool | None:
        asked.append(request)
        return decisions.get(request.transaction_id)

    with cl.client() as c:
        lonely = c.put_half("pay", b"c", producer_group="nobody", uniq_key="C")
        with TransactionProducer(c, "pg", check):
            a = c.put_half("pay", b"a", producer_group="pg", uniq_key="A")
            c.put_half("pay", b"b", producer_group="pg", uniq_key="B")
            wait_until(
                lambda: decided(c),
                15.0,
                "A and B decided by their checks",
                ok=lambda d: {"A", "B"} <= set(d),
            )
        assert decided(c)["A"] == "commit" and decided(c)["B"] == "rollback"
        first = next(r for r in asked if r.transaction_id == "A")
        assert (first.message.topic, first.message.body, first.message.uniq_key) == (
            "pay",
            b"a",
            "A",
        )
        assert first.check_times == 1
        # No producer of its group: checked max_checks times, then rolled back.
        wait_until(
            lambda: decided(c),
            20.0,
            "C rolled back at the check limit",
            ok=lambda d: d.get("C") == "rollback",
        )
        with pytest.raises(TransactionConflict, match="already rolled back"):
            c.end_transaction(lonely, commit=True)
        assert c.end_transaction(a, commit=True).duplicate
        assert sorted(m.uniq_key for m in everything(c, "pay")) == ["A"]


def test_delivery_and_commits_across_a_leader_kill_are_exactly_once(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Delayed messages fall due and transactions end while the leader is killed."""
    cl = make_cluster("dtx-chaos", **{**SETTINGS, "check_timeout_ms": 120_000})
    n = 40
    with cl.client() as c:
        now = int(time.time() * 1000)
        due: dict[str, int] = {}
        for i in range(n):
            if i % 2:
                r = c.put("chaos", b"d%d" % i, delay_level=1 + i % 2, uniq_key=f"D{i}")
                due[f"D{i}"] = r.store_timestamp_ms + 1000 * (1 + i % 2)
            else:
                at = ((now + 1500 + 50 * i) // 1000 + 1) * 1000
                c.put("chaos", b"d%d" % i, deliver_at_ms=at, uniq_key=f"D{i}")
                due[f"D{i}"] = at
        halves = [
            c.put_half("chaos", b"t%d" % i, producer_group="pg", uniq_key=f"T{i}") for i in range(n)
        ]
    victim = cl.wait_for_leader()
    errors: list[BaseException] = []
    ended: list[int] = []
    stop = threading.Event()  # the test failed: the ender gives up

    def end_all() -> None:
        deadline = time.monotonic() + 90.0
        try:
            with cl.client() as c2:
                for k, half in enumerate(halves):
                    time.sleep(0.05)  # pace the ends: they span the kill (about 2 s)
                    while True:  # OutcomeUnknown: retry, ending twice the same way is a no-op
                        if stop.is_set() or time.monotonic() > deadline:
                            raise TimeoutError(f"transaction {k} not ended")
                        try:
                            c2.end_transaction(half, commit=k % 3 != 0)
                            break
                        except OutcomeUnknown:
                            continue
                    ended.append(k)
        except BaseException as exc:
            errors.append(exc)

    ender = threading.Thread(target=end_all, daemon=True)
    ender.start()
    try:
        wait_until(lambda: len(ended), 10.0, "the first ends", ok=lambda count: count >= 5)
        cl.kill(victim)
        assert cl.wait_for_leader(exclude=victim, timeout_s=10.0) != victim
        assert len(ended) < n, "the kill fell in the middle of the ends"
        ender.join(timeout=90)
        assert not ender.is_alive() and errors == []
    finally:
        stop.set()
        ender.join(timeout=10)
    cl.start(victim)
    with cl.client() as c:
        got = wait_until(
            lambda: by_uniq(everything(c, "chaos")),
            30.0,
            "every delivery",
            ok=lambda d: set(due) <= set(d),
        )
    committed = {f"T{k}" for k in range(n) if k % 3 != 0}
    assert set(got) == set(due) | committed, "no rolled-back or undecided message is visible"
    assert all(len(v) == 1 for v in got.values()), "each exactly once"
    for key, at in due.items():
        assert got[key][0].store_timestamp_ms >= at - 5, f"{key} delivered early"


def test_the_cli_puts_delayed_and_ends_transactions(
    cl: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    servers = ["--servers", ",".join(s.client for s in cl), "--json"]

    def run(*argv: str) -> tuple[int, Any, str]:
        try:
            code = cli.main([*argv, *servers])
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, json.loads(out) if code == 0 else None, err

    code, doc, _ = run("put", "--topic", "cli", "--body", "soon", "--delay-level", "1")
    assert code == 0 and doc["commitlog_offset"] > 0
    code, _, err = run("put", "--topic", "cli", "--body", "x", "--deliver-at", "2001-01-01T00:00")
    assert code == 2 and "has no time zone" in err
    code, _, err = run("put", "--topic", "cli", "--body", "x", "--deliver-at", "2001-01-01T00:00Z")
    assert code == 1 and "not in the future" in err
    code, half, _ = run("tx", "put-half", "--topic", "cli", "--body", "tx", "--group", "g")
    assert code == 0 and half["transaction_id"]
    code, doc, _ = run("tx", "commit", half["transaction_id"], str(half["half_offset"]))
    assert code == 0 and doc["outcome"] == "committed" and not doc["duplicate"]
    code, _, err = run("tx", "rollback", half["transaction_id"], str(half["half_offset"]))
    assert code == 1 and "already committed" in err
    with cl.client() as c:
        got = wait_until(
            lambda: by_uniq(everything(c, "cli")), 10.0, "both visible", ok=lambda d: len(d) == 2
        )
    assert sorted(m.body for v in got.values() for m in v) == [b"soon", b"tx"]


def test_the_acl_guards_delayed_and_transactional_puts(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """PUB on the real topic is what a delayed put, a half and its end need; a follower
    forwards PutHalf and EndTransaction on the caller's behalf."""
    cluster = make_cluster("dtx-acl", acl=True, start=False, **SETTINGS)
    cluster._write_layout()  # the admin account, then ours beside it
    admin = load_credentials(cluster.directory / "admin.credentials")
    write_acl(
        cluster.directory / "acl.toml",
        [
            Account(admin[0], admin[1], admin=True),
            Account("app", "app-secret-0123456789", topic_perms={"pay": Perm.PUB}),
        ],
    )
    cluster.up()
    leader = cluster.wait_for_leader()
    follower = next(s.client for s in cluster if s.id != leader)
    creds = ("app", "app-secret-0123456789")
    with Client([follower], cluster=cluster.cluster, credentials=creds) as app:
        with pytest.raises(PermissionDenied):
            app.put("other", b"x", delay_level=1)
        with pytest.raises(PermissionDenied):
            app.put_half("other", b"x", producer_group="pg")
        half = app.put_half("pay", b"ok", producer_group="pg")
        assert app.end_transaction(half, commit=True).committed
    with Client([s.client for s in cluster], cluster=cluster.cluster, credentials=admin) as root:
        other = root.put_half("other", b"y", producer_group="pg")
        got = wait_until(lambda: everything(root, "pay"), 5.0, "the commit", ok=bool)
        assert [m.body for m in got] == [b"ok"]
    with Client([follower], cluster=cluster.cluster, credentials=creds) as app:
        with pytest.raises(PermissionDenied):
            app.end_transaction(other, commit=True)
        with pytest.raises(PermissionDenied):
            app.pull("%SYS%TRANS_HALF", 0, 0)
    # Nor as a check's answer: the checks stream never asked app about it (no right on
    # its topic), so app's forged COMMIT is ignored and the checks roll it back.
    Answer = pb.TransactionCheckAnswer
    forged = [
        Answer(producer_group="pg"),
        Answer(
            transaction_id=other.transaction_id, half_offset=other.half_offset, action=Answer.COMMIT
        ),
    ]
    with node_stubs(cluster) as stubs:
        call = stubs[leader].TransactionChecks(
            iter(forged), timeout=3, metadata=sign(*creds, "TransactionChecks")
        )
        with contextlib.suppress(grpc.RpcError):  # the stream ends with the answers
            list(call)
    with Client([s.client for s in cluster], cluster=cluster.cluster, credentials=admin) as root:
        outcome = wait_until(
            lambda: decided(root).get(other.transaction_id),
            20.0,
            "the half on 'other' decided",
            ok=bool,
        )
        assert outcome == "rollback"
        assert everything(root, "other") == []


def test_an_async_producer_answers_checks_too(cl: LocalCluster) -> None:
    async def check(request: TransactionCheck) -> bool | None:
        return request.transaction_id == "AS1"

    def both_decided() -> dict[str, str]:
        with cl.client() as c:
            return wait_until(
                lambda: decided(c),
                20.0,
                "both decided by their checks",
                ok=lambda d: {"AS1", "AS2"} <= set(d),
            )

    async def main() -> dict[str, str]:
        async with (
            AsyncClient([s.client for s in cl]) as client,
            AsyncTransactionProducer(client, "apg", check),
        ):
            await client.put_half("apay", b"yes", producer_group="apg", uniq_key="AS1")
            await client.put_half("apay", b"no", producer_group="apg", uniq_key="AS2")
            # The producer answers on this loop while a thread watches the op messages.
            return await asyncio.to_thread(both_decided)

    outcomes = asyncio.run(main())
    assert (outcomes["AS1"], outcomes["AS2"]) == ("commit", "rollback")
