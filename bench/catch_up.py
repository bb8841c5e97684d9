"""Catch-up of a wiped node (issue 22, item 5): how fast the leader brings a node whose
data is gone back up to date, against a raw copy of the same bytes, and what it costs
the puts meanwhile.

A local 3-node cluster (real processes on loopback, sync flush, bench/cluster.py's
settings); `--gib` GiB of committed log written through batched puts (PutBatch of
256 messages of `--body-bytes`, 4 in flight). Then:

- catch-up: stop a follower, delete its data directory, start it again with the same
  id; the seconds until its applied and committed index equal the leader's (Status
  polled every 0.1 s), from its first Status answer (the figure) and from the start
  of its process; MB/s = the leader's log bytes (data files, committed position) /
  those seconds (MB = 10^6 bytes). The leader sends the log through the append path
  (raft/replication.py, the peer link, EntryStore.append_entries on the follower); a
  Raft Snapshot only if its retention dropped the log's start (not here). Also: until
  the node has dispatched it all (consume queues, key index: what it serves reads
  from), and the CPU the leader and the follower spent, per thread kind
  (bench/put_profile.py's kinds: loop, python threads, grpc threads);
- copy: the same bytes of the leader's commit-log files (data up to the log's end,
  index up to its last entry) copied on the same file system with copy_file_range
  and fsynced, as `cp` would: warm (the leader's pages cached: they were just
  written) and cold (its pages dropped first with posix_fadvise DONTNEED, only those
  files'), each twice per repetition (medians); catch-up/copy ratios;
- puts while a node catches up: bench/cluster.py's (b) 32 in-flight puts and (a) one
  sequential client, `--seconds` each, with all three nodes up (before and after) and
  while a wiped follower catches up; issue 22's target is at most 20% below the
  steady figure. Each catching-up window reports how far the node still lagged at its
  end (a window the node finished inside is partly steady).

`--profile` runs the nodes under cProfile (bench/_profiled_node.py) and prints the
leader's and the follower's top functions over the unloaded catch-up (the figures then
drop: profile runs are for where, not how fast; no JSON then). `--cold` also drops the
leader's cached pages before each catch-up. `--dir` puts the cluster (and the copies)
on another file system. Run:
`.venv/bin/python bench/catch_up.py [--gib 1.0] [--seconds 5] [--reps 1]`; a quick run:
`--gib 0.1 --seconds 2`. Writes bench/results/catch_up.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._catch_up_report import (
    MB,
    WORKLOADS,
    CatchUp,
    Rates,
    Row,
    catch_up_rows,
    copy_rows,
    rate_rows,
)
from bench._proc import loadavg
from bench._report import report
from bench.cluster import CONFIG, async_client, concurrent, sequential, wait_caught_up
from bench.put_profile import threads
from dledger_commitlog.cli.launcher import LocalCluster, answered
from dledger_commitlog.client import MessageSpec, NodeStatus

_POLL_S = 0.1
_PROFILED = Path(__file__).resolve().parent / "_profiled_node.py"


def status(cl: LocalCluster, node_id: int) -> NodeStatus | None:
    s = cl.statuses(timeout_s=1.0).get(node_id)
    return s if isinstance(s, NodeStatus) else None


def leader_status(cl: LocalCluster, timeout_s: float = 30.0) -> NodeStatus:
    """The leader's status, asked again while it misses polls (a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        leader = cl.wait_for_leader(timeout_s=timeout_s)
        s = status(cl, leader)
        if s is not None and s.role == "leader":
            return s
        if time.monotonic() > deadline:
            raise RuntimeError(f"the leader {leader} does not answer Status")
        time.sleep(_POLL_S)


def data_dir(cl: LocalCluster, node_id: int) -> Path:
    spec = cl.specs[node_id]
    path = Path(spec.data_dir)
    return path if path.is_absolute() else spec.home / path


def fill(cl: LocalCluster, target_bytes: int, body_bytes: int) -> tuple[int, float]:
    """Batched puts (256 x 4 in flight) until the log holds `target_bytes` of bodies;
    the messages put and the seconds it took."""
    batch = [MessageSpec("catchup", b"c" * body_bytes) for _ in range(256)]
    per_batch = len(batch) * body_bytes

    async def run() -> int:
        sent = 0
        async with async_client(cl) as client:

            async def worker() -> None:
                nonlocal sent
                while sent < target_bytes:
                    sent += per_batch  # claimed before the await: no overshoot by 4 batches
                    await client.put_batch(batch)

            await asyncio.gather(*(worker() for _ in range(4)))
        return sent // body_bytes

    started = time.perf_counter()
    count = asyncio.run(run())
    return count, time.perf_counter() - started


# ------------------------------------------------------------------ catch-up


def dispatched(s: NodeStatus) -> bool:
    return s.dispatched_pos >= s.committed_pos


def wipe_and_start(cl: LocalCluster, node_id: int) -> float:
    """Stop `node_id`, delete its data directory, start it again: the start's time."""
    cl.stop(node_id)
    shutil.rmtree(data_dir(cl, node_id))
    started = time.monotonic()
    cl.start(node_id)
    return started


def wait_node(
    cl: LocalCluster,
    node_id: int,
    started: float,
    timeout_s: float,
    ready: Callable[[NodeStatus], bool] = lambda _s: True,
    what: str = "come up",
) -> float:
    """Seconds from `started` until `node_id` answers Status, and `ready` of it."""
    while (s := status(cl, node_id)) is None or not ready(s):
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"node {node_id} did not {what}:\n{cl.log_tail(node_id, 20)}")
        time.sleep(_POLL_S)
    return time.monotonic() - started


def wait_applied(
    cl: LocalCluster, node_id: int, started: float, timeout_s: float
) -> tuple[float, NodeStatus]:
    """Seconds from `started` until `node_id` has applied and committed what the leader
    has committed (a moving target under load), and the leader's status then. A node
    that misses a poll (a loaded machine) is asked again, until `timeout_s`."""
    while True:
        got = answered(cl.statuses(timeout_s=1.0))
        leaders = [s for s in got.values() if s.role == "leader"]
        lead = max(leaders, key=lambda s: s.term) if leaders else None
        me = got.get(node_id)
        if lead and me and min(me.applied_index, me.committed_index) >= lead.committed_index:
            return time.monotonic() - started, lead
        if time.monotonic() - started > timeout_s:
            where = "no answer" if me is None else f"applied {me.applied_index}"
            has = "no leader" if lead is None else f"leader committed {lead.committed_index}"
            raise RuntimeError(
                f"node {node_id} did not catch up in {timeout_s:g} s ({where}, {has})"
            )
        time.sleep(_POLL_S)


def catch_up(
    cl: LocalCluster,
    node_id: int,
    timeout_s: float,
    *,
    cold: bool,
    on_up: Callable[[list[int]], None] = lambda _pids: None,
    on_done: Callable[[list[int]], None] = lambda _pids: None,
) -> CatchUp:
    """Wipe `node_id`, restart it and time its catch-up, nothing else asked of the
    cluster; `on_up` and `on_done` get the leader's and the node's pids when it first
    answers and once it has caught up (a profile's window)."""
    leader = cl.wait_for_leader()
    if cold:
        drop_cached(commitlog_files(data_dir(cl, leader) / "commitlog"))
    started = wipe_and_start(cl, node_id)
    up_s = wait_node(cl, node_id, started, timeout_s)
    pids = {"leader": cl.pid(leader), "follower": cl.pid(node_id)}
    alive = [pid for pid in pids.values() if pid is not None]
    on_up(alive)
    before = {role: threads(pid) for role, pid in pids.items() if pid is not None}
    done_s, lead = wait_applied(cl, node_id, started, timeout_s)
    on_done(alive)
    after = {role: threads(pid) for role, pid in pids.items() if pid is not None}
    cpu = {
        role: {
            kind: after[role][kind][0] - before[role].get(kind, (0.0, 0))[0] for kind in after[role]
        }
        for role in after
    }
    dispatched_s = wait_node(cl, node_id, started, timeout_s, dispatched, "dispatch its log")
    lag = me.loop_lag_max_ms if (me := status(cl, node_id)) else float("nan")
    return CatchUp(up_s, done_s, dispatched_s, lead.committed_pos, lead.committed_index, cpu, lag)


# ------------------------------------------------------------------ raw copy


def commitlog_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def drop_cached(files: list[Path]) -> None:
    """Drop these files' pages from the page cache (clean ones: fsynced first)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def used_bytes(path: Path, log_bytes: int, index_bytes: int) -> int:
    """How much of a commit-log file holds the log: a segment named by its start offset
    up to the log's end (data files: `log_bytes`; index files: `index_bytes`); other
    files whole. Preallocated space past the end is not log."""
    size = path.stat().st_size
    if not path.name.isdigit():
        return size
    end = index_bytes if path.parent.name == "index" else log_bytes
    return max(0, min(size, end - int(path.name)))


def copy_log(
    src: Path, dst: Path, log_bytes: int, index_bytes: int, *, cold: bool
) -> tuple[int, float]:
    """Copy the used bytes of `src`'s files to `dst` (copy_file_range, fsync each file
    and the directories, as a durable `cp`); the bytes copied and the seconds."""
    files = commitlog_files(src)
    if cold:
        drop_cached(files)
    copied = 0
    started = time.perf_counter()
    for path in files:
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        left = used_bytes(path, log_bytes, index_bytes)
        with path.open("rb") as fin, target.open("wb") as fout:
            while left > 0:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), min(left, 1 << 30))
                if n == 0:
                    break
                left -= n
                copied += n
            os.fsync(fout.fileno())
    for d in {dst, *(p.parent for p in dst.rglob("*"))}:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    seconds = time.perf_counter() - started
    drop_cached(commitlog_files(dst))  # the copy's pages are not the cluster's
    shutil.rmtree(dst)
    return copied, seconds


# ------------------------------------------------------------------ puts meanwhile


def put_rate(cl: LocalCluster, workload: str, seconds: float) -> float:
    """Puts/s of one of bench/cluster.py's workloads over `seconds`."""
    if workload == "seq":
        with cl.client() as client:
            return sequential(client, seconds)[0]
    return asyncio.run(concurrent(cl, 32, seconds))[0]


def steady_round(cl: LocalCluster, seconds: float, rates: Rates) -> None:
    for w in WORKLOADS:
        rates.steady.setdefault(w, []).append(put_rate(cl, w, seconds))


def catching_round(
    cl: LocalCluster, node_id: int, seconds: float, timeout_s: float, rates: Rates
) -> None:
    """Wipe and restart `node_id`; each workload's window while it catches up."""
    leader = cl.wait_for_leader()
    started = wipe_and_start(cl, node_id)
    up_s = wait_node(cl, node_id, started, timeout_s)
    for w in WORKLOADS:
        rates.catching.setdefault(w, []).append(put_rate(cl, w, seconds))
        lead, me = status(cl, leader), status(cl, node_id)
        lag = -1 if lead is None or me is None else lead.committed_index - me.applied_index
        rates.lag_at_end.setdefault(w, []).append(lag)
    done_s, lead = wait_applied(cl, node_id, started, timeout_s)
    dispatched_s = wait_node(cl, node_id, started, timeout_s, dispatched, "dispatch its log")
    rates.loaded.append(
        CatchUp(up_s, done_s, dispatched_s, lead.committed_pos, lead.committed_index, {})
    )


def signaller(sig: int) -> Callable[[list[int]], None]:
    """Send `sig` to each pid (bench/_profiled_node.py: SIGUSR1 starts, SIGUSR2 writes)."""

    def send(pids: list[int]) -> None:
        for pid in pids:
            os.kill(pid, sig)

    return send


def print_profile(path: Path, role: str, log_bytes: int, top: int) -> None:
    """`role`'s top functions by own time, in ms per MB caught up."""
    table = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    idle = "<method 'poll' of 'select.epoll' objects>"
    busy = sum(v[2] for k, v in table.items() if k[2] != idle)
    mb = log_bytes / MB
    print(
        f"\n{role}'s event loop under cProfile over the catch-up ({path}); "
        f"busy {busy:.1f} s = {busy / mb * 1e3:.2f} ms/MB, idle epoll waits left out"
    )
    ranked = sorted((k for k in table if k[2] != idle), key=lambda k: -table[k][2])
    for key in ranked[:top]:
        _prim, calls, own, cum, _callers = table[key]
        where = f"{Path(key[0]).name}:{key[1]}({key[2]})"
        print(
            f"{own / mb * 1e3:7.3f} ms/MB own {cum / mb * 1e3:8.3f} cum {own / busy:5.1%} "
            f"{calls:>9}  {where}"
        )


# ------------------------------------------------------------------ main


def filled(
    cl: LocalCluster, args: argparse.Namespace
) -> tuple[int, int, list[Row], dict[str, float]]:
    """Start `cl`, write the log, wait until all have it: the leader, the follower to
    wipe, and the rows and metrics of the writing."""
    cl.up()
    count, fill_s = fill(cl, int(args.gib * (1 << 30)), args.body_bytes)
    wait_caught_up(cl, timeout_s=args.timeout_s)
    lead = leader_status(cl)
    m = {"fill_msgs_per_s": count / fill_s, "fill_mb_per_s": lead.committed_pos / fill_s / MB}
    size = f"{count:,} messages of {args.body_bytes} B, {lead.committed_pos / MB:,.0f} MB of log"
    rows: list[Row] = [
        (
            "write the log (PutBatch 256 x 4)",
            f"{count / fill_s:,.0f} msgs/s",
            f"{size} in {fill_s:.1f} s",
        )
    ]
    return lead.node_id, min(i for i in cl.specs if i != lead.node_id), rows, m


def measure(args: argparse.Namespace) -> None:
    """Catch-up, copies and puts meanwhile, on one cluster: catch_up.json."""
    rows: list[Row] = [("loadavg at start", loadavg(), "")]
    copies: dict[str, list[tuple[int, float]]] = {"warm": [], "cold": []}
    unloaded: list[CatchUp] = []
    rates = Rates({}, {}, {}, [])
    with (
        tempfile.TemporaryDirectory(prefix="catch-up-", dir=args.dir) as tmp,
        LocalCluster(Path(tmp) / "cluster", extra_config=CONFIG) as cl,
    ):
        leader, node, fill_rows, m = filled(cl, args)
        rows += fill_rows
        src = data_dir(cl, leader) / "commitlog"
        for _rep in range(args.reps):
            lead = leader_status(cl)
            index_end = (lead.last_index + 1) * 32
            for cache in ("cold", "warm", "warm", "cold"):  # a cold copy leaves pages cached
                dst = Path(tmp) / "copy"
                copies[cache].append(
                    copy_log(src, dst, lead.committed_pos, index_end, cold=cache == "cold")
                )
            unloaded.append(catch_up(cl, node, args.timeout_s, cold=args.cold))
            steady_round(cl, args.seconds, rates)
            catching_round(cl, node, args.seconds, args.timeout_s, rates)
        steady_round(cl, args.seconds, rates)
        if leader_status(cl).node_id != leader:
            rows.append(("NOTE", "leadership moved", "during the run"))
    cu = sorted(unloaded, key=lambda c: c.mb_per_s)[len(unloaded) // 2]  # the median run
    label = f"catch-up of a wiped node ({'cold' if args.cold else 'warm'} leader cache)"
    for part in (catch_up_rows(cu, label), copy_rows(copies, cu.mb_per_s), rate_rows(rates)):
        rows += part[0]
        m |= part[1]
    rows.append(("loadavg at end", loadavg(), ""))
    report("catch_up", rows, m)


def profile(args: argparse.Namespace) -> None:
    """One unloaded catch-up with the nodes under cProfile: the leader's and the
    follower's top functions (no JSON)."""
    prof_dir = Path(tempfile.mkdtemp(prefix="catch-up-profile-"))
    with (
        tempfile.TemporaryDirectory(prefix="catch-up-", dir=args.dir) as tmp,
        LocalCluster(
            Path(tmp) / "cluster",
            extra_config=CONFIG,
            command_prefix=lambda _i: [sys.executable, str(_PROFILED)],
            env={"DLEDGER_PROFILE_DIR": str(prof_dir)},
        ) as cl,
    ):
        leader, node, rows, _m = filled(cl, args)
        start, stop = signaller(signal.SIGUSR1), signaller(signal.SIGUSR2)
        cu = catch_up(cl, node, args.timeout_s, cold=args.cold, on_up=start, on_done=stop)
        pids = {"leader": cl.pid(leader), f"node {node} catching up": cl.pid(node)}
    for label, value, note in [*rows, *catch_up_rows(cu, "catch-up (under cProfile)")[0]]:
        print(f"{label:<34} {value:>14}  {note}")
    for role, pid in pids.items():
        print_profile(prof_dir / f"node-{pid}.prof", role, cu.log_bytes, args.top)


def compare_trees(args: argparse.Namespace, other: Path) -> None:
    """Unloaded catch-ups on a cluster of this tree's code and one of `other`'s, up at
    once, taking turns (order alternating): catch_up_vs.json."""
    if not (other / "dledger_commitlog" / "__main__.py").exists():
        raise SystemExit(f"--vs-tree {other}: no dledger_commitlog package there")
    runs: dict[str, list[CatchUp]] = {"this": [], "vs": []}
    rows: list[Row] = [("loadavg at start", loadavg(), ""), ("vs", str(other), "")]
    with (
        tempfile.TemporaryDirectory(prefix="catch-up-", dir=args.dir) as tmp,
        LocalCluster(Path(tmp) / "this", extra_config=CONFIG) as this,
        LocalCluster(
            Path(tmp) / "vs",
            extra_config=CONFIG,
            command_prefix=lambda _i: ["env", f"PYTHONPATH={other}"],
        ) as vs,
    ):
        clusters = {"this": this, "vs": vs}
        nodes = {name: filled(cl, args)[1] for name, cl in clusters.items()}
        for rep in range(args.reps):
            for name in list(clusters) if rep % 2 == 0 else list(clusters)[::-1]:
                cu = catch_up(clusters[name], nodes[name], args.timeout_s, cold=args.cold)
                runs[name].append(cu)
    m: dict[str, float] = {}
    for name, cus in runs.items():
        rates = [cu.mb_per_s for cu in cus]
        m[f"catch_up_mb_per_s_{name}"] = statistics.median(rates)
        cpu = {
            f"{role}{'_loop' if loop else ''}": statistics.median(
                (cu.cpu_s[role].get("loop", 0.0) if loop else sum(cu.cpu_s[role].values()))
                / (cu.log_bytes / 1e9)
                for cu in cus
            )
            for role in ("follower", "leader")
            for loop in (False, True)
        }
        m |= {f"{k}_cpu_s_per_gb_{name}": v for k, v in cpu.items()}
        rows.append(
            (
                f"catch-up, {name}",
                f"{statistics.median(rates):,.1f} MB/s",
                f"runs: {', '.join(f'{r:.1f}' for r in rates)}; CPU s/GB: follower "
                f"{cpu['follower']:.1f} (its loop {cpu['follower_loop']:.1f}), leader "
                f"{cpu['leader']:.1f} (its loop {cpu['leader_loop']:.1f})",
            )
        )
    pairs = [a.mb_per_s / b.mb_per_s for a, b in zip(runs["this"], runs["vs"], strict=True)]
    m["catch_up_this_vs_ratio"] = statistics.median(pairs)
    rows.append(
        (
            "this/vs, pair by pair",
            f"{statistics.median(pairs):.3f}",
            ", ".join(f"{p:.3f}" for p in pairs),
        )
    )
    rows.append(("loadavg at end", loadavg(), ""))
    report("catch_up_vs", rows, m)


def _interrupt(_sig: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM: unwind, so the clusters and temp files go too


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="log to write and catch up, GiB")
    ap.add_argument("--body-bytes", type=int, default=1024, help="message body size")
    ap.add_argument("--seconds", type=float, default=5.0, help="per put window")
    reps = "catch-ups (unloaded and loaded) and copies; medians reported"
    ap.add_argument("--reps", type=int, default=1, help=reps)
    rate = "the nodes' raft.catch_up_mb_s (default: theirs; 0: unthrottled)"
    ap.add_argument("--catch-up-mb-s", type=float, default=None, help=rate)
    ap.add_argument(
        "--cold",
        action="store_true",
        help="drop the leader's cached commit-log pages before each catch-up",
    )
    ap.add_argument("--dir", default=None, help="where the cluster lives (default: $TMPDIR)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per catch-up")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the leader and the follower over one unloaded catch-up",
    )
    ap.add_argument("--top", type=int, default=30, help="functions per profile")
    ap.add_argument(
        "--vs-tree",
        default=None,
        help="A/B: unloaded catch-ups only, on a second cluster whose nodes run the code "
        "of this source tree (e.g. `git archive BASE | tar -x -C DIR`), the two taking "
        "turns; writes catch_up_vs.json alone",
    )
    args = ap.parse_args()
    if args.reps < 1 or args.gib <= 0 or args.body_bytes < 1:
        ap.error("--reps, --gib and --body-bytes must be positive")
    if args.catch_up_mb_s is not None:
        CONFIG["catch_up_mb_s"] = args.catch_up_mb_s  # the clusters this run starts
    signal.signal(signal.SIGTERM, _interrupt)
    if args.vs_tree:
        compare_trees(args, Path(args.vs_tree).resolve())
    elif args.profile:
        profile(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
