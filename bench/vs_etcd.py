"""dledger-py against etcd 3.4 on this machine: puts/s, latency and CPU per put (issue 31).

Two 3-node clusters on loopback, up at once: ours as bench/cluster.py makes it
(`LocalCluster(Path(tmp), extra_config=CONFIG)`, sync flush) and etcd (the
system's `etcd`, 3 members, its defaults: the WAL fsynced on every commit; data
in a temp dir). Both fsync every acknowledged put on a quorum. 1 KiB values:
(a) one sequential client, one put at a time; (b) 32 puts in flight (ours:
AsyncClient.put from 32 tasks; etcd: 32 threads sharing one `etcd3` client);
(c) batched: ours PutBatch of 1024 and of 256, 4 in flight each ("best" is the
higher), etcd a transaction of 100 puts, 4 in flight (its --max-txn-ops is
128); puts/s counts the single puts. Each workload runs `--seconds`, in
`--rounds` rounds, the system that goes first alternating per round; the
figures are medians over the rounds, with the ratio ours/etcd (puts/s: above 1
ours is faster; latency, CPU, switches: below 1 ours costs less).

Every client is a process of its own, outside the measuring one: ours runs this
file (`--client-of`, the project's venv), etcd's runs bench/_etcd_client.py with
the python of a venv that has `etcd3` from PyPI (it needs protobuf 3, which the
project's cannot have), made on first use at ~/.cache/dledger-bench/etcd3-venv
(`--etcd3-venv` to put it elsewhere). etcd's client talks to the leader, as ours
does. Per put, over each run: the leader's CPU microseconds (etcd's leader from
its /metrics), all 3 server processes' CPU and context switches (all threads,
/proc), and the client process's own CPU. Without etcd, or when its venv cannot
be made, the bench says why in one line and exits 0 without results.

Run: `.venv/bin/python bench/vs_etcd.py [--seconds 5] [--rounds 6] [--quick]`;
writes bench/results/vs_etcd.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._proc import loadavg, process_usage
from bench._report import report
from bench.cluster import BODY, batched, concurrent, fresh_cluster, pct, sequential
from dledger_commitlog.cli.launcher import LocalCluster, free_ports

ETCD_CLIENT = Path(__file__).resolve().parent / "_etcd_client.py"
ETCD3_PACKAGES = ("etcd3==0.12.0", "protobuf>=3.20,<4")  # etcd3's last release; protobuf 3
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
DEFAULT_VENV = CACHE / "dledger-bench" / "etcd3-venv"
# etcd's default backend quota is 2 GiB and nothing is compacted here: room for the
# default rounds' puts (its recommended maximum)
ETCD_QUOTA_BYTES = 8 << 30
# (metric key, label, our client workloads, etcd's): bench/cluster.py's workloads,
# this file's `client_main` runs ours, bench/_etcd_client.py etcd's
PAIRS = (
    ("seq", "(a) 1 sequential client", ("seq",), ("seq",)),
    ("inflight32", "(b) 32 in-flight puts", ("inflight32",), ("inflight32",)),
    ("batch", "(c) batched", ("batch1024x4", "batch256x4"), ("txn100x4",)),
)
BATCH = re.compile(r"batch(\d+)x(\d+)")
Row = tuple[str, str, str]


class Run(NamedTuple):
    """One run of a workload on one system: puts/s, call latencies (p50, p99; a
    batch's or transaction's for the batched ones), and per put: the leader's CPU
    microseconds (nan if the leadership moved), all server processes' CPU
    microseconds and context switches, the client process's CPU microseconds."""

    rate: float
    p50_ms: float
    p99_ms: float
    leader_cpu_us: float
    cluster_cpu_us: float
    switches: float
    client_cpu_us: float


# ------------------------------------------------------------------ the systems


class Side:
    """A running 3-member cluster, as the measurement sees it."""

    name = ""  # ours or etcd: the metrics' infix

    def pids(self) -> dict[str, int]:
        """Member -> its server process."""
        raise NotImplementedError

    def leader(self) -> str:
        raise NotImplementedError

    def client_cmd(self, workload: str, seconds: float) -> list[str]:
        """The command line of a client process running `workload` (see `client_main`)."""
        raise NotImplementedError


class Ours(Side):
    name = "ours"

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def pids(self) -> dict[str, int]:
        return {str(i): pid for i in self.cluster.specs if (pid := self.cluster.pid(i))}

    def leader(self) -> str:
        return str(self.cluster.wait_for_leader())

    def client_cmd(self, workload: str, seconds: float) -> list[str]:
        me = str(Path(__file__).resolve())
        return [
            sys.executable,
            me,
            "--client-of",
            str(self.cluster.directory),
            "--workload",
            workload,
            "--seconds",
            str(seconds),
        ]


class EtcdCluster(Side):
    """3 etcd members on 127.0.0.1 with their data under `directory`; `up` starts them,
    `down` (and the context's exit) SIGKILLs every one this object started."""

    name = "etcd"

    def __init__(self, etcd: str, directory: Path, venv_python: str) -> None:
        self.etcd, self.directory, self.venv_python = etcd, directory, venv_python
        ports = free_ports(6)
        self.client_ports = {f"e{i}": ports[i] for i in range(3)}
        self.peer_ports = {f"e{i}": ports[3 + i] for i in range(3)}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def up(self, timeout_s: float = 30.0) -> EtcdCluster:
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in self.peer_ports.items())
        for name, port in self.client_ports.items():
            peer = f"http://127.0.0.1:{self.peer_ports[name]}"
            cmd = [
                self.etcd,
                "--name",
                name,
                "--data-dir",
                str(self.directory / name),
                "--listen-client-urls",
                f"http://127.0.0.1:{port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{port}",
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "vs-etcd",
                "--quota-backend-bytes",
                str(ETCD_QUOTA_BYTES),
                "--logger",
                "zap",
                "--log-level",
                "warn",
            ]
            with (self.directory / f"{name}.log").open("ab") as log:
                self.procs[name] = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        deadline = time.monotonic() + timeout_s
        while self._leader_now() is None:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"etcd {name} exited with {proc.returncode}: {self.directory / name}.log"
                    )
            if time.monotonic() >= deadline:
                raise RuntimeError(f"etcd: no leader after {timeout_s:g} s")
            time.sleep(0.1)
        return self

    def _leader_now(self) -> str | None:
        """The member whose /metrics says it leads, if one answers so."""
        for name, port in self.client_ports.items():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue
            if re.search(r"^etcd_server_is_leader 1$", text, re.MULTILINE):
                return name
        return None

    def leader(self) -> str:
        deadline = time.monotonic() + 10
        while (leader := self._leader_now()) is None:
            if time.monotonic() >= deadline:
                raise RuntimeError("etcd: no leader in 10 s")
            time.sleep(0.05)
        return leader

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def client_cmd(self, workload: str, seconds: float) -> list[str]:
        endpoint = f"127.0.0.1:{self.client_ports[self.leader()]}"
        return [
            self.venv_python,
            str(ETCD_CLIENT),
            "--endpoint",
            endpoint,
            "--workload",
            workload,
            "--seconds",
            str(seconds),
            "--body-bytes",
            str(len(BODY)),
        ]

    def down(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()


# ------------------------------------------------------------------ the clients


def client_main(directory: Path, workload: str, seconds: float) -> None:
    """Our client process: run `workload` of bench/cluster.py on the cluster at
    `directory` after `ready` / `go` on stdout / stdin; print its figures as JSON (as
    bench/_etcd_client.py does)."""
    cluster = LocalCluster(directory)  # the running cluster's layout, read back
    with cluster.client() as client:
        client.put("bench", BODY)  # warm: the leader found, the channel up
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        cpu = time.process_time()
        per_call = 1
        if workload == "seq":
            rate, lat = sequential(client, seconds)
        elif workload == "inflight32":
            rate, lat = asyncio.run(concurrent(cluster, 32, seconds))
        elif m := BATCH.fullmatch(workload):
            per_call = int(m[1])
            rate, lat = asyncio.run(batched(cluster, per_call, int(m[2]), seconds))
        else:
            raise SystemExit(f"unknown workload {workload}")
        cpu = time.process_time() - cpu
    puts = len(lat) * per_call
    out = {
        "puts": puts,
        "wall_s": puts / rate,
        "cpu_s": cpu,
        "lat_us": [round(x * 1e6) for x in lat],
    }
    print(json.dumps(out), flush=True)


class ClientProcess:
    """A client process and the lines it prints (read by a thread: waits time out)."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def line(self, timeout_s: float) -> str:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"client {self.proc.args!r}: no answer in {timeout_s:g} s") from None
        if line is None:
            raise RuntimeError(f"client {self.proc.args!r} exited with {self.proc.wait()}")
        return line.strip()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """Wait for the process to end (at once if it still waits for `go`); kill it
        after 10 s."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def measure(side: Side, workload: str, seconds: float) -> Run:
    """One run of `workload` by a client process on `side`; what its puts cost."""
    client = ClientProcess(side.client_cmd(workload, seconds))
    try:
        if (said := client.line(timeout_s=120)) != "ready":
            raise RuntimeError(f"{side.name} client: {said!r} instead of ready")
        leader = side.leader()
        pids = side.pids()
        before = {n: process_usage(pid) for n, pid in pids.items()}
        client.send("go")
        figures: dict[str, Any] = json.loads(client.line(timeout_s=seconds + 120))
        after = {n: process_usage(pid) for n, pid in pids.items()}
        moved = side.leader() != leader
    finally:
        client.close()
    puts = figures["puts"]
    if not puts:
        raise RuntimeError(f"{side.name} {workload}: no put completed")
    lat = [x / 1e6 for x in figures["lat_us"]]
    leader_cpu = (after[leader][0] - before[leader][0]) / puts * 1e6
    return Run(
        rate=puts / figures["wall_s"],
        p50_ms=pct(lat, 0.5) * 1e3,
        p99_ms=pct(lat, 0.99) * 1e3,
        leader_cpu_us=math.nan if moved else leader_cpu,
        cluster_cpu_us=sum(after[n][0] - before[n][0] for n in pids) / puts * 1e6,
        switches=sum(after[n][1] - before[n][1] for n in pids) / puts,
        client_cpu_us=figures["cpu_s"] / puts * 1e6,
    )


# ------------------------------------------------------------------ set-up


def etcd_version(etcd: str) -> str:
    out = subprocess.run([etcd, "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"etcd Version: (\S+)", out.stdout)
    return m[1] if m else "?"


def etcd3_python(venv: Path) -> tuple[str | None, str]:
    """The python of `venv` with etcd3 importable, making the venv (or installing into
    it) if needed; else None and why not."""
    python = venv / "bin" / "python"

    def works() -> bool:
        probe = [str(python), "-c", "import etcd3"]
        return (
            python.exists()
            and subprocess.run(probe, capture_output=True, check=False).returncode == 0
        )

    if works():
        return str(python), ""
    print(f"vs_etcd: installing {' '.join(ETCD3_PACKAGES)} into {venv} (once)", file=sys.stderr)
    steps = [[sys.executable, "-m", "venv", str(venv)]] if not python.exists() else []
    steps.append([str(python), "-m", "pip", "install", "--quiet", *ETCD3_PACKAGES])
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{' '.join(step[1:4])}: {exc}"
        if done.returncode != 0:
            errors = [x for x in done.stderr.splitlines() if "ERROR" in x or "Error" in x]
            last = (errors or done.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"{' '.join(step[1:4])} failed: {last.strip()}"
    if not works():
        return None, f"etcd3 does not import in {venv} after installing it"
    return str(python), ""


# ------------------------------------------------------------------ results


def med(values: list[float]) -> float:
    """The median, leaving out nan (a run whose leader moved); nan if nothing is left."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


FIGURES = {  # metric suffix -> (Run field, label, format)
    "msgs_per_s": ("rate", "puts/s", ",.0f"),
    "p50_ms": ("p50_ms", "    p50 latency, ms", ".2f"),
    "p99_ms": ("p99_ms", "    p99 latency, ms", ".2f"),
    "leader_cpu_us_per_put": ("leader_cpu_us", "    leader CPU us/put", ",.1f"),
    "cluster_cpu_us_per_put": ("cluster_cpu_us", "    all 3 nodes CPU us/put", ",.1f"),
    "switches_per_put": ("switches", "    context switches/put, 3 nodes", ",.2f"),
    "client_cpu_us_per_put": ("client_cpu_us", "    client process CPU us/put", ",.1f"),
}


def summary(runs: list[Run]) -> dict[str, float]:
    """Metric suffix -> the median over `runs`."""
    return {
        suffix: med([getattr(r, field) for r in runs]) for suffix, (field, _, _) in FIGURES.items()
    }


def results(
    runs: dict[tuple[str, str], list[Run]], args: argparse.Namespace, version: str
) -> tuple[list[Row], dict[str, float]]:
    m: dict[str, float] = {}
    rows: list[Row] = [("", f"dledger-py | etcd {version}", "ours/etcd (every row)")]
    for side in ("ours", "etcd"):
        for (s, workload), rs in runs.items():
            if s == side:
                m |= {f"{workload}_{side}_{k}": v for k, v in summary(rs).items()}
    for key, label, ours_ws, etcd_ws in PAIRS:
        # each side's best of its workloads for this pair, by median puts/s
        best = {
            side: max(ws, key=lambda w, s=side: m[f"{w}_{s}_msgs_per_s"])
            for side, ws in (("ours", ours_ws), ("etcd", etcd_ws))
        }
        name = "batch_best" if key == "batch" else key
        if key == "batch":
            size = BATCH.fullmatch(best["ours"])
            assert size is not None
            m["batch_best_ours_batch"] = float(size[1])
            each = " / ".join(f"{m[f'{w}_ours_msgs_per_s']:,.0f}" for w in ours_ws)
            rows.append(
                (
                    f"(c) ours {' / '.join(ours_ws)}, puts/s",
                    each,
                    f"PutBatch size x in flight; etcd {' / '.join(etcd_ws)}",
                )
            )
        title = f"(c) best batched ({best['ours']} | {best['etcd']})" if key == "batch" else label
        for suffix, (_, flabel, fmt) in FIGURES.items():
            a, b = (m[f"{best[s]}_{s}_{suffix}"] for s in ("ours", "etcd"))
            m[f"{name}_ours_{suffix}"], m[f"{name}_etcd_{suffix}"] = a, b
            ratio = a / b if b else math.nan
            m[f"{name}_ratio" if suffix == "msgs_per_s" else f"{name}_{suffix}_ratio"] = ratio
            shown = f"{title}, {flabel}" if suffix == "msgs_per_s" else flabel
            rows.append((shown, f"{a:{fmt}} | {b:{fmt}}", f"{ratio:.2f}x"))
        if args.rounds > 1:
            seen = {s: ", ".join(f"{r.rate:,.0f}" for r in runs[(s, best[s])]) for s in best}
            rows.append(("    runs, puts/s", "", f"ours [{seen['ours']}]; etcd [{seen['etcd']}]"))
    return rows, m


# ------------------------------------------------------------------ main


def compare(args: argparse.Namespace, etcd: str, python: str) -> None:
    version = etcd_version(etcd)
    load_start = loadavg()
    print(
        f"vs_etcd: loadavg {load_start}; etcd {version}; {args.rounds} round(s) of "
        f"{args.seconds:g} s per workload",
        flush=True,
    )
    runs: dict[tuple[str, str], list[Run]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="vs-etcd-") as tmp,
        EtcdCluster(etcd, Path(tmp), python) as etcd_cluster,
    ):
        etcd_cluster.up()  # its ports bound before ours are chosen
        with fresh_cluster(secure=False) as cluster:
            ours = Ours(cluster)
            for rnd in range(args.rounds):
                for _, _, ours_ws, etcd_ws in PAIRS:
                    pairs: list[tuple[Side, tuple[str, ...]]] = [
                        (ours, ours_ws),
                        (etcd_cluster, etcd_ws),
                    ]
                    for side, workloads in pairs if rnd % 2 == 0 else pairs[::-1]:
                        for w in workloads:
                            run = measure(side, w, args.seconds)
                            runs.setdefault((side.name, w), []).append(run)
                            print(
                                f"  round {rnd + 1}/{args.rounds} {side.name:<4} {w:<12}"
                                f"{run.rate:>9,.0f} puts/s  p50 {run.p50_ms:6.2f} ms  "
                                f"leader {run.leader_cpu_us:7.1f} us/put  "
                                f"{run.switches:6.2f} switches/put",
                                flush=True,
                            )
    rows, m = results(runs, args, version)
    head: list[Row] = [
        ("loadavg at start", load_start, f"{os.cpu_count()} cpus, shared: figures indicative"),
        ("runs", f"{args.rounds} x {args.seconds:g} s", "medians; first side alternating"),
    ]
    report("vs_etcd", [*head, *rows, ("loadavg at end", loadavg(), "")], m)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="per workload run")
    ap.add_argument("--rounds", type=int, default=6, help="every workload on both, per round")
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s")
    ap.add_argument("--etcd", default=None, help="the etcd binary (default: etcd on PATH)")
    ap.add_argument(
        "--etcd3-venv",
        type=Path,
        default=DEFAULT_VENV,
        help=f"etcd's Python client's venv, made if needed (default {DEFAULT_VENV})",
    )
    ap.add_argument("--client-of", type=Path, help=argparse.SUPPRESS)  # our client process
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client_of is not None:
        client_main(args.client_of, args.workload, args.seconds)
        return
    # SIGTERM unwinds like Ctrl-C: every process started here is killed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    if args.rounds < 1 or args.seconds <= 0:
        ap.error("--rounds must be at least 1 and --seconds positive")
    etcd = args.etcd or shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(etcd, os.X_OK):
        print(f"vs_etcd: skipped: {etcd} not found (apt-get install etcd-server)")
        return
    python, why = etcd3_python(args.etcd3_venv.expanduser())
    if python is None:
        print(f"vs_etcd: skipped: no etcd3 client venv: {why}")
        return
    compare(args, etcd, python)


if __name__ == "__main__":
    main()
