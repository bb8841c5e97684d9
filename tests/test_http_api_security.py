"""The console's trust boundary and its answers when the cluster cannot serve.

With an ACL every request signs in (HTTP Basic) and runs as that user: no or wrong
credentials are 401, a user without the right is 403 and a refused put stores
nothing. With TLS the console serves HTTPS with a certificate from the cluster's
CA. A plaintext non-loopback bind is refused. With two of three nodes stopped a
put is 503 with Retry-After. Each test runs a cluster of its own (`make_cluster`),
stopped at its end, pass or fail.
"""

from __future__ import annotations

import http.client
import ssl
import subprocess
import sys
from collections.abc import Callable

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, load_credentials
from dledger_commitlog.node.acl import Account, Perm
from tests.console_helpers import ROOT, console_env, running_console, with_accounts

pytestmark = pytest.mark.slow

APP_SECRET = "app-secret-of-at-least-16"
READER_SECRET = "reader-secret-of-16-chars"
NOBODY_SECRET = "nobody-secret-of-16-char"


def acl_cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = make_cluster("acl", acl=True, start=False)
    with_accounts(
        cluster,
        Account("app", APP_SECRET, topic_perms={"orders": Perm.PUB}),
        Account("reader", READER_SECRET, topic_perms={"orders": Perm.SUB}),
        Account("nobody", NOBODY_SECRET, default_group_perm=Perm.DENY),
    )
    return cluster.up()


def queue_ends(cluster: LocalCluster, topic: str) -> list[tuple[int, int]]:
    creds = load_credentials(cluster.directory / "admin.credentials")
    with Client([s.client for s in cluster], credentials=creds) as admin:
        return sorted((q.queue_id, q.max_offset) for q in admin.queue_offsets(topic))


def test_with_an_acl_each_request_runs_as_its_user(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = acl_cluster(make_cluster)
    with running_console(cluster) as api:
        anonymous = api.put("orders", b"x")
        assert anonymous.status == 401 and anonymous.error["code"] == "unauthenticated"
        assert anonymous.headers["www-authenticate"].startswith("Basic")
        wrong = api.as_user("app", "not-the-secret-at-all").put("orders", b"x")
        assert wrong.status == 401
        malformed = api.request("GET", "/cluster", None, {"Authorization": "Basic !!"})
        assert malformed.status == 401
        app, reader = api.as_user("app", APP_SECRET), api.as_user("reader", READER_SECRET)
        put = app.put("orders", b"for readers", "?key=k-1")
        assert put.status == 200, put.body
        msg_id = put.json["msg_id"]
        assert reader.get(f"/messages/{msg_id}").json["body"] == "for readers"
        # PUB is not SUB: the producer cannot read what it wrote
        refused = app.get(f"/messages/{msg_id}")
        assert refused.status == 403 and refused.error["code"] == "permission_denied"
        assert app.get("/topics/orders/messages?key=k-1").status == 403
        assert app.get("/topics/orders/messages?queue=0&offset=0").status == 403
        nobody = api.as_user("nobody", NOBODY_SECRET)
        assert nobody.get(f"/messages/{msg_id}").status == 403
        joined = nobody.post_json("/groups/g/members", {"topic": "orders"})
        assert joined.status == 403, joined.body
        before = queue_ends(cluster, "orders")
        assert reader.put("orders", b"not allowed").status == 403
        assert nobody.put("orders", b"not allowed").status == 403
        assert queue_ends(cluster, "orders") == before
        # a member is its maker's: another user does not see it
        member = reader.post_json("/groups/g/members", {"topic": "orders"})
        assert member.status == 201, member.body
        path = f"/groups/g/members/{member.json['member_id']}/messages"
        assert app.get(path).status == 404
        assert reader.get(path).status == 200
        assert api.get("/cluster").json["error"]["code"] == "unauthenticated"


def test_with_tls_the_console_serves_https(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster("tls", tls=True)
    with running_console(cluster) as api:
        assert api.https
        put = api.put("orders", b"over tls")
        assert put.status == 200, put.body
        assert api.get(f"/messages/{put.json['msg_id']}").json["body"] == "over tls"
        assert api.get("/cluster").json["tls"] is True
        plain = http.client.HTTPConnection(api.host, api.port, timeout=5)
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain.request("GET", "/api/v1/cluster")
            plain.getresponse().read()
        untrusting = ssl.create_default_context()  # the system's CAs: not the cluster's
        other = http.client.HTTPSConnection(api.host, api.port, timeout=5, context=untrusting)
        with pytest.raises(ssl.SSLError):
            other.request("GET", "/api/v1/cluster")


def test_a_plaintext_bind_beyond_loopback_is_refused(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("plain", start=False)
    cluster._write_layout()
    argv = [sys.executable, "-m", "dledger_commitlog", "console"]
    argv += ["--cluster", str(cluster.cluster_file), "--bind", "0.0.0.0", "--port", "0"]
    env = console_env()
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert done.returncode == 2
    assert "--insecure" in done.stderr and "0.0.0.0" in done.stderr


def test_without_a_leader_a_put_is_503_with_retry_after(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster("leaderless")
    with running_console(cluster, "--timeout", "3") as api:
        assert api.put("orders", b"while healthy").status == 200
        leader = cluster.leader_id()
        follower = next(n for n in cluster.specs if n != leader)
        for node in (follower, leader):
            cluster.stop(node)
        shard = api.get("/cluster").json["shards"][0]  # reads: any replica, a view too
        assert shard["leader"] is None and shard["replicas"][str(leader)] is None
        assert sum(cell is not None for cell in shard["replicas"].values()) == 1
        reply = api.put("orders", b"nobody leads")
        assert reply.status == 503, reply.body
        assert reply.error["code"] in ("unavailable", "outcome_unknown")
        assert int(reply.headers["retry-after"]) >= 1
