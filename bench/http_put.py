"""HTTP puts through `dledger console` against the gRPC client's, on one local cluster.

1 KiB messages, sync flush, a local 3-node cluster and one console process:
(a) one sequential client and (b) 32 puts in flight, each through the Python gRPC
client (`Client.put`; `AsyncClient.put` x 32 tasks) and through the console's
`POST /api/v1/topics/{topic}/messages` (one keep-alive connection; 32 keep-alive
connections, one request in flight on each). Issue 33's target: HTTP at least 60%
of the gRPC rates. Run: `.venv/bin/python bench/http_put.py [--count N]`; writes
bench/results/http_put.json.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=2000, help="puts per workload")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="http-put-") as tmp,
        LocalCluster(Path(tmp) / "c", extra_config=CONFIG) as cluster,
    ):
        cluster.up()
        console, port = start_console(cluster)
        try:
            rates = {
                "grpc_seq_msgs_per_s": grpc_sequential(cluster, args.count),
                "http_seq_msgs_per_s": http_sequential(port, args.count),
                "grpc_inflight32_msgs_per_s": grpc_inflight(cluster, args.count),
                "http_inflight32_msgs_per_s": http_inflight(port, args.count),
            }
        finally:
            console.send_signal(signal.SIGTERM)
            console.wait(10)
    rates["http_vs_grpc_seq"] = rates["http_seq_msgs_per_s"] / rates["grpc_seq_msgs_per_s"]
    rates["http_vs_grpc_inflight32"] = (
        rates["http_inflight32_msgs_per_s"] / rates["grpc_inflight32_msgs_per_s"]
    )
    rows = [
        ("(a) sequential, gRPC client", f"{rates['grpc_seq_msgs_per_s']:.0f}", "msgs/s"),
        ("(a) sequential, HTTP", f"{rates['http_seq_msgs_per_s']:.0f}", "msgs/s"),
        ("(a) HTTP / gRPC", f"{rates['http_vs_grpc_seq']:.2f}", "target >= 0.60"),
        ("(b) 32 in flight, gRPC client", f"{rates['grpc_inflight32_msgs_per_s']:.0f}", "msgs/s"),
        ("(b) 32 in flight, HTTP", f"{rates['http_inflight32_msgs_per_s']:.0f}", "msgs/s"),
        ("(b) HTTP / gRPC", f"{rates['http_vs_grpc_inflight32']:.2f}", "target >= 0.60"),
    ]
    report("http_put", rows, rates)


if __name__ == "__main__":
    main()
