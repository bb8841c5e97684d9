"""The client port (h2grpc), seen by grpcio clients.

gRPC is one protocol: the Python client (grpcio) and raw grpcio stubs talk to a
cluster whose client port is h2grpc and get what a grpc.aio server gives them:
framed, unary and batched puts, reads (Get, Pull, the ReadLog stream), a refused
call's status code and leader hint, INVALID_ARGUMENT naming a field that does not
parse, RESOURCE_EXHAUSTED past the 64 MiB message limit, standard health checking
(NOT_SERVING on a graceful shutdown), plaintext and over TLS with the ACL.
"""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, MessageSpec, NodeStatus
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from tests.conftest import wait_until
from tests.test_bad_input import not_utf8

pytestmark = pytest.mark.slow
CALL_TIMEOUT_S = 10.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _channel(cluster: LocalCluster, client: Client, address: str) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", 64 << 20)]
    return client.access.channel(address, options)


def _status(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """A failed call's code, details and trailing metadata."""
    with pytest.raises(grpc.RpcError) as failed:
        call()
    err: Any = failed.value
    return err.code(), err.details() or "", dict(err.trailing_metadata() or ())


@pytest.mark.parametrize("secure", [False, True], ids=["plaintext", "tls-acl"])
def test_a_grpcio_client_talks_to_the_h2_port_and_back(make_cluster: Any, secure: bool) -> None:
    cluster: LocalCluster = make_cluster(tls=secure, acl=secure)
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.specs if i != leader)
    with cluster.client() as client, cluster.client(framed=False) as unary:
        framed = [client.put("port", f"framed-{i}".encode(), queue_id=0) for i in range(5)]
        single = unary.put("port", b"unary", queue_id=0)
        batch = client.put_batch([MessageSpec("port", b"batched", queue_id=0)] * 3)
        acked = [*framed, single, *batch]
        assert [r.queue_offset for r in acked] == list(range(9))
        assert client.get(single.msg_id).body == b"unary"
        pulled = client.pull("port", 0, 0, max_messages=100)
        assert [m.body for m in pulled.messages] == [
            *(f"framed-{i}".encode() for i in range(5)),
            b"unary",
            *[b"batched"] * 3,
        ]
        access = client.access
        with _channel(cluster, client, cluster.specs[leader].client) as channel:
            stub = pb_grpc.DLedgerClientStub(channel)
            chunks = list(
                stub.ReadLog(
                    pb.ReadLogRequest(from_pos=0),
                    timeout=CALL_TIMEOUT_S,
                    metadata=access.metadata("ReadLog"),
                )
            )
            log = b"".join(c.data for c in chunks)
            assert chunks[0].pos == 0 and len(log) == chunks[-1].committed_pos
            assert log.count(b"batched") == 3
            # a request that does not parse: INVALID_ARGUMENT naming the field, as on grpc.aio
            raw = channel.unary_unary("/dledger.v1.DLedgerClient/Put")
            bad = not_utf8(pb.PutRequest(message=pb.MessageData(topic="TopicZZ")), "TopicZZ")
            code, details, _ = _status(
                lambda: raw(bad, timeout=CALL_TIMEOUT_S, metadata=access.metadata("Put"))
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "field message.topic is not valid UTF-8" in details
            # health checking, exactly as on grpc.aio
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "dledger.v1.DLedgerClient"):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == SERVING
            code, _, _ = _status(lambda: health.Check(health_pb2.HealthCheckRequest(service="x")))
            assert code == grpc.StatusCode.NOT_FOUND
        # a refused call: the follower names the leader, in the details and the trailers
        with _channel(cluster, client, cluster.specs[follower].client) as channel:
            stub = pb_grpc.DLedgerClientStub(channel)
            code, details, trailers = _status(
                lambda: stub.TransferLeadership(
                    pb.TransferLeadershipRequest(target_node_id=follower),
                    timeout=CALL_TIMEOUT_S,
                    metadata=access.metadata("TransferLeadership"),
                )
            )
            assert code == grpc.StatusCode.FAILED_PRECONDITION, details
            assert details == f"not the leader; the leader is at {cluster.specs[leader].client}"
            assert trailers["dledger-leader"] == cluster.specs[leader].client
            assert trailers["dledger-leader-id"] == str(leader)
            if secure:  # a call nobody signed is refused by the ACL
                code, _, _ = _status(lambda: stub.Status(pb.StatusRequest(), timeout=5))
                assert code == grpc.StatusCode.UNAUTHENTICATED


def test_client_port_limits_and_graceful_shutdown(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster()
    leader = cluster.wait_for_leader()
    other = next(i for i in cluster.specs if i != leader)
    with cluster.client() as client:
        with _channel(cluster, client, cluster.specs[leader].client) as channel:
            raw = channel.unary_unary("/dledger.v1.DLedgerClient/Put")
            huge = pb.PutRequest(message=pb.MessageData(topic="big", body=b"x" * (64 << 20)))
            code, details, _ = _status(lambda: raw(huge.SerializeToString(), timeout=30))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in details
            assert client.put("big", b"still serving").queue_offset == 0
        with _channel(cluster, client, cluster.specs[other].client) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service="dledger.v1.DLedgerClient"), timeout=30
            )
            assert next(watch).status == SERVING
            cluster.stop(other)
            seen = [answer.status for answer in _until_closed(watch)]
            assert NOT_SERVING in seen
    cluster.start(other)
    wait_until(
        lambda: cluster.statuses()[other],
        30.0,
        "the restarted node answers",
        lambda s: isinstance(s, NodeStatus),
    )


def _until_closed(stream: Any) -> list[Any]:
    """The answers of a server stream until the server ends it (any status)."""
    out = []
    with contextlib.suppress(grpc.RpcError):
        for answer in stream:
            out.append(answer)
    return out
