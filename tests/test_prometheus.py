"""The shipped alert rules and dashboard (deploy/), against a real Prometheus.

promtool checks the rules and runs their unit tests (one or more per alert:
deploy/prometheus/tests/dledger-alerts.test.yml). Then a real Prometheus scrapes a
real 3-node TLS cluster that has served puts and a consumer group: every PromQL
expression of the Grafana dashboard returns series, and a node killed with SIGKILL
fires DledgerNodeDown, seen through Prometheus's HTTP API (the shipped rules, with
their `for:` durations shortened to seconds but for the alerts on the machine's disk:
the unit tests cover the durations).
Prometheus and promtool are the system's or Debian's package that `make test`
unpacks under .venv/tools (`make tools`); without them these tests skip, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster, free_ports
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules" / "dledger-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "dledger-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dledger-dashboard.json"
SCRAPE_EXAMPLE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
UNPACKED = ROOT / ".venv" / "tools" / "usr" / "bin"
ALERTS = (
    "DledgerNodeDown",
    "DledgerNoLeader",
    "DledgerLeaderFlapping",
    "DledgerFollowerLagging",
    "DledgerCommitStalled",
    "DledgerFsyncSlow",
    "DledgerDiskNearRefuseRatio",
    "DledgerDiskRefusingWrites",
    "DledgerConsumerLagGrowing",
    "DledgerDeadLetters",
    "DledgerCertificateExpiring",
)


def tool(name: str) -> str:
    found = shutil.which(name) or (str(UNPACKED / name) if (UNPACKED / name).is_file() else None)
    if found is None:
        pytest.skip(f"{name} not found (`make tools` unpacks Debian's prometheus package)")
    return found


def promtool(*args: str) -> str:
    done = subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_are_valid_and_each_alert_has_a_unit_test() -> None:
    assert f"SUCCESS: {len(ALERTS)} rules found" in promtool("check", "rules", str(RULES))
    assert "SUCCESS" in promtool("test", "rules", str(RULE_TESTS))
    rules = RULES.read_text()
    tested = RULE_TESTS.read_text()
    for alert in ALERTS:
        assert f"- alert: {alert}\n" in rules
        assert f"alertname: {alert}\n" in tested, f"{alert} has no unit test"


def test_the_scrape_example_is_a_valid_config() -> None:
    assert "SUCCESS" in promtool("check", "config", str(SCRAPE_EXAMPLE))


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


# Alerts on what the machine does under the whole suite (its disk's fsync latency and
# fullness), not on what the test does to the cluster: their `for:` stays as shipped, so
# they cannot fire within the test (one run saw DledgerFsyncSlow fire beside NodeDown, a
# p99 fsync over 100 ms while the suite loaded the disk); promtool's unit tests cover them.
MACHINE_BOUND = ("DledgerFsyncSlow", "DledgerDiskNearRefuseRatio")


def short_for(rules: str) -> str:
    """`rules` with each alert's `for:` cut to 2 s, but the MACHINE_BOUND ones'."""
    blocks = re.split(r"(?m)^(?=[ \t]+- alert: )", rules)
    return "".join(
        block
        if any(f"- alert: {name}\n" in block for name in MACHINE_BOUND)
        else re.sub(r"(?m)^(\s+for: )\S+$", r"\g<1>2s", block)
        for block in blocks
    )


class Prometheus:
    """A Prometheus process scraping `targets` every second, with the shipped rules
    (`short_for`), on a port of its own on 127.0.0.1."""

    def __init__(self, home: Path, targets: list[str]) -> None:
        home.mkdir(parents=True, exist_ok=True)
        (home / "rules.yml").write_text(short_for(RULES.read_text()))
        (home / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "rule_files: [rules.yml]\n"
            "scrape_configs:\n  - job_name: dledger\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        self.log = home / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={home / 'prometheus.yml'}",
                    f"--storage.tsdb.path={home / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[list[str]], Prometheus]]:
    started: list[Prometheus] = []

    def start(targets: list[str]) -> Prometheus:
        p = Prometheus(tmp_path / "prometheus", targets)
        started.append(p)
        wait_until(p.ready, 30.0, "Prometheus to be ready")
        return p

    tool("prometheus")
    try:
        yield start
    finally:
        for p in started:
            p.stop()


@pytest.mark.slow
def test_prometheus_scrapes_a_cluster_runs_the_dashboard_and_fires_node_down(
    make_cluster: Callable[..., LocalCluster], prometheus: Callable[[list[str]], Prometheus]
) -> None:
    cluster = make_cluster("monitored", tls=True)
    with cluster.client() as client:
        for i in range(30):
            client.put("Monitored", f"m{i}".encode())
    consumed = subprocess.run(
        [
            *(sys.executable, "-m", "dledger_commitlog", "consume"),
            *("--cluster", str(cluster.cluster_file), "--max", "10"),
            *("--group", "watchers", "--topic", "Monitored"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert consumed.returncode == 0, consumed.stderr
    targets = {s.id: s.metrics for s in cluster.specs.values()}
    prom = prometheus(list(targets.values()))

    def all_up() -> bool:
        return sorted(r["value"][1] for r in prom.query('up{job="dledger"}')) == ["1"] * 3

    wait_until(all_up, 30.0, "every node scraped", interval_s=0.2)
    with cluster.client() as client:  # puts in the rate windows of the dashboard
        for i in range(20):
            client.put("Monitored", f"late{i}".encode())
    exprs = dashboard_exprs()
    wait_until(
        lambda: [e for e in exprs if not prom.query(e)],
        30.0,
        "series for every dashboard expression (last: those still empty)",
        ok=lambda empty: not empty,
        interval_s=0.5,
    )
    lag = prom.query('max by (group) (dledger_group_lag_messages{job="dledger"})')
    assert [r["metric"]["group"] for r in lag] == ["watchers"]
    assert 0 < float(lag[0]["value"][1]) <= 40  # it handled 10 (and acked what it held)
    lagging = prom.query('count by (instance) (dledger_replication_lag_entries{job="dledger"})')
    leader = targets[cluster.leader_id()]
    assert [(r["metric"]["instance"], r["value"][1]) for r in lagging] == [(leader, "2")]
    days = prom.query(exprs[-1])
    assert len(days) == 3 and all(800 < float(r["value"][1]) < 826 for r in days), days

    assert prom.get("/api/v1/alerts")["alerts"] == []  # a healthy cluster fires nothing
    victim = next(i for i in targets if i != cluster.leader_id())
    cluster.kill(victim)

    def firing() -> list[dict[str, Any]]:
        alerts = prom.get("/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["state"] == "firing"]

    fired = wait_until(firing, 30.0, "an alert to fire", interval_s=0.2)
    assert [(a["labels"]["alertname"], a["labels"]["instance"]) for a in fired] == [
        ("DledgerNodeDown", targets[victim])
    ]
    assert fired[0]["annotations"]["summary"] == f"dledger node {targets[victim]} is down"
