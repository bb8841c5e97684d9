"""docs/deploy.md's runbook, followed line by line: three "hosts" on one machine.

The "## Runbook: three hosts" sh block runs in order, read from the Markdown (an
edit to the runbook is an edit to this test). Host 10.0.0.i is 127.0.0.i (Linux
routes all of 127/8 to the loopback device, so each node binds its own address),
each host's file system a directory of its own (`HOST:/var/lib/dledger/n1` is
`<tmp>/hosts/HOST/var/lib/dledger/n1`), and `~/` the test's directory. Per line:

- `dledger cluster init`: run with free ports instead of the defaults (a shared
  machine may hold 7001) and small segments; what it prints must hold the
  runbook's `rsync` and `ssh` lines as they are written;
- `rsync -a SRC/ HOST:DST/`: a copy into that host's directory, modes kept;
- `ssh HOST 'cd DIR && dledger serve ...'`: the node, its own process started in
  that host's DIR as written, its output in a log; every node is stopped at the
  end, pass or fail, and the hosts' directories removed;
- `dledger status`: run until it shows one leader and two followers (or fails
  with the nodes' logs after a deadline);
- `put`, `get`, `pull`: each must exit 0; `get` shows the body put, `pull` the
  message at the queue and offset the put printed.

The nodes are processes of their own; the CLI's commands run in this process
(`cli.main`, the console script's code), which keeps the test within its seconds.

The runbook has TLS and the ACL on, so every hop of it is a TLS one with signed
calls. Also: a node whose config names an address its host does not have exits at
once with one line naming the address, having written nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.launcher import free_ports
from tests.conftest import SHARED_CONFIG
from tests.test_docs_examples import _env, dledger_argv, sh_blocks, table_rows

pytestmark = pytest.mark.slow

DEPLOY = Path(__file__).resolve().parent.parent / "docs" / "deploy.md"
DOC_HOSTS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
COMMAND_TIMEOUT_S = 60.0
ELECTION_S = 30.0  # three processes starting on a busy 2-core machine, then an election
STOP_S = 10.0
FOREIGN = "192.0.2.1"  # TEST-NET-1: no host has it


def runbook() -> list[str]:
    text = DEPLOY.read_text()
    start = text.index("\n## Runbook: three hosts\n")
    end = text.find("\n## ", start + 1)
    (block, *_) = sh_blocks(text[start:end])
    return block


def test_the_doc_holds_the_runbook_this_test_follows() -> None:
    lines = runbook()
    assert lines[0].startswith("dledger cluster init ") and "--tls --acl" in lines[0]
    assert [line.split()[0] for line in lines[1:7]] == ["rsync", "ssh"] * 3
    assert [shlex.split(line)[1] for line in lines[7:]] == ["status", "put", "get", "pull"]


@dataclass
class Hosts:
    """The runbook's run: its directory, each host's files, the nodes it started."""

    tmp: Path
    printed: dict[str, str] = field(default_factory=dict)  # what put printed
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # host -> node
    logs: dict[str, Path] = field(default_factory=dict)

    def local(self, line: str) -> str:
        """`line` on this machine: the doc's hosts are 127.0.0.x, `~/` the test's directory."""
        for i, doc_host in enumerate(DOC_HOSTS, 1):
            line = line.replace(doc_host, f"127.0.0.{i}")
        return line.replace("~/", f"{self.tmp}/")

    def root(self, host: str) -> Path:
        """Host `host`'s file system."""
        assert host in {f"127.0.0.{i}" for i in range(1, 4)}, host
        return self.tmp / "hosts" / host

    def on_host(self, host: str, path: str) -> Path:
        assert path.startswith("/"), path
        return self.root(host) / path.lstrip("/")

    def words(self, line: str) -> list[str]:
        def fill(m: re.Match[str]) -> str:
            return shlex.quote(self.printed[m.group(1)])

        return shlex.split(re.sub(r"<(\w+) printed by put>", fill, self.local(line)))

    def dledger(self, args: list[str], line: str) -> str:
        """Run `dledger ARGS` (the CLI's own code, in this process: the nodes are the
        processes here); what it printed (it must exit 0)."""
        code, out, err = dledger(args)
        assert code == 0, f"{line}\nexit {code}\n{out}{err}"
        return out

    def rsync(self, words: list[str]) -> None:
        assert words[:2] == ["rsync", "-a"] and len(words) == 4, words
        source, (host, _, path) = Path(words[2]), words[3].partition(":")
        shutil.copytree(source, self.on_host(host, path))  # modes kept (copy2)

    def ssh(self, words: list[str]) -> None:
        """`ssh HOST 'cd DIR && dledger serve ...'`: the node, started in DIR on HOST."""
        assert words[0] == "ssh" and len(words) == 3, words
        host = words[1]
        cd, remote, conj, program, *args = shlex.split(words[2])
        assert (cd, conj, program, args[0]) == ("cd", "&&", "dledger", "serve"), words
        self.logs[host] = self.tmp / f"node-{host}.log"
        with self.logs[host].open("ab") as log:
            self.nodes[host] = subprocess.Popen(
                [*dledger_argv(), *args],
                cwd=self.on_host(host, remote),
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def node_logs(self) -> str:
        return "\n".join(
            f"--- {host} (exit {self.nodes[host].poll()}):\n{log.read_text()[-3000:]}"
            for host, log in self.logs.items()
        )

    def stop(self) -> None:
        for proc in self.nodes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for proc in self.nodes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    run = Hosts(tmp_path.resolve())
    try:
        yield run
    finally:
        run.stop()
        shutil.rmtree(tmp_path / "hosts", ignore_errors=True)


def _init_options() -> list[str]:
    """Free ports instead of the defaults, and small segments (each node preallocates them)."""
    client, raft, metrics = free_ports(3)
    ports = ["--client-port", str(client), "--raft-port", str(raft), "--metrics-port", str(metrics)]
    sets = [x for k, v in SHARED_CONFIG.items() for x in ("--set", f"{k}={v}")]
    return ports + sets


def test_the_runbook_on_three_loopback_hosts(hosts: Hosts) -> None:
    lines = runbook()
    for line in lines:
        words = hosts.words(line)
        match words[0], words[1]:
            case "dledger", "cluster":
                out = hosts.dledger([*words[1:], *_init_options()], line)
                steps = {hosts.local(x) for x in lines if x.startswith(("rsync ", "ssh "))}
                assert steps <= {printed.strip() for printed in out.splitlines()}, out
            case "rsync", _:
                hosts.rsync(words)
            case "ssh", _:
                hosts.ssh(words)
            case "dledger", "status":
                wait_for_leader(hosts, words[1:], line)
            case "dledger", "put":
                (hosts.printed,) = table_rows(hosts.dledger(words[1:], line))
            case "dledger", "get":
                out = hosts.dledger(words[1:], line)
                assert re.search(r"^body\s+hello$", out, re.M), out
            case "dledger", "pull":
                out = hosts.dledger(words[1:], line)
                (row,) = table_rows(out.rsplit("\n", 2)[0])
                assert (row["msg_id"], row["body"]) == (hosts.printed["msg_id"], "hello"), out
            case _:
                raise AssertionError(f"a line this test does not know: {line}")
    assert all(proc.poll() is None for proc in hosts.nodes.values()), hosts.node_logs()


def wait_for_leader(hosts: Hosts, args: list[str], line: str) -> None:
    """`status` until it shows the three nodes, one leading and two following."""
    deadline = time.monotonic() + ELECTION_S
    last = ""
    while time.monotonic() < deadline:
        code, out, err = dledger(args)
        last = out + err
        if code == 0:
            roles = sorted(r["role"] for r in table_rows(out.split("\n\n")[0]))
            if roles == ["follower", "follower", "leader"]:
                return
        assert all(p.poll() is None for p in hosts.nodes.values()), hosts.node_logs()
        time.sleep(0.1)
    raise AssertionError(
        f"{line}: no leader in {ELECTION_S:g} s; last:\n{last}\n{hosts.node_logs()}"
    )


def dledger(args: list[str]) -> tuple[int, str, str]:
    """`dledger ARGS` in this process, in the environment the doc tests give a command
    (no DLEDGER_* settings): (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    kept = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("DLEDGER_")}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(args)
    finally:
        os.environ.update(kept)
    return code, out.getvalue(), err.getvalue()


def test_a_node_whose_address_is_not_this_hosts_exits_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        try:
            s.bind((FOREIGN, 0))
        except OSError:
            pass
        else:
            pytest.skip(f"this machine has {FOREIGN}")
    hosts = f"{FOREIGN},127.0.0.2,127.0.0.3"
    init = ["cluster", "init", "--dir", str(tmp_path / "c"), "--hosts", hosts, "--insecure"]
    code, out, err = dledger([*init, *_init_options()])
    assert code == 0, out + err
    home = tmp_path / "c" / "n1"
    done = subprocess.run(
        [*dledger_argv(), "serve", "--config", "node.toml"],
        check=False,
        cwd=home,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(
        rf"dledger: cannot listen for clients on {re.escape(FOREIGN)}:\d+: "
        rf"{re.escape(FOREIGN)} is not an address of this host \(.+\)",
        line,
    ), line
    assert not (home / "data").exists()  # found before the store opened
