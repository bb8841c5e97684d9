"""The `dledger` CLI: argument parsing, output shapes and exit codes, with a fake client."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import pytest

from dledger_commitlog.cli import admin, cluster_layout, commands, messages
from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.launcher import ClusterError
from dledger_commitlog.client import (
    NodeStatus,
    NotFound,
    PullResult,
    PutResult,
    Routes,
    StatusError,
    StoredMessage,
    Unavailable,
)
from dledger_commitlog.node.config import ConfigError, NodeConfig, Route


def stored(body: bytes, offset: int = 96) -> StoredMessage:
    return StoredMessage(
        topic="orders",
        queue_id=1,
        queue_offset=7,
        commitlog_offset=offset,
        msg_id="AB" * 16,
        body=body,
        keys=("k1",),
        tags="new",
        properties={"a": "b"},
        born_timestamp_ms=1,
        store_timestamp_ms=2,
        body_size=len(body),
        size=150,
        uniq_key="U" * 32,
        flag=0,
    )


def status(node_id: int, role: str) -> NodeStatus:
    zero: dict[str, Any] = dict.fromkeys(
        ("first_index", "last_index", "committed_index", "applied_index"), 0
    )
    zero |= dict.fromkeys(("committed_pos", "flushed_pos", "dispatched_pos", "last_chain_crc"), 0)
    return NodeStatus(
        f"h:{node_id}", node_id, role, 3, 1, "h:1", cluster="d", peers=(), flush_mode="sync", **zero
    )


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.error: Exception | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _record(self, name: str, *args: Any, **kw: Any) -> None:
        self.calls.append((name, args, kw))
        if self.error is not None:
            raise self.error

    def put(self, topic: str, body: bytes | str, **kw: Any) -> PutResult:
        self._record("put", topic, body, **kw)
        return PutResult("AB" * 16, 96, 1, 7, 1700000000000, False)

    def get(self, **kw: Any) -> StoredMessage:
        self._record("get", **kw)
        return stored(b"\xff\xfe" if kw["offset"] == 1 else "héllo".encode())

    def pull(self, *args: Any) -> PullResult:
        self._record("pull", *args)
        return PullResult((stored(b"a"), stored(b"b", 200)), 9, 0, 9)

    def query(self, *args: Any) -> list[StoredMessage]:
        self._record("query", *args)
        return [stored(b"q")]

    def status_all(self, **kw: Any) -> list[NodeStatus | StatusError]:
        self._record("status_all", **kw)
        return [status(1, "leader"), StatusError("h:2", Unavailable("refused", code="UNAVAILABLE"))]

    def transfer_leadership(self, *args: Any) -> int:
        self._record("transfer_leadership", *args)
        return 2

    def route(self, topic: str = "") -> Routes:
        """A single-shard cluster's answer (a put asks which shard its topic's queue is in)."""
        return Routes(1, 4, {}, {}, 0)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    for module in (messages, admin):  # the modules whose commands open clients
        monkeypatch.setattr(module, "make_client", lambda args, shard=None: client)
    return client


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_put_json_shape_and_arguments(fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["put", "--servers", "h:1", "--topic", "orders", "--key", "k1", "k2", "--key", "k3"]
    argv += ["--tag", "new", "--property", "a=b", "c=d=e", "--body", "hi", "--json"]
    code, out, _ = run(argv, capsys)
    assert code == 0
    doc = json.loads(out)
    assert set(doc) >= {"msg_id", "commitlog_offset", "queue_id", "queue_offset", "store_timestamp"}
    ((name, args, kw),) = fake.calls
    assert (name, args) == ("put", ("orders", "hi"))
    assert kw["keys"] == ["k1", "k2", "k3"] and kw["properties"] == {"a": "b", "c": "d=e"}
    assert kw["tags"] == "new" and kw["queue_id"] is None and kw["uniq_key"] is None


def test_put_body_file(
    fake: FakeClient, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "b.bin").write_bytes(b"\x00\x01")
    code, out, _ = run(["put", "--topic", "t", "--body-file", str(tmp_path / "b.bin")], capsys)
    assert code == 0 and fake.calls[0][1] == ("t", b"\x00\x01")
    assert "commitlog_offset" in out.splitlines()[0]  # a table: header line, then values
    code, _, err = run(["put", "--topic", "t", "--body-file", str(tmp_path / "no")], capsys)
    assert code == 2 and err.startswith("dledger: error: --body-file") and err.count("\n") == 1


def test_put_later_forms(fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    """--deliver-in is a time from now, --deliver-at a time (ISO 8601 with a zone, or ms)."""
    put = ["put", "--topic", "t", "--body", "x"]
    before_ms = int(time.time() * 1000)
    assert run([*put, "--deliver-in", "10m"], capsys)[0] == 0
    after_ms = int(time.time() * 1000)
    kw = fake.calls[-1][2]
    assert before_ms + 600_000 <= kw["deliver_at_ms"] <= after_ms + 600_000
    assert kw["delay_level"] == 0
    assert run([*put, "--deliver-at", "2031-02-03T04:05:06+01:00"], capsys)[0] == 0
    assert fake.calls[-1][2]["deliver_at_ms"] == 1927854306000
    assert run([*put, "--deliver-at", "1927854306000"], capsys)[0] == 0
    assert fake.calls[-1][2]["deliver_at_ms"] == 1927854306000
    assert run([*put, "--delay-level", "3"], capsys)[0] == 0
    assert fake.calls[-1][2]["delay_level"] == 3 and fake.calls[-1][2]["deliver_at_ms"] == 0
    calls = len(fake.calls)
    for bad, says in [
        (["--deliver-in", "10x"], "is not a duration like 90s"),
        (["--deliver-in", "10m 5s"], "is not a duration like 90s"),
        (["--deliver-in", "10m", "--delay-level", "1"], "not allowed with argument"),
        (["--deliver-in", "10m", "--deliver-at", "1927854306000"], "not allowed with argument"),
    ]:
        with pytest.raises(SystemExit) as info:
            cli.main([*put, *bad])
        assert info.value.code == 2 and says in capsys.readouterr().err
    assert len(fake.calls) == calls  # nothing was sent


def test_get_bodies_text_or_base64(fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["get", "--offset", "96", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["body"] == "héllo" and "body_encoding" not in doc
    assert doc["keys"] == ["k1"] and doc["properties"] == {"a": "b"}
    code, out, _ = run(["get", "--offset", "1", "--json"], capsys)
    doc = json.loads(out)
    assert doc["body"] == "//4=" and doc["body_encoding"] == "base64"
    code, out, _ = run(["get", "--msg-id", "AB", "--linearizable"], capsys)
    assert fake.calls[-1][2] == {"msg_id": "AB", "offset": None, "linearizable": True}
    assert "héllo" in out


def test_pull_and_query(fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["pull", "--topic", "orders", "--queue", "1", "--offset", "5", "--max", "2"]
    code, out, _ = run([*argv, "--tag-expr", "a || b", "--wait-ms", "100", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and [m["body"] for m in doc["messages"]] == ["a", "b"]
    assert doc["next_offset"] == 9 and fake.calls[-1][1] == ("orders", 1, 5, 2, "a || b", 100)
    code, out, _ = run(argv, capsys)
    assert out.splitlines()[0].split()[:3] == ["queue", "q_offset", "cl_offset"]
    code, out, _ = run(["query", "--topic", "t", "--key", "k", "--begin", "5", "--json"], capsys)
    assert json.loads(out)["messages"][0]["body"] == "q"
    assert list(fake.calls[-1][1]) == ["t", "k", 5, 0, 32]


def test_status_and_transfer(fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["status", "--json"], capsys)
    nodes = json.loads(out)["nodes"]
    assert code == 0 and {"node_id", "role", "term", "leader"} <= set(nodes[0])
    assert nodes[0]["leader"] == 1 and nodes[1] == {
        "address": "h:2",
        "error": "refused",
        "code": "UNAVAILABLE",
    }
    code, out, _ = run(["status"], capsys)
    assert out.splitlines()[0].split()[:3] == ["node", "address", "role"] and "refused" in out
    code, out, _ = run(["transfer-leader", "--to", "2", "--json"], capsys)
    assert json.loads(out) == {"leader_id": 2} and fake.calls[-1][1] == (2, 5000)


def test_server_errors_are_one_line_exit_1(
    fake: FakeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.error = NotFound("no message at offset 5", code="NOT_FOUND", address="h:1")
    code, out, err = run(["get", "--offset", "5"], capsys)
    assert (code, out) == (1, "")
    assert err == "dledger: NOT_FOUND (h:1): no message at offset 5\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["get"],  # neither --msg-id nor --offset
        ["get", "--msg-id", "A", "--offset", "1"],
        ["put", "--topic", "t"],  # no body
        ["put", "--topic", "t", "--body", "x", "--property", "novalue"],
        ["pull", "--topic", "t", "--queue", "-1", "--offset", "0"],
        ["serve", "--flush-mode", "maybe"],
        ["cluster"],
        ["no-such-command"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_no_servers_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLEDGER_SERVERS", raising=False)
    monkeypatch.delenv("DLEDGER_CLUSTER", raising=False)
    code, _, err = run(["status"], capsys)
    assert code == 2 and "--cluster FILE or --servers" in err
    code, _, err = run(["status", "--cluster", "/nonexistent/cluster.json"], capsys)
    assert code == 2 and "not a readable cluster file" in err


def test_make_client_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["status", "--servers", "a:1, b:2", "--cluster-name", "x"])
    c = commands.make_client(args)
    assert c.servers == ["a:1", "b:2"] and c.cluster == "x"
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"nodes": [{"id": 1, "client": "c:3"}]}))
    monkeypatch.setenv("DLEDGER_CLUSTER", str(path))
    assert commands.make_client(parser.parse_args(["status"])).servers == ["c:3"]


def test_serve_builds_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dledger_commitlog.process import server

    seen: list[NodeConfig] = []
    monkeypatch.setattr(server, "run", seen.append)
    toml = tmp_path / "node.toml"
    toml.write_text('node_id = 1\ndata_dir = "d"\n[raft]\ntick_ms = 30\n')
    peers = [f"--peer={i}=127.0.0.1:710{i}/127.0.0.1:700{i}" for i in (1, 2, 3)]
    argv = ["serve", "--config", str(toml), *peers, "--node-id", "2", "--election-ticks", "7"]
    code, _, _ = run([*argv, "--flush-mode", "async", "--cluster-name", "c9"], capsys)
    (config,) = seen
    assert code == 0 and config.node_id == 2 and config.tick_ms == 30
    assert config.election_ticks == 7 and config.flush_mode == "async" and config.cluster == "c9"
    assert [p.client for p in config.peers] == [
        "127.0.0.1:7001",
        "127.0.0.1:7002",
        "127.0.0.1:7003",
    ]
    code, _, err = run(["serve", "--config", str(toml)], capsys)  # no peers anywhere
    assert code == 2 and err.startswith("dledger: error: missing setting 'peers'")


def test_serve_reads_a_retired_setting_with_a_warning_that_names_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The gRPC stack of either port is no longer a setting: a config file or a flag
    that still names one starts the node, with one warning each that says so."""
    from dledger_commitlog.process import server

    seen: list[NodeConfig] = []
    monkeypatch.setattr(server, "run", seen.append)
    toml = tmp_path / "node.toml"
    toml.write_text('node_id = 1\ndata_dir = "d"\n[listen]\nclient_transport = "grpcio"\n')
    argv = ["serve", "--config", str(toml), "--peer=1=127.0.0.1:7101/127.0.0.1:7001"]
    assert run([*argv, "--raft-transport", "grpcio"], capsys)[0] == 0
    assert seen.pop().node_id == 1
    warned = [r.getMessage() for r in caplog.records if "no longer read" in r.getMessage()]
    assert len(warned) == 2
    assert warned[0].startswith("listen.client_transport is no longer read")
    assert warned[1].startswith("raft.transport is no longer read")
    toml.write_text('node_id = 1\ndata_dir = "d"\n[listen]\nclient_stack = "h2"\n')
    code, _, err = run(argv, capsys)
    assert code == 2 and "unknown setting listen.client_stack" in err


def test_serve_offers_every_node_setting() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(
        [
            "serve",
            "--refuse-ratio",
            "0.9",
            "--preferred-leader",
            "2",
            "--tls-ca",
            "ca.pem",
            "--insecure",
        ]
    )
    for f in dataclasses.fields(NodeConfig):
        # options of their own; `shard` is a per-shard config's, set by the process
        if f.name not in ("peers", "cluster", "tls_ca", "routes", "shard"):
            assert hasattr(args, f"cfg_{f.name}"), f.name
    assert args.cfg_refuse_ratio == 0.9 and args.cfg_preferred_leader == 2
    assert args.tls_ca == "ca.pem"
    assert args.cfg_insecure is True
    peers = [f"--peer={i}=127.0.0.1:710{i}/127.0.0.1:700{i}" for i in (1, 2, 3)]
    args = parser.parse_args(
        ["serve", *peers, "--node-id", "1", "--data-dir", "d", "--route", "4=127.0.0.1:7404"]
    )
    assert cli.serve_config(args).routes == (Route(4, "127.0.0.1:7404"),)
    args = parser.parse_args(["serve", "--route", "four=127.0.0.1:1"])
    with pytest.raises(ConfigError, match=r"route 'four=127\.0\.0\.1:1' is not ID=RAFT_HOST:PORT"):
        cli.serve_config(args)


_SERVE_LOADS = """
import sys
from dledger_commitlog.cli.main import main
assert main(["serve", "--config", sys.argv[1]]) == 2  # through `serve`, up to its config
import dledger_commitlog.process.server
print(" ".join(sorted(sys.modules)))
"""


def test_a_node_process_loads_neither_the_client_nor_the_other_commands(tmp_path: Path) -> None:
    """`dledger serve` (every node's process) skips what only the other commands use:
    at about 0.13 s of CPU per node, the client, the console and the plugins were a
    quarter of a node's start-up."""
    done = subprocess.run(
        [sys.executable, "-c", _SERVE_LOADS, str(tmp_path / "missing.toml")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "dledger_commitlog.process.server" in loaded
    others = [f"dledger_commitlog.cli.{m}" for m in cli.COMMAND_MODULES]
    unwanted = ("dledger_commitlog.client", "dledger_commitlog.console", "analytics", "chaos")
    assert [m for m in loaded if m in others or m.startswith(unwanted)] == []


def test_cluster_set_values_and_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.node_settings([("tick_ms", "20"), ("force_clean_ratio", "0.5")]) == {
        "tick_ms": 20,
        "force_clean_ratio": 0.5,
    }
    with pytest.raises(commands.UsageError, match="not a node setting"):
        commands.node_settings([("nope", "1")])
    with pytest.raises(commands.UsageError, match="tick_ms=x"):
        commands.node_settings([("tick_ms", "x")])

    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("--now", action="store_true")

    @commands.command("admin test-only", "test only", configure)
    def clean(args: argparse.Namespace) -> int:
        print("cleaned", args.now, args.json)
        return 0

    try:
        assert cli.main(["admin", "test-only", "--now", "--json"]) == 0
        assert capsys.readouterr().out == "cleaned True True\n"
        with pytest.raises(ValueError, match="twice"):
            commands.command("admin test-only", "again")(clean)
    finally:
        del commands._REGISTRY[("admin", "test-only")]


def test_free_ports_avoid_the_ephemeral_range() -> None:
    """A cluster's ports must not be ones the kernel hands to bind(0) or to outgoing
    connections (a fault proxy on 127.0.0.1:0 once took a node's metrics port)."""
    low, high = cluster_layout.ephemeral_range()
    if low <= 10_000 and high >= 65_535:
        pytest.skip(f"the ephemeral range {low}-{high} leaves no other port")
    with socket.create_server(("127.0.0.1", 0)) as s:  # the premise: bind(0) draws from it
        assert low <= s.getsockname()[1] <= high
    ports = cluster_layout.free_ports(60)
    assert len(set(ports)) == 60
    assert all(p >= 10_000 and not low <= p <= high for p in ports), (low, high, ports)


def test_free_ports_skip_ports_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Among 30 candidate ports of which 20 are held, exactly the other 10 are free."""
    block = _free_block(30)
    monkeypatch.delenv(cluster_layout.PORTS_ENV, raising=False)  # parallel workers set it
    monkeypatch.setattr(cluster_layout, "_MIN_PORT", block[0])
    monkeypatch.setattr(cluster_layout, "ephemeral_range", lambda: (block[-1] + 1, 65_535))
    held = [socket.create_server(("127.0.0.1", p)) for p in block[::3] + block[1::3]]
    try:
        assert sorted(cluster_layout.free_ports(10)) == block[2::3]
        with pytest.raises(ClusterError, match="only 10 of 11 ports are free"):
            cluster_layout.free_ports(11)
    finally:
        for s in held:
            s.close()


def test_dledger_ports_narrows_the_choice_and_a_bad_value_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    block = _free_block(30)
    monkeypatch.setenv(cluster_layout.PORTS_ENV, f"{block[0]}-{block[-1]}")
    ports = cluster_layout.free_ports(30)
    assert sorted(ports) == block
    with pytest.raises(ClusterError, match="only 30 of 31 ports are free"):
        cluster_layout.free_ports(31)
    for bad in ("20000", "x-y", "30000-20000", "80-90"):
        monkeypatch.setenv(cluster_layout.PORTS_ENV, bad)
        with pytest.raises(ClusterError, match="DLEDGER_PORTS"):
            cluster_layout.free_ports(1)


def _free_block(size: int) -> list[int]:
    """`size` consecutive ports below the ephemeral range, all free right now."""
    low, _ = cluster_layout.ephemeral_range()
    for base in range(20_000, max(20_001, low - size), 97):
        block = list(range(base, base + size))
        try:
            for port in block:
                socket.create_server(("127.0.0.1", port)).close()
        except OSError:
            continue
        return block
    pytest.skip("no block of free ports below the ephemeral range")


def test_local_cluster_layout_round_trips(tmp_path: Path) -> None:
    from dledger_commitlog.cli.launcher import LocalCluster, node_toml
    from dledger_commitlog.node.config import load_config

    extra = {"tick_ms": 20, "force_clean_ratio": 0.5, "preferred_leader": 2}
    lc = LocalCluster(tmp_path / "c", base_port=30000, flush_mode="async", extra_config=extra)
    assert [s.client for s in lc] == ["127.0.0.1:30000", "127.0.0.1:30001", "127.0.0.1:30002"]
    assert lc.specs[3].raft == "127.0.0.1:30102" and lc.specs[3].metrics == "127.0.0.1:30202"
    for i, config in lc.configs.items():
        path = tmp_path / f"{i}.toml"
        path.write_text(node_toml(config))
        assert load_config(path) == config and config.flush_mode == "async"
    lc._write_layout()
    doc = json.loads((tmp_path / "c/cluster.json").read_text())
    assert [sorted(n) for n in doc["nodes"]] == [
        ["client", "data_dir", "id", "metrics", "pid", "raft"]
    ] * 3
    again = LocalCluster(tmp_path / "c")  # a stopped cluster keeps its ports and settings
    assert again.configs == lc.configs and again.pid(1) is None
    for bad in ({"node_id": 3}, {"tick_ms": 0}):
        with pytest.raises(ValueError):
            LocalCluster(tmp_path / "d", extra_config=bad)
    with pytest.raises(ValueError, match="1, 3 or 5"):
        LocalCluster(tmp_path / "e", nodes=2)


def test_a_saved_cluster_this_version_refuses_can_still_be_stopped(tmp_path: Path) -> None:
    """A cluster.json written with settings now refused (4 MiB segments with 4 MiB
    messages, as `make run` once used) loads for status and down; starting it says why."""
    from dledger_commitlog.cli.launcher import LocalCluster
    from dledger_commitlog.node.config import ConfigError

    LocalCluster(tmp_path / "c", base_port=31000)._write_layout()
    path = tmp_path / "c" / "cluster.json"
    doc = json.loads(path.read_text())
    doc["extra_config"] = {"data_segment_bytes": 4 << 20}
    path.write_text(json.dumps(doc))
    old = LocalCluster(tmp_path / "c")
    old.down()  # nothing runs: a no-op, and no error
    assert all(not old.is_running(i) for i in old.specs)
    with pytest.raises(ConfigError, match=r"cluster\.json: store\.data_segment_bytes 4194304"):
        old.up()
    with pytest.raises(ConfigError, match="max_message_bytes of at most 4161263"):
        old.start(1)


@pytest.mark.slow
def test_cluster_up_restarts_the_nodes_that_are_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cluster up` on a cluster with a killed node starts that node, leaves the running
    ones alone (same pids) and says which it started; other settings are refused."""
    from dledger_commitlog.cli.launcher import LocalCluster

    d = str(tmp_path / "c")
    try:
        code, out, _ = run(["cluster", "up", "--dir", d, "--json"], capsys)
        assert code == 0 and json.loads(out)["started"] == [1, 2, 3]
        before = {n["id"]: n["pid"] for n in json.loads(out)["nodes"]}
        LocalCluster(d).kill(2)
        code, out, _ = run(["cluster", "up", "--dir", d], capsys)
        assert code == 0 and out.splitlines()[0] == "started node 2 (1, 3 were running)"
        after = {i: LocalCluster(d).pid(i) for i in before}
        assert after[1] == before[1] and after[3] == before[3]
        assert after[2] is not None and after[2] != before[2]
        code, out, _ = run(["cluster", "up", "--dir", d], capsys)
        assert code == 0 and out.startswith("started none: every node was running\n")
        code, _, err = run(["cluster", "up", "--dir", d, "--set", "tick_ms=20"], capsys)
        assert code == 1 and "node 1 runs" in err and "with other settings" in err
        assert {i: LocalCluster(d).pid(i) for i in before} == after  # nothing was touched
    finally:
        assert cli.main(["cluster", "down", "--dir", d]) == 0


@pytest.mark.slow
def test_transfer_leader_to_the_leader_is_done_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`transfer-leader --to N` where N leads already says so instead of timing out
    (the README's `--to 2` hit that whenever node 2 had won the first election)."""
    from dledger_commitlog.cli.launcher import LocalCluster

    with LocalCluster(tmp_path / "c") as cluster:
        cluster.up()
        leader = cluster.wait_for_leader()
        argv = ["transfer-leader", "--cluster", str(cluster.cluster_file), "--to", str(leader)]
        code, out, err = run([*argv, "--timeout", "3"], capsys)
        assert (code, out, err) == (0, f"leader is now node {leader}\n", "")
        assert cluster.wait_for_leader() == leader
