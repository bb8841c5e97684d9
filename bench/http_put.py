"""HTTP puts through `dledger console` against the gRPC client's, on one local cluster.

1 KiB messages, sync flush, a local 3-node cluster and one console process:
(a) one sequential client and (b) 32 puts in flight, each through the Python gRPC
client (`Client.put`; `AsyncClient.put` x 32 tasks) and through the console's
`POST /api/v1/topics/{topic}/messages` (one keep-alive connection; 32 keep-alive
connections, one request in flight on each), in rounds run A B A B (gRPC, HTTP in
turn). Issue 33's target: HTTP at least 60% of the gRPC rates. Run:
`.venv/bin/python bench/http_put.py [--count N] [--rounds R]`; writes
bench/results/http_put.json. bench/console.py runs the same measurement
(`interleaved`) beside the console's other targets.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._proc import process_usage
from bench._report import report
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import AsyncClient, Client

ROOT = Path(__file__).resolve().parent.parent
BODY = b"m" * 1024
CONFIG = {"data_segment_bytes": 64 << 20, "index_segment_bytes": 8 << 20}
INFLIGHT = 32
PATH = "/api/v1/topics/bench/messages"
HEAD = (
    "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/octet-stream\r\n"
    "Content-Length: {n}\r\n\r\n"
)


def start_console(cluster: LocalCluster) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "dledger_commitlog", "console"]
    argv += ["--cluster", str(cluster.cluster_file), "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("console: serving "):
            return proc, int(line.rsplit(":", 1)[1].split("/")[0])
    raise SystemExit(f"the console did not start ({proc.wait()})")


def grpc_sequential(cluster: LocalCluster, count: int) -> float:
    with Client([s.client for s in cluster]) as client:
        client.put("bench", BODY)  # connect, find the leader
        started = time.perf_counter()
        for _ in range(count):
            client.put("bench", BODY)
        return count / (time.perf_counter() - started)


def grpc_inflight(cluster: LocalCluster, count: int) -> float:
    async def main() -> float:
        async with AsyncClient([s.client for s in cluster]) as client:
            await client.put("bench", BODY)

            async def worker(n: int) -> None:
                for _ in range(n):
                    await client.put("bench", BODY)

            return await timed(count, worker)

    return asyncio.run(main())


def http_sequential(port: int, count: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/octet-stream"}

    def one() -> None:
        conn.request("POST", PATH, BODY, headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status

    one()
    started = time.perf_counter()
    for _ in range(count):
        one()
    conn.close()
    return count / (time.perf_counter() - started)


def http_inflight(port: int, count: int) -> float:
    request = HEAD.format(path=PATH, n=len(BODY)).encode() + BODY

    async def worker(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(n):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:40]
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
        writer.close()

    return asyncio.run(timed(count, worker))


async def timed(count: int, worker: Callable[[int], Awaitable[None]]) -> float:
    shares = [count // INFLIGHT + (i < count % INFLIGHT) for i in range(INFLIGHT)]
    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in shares))
    return count / (time.perf_counter() - started)


def interleaved(
    cluster: LocalCluster, console_pid: int, port: int, count: int, rounds: int
) -> dict[str, float]:
    """The four rates and the two HTTP/gRPC ratios, over `rounds` rounds run A B A B
    (gRPC then HTTP, sequential then 32 in flight), so that a change in the machine's
    load falls on both sides alike: each rate is the median of its rounds, each ratio
    the median of the rounds' ratios. Beside each rate, the CPU per put of every
    process of the path (the nodes, the console, this client): on a busy host that is
    the bound of the rate."""
    pids = [p for p in (cluster.pid(n) for n in cluster.specs) if p is not None]
    pids += [console_pid, os.getpid()]
    runs: dict[str, list[float]] = {}
    workloads: tuple[tuple[str, Callable[[], float]], ...] = (
        ("grpc_seq", lambda: grpc_sequential(cluster, count)),
        ("http_seq", lambda: http_sequential(port, count)),
        ("grpc_inflight32", lambda: grpc_inflight(cluster, count)),
        ("http_inflight32", lambda: http_inflight(port, count)),
    )
    for _ in range(rounds):
        for name, measure in workloads:
            before = sum(process_usage(p)[0] for p in pids)
            runs.setdefault(f"{name}_msgs_per_s", []).append(measure())
            spent = sum(process_usage(p)[0] for p in pids) - before
            runs.setdefault(f"{name}_cpu_us_per_put", []).append(spent / count * 1e6)
    rates = {name: statistics.median(values) for name, values in runs.items()}
    for kind in ("seq", "inflight32"):
        pairs = zip(runs[f"http_{kind}_msgs_per_s"], runs[f"grpc_{kind}_msgs_per_s"], strict=True)
        rates[f"http_vs_grpc_{kind}"] = statistics.median(h / g for h, g in pairs)
    return rates


def rows(rates: dict[str, float]) -> list[tuple[str, str, str]]:
    """The table rows of `interleaved`'s figures."""
    out = []
    for kind, label in (("seq", "(a) sequential"), ("inflight32", "(b) 32 in flight")):
        for side, name in (("grpc", "gRPC client"), ("http", "HTTP")):
            rate, cpu = rates[f"{side}_{kind}_msgs_per_s"], rates[f"{side}_{kind}_cpu_us_per_put"]
            out.append((f"{label}, {name}", f"{rate:.0f}", f"msgs/s, {cpu:.0f} us CPU a put"))
        ratio = f"{rates[f'http_vs_grpc_{kind}']:.2f}"
        out.append((f"{label}, HTTP / gRPC", ratio, "target >= 0.60"))
    return out


def stop_console(console: subprocess.Popen[str]) -> None:
    console.send_signal(signal.SIGTERM)
    try:
        console.wait(10)
    except subprocess.TimeoutExpired:
        console.kill()
        console.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=2000, help="puts per workload and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of A B A B")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="http-put-") as tmp,
        LocalCluster(Path(tmp) / "c", extra_config=CONFIG) as cluster,
    ):
        cluster.up()
        console, port = start_console(cluster)
        try:
            rates = interleaved(cluster, console.pid, port, args.count, args.rounds)
        finally:
            stop_console(console)
    report("http_put", rows(rates), rates)


if __name__ == "__main__":
    main()
