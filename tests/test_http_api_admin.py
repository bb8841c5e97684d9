"""The cluster admin endpoints over real HTTP, against a real cluster with an ACL.

One three-node cluster (an admin account and `app`, a user without the admin right)
and one console serve the module. As the admin: a leadership transfer moves the
shard's leader (to an unknown node it is a 400 naming `to`, on an unknown shard a
404); a balance plans (dry run) and makes the move back to the shard's preferred
leader; a learner is added, promoted and removed (an id that exists, or a node that
is no member, is a 409 with the cluster's reason); clean-now answers for every node.
As `app`, every one of those actions is a 403 and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dledger_commitlog.cli.cluster_layout import free_ports
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import load_credentials
from dledger_commitlog.common.routes import preferred_leader
from dledger_commitlog.node.acl import Account
from tests.conftest import SHARED_CONFIG, wait_until
from tests.console_helpers import Http, running_console, with_accounts

pytestmark = pytest.mark.slow

APP_SECRET = "app-secret-of-at-least-16"
NEW_NODE = 9  # a learner at ports nothing listens on: added, promoted, removed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("admin")
    with LocalCluster(directory, extra_config=SHARED_CONFIG, acl=True) as made:
        with_accounts(made, Account("app", APP_SECRET))
        made.up()
        yield made


@pytest.fixture(scope="module")
def consoles(cluster: LocalCluster) -> Iterator[tuple[Http, Http]]:
    """(as the admin, as `app`)."""
    admin = load_credentials(cluster.directory / "admin.credentials")
    with running_console(cluster) as http:
        yield http.as_user(*admin), http.as_user("app", APP_SECRET)


@pytest.fixture
def admin(consoles: tuple[Http, Http]) -> Http:
    return consoles[0]


@pytest.fixture
def app(consoles: tuple[Http, Http]) -> Http:
    return consoles[1]


def leader(http: Http) -> int | None:
    shard: dict[str, Any] = http.get("/cluster").json["shards"][0]
    found: int | None = shard["leader"]
    return found


def transfer(http: Http, to: Any, shard: int = 1) -> Any:
    return http.post_json(f"/shards/{shard}/transfer-leader", {"to": to})


def settled_leader(http: Http) -> int:
    """The shard's leader, once there is one."""
    found = wait_until(lambda: leader(http), 10, "a leader", lambda n: n is not None)
    assert found is not None
    return found


def test_a_transfer_moves_the_leader(admin: Http, cluster: LocalCluster) -> None:
    old = settled_leader(admin)
    to = next(n for n in cluster.specs if n != old)
    moved = transfer(admin, to)
    assert moved.status == 200, moved.body
    assert moved.json == {"shard": 1, "leader": to}
    wait_until(lambda: leader(admin), 10, f"node {to} leading", lambda n: n == to)
    unknown = transfer(admin, 99)
    assert unknown.status == 400 and unknown.error["field"] == "to", unknown.body
    assert "99" in unknown.error["message"]
    assert transfer(admin, "two").error["field"] == "to"
    assert transfer(admin, to, shard=7).status == 404
    assert leader(admin) == to


def test_a_balance_moves_the_leader_to_its_preferred_node(
    admin: Http, cluster: LocalCluster
) -> None:
    preferred = preferred_leader(1, sorted(cluster.specs))
    now = settled_leader(admin)
    if now == preferred:
        other = next(n for n in cluster.specs if n != preferred)
        assert transfer(admin, other).status == 200
        now = other
    planned = admin.post_json("/shards/balance", {"dry_run": True})
    assert planned.status == 200, planned.body
    assert planned.json["moves"] == [{"shard": 1, "from": now, "to": preferred}]
    assert leader(admin) == now
    done = admin.post_json("/shards/balance", {})
    assert done.status == 200, done.body
    assert done.json["moves"] == [{"shard": 1, "from": now, "to": preferred}]
    assert done.json["failed"] == [] and done.json["leads"][str(preferred)] == 1
    again = admin.post_json("/shards/balance", {}).json
    assert again["moves"] == [] and again["leads"][str(preferred)] == 1


def test_a_learner_is_added_promoted_and_removed(admin: Http) -> None:
    raft, client = (f"127.0.0.1:{p}" for p in free_ports(2))
    base = "/shards/1/members"
    added = admin.post_json(base, {"id": NEW_NODE, "raft": raft, "client": client, "learner": True})
    assert added.status == 200, added.body
    roles = {m["id"]: m["role"] for m in added.json["members"]}
    assert roles[NEW_NODE] == "learner" and added.json["config_index"] > 0
    again = admin.post_json(base, {"id": NEW_NODE, "raft": raft, "client": client})
    assert again.status == 409 and again.error["code"] == "change_refused", again.body
    assert "already" in again.error["message"]
    bad = admin.post_json(base, {"id": 10, "raft": "nowhere", "client": client})
    assert bad.status == 400 and bad.error["field"] == "raft"
    try:
        promoted = admin.post_json(f"{base}/{NEW_NODE}/promote", {})
        assert promoted.status == 200, promoted.body
        assert {m["id"]: m["role"] for m in promoted.json["members"]}[NEW_NODE] == "voter"
    finally:
        removed = admin.request("DELETE", f"{base}/{NEW_NODE}")
    assert removed.status == 200, removed.body
    assert NEW_NODE not in {m["id"] for m in removed.json["members"]}
    gone = admin.request("DELETE", f"{base}/{NEW_NODE}")
    assert gone.status == 409 and gone.error["code"] == "change_refused", gone.body
    assert "not a member" in gone.error["message"]


def test_clean_now_answers_for_every_node(admin: Http, cluster: LocalCluster) -> None:
    cleaned = admin.post_json("/cluster/clean-now", {})
    assert cleaned.status == 200, cleaned.body
    rows = cleaned.json["nodes"]
    assert sorted(r["server"] for r in rows) == sorted(s.client for s in cluster)
    assert all("error" not in r and r["deleted_segments"] >= 0 for r in rows), rows
    assert admin.post_json("/cluster/clean-now", {"force": "yes"}).error["field"] == "force"


def test_a_user_without_the_admin_right_gets_403_on_every_action(
    admin: Http, app: Http, cluster: LocalCluster
) -> None:
    preferred = preferred_leader(1, sorted(cluster.specs))
    other = next(n for n in cluster.specs if n != preferred)
    if settled_leader(admin) != other:  # unbalanced: a balance has a move to make
        assert transfer(admin, other).status == 200
    raft, client = (f"127.0.0.1:{p}" for p in free_ports(2))
    members = "/shards/1/members"
    refused = {
        "transfer": transfer(app, preferred),
        "balance": app.post_json("/shards/balance", {}),
        "add": app.post_json(members, {"id": 11, "raft": raft, "client": client}),
        "promote": app.post_json(f"{members}/{other}/promote", {}),
        "remove": app.request("DELETE", f"{members}/{other}"),
        "clean-now": app.post_json("/cluster/clean-now", {}),
    }
    for action, reply in refused.items():
        assert reply.status == 403, (action, reply.body)
        assert reply.error["code"] == "permission_denied", (action, reply.body)
    assert leader(admin) == other
    assert len(admin.get("/cluster").json["shards"][0]["members"]) == len(cluster.specs)
    assert app.post_json("/shards/balance", {"dry_run": True}).status == 200  # a read
    form = app.request("POST", "/shards/1/transfer-leader", b'{"to": 1}', {})
    assert form.status == 415  # the CSRF rule: no JSON content type, no header
