"""Run one chaos scenario against a local cluster and check what the clients saw.

`run(ChaosConfig)`:
1. starts a `LocalCluster` whose every Raft link goes through its own proxy
   (`ToxiproxyNetwork`; `TOXIPROXY_URL` selects a real Toxiproxy) or, as root,
   through network namespaces (`network="netns"`);
2. starts the workload (clients recording a `History`) and a monitor that polls
   every node's status (the leaders per term);
3. runs the scenario's fault schedule for `duration_s`, then heals everything:
   links, paused and stopped nodes;
4. stops the clients, waits until every replica holds the same committed log,
   reads every replica's committed messages, stops the cluster and verifies each
   store offline against a rebuild (`verify_store`);
   in membership scenarios (chaos/membership.py) the replicas are the members at
   the end; a removed node's committed log is read offline (it must be a prefix of
   the final one) and its store verified unless it was removed while killed (a
   crashed store's queues run ahead of its checkpoint until a restart reconciles
   them); a wiped node's data is gone and left out;
5. checks the history against all of it (`checker.check`) and reports.
Invariants: every process and proxy it starts is stopped before it returns or
raises; the run directory is kept when the run is not valid (or `keep`), with
`history.jsonl`, the nodes' logs and the report.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import LeaderSeen, Replica, Verdict, check, timings
from chaos.history import History
from chaos.membership import MEMBER_SCENARIOS, SPARE_NODES
from chaos.network import Network, ToxiproxyNetwork
from chaos.scenarios import ASYNC_SCENARIOS, SCENARIOS, Nemesis, ScenarioError
from chaos.workload import Workload
from dledger_commitlog.cli.launcher import LocalCluster, NodeSpec, converged
from dledger_commitlog.client import Client, ClientError
from dledger_commitlog.log.entry_reads import entries_from
from dledger_commitlog.log.reads import VerifiedRanges, log_view
from dledger_commitlog.log.verify import open_log, read_layout, verify_store
from dledger_commitlog.node.config import SMALL_SEGMENTS
from store.entry_format import HEADER_SIZE

Log = Callable[[str], None]


@dataclass(slots=True)
class ChaosConfig:
    scenario: str
    duration_s: float = 15.0
    seed: int = 0
    directory: Path | None = None  # default: a temporary directory
    nodes: int = 3
    clients: int = 4
    read_ratio: float = 0.2
    network: str = "toxiproxy"  # or "netns" (root only)
    keep: bool = False  # keep the run directory even when the run is valid
    settle_s: float = 60.0  # bound on every wait for the cluster to recover
    # node settings on top of SMALL_SEGMENTS (1 GiB default segments would
    # preallocate 3 GiB per run)
    extra_config: dict[str, Any] = field(default_factory=dict)
    max_leader_faults: int | None = None  # end the schedule early after this many

    def validate(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(
                f"unknown scenario {self.scenario!r}; choose one of {', '.join(SCENARIOS)}"
            )
        if self.duration_s <= 0 or self.clients < 1 or not 0 <= self.read_ratio < 1:
            raise ValueError("need duration > 0, clients >= 1 and 0 <= read ratio < 1")
        if self.network not in ("toxiproxy", "netns"):
            raise ValueError(f"network must be 'toxiproxy' or 'netns', not {self.network!r}")
        if self.network == "netns" and self.scenario in MEMBER_SCENARIOS:
            raise ValueError(f"{self.scenario} adds nodes: it runs on the toxiproxy network")

    @property
    def spare_ids(self) -> tuple[int, ...]:
        """The ids a membership scenario may add (links made for each at the start)."""
        spares = SPARE_NODES if self.scenario in MEMBER_SCENARIOS else 0
        return tuple(range(self.nodes + 1, self.nodes + 1 + spares))


@dataclass(slots=True)
class ChaosReport:
    config: dict[str, Any]
    verdict: Verdict
    timing: dict[str, Any]
    faults: list[str]
    harness_errors: list[str]
    exits: list[str]  # nodes that stopped on their own (restarted by the harness)
    directory: str
    elapsed_s: float

    @property
    def valid(self) -> bool:
        return self.verdict.valid and not self.harness_errors

    def as_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            **self.config,
            "valid": self.valid,
            "operations": v.operations,
            "puts": v.puts,
            "acknowledged": v.acked,
            "failed": v.failed,
            "unknown": v.unknown,
            "reads": v.reads,
            "reads_ok": v.reads_ok,
            "lost": len(v.lost),
            "lost_in_window": len(v.lost_in_window),
            "reads_lost_in_window": v.reads_lost_in_window,
            "duplicates": len(v.duplicates),
            "failed_present": len(v.failed_present),
            "unknown_present": v.unknown_present,
            "divergent": len(v.divergent),
            "stale_reads": len(v.stale_reads),
            "removed_checked": v.removed_checked,
            "leader_conflicts": v.leader_conflicts,
            "store_problems": v.store_problems,
            "problems": v.problems(),
            "examples": {
                "lost": v.lost[:10],
                "lost_in_window": v.lost_in_window[:10],
                "duplicates": v.duplicates[:10],
                "failed_present": v.failed_present[:10],
                "divergent": v.divergent[:10],
                "stale_reads": v.stale_reads[:10],
            },
            **self.timing,
            "faults": self.faults,
            "harness_errors": self.harness_errors,
            "node_exits": len(self.exits),
            "exits": self.exits,
            "directory": self.directory,
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def lines(self) -> list[tuple[str, str]]:
        """The report as (what, value) rows for a table."""
        c, v, t = self.config, self.verdict, self.timing
        windows = t["unavailability_windows"]
        shown = ", ".join(f"{a:.1f}s +{d:.2f}s" for a, d in windows[:6])
        more = f", ... ({len(windows)} in all)" if len(windows) > 6 else ""
        p50, worst = t["failover_p50_s"], t["failover_max_s"]
        rows = [
            (
                "scenario",
                f"{c['scenario']} (seed {c['seed']}, {c['duration_s']:g} s, "
                f"{c['nodes']} nodes, {c['flush_mode']} flush, {c['network']} links)",
            ),
            ("operations", f"{v.operations}: {v.puts} puts, {v.reads} reads ({v.reads_ok} ok)"),
            ("acknowledged", str(v.acked)),
            (
                "failed / unknown",
                f"{v.failed} / {v.unknown} ({v.unknown_present} of the "
                "unknown were stored, once each)",
            ),
            ("lost", str(len(v.lost))),
            ("duplicates", str(len(v.duplicates))),
            ("failed but present", str(len(v.failed_present))),
            ("replicas diverging", str(len(v.divergent))),
            (
                "stores vs rebuild",
                "identical" if not v.store_problems else f"{len(v.store_problems)} differ",
            ),
            (
                "leaders per term",
                "at most one" if not v.leader_conflicts else f"conflicts: {v.leader_conflicts}",
            ),
            ("stale reads", str(len(v.stale_reads))),
            (
                "unavailability",
                f"{t['unavailable_s']:.2f} s in {len(windows)} windows"
                f"{': ' + shown + more if windows else ''}",
            ),
            (
                "failover",
                "no leader faults"
                if not t["failovers"]
                else f"p50 {_s(p50)}, max {_s(worst)} over {t['failovers']} leader faults"
                + (
                    f" ({t['failovers_unfinished']} unfinished)"
                    if t["failovers_unfinished"]
                    else ""
                ),
            ),
        ]
        if self.exits:
            rows.append(("nodes that exited", f"{len(self.exits)}: {self.exits[:3]}"))
        if v.lost_in_window:
            read = f", {v.reads_lost_in_window} read before" if v.reads_lost_in_window else ""
            lost = f"{len(v.lost_in_window)} (async power loss{read})"
            rows.insert(5, ("lost in the window", lost))
        rows += [("problem", p) for p in v.problems() + self.harness_errors]
        rows.append(("verdict", "VALID" if self.valid else "INVALID"))
        return rows


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


class Monitor:
    """Polls every node's status; records who claimed leadership in which term."""

    def __init__(self, servers: dict[int, str], cluster: str, interval_s: float = 0.1) -> None:
        self.servers = dict(servers)  # every node that ever joined (add: a new dict)
        self.interval_s = interval_s
        self.seen: list[LeaderSeen] = []
        self._client = Client(list(servers.values()), cluster=cluster)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-monitor", daemon=True)
        self._started = time.monotonic()

    def start(self, history: History) -> Monitor:
        self._started = history.started
        self._thread.start()
        return self

    def add(self, node: int, address: str) -> None:
        self.servers = {**self.servers, node: address}

    def _run(self) -> None:
        last: dict[int, int] = {}
        while not self._stop.wait(self.interval_s):
            for node, address in self.servers.items():
                try:
                    s = self._client.status(address, timeout_s=0.3)
                except ClientError:
                    continue
                if s.role == "leader" and last.get(node) != s.term:
                    last[node] = s.term
                    self.seen.append(LeaderSeen(time.monotonic() - self._started, node, s.term))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._client.close()


def make_network(cfg: ChaosConfig, cluster_dir: Path) -> tuple[LocalCluster, Network]:
    flush_mode = "async" if cfg.scenario in ASYNC_SCENARIOS else "sync"
    env = {"DLEDGER_FLUSH_TRACE": "1"} if cfg.scenario == "power-loss" else {}
    settings = {**SMALL_SEGMENTS, **cfg.extra_config}
    if cfg.network == "netns":
        from chaos.netns import NetnsNetwork, available

        why = available()
        if why is not None:
            raise ValueError(f"the netns network cannot run here: {why}")
        netns = NetnsNetwork(list(range(1, cfg.nodes + 1)))
        try:
            # The namespaces' bridge is this run's own: its addresses reach no other machine.
            insecure = {**settings, "insecure": True}
            cluster = LocalCluster(
                cluster_dir,
                nodes=cfg.nodes,
                flush_mode=flush_mode,
                env=env,
                extra_config=insecure,
                hosts=netns.hosts(),
                command_prefix=netns.command_prefix,
            )
            netns.attach({s.id: s.raft for s in cluster})
        except BaseException:
            netns.close()
            raise
        return cluster, netns
    cluster = LocalCluster(
        cluster_dir, nodes=cfg.nodes, flush_mode=flush_mode, env=env, extra_config=settings
    )
    proxies = ToxiproxyNetwork({s.id: s.raft for s in cluster}, spares=cfg.spare_ids)
    cluster.set_links(proxies.links())
    return cluster, proxies


def read_replica(address: str, cluster: str) -> bytes:
    """Every committed message the node at `address` holds, as ReadRange serves them."""
    out = bytearray()
    offset = 0
    with Client([address], cluster=cluster, timeout_s=10.0) as client:
        while True:
            r = client.read_range(offset, max_messages=4096, max_bytes=8 << 20)
            out += r.messages
            if r.next_offset - HEADER_SIZE >= r.committed_offset:
                return bytes(out)
            if r.next_offset <= offset:
                raise RuntimeError(f"{address}: ReadRange from {offset} made no progress")
            offset = r.next_offset


def run(cfg: ChaosConfig, log: Log = lambda _: None) -> ChaosReport:
    cfg.validate()
    logging.getLogger("chaos.proxy").setLevel(logging.ERROR)  # peers down: expected here
    started = time.monotonic()
    temp = cfg.directory is None
    root = Path(tempfile.mkdtemp(prefix="dledger-chaos-")) if temp else Path(cfg.directory or "")
    root.mkdir(parents=True, exist_ok=True)
    cluster, net = make_network(cfg, root / "cluster")
    history = History()
    harness: list[str] = []
    info = {
        "scenario": cfg.scenario,
        "seed": cfg.seed,
        "duration_s": cfg.duration_s,
        "nodes": cfg.nodes,
        "clients": cfg.clients,
        "flush_mode": cluster.flush_mode,
        "network": net.name,
    }
    servers = {s.id: s.client for s in cluster}
    monitor = Monitor(servers, cluster.cluster)
    workload = Workload(
        list(servers.values()),
        history,
        cfg.seed,
        cfg.clients,
        read_ratio=cfg.read_ratio,
        cluster=cluster.cluster,
    )
    nemesis: Nemesis | None = None
    replicas: list[Replica] = []
    removed: list[Replica] = []
    problems: dict[int, list[str]] = {}
    try:
        log(f"starting {cfg.nodes} nodes in {root} ({net.name} links)")
        cluster.up(timeout_s=cfg.settle_s)
        monitor.start(history)
        workload.start()
        _wait(lambda: workload.acked_count() > 0, cfg.settle_s, "a first acknowledged put")
        nemesis = Nemesis(
            cluster,
            net,
            history,
            random.Random(cfg.seed),
            time.monotonic() + cfg.duration_s,
            settle_s=cfg.settle_s,
            max_leader_faults=cfg.max_leader_faults,
            spare_ids=cfg.spare_ids,
            on_join=lambda spec: _joined(spec, monitor, workload),
            on_leave=lambda spec: workload.remove_server(spec.client),
        )
        log(f"running {cfg.scenario} for {cfg.duration_s:g} s (seed {cfg.seed})")
        try:
            SCENARIOS[cfg.scenario][0](nemesis)
        except ScenarioError as exc:
            harness.append(f"the cluster did not recover: {exc}")
        healed_at = nemesis.heal()
        _wait(
            lambda: workload.last_acked_start >= healed_at,
            cfg.settle_s,
            "a put invoked after healing to be acknowledged",
        )
        history.info("stop-clients")
        workload.stop(timeout_s=cfg.settle_s)
        harness += [f"client thread failed: {e!r}" for e in workload.errors]
        log("healed; waiting for the replicas to converge")
        _wait(
            lambda: nemesis_converged(nemesis, cluster),
            cfg.settle_s,
            "every replica to hold the same committed log",
        )
        replicas = [
            Replica.from_raw(s.id, read_replica(s.client, cluster.cluster)) for s in cluster
        ]
        monitor.stop()
        cluster.down()
        log("verifying every store against a rebuild")
        kept = [s for s in cluster.retired.values() if s.id not in nemesis.wiped]
        # A store killed and never restarted has queues ahead of its checkpoint (a
        # restart would reconcile them): only its committed log is read.
        clean = [s for s in kept if s.id not in nemesis.crashed]
        for spec in [*cluster, *clean]:
            problems[spec.id] = list(verify_store(spec.data_dir).problems)
        removed = [Replica.from_raw(s.id, read_stopped_replica(s.data_dir)) for s in kept]
    except (TimeoutError, RuntimeError, ClientError) as exc:
        harness.append(f"{type(exc).__name__}: {exc}")
    finally:
        workload.stop(timeout_s=cfg.settle_s)
        monitor.stop()
        cluster.down()
        net.close()
    verdict = check(
        history, replicas, problems, monitor.seen, nemesis.loss_windows if nemesis else (), removed
    )
    if not replicas and not harness:
        harness.append("no replica was read")
    faults = [f"{e.time:7.2f}s {e.f}: {e.detail}".rstrip(": ") for e in history.faults()]
    timing = timings(history, nemesis.leader_faults if nemesis else [])
    exits = nemesis.exits if nemesis else []
    report = ChaosReport(
        info,
        verdict,
        timing.as_json(),
        faults,
        harness,
        exits,
        str(root),
        time.monotonic() - started,
    )
    history.write_jsonl(root / "history.jsonl")
    (root / "report.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
    if report.valid and temp and not cfg.keep:
        shutil.rmtree(root, ignore_errors=True)
        report.directory = ""
    return report


def read_stopped_replica(data_dir: str | Path) -> bytes:
    """Every committed message in a stopped node's store, as ReadRange would serve them
    (a removed node serves no reads)."""
    root = Path(data_dir)
    store, committed = open_log(root, read_layout(root))
    try:
        view, verified = log_view(committed), VerifiedRanges()
        out = bytearray()
        pos = view.min_pos
        while pos < view.committed:
            bodies, end = entries_from(view, verified, pos, 4096, 8 << 20)
            if end <= pos:
                raise RuntimeError(f"{root}: reading the log from {pos} made no progress")
            out += b"".join(bodies)
            pos = end
        return bytes(out)
    finally:
        store.close()


def _joined(spec: NodeSpec, monitor: Monitor, workload: Workload) -> None:
    monitor.add(spec.id, spec.client)
    workload.add_server(spec.client)


def nemesis_converged(nemesis: Nemesis, cluster: LocalCluster) -> bool:
    nemesis.supervise()
    return converged(cluster.statuses(timeout_s=1.0))


def _wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() >= deadline:
            if what:
                raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
            return
        time.sleep(0.05)
