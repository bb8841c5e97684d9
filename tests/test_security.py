"""Trust boundaries on real clusters: the Raft port no outsider can drive, client
authentication and authorization, TLS end to end (docs/security.md).

Each attack an outside tester made against a cluster from `dledger cluster up` is
replayed here with raw gRPC: a forged append from a non-member, a heartbeat with
the largest term, a vote from a non-member, admin calls without rights. Every one
of them was accepted before the Raft port and the client port checked who calls.
"""

from __future__ import annotations

import struct
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from analytics.server_store import ServerStore
from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.certs import make_dev_pki
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import (
    Access,
    Client,
    InvalidArgument,
    MessageSpec,
    PermissionDenied,
    StatusError,
    Subscription,
    Unauthenticated,
    Unavailable,
    load_credentials,
)
from dledger_commitlog.common.signing import sign
from dledger_commitlog.node.acl import Account, Perm, write_acl
from dledger_commitlog.node.security import read_secret
from netkit.peer_auth import NODE_AUTH, PeerAuth
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from raft import AppendEntries, Entry, Heartbeat, Message, RequestVote
from raftio.wire import PEER_ID, to_proto

from .conftest import get_at, node_stubs, wait_converged, wait_until

pytestmark = pytest.mark.slow

APP_SECRET = "app-secret-0123456789"
READER_SECRET = "reader-secret-0123456789"
MAX_I64 = (1 << 63) - 1


def raft_call(
    address: str,
    messages: Sequence[Message],
    *,
    cluster: str = "dledger",
    metadata: Sequence[tuple[str, str]] = (),
    credentials: Any = None,
) -> grpc.StatusCode:
    """Open a Raft stream to `address` as an outsider would and push `messages`:
    the status the node ends the stream with (OK: it took them)."""
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, credentials)
    try:
        batch = pb.RaftBatch(cluster=cluster, messages=[to_proto(m) for m in messages])
        pb_grpc.RaftPeerStub(channel).Stream(iter([batch]), timeout=5.0, metadata=tuple(metadata))
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    finally:
        channel.close()
    return grpc.StatusCode.OK


def metric(cluster: LocalCluster, node: int, sample: str) -> float:
    """The value of `sample` (`name{label="value",...}`: those labels, any others too)
    from node `node`'s Prometheus endpoint, summed over what matches (0 if none yet)."""
    name, _, labels = sample.partition("{")
    wanted = [part for part in labels.rstrip("}").split(",") if part]
    total = 0.0
    with urllib.request.urlopen(f"http://{cluster.specs[node].metrics}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            head, _, value = line.rpartition(" ")
            if head.partition("{")[0] == name and all(w in head for w in wanted):
                total += float(value)
    return total


def member_token(cluster: LocalCluster, src: int, dst: int) -> list[tuple[str, str]]:
    """What a member's stream opens with (an insider who holds the cluster secret)."""
    auth = PeerAuth(cluster.cluster, read_secret(str(cluster.secret_path)))
    return [(PEER_ID, str(src)), (NODE_AUTH, auth.token(src, dst))]


def message_at(client: Client, offset: int) -> bytes:
    """The encoded bytes of a committed message (a well-formed forgery's body)."""
    raw = client.read_range(offset, max_messages=1).messages
    (size,) = struct.unpack_from(">i", raw)
    return raw[:size]


@pytest.fixture
def secured(
    make_cluster: Callable[..., LocalCluster],
) -> Iterator[LocalCluster]:
    yield make_cluster("secured")


def test_forged_append_from_a_non_member_is_refused_and_stores_nothing(
    secured: LocalCluster,
) -> None:
    cluster = secured
    with cluster.client() as client:
        body = message_at(client, client.put("orders", b"real-1").commitlog_offset)
        leader = cluster.specs[cluster.wait_for_leader()]
        st = client.status(leader.client)
        last, term = st.last_index, st.term
        forged = Entry(last + 1, 1 << 40, body)
        for spec in cluster:
            msg = AppendEntries(99, spec.id, 1 << 40, last, term, (forged,), last + 1)
            # No cluster secret: refused before any message is read.
            assert raft_call(spec.raft, [msg]) == grpc.StatusCode.UNAUTHENTICATED
            # Even with the secret (an insider), node 99 is no member.
            insider = member_token(cluster, 99, spec.id)
            assert raft_call(spec.raft, [msg], metadata=insider) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
        real = client.put("orders", b"real-2")
        statuses = wait_converged(cluster, 20.0)
        assert all(s.term < 1 << 40 for s in statuses.values())
    with node_stubs(cluster) as stubs:
        for stub in stubs.values():
            assert get_at(stub, real.commitlog_offset).body == b"real-2"
    for i in cluster.specs:
        assert cluster.is_running(i)
        assert "refused a raft stream" in cluster.log_tail(i, 200)
        assert metric(cluster, i, 'dledger_peer_rejected_total{reason="token"}') >= 1
        assert metric(cluster, i, 'dledger_peer_rejected_total{reason="membership"}') >= 1


def test_open_mode_still_refuses_non_members_and_messages_not_for_this_node(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    # No secret: membership only, which a node accepts with --insecure alone.
    cluster = make_cluster("open", peer_secret_file="", insecure=True)
    leader = cluster.wait_for_leader()
    spec = cluster.specs[leader]
    vote = RequestVote(99, leader, 5, 1 << 30, 4)
    assert raft_call(spec.raft, [vote]) == grpc.StatusCode.PERMISSION_DENIED
    other = next(i for i in cluster.specs if i != leader)
    misdirected = Heartbeat(other, other, 1, 0)  # for someone else
    assert raft_call(spec.raft, [misdirected]) == grpc.StatusCode.PERMISSION_DENIED
    assert cluster.wait_for_leader() == leader


def test_a_heartbeat_with_the_largest_term_is_refused_and_never_persisted(
    secured: LocalCluster,
) -> None:
    cluster = secured
    leader = cluster.wait_for_leader()
    for spec in cluster:
        src = next(i for i in cluster.specs if i != spec.id)
        hb = Heartbeat(src, spec.id, MAX_I64, 0)
        meta = member_token(cluster, src, spec.id)
        assert raft_call(spec.raft, [hb], metadata=meta) == grpc.StatusCode.INVALID_ARGUMENT
        # A vote far past this node's term from a member is refused too.
        vote = RequestVote(src, spec.id, 1 << 40, 1 << 30, 1)
        meta = member_token(cluster, src, spec.id)
        assert raft_call(spec.raft, [vote], metadata=meta) == grpc.StatusCode.INVALID_ARGUMENT
        # An append whose entry holds no message never reaches the log.
        st = cluster.statuses()[spec.id]
        assert not isinstance(st, StatusError)
        junk = AppendEntries(
            src,
            spec.id,
            st.term,
            st.last_index,
            st.term,
            (Entry(st.last_index + 1, st.term, b"\0" * 64),),
            0,
        )
        meta = member_token(cluster, src, spec.id)
        assert raft_call(spec.raft, [junk], metadata=meta) == grpc.StatusCode.INVALID_ARGUMENT
        # A member cannot speak for another one on its stream.
        third = next(i for i in cluster.specs if i not in (src, spec.id))
        meta = member_token(cluster, src, spec.id)
        posing = Heartbeat(third, spec.id, 1, 0)
        assert raft_call(spec.raft, [posing], metadata=meta) == grpc.StatusCode.PERMISSION_DENIED
    assert cluster.wait_for_leader() == leader
    cluster.restart(leader)  # the persisted term is still a small one
    statuses = wait_converged(cluster, 20.0)
    assert all(s.term < 100 for s in statuses.values()), statuses
    with cluster.client() as client:
        assert client.put("orders", b"after").commitlog_offset >= 0


def test_a_replayed_or_foreign_token_is_refused(secured: LocalCluster) -> None:
    cluster = secured
    spec = cluster.specs[1]
    meta = member_token(cluster, 2, 1)
    hb = Heartbeat(2, 1, 0, 0)  # term 0: stepped and ignored
    assert raft_call(spec.raft, [hb], metadata=meta) == grpc.StatusCode.OK
    assert raft_call(spec.raft, [hb], metadata=meta) == grpc.StatusCode.UNAUTHENTICATED
    for_node_3 = member_token(cluster, 2, 3)
    assert raft_call(spec.raft, [hb], metadata=for_node_3) == grpc.StatusCode.UNAUTHENTICATED
    wrong = PeerAuth(cluster.cluster, b"another-secret-of-32-bytes-000000")
    forged = [(PEER_ID, "2"), (NODE_AUTH, wrong.token(2, 1))]
    assert raft_call(spec.raft, [hb], metadata=forged) == grpc.StatusCode.UNAUTHENTICATED


# ---------------------------------------------------------------- clients: the ACL


def _acl_cluster(make_cluster: Callable[..., LocalCluster], **kw: Any) -> LocalCluster:
    cluster = make_cluster("acl", acl=True, start=False, **kw)
    cluster._write_layout()  # the admin account, then ours beside it
    admin = load_credentials(cluster.directory / "admin.credentials")
    write_acl(
        cluster.directory / "acl.toml",
        [
            Account(admin[0], admin[1], admin=True),
            Account("app", APP_SECRET, topic_perms={"orders": Perm.PUB}),
            Account(
                "reader",
                READER_SECRET,
                default_topic_perm=Perm.SUB,
                group_perms={"other": Perm.DENY},
            ),
            Account("orders-reader", READER_SECRET, topic_perms={"orders": Perm.SUB}),
        ],
    )
    return cluster.up()


def _client(cluster: LocalCluster, creds: tuple[str, str] | None, **kw: Any) -> Client:
    return Client(
        [s.client for s in cluster],
        cluster=cluster.cluster,
        credentials=creds,
        tls_ca=str(cluster.tls_ca) if cluster.tls_ca else None,
        **kw,
    )


def test_acl_authenticates_every_call_and_checks_rights(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = _acl_cluster(make_cluster)
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.specs if i != leader)
    with _client(cluster, None, timeout_s=3.0) as anonymous:
        with pytest.raises(Unauthenticated, match="no credentials"):
            anonymous.put("orders", b"x")
        with pytest.raises(Unauthenticated):
            anonymous.clean_now(cluster.specs[leader].client, force=True)
    bad = _client(cluster, ("app", "wrong-secret-0123456789"))
    with bad, pytest.raises(Unauthenticated, match="unknown key or wrong secret"):
        bad.put("orders", b"x")
    with _client(cluster, ("app", APP_SECRET)) as app:
        put = app.put("orders", b"by-app")
        with pytest.raises(PermissionDenied, match="no PUB right on topic 'audit'"):
            app.put("audit", b"x")
        with pytest.raises(PermissionDenied, match="no SUB right"):
            app.pull("orders", put.queue_id, 0)
        with pytest.raises(PermissionDenied, match="no SUB right"):
            app.group_heartbeat("billing", "a1", [Subscription("orders")])
        with pytest.raises(PermissionDenied, match="not an admin"):
            app.clean_now(cluster.specs[leader].client, force=True)
        with pytest.raises(PermissionDenied, match="not an admin"):
            app.transfer_leadership(follower)
    with _client(cluster, ("reader", READER_SECRET)) as reader:
        got = reader.pull("orders", put.queue_id, 0, wait_ms=2000)
        assert [m.body for m in got.messages] == [b"by-app"]
        assert reader.get(msg_id=put.msg_id).body == b"by-app"
        with pytest.raises(PermissionDenied):
            reader.put("orders", b"x")
        reader.commit_offset("billing", "orders", put.queue_id, 1)
        with pytest.raises(PermissionDenied, match="group 'other'"):
            reader.commit_offset("other", "orders", put.queue_id, 1)
        with pytest.raises(PermissionDenied, match="'%SYS%OFFSETS'"):  # every group's offsets
            reader.pull("%SYS%OFFSETS", 0, 0)
        # A consumer group's calls need the group's right and SUB on its topics.
        joined = reader.group_heartbeat("billing", "r1", [Subscription("orders")])
        assert {x.topic for x in joined.leases} <= {"orders", "%RETRY%billing"}
        with pytest.raises(PermissionDenied, match="group 'other'"):
            reader.group_heartbeat("other", "r1", [Subscription("orders")])
        with pytest.raises(PermissionDenied, match="group 'other'"):
            reader.group_fetch("other", "r1")
        reader.group_leave("billing", "r1")
    with cluster.client() as admin:
        audit = admin.put("audit", b"admin-only")
        assert admin.clean_now(cluster.specs[leader].client, force=True).deleted_segments == 0
        assert admin.transfer_leadership(follower) == follower
    with _client(cluster, ("orders-reader", READER_SECRET)) as narrow:
        assert {q.topic for q in narrow.queue_offsets()} == {"orders"}  # audit is not listed
        with pytest.raises(PermissionDenied, match="'audit'"):
            narrow.get(msg_id=audit.msg_id)
        with pytest.raises(PermissionDenied, match="ReadRange"):
            narrow.read_range(0)
        assert narrow.get(msg_id=put.msg_id).body == b"by-app"
    # A put sent to a follower is forwarded, vouched for with the cluster secret.
    new_leader = cluster.wait_for_leader()
    spec = cluster.specs[next(i for i in cluster.specs if i != new_leader)]
    req = pb.PutRequest(message=pb.MessageData(topic="orders", body=b"via-follower"))
    with node_stubs(cluster) as stubs:
        stub = stubs[spec.id]
        reply = stub.Put(req, timeout=5.0, metadata=sign("app", APP_SECRET, "Put"))
        assert reply.result.commitlog_offset > put.commitlog_offset
        # A signature is good for its own RPC only.
        with pytest.raises(grpc.RpcError) as err:
            stub.Status(pb.StatusRequest(), timeout=5.0, metadata=sign("app", APP_SECRET, "Put"))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Claiming to be a forwarding peer without its token gets nowhere; a real token
        # (an insider's) for app's PutBatch vouches neither for admin nor for CleanNow.
        leader_stub = stubs[new_leader]
        auth = PeerAuth(cluster.cluster, read_secret(str(cluster.secret_path)))
        batch = pb.PutBatchRequest(messages=[req.message])
        for method, call, request, token_scope in (
            ("CleanNow", leader_stub.CleanNow, pb.CleanNowRequest(force=True), None),
            ("CleanNow", leader_stub.CleanNow, pb.CleanNowRequest(), "forward:PutBatch:app"),
            ("PutBatch", leader_stub.PutBatch, batch, "forward:PutBatch:app"),
        ):
            fake = [
                *sign("app", APP_SECRET, method),
                ("dledger-forwarded", str(spec.id)),
                ("dledger-on-behalf-of", "admin"),
            ]
            if token_scope is not None:
                fake.append((NODE_AUTH, auth.token(spec.id, new_leader, token_scope)))
            with pytest.raises(grpc.RpcError) as err:
                call(request, timeout=5.0, metadata=fake)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
    # The CLI says it in one line.
    creds = tmp_path / "app.credentials"
    creds.write_text(f'access_key = "app"\nsecret_key = "{APP_SECRET}"\n')
    capsys.readouterr()
    code = cli.main(
        [
            "put",
            "--cluster",
            str(cluster.cluster_file),
            "--credentials",
            str(creds),
            "--topic",
            "audit",
            "--body",
            "x",
        ]
    )
    err_text = capsys.readouterr().err
    assert code == 1
    assert err_text.count("\n") == 1 and "PERMISSION_DENIED" in err_text, err_text
    failures = 'dledger_client_auth_failures_total{status="%s"}'
    assert sum(metric(cluster, i, failures % "unauthenticated") for i in cluster.specs) >= 3
    assert sum(metric(cluster, i, failures % "permission_denied") for i in cluster.specs) >= 5


# ---------------------------------------------------------------- TLS


def test_tls_cluster_end_to_end_and_what_it_refuses(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster("tls", tls=True, acl=True)
    with cluster.client() as client:
        put = client.put("orders", b"over-tls")
        assert client.get(msg_id=put.msg_id, linearizable=True).body == b"over-tls"
    # Analytics reads a TLS + ACL cluster with the same access.
    access = Access.load(str(cluster.tls_ca), str(cluster.credentials_path))
    store = ServerStore([s.client for s in cluster], access=access, timeout_s=10.0)
    try:
        (queue,) = [q for q in store.queues("orders") if q.max_offset > 0]
        rows = pa.Table.from_batches(list(store.read("orders", queue.queue_id, 0, 1)))
        assert rows.column("body").to_pylist() == [b"over-tls"]
    finally:
        store.close()
    creds = load_credentials(cluster.directory / "admin.credentials")
    plain = Client([s.client for s in cluster], timeout_s=2.0, credentials=creds)
    with plain, pytest.raises(Unavailable):
        plain.status(cluster.specs[1].client)
    # Raft port: a certificate is required, from our CA, naming a member node.
    spec = cluster.specs[1]
    hb = Heartbeat(2, 1, 0, 0)
    pki = cluster.pki_dir
    ca = (pki / "ca.pem").read_bytes()
    no_cert = grpc.ssl_channel_credentials(ca)
    assert raft_call(spec.raft, [hb], credentials=no_cert) == grpc.StatusCode.UNAVAILABLE
    client_cert = grpc.ssl_channel_credentials(
        ca, (pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes()
    )
    assert raft_call(spec.raft, [hb], credentials=client_cert) == grpc.StatusCode.UNAUTHENTICATED
    other = make_dev_pki(tmp_path / "other-ca", [2], [])
    foreign = grpc.ssl_channel_credentials(
        ca, other.node_key(2).read_bytes(), other.node_cert(2).read_bytes()
    )
    assert raft_call(spec.raft, [hb], credentials=foreign) == grpc.StatusCode.UNAVAILABLE
    # Node 2's own certificate and the secret: accepted (term 0 is ignored by the core).
    node2 = grpc.ssl_channel_credentials(
        ca, (pki / "node-2.key").read_bytes(), (pki / "node-2.pem").read_bytes()
    )
    meta = member_token(cluster, 2, 1)
    assert raft_call(spec.raft, [hb], credentials=node2, metadata=meta) == grpc.StatusCode.OK
    # ... but not when the token speaks for node 3 on node 2's certificate.
    meta3 = [(PEER_ID, "3"), (NODE_AUTH, member_token(cluster, 3, 1)[1][1])]
    assert raft_call(spec.raft, [Heartbeat(3, 1, 0, 0)], credentials=node2, metadata=meta3) == (
        grpc.StatusCode.UNAUTHENTICATED
    )


def test_cli_cluster_up_with_tls_and_acl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "c"
    try:
        assert (
            cli.main(
                [
                    "cluster",
                    "up",
                    "--dir",
                    str(d),
                    "--tls",
                    "--acl",
                    "--set",
                    "data_segment_bytes=8388608",
                ]
            )
            == 0
        )
        cf = str(d / "cluster.json")
        assert cli.main(["put", "--cluster", cf, "--topic", "t", "--body", "hi", "--json"]) == 0
        assert cli.main(["status", "--cluster", cf, "--json"]) == 0
        capsys.readouterr()
        servers = ",".join(s.client for s in LocalCluster(d))
        code = cli.main(["status", "--servers", servers, "--tls-ca", str(d / "pki" / "ca.pem")])
        out = capsys.readouterr()
        assert code == 1 and "no credentials" in out.out + out.err, out
    finally:
        cli.main(["cluster", "down", "--dir", str(d)])


# ---------------------------------------------------------------- an oversize put


def test_an_oversize_put_fails_at_once_as_not_stored(secured: LocalCluster) -> None:
    with secured.client(timeout_s=10.0) as client:
        with pytest.raises(InvalidArgument, match="nothing was sent or stored"):
            client.put("orders", b"x" * (200 << 20))
        batch = [MessageSpec("orders", b"y" * (30 << 20)) for _ in range(3)]
        with pytest.raises(InvalidArgument, match="nothing was stored"):
            client.put_batch(batch)
        # the server's own limit (64 KiB messages here): refused, nothing stored
        with pytest.raises(InvalidArgument):
            client.put("orders", b"z" * (1 << 20))
        assert client.put("orders", b"small").commitlog_offset >= 0
    wait_until(lambda: all(secured.is_running(i) for i in secured.specs), 5.0, "nodes running")
