"""Multi-Raft units (issue 24), no processes: the pure parts a multi-shard node and
its clients are built of.

- `node.config`: `[shards]` parsing and refusals, `shard_dir`, `shard_config`,
  and preferred leaders that spread (no node prefers more than ceil(shards/nodes)).
- `messaging.routes.RouteTable`: the rules of create/update/delete, the default
  route, a record's load (property tests: a checked change loads back as made).
- `common.routes`: `TopicRoute.locate` / `queue_of_key` cover every queue once,
  and its old `groups` name (keyword and attribute) warns, naming `shards`;
  `shard_of_msg_id` reads back the shard `shard_port` writes (shards 0..1000),
  and shard 1's ids are a single-shard cluster's, unchanged.
- `raftio.multiplex.LinkPool`: one shared link per (peer, address), refcounted,
  the shard stamped on every message but shard 1's. The links are fakes: this
  tests the pool's bookkeeping, not a transport.
- `raftio.link.PeerGate(shards=...)`: each message of a mixed batch to its
  shard; an unknown shard's dropped without holding up the rest.
- `common.balance.plan_moves` (property): within ceil(shards / serving nodes) per
  node, preferred leaders used when they serve, nothing planned onto a down node.
- `client.quota.Quota`: the `max_messages` of one consumer per shard, shared.
- `client.routing`: the keywords renamed to `shard`/`shards` still take their old
  names, with a FutureWarning naming the new one (no server: the calls are built,
  not made).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger_commitlog.client import Client, RoutedClient
from dledger_commitlog.client.quota import Quota
from dledger_commitlog.client.retry import Op
from dledger_commitlog.common.balance import plan_moves
from dledger_commitlog.common.routes import (
    SHARD_ZERO_CODE,
    TopicRoute,
    preferred_leader,
    shard_of_msg_id,
)
from dledger_commitlog.log.message_layout import make_msg_id, offset_of_msg_id, shard_port
from dledger_commitlog.messaging.routes import ROUTES_TOPIC, RouteError, RouteTable
from dledger_commitlog.node.config import (
    ConfigError,
    NodeConfig,
    Peer,
    load_config,
    preferred_leader_of,
    shard_config,
    shard_dir,
)
from proto import dledger_pb2 as pb
from raft.messages import Heartbeat, Message, RequestVote
from raftio.link import PeerGate
from raftio.multiplex import LinkPool
from raftio.wire import to_proto

PEERS3 = (
    Peer(1, "127.0.0.1:7001", "127.0.0.1:8001"),
    Peer(2, "127.0.0.1:7002", "127.0.0.1:8002"),
    Peer(3, "127.0.0.1:7003", "127.0.0.1:8003"),
)


def node_config(tmp: Path, **kw: Any) -> NodeConfig:
    return NodeConfig(node_id=1, data_dir=str(tmp), peers=PEERS3, **kw)


# --- node/config.py ---


def write_toml(tmp: Path, body: str, section: str = "shards") -> Path:
    peers = "".join(
        f'[[peers]]\nid = {p.id}\nraft = "{p.raft}"\nclient = "{p.client}"\n' for p in PEERS3
    )
    path = tmp / "node.toml"
    path.write_text(f'node_id = 1\ndata_dir = "{tmp}/d"\n{peers}\n[{section}]\n{body}\n')
    return path


def test_shards_section_parses(tmp_path: Path) -> None:
    cfg = load_config(write_toml(tmp_path, "count = 3\nhost = [0, 1, 2, 3]"))
    assert cfg.shard_count == 3
    assert cfg.host_shards == (0, 1, 2, 3)
    assert cfg.shard == 1
    plain = load_config(write_toml(tmp_path, ""))
    assert (plain.shard_count, plain.host_shards) == (1, (1,))


def test_the_old_multiraft_keys_are_read_with_a_warning_naming_the_new(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config(write_toml(tmp_path, "groups = 3\nhost = [0, 1, 2, 3]", "multiraft"))
    assert (cfg.shard_count, cfg.host_shards) == (3, (0, 1, 2, 3))
    warned = [r.getMessage() for r in caplog.records]
    assert any("multiraft.groups is now shards.count" in w for w in warned), warned
    assert any("multiraft.host is now shards.host" in w for w in warned), warned
    with pytest.raises(ConfigError, match=r"unknown setting multiraft\.colour"):
        load_config(write_toml(tmp_path, "colour = 3", "multiraft"))


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ("count = 3\nhost = []", "non-empty list"),
        ('count = 3\nhost = "1"', "non-empty list"),
        ("count = 3\nhost = [true]", "non-empty list"),
        ('count = 3\nhost = ["1"]', "non-empty list"),
        ("count = 3\nhost = [1, 1]", "distinct shards in 0..3"),
        ("count = 3\nhost = [4]", "distinct shards in 0..3"),
        ("count = 3\nhost = [-1, 1]", "distinct shards in 0..3"),
        ("count = 1\nhost = [0, 1]", "shard 0 (topic routes) exists only"),
        ("count = 0\nhost = [1]", "shards.count must be in 1..1000"),
        ("count = 1001\nhost = [1]", "shards.count must be in 1..1000"),
        ('count = "3"', "shards.count must be"),
        ("count = 3\nhost = [2, 4]", "distinct shards in 0..3"),
        ("colour = 3", "unknown setting shards.colour"),
    ],
)
def test_shards_section_refusals_say_why(tmp_path: Path, section: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_config(write_toml(tmp_path, section))


def test_shard_dirs_keep_shard_one_in_the_data_directory_itself(tmp_path: Path) -> None:
    assert shard_dir(str(tmp_path), 1) == str(tmp_path)
    assert shard_dir(str(tmp_path), 0) == str(tmp_path / "groups" / "0")
    assert shard_dir(str(tmp_path), 17) == str(tmp_path / "groups" / "17")
    cfg = node_config(tmp_path, shard_count=3, host_shards=(0, 1, 2, 3))
    dirs = {shard_config(cfg, g).data_dir for g in (0, 1, 2, 3)}
    assert len(dirs) == 4
    for g in (0, 1, 2, 3):
        one = shard_config(cfg, g)
        assert one.shard == g
        assert one.data_dir == shard_dir(str(tmp_path), g)
        assert one.preferred_leader == preferred_leader(g, [1, 2, 3])
    with pytest.raises(ConfigError, match="shard 4 is not among"):
        shard_config(node_config(tmp_path, shard_count=4, host_shards=(1, 2, 3)), 4)


def test_a_single_shard_node_keeps_its_configured_preferred_leader(tmp_path: Path) -> None:
    assert preferred_leader_of(node_config(tmp_path, preferred_leader=3), 1) == 3
    assert preferred_leader_of(node_config(tmp_path), 1) is None


@given(
    shards=st.integers(1, 200),
    ids=st.lists(st.integers(1, 50), min_size=1, max_size=7, unique=True),
)
def test_preferred_leaders_spread(shards: int, ids: list[int]) -> None:
    """Over shards 0..N (shard 0 included when N > 1), each node is preferred by at
    most ceil(shards / nodes) of them, and every preferred leader is a node."""
    hosted = list(range(0 if shards > 1 else 1, shards + 1))
    load = Counter(preferred_leader(g, ids) for g in hosted)
    assert set(load) <= set(ids)
    assert max(load.values()) <= math.ceil(len(hosted) / len(ids))


# --- messaging/routes.py: RouteTable ---


def test_route_table_rules() -> None:
    t = RouteTable(shard_count=3, queues_per_topic=4)
    assert t.route("t") == TopicRoute("t", ((1, 4), (2, 4), (3, 4)))
    made = t.check("create", "t", [(2, 2), (3, 4)])
    assert made == TopicRoute("t", ((2, 2), (3, 4)), configured=True)
    t.load({"routes": t.changed(made, "t")}, version=1)
    assert t.route("t") == made and t.version == 1
    refusals = [
        (("create", "t", [(1, 1)]), "already has a route"),
        (("update", "u", [(1, 1)]), "no configured route to update"),
        (("delete", "u", []), "no configured route to delete"),
        (("rename", "t", [(1, 1)]), "unknown route operation"),
        (("update", "t", []), "at least one shard"),
        (("update", "t", [(0, 1)]), "shard 0 is not a data shard"),
        (("update", "t", [(4, 1)]), "shard 4 is not a data shard"),
        (("update", "t", [(2, 1), (2, 2)]), "shard 2 is named twice"),
        (("update", "t", [(2, 5)]), "5 queues, not in 1..4"),
        (("update", "t", [(2, 0)]), "0 queues, not in 1..4"),
        (("create", ROUTES_TOPIC, [(1, 1)]), "system topics"),
        (("create", "%RETRY%g", [(1, 1)]), "system topics"),
        (("create", "", [(1, 1)]), ""),
        (("create", "a b", [(1, 1)]), ""),
    ]
    for (op, topic, shards), says in refusals:
        with pytest.raises(RouteError, match=says or None):
            t.check(op, topic, shards)
    assert t.check("delete", "t", []) is None
    t.load({"routes": t.changed(None, "t")}, version=2)
    assert t.route("t") == TopicRoute("t", ((1, 4), (2, 4), (3, 4)))
    assert not t.route("t").configured


def test_a_record_that_is_no_table_leaves_what_it_can() -> None:
    t = RouteTable(shard_count=2, queues_per_topic=2)
    t.load({"routes": {"a": [[1, 2]], "b": [["x", 1]], "c": 7, "d": [[2, 1]]}}, version=5)
    assert sorted(t.configured) == ["a", "d"]
    t.load({"nothing": 1}, version=6)  # no table: keeps the last one
    assert sorted(t.configured) == ["a", "d"] and t.version == 6


@st.composite
def changes(draw: st.DrawFn) -> list[tuple[str, str, list[tuple[int, int]]]]:
    topics = st.sampled_from(["a", "b", "c"])
    shards = st.lists(st.tuples(st.integers(-1, 5), st.integers(-1, 6)), max_size=4)
    op = st.sampled_from(["create", "update", "delete"])
    return draw(st.lists(st.tuples(op, topics, shards), max_size=12))


@given(ops=changes())
def test_route_changes_fold_like_a_model(ops: list[tuple[str, str, list[tuple[int, int]]]]) -> None:
    """Each change is accepted exactly when a model says so; the table a record holds
    loads back into the routes the changes made; every shard named is a data shard
    holding 1..queues_per_topic queues."""
    t = RouteTable(shard_count=4, queues_per_topic=4)
    model: dict[str, tuple[tuple[int, int], ...]] = {}
    for version, (op, topic, shards) in enumerate(ops, 1):
        valid = (
            (op == "create") == (topic not in model)
            and (op == "delete" or bool(shards))
            and (
                op == "delete"
                or (
                    len({g for g, _ in shards}) == len(shards)
                    and all(1 <= g <= 4 and 1 <= n <= 4 for g, n in shards)
                )
            )
        )
        try:
            route = t.check(op, topic, shards)
        except RouteError:
            assert not valid, (op, topic, shards)
            continue
        assert valid, (op, topic, shards)
        if route is None:
            del model[topic]
        else:
            model[topic] = route.shards
        t.load({"routes": t.changed(route, topic)}, version)
        assert {k: r.shards for k, r in t.configured.items()} == model
    for topic, route in t.configured.items():
        assert route.configured and route.topic == topic
        assert all(1 <= g <= 4 and 1 <= n <= 4 for g, n in route.shards)


# --- common/routes.py ---


@given(
    counts=st.lists(st.integers(1, 8), min_size=1, max_size=6),
    keys=st.lists(st.text(max_size=12), max_size=20),
)
def test_locate_covers_every_queue_once(counts: list[int], keys: list[str]) -> None:
    route = TopicRoute("t", tuple((g + 1, n) for g, n in enumerate(counts)))
    located = [route.locate(q) for q in range(route.total_queues)]
    assert located == [(g + 1, q) for g, n in enumerate(counts) for q in range(n)]
    for bad in (-1, route.total_queues):
        with pytest.raises(IndexError, match="outside"):
            route.locate(bad)
    for key in keys:
        q = route.queue_of_key(key)
        assert 0 <= q < route.total_queues
        assert q == route.queue_of_key(key)  # stable: one key, one queue


def test_topic_routes_old_groups_name_warns_and_is_the_same_value() -> None:
    route = TopicRoute("t", ((2, 1), (3, 4)), configured=True)
    with pytest.warns(FutureWarning, match=r"TopicRoute\.groups is renamed to TopicRoute\.shards"):
        old = route.groups
    assert old == route.shards == ((2, 1), (3, 4))
    with pytest.warns(FutureWarning, match=r"TopicRoute\(groups=\.\.\.\) is now"):
        built = TopicRoute("t", groups=((2, 1), (3, 4)), configured=True)
    assert built == route
    assert TopicRoute("t", shards=((1, 1),)).shards == ((1, 1),)
    with pytest.raises(TypeError, match="needs its shards"):
        TopicRoute("t")


def test_shard_of_msg_id_round_trips_for_every_shard() -> None:
    for shard in range(0, 1001):
        for port in (0, 1, 8001, 65535):
            for offset in (0, 7, (1 << 40) + 3):
                msg_id = make_msg_id(("10.1.2.3", shard_port(port, shard)), offset)
                assert shard_of_msg_id(msg_id) == shard, (shard, port)
                assert offset_of_msg_id(msg_id) == offset
    assert shard_port(8001, 0) >> 16 == SHARD_ZERO_CODE
    for bad in ("", "zz", "00" * 15, "00" * 17):
        with pytest.raises(ValueError):
            shard_of_msg_id(bad)


def test_shard_ones_ids_are_a_single_shard_clusters() -> None:
    for port in (0, 8001, 65535):
        assert shard_port(port, 1) == port
        assert make_msg_id(("127.0.0.1", shard_port(port, 1)), 99) == make_msg_id(
            ("127.0.0.1", port), 99
        )
    # An id a single-shard node wrote before multi-Raft existed (RocketMQ's layout).
    assert shard_of_msg_id("7F0000010000271100000000000003E8") == 1


# --- raftio/multiplex.py: LinkPool ---


class FakeLink:
    """What LinkPool uses of a PeerLink: a record of what it was asked to do."""

    def __init__(self, peer_id: int, address: str) -> None:
        self.peer_id, self.address = peer_id, address
        self.started = 0
        self.closed = 0
        self.sent: list[pb.RaftMessage] = []
        self.connected = True
        self.dropped = 0

    def start(self) -> None:
        self.started += 1

    def send(self, messages: Sequence[tuple[pb.RaftMessage, int]]) -> None:
        self.sent.extend(m for m, _ in messages)

    async def close(self) -> None:
        self.closed += 1


def test_link_pool_shares_one_link_per_peer_and_address() -> None:
    opened: list[FakeLink] = []

    def open_link(cluster: str, peer_id: int, address: str, **kw: Any) -> Any:
        opened.append(FakeLink(peer_id, address))
        return opened[-1]

    async def scenario() -> None:
        pool = LinkPool(open_link)
        views = {g: pool.open(g, "c", 2, "h:2", me=1) for g in (0, 1, 2, 3)}
        other = pool.open(1, "c", 3, "h:3", me=1)
        moved = pool.open(2, "c", 2, "h:9", me=1)  # a new address: a new link
        assert len(opened) == 3 and pool.links == 3
        assert [link.started for link in opened] == [1, 1, 1]
        for g, view in views.items():
            view.send([(to_proto(Heartbeat(1, 2, 5, g)), 10)])
        shared = opened[0]
        assert [m.commit for m in shared.sent] == [0, 1, 2, 3]  # one ordered queue
        assert [m.group if m.HasField("group") else None for m in shared.sent] == [0, None, 2, 3]
        await views[1].close()
        await views[1].close()  # twice: counted once
        await views[2].close()
        await views[0].close()
        assert shared.closed == 0 and pool.links == 3  # shard 3 still uses it
        views[3].send([(to_proto(Heartbeat(1, 2, 5, 9)), 10)])
        assert shared.sent[-1].group == 3
        await views[3].close()
        assert shared.closed == 1 and pool.links == 2
        again = pool.open(1, "c", 2, "h:2", me=1)
        assert len(opened) == 4 and opened[3].started == 1  # reopened with its first shard
        for view in (other, moved, again):
            await view.close()
        assert pool.links == 0 and all(link.closed == 1 for link in opened)

    asyncio.run(scenario())


# --- raftio/link.py: PeerGate(shards=...) ---


def test_gate_delivers_each_message_to_its_shard_and_drops_an_unknown_shard() -> None:
    got: dict[int, list[Message]] = {0: [], 1: [], 2: []}
    fallback: list[Message] = []
    gate = PeerGate(
        "c",
        fallback.append,
        me=2,
        members=(1, 2, 3),
        shards=lambda g: got[g].append if g in got else None,
    )
    sent: list[tuple[int | None, Message]] = []
    for k in range(12):
        shard = (None, 0, 2, 7)[k % 4]  # None: absent on the wire (shard 1); 7: not hosted
        m: Message = Heartbeat(1, 2, 3, k) if k % 3 else RequestVote(1, 2, 4, k, 3)
        sent.append((shard, m))
    batch = pb.RaftBatch(cluster="c")
    for shard, m in sent:
        p = to_proto(m)
        if shard is not None:
            p.group = shard
        batch.messages.append(p)
    gate.receive(batch.SerializeToString(), 1, "peer")
    assert got[1] == [m for g, m in sent if g is None]
    assert got[0] == [m for g, m in sent if g == 0]
    assert got[2] == [m for g, m in sent if g == 2]
    assert fallback == []
    # The next batch of a known shard is delivered as ever.
    again = pb.RaftBatch(cluster="c", messages=[to_proto(Heartbeat(1, 2, 3, 99))])
    again.messages[0].group = 7
    again.messages.append(to_proto(Heartbeat(1, 2, 3, 100)))
    gate.receive(again.SerializeToString(), 1, "peer")
    assert got[1][-1] == Heartbeat(1, 2, 3, 100)


# --- common/balance.py: plan_moves ---


@st.composite
def cluster_states(
    draw: st.DrawFn,
) -> tuple[dict[int, int | None], dict[int, list[int]], list[int]]:
    nodes = sorted(draw(st.sets(st.integers(1, 9), min_size=1, max_size=5)))
    shards = draw(st.integers(1, 12))
    down = draw(st.sets(st.sampled_from(nodes), max_size=len(nodes) - 1))
    serving = [n for n in nodes if n not in down]
    candidates = {g: serving for g in range(shards + 1)}
    leaders = {g: draw(st.one_of(st.none(), st.sampled_from(serving))) for g in range(shards + 1)}
    return leaders, candidates, nodes


@settings(max_examples=300)
@given(state=cluster_states())
def test_plan_moves_spreads_leaders(
    state: tuple[dict[int, int | None], dict[int, list[int]], list[int]],
) -> None:
    leaders, candidates, nodes = state
    moves = plan_moves(leaders, candidates, nodes)
    after = dict(leaders)
    for g, src, dst in moves:
        assert after[g] == src != dst
        assert dst in candidates[g], f"shard {g} planned onto node {dst}, which does not serve it"
        after[g] = dst
    serving = sorted({n for c in candidates.values() for n in c})
    led = [g for g, n in after.items() if n is not None]
    assert all(after[g] in serving for g in led)
    load = Counter(after[g] for g in led)
    cap = math.ceil(len(leaders) / len(serving))
    assert max(load.values(), default=0) <= cap, (after, cap)
    for g in led:
        want = preferred_leader(g, nodes)
        if want in candidates[g] and load[want] < cap:
            assert after[g] == want, (
                f"shard {g}: preferred node {want} serves it, led by {after[g]}"
            )
    assert plan_moves(after, candidates, nodes) == []  # a balanced cluster stays put


def test_plan_moves_takes_a_stopped_shards_leadership_elsewhere() -> None:
    """Node 1 is preferred for shard 3 but its copy of shard 3 is stopped (corrupt):
    shard 3 stays with a node that serves it; the other shards go to their preferred."""
    leaders: dict[int, int | None] = {0: 2, 1: 1, 2: 2, 3: 2}
    candidates = {0: [1, 2, 3], 1: [1, 2, 3], 2: [1, 2, 3], 3: [2, 3]}
    moves = plan_moves(leaders, candidates, [1, 2, 3])
    after = {**leaders, **{g: dst for g, _, dst in moves}}
    assert after[3] in (2, 3)
    assert after[0] == 1 and after[1] == 2 and after[2] == 3
    assert max(Counter(after.values()).values()) <= 2


def test_plan_moves_keeps_a_preferred_leader_when_another_shard_is_over_the_cap() -> None:
    """Node 4 of 5 is down: shard 3 (preferred: 4) stays on node 3, where shard 2 is
    preferred. The cap (ceil(4 shards / 4 serving) = 1) must move shard 3, not shard 2."""
    leaders: dict[int, int | None] = {0: None, 1: None, 2: 1, 3: 3}
    candidates = {g: [1, 2, 3, 5] for g in leaders}
    moves = plan_moves(leaders, candidates, [1, 2, 3, 4, 5])
    after = {**leaders, **{g: dst for g, _, dst in moves}}
    assert after[2] == 3 and after[3] != 3


def test_a_shared_quota_never_hands_out_more_than_its_limit() -> None:
    """Consumers run together (one per shard) ask for the room left; what fetches
    running at once bring past the limit is not taken; what is given back is room
    again; the limit is reached by handler calls that ended, not by those taken."""
    quota = Quota(5)
    assert quota.room(32) == 5 and quota.room(3) == 3
    assert quota.take(4) == 4 and quota.take(4) == 1  # two fetches at once: 8 brought, 5 taken
    assert quota.room(32) == 0 and quota.take(2) == 0
    quota.give_back()  # an orderly run stopped before it: that one comes again
    assert quota.room(32) == 1
    quota.handled = 4
    assert not quota.reached()
    quota.handled = 5
    assert quota.reached()
    unlimited = Quota(0)
    assert unlimited.room(32) == 32 and unlimited.take(1000) == 1000 and not unlimited.reached()


# --- client/routing.py and the client's topic_update: renamed keywords ---


def test_routed_clients_old_group_keyword_warns_and_names_the_same_shard() -> None:
    with RoutedClient("127.0.0.1:1") as rc:
        with pytest.warns(FutureWarning, match="group= is now shard="):
            old = rc.client(group=2)
        assert old is rc.client(2) is rc.client(shard=2)
        assert old.shard == 2


def test_topic_updates_old_groups_keyword_warns_and_sends_the_same_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def sent(client: Client) -> list[tuple[int, int]]:
        op = cast(Op[Any], client.topic_update("create", "t", {2: 3}))
        return [(q.group, q.queues) for q in op.request.groups]

    with Client("127.0.0.1:1", shard=0) as client:
        monkeypatch.setattr(client, "_run", lambda op: op)  # built, not made
        with pytest.warns(FutureWarning, match=r"topic_update\(groups=...\) is now"):
            old = cast(Op[Any], client.topic_update("create", "t", groups={2: 3}))
        assert [(q.group, q.queues) for q in old.request.groups] == sent(client) == [(2, 3)]
    with RoutedClient("127.0.0.1:1") as rc:
        monkeypatch.setattr(rc.client(0), "_run", lambda op: op)
        with pytest.warns(FutureWarning, match="groups= is now shards="):
            made = cast(Op[Any], rc.topic_update("update", "t", groups={3: 1}))
        assert [(q.group, q.queues) for q in made.request.groups] == [(3, 1)]
