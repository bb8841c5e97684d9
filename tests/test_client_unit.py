"""Client retry and leader logic against tiny in-process fake servers.

Each `FakeNode` implements only what these tests need of the DLedgerClient
service: scripted errors (with the `dledger-leader` trailing metadata) per RPC,
a Status answer, and a record of every Put it received.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from dledger_commitlog.cli.launcher import free_ports
from dledger_commitlog.client import (
    AsyncClient,
    Client,
    InvalidArgument,
    MessageSpec,
    NodeStatus,
    NotFound,
    OffsetOutOfRange,
    OutcomeUnknown,
    StatusError,
    Unavailable,
    WrongCluster,
)
from dledger_commitlog.client.retry import (
    Failure,
    ReplicaReads,
    ReplicaRefused,
    ReplicasExhausted,
    Router,
)
from dledger_commitlog.common.protocol import PUT_FRAMES_ACCEPTED
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc

Script = list[tuple[grpc.StatusCode, str, str | None]]  # code, details, leader hint


class FakeNode(pb_grpc.DLedgerClientServicer):  # type: ignore[misc]
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.address = ""
        self.role = "follower"
        self.leader_id = 0
        self.leader_address = ""
        self.term = 1
        self.cluster = "dledger"
        self.errors: dict[str, Script] = {}
        self.puts: list[pb.PutRequest] = []
        self.frames = 0
        self.unframed = False
        self.silent_after: int | None = None  # puts after this many get no answer...
        self.released = threading.Event()  # ...until this is set

    def lead(self, term: int = 1) -> None:
        self.role, self.leader_id, self.leader_address = "leader", self.node_id, self.address
        self.term = term

    def _next(self, method: str) -> tuple[grpc.StatusCode, str, str | None] | None:
        """The scripted failure of this call of `method` (None: it succeeds)."""
        script = self.errors.get(method)
        if script:
            code, details, hint = script.pop(0) if len(script) > 1 else script[0]
            if code != grpc.StatusCode.OK:
                return code, details, hint
        return None

    def _fail(self, method: str, context: Any) -> None:
        failure = self._next(method)
        if failure is not None:
            code, details, hint = failure
            if hint is not None:
                context.set_trailing_metadata((("dledger-leader", hint),))
            context.abort(code, details)

    def _maybe_silent(self) -> None:
        if self.silent_after is not None and len(self.puts) > self.silent_after:
            self.released.wait(10)

    def _put_result(self) -> pb.PutResult:
        return pb.PutResult(msg_id=f"ID{len(self.puts)}", commitlog_offset=100, queue_id=1)

    def Put(self, request: pb.PutRequest, context: Any) -> pb.PutResponse:
        self.puts.append(request)
        self._maybe_silent()
        self._fail("Put", context)
        return pb.PutResponse(result=self._put_result())

    def PutFrames(self, frames: Iterator[pb.PutFrame], context: Any) -> Iterator[pb.PutFrameResult]:
        """Single puts as a real server answers them in frames: the "Put" script per message."""
        if self.unframed:  # a server from before PutFrames
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        context.send_initial_metadata(((PUT_FRAMES_ACCEPTED, "1"),))
        for frame in frames:
            self.frames += 1
            reply = pb.PutFrameResult(seq=frame.seq)
            for m in frame.messages:
                self.puts.append(pb.PutRequest(message=m))
                self._maybe_silent()
                failure = self._next("Put")
                if failure is None:
                    reply.outcomes.add(result=self._put_result())
                    continue
                code, details, hint = failure
                if code == FAILED and hint == "":  # knows no leader: the server says so
                    code = grpc.StatusCode.UNAVAILABLE
                reply.outcomes.add(code=code.value[0], error=details)
                reply.leader = hint or ""
            yield reply

    def PutBatch(self, request: pb.PutBatchRequest, context: Any) -> pb.PutBatchResponse:
        self.puts.extend(pb.PutRequest(message=m) for m in request.messages)
        self._fail("PutBatch", context)
        n = len(self.puts)
        results = [
            pb.PutResult(msg_id=f"ID{n - i}") for i in reversed(range(len(request.messages)))
        ]
        return pb.PutBatchResponse(results=results)

    def Get(self, request: pb.GetRequest, context: Any) -> pb.GetResponse:
        self._fail("Get", context)
        msg = pb.StoredMessage(topic="t", body=b"x", keys=["k"], properties={"a": "b"})
        return pb.GetResponse(message=msg)

    def Pull(self, request: pb.PullRequest, context: Any) -> pb.PullResponse:
        self._fail("Pull", context)
        return pb.PullResponse(next_offset=request.queue_offset)

    def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        self._fail("Status", context)
        return pb.StatusResponse(
            node_id=self.node_id,
            role=self.role,
            term=self.term,
            leader_id=self.leader_id,
            leader_address=self.leader_address,
            cluster=self.cluster,
        )


@pytest.fixture
def nodes() -> Iterator[list[FakeNode]]:
    servers, fakes = [], []
    for i in (1, 2, 3):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        fake = FakeNode(i)
        pb_grpc.add_DLedgerClientServicer_to_server(fake, server)
        fake.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        servers.append(server)
        fakes.append(fake)
    yield fakes
    for server in servers:
        server.stop(None)


_FRAMED = [True]  # how the tests' clients send single puts (see the `framing` fixture)


@pytest.fixture(autouse=True, params=[True, False], ids=["framed", "unary"])
def framing(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test twice: single puts through PutFrames, and as unary Put calls."""
    _FRAMED[0] = request.param
    yield
    _FRAMED[0] = True


def client(addresses: list[str], **kw: Any) -> Client:
    kw.setdefault("timeout_s", 5.0)
    kw.setdefault("framed", _FRAMED[0])
    return Client(addresses, backoff_base_s=0.001, backoff_max_s=0.01, seed=1, **kw)


FAILED = grpc.StatusCode.FAILED_PRECONDITION


def test_put_fills_uniq_key_and_follows_the_leader_hint(nodes: list[FakeNode]) -> None:
    n1, n2, _ = nodes
    n1.lead()  # a deposed leader that still believes it leads
    n1.errors["Put"] = [(FAILED, "not the leader", n2.address)]
    n2.lead(term=2)
    with client([n1.address]) as c:  # the hint names a server the client was not given
        result = c.put("orders", "hello", keys=["k1"], tags="new")
        assert c.leader == n2.address and c.servers == [n1.address, n2.address]
    assert result.msg_id == "ID1" and result.commitlog_offset == 100
    (first,), (second,) = n1.puts, n2.puts
    assert re.fullmatch("[0-9A-F]{32}", first.message.uniq_key)
    assert second.message.uniq_key == first.message.uniq_key
    assert second.message.body == b"hello" and list(second.message.keys) == ["k1"]
    assert not second.message.has_queue_id and second.message.born_timestamp_ms > 0


def test_deadline_exceeded_is_retried_with_the_same_uniq_key(nodes: list[FakeNode]) -> None:
    n1 = nodes[0]
    n1.lead()
    late = (grpc.StatusCode.DEADLINE_EXCEEDED, "not committed in time", None)
    n1.errors["Put"] = [late, late, (grpc.StatusCode.OK, "", None)]
    with client([n1.address]) as c:
        c.put("orders", b"x", uniq_key="MYKEY")
    assert [p.message.uniq_key for p in n1.puts] == ["MYKEY"] * 3


def test_a_put_that_always_times_out_has_an_unknown_outcome(nodes: list[FakeNode]) -> None:
    n1 = nodes[0]
    n1.lead()
    n1.errors["Put"] = [(grpc.StatusCode.DEADLINE_EXCEEDED, "not committed in time", None)]
    with client([n1.address], timeout_s=1.0) as c, pytest.raises(OutcomeUnknown) as info:
        c.put("orders", b"x")
    assert info.value.uniq_keys == (n1.puts[0].message.uniq_key,)
    assert len({p.message.uniq_key for p in n1.puts}) == 1 and len(n1.puts) > 1
    assert "not committed in time" in info.value.message


def test_a_put_cut_short_by_its_deadline_says_what_the_server_last_said(
    nodes: list[FakeNode],
) -> None:
    """The last attempt ran out of time with no answer: the error names the server's
    last answer (why the put may not be stored), not only the client's own deadline."""
    n1 = nodes[0]
    n1.lead()
    n1.errors["Put"] = [(grpc.StatusCode.DEADLINE_EXCEEDED, "not committed in time", None)]
    n1.silent_after = 1  # the first attempt is answered, the second never is
    try:
        with client([n1.address], timeout_s=1.0) as c, pytest.raises(OutcomeUnknown) as info:
            c.put("orders", b"x")
    finally:
        n1.released.set()
    message = info.value.message
    assert f"last answer from {n1.address}: DEADLINE_EXCEEDED: not committed in time" in message
    assert "the last attempt got no answer in time" in message
    assert len(n1.puts) == 2


@pytest.mark.parametrize(
    ("method", "code", "error"),
    [
        ("Put", grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
        ("Get", grpc.StatusCode.NOT_FOUND, NotFound),
        ("Pull", grpc.StatusCode.OUT_OF_RANGE, OffsetOutOfRange),
        ("Put", FAILED, WrongCluster),  # FAILED_PRECONDITION without a leader hint
    ],
)
def test_errors_that_are_not_retried(
    nodes: list[FakeNode], method: str, code: grpc.StatusCode, error: type[Exception]
) -> None:
    n1 = nodes[0]
    n1.lead()
    n1.errors[method] = [(code, f"the server says {code.name}", None)]
    with client([n1.address]) as c, pytest.raises(error, match=f"the server says {code.name}"):
        if method == "Put":
            c.put("orders", b"x")
        elif method == "Get":
            c.get(msg_id="X")
        else:
            c.pull("orders", 0, 99)
    assert len(n1.puts) == (1 if method == "Put" else 0)


def test_unavailable_servers_are_skipped(nodes: list[FakeNode]) -> None:
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    n2 = nodes[1]
    n2.lead()
    with client([dead, n2.address]) as c:
        assert c.put("orders", b"x").msg_id == "ID1"
        assert c.get(offset=5).keys == ("k",)


def test_no_server_at_all_is_unavailable_not_unknown() -> None:
    dead = [f"127.0.0.1:{p}" for p in free_ports(2)]
    with client(dead, timeout_s=0.5) as c, pytest.raises(Unavailable):
        c.put("orders", b"x")


def test_an_election_under_way_is_waited_out(nodes: list[FakeNode]) -> None:
    n1, n2, _ = nodes
    unavailable = (grpc.StatusCode.UNAVAILABLE, "no leader right now", None)
    n1.errors["Put"] = [unavailable, unavailable, (FAILED, "not the leader", n2.address)]
    n2.lead()
    with client([n1.address]) as c:
        assert c.put("orders", b"x").msg_id == "ID1"
    assert len(n1.puts) == 3 and len(n2.puts) == 1


def test_an_unreachable_leader_hint_is_mapped_through_status(nodes: list[FakeNode]) -> None:
    n1, n2, _ = nodes
    internal = f"127.0.0.1:{free_ports(1)[0]}"  # how the cluster names n2; we cannot reach it
    n1.lead()
    n1.errors["Put"] = [(FAILED, "not the leader", internal)]
    n2.role, n2.leader_id, n2.leader_address, n2.term = "leader", 2, internal, 2
    with client([n1.address, n2.address]) as c:
        assert c.put("orders", b"x").msg_id == "ID1"
        n1.role, n1.leader_id, n1.leader_address, n1.term = "follower", 2, internal, 2
        assert c.put("orders", b"y").msg_id == "ID2"  # straight to n2 now
    assert len(n2.puts) == 2


def test_status_all_and_cluster_name(nodes: list[FakeNode]) -> None:
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    nodes[2].cluster = "other"
    with client([nodes[0].address, dead, nodes[2].address], cluster="dledger") as c:
        first, second, third = c.status_all(timeout_s=1)
    assert isinstance(first, NodeStatus) and first.node_id == 1 and first.role == "follower"
    assert isinstance(second, StatusError) and second.error.code == "UNAVAILABLE"
    assert isinstance(third, StatusError) and isinstance(third.error, WrongCluster)


def test_async_client_follows_hints_and_retries(nodes: list[FakeNode]) -> None:
    n1, n2, _ = nodes
    n1.lead()
    n1.errors["Put"] = [(FAILED, "not the leader", n2.address)]
    n2.lead(term=2)

    async def puts() -> list[str]:
        async with AsyncClient([n1.address], backoff_base_s=0.001, framed=_FRAMED[0]) as c:
            r = await c.put("t", "a", properties={"p": "q"})
            statuses = await c.status_all()
            assert {s.node_id for s in statuses if isinstance(s, NodeStatus)} == {1, 2}
            specs = [MessageSpec("t", f"m{i}") for i in range(5)]
            return [r.msg_id, *[x.msg_id async for x in c.put_stream(specs, batch=2)]]

    assert asyncio.run(puts()) == ["ID1", "ID2", "ID3", "ID4", "ID5", "ID6"]
    assert n1.puts[0].message.uniq_key == n2.puts[0].message.uniq_key
    assert dict(n2.puts[0].message.properties) == {"p": "q"}


def test_router_learns_the_highest_term_and_aliases() -> None:
    router = Router(["a:1", "b:2", "c:3"])

    def st(addr: str, node: int, role: str, term: int, leader: int, laddr: str) -> NodeStatus:
        zero: dict[str, Any] = dict.fromkeys(
            ("first_index", "last_index", "committed_index", "applied_index"), 0
        )
        zero |= dict.fromkeys(("committed_pos", "flushed_pos", "dispatched_pos"), 0)
        return NodeStatus(
            addr,
            node,
            role,
            term,
            leader,
            laddr,
            **zero,
            cluster="d",
            peers=(),
            last_chain_crc=0,
            flush_mode="sync",
        )

    router.learn([st("a:1", 1, "leader", 3, 1, "n1:7"), st("b:2", 2, "follower", 4, 3, "n3:7")])
    assert router.leader == "n3:7"  # the newer term wins; n3's address is not known yet
    router.learn([st("c:3", 3, "leader", 4, 3, "n3:7")])
    assert router.leader == "c:3" and router.redirect("n3:7") == "c:3"
    assert router.redirect("n1:7") == "a:1"


def test_message_spec_validation_and_get_arguments(tmp_path: Path) -> None:
    bad_specs: list[Callable[[], object]] = [
        lambda: MessageSpec("", b"x"),
        lambda: MessageSpec("t", 3),  # type: ignore[arg-type]
        lambda: MessageSpec("t", b"x", keys="abc"),
        lambda: MessageSpec("t", b"x", properties={"a": 1}),  # type: ignore[dict-item]
        lambda: MessageSpec("t", b"x", queue_id=-1),
    ]
    for bad in bad_specs:
        with pytest.raises(InvalidArgument):
            bad()
    c = Client(["127.0.0.1:1"])
    with pytest.raises(ValueError, match="exactly one"):
        c.get()
    with pytest.raises(ValueError, match="exactly one"):
        c.get(msg_id="x", offset=1)
    path = tmp_path / "cluster.json"
    doc = {"cluster": "c1", "nodes": [{"id": 1, "client": "h:1"}, {"id": 2, "client": "h:2"}]}
    path.write_text(json.dumps(doc))
    loaded = Client.from_cluster_file(path)
    assert loaded.servers == ["h:1", "h:2"] and loaded.cluster == "c1"
    with pytest.raises(ValueError, match="cluster file"):
        Client.from_cluster_file(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="at least one server"):
        Client([])


def test_concurrent_framed_puts_share_frames_and_each_gets_its_own_result(
    nodes: list[FakeNode],
) -> None:
    n1 = nodes[0]
    n1.lead()
    n1.errors["Put"] = [(grpc.StatusCode.OK, "", None)] * 7 + [
        (grpc.StatusCode.INVALID_ARGUMENT, "bad one", None),
        (grpc.StatusCode.OK, "", None),
    ]

    async def puts() -> list[str | Exception]:
        async with AsyncClient([n1.address], framed=True) as c:
            results = await asyncio.gather(
                *(c.put("t", f"m{i}") for i in range(40)), return_exceptions=True
            )
        return [r if isinstance(r, BaseException) else r.msg_id for r in results]  # type: ignore[misc]

    got = asyncio.run(puts())
    failed = [r for r in got if isinstance(r, Exception)]
    assert len(failed) == 1 and isinstance(failed[0], InvalidArgument), got  # alone
    assert len({r for r in got if isinstance(r, str)}) == 39
    assert len(n1.puts) == 40  # each sent once: the bad one is not retried
    assert n1.frames < 40, "concurrent puts were coalesced into fewer frames"


def test_a_server_without_put_frames_gets_unary_puts(nodes: list[FakeNode]) -> None:
    n1 = nodes[0]
    n1.lead()
    n1.unframed = True
    with client([n1.address], framed=True) as c:
        assert c.put("t", b"a").msg_id == "ID1"
        assert not c.framed  # remembered: the next put goes unary at once
        assert c.put("t", b"b").msg_id == "ID2"
    assert n1.frames == 0 and len(n1.puts) == 2


class _Refusal(grpc.RpcError):  # type: ignore[misc]
    """What a replica's failed call raises (the parts `Failure.of` reads)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_replica_reads_fail_over_stick_to_the_answer_and_stop_at_a_refusal() -> None:
    replicas = ReplicaReads(["a:1", "b:2", "c:3"], first=1)
    tried: list[str] = []

    def down_but_c(address: str, timeout: float) -> str:
        tried.append(address)
        if address != "c:3":
            raise _Refusal(grpc.StatusCode.UNAVAILABLE, "down")
        return f"from {address}"

    def retried(f: Failure) -> bool:
        return f.code == "UNAVAILABLE"

    got = replicas.call(down_but_c, "read", timeout_s=5, attempt_s=1, retried=retried)
    assert got == "from c:3" and tried == ["b:2", "c:3"]
    assert replicas.current == "c:3"  # the one that answered is asked first from now on
    assert replicas.in_order() == ["c:3", "a:1", "b:2"]

    def refuses(address: str, timeout: float) -> str:
        raise _Refusal(grpc.StatusCode.PERMISSION_DENIED, "no right")

    with pytest.raises(ReplicaRefused, match="read: c:3 answered PERMISSION_DENIED: no right"):
        replicas.call(refuses, "read", timeout_s=5, attempt_s=1, retried=retried)

    def always_down(address: str, timeout: float) -> str:
        raise _Refusal(grpc.StatusCode.UNAVAILABLE, f"{address} down")

    with pytest.raises(ReplicasExhausted, match=r"no server answered in 0\.3s .*a:1: UNAVAILABLE"):
        replicas.call(always_down, "read", timeout_s=0.3, attempt_s=0.1, retried=retried)
