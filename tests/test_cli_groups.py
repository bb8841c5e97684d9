"""The consumer-group CLI on real node processes: `dledger consume` as a member of
a group (two processes share the queues; SQL92 filters on the server; Ctrl-C
leaves the group) and the operator's `dledger group list|describe|reset-offsets|dlq`.

Every command runs as a subprocess (`python -m dledger_commitlog`), as a user
runs it. A test's long-running `consume` processes are killed at its end, pass or
fail (the `procs` fixture). Every wait is a condition with a deadline.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client
from dledger_commitlog.client.consumer import ConsumedMessage, Consumer
from dledger_commitlog.client.groups import GroupDescription
from tests.conftest import wait_until

pytestmark = pytest.mark.slow

COMMAND_TIMEOUT_S = 60.0
START_S = 30.0  # a `consume` process starts, joins and gets its queues
SESSION_S = 3.0  # group_session_timeout_ms: a member leaving must not need it
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{int(time.time() * 1000)}x{next(_names)}"


def servers(cluster: LocalCluster) -> str:
    return ",".join(s.client for s in cluster)


def dledger(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """One `dledger` command against `cluster`, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "dledger_commitlog", *args, "--servers", servers(cluster)],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def ok_json(cluster: LocalCluster, *args: str) -> Any:
    """The JSON document a `dledger ... --json` command that must succeed prints."""
    done = dledger(cluster, *args, "--json")
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class ConsumeProc:
    """A `dledger consume --json` process running in the background; its output goes
    to files (a pipe nobody reads while it runs could fill and block it)."""

    def __init__(self, cluster: LocalCluster, tmp: Path, name: str, *args: str) -> None:
        self.out_path, self.err_path = tmp / f"{name}.out", tmp / f"{name}.err"
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dledger_commitlog",
                    "consume",
                    *args,
                    "--json",
                    "--servers",
                    servers(cluster),
                ],
                stdout=out,
                stderr=err,
                text=True,
            )

    def printed(self) -> list[dict[str, Any]]:
        """The messages printed so far (complete lines only)."""
        text = self.out_path.read_text()
        return json_lines(text[: text.rfind("\n") + 1])

    def bodies(self) -> list[str]:
        return [m["body"] for m in self.printed()]

    def interrupt(self) -> int:
        """Ctrl-C, as a user's: it must stop cleanly (exit 130, 'interrupted')."""
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running 30 s after SIGINT; stderr: {self.err_path.read_text()}"
            ) from None
        assert self.err_path.read_text() == "dledger: interrupted\n", self.err_path.read_text()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., ConsumeProc]]:
    """Start `consume` processes (cluster, name, args...); all are killed at the end."""
    started: list[ConsumeProc] = []

    def start(cluster: LocalCluster, name: str, *args: str) -> ConsumeProc:
        started.append(ConsumeProc(cluster, tmp_path, name, *args))
        return started[-1]

    try:
        yield start
    finally:
        for p in started:
            p.kill()


def describe(client: Client, group: str) -> GroupDescription:
    return client.group_describe(group)


def settled(d: GroupDescription, topic: str, members: int) -> bool:
    """`members` live members, each holding some of `topic`'s queues, none moving."""
    queues = [q for q in d.queues if q.topic == topic]
    owners = {q.owner for q in queues}
    return (
        d.summary.members == members
        and len(queues) > 0
        and all(q.owner and not q.revoking for q in queues)
        and len(owners) == members
    )


def put_spread(client: Client, topic: str, count: int, prefix: str, queues: int = 4) -> list[str]:
    bodies = [f"{prefix}{i}" for i in range(count)]
    for i, body in enumerate(bodies):
        client.put(topic, body, queue_id=i % queues)
    return bodies


# ---------------------------------------------------------------- consume


def test_two_consumers_in_a_group_share_the_queues(
    cluster: LocalCluster, procs: Callable[..., ConsumeProc]
) -> None:
    group, topic = unique("share"), unique("shared")
    args = ("--group", group, "--topic", topic)
    a, b = procs(cluster, "a", *args), procs(cluster, "b", *args)
    with cluster.client() as client:
        wait_until(
            lambda: describe(client, group),
            START_S,
            "both consumers to join and split the queues",
            lambda d: settled(d, topic, 2),
        )
        # a member must share the group's settings: this one is refused, clearly
        refused = dledger(cluster, "consume", *args, "--orderly", "--idle-exit", "1")
        assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr, refused
        assert "same strategy and mode" in refused.stderr, refused.stderr
        sent = put_spread(client, topic, 40, "s")
        wait_until(
            lambda: sorted(a.bodies() + b.bodies()),
            COMMAND_TIMEOUT_S,
            "the two to print every message",
            lambda got: got == sorted(sent),
        )
        got_a, got_b = a.printed(), b.printed()
        assert got_a and got_b, "each prints some"
        assert not {m["body"] for m in got_a} & {m["body"] for m in got_b}, "each to one of them"
        assert not {m["queue_id"] for m in got_a} & {m["queue_id"] for m in got_b}
        for m in got_a + got_b:
            assert m["topic"] == m["stored_topic"] == topic and m["reconsume_times"] == 0
            assert {"queue_id", "queue_offset", "msg_id", "body"} <= m.keys()

        assert a.interrupt() == 130
        # it left the group as it stopped: its queues move without the session timeout
        wait_until(
            lambda: describe(client, group),
            SESSION_S - 1.0,
            "a's queues to move to b at once",
            lambda d: settled(d, topic, 1),
        )
        more = put_spread(client, topic, 4, "m")
        wait_until(
            b.bodies,
            COMMAND_TIMEOUT_S,
            "b to print the newer messages",
            lambda got: set(more) <= set(got),
        )
    assert b.interrupt() == 130
    assert sorted(a.bodies() + b.bodies()) == sorted(sent + more)


def test_consume_filters_with_sql_on_the_server(cluster: LocalCluster) -> None:
    topic = unique("sql")
    with cluster.client() as client:
        for i in range(10):
            client.put(topic, f"n{i}", properties={"n": str(i), "region": "eu" if i % 2 else "us"})
    done = dledger(
        cluster,
        "consume",
        "--group",
        unique("sqlg"),
        "--topic",
        topic,
        "--sql",
        "n >= 5 AND region = 'eu'",
        "--idle-exit",
        "5",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert sorted(m["body"] for m in json_lines(done.stdout)) == ["n5", "n7", "n9"]
    # without --json: a line per message, and the count on stderr
    done = dledger(
        cluster,
        "consume",
        "--group",
        unique("tail"),
        "--topic",
        topic,
        "--max",
        "4",
        "--idle-exit",
        "5",
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 4 and done.stderr == "consumed 4 messages\n"
    assert all(line.startswith(f"{topic}/") for line in done.stdout.splitlines())


def test_consume_refuses_bad_input_clearly(cluster: LocalCluster) -> None:
    args = ("consume", "--group", unique("bad"), "--topic", unique("bad"), "--idle-exit", "2")
    done = dledger(cluster, *args, "--sql", "a > 5 AND region = = 'eu'")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "INVALID_ARGUMENT" in line and "column 20" in line, line
    done = dledger(cluster, *args, "--sql", "a > 5", "--tag-expr", "A")
    assert done.returncode == 2 and "not allowed with" in done.stderr, done.stderr


# ---------------------------------------------------------------- group list, describe


def test_group_list_and_describe_show_the_lag(
    cluster: LocalCluster, procs: Callable[..., ConsumeProc]
) -> None:
    group, topic = unique("lag"), unique("lagt")
    with cluster.client() as client:
        put_spread(client, topic, 6, "l")
        done = dledger(  # --max: done at the sixth; fewer, and it exits idle (the assert says)
            cluster, "consume", "--group", group, "--topic", topic, "--max", "6",
            "--idle-exit", "3", "--json",
        )  # fmt: skip
        assert done.returncode == 0 and len(json_lines(done.stdout)) == 6, done.stderr
        newer = put_spread(client, topic, 4, "n")  # one more in each queue: lag 4

    def listed() -> dict[str, Any]:
        return {g["group"]: g for g in ok_json(cluster, "group", "list")["groups"]}

    row = wait_until(
        listed, 10.0, f"{group} listed with lag 4", lambda gs: gs.get(group, {}).get("lag") == 4
    )[group]
    assert row["members"] == 0 and row["dead_letters"] == 0
    # the strategy is its live members' (the leader forgets a group without any soon)
    assert row["strategy"] in ("", "average")
    text = dledger(cluster, "group", "list").stdout
    assert any(line.split()[:3] == [group, "0", "4"] for line in text.splitlines()), text

    doc = ok_json(cluster, "group", "describe", group)
    assert doc["summary"]["lag"] == 4 and doc["members"] == []
    queues = {q["queue_id"]: q for q in doc["queues"] if q["topic"] == topic}
    figures = {q: (x["committed"], x["max_offset"], x["lag"]) for q, x in queues.items()}
    assert figures == {0: (2, 3, 1), 1: (2, 3, 1), 2: (1, 2, 1), 3: (1, 2, 1)}

    # with a live member: its id and its queues; it takes what the group has not
    live = procs(cluster, "live", "--group", group, "--topic", topic)
    with cluster.client() as client:
        d = wait_until(
            lambda: describe(client, group),
            START_S,
            "the member to hold the queues",
            lambda d: settled(d, topic, 1),
        )
    text = dledger(cluster, "group", "describe", group).stdout
    member = d.members[0].member_id
    assert "members        1" in text and f"{topic}/0" in text and member in text, text
    wait_until(
        live.bodies,
        COMMAND_TIMEOUT_S,
        "the member to print the newer messages",
        lambda got: sorted(got) == sorted(newer),
    )
    wait_until(
        lambda: ok_json(cluster, "group", "describe", group),
        10.0,
        "no lag left",
        lambda doc: doc["summary"]["lag"] == 0,
    )
    assert live.interrupt() == 130

    done = dledger(cluster, "group", "describe", unique("nosuch"))
    assert done.returncode == 1 and "unknown group" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1


# ---------------------------------------------------------------- reset-offsets


def test_reset_offsets_makes_the_group_read_again(
    cluster: LocalCluster, procs: Callable[..., ConsumeProc]
) -> None:
    group, topic = unique("reset"), unique("resett")
    with cluster.client() as client:
        sent = put_spread(client, topic, 5, "r")

    def consume_all(expected: int = 0) -> list[str]:
        """What the group reads: `expected` messages end the read (no idle wait), nothing
        more comes within 3 s otherwise."""
        more = ("--max", str(expected)) if expected else ()
        done = dledger(
            cluster, "consume", "--group", group, "--topic", topic, *more,
            "--idle-exit", "3", "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return sorted(m["body"] for m in json_lines(done.stdout))

    assert consume_all(len(sent)) == sorted(sent)
    assert consume_all() == []  # committed: nothing again

    live = procs(cluster, "live", "--group", group, "--topic", topic)
    with cluster.client() as client:
        wait_until(
            lambda: describe(client, group),
            START_S,
            "the live member to hold the queues",
            lambda d: settled(d, topic, 1),
        )
    refused = dledger(cluster, "group", "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert refused.returncode == 1, refused
    assert "live member" in refused.stderr and "--force" in refused.stderr, refused.stderr
    forced = ok_json(
        cluster, "group", "reset-offsets", group, "--topic", topic, "--to-earliest", "--force"
    )
    assert {o["queue_id"]: o["offset"] for o in forced["offsets"]} == {0: 0, 1: 0, 2: 0, 3: 0}
    wait_until(
        live.bodies,
        COMMAND_TIMEOUT_S,
        "the live member to read them again",
        lambda got: sorted(got) == sorted(sent),
    )
    assert live.interrupt() == 130

    # no live members: no --force needed
    one = ok_json(
        cluster,
        "group",
        "reset-offsets",
        group,
        "--topic",
        topic,
        "--to-offset",
        "1",
        "--queue",
        "0",
    )
    assert one["offsets"] == [{"queue_id": 0, "offset": 1}] and one["to"] == "offset"
    latest = ok_json(cluster, "group", "reset-offsets", group, "--topic", topic, "--to-latest")
    assert {o["queue_id"]: o["offset"] for o in latest["offsets"]} == {0: 2, 1: 1, 2: 1, 3: 1}
    assert consume_all() == []
    earliest = dledger(
        cluster,
        "group",
        "reset-offsets",
        group,
        "--topic",
        topic,
        "--to-time",
        "2000-01-01T00:00:00Z",
    )
    assert earliest.returncode == 0, earliest.stderr
    assert earliest.stdout.splitlines()[0].split() == ["topic", "queue", "offset"]
    assert consume_all(len(sent)) == sorted(sent)

    bad = dledger(cluster, "group", "reset-offsets", group, "--topic", topic, "--to-time", "noon")
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr, bad.stderr


# ---------------------------------------------------------------- dlq


def test_dlq_lists_and_resends_dead_letters(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster("dlq", delay_levels="100ms 200ms 300ms")
    group, topic = "gdlq", "orders"
    seen: list[tuple[str, int]] = []

    def refuse(m: ConsumedMessage) -> bool:
        seen.append((m.body.decode(), m.reconsume_times))
        return False

    with cluster.client() as client:
        sent = put_spread(client, topic, 3, "d")
        consumer = Consumer(servers(cluster), group, [topic], refuse, max_reconsume=1).start()
        try:
            wait_until(
                lambda: {g.group: g.dead_letters for g in client.group_list()},
                30.0,
                "three dead letters",
                lambda d: d.get(group) == 3,
            )
        finally:
            consumer.stop()
            consumer.join(30.0)
    assert sorted(seen) == sorted([(b, 0) for b in sent] + [(b, 1) for b in sent])

    doc = ok_json(cluster, "group", "dlq", group)
    assert [m["queue_offset"] for m in doc["messages"]] == [0, 1, 2]
    assert sorted(m["body"] for m in doc["messages"]) == sorted(sent)
    assert all(m["properties"]["RETRY_TOPIC"] == topic for m in doc["messages"])
    assert (doc["resent"], doc["next_offset"], doc["max_offset"]) == (0, 3, 3)
    text = dledger(cluster, "group", "dlq", group, "--from", "1", "--max", "1").stdout
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["offset", "msg_id", "topic", "retries", "reason"], text
    assert lines[1].split()[0] == "1" and topic in lines[1] and len(lines) == 3, text
    assert lines[2].startswith("next_offset 2"), text

    first = ok_json(cluster, "group", "dlq", group, "--resend", "1")
    assert first["resent"] == 1
    rest = ok_json(cluster, "group", "dlq", group, "--resend-all")
    assert rest["resent"] == 2  # the one resent already is not put twice
    bad = dledger(cluster, "group", "dlq", group, "--resend", "7")
    assert bad.returncode == 1 and "no dead letter at offset 7" in bad.stderr, bad.stderr

    done = dledger(  # --max: done at the third; fewer, and it exits idle (the assert says)
        cluster, "consume", "--group", group, "--topic", topic, "--max", "3",
        "--idle-exit", "3", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    again = json_lines(done.stdout)
    assert sorted(m["body"] for m in again) == sorted(sent)
    assert all(m["topic"] == topic and m["stored_topic"] == f"%RETRY%{group}" for m in again)
    listed = {g["group"]: g for g in ok_json(cluster, "group", "list")["groups"]}
    assert listed[group]["dead_letters"] == 3
