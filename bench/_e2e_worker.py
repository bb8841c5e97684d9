"""The producer process of bench/e2e.py, and the orchestrator's handle on it.

`python -m bench._e2e_worker --servers ... --topic T --mode closed|paced|batch`:
an `AsyncClient` puts 1 KiB messages whose body starts with (sequence number, send
time: time.time()), bench/_group_worker.py's HEAD, so a consumer process of
bench/_group_worker.py (`Worker`) measures the end-to-end latency on this host's
clock. The process primes its client (one put to `T-prime`: channel, leader, put
stream), prints {"ready": pid}, reads a start time (time.time()) from stdin, then:

- closed: `--inflight` puts at once, each task putting again as soon as its last
  put is acknowledged, until start + `--warmup` + `--seconds`;
- paced: `--rate` msgs/s, one asyncio task per message created at its scheduled
  time (start + n / rate), never waiting for earlier puts; a scheduler that falls
  behind sends every message that is due at once, and the delay from the scheduled
  time to the put's start is reported (`behind`);
- batch: `--count` messages in PutBatch calls of `--batch`, `--inflight` at once.

It prints one {"result": ...} line: every acknowledged put as [seq, sent, acked]
(time.time()), the failures (and the 3 commonest kinds), its own CPU seconds from
the start to the last acknowledgement, the `behind` summary, and the PutFrames
frames its client wrote in the measured window (start + warmup to the end),
counted by wrapping PutPipe._take_frame (instrumentation only: what is sent is
unchanged).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._group_worker import HEAD
from bench.consumer_groups import PAD, ROOT, pct
from dledger_commitlog.client import AsyncClient, ClientError, MessageSpec
from dledger_commitlog.client.put_pipe import PutPipe

FRAMES = [0, 0]  # PutFrames frames this process wrote, and the messages in them


def count_frames() -> None:
    """Count the frames (and their messages) every PutPipe of this process writes."""
    take = PutPipe._take_frame

    def counting(self: PutPipe) -> Any:
        frame, futures = take(self)
        if futures:
            FRAMES[0] += 1
            FRAMES[1] += len(futures)
        return frame, futures

    PutPipe._take_frame = counting  # type: ignore[method-assign]


class Run:
    """What one producer run noted."""

    def __init__(self) -> None:
        self.acked: list[tuple[int, float, float]] = []  # seq, sent, acked (time.time())
        self.failed = 0
        self.errors: collections.Counter[str] = collections.Counter()  # failures by kind
        self.behind: list[float] = []  # paced: put start - scheduled time, s

    async def put(self, client: AsyncClient, topic: str, seq: int) -> None:
        sent = time.time()
        try:
            await client.put(topic, HEAD.pack(seq, sent) + PAD)
        except ClientError as exc:
            self.failed += 1
            self.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            return
        self.acked.append((seq, sent, time.time()))


async def closed(client: AsyncClient, topic: str, base: int, inflight: int, end: float) -> Run:
    run, seqs = Run(), itertools.count(base)

    async def one() -> None:
        while time.time() < end:
            await run.put(client, topic, next(seqs))

    await asyncio.gather(*(one() for _ in range(inflight)))
    return run


async def paced(
    client: AsyncClient, topic: str, base: int, rate: float, start: float, end: float
) -> Run:
    run = Run()
    tasks: set[asyncio.Task[None]] = set()
    total = int((end - start) * rate)

    async def one(seq: int, due: float) -> None:
        run.behind.append(time.time() - due)
        await run.put(client, topic, seq)

    n = 0
    while n < total:
        now = time.time()
        while n < total and start + n / rate <= now:  # everything due, late or not
            task = asyncio.create_task(one(base + n, start + n / rate))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if n < total:
            await asyncio.sleep(max(0.0, start + n / rate - time.time()))
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    return run


async def batched(
    client: AsyncClient, topic: str, base: int, count: int, batch: int, inflight: int
) -> Run:
    run, starts = Run(), iter(range(0, count, batch))

    async def one() -> None:
        for lo in starts:
            sent = time.time()
            seqs = range(base + lo, base + min(count, lo + batch))
            try:
                await client.put_batch([MessageSpec(topic, HEAD.pack(s, sent) + PAD) for s in seqs])
            except ClientError as exc:
                run.failed += len(seqs)
                run.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
                continue
            acked = time.time()
            run.acked.extend((s, sent, acked) for s in seqs)

    await asyncio.gather(*(one() for _ in range(inflight)))
    return run


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    count_frames()
    linger = {} if args.linger_ms is None else {"linger_ms": args.linger_ms}
    async with AsyncClient(args.servers.split(","), **linger) as client:
        await client.put(f"{args.topic}-prime", PAD)
        print(json.dumps({"ready": os.getpid()}), flush=True)
        start = float(await asyncio.to_thread(sys.stdin.readline))
        await asyncio.sleep(max(0.0, start - time.time()))
        began, cpu0 = time.time(), time.process_time()
        measured, end = start + args.warmup, start + args.warmup + args.seconds
        at_window: list[int] = []

        async def window() -> None:  # the frame counters when the measured window opens
            await asyncio.sleep(max(0.0, measured - time.time()))
            at_window.extend(FRAMES)

        marker = asyncio.create_task(window())
        if args.mode == "closed":
            run = await closed(client, args.topic, args.base, args.inflight, end)
        elif args.mode == "paced":
            run = await paced(client, args.topic, args.base, args.rate, start, end)
        else:
            run = await batched(
                client, args.topic, args.base, args.count, args.batch, args.inflight
            )
        ended, cpu_s = time.time(), time.process_time() - cpu0
        marker.cancel()
        frames = [b - a for a, b in zip(at_window or [0, 0], FRAMES, strict=True)]
    behind_ms = [b * 1e3 for b in run.behind]
    return {
        "acked": run.acked,
        "failed": run.failed,
        "errors": dict(run.errors.most_common(3)),
        "started": began,
        "ended": ended,
        "cpu_s": cpu_s,
        "frames": frames[0],
        "framed_msgs": frames[1],
        "behind_max_ms": max(behind_ms, default=0.0),
        "behind_p99_ms": pct(behind_ms, 0.99),
        "late_msgs": sum(b > 1.0 for b in behind_ms),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--servers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--mode", choices=("closed", "paced", "batch"), required=True)
    ap.add_argument("--base", type=int, default=0, help="the first sequence number")
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--warmup", type=float, default=0.0)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--linger-ms", type=float, default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator ends us
    print(json.dumps({"result": asyncio.run(produce(args))}), flush=True)


# -- the orchestrator's side ------------------------------------------------------------


class Result(NamedTuple):
    acked: list[tuple[int, float, float]]  # seq, sent, acked
    failed: int
    errors: dict[str, int]  # the commonest failures: message -> count
    started: float
    ended: float
    cpu_s: float  # this process's CPU from the start to the last acknowledgement
    frames: int
    framed_msgs: int
    behind_max_ms: float
    behind_p99_ms: float
    late_msgs: int


class Producer:
    """A producer process (see the module docstring): `ready()`, `go(at)`, `result()`."""

    def __init__(self, servers: Sequence[str], topic: str, mode: str, **opts: float) -> None:
        cmd = [
            sys.executable,
            "-m",
            "bench._e2e_worker",
            "--servers",
            ",".join(servers),
            "--topic",
            topic,
            "--mode",
            mode,
        ]
        for k, v in opts.items():
            cmd += [f"--{k}", str(v)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"read-producer-{topic}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def _next(self, key: str, timeout_s: float) -> Any:
        try:
            msg = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"producer {self.pid}: no {key!r} in {timeout_s:.0f} s") from None
        if msg is None or key not in msg:
            raise RuntimeError(
                f"producer {self.pid} ended (exit {self.proc.poll()}) without {key!r}"
            )
        return msg[key]

    def ready(self, timeout_s: float = 60.0) -> None:
        self._next("ready", timeout_s)

    def go(self, at: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{at}\n")
        self.proc.stdin.flush()

    def result(self, timeout_s: float) -> Result:
        r = self._next("result", timeout_s)
        acked = [(int(s), float(t), float(a)) for s, t, a in r.pop("acked")]
        self.proc.wait(10)
        return Result(acked=acked, **r)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    main()
