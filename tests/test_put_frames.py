"""PutFrames on a real cluster: frames of coalesced puts, each message on its own.

The server side is driven with raw frames (what a client's PutPipe sends); the
clients' side through `Client`/`AsyncClient`, whose single puts use it by default.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import AsyncClient, Client, ClientError, PutResult
from dledger_commitlog.common.signing import sign
from proto import dledger_pb2 as pb

from .conftest import get_at, node_stubs, wait_converged, wait_until

pytestmark = pytest.mark.slow
OK = 0


def frames(
    stub: object, *batches: list[pb.MessageData], cluster: str = "", metadata: object = None
) -> list[pb.PutFrameResult]:
    """Send each batch as one frame on one stream; the answers, by frame."""
    requests = [pb.PutFrame(seq=i + 1, messages=b, cluster=cluster) for i, b in enumerate(batches)]
    answers = list(stub.PutFrames(iter(requests), timeout=10.0, metadata=metadata))  # type: ignore[attr-defined]
    return sorted(answers, key=lambda a: a.seq)


def msg(topic: str, body: bytes, key: str) -> pb.MessageData:
    return pb.MessageData(topic=topic, body=body, uniq_key=key)


def test_each_message_of_a_frame_succeeds_or_fails_on_its_own(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    with node_stubs(cluster) as stubs:
        good = [
            msg("frames", b"a", "F-A"),
            msg("bad topic!", b"x", "F-X"),
            msg("frames", b"b", "F-B"),
        ]
        (answer,) = frames(stubs[leader], good)
        codes = [o.code for o in answer.outcomes]
        assert codes == [OK, grpc.StatusCode.INVALID_ARGUMENT.value[0], OK]
        assert "bad topic!" in answer.outcomes[1].error
        a, b = answer.outcomes[0].result, answer.outcomes[2].result
        assert b.commitlog_offset > a.commitlog_offset
        # The same uniq keys again: answered from the idempotency window, stored once.
        (again,) = frames(stubs[leader], [msg("frames", b"a", "F-A")])
        assert again.outcomes[0].result.duplicate
        assert again.outcomes[0].result.commitlog_offset == a.commitlog_offset
        wrong = frames(stubs[leader], [msg("frames", b"c", "F-C")], cluster="other")
        assert wrong[0].outcomes[0].code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert not wrong[0].leader  # a wrong cluster, not a redirect
        # A follower points at the leader; nothing is stored there.
        follower = next(i for i in cluster.specs if i != leader)
        (redirect,) = frames(stubs[follower], [msg("frames", b"d", "F-D")])
        assert redirect.outcomes[0].code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert redirect.leader == cluster.specs[leader].client
        for node, stub in stubs.items():  # followers hear the commit within a tick
            served = wait_until(
                partial(_served, stub, b.commitlog_offset), 5.0, f"node {node} to serve the put"
            )
            assert served is not None and served.body == b"b"


def _served(stub: Any, offset: int) -> pb.StoredMessage | None:
    try:
        return get_at(stub, offset)
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.OUT_OF_RANGE:  # not committed there yet
            return None
        raise


def test_many_frames_in_flight_on_one_stream(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    with node_stubs(cluster) as stubs:
        batches = [
            [msg("frames", b"%d-%d" % (f, i), f"M-{f}-{i}") for i in range(8)] for f in range(50)
        ]
        answers = frames(stubs[leader], *batches)
    assert [a.seq for a in answers] == list(range(1, 51))
    offsets = [o.result.commitlog_offset for a in answers for o in a.outcomes]
    assert all(o.code == OK for a in answers for o in a.outcomes)
    assert len(set(offsets)) == 400


def test_a_lingering_put_leaves_when_the_frames_before_it_are_answered(
    cluster: LocalCluster,
) -> None:
    """The linger bounds the wait for more; a put waits no longer than the answers to
    the frames before it (a linger of 30 s would otherwise hold the second put 30 s)."""
    servers = [s.client for s in cluster]

    async def two_puts() -> tuple[float, int]:
        async with AsyncClient(servers, timeout_s=20.0, linger_ms=30_000) as c:
            await c.put("linger", b"warm")  # the pipe is open, the leader known
            started = time.monotonic()
            first = asyncio.ensure_future(c.put("linger", b"first"))
            await asyncio.sleep(0)  # `first` leaves at the end of this pass
            await asyncio.gather(first, c.put("linger", b"second"))
            return time.monotonic() - started, len(c._pipes)

    took, pipes = asyncio.run(two_puts())
    assert pipes == 1 and took < 15, f"the second put lingered {took:.1f}s"


def test_clients_coalesce_concurrent_puts_and_survive_a_leader_change(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("frames")
    servers = [s.client for s in cluster]

    async def async_puts() -> list[PutResult]:
        async with AsyncClient(servers, timeout_s=20.0) as c:
            return await asyncio.gather(*(c.put("co", b"a%d" % i) for i in range(200)))

    first = asyncio.run(async_puts())
    assert len({r.commitlog_offset for r in first}) == 200
    # Blocking client from threads, with the leader moved away midway.
    got: list[PutResult] = []
    errors: list[BaseException] = []
    with Client(servers, timeout_s=20.0) as c:

        def worker(k: int) -> None:
            try:
                for i in range(30):
                    got.append(c.put("co", b"t%d-%d" % (k, i)))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        leader = cluster.wait_for_leader()
        c.transfer_leadership(next(i for i in cluster.specs if i != leader))
        for t in threads:
            t.join()
    assert not errors, errors
    assert len({r.commitlog_offset for r in got}) == 120
    wait_converged(cluster, 20.0)
    with node_stubs(cluster) as stubs:
        for r in got[::10]:
            for stub in stubs.values():
                assert get_at(stub, r.commitlog_offset).topic == "co"


def test_frames_check_each_messages_rights(make_cluster: Callable[..., LocalCluster]) -> None:
    from dledger_commitlog.client import load_credentials
    from dledger_commitlog.node.acl import Account, Perm, write_acl

    cluster = make_cluster("frames-acl", acl=True, start=False)
    cluster._write_layout()
    admin = load_credentials(cluster.directory / "admin.credentials")
    secret = "app-secret-0123456789"
    write_acl(
        cluster.directory / "acl.toml",
        [
            Account(*admin, admin=True),
            Account("app", secret, topic_perms={"orders": Perm.PUB}),
        ],
    )
    cluster.up()
    leader = cluster.wait_for_leader()
    with node_stubs(cluster) as stubs:
        both = [msg("orders", b"o", "A-O"), msg("audit", b"a", "A-A")]
        (answer,) = frames(stubs[leader], both, metadata=sign("app", secret, "PutFrames"))
        assert [o.code for o in answer.outcomes] == [OK, grpc.StatusCode.PERMISSION_DENIED.value[0]]
        with pytest.raises(grpc.RpcError) as err:
            frames(stubs[leader], both)  # no signature at all: the stream is refused
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_refused_put_stream_says_why_every_time(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Framed puts without credentials to a cluster with an ACL: every one is refused
    as UNAUTHENTICATED, never INTERNAL. (The client wrote its first frame while the
    server refused the stream; a write that lost that race made gRPC report
    "Internal error from Core" instead of the server's status.)"""
    cluster = make_cluster("frames-refused", acl=True)
    seen: Counter[tuple[str, str]] = Counter()
    with Client([s.client for s in cluster], cluster=cluster.cluster, timeout_s=5.0) as anonymous:
        for i in range(300):  # before the fix, about one in a hundred came back INTERNAL
            try:
                anonymous.put("orders", b"%d" % i)
            except ClientError as exc:
                seen[type(exc).__name__, exc.message] += 1
    no_credentials = "no credentials: this cluster needs an access key and a signature"
    assert seen == {("Unauthenticated", no_credentials): 300}, seen


def test_closing_clients_while_others_put_logs_nothing_about_event_loops(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Blocking clients, each put through by two threads, closed while other clients'
    threads still put: nothing is logged or printed about an event loop. (gRPC hands
    a cancelled call's last completion events to the loop the call was made in; when
    that client's loop had been closed, another client's loop logged "Event loop is
    closed" with a traceback.)"""
    cluster.wait_for_leader()
    servers = [s.client for s in cluster]
    failed: list[BaseException] = []

    def put(client: Client, count: int) -> None:
        try:
            for i in range(count):
                client.put("closing", b"c%d" % i)
        except BaseException as exc:  # surfaced below
            failed.append(exc)

    def one_client(count: int) -> None:
        with Client(servers, timeout_s=20.0) as client:
            threads = [threading.Thread(target=put, args=(client, count)) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    caplog.set_level(logging.WARNING)
    for _ in range(60):  # before the fix, every run of 60 rounds logged some
        clients = [threading.Thread(target=one_client, args=(k + 1,)) for k in range(10)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
    assert not failed, failed
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, caplog.text
    err = capfd.readouterr().err
    assert "Event loop" not in err and "Traceback" not in err, err
