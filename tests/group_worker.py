"""A consumer-group member as a process of its own, for tests/test_consumer_groups*.py.

Runs one `Consumer` and prints one JSON line per handler call to stdout, flushed at
once (so a SIGKILL loses at most the line being written): the member, where the
message is stored, its producer's topic, body, msg_id, reconsume times, the
outcome and `t_ns` (time.monotonic_ns(): one clock for every process of the
machine). The first line is {"event": "started", "member": ...}. `--fail BODY:N`
fails the message with that body its first N times (N < 0: always); `--work-ms`
makes every handler call take that long. SIGTERM stops it cleanly.

    python -m tests.group_worker --servers H:P,... --cluster C --group G --topic T

The tests' side is `Workers`: it starts these processes (stdout to a file each),
reads their records, and kills every one at the end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client.consumer import ConsumedMessage, Consumer

ROOT = Path(__file__).resolve().parent.parent
Record = dict[str, Any]


class Worker:
    """One worker process: its member id, its output file, its records so far."""

    def __init__(self, member: str, process: subprocess.Popen[bytes], out_path: Path) -> None:
        self.member = member
        self.process = process
        self.out_path = out_path

    def lines(self) -> list[Record]:
        """Every complete JSON line printed so far (a line cut by a kill is skipped)."""
        out: list[Record] = []
        for line in self.out_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def records(self) -> list[Record]:
        """The handler calls printed so far."""
        return [r for r in self.lines() if "event" not in r]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


class Workers:
    """Worker processes of one test, against `cluster`; every one killed on exit."""

    def __init__(self, cluster: LocalCluster, directory: Path) -> None:
        self.servers = ",".join(s.client for s in cluster)
        self.cluster = cluster.cluster
        self.directory = directory
        self.started: list[Worker] = []

    def spawn(self, member: str, group: str, topic: str, *extra: str) -> Worker:
        out_path = self.directory / f"worker-{member}.jsonl"
        argv = [
            sys.executable,
            "-m",
            "tests.group_worker",
            "--servers",
            self.servers,
            "--cluster",
            self.cluster,
            "--group",
            group,
            "--topic",
            topic,
            "--member-id",
            member,
            *extra,
        ]
        err_path = self.directory / f"worker-{member}.err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err)
        worker = Worker(member, process, out_path)
        self.started.append(worker)
        return worker

    def records(self) -> list[Record]:
        """Every worker's handler calls (the union of their outputs)."""
        return [r for w in self.started for r in w.records()]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for worker in self.started:
            worker.kill()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", required=True)
    p.add_argument("--cluster", default="")
    p.add_argument("--group", required=True)
    p.add_argument("--topic", action="append", required=True)
    p.add_argument("--member-id", default=None)
    p.add_argument("--orderly", action="store_true")
    p.add_argument("--strategy", default="average")
    p.add_argument("--max-reconsume", type=int, default=16)
    p.add_argument("--first-retry-level", type=int, default=3)
    p.add_argument("--fail", action="append", default=[], help="BODY:N (N < 0: always)")
    p.add_argument("--work-ms", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    fail_rules = {body: int(n) for body, n in (rule.rsplit(":", 1) for rule in args.fail)}
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def emit(record: dict[str, object]) -> None:
        line = json.dumps(record)
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def handle(m: ConsumedMessage) -> bool:
        body = m.body.decode(errors="replace")
        with lock:
            calls[body] += 1
            nth = calls[body]
        limit = fail_rules.get(body)
        ok = limit is None or (0 <= limit < nth)
        emit(
            {
                "member": consumer.member_id,
                "topic": m.topic,
                "stored_topic": m.stored_topic,
                "queue_id": m.queue_id,
                "queue_offset": m.queue_offset,
                "body": body,
                "msg_id": m.msg_id,
                "uniq_key": m.message.uniq_key,
                "reconsume_times": m.reconsume_times,
                "ok": ok,
                "t_ns": time.monotonic_ns(),
            }
        )
        if args.work_ms:
            time.sleep(args.work_ms / 1000)
        return ok

    consumer = Consumer(
        args.servers.split(","),
        args.group,
        args.topic,
        handle,
        orderly=args.orderly,
        strategy=args.strategy,
        max_reconsume=args.max_reconsume,
        first_retry_level=args.first_retry_level,
        member_id=args.member_id,
        cluster=args.cluster or None,
    )

    def on_term(signum: int, frame: FrameType | None) -> None:
        consumer.stop()

    signal.signal(signal.SIGTERM, on_term)
    emit({"event": "started", "member": args.member_id})
    consumer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
