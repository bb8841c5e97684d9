"""Bad input against a real cluster: a clear gRPC status, nothing stored, the node serves on.

Requests go through raw gRPC stubs (the client library would refuse most of them
before sending), to the leader and to a follower alike: a follower validates
before it forwards. Every check compares each node's committed and last index
before and after, and reads a canary message back from the node it attacked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, NodeStatus, WrongCluster
from dledger_commitlog.log.message_layout import make_msg_id
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from tests.conftest import (
    CONVERGE_S,
    MAX_MESSAGE_BYTES,
    answered,
    get_at,
    node_stubs,
    summary,
    wait_converged,
    wait_until,
)

pytestmark = pytest.mark.slow

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MAX_TOPIC = 127
MAX_PROPERTIES = 32767


@dataclass(frozen=True, slots=True)
class Canary:
    """A committed message every check reads back from the node it sent bad input to."""

    offset: int
    msg_id: str
    committed_pos: int  # the committed end once the canary is on every replica


@pytest.fixture(scope="module")
def canary(shared_cluster: LocalCluster) -> Canary:
    with shared_cluster.client() as client:
        put = client.put("Canary", b"canary")
    statuses = wait_converged(shared_cluster, CONVERGE_S)
    return Canary(put.commitlog_offset, put.msg_id, statuses[1].committed_pos)


@pytest.fixture(scope="module")
def stubs(shared_cluster: LocalCluster) -> Iterator[dict[int, Any]]:
    with node_stubs(shared_cluster) as by_node:
        yield by_node


@pytest.fixture(params=["leader", "follower"])
def target(request: pytest.FixtureRequest, cluster: LocalCluster) -> int:
    """The node a test sends its request to: the leader, or a follower."""
    leader = cluster.wait_for_leader(timeout_s=10.0)
    if request.param == "leader":
        return leader
    return next(s.id for s in cluster if s.id != leader)


def expect_rejected(
    cluster: LocalCluster,
    stub: Any,
    canary: Canary,
    call: Callable[[Any], object],
    codes: grpc.StatusCode | set[grpc.StatusCode],
    phrase: str,
) -> grpc.RpcError:
    """`call(stub)` fails with one of `codes` and a message containing `phrase`;
    no node's log changed, every node answers Status, the node still serves reads."""
    allowed = codes if isinstance(codes, set) else {codes}
    before = wait_converged(cluster, CONVERGE_S)
    with pytest.raises(grpc.RpcError) as info:
        call(stub)
    err = info.value
    details = err.details() or ""
    assert err.code() in allowed, f"{err.code()} ({details!r}), wanted {allowed}"
    assert phrase.lower() in details.lower(), f"{details!r} does not say {phrase!r}"
    after = answered(cluster.statuses(timeout_s=2.0))
    assert after.keys() == before.keys(), f"a node stopped answering: {summary(after)}"
    assert _logs(after) == _logs(before), f"bad input changed a log: {summary(after)}"
    assert get_at(stub, canary.offset).body == b"canary"
    return err


def _logs(statuses: dict[int, NodeStatus]) -> dict[int, tuple[int, int, int]]:
    return {i: (s.committed_index, s.last_index, s.committed_pos) for i, s in statuses.items()}


def message(**fields: Any) -> pb.MessageData:
    """A valid message with `fields` changed."""
    values: dict[str, Any] = {"topic": "BadInput", "body": b"body", "uniq_key": uuid.uuid4().hex}
    values.update(fields)
    return pb.MessageData(**values)


BAD_MESSAGES = [
    pytest.param(
        {"body": b"x" * (MAX_MESSAGE_BYTES + 1)},
        f"body is {MAX_MESSAGE_BYTES + 1} bytes, at most {MAX_MESSAGE_BYTES} allowed",
        id="oversized-body",
    ),
    pytest.param({"topic": ""}, "topic must be a non-empty string", id="empty-topic"),
    pytest.param(
        {"topic": "t" * (MAX_TOPIC + 1)}, f"at most {MAX_TOPIC} allowed", id="too-long-topic"
    ),
    pytest.param({"topic": "a b"}, "may only contain", id="space-in-topic"),
    pytest.param({"topic": "é"}, "may only contain", id="non-ascii-topic"),
    pytest.param({"topic": "a/b"}, "may only contain", id="slash-in-topic"),
    pytest.param(
        {"properties": {"na\x01me": "v"}}, "must not contain \\x01 or \\x02", id="x01-in-name"
    ),
    pytest.param(
        {"properties": {"na\x02me": "v"}}, "must not contain \\x01 or \\x02", id="x02-in-name"
    ),
    pytest.param(
        {"properties": {"name": "va\x01ue"}}, "must not contain \\x01 or \\x02", id="x01-in-value"
    ),
    pytest.param({"properties": {"": "v"}}, "must be non-empty", id="empty-property-name"),
    pytest.param(
        {"properties": {"big": "v" * (MAX_PROPERTIES + 1)}},
        f"at most {MAX_PROPERTIES} allowed",
        id="properties-too-large",
    ),
    pytest.param({"keys": ["a b"]}, "contain no space", id="space-in-key"),
    pytest.param({"queue_id": 99, "has_queue_id": True}, "queue id 99", id="queue-id-out-of-range"),
]


@pytest.mark.parametrize(("fields", "phrase"), BAD_MESSAGES)
def test_bad_put_is_rejected(
    cluster: LocalCluster,
    stubs: dict[int, Any],
    canary: Canary,
    target: int,
    fields: dict[str, Any],
    phrase: str,
) -> None:
    request = pb.PutRequest(message=message(**fields), cluster=cluster.cluster)
    expect_rejected(
        cluster, stubs[target], canary, lambda s: s.Put(request, timeout=5.0), INVALID, phrase
    )


@pytest.mark.parametrize(("fields", "phrase"), BAD_MESSAGES)
def test_one_bad_message_fails_the_whole_batch(
    cluster: LocalCluster,
    stubs: dict[int, Any],
    canary: Canary,
    fields: dict[str, Any],
    phrase: str,
) -> None:
    request = pb.PutBatchRequest(
        messages=[message(body=b"good"), message(**fields), message(body=b"good too")]
    )
    leader = cluster.wait_for_leader(timeout_s=10.0)
    expect_rejected(
        cluster, stubs[leader], canary, lambda s: s.PutBatch(request, timeout=5.0), INVALID, phrase
    )


def test_an_empty_batch_is_rejected(
    cluster: LocalCluster, stubs: dict[int, Any], canary: Canary, target: int
) -> None:
    request = pb.PutBatchRequest(messages=[], cluster=cluster.cluster)
    expect_rejected(
        cluster,
        stubs[target],
        canary,
        lambda s: s.PutBatch(request, timeout=5.0),
        INVALID,
        "no message to put",
    )


def test_messages_at_the_limits_are_accepted(cluster: LocalCluster, stubs: dict[int, Any]) -> None:
    """The limits are inclusive: what the bad-input tests send is just one byte over them."""
    leader = cluster.wait_for_leader(timeout_s=10.0)
    at_limits = message(
        topic="T" * MAX_TOPIC,
        body=b"x" * MAX_MESSAGE_BYTES,
        properties={"p": "v" * 1000, "name with spaces é": "value é ✓"},
    )
    put = stubs[leader].Put(pb.PutRequest(message=at_limits), timeout=10.0).result
    got = get_at(stubs[leader], put.commitlog_offset)
    assert (got.topic, got.body) == (at_limits.topic, at_limits.body)
    assert dict(got.properties) == dict(at_limits.properties)


def _get_cases(canary: Canary) -> dict[str, tuple[pb.GetRequest, grpc.StatusCode, str]]:
    host = ("127.0.0.1", 1)
    beyond = canary.committed_pos + (1 << 20)
    inside_id = make_msg_id(host, canary.offset + 1)
    beyond_id = make_msg_id(host, beyond)
    below_id = make_msg_id(host, 0)
    return {
        "id-not-hex": (pb.GetRequest(msg_id="Z" * 32), INVALID, "is not hex"),
        "id-too-short": (pb.GetRequest(msg_id="ABCD"), INVALID, "must be 32 hex digits"),
        "id-empty": (pb.GetRequest(msg_id=""), INVALID, "must be 32 hex digits"),
        "no-key": (pb.GetRequest(), INVALID, "give msg_id or commitlog_offset"),
        "unknown-id": (
            pb.GetRequest(msg_id=inside_id),
            grpc.StatusCode.NOT_FOUND,
            f"no message with id {inside_id}: "
            f"no message starts at commit-log offset {canary.offset + 1}",
        ),
        "offset-inside-a-message": (
            pb.GetRequest(commitlog_offset=canary.offset + 7),
            grpc.StatusCode.NOT_FOUND,
            f"no message starts at commit-log offset {canary.offset + 7}",
        ),
        "offset-beyond-committed": (
            pb.GetRequest(commitlog_offset=beyond),
            grpc.StatusCode.OUT_OF_RANGE,
            str(beyond),
        ),
        # An id names a message: one that names none is NOT_FOUND, wherever it points.
        "id-beyond-committed": (
            pb.GetRequest(msg_id=beyond_id),
            grpc.StatusCode.NOT_FOUND,
            f"no message with id {beyond_id}: commit-log offset (not committed) {beyond}",
        ),
        "id-below-the-log": (
            pb.GetRequest(msg_id=below_id),
            grpc.StatusCode.NOT_FOUND,
            f"no message with id {below_id}: commit-log offset 0",
        ),
        "negative-offset": (
            pb.GetRequest(commitlog_offset=-5),
            grpc.StatusCode.OUT_OF_RANGE,
            "-5",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "id-not-hex",
        "id-too-short",
        "id-empty",
        "no-key",
        "unknown-id",
        "offset-inside-a-message",
        "offset-beyond-committed",
        "id-beyond-committed",
        "id-below-the-log",
        "negative-offset",
    ],
)
def test_bad_get_is_rejected(
    cluster: LocalCluster, stubs: dict[int, Any], canary: Canary, target: int, case: str
) -> None:
    request, code, phrase = _get_cases(canary)[case]
    expect_rejected(
        cluster, stubs[target], canary, lambda s: s.Get(request, timeout=5.0), code, phrase
    )


def test_read_range_from_inside_a_message_is_not_found(
    cluster: LocalCluster, stubs: dict[int, Any], canary: Canary, target: int
) -> None:
    """Like Get at the same offset: the contract's NOT_FOUND, "no message at that offset"."""
    inside = canary.offset + 7
    request = pb.ReadRangeRequest(from_offset=inside)
    expect_rejected(
        cluster,
        stubs[target],
        canary,
        lambda s: s.ReadRange(request, timeout=5.0),
        grpc.StatusCode.NOT_FOUND,
        f"no message starts at commit-log offset {inside}",
    )


def test_wrong_cluster_is_refused(
    cluster: LocalCluster, stubs: dict[int, Any], canary: Canary, target: int
) -> None:
    put = pb.PutRequest(message=message(), cluster="elsewhere")
    batch = pb.PutBatchRequest(messages=[message()], cluster="elsewhere")
    for call in (
        lambda s: s.Put(put, timeout=5.0),
        lambda s: s.PutBatch(batch, timeout=5.0),
    ):
        expect_rejected(
            cluster,
            stubs[target],
            canary,
            call,
            grpc.StatusCode.FAILED_PRECONDITION,
            "wrong cluster",
        )
    # The client library, naming another cluster, refuses to talk to it at all.
    with (
        pytest.raises(WrongCluster, match="elsewhere"),
        Client([cluster.specs[target].client], cluster="elsewhere", timeout_s=5.0) as client,
    ):
        client.put("Lost", b"never stored")


WIRE_GARBAGE = [
    pytest.param(b"\xff\xff\xff\xff", "Wire format was corrupt", id="not-protobuf"),
    pytest.param(
        b"\x0a\x05\x0a\x03\xff\xfe\xfd",
        "field message.topic is not valid UTF-8",
        id="bad-utf8-topic",
    ),
    pytest.param(b"\x0a\x10\x0a", "Wire format was corrupt", id="truncated"),
]


@pytest.mark.parametrize(("payload", "says"), WIRE_GARBAGE)
def test_a_malformed_request_is_refused_and_the_node_serves_on(
    cluster: LocalCluster, canary: Canary, target: int, payload: bytes, says: str
) -> None:
    with grpc.insecure_channel(cluster.specs[target].client) as channel:
        put_bytes = channel.unary_unary(
            "/dledger.v1.DLedgerClient/Put", request_serializer=None, response_deserializer=None
        )
        stub = pb_grpc.DLedgerClientStub(channel)
        err = expect_rejected(
            cluster,
            stub,
            canary,
            lambda _: put_bytes(payload, timeout=5.0),
            INVALID,
            "pars",  # "Error parsing message ..."
        )
        assert says in (err.details() or ""), err.details()
        # The same method on the same connection still takes a well-formed put.
        good = pb.PutRequest(message=message(topic="AfterGarbage", body=payload))
        put = stub.Put(good, timeout=10.0).result
        got = wait_until(
            partial(get_at, stub, put.commitlog_offset),
            CONVERGE_S,
            f"node {target} to serve the put after the garbage",
        )
        assert got.body == payload


def not_utf8(request: Any, text: str) -> bytes:
    """`request` on the wire with the UTF-8 bytes of `text` (in a string field) made
    invalid: their first byte becomes 0xFF, which never occurs in UTF-8."""
    raw: bytes = request.SerializeToString()
    at = raw.index(text.encode())
    assert raw.count(text.encode()) == 1
    return raw[:at] + b"\xff" + raw[at + 1 :]


def _utf8_cases(cluster: LocalCluster) -> dict[str, tuple[str, bytes, str]]:
    """Per case: the method, the request's bytes, the field named in the answer."""
    put = pb.PutRequest(message=message(topic="TopicZZ"), cluster=cluster.cluster)
    keyed = pb.PutRequest(message=message(keys=["ok", "KeyZZ"]), cluster=cluster.cluster)
    props = pb.PutRequest(message=message(properties={"name": "ValueZZ"}))
    batch = pb.PutBatchRequest(messages=[message(), message(topic="TopicZZ")])
    return {
        "put-topic": ("Put", not_utf8(put, "TopicZZ"), "message.topic"),
        "put-key": ("Put", not_utf8(keyed, "KeyZZ"), "message.keys[1]"),
        "put-property": ("Put", not_utf8(props, "ValueZZ"), "message.properties[0].value"),
        "put-cluster": ("Put", not_utf8(put, cluster.cluster), "cluster"),
        "batch-topic": ("PutBatch", not_utf8(batch, "TopicZZ"), "messages[1].topic"),
        "get-msg-id": ("Get", not_utf8(pb.GetRequest(msg_id="IdZZ"), "IdZZ"), "msg_id"),
        "query-key": (
            "QueryByKey",
            not_utf8(pb.QueryByKeyRequest(topic="BadInput", key="KeyZZ"), "KeyZZ"),
            "key",
        ),
        "pull-topic": ("Pull", not_utf8(pb.PullRequest(topic="TopicZZ"), "TopicZZ"), "topic"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "put-topic",
        "put-key",
        "put-property",
        "put-cluster",
        "batch-topic",
        "get-msg-id",
        "query-key",
        "pull-topic",
    ],
)
def test_a_string_that_is_not_utf8_is_invalid_argument_naming_the_field(
    cluster: LocalCluster, stubs: dict[int, Any], canary: Canary, target: int, case: str
) -> None:
    """protobuf refuses such a request before any handler runs; the answer says which
    field, and nothing is stored."""
    method, raw, field = _utf8_cases(cluster)[case]
    with grpc.insecure_channel(cluster.specs[target].client) as channel:
        call = channel.unary_unary(
            f"/dledger.v1.DLedgerClient/{method}",
            request_serializer=None,
            response_deserializer=None,
        )
        expect_rejected(
            cluster,
            stubs[target],
            canary,
            lambda _: call(raw, timeout=5.0),
            INVALID,
            f"field {field} is not valid UTF-8",
        )


def test_a_stream_ends_at_a_request_that_is_not_utf8(
    cluster: LocalCluster, stubs: dict[int, Any], canary: Canary
) -> None:
    """PutStream: the puts before the bad request are answered (and stored), then the
    call fails with INVALID_ARGUMENT naming the field; nothing after it is read."""
    leader = cluster.wait_for_leader(timeout_s=10.0)
    before = pb.PutRequest(message=message(body=b"before the bad one"))
    bad = not_utf8(pb.PutRequest(message=message(topic="TopicZZ")), "TopicZZ")
    after = pb.PutRequest(message=message(body=b"never read"))
    wire = [before.SerializeToString(), bad, after.SerializeToString()]
    logs = _logs(wait_converged(cluster, CONVERGE_S))
    with grpc.insecure_channel(cluster.specs[leader].client) as channel:
        stream = channel.stream_stream(
            "/dledger.v1.DLedgerClient/PutStream",
            request_serializer=None,
            response_deserializer=pb.PutResponse.FromString,
        )
        answers: list[pb.PutResponse] = []
        with pytest.raises(grpc.RpcError) as info:
            for answer in stream(iter(wire), timeout=10.0):
                answers.append(answer)
    assert info.value.code() == INVALID, info.value.details()
    assert "field message.topic is not valid UTF-8" in (info.value.details() or "")
    assert len(answers) == 1
    stored = get_at(stubs[leader], answers[0].result.commitlog_offset)
    assert stored.body == b"before the bad one"
    after_logs = _logs(wait_converged(cluster, CONVERGE_S))
    grew = {i: after_logs[i][0] - logs[i][0] for i in logs}
    assert grew == dict.fromkeys(logs, 1), f"one put stored, not {grew}"


def test_a_health_check_that_is_not_utf8_is_invalid_argument(
    cluster: LocalCluster, target: int
) -> None:
    """The client port's other service (gRPC health) decodes its requests the same way."""
    raw = not_utf8(health_pb2.HealthCheckRequest(service="ServiceZZ"), "ServiceZZ")
    with grpc.insecure_channel(cluster.specs[target].client) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as info:
            check(raw, timeout=5.0)
        assert info.value.code() == INVALID
        assert "field service is not valid UTF-8" in (info.value.details() or "")
        ok = health_pb2.HealthCheckRequest(service="dledger.v1.DLedgerClient")
        served = health_pb2_grpc.HealthStub(channel).Check(ok, timeout=5.0)
        assert served.status == health_pb2.HealthCheckResponse.SERVING


def test_transfer_to_an_unknown_node_is_rejected(
    cluster: LocalCluster, stubs: dict[int, Any], canary: Canary
) -> None:
    leader = cluster.wait_for_leader(timeout_s=10.0)
    request = pb.TransferLeadershipRequest(target_node_id=9, timeout_ms=1000)
    expect_rejected(
        cluster,
        stubs[leader],
        canary,
        lambda s: s.TransferLeadership(request, timeout=5.0),
        INVALID,
        "node 9 is not a peer",
    )
    assert cluster.wait_for_leader(timeout_s=10.0) == leader
