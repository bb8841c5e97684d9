"""docs/http-api.md's curl examples, run as written against real clusters.

Every line of the document's `sh` blocks runs, in order, in one bash process (the
examples share shell variables: `$API`, `$MSG_ID`, `$MEMBER`), with three
substitutions: `/tmp/` is the test's directory, `.venv/bin/dledger` this
environment's `dledger`, and the documented ports 7480 and 7481 free ones. Each
command must exit 0, and what it prints must be what the document says it is (a
put's result, the message read back, the duplicate of an idempotent put, the
member's acks, each refusal's status code and field). The clusters and consoles
the document starts are stopped at the end, pass or fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.cli.cluster_layout import free_ports
from dledger_commitlog.cli.launcher import LocalCluster
from tests.console_helpers import ROOT, console_env

pytestmark = pytest.mark.slow

DOC = ROOT / "docs" / "http-api.md"
PORTS = ("7480", "7481")
RUN_TIMEOUT_S = 240.0


def doc_commands() -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```$", DOC.read_text(), re.M | re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_doc_shows_every_endpoint() -> None:
    text = "\n".join(doc_commands())
    for needed in (
        "/topics/orders/messages?key=",
        "Idempotency-Key",
        "/messages/$MSG_ID",
        "/raw",
        "queue=0&offset=0",
        '"$API/cluster"',
        '"$API/topics"',
        '"$API/events"',
        "/groups/billing/members",
        "/ack",
        "-X DELETE",
        "/trace",
        "/history",
        "/backlog",
        "/transfer-leader",
        "/shards/balance",
        "/cluster/clean-now",
        "-u ",
    ):
        assert needed in text, needed


def script(tmp: Path, commands: list[str]) -> str:
    ports = dict(zip(PORTS, map(str, free_ports(len(PORTS))), strict=True))
    dledger = f"{sys.executable} -m dledger_commitlog"
    lines = []
    for i, command in enumerate(commands):
        line = command.replace("/tmp/", f"{tmp}/").replace(".venv/bin/dledger", dledger)
        for documented, free in ports.items():
            line = line.replace(documented, free)
        lines += [f"printf '\\n@@cmd {i}\\n'", line, "printf '\\n@@rc %s\\n' $?"]
    return "\n".join(lines) + "\n"


def outputs(text: str) -> Iterator[tuple[int, str, int]]:
    """(command index, what it printed, exit code) of each command the script ran."""
    for m in re.finditer(r"^@@cmd (\d+)\n(.*?)\n@@rc (\d+)$", text, re.M | re.S):
        yield int(m.group(1)), m.group(2), int(m.group(3))


def test_the_docs_curl_examples_run_as_written(tmp_path: Path) -> None:
    commands = doc_commands()
    proc = subprocess.Popen(
        ["bash", "-c", script(tmp_path, commands)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=console_env(),
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stop_leftovers(tmp_path)
    ran = list(outputs(out))
    assert [i for i, _, _ in ran] == list(range(len(commands))), out
    for i, printed, code in ran:
        assert code == 0, f"{commands[i]}\nexited {code}:\n{printed}"
    check(tmp_path, [(commands[i], printed) for i, printed, _ in ran])


def stop_leftovers(tmp: Path) -> None:
    """Stop what the document started, should a failure have cut it short."""
    for name in ("h1", "h2"):
        if (tmp / name / "cluster.json").exists():
            LocalCluster(tmp / name).down()


def doc_of(printed: str) -> Any:
    return json.loads(printed.strip().splitlines()[-1])


def check(tmp: Path, ran: list[tuple[str, str]]) -> None:
    """What each documented command printed is what the document says."""

    def find(*parts: str) -> list[Any]:
        return [doc_of(out) for cmd, out in ran if all(p in cmd for p in parts)]

    (put,) = find("--data-binary 'hello'")
    assert put["topic"] == "orders" and put["duplicate"] is False and len(put["msg_id"]) == 32
    once, twice = find("Idempotency-Key: order-42-v1")
    assert once["duplicate"] is False
    assert twice["duplicate"] is True and twice["msg_id"] == once["msg_id"]
    (message,) = find('curl -s "$API/messages/$MSG_ID"')
    assert (message["body"], message["tags"], message["keys"]) == ("paid", "paid", ["o-1"])
    assert (tmp / "h1" / "body.bin").read_bytes() == b"paid"
    (by_key,) = find('curl -s "$API/topics/orders/messages?key=o-1"')
    assert sorted(m["body"] for m in by_key["messages"]) == ["hello", "paid"]
    (by_offset,) = find("queue=0&offset=0")
    assert by_offset["messages"] and by_offset["next_offset"] >= 1
    (cluster,) = find('curl -s "$API/cluster"')
    assert cluster["shards"][0]["leader"] is not None
    (events,) = [out for cmd, out in ran if '"$API/events"' in cmd]
    assert events.splitlines()[-1].startswith("event: snapshot"), events
    (topics,) = find('curl -s "$API/topics"')
    assert {"orders", "payments"} <= {t["topic"] for t in topics["topics"]}
    (loop,) = [out for cmd, out in ran if cmd.startswith("for i in 1 2 3")]
    acked = [json.loads(line)["acked"] for line in loop.splitlines() if line.strip()]
    assert sum(acked) >= 3, loop  # the three orders messages, at least once
    (group,) = find('"$API/groups/billing"')
    assert group["shards"][0]["members"], group
    (trace,) = find("/trace")
    assert trace["events"][0]["kind"] == "stored" and trace["events"][0]["time"].endswith("Z")
    delivered = [e for e in trace["events"] if e["kind"] == "delivered"]
    assert delivered and delivered[0]["group"] == "billing" and delivered[0]["member_id"]
    (backlog,) = find("/backlog")
    assert {"delayed", "halves"} <= backlog.keys() and backlog["delayed"][0]["level"] >= 0
    (history,) = find("/history")
    assert history["samples"] and "oldest_unconsumed_age_ms" in history["samples"][-1]
    (left,) = find("-X DELETE")
    assert "left" in left
    (moved,) = find("/transfer-leader")
    assert moved == {"shard": 1, "leader": 2}
    (plan,) = find("/shards/balance")
    assert plan["dry_run"] is True and plan["moves"] == []  # node 2 is shard 1's preferred
    (cleaned,) = find("/cluster/clean-now")
    assert len(cleaned["nodes"]) == 3 and all("reason" in n for n in cleaned["nodes"])
    (bad_topic,) = find("bad%20topic")
    assert bad_topic["error"]["field"] == "topic"
    (bad_id,) = find("not-an-id")
    assert bad_id["error"]["field"] == "msg_id"
    (signed,) = find("-u ")
    assert len(signed["msg_id"]) == 32
    (anonymous,) = [doc_of(out) for cmd, out in ran if cmd.endswith("/api/v1/topics")]
    assert anonymous["error"]["code"] == "unauthenticated"
