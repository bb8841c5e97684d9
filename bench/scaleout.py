"""Multi-Raft scale-out (issue 24): aggregate puts/s with 1, 2 and 3 groups, two layouts.

A 3-node cluster on this machine, every data group under load at once: per group
one AsyncClient(shard=g) keeps 32 puts of 1 KiB in flight (topic "bench", sync
flush) for `--seconds` after a `--warmup-s`; measured over that window: aggregate
puts/s, p50/p99 latency, and the CPU seconds (utime + stime, /proc/PID/stat) of
every node process and of this load generator, as CPU microseconds per put.

- Layout A, one process per node: `LocalCluster` with `shards_config(G)`, each of
  the 3 processes hosting every group (and group 0, the routes, when G > 1); the
  leaders spread by preferred leader (group g: node sorted(ids)[g % 3]).
- Layout B, one process per group: 3 x G processes; group g's 3 processes form
  their own `LocalCluster` (own ports, data dirs, secret) whose configs host only g
  (`host_shards=(g,)`; group 1's also host group 0 when G > 1), written by the
  layout (`cluster_layout.node_toml`) and started as `dledger serve --config`
  (`GroupCluster`, a `LocalCluster` whose calls name its group). Same code, other
  config: how groups map to processes is a setting.

Per role: in B a process leads or follows one data group, so leader CPU per put
(L) is the leader process's CPU over its group's puts, follower CPU (F) the mean
of the two others'. In A a process leads some groups and follows others; its CPU
is reported per put of all groups, and L and F are fitted (least squares of
cpu_p = L * puts led by p + F * puts followed by p) where the processes' mixes
differ enough (not with G = 3 leaders spread 1-1-1: every process has the same
mix). The `model_*` figures are docs/scaling.md's model applied to L and F of
`--model-from` (default: the medians over the cases that measured L and F).

Everything here shares this machine's cores: 3 to 9 node processes and the load
generator (its own CPU is reported); the machine's busy % says whether a case was
CPU-bound. Run: `.venv/bin/python bench/scaleout.py [--seconds 10]`; writes
bench/results/scaleout.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._proc import loadavg, process_usage
from bench._report import report
from bench.put_profile import threads
from dledger_commitlog.cli.cluster_layout import shards_config
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import AsyncClient, Client, ClientError, NodeStatus
from dledger_commitlog.common.routes import preferred_leader
from dledger_commitlog.node.config import SMALL_SEGMENTS

BODY = b"m" * 1024
INFLIGHT = 32  # puts in flight per group
# the model's worked examples: (hosts, cores per host); hosts * cores a multiple of 3
SHAPES = ((3, 2), (3, 16), (6, 16))
Row = tuple[str, str, str]
Proc = tuple[int, int]  # (node id, group): group 0 for a process hosting every group (A)


class GroupCluster(LocalCluster):
    """The 3 processes of one Raft group in layout B; every call names `group`."""

    def __init__(self, directory: Path, group: int, extra_config: dict[str, Any]) -> None:
        self.group = group
        super().__init__(directory, extra_config=extra_config)

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault("group", self.group)
        return super().client(**kwargs)


@dataclass
class Deployment:
    """A running case: each data group's client addresses, each node process's pid,
    and which process is which group's replica on which node."""

    layout: str  # "a" or "b"
    groups: int
    servers: dict[int, list[str]]  # data group -> its 3 replicas' client addresses
    pids: dict[Proc, int]
    replica: dict[tuple[int, int], Proc]  # (group, node id) -> the process hosting it


@contextlib.contextmanager
def layout_a(root: Path, groups: int, store: dict[str, Any]) -> Iterator[Deployment]:
    with LocalCluster(root, extra_config={**store, **shards_config(groups)}) as cl:
        cl.up(timeout_s=60)
        servers = [s.client for s in cl.specs.values()]
        pids = {(i, 0): pid for i in cl.specs if (pid := cl.pid(i)) is not None}
        replica = {(g, i): (i, 0) for g in range(1, groups + 1) for i in cl.specs}
        yield Deployment("a", groups, {g: servers for g in range(1, groups + 1)}, pids, replica)


@contextlib.contextmanager
def layout_b(root: Path, groups: int, store: dict[str, Any]) -> Iterator[Deployment]:
    with contextlib.ExitStack() as stack:  # every process stopped on the way out
        dep = Deployment("b", groups, {}, {}, {})
        for g in range(1, groups + 1):
            hosted = (0, 1) if g == 1 and groups > 1 else (g,)
            extra = {**store, "shard_count": groups, "host_shards": hosted}
            if groups == 1:
                extra = dict(store)  # today's single-group layout, as in A
            cl = stack.enter_context(GroupCluster(root / f"group{g}", g, extra))
            cl.up(timeout_s=60)
            dep.servers[g] = [s.client for s in cl.specs.values()]
            for i in cl.specs:
                pid = cl.pid(i)
                if pid is None:
                    raise RuntimeError(f"group {g} node {i} is not running")
                dep.pids[(i, g)] = pid
                dep.replica[(g, i)] = (i, g)
        yield dep


async def group_statuses(dep: Deployment) -> dict[int, list[NodeStatus]]:
    out: dict[int, list[NodeStatus]] = {}
    for g, servers in dep.servers.items():
        async with AsyncClient(servers, shard=g) as client:
            got = await client.status_all(timeout_s=1.0)
        out[g] = [s for s in got if isinstance(s, NodeStatus)]
    return out


async def leaders(dep: Deployment, timeout_s: float) -> dict[int, int]:
    """Data group -> its leader's node id, once every group has one and (until
    `timeout_s`) each is led by its preferred node (G > 1; any node for G = 1)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[int, int] = {}
        for g, statuses in (await group_statuses(dep)).items():
            led = [s for s in statuses if s.role == "leader"]
            if led:
                found[g] = max(led, key=lambda s: s.term).node_id
        every = len(found) == dep.groups
        preferred = dep.groups == 1 or all(
            n == preferred_leader(g, [1, 2, 3]) for g, n in found.items()
        )
        if every and (preferred or time.monotonic() >= deadline):
            return found
        if time.monotonic() >= deadline + 30:
            raise RuntimeError(f"groups without a leader: {found} of {dep.groups}")
        await asyncio.sleep(0.1)


@dataclass
class Case:
    """What one case measured over its window."""

    window_s: float
    puts: dict[int, int]  # data group -> puts completed in the window
    lat: list[float]
    errors: int
    cpu: dict[Proc, float]  # CPU seconds per node process in the window
    loop_cpu: dict[Proc, float]  # of which its main thread (the event loop)
    loadgen_cpu: float
    leaders: dict[int, int]
    machine_busy: float  # of all CPUs, by anyone (0..1)
    machine_iowait: float
    moved: bool = False  # a group's leader changed during the run


def machine_ticks() -> tuple[int, int, int]:
    """Since boot, all CPUs (/proc/stat): (busy, iowait, all) clock ticks; busy counts
    every process's work, this bench's and anything else running on the machine."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    busy = user + nice + system + irq + softirq + steal
    return busy, iowait, busy + iowait + idle


Usage = tuple[dict[Proc, float], dict[Proc, float], float, tuple[int, int, int]]


def usage(dep: Deployment) -> Usage:
    """CPU seconds so far: per node process, of its main thread, of this process; and
    the machine's ticks."""
    cpu = {p: process_usage(pid)[0] for p, pid in dep.pids.items()}
    loop = {p: threads(pid).get("loop", (0.0, 0))[0] for p, pid in dep.pids.items()}
    return cpu, loop, process_usage(os.getpid())[0], machine_ticks()


async def run_load(dep: Deployment, seconds: float, warmup_s: float, led: dict[int, int]) -> Case:
    """32 puts in flight per group, all groups at once; measured after the warm-up."""
    puts = {g: 0 for g in dep.servers}
    lat: list[float] = []
    errors = 0
    start = time.perf_counter() + warmup_s
    end = start + seconds

    async def worker(client: AsyncClient, g: int) -> None:
        nonlocal errors
        while (t := time.perf_counter()) < end:
            try:
                await client.put("bench", BODY)
            except ClientError:
                errors += 1
                continue
            done = time.perf_counter()
            if start <= t and done <= end:
                puts[g] += 1
                lat.append(done - t)

    async def window() -> tuple[Usage, Usage, float]:
        await asyncio.sleep(max(0.0, start - time.perf_counter()))  # the warm-up
        before = usage(dep)
        t0 = time.perf_counter()
        await asyncio.sleep(max(0.0, end - time.perf_counter()))  # the measured window
        return before, usage(dep), time.perf_counter() - t0

    async with contextlib.AsyncExitStack() as stack:
        clients = {
            g: await stack.enter_async_context(AsyncClient(s, shard=g))
            for g, s in dep.servers.items()
        }
        measuring = asyncio.ensure_future(window())
        await asyncio.gather(*(worker(c, g) for g, c in clients.items() for _ in range(INFLIGHT)))
        (cpu0, loop0, gen0, m0), (cpu1, loop1, gen1, m1), wall = await measuring
    ticks = max(1, m1[2] - m0[2])
    return Case(
        window_s=wall,
        puts=puts,
        lat=lat,
        errors=errors,
        cpu={p: cpu1[p] - cpu0[p] for p in cpu0},
        loop_cpu={p: loop1[p] - loop0[p] for p in loop0},
        loadgen_cpu=gen1 - gen0,
        leaders=led,
        machine_busy=(m1[0] - m0[0]) / ticks,
        machine_iowait=(m1[1] - m0[1]) / ticks,
    )


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] if s else math.nan


def roles(dep: Deployment, case: Case) -> dict[Proc, tuple[int, int]]:
    """Per node process: (puts it led, puts it followed) in the window."""
    out = {p: (0, 0) for p in dep.pids}
    for (g, node), proc in dep.replica.items():
        led, followed = out[proc]
        if case.leaders[g] == node:
            out[proc] = (led + case.puts[g], followed)
        else:
            out[proc] = (led, followed + case.puts[g])
    return out


def fit(dep: Deployment, case: Case) -> tuple[float, float] | None:
    """L and F (CPU us per put) by least squares over the node processes, or None
    where their (led, followed) mixes are too alike to tell L from F."""
    mix = roles(dep, case)
    a = [(float(led), float(fol), case.cpu[p]) for p, (led, fol) in mix.items()]
    sxx = sum(x * x for x, _, _ in a)
    syy = sum(y * y for _, y, _ in a)
    sxy = sum(x * y for x, y, _ in a)
    det = sxx * syy - sxy * sxy
    if sxx == 0 or syy == 0 or det < 0.05 * sxx * syy:  # nearly collinear mixes
        return None
    sxc = sum(x * c for x, _, c in a)
    syc = sum(y * c for _, y, c in a)
    return (sxc * syy - syc * sxy) / det * 1e6, (syc * sxx - sxc * sxy) / det * 1e6


def name(p: Proc) -> str:
    return f"node{p[0]}" if p[1] == 0 else f"g{p[1]}n{p[0]}"


def case_results(dep: Deployment, case: Case) -> tuple[list[Row], dict[str, float]]:
    key = f"{dep.layout}_g{dep.groups}"
    total = sum(case.puts.values())
    if total == 0:
        raise RuntimeError(f"{key}: no put completed in the window ({case.errors} errors)")
    node_cpu = sum(case.cpu.values())
    cores = os.cpu_count() or 1
    m: dict[str, float] = {
        f"{key}_puts_per_s": total / case.window_s,
        f"{key}_p50_ms": pct(case.lat, 0.5) * 1e3,
        f"{key}_p99_ms": pct(case.lat, 0.99) * 1e3,
        f"{key}_errors": case.errors,
        f"{key}_nodes_cpu_us_per_put": node_cpu / total * 1e6,
        f"{key}_loadgen_cpu_us_per_put": case.loadgen_cpu / total * 1e6,
        f"{key}_nodes_cores": node_cpu / case.window_s,
        f"{key}_loadgen_cores": case.loadgen_cpu / case.window_s,
        f"{key}_bench_busy_pct": (node_cpu + case.loadgen_cpu) / case.window_s / cores * 100,
        f"{key}_machine_busy_pct": case.machine_busy * 100,
        f"{key}_machine_iowait_pct": case.machine_iowait * 100,
        f"{key}_busiest_loop_pct": max(case.loop_cpu.values()) / case.window_s * 100,
        f"{key}_distinct_leader_nodes": len(set(case.leaders.values())),
    }
    m[f"{key}_leader_moved"] = float(case.moved)  # then who led what is unknown: no L, F
    if dep.layout == "b" and not case.moved:  # each process one role: direct
        lead = sum(case.cpu[dep.replica[(g, n)]] for g, n in case.leaders.items())
        follow = sum(
            case.cpu[dep.replica[(g, n)]] / 2 for g, n in dep.replica if case.leaders[g] != n
        )
        m[f"{key}_leader_cpu_us_per_put"] = lead / total * 1e6
        m[f"{key}_follower_cpu_us_per_put"] = follow / total * 1e6
    elif not case.moved and (lf := fit(dep, case)) is not None:
        m[f"{key}_leader_cpu_us_per_put"], m[f"{key}_follower_cpu_us_per_put"] = lf
    per_group = ", ".join(f"g{g} {n / case.window_s:,.0f}" for g, n in sorted(case.puts.items()))
    led = ", ".join(f"g{g}@node{n}" for g, n in sorted(case.leaders.items()))
    rows: list[Row] = [
        (
            f"{key}: {dep.groups} group(s), layout {dep.layout.upper()}",
            f"{m[f'{key}_puts_per_s']:,.0f} puts/s",
            f"p50 {m[f'{key}_p50_ms']:.1f} ms, p99 {m[f'{key}_p99_ms']:.1f} ms; {per_group}; "
            f"leaders {led}; errors {case.errors}",
        ),
        (
            "    CPU us/put: nodes | loadgen",
            f"{m[f'{key}_nodes_cpu_us_per_put']:,.0f} | {m[f'{key}_loadgen_cpu_us_per_put']:,.0f}",
            f"cores busy: nodes {m[f'{key}_nodes_cores']:.2f}, loadgen "
            f"{m[f'{key}_loadgen_cores']:.2f} ({m[f'{key}_bench_busy_pct']:.0f} % of the machine); "
            f"machine {m[f'{key}_machine_busy_pct']:.0f} % busy by anyone, "
            f"{m[f'{key}_machine_iowait_pct']:.0f} % iowait; "
            f"busiest event loop {m[f'{key}_busiest_loop_pct']:.0f} % of a core",
        ),
    ]
    if f"{key}_leader_cpu_us_per_put" in m:
        how = "direct" if dep.layout == "b" else "fitted over the processes"
        rows.append(
            (
                "    CPU us/put: leader L | follower F",
                f"{m[f'{key}_leader_cpu_us_per_put']:,.0f} | "
                f"{m[f'{key}_follower_cpu_us_per_put']:,.0f}",
                f"per put of its group ({how})",
            )
        )
    else:
        why = (
            "a leader moved during the run"
            if case.moved
            else "not separable: every process leads and follows the same mix"
        )
        rows.append(("    CPU us/put: leader L | follower F", "-", why))
    mix = roles(dep, case)
    rows.append(("    per node process", "CPU us/put", "per put of the groups it hosts"))
    for p in sorted(case.cpu, key=lambda q: (q[1], q[0])):
        led_n, fol_n = mix[p]
        us = case.cpu[p] / max(1, led_n + fol_n) * 1e6  # per put of the groups it hosts
        m[f"{key}_{name(p)}_cpu_us_per_put"] = us
        what = []
        if led_n:
            what.append(f"leads {led_n / case.window_s:,.0f} puts/s")
        if fol_n:
            what.append(f"follows {fol_n / case.window_s:,.0f} puts/s")
        rows.append(
            (
                f"    {name(p)}",
                f"{us:,.0f} us/put",
                f"{case.cpu[p] / case.window_s * 100:.0f} % of a core (loop "
                f"{case.loop_cpu[p] / case.window_s * 100:.0f} %); " + ("; ".join(what) or "idle"),
            )
        )
    return rows, m


def bound(groups: int, cores: int, lead_s: float, follow_s: float) -> float:
    """docs/scaling.md's CPU bound on aggregate puts/s: `groups` groups of 3 replicas,
    one process per replica, spread evenly over `cores` cores (3 * groups a multiple
    of `cores`), equal load per group: the busiest core holds ceil(groups / cores)
    leaders and followers for the rest of its 3 * groups / cores replicas."""
    per_core = 3 * groups / cores
    leaders = math.ceil(groups / cores)
    return groups / (leaders * lead_s + (per_core - leaders) * follow_s)


def model(lead_us: float, follow_us: float, source: str) -> tuple[list[Row], dict[str, float]]:
    """docs/scaling.md's model on N hosts x C cores (K = N * C): K/3 groups (one
    replica per core), K groups (three per core), and one process per host."""
    rows: list[Row] = [
        (
            "model (docs/scaling.md)",
            f"L {lead_us:,.0f}, F {follow_us:,.0f} us",
            f"from {source}; CPU-bound, leaders spread, no client cost",
        )
    ]
    m: dict[str, float] = {"model_leader_us": lead_us, "model_follower_us": follow_us}
    lead, follow = lead_us / 1e6, follow_us / 1e6
    for hosts, cores in SHAPES:
        k = hosts * cores
        tag = f"model_{hosts}x{cores}"
        m[f"{tag}_g{k // 3}_puts_per_s"] = sparse = bound(k // 3, k, lead, follow)
        m[f"{tag}_g{k}_puts_per_s"] = full = bound(k, k, lead, follow)
        m[f"{tag}_one_process_per_host_puts_per_s"] = one = hosts / (lead + 2 * follow)
        rows.append(
            (
                f"    {hosts} hosts x {cores} cores",
                f"<= {full:,.0f} puts/s",
                f"with {k} groups (3 replicas a core); {sparse:,.0f} with {k // 3} "
                f"(1 a core); one process per host: {one:,.0f}",
            )
        )
    return rows, m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window per case")
    ap.add_argument("--warmup-s", type=float, default=2.0, help="load before the window")
    ap.add_argument("--groups", default="1,2,3", help="data group counts to run")
    ap.add_argument("--layouts", default="a,b", help="a: process per node, b: per group")
    ap.add_argument(
        "--leader-wait-s",
        type=float,
        default=20.0,
        help="how long to wait for the preferred leaders",
    )
    ap.add_argument(
        "--model-from",
        default="median",
        help="the case whose L and F feed the model (default: the median of "
        "every case that measured them)",
    )
    ap.add_argument(
        "--segment-mb",
        type=int,
        default=SMALL_SEGMENTS["data_segment_bytes"] >> 20,
        help="data segment size (MiB); bench/cluster.py uses 256",
    )
    args = ap.parse_args()
    store = {**SMALL_SEGMENTS, "data_segment_bytes": args.segment_mb << 20}
    counts = [int(g) for g in args.groups.split(",")]
    layouts = args.layouts.split(",")
    if not set(layouts) <= {"a", "b"} or not all(1 <= g <= 9 for g in counts):
        ap.error("--layouts from a,b; --groups from 1..9")
    rows: list[Row] = [("loadavg at start", loadavg(), "")]
    m: dict[str, float] = {
        "loadavg_1m_start": float(loadavg().split()[0] or "nan"),
        "seconds": args.seconds,
        "inflight_per_group": INFLIGHT,
    }
    gen_cpu, gen_puts = 0.0, 0
    for layout in layouts:
        for groups in counts:
            with tempfile.TemporaryDirectory(prefix="scaleout-") as tmp:
                start = layout_a if layout == "a" else layout_b
                with start(Path(tmp), groups, store) as dep:
                    led = asyncio.run(leaders(dep, args.leader_wait_s))
                    case = asyncio.run(run_load(dep, args.seconds, args.warmup_s, led))
                    case.moved = asyncio.run(leaders(dep, 0.0)) != led
            case_rows, case_m = case_results(dep, case)
            rows += case_rows
            m |= case_m
            gen_cpu += case.loadgen_cpu
            gen_puts += sum(case.puts.values())
            print("\n".join(f"{a}  {b}  {c}" for a, b, c in case_rows), flush=True)
    m["loadgen_cpu_us_per_put"] = gen_cpu / max(gen_puts, 1) * 1e6
    tail = "_leader_cpu_us_per_put"
    cases = [k.removesuffix(tail) for k in m if k.endswith(tail)]
    if args.model_from != "median":
        cases = [c for c in cases if c == args.model_from]
    if cases:
        lead = statistics.median(m[f"{c}{tail}"] for c in cases)
        follow = statistics.median(m[f"{c}_follower_cpu_us_per_put"] for c in cases)
        how = f"median of {', '.join(cases)}" if len(cases) > 1 else cases[0]
        model_rows, model_m = model(lead, follow, f"{how} (bench/scaleout.py)")
        rows += model_rows
        m |= model_m | {"model_cases": len(cases)}
    for key in ("a", "b"):
        if f"{key}_g1_puts_per_s" in m:
            most = max(m[f"{key}_g{g}_puts_per_s"] for g in counts)
            m[f"{key}_best_over_g1"] = most / m[f"{key}_g1_puts_per_s"]
    rows.append(("loadavg at end", loadavg(), ""))
    report("scaleout", rows, {k: v for k, v in m.items() if not math.isnan(v)})


if __name__ == "__main__":
    main()
