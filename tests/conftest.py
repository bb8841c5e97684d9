"""Fixtures and helpers for tests that run real node processes (`LocalCluster`).

`shared_cluster` is one three-node cluster per test module, for the cheap tests
that leave it healthy; `make_cluster` starts a cluster of a test's own (for tests
that kill or stop nodes). Every cluster lives under pytest's tmp directories and
is stopped when its scope ends, pass or fail. When a test that used a cluster
fails, the tails of its nodes' logs are added to the failure report.
`wait_until` replaces sleeping-and-hoping: it polls a condition up to a deadline
and names what it waited for and the last value it saw. `--rewrite` makes
tests/test_raft_traces.py write the traces of tests/testdata/*.txt into the files.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
import pytest

from dledger_commitlog.cli.cluster_layout import PORTS_ENV, ephemeral_range
from dledger_commitlog.cli.launcher import LocalCluster, converged
from dledger_commitlog.cli.launcher import answered as answered
from dledger_commitlog.client import (
    Client,
    ClientError,
    MessageSpec,
    NodeStatus,
    StatusError,
)
from netkit.reconnect import reconnect_options
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from tests.console_helpers import Http, running_console

V = TypeVar("V")

# Small segments keep start-up, recovery and offline comparison fast.
SMALL_SEGMENTS: Final[dict[str, Any]] = {
    "data_segment_bytes": 1 << 20,
    "index_segment_bytes": 32 * 4096,
}
MAX_MESSAGE_BYTES: Final = 64 * 1024  # a 1 MiB segment must hold the largest message
SHARED_CONFIG: Final[dict[str, Any]] = {**SMALL_SEGMENTS, "max_message_bytes": MAX_MESSAGE_BYTES}
SHORT_LIVED_JVM: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CHAOS_DAY_ENV: Final = "DLEDGER_CHAOS_DAY"  # the UTC day that picks the rotating chaos scenario
LOG_TAIL_LINES: Final = 40
CONVERGE_S: Final = 20.0  # replicas of a quiet cluster agree within this
CHANNEL_OPTIONS: Final = [
    ("grpc.max_receive_message_length", 64 << 20),
    *reconnect_options(100, 500),
]

_CLUSTERS = pytest.StashKey[list[LocalCluster]]()

Statuses = Mapping[int, NodeStatus | StatusError]


def wait_until(
    observe: Callable[[], V],
    timeout_s: float,
    what: str,
    ok: Callable[[V], object] = bool,
    interval_s: float = 0.05,
) -> V:
    """Poll `observe()` until `ok(value)`; return that value, or fail naming `what`.

    A client or gRPC error raised by `observe` counts as an observation that is not ok.
    """
    deadline = time.monotonic() + timeout_s
    last: object = "(nothing observed)"
    while True:
        try:
            value = observe()
        except (ClientError, grpc.RpcError) as exc:
            last = exc
        else:
            if ok(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last}")
        time.sleep(interval_s)


def summary(statuses: Statuses) -> str:
    """One line per node: what a failed wait on statuses should show."""
    lines = []
    for i, s in sorted(statuses.items()):
        if isinstance(s, NodeStatus):
            lines.append(
                f"n{i}: {s.role} term={s.term} leader={s.leader_id} last={s.last_index} "
                f"committed={s.committed_index} pos={s.committed_pos} crc={s.last_chain_crc}"
            )
        else:
            lines.append(f"n{i}: no answer ({s.error.code}: {s.error.message})")
    return "; ".join(lines)


def wait_converged(
    cluster: LocalCluster,
    timeout_s: float,
    at_least: int = 0,
    nodes: Collection[int] | None = None,
) -> dict[int, NodeStatus]:
    """Wait until `nodes` (default: all) hold the same committed log (see `converged`)."""
    ids = sorted(nodes) if nodes is not None else [s.id for s in cluster]

    def observe() -> _Shown:
        every = cluster.statuses(timeout_s=1.0)
        return _Shown({i: every[i] for i in ids})

    final = wait_until(
        observe,
        timeout_s,
        f"nodes {ids} to commit the same log (committed index >= {at_least})",
        ok=lambda s: converged(s.statuses, at_least),
    )
    return answered(final.statuses)


class _Shown:
    """Statuses that print as `summary` in a failed wait."""

    def __init__(self, statuses: Statuses) -> None:
        self.statuses = statuses

    def __str__(self) -> str:
        return summary(self.statuses)


@contextmanager
def small_filesystem(directory: Path, size_mib: int) -> Iterator[Callable[[int], None]]:
    """A real filesystem of `size_mib` MiB (tmpfs) mounted on `directory`, for full-disk tests.

    Yields `grow(size_mib)`. Skips when this process may not mount (not root,
    or a container without the capability). Unmounted afterwards, also on failure.
    """
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs, which needs root")
    directory.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(directory)]
    done = subprocess.run(mount, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")

    def grow(new_mib: int) -> None:
        remount = ["mount", "-o", f"remount,size={new_mib}m", str(directory)]
        subprocess.run(remount, check=True, capture_output=True)

    try:
        yield grow
    finally:
        unmount = ["umount", str(directory)]
        if subprocess.run(unmount, check=False, capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(directory)], check=False, capture_output=True)


@contextmanager
def node_stubs(cluster: LocalCluster) -> Iterator[dict[int, Any]]:
    """A raw DLedgerClient stub per node: calls reach exactly that node (no redirects)."""
    channels = {s.id: grpc.insecure_channel(s.client, options=CHANNEL_OPTIONS) for s in cluster}
    try:
        yield {i: pb_grpc.DLedgerClientStub(ch) for i, ch in channels.items()}
    finally:
        for ch in channels.values():
            ch.close()


@contextmanager
def leader_cut_off(cluster: LocalCluster, puts: Sequence[MessageSpec]) -> Iterator[int]:
    """Pause every follower and put `puts` through the leader alone (a thread: the put
    is appended there and can never commit); yield the leader's id. On the way out,
    also on failure, the followers resume and the put is waited for."""
    leader = cluster.leader_id()
    followers = [s.id for s in cluster if s.id != leader]

    def put_alone() -> None:
        client = Client([cluster.specs[leader].client], timeout_s=4, max_retries=0)
        with client, suppress(ClientError):
            client.put_batch(list(puts))

    stranded = threading.Thread(target=put_alone)
    try:
        for f in followers:
            cluster.pause(f)
        stranded.start()
        yield leader
    finally:
        for f in followers:
            cluster.resume(f)
        if stranded.is_alive():
            stranded.join(30)


def get_at(stub: Any, offset: int) -> pb.StoredMessage:
    """The message a node serves at a commit-log offset (raises grpc.RpcError if none)."""
    message: pb.StoredMessage = stub.Get(
        pb.GetRequest(commitlog_offset=offset), timeout=2.0
    ).message
    return message


def register(item: pytest.Item, cluster: LocalCluster) -> None:
    clusters = item.stash.setdefault(_CLUSTERS, [])
    if cluster not in clusters:
        clusters.append(cluster)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker's clusters take ports from a range of their own
    (DLEDGER_PORTS, read by `free_ports`): workers never race for a port. The day that
    picks the rotating chaos scenario (tests/test_chaos.py) is the run's, set once before
    the workers start: every worker collects the same tests, also across midnight."""
    os.environ.setdefault(CHAOS_DAY_ENV, datetime.datetime.now(datetime.UTC).date().isoformat())
    # Spark's JVMs here (the session, `dledger analytics` in the docs test, a stream's
    # driver) live seconds to a minute: the tiered JIT's C2 and G1's threads cost more
    # CPU than they save (the four Spark test files: 117 -> 87 s of the machine's CPU, wall
    # 93 -> 85 s). Spark's launcher adds SPARK_SUBMIT_OPTS to each driver JVM.
    os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if worker.startswith("gw") and count > 0 and PORTS_ENV not in os.environ:
        low, _ = ephemeral_range()  # the ports below it, 10000 up, are split
        share = (min(low, 32768) - 10_000) // count
        first = 10_000 + int(worker[2:]) * share
        os.environ[PORTS_ENV] = f"{first}-{first + share - 1}"


@pytest.hookimpl(tryfirst=True)  # before xdist's, which turns the marks into the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`), tests that share one of our fixtures
    wider than a test (a module's cluster, a PKI, the Spark session) run on one
    worker, so the fixture is built once; every other test goes where there is room."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        ours = [d[-1] for d in info.name2fixturedefs.values()] if info is not None else []
        ours = [d for d in ours if d.baseid and d.scope != "function"]
        wide = [d.argname for d in ours if d.scope == "session"]  # shared across modules
        if wide:
            item.add_marker(pytest.mark.xdist_group(wide[0]))
        elif ours:
            module = getattr(item, "module", None)
            item.add_marker(pytest.mark.xdist_group(getattr(module, "__name__", "shared")))
    _longest_first(items)


def _longest_first(items: list[pytest.Item]) -> None:
    """Order whole modules so the long ones go first: the groups of a session-wide
    fixture (Spark: minutes of tests on one worker), then modules with slow tests, then
    the rest; a module's tests stay together and in their order. The workers take the
    groups in this order, so no long group starts near the end and leaves the other
    workers idle (longest processing time first)."""

    def rank(item: pytest.Item) -> int:
        group = item.get_closest_marker("xdist_group")
        if group is not None and not str(group.args[0]).startswith("tests."):
            return 0
        return 1 if item.get_closest_marker("slow") is not None else 2

    module_rank: dict[str, int] = {}
    for item in items:
        name = item.nodeid.split("::", 1)[0]
        module_rank[name] = min(module_rank.get(name, 2), rank(item))
    items.sort(key=lambda item: module_rank[item.nodeid.split("::", 1)[0]])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        help="write the traces of tests/testdata/*.txt into the files (tests/test_raft_traces.py)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and report.when == "call":
        for cluster in item.stash.get(_CLUSTERS, []):
            for spec in cluster:
                report.sections.append(
                    (
                        f"node {spec.id} log tail ({spec.log_path})",
                        cluster.log_tail(spec.id, LOG_TAIL_LINES),
                    )
                )
    return report


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One healthy three-node cluster for a whole module (small segments, 64 KiB messages)."""
    with LocalCluster(tmp_path_factory.mktemp("shared"), extra_config=SHARED_CONFIG) as cluster:
        cluster.up()
        yield cluster


@pytest.fixture(scope="module")
def api(shared_cluster: LocalCluster) -> Iterator[Http]:
    """A `dledger console` of the module's shared cluster, as its HTTP client."""
    shared_cluster.wait_for_leader(timeout_s=10.0)
    with running_console(shared_cluster) as http:
        yield http


@pytest.fixture(scope="module")
def client(shared_cluster: LocalCluster) -> Iterator[Client]:
    """A client of the module's shared cluster."""
    with shared_cluster.client() as c:
        yield c


@pytest.fixture
def cluster(request: pytest.FixtureRequest, shared_cluster: LocalCluster) -> LocalCluster:
    """The module's shared cluster, with a leader; its logs are reported if the test fails."""
    register(request.node, shared_cluster)
    shared_cluster.wait_for_leader(timeout_s=10.0)
    return shared_cluster


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., LocalCluster]]:
    """A factory of clusters of the test's own, started (`up`) and stopped at the end."""
    made: list[LocalCluster] = []

    def make(
        name: str = "cluster",
        *,
        tls: bool = False,
        acl: bool = False,
        start: bool = True,
        **extra_config: Any,
    ) -> LocalCluster:
        config = {**SHARED_CONFIG, **extra_config}
        cluster = LocalCluster(tmp_path / name, extra_config=config, tls=tls, acl=acl)
        made.append(cluster)
        register(request.node, cluster)
        return cluster.up() if start else cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.down()
