"""The client port's two stacks, A/B in one run: grpc.aio against h2grpc.

Two local 3-node clusters up at once (sync flush, nodes on uvloop), one serving
clients with grpc.aio (`listen.client_transport = "grpcio"`), one with h2grpc ("h2"); the
client is the grpcio Python client in this process. Each workload runs `--reps`
times per stack, the stacks taking turns (order alternating per round); medians:

- status: one client, sequential Status calls: the port's own cost, no Raft work;
- put: one client, sequential unary Put of 1 KiB (the RPC alone, grpc.aio stub);
- frames32: 32 puts in flight through `AsyncClient.put` (PutFrames, coalesced);
- pull16k: Pull of a 16,384-message queue (1 KiB each), 1,024 per call, decoded;
- readlog: ReadLog of the whole committed log (4 MiB chunks), MB/s.

Every call goes to the leader; "CPU" is the leader process's user+system time
(/proc) per call (per put, per Pull call, per MiB read), and for puts also all
three nodes'. Then the port alone, no node behind it: a server process (uvloop)
whose handlers answer at once, on each stack in turn: sequential unary calls, a
PutFrames stream ping-pong and 32 frames of 1 KiB in flight, with the server's
CPU per round trip. Run: `.venv/bin/python bench/client_port.py [--reps 3]
[--seconds 3]`; writes bench/results/client_port.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import uvloop

from bench._proc import process_usage as node_usage
from bench._report import report
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import AsyncClient, MessageSpec
from dledger_commitlog.service import h2_port
from dledger_commitlog.service.decoding import add_services
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc

STACKS = ("grpcio", "h2")
BODY = b"m" * 1024
PULL_MESSAGES = 16_384
CONFIG = {"data_segment_bytes": 256 << 20, "index_segment_bytes": 32 << 20}
Sample = tuple[float, float, float]  # rate, leader CPU us per unit, all nodes' CPU us per unit


@contextlib.contextmanager
def clusters(root: Path) -> Iterator[dict[str, LocalCluster]]:
    with contextlib.ExitStack() as stack:
        made = {}
        for name in STACKS:
            config = dict(CONFIG, client_transport=name)
            made[name] = stack.enter_context(
                LocalCluster(root / name, extra_config=config)  # nodes run on uvloop
            )
            made[name].up()
        yield made


def cpu_s(cluster: LocalCluster) -> dict[int, float]:
    return {i: node_usage(pid)[0] for i in cluster.specs if (pid := cluster.pid(i)) is not None}


Work = Callable[[str, float], Awaitable[tuple[float, float]]]


async def measured(cluster: LocalCluster, work: Work, seconds: float) -> Sample:
    """Run `work(leader address, seconds)` -> (units done, rate); CPU per unit of the
    leader and of all nodes."""
    leader = cluster.leader_id()
    before = cpu_s(cluster)
    units, rate = await work(cluster.specs[leader].client, seconds)
    after = cpu_s(cluster)
    lead = (after[leader] - before[leader]) / units * 1e6
    every = sum(after[i] - before[i] for i in after) / units * 1e6
    return rate, lead, every


def put_request(topic: str) -> pb.PutRequest:
    return pb.PutRequest(message=pb.MessageData(topic=topic, body=BODY))


async def sequential_puts(address: str, seconds: float) -> tuple[float, float]:
    async with grpc.aio.insecure_channel(address) as channel:
        put = pb_grpc.DLedgerClientStub(channel).Put
        await put(put_request("put"), timeout=10)
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            await put(put_request("put"), timeout=10)
            count += 1
        return count, count / (time.perf_counter() - started)


async def statuses(address: str, seconds: float) -> tuple[float, float]:
    """Status, one after another: the client port's cost per call with no Raft work."""
    async with grpc.aio.insecure_channel(address) as channel:
        status = pb_grpc.DLedgerClientStub(channel).Status
        await status(pb.StatusRequest(), timeout=10)
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            await status(pb.StatusRequest(), timeout=10)
            count += 1
        return count, count / (time.perf_counter() - started)


async def framed_puts(address: str, seconds: float, inflight: int = 32) -> tuple[float, float]:
    async with AsyncClient([address]) as client:
        await client.put("frames", BODY)
        count, started = 0, time.perf_counter()

        async def worker() -> None:
            nonlocal count
            while time.perf_counter() - started < seconds:
                await client.put("frames", BODY)
                count += 1

        await asyncio.gather(*(worker() for _ in range(inflight)))
        return count, count / (time.perf_counter() - started)


async def fill_pull_queue(address: str) -> None:
    async with AsyncClient([address]) as client:
        for _ in range(PULL_MESSAGES // 256):
            await client.put_batch([MessageSpec("pull", BODY, queue_id=0)] * 256)


async def pulls(address: str, seconds: float) -> tuple[float, float]:
    """Pull the whole 16k queue, again and again: Pull calls done, messages per second."""
    async with grpc.aio.insecure_channel(address) as channel:
        pull = pb_grpc.DLedgerClientStub(channel).Pull
        calls = messages = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            offset = 0
            while offset < PULL_MESSAGES:
                reply = await pull(pb.PullRequest(topic="pull", queue_id=0, queue_offset=offset,
                                                  max_messages=1024), timeout=30)  # fmt: skip
                assert reply.messages, f"no messages at {offset}"
                offset = reply.next_offset
                messages += len(reply.messages)
                calls += 1
        return calls, messages / (time.perf_counter() - started)


async def read_logs(address: str, seconds: float) -> tuple[float, float]:
    """ReadLog of the whole log, again and again: MiB read, MiB per second."""
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options) as channel:
        read_log = pb_grpc.DLedgerClientStub(channel).ReadLog
        read = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            async for chunk in read_log(pb.ReadLogRequest(from_pos=0), timeout=60):
                read += len(chunk.data)
        mib = read / (1 << 20)
        return mib, mib / (time.perf_counter() - started)


WORKLOADS: dict[str, tuple[str, str, Work]] = {
    "status": ("sequential Status (no Raft work)", "calls/s", statuses),
    "put": ("sequential unary Put, 1 KiB", "puts/s", sequential_puts),
    "frames32": ("PutFrames, 32 puts in flight", "puts/s", framed_puts),
    "pull16k": ("Pull 16k x 1 KiB, 1,024 per call", "msgs/s", pulls),
    "readlog": ("ReadLog, whole log", "MiB/s", read_logs),
}
UNIT = {"status": "call", "put": "put", "frames32": "put", "pull16k": "Pull call", "readlog": "MiB"}


async def run(seconds: float, reps: int) -> dict[str, dict[str, list[Sample]]]:
    samples: dict[str, dict[str, list[Sample]]] = {w: {s: [] for s in STACKS} for w in WORKLOADS}
    with tempfile.TemporaryDirectory(prefix="bench-client-port-") as root, clusters(
        Path(root)
    ) as made:  # fmt: skip
        for cluster in made.values():
            await fill_pull_queue(cluster.specs[cluster.leader_id()].client)
        for rep in range(reps):
            order = STACKS if rep % 2 == 0 else STACKS[::-1]
            for name, (_, _, work) in WORKLOADS.items():
                for stack in order:
                    sample = await measured(made[stack], work, seconds)
                    samples[name][stack].append(sample)
                    print(f"round {rep + 1} {name:<9} {stack:<8} {sample[0]:>10,.1f}/s "
                          f"leader {sample[1]:,.0f} us/{UNIT[name]}", flush=True)  # fmt: skip
    return samples


# ---------------------------------------------------------------- the port alone


class _Echo(pb_grpc.DLedgerClientServicer):  # type: ignore[misc]
    """Answers at once: what is left is the stack's own cost."""

    async def Status(self, request: pb.StatusRequest, context: object) -> pb.StatusResponse:
        return pb.StatusResponse(node_id=1)

    async def PutFrames(
        self, requests: AsyncIterator[pb.PutFrame], context: object
    ) -> AsyncIterator[pb.PutFrameResult]:
        async for frame in requests:
            yield pb.PutFrameResult(seq=frame.seq)


async def serve_alone(stack: str, address: str) -> None:
    """`--serve-alone STACK ADDRESS`: the echo service on `stack` until killed."""
    services = ((pb_grpc.add_DLedgerClientServicer_to_server, _Echo()),)
    if stack == "h2":
        await h2_port.ClientServer(services, None).start(address)
    else:
        server = grpc.aio.server()
        add_services(server, *services)
        server.add_insecure_port(address)
        await server.start()
    await asyncio.Event().wait()


async def alone_unary(channel: grpc.aio.Channel, seconds: float) -> tuple[float, float]:
    status = pb_grpc.DLedgerClientStub(channel).Status
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        await status(pb.StatusRequest(), timeout=10)
        count += 1
    return count, count / (time.perf_counter() - started)


async def alone_frames(
    channel: grpc.aio.Channel, seconds: float, inflight: int = 1
) -> tuple[float, float]:
    call = pb_grpc.DLedgerClientStub(channel).PutFrames(timeout=seconds + 30)
    frame = pb.PutFrame(messages=[pb.MessageData(topic="t", body=BODY)])
    window = asyncio.Semaphore(inflight)
    count, started = 0, time.perf_counter()

    async def write() -> None:
        while time.perf_counter() - started < seconds:
            await window.acquire()
            await call.write(frame)
        await call.done_writing()

    writer = asyncio.ensure_future(write())
    async for _ in call:
        count += 1
        window.release()
    await writer
    return count, count / (time.perf_counter() - started)


ALONE: dict[
    str, tuple[str, Callable[[grpc.aio.Channel, float], Awaitable[tuple[float, float]]]]
] = {
    "alone_unary": ("port alone: sequential unary calls", alone_unary),
    "alone_stream": ("port alone: PutFrames ping-pong, 1 KiB", alone_frames),
    "alone_stream32": (
        "port alone: PutFrames 32 x 1 KiB in flight",
        lambda channel, seconds: alone_frames(channel, seconds, 32),
    ),
}


def port_alone(seconds: float, reps: int) -> dict[str, dict[str, list[Sample]]]:
    """An echo server process per stack (uvloop), measured in turns."""
    servers = {}
    try:
        for stack in STACKS:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                address = f"127.0.0.1:{s.getsockname()[1]}"
            cmd = [sys.executable, __file__, "--serve-alone", stack, address]
            servers[stack] = (subprocess.Popen(cmd), address)
        return asyncio.run(_alone_rounds(servers, seconds, reps))
    finally:
        for proc, _ in servers.values():
            proc.kill()
            proc.wait()


async def _alone_rounds(
    servers: dict[str, tuple[subprocess.Popen[bytes], str]], seconds: float, reps: int
) -> dict[str, dict[str, list[Sample]]]:
    samples: dict[str, dict[str, list[Sample]]] = {w: {s: [] for s in STACKS} for w in ALONE}
    for rep in range(reps):
        for name, (_, work) in ALONE.items():
            for stack in STACKS if rep % 2 == 0 else STACKS[::-1]:
                proc, address = servers[stack]
                async with grpc.aio.insecure_channel(address) as channel:
                    await asyncio.wait_for(channel.channel_ready(), 30)
                    before = node_usage(proc.pid)[0]
                    units, rate = await work(channel, seconds)
                    cpu = (node_usage(proc.pid)[0] - before) / units * 1e6
                samples[name][stack].append((rate, cpu, cpu))
                print(f"round {rep + 1} {name:<14} {stack:<8} {rate:>10,.1f}/s "
                      f"server {cpu:,.0f} us/round trip", flush=True)  # fmt: skip
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--serve-alone", nargs=2, metavar=("STACK", "ADDRESS"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.serve_alone:
        uvloop.run(serve_alone(*args.serve_alone))  # the loop a node runs on
        return
    load = Path("/proc/loadavg").read_text().split()[:3]
    samples = asyncio.run(run(args.seconds, args.reps))
    alone = port_alone(args.seconds, args.reps)
    rows: list[tuple[str, str, str]] = []
    metrics: dict[str, float] = {}
    for name, (label, unit, _) in WORKLOADS.items():
        for stack in STACKS:
            runs = samples[name][stack]
            rate, lead, every = (statistics.median(r[i] for r in runs) for i in range(3))
            metrics[f"{name}_{stack}_per_s"] = rate
            metrics[f"{name}_{stack}_leader_cpu_us_per_{UNIT[name].split()[-1].lower()}"] = lead
            metrics[f"{name}_{stack}_cluster_cpu_us_per_{UNIT[name].split()[-1].lower()}"] = every
            note = f"leader CPU {lead:,.0f} us/{UNIT[name]}, all nodes {every:,.0f}"
            rows.append((f"{label} [{stack}]", f"{rate:,.1f} {unit}", note))
        ratio = metrics[f"{name}_h2_per_s"] / metrics[f"{name}_grpcio_per_s"]
        metrics[f"{name}_h2_vs_grpcio"] = ratio
        rows.append((f"{label}: h2 / grpcio", f"{ratio:.2f}x", ""))
    for name, (label, _) in ALONE.items():
        for stack in STACKS:
            runs = alone[name][stack]
            rate, cpu = (statistics.median(r[i] for r in runs) for i in range(2))
            metrics[f"{name}_{stack}_per_s"] = rate
            metrics[f"{name}_{stack}_server_cpu_us_per_round_trip"] = cpu
            rows.append((f"{label} [{stack}]", f"{rate:,.1f}/s", f"server CPU {cpu:,.0f} us"))
        ratio = metrics[f"{name}_h2_per_s"] / metrics[f"{name}_grpcio_per_s"]
        metrics[f"{name}_h2_vs_grpcio"] = ratio
        rows.append((f"{label}: h2 / grpcio", f"{ratio:.2f}x", ""))
    rows.append(("loadavg at start", " ".join(load), f"{args.reps} rounds of {args.seconds}s"))
    metrics["reps"] = args.reps
    report("client_port", rows, metrics)
    print(f"loadavg at end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; "
          f"pid {os.getpid()}")  # fmt: skip


if __name__ == "__main__":
    main()
