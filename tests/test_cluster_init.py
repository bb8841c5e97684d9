"""`dledger cluster init` (cli/deploy.py): the files of a cluster on real hosts, and
what it refuses. No process starts here (tests/test_deploy_runbook.py runs a
cluster from these files): each test runs the command in this process, as the
console script does, and reads what it wrote.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.deploy import HostPorts, host_ports
from dledger_commitlog.client import Client
from dledger_commitlog.node.config import load_config

HOSTS = "10.0.0.1,10.0.0.2,10.0.0.3"


def init(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["cluster", "init", *args])
    return code, out.getvalue(), err.getvalue()


def files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_each_node_directory_holds_what_its_config_names(tmp_path: Path) -> None:
    d = tmp_path / "c"
    code, out, err = init("--dir", str(d), "--hosts", HOSTS, "--tls", "--acl", "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    for i, node in enumerate(doc["nodes"], 1):
        home = d / f"n{i}"
        cfg = load_config(home / "node.toml")
        assert (cfg.node_id, cfg.data_dir, cfg.client_address) == (i, "data", f"10.0.0.{i}:7001")
        assert [(p.raft, p.client) for p in cfg.peers] == [
            (f"10.0.0.{j}:7101", f"10.0.0.{j}:7001") for j in (1, 2, 3)
        ]
        assert cfg.listen_metrics == f"10.0.0.{i}:7201"
        named = [cfg.peer_secret_file, cfg.tls_ca, cfg.tls_cert, cfg.tls_key, cfg.acl_file]
        assert all(not Path(f).is_absolute() for f in named)
        # exactly the files its config names, each the operator's original
        assert sorted(files(home)) == sorted(["node.toml", *named])
        assert all((home / f).read_bytes() == (d / f).read_bytes() for f in named)
        assert node["start"] == (
            f"ssh 10.0.0.{i} 'cd /var/lib/dledger/n{i} && dledger serve --config node.toml'"
        )
    assert (d / "pki" / "ca.key").exists() and (d / "admin.credentials").exists()
    client = Client.from_cluster_file(d / "cluster.json")  # opens no connection yet
    assert client.servers == ["10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001"]


def test_a_host_may_name_its_client_port_and_the_others_follow() -> None:
    assert host_ports(["a:8001", "b", "[fd00::3]:9001"], 7001, None, None) == [
        HostPorts("a", 8001, 8101, 8201),
        HostPorts("b", 7001, 7101, 7201),
        HostPorts("[fd00::3]", 9001, 9101, 9201),
    ]
    assert host_ports(["a:8001", "b"], 7001, 7500, 9100) == [
        HostPorts("a", 8001, 7500, 9100),
        HostPorts("b", 7001, 7500, 9100),
    ]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--hosts", "10.0.0.1,10.0.0.1,10.0.0.2", "--tls", "--acl"], "'10.0.0.1' is given twice"),
        (
            ["--hosts", "a:7001,a:7101,b", "--tls", "--acl"],
            "nodes 1 and 2 would both listen on a:7101",
        ),
        (["--hosts", "10.0.0.300,b,c", "--tls", "--acl"], "neither an IP address nor a DNS name"),
        (["--hosts", "bad host,b,c", "--tls", "--acl"], "neither an IP address nor a DNS name"),
        (["--hosts", "a:0,b,c", "--tls", "--acl"], "'a:0': the port is not a number in 1..65535"),
        (["--hosts", "a:65500,b,c", "--tls", "--acl"], "run past 65535"),
        (["--hosts", "a,b", "--tls", "--acl"], "a cluster has 1, 3 or 5 nodes, not 2"),
        (["--hosts", HOSTS, "--nodes", "5", "--tls", "--acl"], "--nodes 5 but --hosts names 3"),
        (["--hosts", HOSTS], "node 1: listen.client 10.0.0.1:7001 is reachable from other"),
        (["--hosts", HOSTS, "--tls"], "are not both on"),
        (["--hosts", HOSTS, "--insecure", "--set", "tick_ms=0"], "need tick_ms > 0"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], error: str
) -> None:
    d = tmp_path / "c"
    code, out, err = init("--dir", str(d), *args)
    assert (code, out) == (2, "")
    (line,) = err.splitlines()
    assert line.startswith("dledger: error: ") and error in line, line
    assert not d.exists()


def test_a_directory_in_use_is_refused_unless_forced(tmp_path: Path) -> None:
    d = tmp_path / "c"
    five = "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5"
    assert init("--dir", str(d), "--hosts", five, "--tls", "--acl")[0] == 0
    before = files(d)
    code, _, err = init("--dir", str(d), "--hosts", HOSTS, "--tls", "--acl")
    assert (
        code == 2
        and err == f"dledger: error: --dir {d} is not empty (--force replaces an earlier init)\n"
    )
    assert files(d) == before
    (d / "notes.txt").write_text("mine")
    assert init("--dir", str(d), "--hosts", HOSTS, "--force")[0] == 2  # still no --tls --acl
    assert files(d) == {**before, "notes.txt": b"mine"}
    assert init("--dir", str(d), "--hosts", HOSTS, "--tls", "--acl", "--force")[0] == 0
    after = files(d)
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [
            "acl.toml",
            "admin.credentials",
            "cluster.json",
            "cluster.secret",
            "n1",
            "n2",
            "n3",
            "notes.txt",
            "pki",
        ]
    )
    assert after["cluster.secret"] != before["cluster.secret"]  # a new cluster
    assert after["pki/ca.pem"] != before["pki/ca.pem"]
    assert len(json.loads(after["cluster.json"])["nodes"]) == 3
