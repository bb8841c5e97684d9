"""The membership RPCs' mapping, end to end over real gRPC, against a scripted node.

The client service (`service/members.py`, `admin.py`) runs on grpc.aio servers
over `FakeShard`'s nodes, which stand in for `RaftNode` and its membership part
(`RaftNode.membership`): what they answer and raise is scripted (a refusal, a
timeout, a lost leadership). The real clients (`Client`, and the `dledger` CLI)
call them, so each test checks the whole path of a status: the node's exception
-> the gRPC status -> the client's error and the CLI's exit code. Nothing here
needs the Raft core's membership (tests/test_operations_runbooks.py runs the real
thing). Also: a local cluster directory's memory of added and removed nodes
(`ClusterLayout`), without processes.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from dledger_commitlog.cli.cluster_layout import ClusterLayout
from dledger_commitlog.cli.main import build_parser, main
from dledger_commitlog.client import (
    AsyncClient,
    ChangeRefused,
    Client,
    InvalidArgument,
    MemberInfo,
    OutcomeUnknown,
    PermissionDenied,
)
from dledger_commitlog.node.acl import Account, Acl
from dledger_commitlog.node.config import ConfigError, NodeConfig, Peer, load_config
from dledger_commitlog.node.members import NodeMembers
from dledger_commitlog.node.metrics import NodeMetrics
from dledger_commitlog.node.security import NodeSecurity
from dledger_commitlog.node.views import MemberStatus, NodeState
from dledger_commitlog.service import h2_port
from dledger_commitlog.service.client_service import ClientService
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from raft import Config, MemoryStorage, NotLeader, RaftCore, Role
from raft.errors import MembershipError
from raft.membership import Member

ADMIN = ("admin", "admin-secret")
APP = ("app", "app-secret")


@dataclass
class FakeShard:
    """What the fake nodes share: the members, the leader, what a change does next."""

    members: dict[int, MemberStatus] = field(default_factory=dict)
    leader: int | None = 1
    addresses: dict[int, str] = field(default_factory=dict)
    calls: list[tuple[str, Any, float]] = field(default_factory=list)
    refuse: MembershipError | None = None  # the next change raises this
    time_out: bool = False  # the next change raises TimeoutError
    lose_leadership_to: int | None = None  # the next change raises NotLeader, this one leads
    index: int = 100
    read_refusal: str | None = None  # what RaftNode.membership.read_refusal says


class FakeNode:
    """The part of RaftNode's facade the membership and admin RPCs use."""

    def __init__(self, shard: FakeShard, node_id: int) -> None:
        self.shard = shard
        self.node_id = node_id
        self.membership = FakeMembership(self)

    @property
    def leader_id(self) -> int | None:
        return self.shard.leader

    def is_leader(self) -> bool:
        return self.shard.leader == self.node_id

    def leader_client_address(self) -> str | None:
        return None if self.shard.leader is None else self.shard.addresses[self.shard.leader]

    def status(self) -> NodeState:
        role = Role.LEADER if self.is_leader() else Role.FOLLOWER
        return NodeState(
            role, 1, self.shard.leader, self.leader_client_address(), 0, 0, 0, 0, 0, 0, 0, {}
        )


class FakeMembership:
    """The part of NodeMembers (`RaftNode.membership`) the RPCs use, scripted."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.shard = node.shard

    @property
    def accepted(self) -> frozenset[int]:
        return frozenset(self.shard.members)

    @property
    def read_refusal(self) -> str | None:
        return self.shard.read_refusal

    @property
    def removed(self) -> bool:
        return self.node.node_id not in self.shard.members

    def members(self) -> list[MemberStatus]:
        ms = self.shard.members.values()
        if self.node.is_leader():
            return list(ms)
        return [MemberStatus(m.id, m.role, m.raft, m.client, -1, -1) for m in ms]

    async def _change(self, what: str, arg: Any, timeout_s: float) -> int:
        g = self.shard
        g.calls.append((what, arg, timeout_s))
        if g.lose_leadership_to is not None:
            g.leader, g.lose_leadership_to = g.lose_leadership_to, None
            raise NotLeader(g.leader)
        if g.refuse is not None:
            exc, g.refuse = g.refuse, None
            raise exc
        if g.time_out:
            g.time_out = False
            raise TimeoutError(f"configuration entry {g.index + 1} not committed in {timeout_s}s")
        g.index += 1
        if what == "add":
            m = arg
            role = "learner" if m.learner else "voter"
            g.members[m.id] = MemberStatus(m.id, role, m.raft, m.client, 0, g.index)
        elif what == "promote":
            m = g.members[arg]
            g.members[arg] = MemberStatus(m.id, "voter", m.raft, m.client, m.match, m.lag)
        else:
            del g.members[arg]
        return g.index

    async def add_member(self, member: Member, timeout_s: float) -> int:
        return await self._change("add", member, timeout_s)

    async def promote_member(self, node_id: int, timeout_s: float) -> int:
        return await self._change("promote", node_id, timeout_s)

    async def remove_member(self, node_id: int, timeout_s: float) -> int:
        return await self._change("remove", node_id, timeout_s)


class Served:
    """Client services over `nodes` on grpc.aio servers, in an event loop of their own."""

    def __init__(self, shard: FakeShard, tmp: Path, acl: Acl | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.shard = shard
        self.acl = acl
        self._servers: list[Any] = []
        self._services: list[ClientService] = []
        asyncio.run_coroutine_threadsafe(self._start(tmp), self.loop).result()

    async def _start(self, tmp: Path) -> None:
        peers = tuple(Peer(i, f"127.0.0.1:{i}", f"127.0.0.1:{i}") for i in (1, 2, 3))
        for i in (1, 2, 3):
            cfg = NodeConfig(node_id=i, data_dir=str(tmp / f"n{i}"), peers=peers)
            node: Any = FakeNode(self.shard, i)
            no_services: Any = None  # no delayed or transactional messages here
            security = NodeSecurity(acl=self.acl)
            service = ClientService(
                cfg, node, no_services, metrics=NodeMetrics(i), security=security
            )
            server = h2_port.ClientServer(
                ((pb_grpc.add_DLedgerClientServicer_to_server, service),), None
            )
            port = await server.start("127.0.0.1:0")
            self.shard.addresses[i] = f"127.0.0.1:{port}"
            self._servers.append(server)
            self._services.append(service)

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                await server.stop(0)
            for service in self._services:
                await service.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _shard() -> FakeShard:
    g = FakeShard()
    for i in (1, 2, 3):
        g.members[i] = MemberStatus(
            i, "voter", f"127.0.0.1:{7100 + i}", f"127.0.0.1:{7000 + i}", 10, 0
        )
    return g


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[FakeShard]:
    g = _shard()
    served = Served(g, tmp_path, None)
    yield g
    served.close()


@pytest.fixture
def acl_shard(tmp_path: Path) -> Iterator[FakeShard]:
    g = _shard()
    acl = Acl([Account(*ADMIN, admin=True), Account(*APP)])
    served = Served(g, tmp_path, acl)
    yield g
    served.close()


def client(g: FakeShard, *ids: int, **kw: Any) -> Client:
    servers = [g.addresses[i] for i in ids or (1, 2, 3)]
    return Client(servers, timeout_s=5.0, backoff_base_s=0.001, backoff_max_s=0.01, **kw)


# ---------------------------------------------------------------- service and client


def test_member_list_is_the_leaders_view_through_a_redirect(shard: FakeShard) -> None:
    shard.members[4] = MemberStatus(4, "learner", "h:4", "h:5", 7, 3)
    with client(shard, 2) as c:  # a follower only: it redirects to the leader
        rows = c.member_list()
        assert c.leader == shard.addresses[1]
    assert [r.id for r in rows] == [1, 2, 3, 4]
    assert rows[3] == MemberInfo(4, "learner", "h:4", "h:5", 7, 3)


def test_a_change_reaches_the_leader_with_its_timeout(shard: FakeShard) -> None:
    with client(shard, 3) as c:
        change = c.member_add(4, "127.0.0.1:9104", "127.0.0.1:9004", learner=True, timeout_ms=3000)
        assert shard.calls == [("add", Member(4, "127.0.0.1:9104", "127.0.0.1:9004", True), 3.0)]
        assert change.config_index == 101
        assert [(m.id, m.role) for m in change.members][-1] == (4, "learner")
        assert c.member_promote(4).config_index == 102  # default timeout: 10 s
        assert shard.calls[-1] == ("promote", 4, 10.0)
        assert [m.id for m in c.member_remove(2).members] == [1, 3, 4]


@pytest.mark.parametrize(
    ("node_id", "raft", "client_address", "why"),
    [
        (0, "h:1", "h:2", "node id 0"),
        (-3, "h:1", "h:2", "node id -3"),
        (4, "nohost", "h:2", "raft address 'nohost' of node 4 is not HOST:PORT"),
        (4, "h:1", "h:0", "client address 'h:0'"),
        (4, "h:1", "", "client address ''"),
    ],
)
def test_malformed_changes_are_invalid_and_reach_no_node(
    shard: FakeShard, node_id: int, raft: str, client_address: str, why: str
) -> None:
    with client(shard) as c, pytest.raises(InvalidArgument, match=why) as err:
        c.member_add(node_id, raft, client_address)
    assert err.value.code == "INVALID_ARGUMENT"
    with client(shard) as c, pytest.raises(InvalidArgument, match="timeout_ms -1"):
        c.member_remove(3, timeout_ms=-1)
    assert shard.calls == []


@pytest.mark.parametrize(
    "reason",
    [
        "node 2 is already a member",
        "node 1 is the last voter",
        "node 9 is not a member",
        "a membership change is pending (configuration entry 99)",
    ],
)
def test_a_refused_change_is_change_refused_with_the_nodes_reason(
    shard: FakeShard, reason: str
) -> None:
    shard.refuse = MembershipError(reason)
    with client(shard) as c, pytest.raises(ChangeRefused) as err:
        c.member_promote(9)
    assert err.value.code == "FAILED_PRECONDITION" and err.value.message == reason
    assert len(shard.calls) == 1  # asked once: a refusal is not retried


def test_a_change_not_committed_in_time_is_unknown_and_never_repeated(shard: FakeShard) -> None:
    shard.time_out = True
    with client(shard) as c, pytest.raises(OutcomeUnknown, match="may still commit"):
        c.member_add(4, "h:1", "h:2", timeout_ms=500)
    assert len(shard.calls) == 1


def test_a_leadership_lost_during_a_change_sends_it_to_the_new_leader(shard: FakeShard) -> None:
    shard.lose_leadership_to = 2
    with client(shard, 1) as c:
        assert c.member_remove(3).config_index == 101
        assert c.leader == shard.addresses[2]
    assert [call[0] for call in shard.calls] == ["remove", "remove"]


def test_no_leader_is_unavailable_and_retried(shard: FakeShard) -> None:
    shard.leader = None
    timer = threading.Timer(0.2, lambda: setattr(shard, "leader", 3))
    timer.start()
    servers = list(shard.addresses.values())
    try:  # back-offs of 25-50 ms: the election outlasts a few attempts, not 32 of them
        with Client(servers, timeout_s=5.0, backoff_base_s=0.05, backoff_max_s=0.05) as c:
            assert c.member_add(4, "h:1", "h:2").config_index == 101
    finally:
        timer.cancel()
    assert len(shard.calls) == 1


def test_changes_need_the_admin_right_and_listing_does_not(acl_shard: FakeShard) -> None:
    g = acl_shard
    with client(g, credentials=APP) as c:
        assert len(c.member_list()) == 3
        changes: list[Callable[[], object]] = [
            lambda: c.member_add(4, "h:1", "h:2"),
            lambda: c.member_promote(3),
            lambda: c.member_remove(3),
        ]
        for change in changes:
            with pytest.raises(PermissionDenied, match="is not an admin"):
                change()
    assert g.calls == []
    with client(g, credentials=ADMIN) as c:
        c.member_remove(3)
    assert g.calls == [("remove", 3, 10.0)]


def test_leadership_goes_only_to_a_voter_of_the_live_membership(shard: FakeShard) -> None:
    shard.members[4] = MemberStatus(4, "learner", "h:4", "h:5", 7, 3)
    with client(shard) as c:
        with pytest.raises(InvalidArgument, match="node 4 is a learner: only a voter can lead"):
            c.transfer_leadership(4)
        with pytest.raises(InvalidArgument, match="node 9 is not a peer"):
            c.transfer_leadership(9)


def test_the_async_client_has_the_same_membership_calls(shard: FakeShard) -> None:
    async def go() -> tuple[list[MemberInfo], int]:
        async with AsyncClient([shard.addresses[2]], timeout_s=5.0) as c:
            change = await c.member_add(4, "h:1", "h:2", learner=True)
            shard.refuse = MembershipError("node 4 is too far behind to vote")
            with pytest.raises(ChangeRefused, match="too far behind"):
                await c.member_promote(4)
            return await c.member_list(), change.config_index

    rows, index = asyncio.run(go())
    assert index == 101 and [(m.id, m.role) for m in rows][-1] == (4, "learner")


def test_status_carries_the_members(shard: FakeShard) -> None:
    with client(shard) as c:
        leader = c.status(shard.addresses[1])
        follower = c.status(shard.addresses[2])
    assert [(m.id, m.role, m.match_index, m.lag) for m in leader.members] == [
        (1, "voter", 10, 0),
        (2, "voter", 10, 0),
        (3, "voter", 10, 0),
    ]
    assert {(m.match_index, m.lag) for m in follower.members} == {(-1, -1)}


# ---------------------------------------------------------------- the CLI


def test_member_commands_parse() -> None:
    parser = build_parser()
    a = parser.parse_args(
        [
            "member",
            "add",
            "--id",
            "4",
            "--raft",
            "h:1",
            "--client",
            "h:2",
            "--learner",
            "--timeout-ms",
            "500",
        ]
    )
    assert (a.id, a.raft, a.client, a.learner, a.timeout_ms) == (4, "h:1", "h:2", True, 500)
    assert parser.parse_args(["member", "promote", "4"]).id == 4
    assert parser.parse_args(["member", "remove", "5", "--json"]).json
    a = parser.parse_args(["cluster", "add-node", "--dir", "D", "--learner", "--json"])
    assert (a.dir, a.learner, a.json, a.catch_up_timeout) == ("D", True, True, 120.0)
    assert parser.parse_args(["cluster", "remove-node", "--dir", "D", "3"]).id == 3


@pytest.mark.parametrize(
    "argv",
    [
        ["member", "add", "--id", "4", "--raft", "h:1"],  # no --client
        ["member", "add", "--id", "0", "--raft", "h:1", "--client", "h:2"],
        ["member", "promote", "four"],
        ["member", "remove"],
        ["member", "remove", "3", "--timeout-ms", "0"],
    ],
)
def test_bad_member_command_lines_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_member_list_json_and_a_refusal_on_the_command_line(
    shard: FakeShard, capsys: pytest.CaptureFixture[str]
) -> None:
    servers = ["--servers", shard.addresses[2]]
    assert main(["member", "list", "--json", *servers]) == 0
    doc = json.loads(capsys.readouterr().out)
    first = {"id": 1, "role": "voter", "raft": "127.0.0.1:7101", "client": "127.0.0.1:7001"}
    assert doc["members"][0] == first | {"match_index": 10, "lag": 0}
    shard.refuse = MembershipError("node 1 is the last voter")
    assert main(["member", "remove", "1", *servers]) == 1
    err = capsys.readouterr().err
    assert "FAILED_PRECONDITION" in err and "node 1 is the last voter" in err
    assert (
        main(["member", "add", "--id", "4", "--raft", "h:1", "--client", "h:2", "--json", *servers])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {"id": 4, "role": "voter", "config_index": 101}
    assert main(["status", *servers, "--servers", ",".join(shard.addresses.values())]) == 0
    out = capsys.readouterr().out
    assert "members: 4 voters, 0 learner(s)" in out and "127.0.0.1:7101" in out


# ---------------------------------------------------------------- a local cluster's memory


def test_a_cluster_directory_remembers_added_and_removed_nodes(tmp_path: Path) -> None:
    layout = ClusterLayout(tmp_path, nodes=3, base_port=21000)
    layout._write_layout()
    before = {i: layout.specs[i].config_path.read_text() for i in (1, 2, 3)}
    members = {s.id: (s.raft, s.client) for s in layout}
    spec = layout.new_spec(members)
    assert (spec.id, spec.client, spec.raft, spec.metrics) == (
        4,
        "127.0.0.1:21003",
        "127.0.0.1:21103",
        "127.0.0.1:21203",
    )
    layout.add_spec(spec, members)

    again = ClusterLayout(tmp_path)
    assert sorted(again.specs) == [1, 2, 3, 4]
    joined = load_config(again.specs[4].config_path)
    assert joined.join and [p.id for p in joined.peers] == [1, 2, 3, 4]
    assert {i: again.specs[i].config_path.read_text() for i in (1, 2, 3)} == before
    assert again.configs == layout.configs

    again.retire(2)
    third = ClusterLayout(tmp_path)
    assert sorted(third.specs) == [1, 3, 4] and sorted(third.retired) == [2]
    assert third.configs[1].peers == layout.configs[1].peers  # bootstrap peers still name 2
    assert third.new_spec({1: ("", ""), 3: ("", ""), 4: ("", "")}).id == 5  # 2 never again
    servers = Client.from_cluster_file(tmp_path / "cluster.json").servers
    assert servers == [third.specs[i].client for i in (1, 3, 4)]


def test_links_to_nodes_added_later_are_written_as_routes(tmp_path: Path) -> None:
    """A link to an id the layout does not have yet becomes a `[[routes]]` entry of the
    source's config (node configs are written once); a node added later dials its
    peers through its own links and the later ids through routes."""
    layout = ClusterLayout(tmp_path, nodes=3, base_port=21500)
    links = {
        (i, j): f"127.0.0.1:{22000 + 10 * i + j}"
        for i in range(1, 6)
        for j in range(1, 6)
        if i != j
    }
    layout.set_links(links)
    layout._write_layout()
    first = load_config(layout.specs[1].config_path)
    assert [p.id for p in first.peers] == [1, 2, 3]  # the bootstrap voters: routes add none
    assert [(r.id, r.raft) for r in first.routes] == [(4, links[1, 4]), (5, links[1, 5])]
    members = {s.id: (s.raft, s.client) for s in layout}
    spec = layout.new_spec(members)
    layout.add_spec(spec, members)
    joined = load_config(spec.config_path)
    assert [(p.id, p.raft) for p in joined.peers if p.id != 4] == [
        (i, links[4, i]) for i in (1, 2, 3)
    ]
    assert [(r.id, r.raft) for r in joined.routes] == [(5, links[4, 5])]
    with pytest.raises(ValueError, match="not a pair of distinct node ids"):
        layout.set_links({(2, 2): "127.0.0.1:1"})


@pytest.mark.parametrize(
    ("routes", "error"),
    [
        (
            '[[routes]]\nid = 4\nraft = "127.0.0.1:1"\n[[routes]]\nid = 4\nraft = "127.0.0.1:2"',
            "routes: duplicate node ids",
        ),
        ('[[routes]]\nid = 2\nraft = "127.0.0.1:1"', "node 2 is a peer"),
        ('[[routes]]\nid = 0\nraft = "127.0.0.1:1"', "an integer >= 1"),
        ('[[routes]]\nid = 4\nraft = "nowhere"', "is not HOST:PORT"),
        ("[[routes]]\nid = 4", "each route needs id and raft"),
        ("routes = 4", "routes must be an array of tables"),
    ],
)
def test_bad_routes_are_refused_naming_the_setting(tmp_path: Path, routes: str, error: str) -> None:
    path = tmp_path / "node.toml"
    peers = "".join(
        f'[[peers]]\nid = {i}\nraft = "127.0.0.1:{7100 + i}"\nclient = "127.0.0.1:{7000 + i}"\n'
        for i in (1, 2, 3)
    )
    path.write_text(f'node_id = 1\ndata_dir = "d"\n{routes}\n{peers}')
    with pytest.raises(ConfigError, match=error):
        load_config(path)


def test_a_node_that_serves_no_read_refuses_reads_as_unavailable(shard: FakeShard) -> None:
    shard.read_refusal = "node 1 is catching up: applied entry 3 of 9"
    with grpc.insecure_channel(shard.addresses[1]) as channel:
        stub: Any = pb_grpc.DLedgerClientStub(channel)
        calls: list[tuple[str, Any]] = [
            ("Get", pb.GetRequest(commitlog_offset=0)),
            ("ReadRange", pb.ReadRangeRequest(from_offset=0)),
        ]
        for method, request in calls:
            with pytest.raises(grpc.RpcError) as err:
                getattr(stub, method)(request, timeout=5)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "catching up" in (err.value.details() or "")
    shard.read_refusal = None
    with client(shard, 1) as c:
        assert [m.id for m in c.member_list()] == [1, 2, 3]  # not a read: always answered


def test_a_joining_node_that_elects_itself_serves_reads(tmp_path: Path) -> None:
    """A joined node restarted (its config still says join) may win the next election
    before it hears another leader: as the leader it holds every committed entry, so
    it serves reads instead of refusing them as 'joining' until someone else leads."""
    peers = tuple(Peer(i, f"127.0.0.1:{7100 + i}", f"127.0.0.1:{7000 + i}") for i in (1, 4))
    cfg = NodeConfig(node_id=4, data_dir=str(tmp_path), peers=peers, join=True)
    core = RaftCore(Config(id=4, peers=(4,)), MemoryStorage(), rng=random.Random(1))

    async def wait() -> None: ...

    members = NodeMembers(
        cfg, core, kick=lambda: None, wait_for_commit=wait, committed_index=lambda: 0
    )
    assert (
        members.read_refusal == "node 4 is joining the shard and has not heard from its leader yet"
    )
    for _ in range(100):
        if core.role is Role.LEADER:
            break
        core.tick()
    assert core.role is Role.LEADER
    members.sync()  # what the node does after every Ready
    assert members.read_refusal is None
