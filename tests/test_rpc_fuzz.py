"""Garbage at every RPC of the client port, generated (hypothesis): well-formed requests
with hostile values, and bytes that are no request at all.

A real three-node cluster (its own) and raw gRPC calls to one node (no client library
between: no redirects, no retries). For each RPC of `DLedgerClient` a request is drawn
from its protobuf descriptor: every field set or not, integers at their extremes,
strings empty, long, with NUL or non-ASCII, names of system topics, enum numbers no
version defined, nested messages and repeated fields; streaming RPCs get one message.
Each answer must be OK or a refusal the caller can act on: never INTERNAL, UNKNOWN or
DATA_LOSS (what a server says when garbage reached code that did not expect it). Bytes
that do not parse as the request are INVALID_ARGUMENT. After all of it every node still
answers Status and no node process has exited. Left out: the RPCs that change
membership or leadership on purpose (MemberAdd/Promote/Remove, TransferLeadership,
Drain): any value they take is a real command, not garbage. Hypothesis prints the
falsifying request of a failure (and `@reproduce_failure`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dledger_commitlog.cli.launcher import LocalCluster
from proto import dledger_pb2 as pb
from tests.conftest import CHANNEL_OPTIONS, SHARED_CONFIG, wait_until

pytestmark = pytest.mark.slow

SERVICE = pb.DESCRIPTOR.services_by_name["DLedgerClient"]
ON_PURPOSE = {"MemberAdd", "MemberPromote", "MemberRemove", "TransferLeadership", "Drain"}
METHODS = [m for m in SERVICE.methods if m.name not in ON_PURPOSE]
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
CALL_S = 3.0
STREAM_ITEMS = 8  # of a server stream, read before the call is cancelled
# Small files: the drawn puts create consume queues of random topics.
CONFIG = {**SHARED_CONFIG, "cq_units_per_file": 64, "index_slots": 64, "index_entries": 256}
_F = FieldDescriptor

_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)
_INTS: dict[int, tuple[int, int]] = {
    _F.TYPE_INT32: _I32,
    _F.TYPE_SINT32: _I32,
    _F.TYPE_SFIXED32: _I32,
    _F.TYPE_INT64: _I64,
    _F.TYPE_SINT64: _I64,
    _F.TYPE_SFIXED64: _I64,
    _F.TYPE_UINT32: (0, 2**32 - 1),
    _F.TYPE_FIXED32: (0, 2**32 - 1),
    _F.TYPE_UINT64: (0, 2**64 - 1),
    _F.TYPE_FIXED64: (0, 2**64 - 1),
}
_TEXTS = [
    "",
    "orders",
    "a" * 300,
    "x\x00y",
    "grüße ☃",
    "%RETRY%g",
    "%DLQ%g",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "../../etc/passwd",
    "0A000001" + "0" * 24,
]

_USUAL: dict[str, tuple[str, ...]] = {
    "topic": ("orders", "t1"),
    "topics": ("orders", "t1"),
    "group": ("billing", "g1"),
    "producer_group": ("pg",),
    "member_id": ("m1", "m2"),
    "keys": ("k1",),
    "key": ("k1",),
    "tags": ("TagA", ""),
    "uniq_key": ("U1", "U2"),
}


def _patient(name: str) -> bool:
    """A field that makes the server wait (a long poll, a deadline): drawn small, so
    an example costs at most its call's deadline."""
    return any(w in name for w in ("wait", "timeout", "_ms", "_s", "seconds", "linger"))


def _scalar(field: FieldDescriptor, cluster: str) -> st.SearchStrategy[Any]:
    t = field.type
    if t in _INTS:
        low, high = _INTS[t]
        if _patient(field.name):
            return st.integers(max(low, -5), min(high, 500))
        edges = [low, high, 0, 1, -1] if low < 0 else [low, high, 0, 1]
        return st.one_of(st.sampled_from(edges), st.integers(low, high))
    if t == _F.TYPE_BOOL:
        return st.booleans()
    if t in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        return st.floats(width=32 if t == _F.TYPE_FLOAT else 64)
    if t == _F.TYPE_STRING:
        hostile = st.one_of(st.sampled_from(_TEXTS), st.text(max_size=40))
        # Mostly the names a real caller sends, so the request gets past the first
        # check (the cluster's name, a valid topic) to what the values reach beyond it.
        usual = _USUAL.get(field.name, ())
        if field.name == "cluster":
            usual = ("", cluster)
        if usual:
            return st.one_of(st.sampled_from(usual), st.sampled_from(usual), hostile)
        return hostile
    if t == _F.TYPE_BYTES:
        return st.binary(max_size=300)
    if t == _F.TYPE_ENUM:
        return st.integers(-1, 12)  # proto3 enums are open: numbers no version names
    raise AssertionError(f"no strategy for field {field.full_name} of type {t}")


def _value(field: FieldDescriptor, cluster: str, depth: int) -> st.SearchStrategy[Any]:
    if field.message_type is not None:
        return _message(field.message_type, cluster, depth + 1)
    return _scalar(field, cluster)


def _message(desc: Descriptor, cluster: str, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type `desc`: any subset of its fields set, nested ones two deep."""
    cls = message_factory.GetMessageClass(desc)
    if depth > 2:
        return st.just(cls())
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in desc.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = field.message_type.fields
            parts[field.name] = st.dictionaries(
                _value(key_field, cluster, depth),
                _value(value_field, cluster, depth),
                max_size=3,
            )
        elif field.is_repeated:
            parts[field.name] = st.lists(_value(field, cluster, depth), max_size=4)
        else:
            parts[field.name] = _value(field, cluster, depth)
    return st.fixed_dictionaries({}, optional=parts).map(lambda values: _build(cls, values))


def _build(cls: type[Message], values: dict[str, Any]) -> Message:
    msg = cls()
    for name, value in values.items():
        target = getattr(msg, name)
        if isinstance(value, Message):
            target.CopyFrom(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, Message):
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif isinstance(value, list):
            for item in value:
                target.add().CopyFrom(item) if isinstance(item, Message) else target.append(item)
        else:
            setattr(msg, name, value)
    return msg


def _call(channel: grpc.Channel, method: MethodDescriptor, raw: bytes) -> grpc.StatusCode:
    """Send `raw` as one request of `method`; the status of its answer."""
    path = f"/{SERVICE.full_name}/{method.name}"
    same = {"request_serializer": None, "response_deserializer": None}
    try:
        if method.client_streaming:
            answers = channel.stream_stream(path, **same)(iter([raw]), timeout=CALL_S)
            for n, _ in enumerate(answers):
                if n >= STREAM_ITEMS:
                    answers.cancel()
                    return grpc.StatusCode.OK
        elif method.server_streaming:
            stream = channel.unary_stream(path, **same)(raw, timeout=CALL_S)
            for n, _ in enumerate(stream):
                if n >= STREAM_ITEMS:
                    stream.cancel()
                    return grpc.StatusCode.OK
        else:
            channel.unary_unary(path, **same)(raw, timeout=CALL_S)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        if code in NEVER:
            details = exc.details()
            raise AssertionError(f"{method.name}: {code.name}: {details}") from None
        return code
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, grpc.Channel]]:
    """The module's own cluster and a channel to its first node; every node must still
    be up and answer Status when the module is done."""
    with LocalCluster(tmp_path_factory.mktemp("fuzz"), extra_config=CONFIG) as cluster:
        cluster.up()
        first = next(iter(cluster))
        with grpc.insecure_channel(first.client, options=CHANNEL_OPTIONS) as channel:
            yield cluster, channel
        with cluster.client() as client:
            for spec in cluster:
                assert cluster.pid(spec.id) is not None, f"node {spec.id} exited"
                address = spec.client
                wait_until(
                    lambda address=address: client.status(address, timeout_s=2.0),  # type: ignore[misc]
                    10.0,
                    f"node {spec.id} to answer Status",
                )


FUZZ = settings(
    max_examples=25,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_every_rpc_refuses_hostile_values_with_a_status_a_caller_can_act_on(
    target: tuple[LocalCluster, grpc.Channel], method: MethodDescriptor
) -> None:
    cluster, channel = target

    @FUZZ
    @given(request=_message(method.input_type, cluster.cluster))
    def hostile(request: Message) -> None:
        _call(channel, method, request.SerializeToString())

    hostile()


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_bytes_that_are_no_request_are_invalid_argument(
    target: tuple[LocalCluster, grpc.Channel], method: MethodDescriptor
) -> None:
    _, channel = target
    # a truncated tag, a length past the end, a varint of 11 bytes, a length of 2**32
    for raw in (
        b"\xff\xff\xff\xff",
        b"\x0a\x05ab",
        b"\x08" + b"\xff" * 11,
        b"\x12\x80\x80\x80\x80\x10",
    ):
        code = _call(channel, method, raw)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method.name, raw, code)


def test_the_generator_covers_every_field_type() -> None:
    """A descriptor type the strategies do not know fails here, not in a run."""
    seen = {
        f.type
        for m in METHODS
        for desc in (m.input_type, *m.input_type.nested_types)
        for f in desc.fields
    }
    known = {*_INTS, _F.TYPE_BOOL, _F.TYPE_DOUBLE, _F.TYPE_FLOAT, _F.TYPE_STRING}
    known |= {_F.TYPE_BYTES, _F.TYPE_ENUM, _F.TYPE_MESSAGE}
    assert seen <= known, seen - known
