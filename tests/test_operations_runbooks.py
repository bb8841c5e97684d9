"""docs/operations.md's runbooks, followed line by line against real node processes.

Each "## Runbook: ..." section's sh block runs in order, read from the Markdown (an
edit to a runbook is an edit to this test), in a temporary directory: `/tmp/` in
a path is the test's directory. A `dledger` line runs as its own process and must
exit 0; `kill`, `rm`, `mkdir` and `cp` lines run as written; a line ending in `&`
runs in the background until the test ends (`dledger serve` of the read replica,
whose config is the runbook's toml block, written when it starts). Placeholders
(`<id printed by put>`, `<pid of node 3>`, the replica's addresses, ...) are
filled from what the commands printed and from the cluster's files; one this test
does not know fails it.

From the first `cluster up` on, a writer puts a message every few milliseconds
through its own client and records each acknowledged one. At the end the last
`member list --json` must show the members the runbook promises, the writer must
still get puts acknowledged after the last command, and every acknowledged
message, the runbook's own puts included, must read back from the final group
with its body: nothing acknowledged is lost. Also: a local cluster with TLS and the
ACL grows and restarts with its new nodes.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dledger_commitlog.cli.launcher import LocalCluster, free_ports
from dledger_commitlog.client import Client, ClientError, PutResult
from tests.test_docs_examples import _env, dledger_argv, option, sh_blocks, table_rows

pytestmark = pytest.mark.slow

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
COMMAND_TIMEOUT_S = 180.0  # add-node waits for the new node to catch up (120 s at most)
WRITER_PAUSE_S = 0.01
_SHELL = ("kill", "rm", "mkdir", "cp")


def runbooks() -> dict[str, list[str]]:
    """Each runbook's name ("grow 3 -> 5") and the lines of its sh block."""
    text = OPERATIONS.read_text()
    out = {}
    for m in re.finditer(r"^## Runbook: (.+)$", text, re.M):
        end = text.find("\n## ", m.end())
        (block, *_) = sh_blocks(text[m.end() : end if end != -1 else len(text)])
        out[m.group(1)] = block
    return out


def replica_toml() -> str:
    (block,) = re.findall(r"^```toml\n(.*?)^```$", OPERATIONS.read_text(), re.M | re.S)
    return str(block)


# What each runbook leaves: member id -> role.
EXPECTED = {
    "grow 3 -> 5": {1: "voter", 2: "voter", 3: "voter", 4: "voter", 5: "voter"},
    "shrink 5 -> 3": {1: "voter", 2: "voter", 3: "voter"},
    "replace a dead node": {1: "voter", 2: "voter", 4: "voter"},
    "add a remote learner (read replica)": {1: "voter", 2: "voter", 3: "voter", 4: "learner"},
}


def test_the_doc_holds_the_runbooks_this_test_follows() -> None:
    books = runbooks()
    assert set(books) == set(EXPECTED)
    for name, lines in books.items():
        assert lines[0].startswith(".venv/bin/dledger cluster up --dir /tmp/c1"), name
        assert any(" member list " in f"{line} " and "--json" in line for line in lines), name
        for line in lines:
            assert line.split()[0] in (".venv/bin/dledger", *_SHELL), line
    assert "join = true" in replica_toml()


def run_dledger(args: list[str], cwd: Path, line: str) -> str:
    """Run `dledger ARGS` as its own process; what it printed (it must exit 0)."""
    done = subprocess.run(
        [*dledger_argv(), *args],
        check=False,
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


@dataclass
class Writer:
    """Puts a message every WRITER_PAUSE_S through its own client; records the acked."""

    cluster_file: Path
    acked: dict[str, PutResult] = field(default_factory=dict)  # body -> result
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="runbook-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with Client.from_cluster_file(self.cluster_file, timeout_s=10.0) as client:
            n = 0
            while not self._stop.is_set():
                body = f"w-{n}"
                n += 1
                try:
                    self.acked[body] = client.put("runbook", body.encode())
                except ClientError as exc:  # not acknowledged: may or may not be stored
                    self.failures.append(f"{body}: {type(exc).__name__}: {exc.message}")
                self._stop.wait(WRITER_PAUSE_S)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)


@dataclass
class Runbook:
    """One runbook's lines, run in order, and what they printed."""

    tmp: Path
    printed: dict[str, str] = field(default_factory=dict)
    puts: dict[str, str] = field(default_factory=dict)  # msg id -> body, the runbook's puts
    members: list[dict[str, object]] = field(default_factory=list)  # the last `member list`
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cluster_dir: Path | None = None
    writer: Writer | None = None
    replica: tuple[str, str] = ("", "")  # raft, client

    def __post_init__(self) -> None:
        raft_port, client_port = free_ports(2)
        self.replica = (f"127.0.0.1:{raft_port}", f"127.0.0.1:{client_port}")

    def cluster(self) -> LocalCluster:
        assert self.cluster_dir is not None, "a command needs a cluster before `cluster up`"
        return LocalCluster(self.cluster_dir)

    def placeholder(self, text: str) -> str:
        """What `<...>` in a runbook line stands for (AssertionError: unknown here)."""
        fixed = {
            "<id printed by put>": lambda: self.printed["msg_id"],
            "<replica raft address>": lambda: self.replica[0],
            "<replica client address>": lambda: self.replica[1],
        }
        if text in fixed:
            return fixed[text]()
        m = re.fullmatch(r"<(raft|client) address of node (\d+)>", text)
        if m is not None:
            spec = self.cluster().specs[int(m.group(2))]
            return spec.raft if m.group(1) == "raft" else spec.client
        m = re.fullmatch(r"<pid of node (\d+)>", text)
        if m is not None:
            pid = self.cluster().pid(int(m.group(1)))
            assert pid is not None, f"{text}: the node does not run"
            return str(pid)
        raise AssertionError(f"{text}: a placeholder to teach the test")

    def fill(self, text: str) -> str:
        text = re.sub(r"<[^<>]+>", lambda m: self.placeholder(m.group(0)), text)
        return text.replace("/tmp/", f"{self.tmp}/")

    def run(self, line: str) -> None:
        background = line.endswith("&")
        words = shlex.split(self.fill(line.removesuffix("&")), comments=True)
        if words[0] in _SHELL:
            subprocess.run(words, check=True, timeout=30.0)
            return
        args = words[1:]
        if background:
            self.start_background(args)
            return
        self.saw(args, run_dledger(args, self.tmp, line))

    def start_background(self, args: list[str]) -> None:
        config = Path(option(args, "--config"))
        if not config.exists():  # the runbook's toml block is this file
            config.write_text(self.fill(replica_toml()))
        argv = [*dledger_argv(), *args]
        with (config.parent / "serve.log").open("ab") as log:
            proc = subprocess.Popen(
                argv,
                cwd=config.parent,
                env=_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append(proc)

    def saw(self, args: list[str], out: str) -> None:
        """Record what a command printed; start the writer once there is a cluster."""
        path = tuple(a for a in args[:2] if not a.startswith("-"))
        if path == ("cluster", "up"):
            self.cluster_dir = Path(option(args, "--dir"))
            self.writer = Writer(self.cluster_dir / "cluster.json")
            self.writer.start()
        elif path == ("put",):
            (row,) = table_rows(out)
            self.printed |= row
            self.puts[row["msg_id"]] = option(args, "--body")
        elif path == ("member", "list") and "--json" in args:
            self.members = json.loads(out)["members"]
        elif path == ("get",):
            doc = json.loads(out)
            assert doc["body"] == self.puts[option(args, "--msg-id")], out
        elif path == ("cluster", "add-node") and "--json" in args:
            doc = json.loads(out)
            assert doc["role"] == ("learner" if "--learner" in args else "voter"), out

    def close(self) -> None:
        if self.writer is not None:
            self.writer.stop()
        for proc in self.background:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.cluster_dir is not None and (self.cluster_dir / "cluster.json").exists():
            LocalCluster(self.cluster_dir).down()


def stored_bodies(
    client: Client, topic: str, results: Iterable[PutResult]
) -> dict[tuple[int, int], bytes]:
    """The bodies stored at the queue offsets of `results`, read a queue at a time (a
    thousand Gets one by one took seconds of a test that only asks: is each there?)."""
    spans: dict[int, tuple[int, int]] = {}
    for r in results:
        lo, hi = spans.get(r.queue_id, (r.queue_offset, r.queue_offset))
        spans[r.queue_id] = (min(lo, r.queue_offset), max(hi, r.queue_offset))
    out: dict[tuple[int, int], bytes] = {}
    for queue_id, (first, last) in spans.items():
        at = first
        while at <= last:
            page = client.pull(topic, queue_id, at, max_messages=1024)
            assert page.next_offset > at, f"{topic}/{queue_id}@{at}: nothing stored"
            out |= {(queue_id, m.queue_offset): m.body for m in page.messages}
            at = page.next_offset
    return out


@pytest.fixture
def runbook(tmp_path: Path) -> Iterator[Runbook]:
    run = Runbook(tmp_path)
    try:
        yield run
    finally:
        run.close()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_runbook_does_what_it_says(name: str, runbook: Runbook) -> None:
    for line in runbooks()[name]:
        runbook.run(line)
    assert {int(str(m["id"])): m["role"] for m in runbook.members} == EXPECTED[name]
    writer = runbook.writer
    assert writer is not None
    after = len(writer.acked)
    deadline = time.monotonic() + 30.0
    while len(writer.acked) < after + 20:  # puts keep working after the last change
        assert time.monotonic() < deadline, f"no puts acknowledged: {writer.failures[-5:]}"
        time.sleep(0.05)
    writer.stop()
    with runbook.cluster().client(timeout_s=10.0) as client:
        stored = stored_bodies(client, "runbook", writer.acked.values())
        for body, result in list(writer.acked.items()):
            assert stored.get((result.queue_id, result.queue_offset)) == body.encode(), body
        for msg_id, body in runbook.puts.items():
            assert client.get(msg_id=msg_id).body == body.encode()


def test_a_secured_local_cluster_grows_and_restarts_with_its_new_nodes(tmp_path: Path) -> None:
    """TLS and the ACL on: add-node makes the new node's certificate from the cluster's
    CA and signs the changes with the admin's credentials; after `cluster down` and
    `up` every node comes back, the learner still a learner."""
    directory = str(tmp_path / "c1")

    def dledger(*args: str) -> str:
        return run_dledger(list(args), tmp_path, " ".join(args))

    try:
        dledger("cluster", "up", "--dir", directory, "--tls", "--acl")
        added = json.loads(dledger("cluster", "add-node", "--dir", directory, "--json"))
        learner = json.loads(
            dledger("cluster", "add-node", "--dir", directory, "--learner", "--json")
        )
        assert (added["id"], added["role"], learner["id"], learner["role"]) == (
            4,
            "voter",
            5,
            "learner",
        )
        assert (tmp_path / "c1" / "pki" / "node-5.pem").exists()
        dledger("cluster", "down", "--dir", directory)
        assert dledger("cluster", "up", "--dir", directory).startswith(
            "started nodes 1, 2, 3, 4, 5\n"
        )
        cluster_file = str(tmp_path / "c1" / "cluster.json")
        members = json.loads(dledger("member", "list", "--cluster", cluster_file, "--json"))
        roles = {m["id"]: m["role"] for m in members["members"]}
        assert roles == {1: "voter", 2: "voter", 3: "voter", 4: "voter", 5: "learner"}
        with Client.from_cluster_file(cluster_file, timeout_s=10.0) as client:
            result = client.put("secured", b"after the restart")
            assert client.get(msg_id=result.msg_id).body == b"after the restart"
    finally:
        if (tmp_path / "c1" / "cluster.json").exists():
            LocalCluster(tmp_path / "c1").down()
