"""A consumer process of the consumer-group benches, and the bench's handle on it.

`python -m bench.consumer_groups --worker --servers ... --group G --topic T --member M`
runs `worker_main`: an `AsyncConsumer` of `T` in group `G` whose handler notes each
message (its sequence number from the body's `HEAD`, the queue it was stored in, the
time it was handled, and its latency from the send time in `HEAD`, this host's
clock), printed as JSON lines on stdout every FLUSH_S until SIGTERM. `Worker` starts
one and collects what it reports (`Seen`); `stop_all` stops several together.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client.async_consumer import AsyncConsumer, ConsumedMessage

ROOT = Path(__file__).resolve().parent.parent
HEAD = struct.Struct(">qd")  # the message's sequence number, its send time (time.time())
FLUSH_S = 0.1  # how often a worker reports what it handled


class Seen(NamedTuple):
    """A handler call in a worker: which message, where it was stored, when (this host's
    time.time()), and how long after it was sent (ms)."""

    seq: int
    queue_id: int
    handled_s: float
    latency_ms: float


async def worker_main(servers: list[str], group: str, topic: str, member_id: str) -> int:
    """Consume `topic` in `group` until SIGTERM; print JSON lines on stdout: {"member"}
    once it runs, {"seen": [[seq, queue_id, handled_s, latency_ms], ...]} every
    FLUSH_S, {"done": handled} at the end."""
    seen: list[list[float]] = []

    def out(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    async def handle(m: ConsumedMessage) -> None:
        now = time.time()
        seq, sent = HEAD.unpack_from(m.body)
        queue = m.queue_id if m.stored_topic == topic else -1  # -1: a retried copy
        seen.append([seq, queue, now, (now - sent) * 1e3])

    async def flush() -> None:
        nonlocal seen
        while True:
            await asyncio.sleep(FLUSH_S)
            if seen:
                batch, seen = seen, []
                out({"seen": batch})

    consumer = AsyncConsumer(servers, group, [topic], handle, member_id=member_id)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
    flusher = asyncio.create_task(flush())
    out({"member": member_id})
    handled = await consumer.run()
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    if seen:
        out({"seen": seen})
    out({"done": handled})
    return handled


class Worker:
    """A consumer process (`--worker`) and what it reported so far."""

    def __init__(self, cl: LocalCluster, group: str, topic: str, member_id: str) -> None:
        self.member_id = member_id
        servers = ",".join(s.client for s in cl.specs.values())
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.consumer_groups",
                "--worker",
                "--servers",
                servers,
                "--group",
                group,
                "--topic",
                topic,
                "--member",
                member_id,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.seen: list[Seen] = []
        self.done: int | None = None
        self._reader = threading.Thread(target=self._read, name=f"read-{member_id}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "seen" in msg:
                self.seen.extend(Seen(int(s[0]), int(s[1]), s[2], s[3]) for s in msg["seen"])
            elif "done" in msg:
                self.done = int(msg["done"])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(5)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM: the consumer finishes, acks, leaves the group, reports the rest."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"worker {self.member_id} did not stop in {timeout_s} s; killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


def stop_all(workers: Sequence[Worker]) -> None:
    for w in workers:  # all asked first, so they leave together
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        w.stop()
