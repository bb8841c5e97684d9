"""Where a sequential put's CPU goes: per node and thread kind, and (with --cprofile)
the leader's event-loop functions.

A local 3-node cluster (sync flush, 1 KiB messages, bench/cluster.py's settings);
one blocking client puts one message at a time for `--seconds`. Read from /proc
before and after, per node (leader, followers) and per kind of thread:

- loop: the main thread, which runs the node's event loop (Raft, the services);
- python: the node's other Python threads (the fsync thread of the group commit,
  the read pool, the async-mode flush, and grpc.aio's completion-queue poller);
- grpc: grpcio's native threads (event_engine, its timer).

Each as CPU microseconds and context switches per put, and the client's own CPU per
put (this process). With `--cprofile` the nodes run under cProfile (main thread only;
the rates then drop), profiled over the measured window only, and the leader's top
functions by own time are printed, idle waiting in epoll left out. Run:
`.venv/bin/python bench/put_profile.py [--seconds 5] [--cprofile]`; writes
bench/results/put_profile.json (without --cprofile).
"""

from __future__ import annotations

import argparse
import collections
import os
import pstats
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import report
from bench.cluster import CONFIG, sequential
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
_PROFILED = Path(__file__).resolve().parent / "_profiled_node.py"


def thread_kind(pid: int, tid: str, name: str) -> str:
    if tid == str(pid):
        return "loop"
    if name == "python":
        return "python"
    return "grpc"


def threads(pid: int) -> dict[str, tuple[float, int]]:
    """CPU seconds and context switches per thread kind of process `pid`, so far."""
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text().splitlines()
        except OSError:  # a thread that ended meanwhile
            continue
        row = out[thread_kind(pid, task.name, name)]
        row[0] += (int(stat[11]) + int(stat[12])) * _TICK_S
        row[1] += sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def profiling(pids: Iterable[int], sig: int, on: bool) -> None:
    """Start (SIGUSR1) or stop and write (SIGUSR2) the nodes' profiles."""
    if on:
        for pid in pids:
            os.kill(pid, sig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--cprofile", action="store_true", help="nodes under cProfile")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    prof_dir = Path(tempfile.mkdtemp(prefix="put-profile-"))
    prefix = None
    if args.cprofile:
        os.environ["DLEDGER_PROFILE_DIR"] = str(prof_dir)
        prefix = lambda _i: [sys.executable, str(_PROFILED)]  # noqa: E731
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), extra_config=CONFIG, command_prefix=prefix) as cl,
    ):
        cl.up()
        leader = cl.wait_for_leader()
        pids = {i: pid for i in cl.specs if (pid := cl.pid(i)) is not None}
        with Client([s.client for s in cl.specs.values()]) as client:
            sequential(client, 1.0)  # warm-up
            before = {i: threads(p) for i, p in pids.items()}
            profiling(pids.values(), signal.SIGUSR1, args.cprofile)
            me0 = time.process_time()
            rate, lat = sequential(client, args.seconds)
            me = time.process_time() - me0
            profiling(pids.values(), signal.SIGUSR2, args.cprofile)
            after = {i: threads(p) for i, p in pids.items()}
        moved = cl.wait_for_leader() != leader
        cl.down()
    puts = len(lat)
    lat.sort()
    m: dict[str, float] = {
        "seq_msgs_per_s": rate,
        "seq_p50_ms": lat[puts // 2] * 1e3,
        "client_cpu_us_per_put": me / puts * 1e6,
    }
    rows = [
        (
            "sequential puts",
            f"{rate:,.0f}/s",
            f"p50 {m['seq_p50_ms']:.2f} ms over {puts:,} puts"
            + (" (leadership moved: leader figures mix roles)" if moved else ""),
        ),
        ("client", f"{m['client_cpu_us_per_put']:,.0f} us/put", "CPU of this process"),
    ]
    for i in pids:
        role = (
            "leader"
            if i == leader
            else f"follower{sum(1 for j in pids if j < i and j != leader) + 1}"
        )
        kinds = sorted(set(after[i]) | set(before[i]))
        total_cpu = total_sw = 0.0
        for kind in kinds:
            cpu0, sw0 = before[i].get(kind, (0.0, 0))
            cpu1, sw1 = after[i].get(kind, (0.0, 0))
            cpu_us, sw = (cpu1 - cpu0) / puts * 1e6, (sw1 - sw0) / puts
            total_cpu, total_sw = total_cpu + cpu_us, total_sw + sw
            m[f"{role}_{kind}_cpu_us_per_put"] = cpu_us
            m[f"{role}_{kind}_switches_per_put"] = sw
            rows.append((f"{role}: {kind}", f"{cpu_us:,.0f} us/put", f"{sw:.1f} switches/put"))
        m[f"{role}_cpu_us_per_put"] = total_cpu
        m[f"{role}_switches_per_put"] = total_sw
        rows.append((f"{role}: all", f"{total_cpu:,.0f} us/put", f"{total_sw:.1f} switches/put"))
    if not args.cprofile:
        report("put_profile", rows, m)
        return
    for label, value, note in rows:
        print(f"{label:<22} {value:>14}  {note}")
    profile = prof_dir / f"node-{pids[leader]}.prof"  # written at SIGUSR2, before `down`
    table = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    print(f"\nthe leader's event loop under cProfile (idle epoll waits left out); {profile}")
    idle = "<method 'poll' of 'select.epoll' objects>"
    ranked = sorted((k for k in table if k[2] != idle), key=lambda k: -table[k][2])
    for key in ranked[: args.top]:
        _primitive, calls, own, cum, _callers = table[key]
        where = f"{Path(key[0]).name}:{key[1]}({key[2]})"
        print(f"{own / puts * 1e6:8.1f} us/put own {cum / puts * 1e6:8.1f} cum {calls:>8}  {where}")


if __name__ == "__main__":
    main()
