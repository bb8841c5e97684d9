"""The Raft peer link alone: two processes exchanging real Raft messages (issue 21).

A driver process and an echo process, each on uvloop, each with a Raft port and a
link to the other, as two nodes are: the driver sends AppendEntries (one entry),
the echo answers each with an AppendResponse on its own link, as a follower does.
(a) ping-pong: one append in flight, a 100-byte entry; (b) 32 appends in flight,
1 KiB entries. Per stack: round trips/s, CPU microseconds per round trip of both
processes together, and context switches per round trip. Stacks: `h2`
(`raftio.transport`, as the node runs it) and `streams`, the floor: the
same RaftBatch bytes, length-prefixed, over one plain asyncio TCP connection
(measured only; not a transport the node offers). The stacks take turns, the
order alternating per round; medians of `--rounds`.

Run: `.venv/bin/python bench/peer_link.py [--seconds 3] [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench._proc import loadavg, process_usage
from bench._report import report
from proto import dledger_pb2 as pb
from raft.messages import AppendEntries, AppendResponse, Message
from raft.types import Entry
from raftio.link import PeerGate, PeerLink
from raftio.transport import open_link, open_peer_server
from raftio.wire import from_proto, to_wire

STACKS = ("h2", "streams")
CLUSTER = "bench"
DRIVER, ECHO = 1, 2
_LEN = struct.Struct(">I")
Send = Callable[[list[Message]], None]
WORKLOADS = {"pingpong": "ping-pong, 100 B", "inflight32": "32 in flight, 1 KiB"}


def answer(m: Message) -> AppendResponse:
    assert isinstance(m, AppendEntries)
    return AppendResponse(ECHO, DRIVER, m.term, m.prev_index + len(m.entries))


def encode(msgs: list[Message]) -> bytes:
    raw = pb.RaftBatch(cluster=CLUSTER, messages=[to_wire(m)[0] for m in msgs])
    data = raw.SerializeToString()
    return _LEN.pack(len(data)) + data


async def read_batches(reader: asyncio.StreamReader, deliver: Callable[[Message], None]) -> None:
    while not reader.at_eof():
        try:
            head = await reader.readexactly(_LEN.size)
        except asyncio.IncompleteReadError:
            return  # the other end closed: the run is over
        batch = pb.RaftBatch.FromString(await reader.readexactly(_LEN.unpack(head)[0]))
        for p in batch.messages:
            deliver(from_proto(p))


class End(NamedTuple):
    """This process's end of a stack: its port, `connect(peer_port)` giving a send
    function, and `close`."""

    port: int
    connect: Callable[[int], Awaitable[Send]]
    close: Callable[[], Awaitable[None]]


async def open_stack(stack: str, me: int, deliver: Callable[[Message], None]) -> End:
    if stack == "streams":
        writers: list[asyncio.StreamWriter] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)  # the echo answers on the connection it was called on
            await read_batches(reader, deliver)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)

        async def connect_streams(port: int) -> Send:
            if port == 0:  # the echo: answer on the driver's connection once it exists
                return lambda msgs: writers[0].write(encode(msgs))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            asyncio.get_running_loop().create_task(read_batches(reader, deliver))
            return lambda msgs: writer.write(encode(msgs))

        async def close_streams() -> None:
            server.close()

        return End(server.sockets[0].getsockname()[1], connect_streams, close_streams)
    gate = PeerGate(CLUSTER, deliver, me=me, members=(DRIVER, ECHO))
    raft_server = open_peer_server(gate)
    port = raft_server.bind("127.0.0.1:0")
    await raft_server.start()
    links: list[PeerLink] = []

    async def connect_link(peer: int) -> Send:
        link = open_link(CLUSTER, ECHO if me == DRIVER else DRIVER, f"127.0.0.1:{peer}", me=me)
        link.start()
        links.append(link)
        return lambda msgs: link.send([to_wire(m) for m in msgs])

    async def close_link() -> None:
        for link in links:
            await link.close()
        await raft_server.stop(grace_s=0)

    return End(port, connect_link, close_link)


async def echo(stack: str) -> None:
    """The echo process: print our port, read the driver's, answer every append."""
    sends: list[Send] = []
    end = await open_stack(stack, ECHO, lambda m: sends[0]([answer(m)]))
    print(end.port, flush=True)
    driver_port = int(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    sends.append(await end.connect(0 if stack == "streams" else driver_port))
    print("ready", flush=True)  # answers can go out now
    await asyncio.Event().wait()


async def drive(stack: str, seconds: float) -> dict[str, float]:
    """Start an echo, run (a) and (b) against it; what each cost."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--echo", stack, stdin=PIPE, stdout=PIPE
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        echo_port = int(await child.stdout.readline())
        waiting: dict[int, asyncio.Future[None]] = {}

        def deliver(m: Message) -> None:
            assert isinstance(m, AppendResponse)
            waiting.pop(m.index).set_result(None)

        end = await open_stack(stack, DRIVER, deliver)
        child.stdin.write(f"{end.port}\n".encode())
        await child.stdin.drain()
        send = await end.connect(echo_port)
        assert await child.stdout.readline() == b"ready\n"
        out: dict[str, float] = {}
        await run(send, waiting, 1, 100, 1.0)  # warm-up: connections up
        for name, inflight, size in (("pingpong", 1, 100), ("inflight32", 32, 1024)):
            before = process_usage(os.getpid()), process_usage(child.pid)
            started = time.perf_counter()
            trips = await run(send, waiting, inflight, size, seconds)
            wall = time.perf_counter() - started
            after = process_usage(os.getpid()), process_usage(child.pid)
            cpu = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
            switches = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
            out |= {
                f"{name}_round_trips_per_s": trips / wall,
                f"{name}_cpu_us_per_round_trip": cpu / trips * 1e6,
                f"{name}_context_switches_per_round_trip": switches / trips,
            }
        await end.close()
        return out
    finally:
        child.kill()
        await child.wait()


async def run(
    send: Send, waiting: dict[int, asyncio.Future[None]], inflight: int, size: int, seconds: float
) -> int:
    """Round trips of `inflight` concurrent senders of `size`-byte entries for `seconds`."""
    loop = asyncio.get_running_loop()
    end = time.perf_counter() + seconds
    data = bytes(size)
    counter = [0, 0]  # next index, round trips

    async def sender() -> None:
        while time.perf_counter() < end:
            counter[0] += 1
            index = counter[0]
            fut = waiting[index + 1] = loop.create_future()
            send([AppendEntries(DRIVER, ECHO, 1, index, 1, (Entry(index + 1, 1, data),), index)])
            async with asyncio.timeout(10):
                await fut
            counter[1] += 1

    await asyncio.gather(*(sender() for _ in range(inflight)))
    return counter[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0, help="per workload and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stacks", default=",".join(STACKS))
    ap.add_argument("--echo", choices=STACKS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo:
        uvloop.run(echo(args.echo))
        return
    stacks = args.stacks.split(",")
    load_before = loadavg()
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in stacks}
    for r in range(args.rounds):
        for stack in stacks if r % 2 == 0 else stacks[::-1]:
            runs[stack].append(uvloop.run(drive(stack, args.seconds)))
    metrics: dict[str, float] = {}
    rows: list[tuple[str, str, str]] = []
    for stack in stacks:
        med = {k: statistics.median(r[k] for r in runs[stack]) for k in runs[stack][0]}
        metrics |= {f"{stack}_{k}": v for k, v in med.items()}
        for name, label in (
            ("pingpong", "ping-pong, 100 B"),
            ("inflight32", "32 in flight, 1 KiB"),
        ):
            rates = ", ".join(f"{r[f'{name}_round_trips_per_s']:,.0f}" for r in runs[stack])
            rows.append(
                (
                    f"{stack}: {label}",
                    f"{med[f'{name}_round_trips_per_s']:,.0f} /s",
                    f"{med[f'{name}_cpu_us_per_round_trip']:,.0f} us CPU, "
                    f"{med[f'{name}_context_switches_per_round_trip']:.1f} switches "
                    f"per round trip [runs: {rates}]",
                )
            )
    if set(stacks) == set(STACKS):
        for name in ("pingpong", "inflight32"):
            key = f"{name}_round_trips_per_s"
            ratio = metrics[f"h2_{key}"] / metrics[f"streams_{key}"]
            metrics[f"h2_vs_streams_{key}_ratio"] = ratio
            rows.append((f"h2 / streams: {name}", f"{ratio:.2f}x", "round trips/s"))
    rows.append(("loadavg before / after", f"{load_before} / {loadavg()}", ""))
    report("peer_link", rows, metrics)


if __name__ == "__main__":
    main()
