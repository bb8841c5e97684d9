"""The documented commands, run as written against a real local cluster.

Every command of the README's "Using a cluster" block and of the sh blocks of
docs/delayed-and-transactional.md runs in order, read from the Markdown (an edit
to the docs is an edit to this test), as its own `dledger` process, against a
real three-node cluster in a temporary directory: `/tmp/` in a path is the test's
directory. A placeholder such as `<id printed by put>` is filled from the output
of the last command that printed that field; a placeholder this test does not
know fails it. Each command must exit 0, and where it prints something to check,
the check below its name makes sure it did what it says (a put is readable, a
delayed put is delivered no earlier than its delay, a commit makes the message
visible and a rollback never does, ...). Exceptions, each with its reason where
it happens: `consume` tails until interrupted, so it runs until it printed and
committed what the topic holds, then gets SIGINT, as a user's Ctrl-C; Spark
commands skip without Java.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import takewhile
from pathlib import Path
from typing import TypeVar

import pyarrow.parquet as pq
import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, NodeStatus, StoredMessage
from dledger_commitlog.node.config import NodeConfig, parse_levels

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DELAYED_TX = ROOT / "docs" / "delayed-and-transactional.md"
COMMAND_TIMEOUT_S = 180.0  # a Spark job's first start on a busy 2-core machine
DEADLINE_S = 30.0  # for a condition a command's output promises
# `cluster up` keeps the default delay levels
LEVELS_MS = parse_levels(str(NodeConfig.__dataclass_fields__["delay_levels"].default))
T = TypeVar("T")


# ---------------------------------------------------------------- reading the docs


def sh_blocks(markdown: str) -> list[list[str]]:
    """The non-empty lines of every ```sh block, block by block."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", markdown, re.M | re.S)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n{heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else len(markdown)]


def readme_commands() -> list[str]:
    first, *_ = sh_blocks(section(README.read_text(), "## Using a cluster"))
    return first


def readme_scaleout_commands() -> list[str]:
    """The README's "Scaling out" block (the section's second): a cluster of 3 shards."""
    _, second, *_ = sh_blocks(section(README.read_text(), "## Using a cluster"))
    return second


def delayed_tx_commands() -> list[str]:
    return [line for block in sh_blocks(DELAYED_TX.read_text()) for line in block]


def test_the_docs_hold_commands_to_run() -> None:
    """The parsing above finds what the docs show (a change of their layout fails here)."""
    readme = readme_commands()
    assert readme[0].startswith(".venv/bin/dledger cluster up ") and len(readme) >= 15
    assert any(c.startswith(".venv/bin/dledger cluster down ") for c in readme)
    scaleout = readme_scaleout_commands()
    assert scaleout[0].startswith(".venv/bin/dledger cluster up ") and "--shards" in scaleout[0]
    docs = delayed_tx_commands()
    assert any("--delay-level" in c for c in docs) and any("tx rollback" in c for c in docs)


def test_the_delayed_tx_doc_has_no_command_outside_its_blocks() -> None:
    """A command shown only inline in the prose would not be run by this test."""
    prose = re.sub(r"^```.*?^```$", "", DELAYED_TX.read_text(), flags=re.M | re.S)
    assert re.findall(r"`dledger [^`]*`", prose) == []


def test_the_delayed_tx_doc_python_imports_work() -> None:
    """The Python examples need a cluster on 127.0.0.1:7001; their imports must hold."""
    for block in re.findall(r"^```python\n(.*?)^```$", DELAYED_TX.read_text(), re.M | re.S):
        imports = [line for line in block.splitlines() if line.startswith(("import ", "from "))]
        assert imports
        exec("\n".join(imports), {})


# ---------------------------------------------------------------- running them


def dledger_argv() -> list[str]:
    """The `dledger` console script of this environment (what `.venv/bin/dledger` is)."""
    script = Path(sys.executable).parent / "dledger"
    return [str(script)] if script.exists() else [sys.executable, "-m", "dledger_commitlog"]


def table_rows(text: str) -> list[dict[str, str]]:
    """The rows of a table the CLI printed (`commands.table`: cells 2+ spaces apart)."""
    header, *rows = (line for line in text.splitlines() if line.strip())
    names = re.split(r"\s{2,}", header.strip())
    out = []
    for row in rows:
        cells = re.split(r"\s{2,}", row.strip())
        assert len(cells) == len(names), f"not a table row: {row!r} under {header!r}"
        out.append(dict(zip(names, cells, strict=True)))
    return out


def option(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def option_values(args: list[str], name: str) -> list[str]:
    """Every value an option took (`--key a b --key c`: a, b, c)."""
    values: list[str] = []
    for i, arg in enumerate(args):
        if arg == name:
            values += takewhile(lambda a: not a.startswith("-"), args[i + 1 :])
    return values


def messages_of(client: Client, topic: str) -> list[StoredMessage]:
    """Every committed message of `topic`, queue by queue."""
    found: list[StoredMessage] = []
    for q in client.queue_offsets(topic):
        offset = q.min_offset
        while offset < q.max_offset:
            r = client.pull(topic, q.queue_id, offset, 256)
            found += r.messages
            offset = r.next_offset
    return found


def bodies_of(client: Client, topic: str) -> list[bytes]:
    return [m.body for m in messages_of(client, topic)]


def wait_for(what: str, condition: Callable[[], T | None]) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what}"
        time.sleep(0.1)
    return value


@dataclass
class Put:
    """A put or a half the docs made, and what the command printed about it."""

    topic: str
    body: str
    keys: list[str]
    tag: str | None
    printed: dict[str, str]
    later: bool  # a delayed put or a half: stored elsewhere, visible later or never


@dataclass
class DocRun:
    """One document's commands, run in order; what they printed, for placeholders and checks."""

    tmp: Path
    printed: dict[str, str] = field(default_factory=dict)  # field -> last value printed
    puts: list[Put] = field(default_factory=list)
    halves: list[Put] = field(default_factory=list)
    clusters: set[Path] = field(default_factory=set)
    cluster_dir: Path | None = None
    skipped: list[str] = field(default_factory=list)  # commands not run, with the reason

    def placeholders(self) -> dict[str, Callable[[], str]]:
        in_an_hour = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {
            "<id printed by put>": lambda: self.printed["msg_id"],
            "<transaction id>": lambda: self.printed["transaction_id"],
            "<half offset>": lambda: self.printed["half_offset"],
            "<a time within 3 days>": lambda: in_an_hour.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def argv(self, line: str) -> list[str]:
        known = self.placeholders()

        def fill(m: re.Match[str]) -> str:
            assert m.group(0) in known, f"{line}\n  {m.group(0)}: a placeholder to teach the test"
            return shlex.quote(known[m.group(0)]())

        words = shlex.split(re.sub(r"<[^<>]+>", fill, line), comments=True)
        assert words[0] in (".venv/bin/dledger", "dledger"), f"not a dledger command: {line}"
        return [w.replace("/tmp/", f"{self.tmp}/") for w in words[1:]]

    def run(self, line: str) -> None:
        args = self.argv(line)
        path = tuple(takewhile(lambda a: not a.startswith("-"), args))[:2]
        if path == ("consume",):
            self.consume(line, args)
            return
        if path[0] == "analytics" and shutil.which("java") is None:
            self.skipped.append(f"{line}: Spark needs Java 17+, not installed here")
            return
        done = subprocess.run(
            [*dledger_argv(), *args],
            check=False,
            cwd=self.tmp,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
        check = CHECKS.get(path) or CHECKS.get(path[:1])
        if check is not None:
            check(self, args, done.stdout)

    def client(self, shard: int = 1) -> Client:
        assert self.cluster_dir is not None, "a command needs a cluster before `cluster up`"
        return LocalCluster(self.cluster_dir).client(shard=shard)

    def consume(self, line: str, args: list[str]) -> None:
        """`consume` tails until interrupted: it must print every message its topic holds
        and commit its offsets past them; then it gets SIGINT, as a user's Ctrl-C, and
        exits 130 ('interrupted') instead of 0."""
        topic, group = option(args, "--topic"), option(args, "--group")
        expected = {p.printed["msg_id"]: p for p in self.puts if p.topic == topic and not p.later}
        assert expected, f"{line}: nothing put to {topic} before"
        # stderr to a file: a pipe nobody reads while it runs could fill and block it
        err_path = self.tmp / f"consume-{len(self.puts)}.stderr"
        err_file = err_path.open("w")
        proc = subprocess.Popen(
            [*dledger_argv(), *args],
            cwd=self.tmp,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(_lines(proc)), daemon=True)
        reader.start()

        def printed_all() -> bool:
            return all(any(msg_id in x for x in list(lines)) for msg_id in expected)

        def committed_all(c: Client) -> bool:
            queues = {int(p.printed["queue_id"]): p for p in expected.values()}
            offsets = {q: c.fetch_offset(group, topic, q).get(q, -1) for q in queues}
            return all(offsets[q] > int(p.printed["queue_offset"]) for q, p in queues.items())

        try:
            wait_for(f"{line} prints {sorted(expected)}", printed_all)
            with self.client() as c:
                wait_for(f"{line} commits its offsets", lambda: committed_all(c))
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError(
                    f"{line}: still running 30 s after SIGINT; stderr: {err_path.read_text()}"
                ) from None
            finally:
                err_file.close()
                reader.join(timeout=5)
        err = err_path.read_text()
        assert proc.returncode == 130 and err == "dledger: interrupted\n", (proc.returncode, err)
        for msg_id, p in expected.items():
            (shown,) = [x for x in lines if msg_id in x]
            assert shown.endswith(p.body) and f"{topic}/{p.printed['queue_id']}@" in shown


def _lines(proc: subprocess.Popen[str]) -> Iterator[str]:
    assert proc.stdout is not None
    for line in proc.stdout:
        yield line.rstrip("\n")


def _env() -> dict[str, str]:
    """This environment without settings that would point a command elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLEDGER_")}
    return env | {"PYTHONUNBUFFERED": "1"}


# ---------------------------------------------------------------- what each command says


def check_cluster_up(run: DocRun, args: list[str], out: str) -> None:
    run.cluster_dir = Path(option(args, "--dir"))
    run.clusters.add(run.cluster_dir)
    assert out.startswith("started nodes 1, 2, 3\n"), out  # a new directory: every node
    cluster = LocalCluster(run.cluster_dir)
    assert all(cluster.is_running(i) for i in cluster.specs)
    servers = Client.from_cluster_file(run.cluster_dir / "cluster.json").servers
    assert servers == [s.client for s in cluster]


def check_cluster_down(run: DocRun, args: list[str], out: str) -> None:
    cluster = LocalCluster(option(args, "--dir"))
    assert out.startswith("stopped the cluster in ") and cluster.specs
    assert not any(cluster.is_running(i) for i in cluster.specs)


def check_put(run: DocRun, args: list[str], out: str) -> None:
    (printed,) = table_rows(out)
    run.printed |= printed
    later = any(o in args for o in ("--delay-level", "--deliver-in", "--deliver-at"))
    tag = option(args, "--tag") if "--tag" in args else None
    keys = option_values(args, "--key")
    put = Put(option(args, "--topic"), option(args, "--body"), keys, tag, printed, later)
    assert printed["duplicate"] == "False" and int(printed["commitlog_offset"]) > 0
    run.puts.append(put)
    body = put.body.encode()
    if "shard" in printed:  # a cluster of several shards: the topic's route chose one
        with run.client(int(printed["shard"])) as c:
            routes = c.route(put.topic)
        assert int(printed["shard"]) in dict(routes.route(put.topic).shards), (routes, printed)
    with run.client(int(printed.get("shard", 1))) as c:
        if not later:
            assert c.get(msg_id=printed["msg_id"]).body == body
        elif "--delay-level" not in args:  # minutes or more ahead: stored, not delivered yet
            assert body not in bodies_of(c, put.topic)
        else:
            level = int(option(args, "--delay-level"))
            due_ms = int(printed["store_timestamp"]) + LEVELS_MS[level - 1]
            (got,) = wait_for(
                f"{put.body!r} delivered to {put.topic}",
                lambda: [m for m in messages_of(c, put.topic) if m.body == body],
            )
            assert got.store_timestamp_ms >= due_ms, "delivered early"


def check_get(run: DocRun, args: list[str], out: str) -> None:
    (put,) = [p for p in run.puts if p.printed["msg_id"] == option(args, "--msg-id")]
    doc = json.loads(out)
    assert (doc["topic"], doc["body"], doc["keys"]) == (put.topic, put.body, put.keys)
    assert doc["tags"] == put.tag
    assert doc["commitlog_offset"] == int(put.printed["commitlog_offset"])


def check_status(run: DocRun, args: list[str], out: str) -> None:
    nodes, members = out.split("\n\n")  # every node, then the members as the leader sees them
    rows = table_rows(nodes)
    assert len(rows) == 3 and [r["role"] for r in rows].count("leader") == 1, out
    head, _, rest = members.partition("\n")
    assert head == "members: 3 voters, 0 learner(s)", out
    check_member_list(run, args, rest)


def check_member_list(run: DocRun, args: list[str], out: str) -> None:
    rows = table_rows(out)
    assert [(r["member"], r["role"]) for r in rows] == [
        ("1", "voter"),
        ("2", "voter"),
        ("3", "voter"),
    ], out
    assert all(int(r["match"]) >= 0 and int(r["lag"]) >= 0 for r in rows), out  # the leader knows


def check_transfer(run: DocRun, args: list[str], out: str) -> None:
    target = int(option(args, "--to"))
    assert out == f"leader is now node {target}\n"
    with run.client() as c:
        statuses = [s for s in c.status_all() if isinstance(s, NodeStatus)]
    assert {s.node_id for s in statuses if s.role == "leader"} == {target}


def check_drain(run: DocRun, args: list[str], out: str) -> None:
    node = int(option(args, "--node"))
    assert out.endswith(f"node {node} is drained: it leads nothing and will not campaign\n"), out
    with run.client() as c:
        statuses = {s.node_id: s for s in c.status_all() if isinstance(s, NodeStatus)}
    assert statuses[node].drained and statuses[node].role == "follower", statuses


def check_rolling_restart(run: DocRun, args: list[str], out: str) -> None:
    steps, table = out.split("node  handed over")  # a line per step, then the table
    assert steps.count("caught up in") == 3, out
    rows = table_rows("node  handed over" + table)
    assert sorted(r["node"] for r in rows) == ["1", "2", "3"], out
    with run.client() as c:
        statuses = [s for s in c.status_all() if isinstance(s, NodeStatus)]
    assert len(statuses) == 3 and not any(s.drained for s in statuses), statuses


def check_pull(run: DocRun, args: list[str], out: str) -> None:
    topic, queue, offset = (
        option(args, "--topic"),
        option(args, "--queue"),
        option(args, "--offset"),
    )
    tags = option(args, "--tag-expr") if "--tag-expr" in args else "*"
    wanted = {t.strip() for t in tags.split("||")}
    expected = [
        p.printed["msg_id"]
        for p in run.puts
        if not p.later
        and (p.topic, p.printed["queue_id"]) == (topic, queue)
        and int(p.printed["queue_offset"]) >= int(offset)
        and (tags == "*" or p.tag in wanted)
    ]
    assert expected, "the documented pull shows a message put before it"
    table, footer = out.rstrip("\n").rsplit("\n", 1)
    assert [r["msg_id"] for r in table_rows(table)] == expected
    assert footer.startswith(f"next_offset {int(offset) + len(expected)} ")


def check_query(run: DocRun, args: list[str], out: str) -> None:
    topic, key = option(args, "--topic"), option(args, "--key")
    expected = {
        p.printed["msg_id"] for p in run.puts if not p.later and p.topic == topic and key in p.keys
    }
    assert expected and expected == {r["msg_id"] for r in table_rows(out)}


def check_clean_now(run: DocRun, args: list[str], out: str) -> None:
    rows = table_rows(out)
    assert len(rows) == 3 and all(r["deleted"].isdigit() for r in rows), out


def check_export(run: DocRun, args: list[str], out: str) -> None:
    files = sorted(Path(option(args, "--to")).rglob("*.parquet"))
    bodies = [b for f in files for b in pq.read_table(f, columns=["body"]).column(0).to_pylist()]
    assert {p.body.encode() for p in run.puts if not p.later} <= set(bodies)
    assert f"exported {len(bodies)} messages in {len(files)} files" in out


def check_analytics(run: DocRun, args: list[str], out: str) -> None:
    _, rest = out.split("\n", 1)  # a title line, then the table, then the chart's name
    rows = table_rows(rest.split("\nchart: ", 1)[0])
    assert {p.topic for p in run.puts} <= {r["topic"] for r in rows}, out
    if "--chart" in args:
        chart = run.tmp / option(args, "--chart")
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"chart: {chart.name}" in out


def check_put_half(run: DocRun, args: list[str], out: str) -> None:
    (printed,) = table_rows(out)
    run.printed |= printed
    half = Put(option(args, "--topic"), option(args, "--body"), [], None, printed, later=True)
    run.halves.append(half)
    with run.client() as c:  # a half is invisible until committed
        assert half.body.encode() not in bodies_of(c, half.topic)


def check_tx_end(run: DocRun, args: list[str], out: str) -> None:
    (printed,) = table_rows(out)
    run.printed |= printed
    (half,) = [h for h in run.halves if h.printed["transaction_id"] == printed["transaction_id"]]
    committed = args[1] == "commit"
    assert printed["outcome"] == ("committed" if committed else "rolled back")
    body = half.body.encode()
    with run.client() as c:
        if committed:
            wait_for(
                f"{half.body!r} visible in {half.topic}", lambda: body in bodies_of(c, half.topic)
            )
        else:
            assert body not in bodies_of(c, half.topic)


def check_topic_create(run: DocRun, args: list[str], out: str) -> None:
    topic = next(a for a in args[2:] if not a.startswith("-") and "/" not in a)
    spread = dict(
        (int(g), int(n)) for g, n in (x.split(":") for x in option(args, "--queues").split(","))
    )
    with run.client() as c:
        route = c.route(topic).route(topic)
    assert route.configured and dict(route.shards) == spread, route
    assert out.startswith(f"created {topic}: "), out


def check_topic_route(run: DocRun, args: list[str], out: str) -> None:
    rows = table_rows(out)
    with run.client() as c:
        routes = c.route()
    shown = {(r["topic"], int(r["shard"]), int(r["queues"])) for r in rows}
    assert shown and shown <= {(t, g, n) for t, r in routes.routes.items() for g, n in r.shards}
    for r in rows:  # each shard's leader as the node knows it
        assert int(r["leader"]) == routes.leaders[int(r["shard"])].leader_id, (r, routes)


def check_shard_status(run: DocRun, args: list[str], out: str) -> None:
    table, leads = out.rstrip("\n").rsplit("\n", 1)
    rows = table_rows(table)
    assert [r["shard"] for r in rows] == ["0", "1", "2", "3"], out
    for r in rows:  # one leader per shard, every node a member
        cells = [v for k, v in r.items() if k.startswith("node ")]
        assert len(cells) == 3 and sum(v.startswith("leader") for v in cells) == 1, out
    assert leads.startswith("leads: ")
    counts = [int(x.rsplit(": ", 1)[1]) for x in leads.removeprefix("leads: ").split(", ")]
    assert sum(counts) == 4, out


def check_shard_balance(run: DocRun, args: list[str], out: str) -> None:
    """Leaders spread: no node leads more than ceil(4 shards / 3 nodes) = 2."""
    leads = out.rstrip("\n").rsplit("\n", 1)[1]
    counts = [int(x.rsplit(": ", 1)[1]) for x in leads.removeprefix("leads: ").split(", ")]
    assert sum(counts) == 4 and max(counts) <= 2, out


def check_verify(run: DocRun, args: list[str], out: str) -> None:
    result = {r["check"]: r["result"] for r in table_rows(out)}
    assert result["ok"] == "True" and int(result["entries_checked"]) > 0, out


CHECKS: dict[tuple[str, ...], Callable[[DocRun, list[str], str], None]] = {
    ("cluster", "up"): check_cluster_up,
    ("cluster", "down"): check_cluster_down,
    ("put",): check_put,
    ("member", "list"): check_member_list,
    ("get",): check_get,
    ("status",): check_status,
    ("transfer-leader",): check_transfer,
    ("node", "drain"): check_drain,
    ("cluster", "rolling-restart"): check_rolling_restart,
    ("pull",): check_pull,
    ("query",): check_query,
    ("admin", "clean-now"): check_clean_now,
    ("export",): check_export,
    ("analytics",): check_analytics,
    ("tx", "put-half"): check_put_half,
    ("tx", "commit"): check_tx_end,
    ("tx", "rollback"): check_tx_end,
    ("verify",): check_verify,
    ("topic", "create"): check_topic_create,
    ("topic", "route"): check_topic_route,
    ("shard", "status"): check_shard_status,
    ("shard", "balance"): check_shard_balance,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "commands",
    [
        pytest.param(readme_commands, id="README"),
        pytest.param(readme_scaleout_commands, id="README-scaleout"),
        pytest.param(delayed_tx_commands, id="delayed-tx"),
    ],
)
def test_every_documented_command_runs_as_written(
    commands: Callable[[], list[str]], tmp_path: Path
) -> None:
    run = DocRun(tmp_path)
    try:
        for line in commands():
            run.run(line)
    finally:
        for directory in run.clusters:
            LocalCluster(directory).down()
    if run.skipped:
        pytest.skip("every other command ran; not run: " + "; ".join(run.skipped))
