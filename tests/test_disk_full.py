"""A follower's disk fills up: it stops loudly, the others go on, it recovers when space is freed.

One follower's data directory is a small tmpfs, mounted before the node first
starts (so every segment it preallocates really is allocated there). Puts of
64 KiB go through the normal client until that follower can no longer allocate
a log segment: the node must log a CRITICAL line naming ENOSPC and its process
must exit with code 1, while the leader and the other follower keep
acknowledging puts. Then the tmpfs grows, the follower restarts (recovering as
after a crash), catches up, and serves every acknowledged put itself; its store
then verifies offline.

Runs only as root (it mounts a tmpfs); else it skips, saying why. The tmpfs is
unmounted at the end, pass or fail, after every node process has stopped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.log.verify import verify_store
from tests.conftest import (
    CONVERGE_S,
    SHARED_CONFIG,
    answered,
    node_stubs,
    register,
    small_filesystem,
    summary,
    wait_converged,
    wait_until,
)
from tests.workload import Writers, check_acked, read_all

pytestmark = pytest.mark.slow

LEADER: Final = 1  # preferred leader, on the ordinary disk
VICTIM: Final = 3  # a follower whose data directory is the small tmpfs
BODY_BYTES: Final = 64 * 1024
# Room for what the follower allocates at start and on its first puts (two 1 MiB
# log segments, two entry-index segments, consume-queue files, the key index),
# but not for many more log segments: it fills after a few MiB of puts.
SMALL_MIB: Final = 4
GROWN_MIB: Final = 64
CONFIG: Final[dict[str, Any]] = {
    **SHARED_CONFIG,  # 1 MiB log segments, 128 KiB entry-index segments, 64 KiB messages
    "cq_units_per_file": 2000,  # 40 KB consume-queue files
    "index_slots": 128,
    "index_entries": 4096,  # an 82 KB key index: one file for every put of the test
    # The store's own guard must not refuse writes before the disk is really full,
    # and retention must not delete segments under pressure (checked in the log too).
    "force_clean_ratio": 1.0,
    "refuse_ratio": 1.0,
    "preferred_leader": LEADER,
}
FILL_S: Final = 60.0  # the follower runs out of space and exits within this
AFTER_EXIT_PUTS: Final = 20  # acknowledged by the other two after the follower is gone
ENOSPC_TEXT: Final = "No space left on device"


def _df(path: Path) -> str:
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return f"{used / 1024:.0f} KiB used of {st.f_blocks * st.f_frsize / 1024:.0f} KiB"


@pytest.fixture
def cluster_on_small_disk(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[LocalCluster, Path, Callable[[int], None]]]:
    """A three-node cluster (not started) whose node VICTIM keeps its data on a
    SMALL_MIB tmpfs, and the tmpfs's `grow`; every node is stopped and the tmpfs
    unmounted at the end."""
    cluster = LocalCluster(tmp_path / "diskfull", extra_config=CONFIG)
    data = Path(cluster.specs[VICTIM].data_dir)
    with small_filesystem(data, SMALL_MIB) as grow:
        register(request.node, cluster)
        try:
            yield cluster, data, grow
        finally:
            cluster.down()


def _critical_lines(cluster: LocalCluster, node: int) -> list[str]:
    text = cluster.specs[node].log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if " CRITICAL " in line]


@pytest.mark.timeout(180)
def test_a_follower_whose_disk_fills_stops_and_catches_up_once_space_is_freed(
    cluster_on_small_disk: tuple[LocalCluster, Path, Callable[[int], None]],
) -> None:
    cluster, data, grow = cluster_on_small_disk
    cluster.up()

    def leader_is_preferred() -> bool:
        statuses = cluster.statuses(timeout_s=1.0)
        got = answered(statuses)
        return len(got) == 3 and got[LEADER].role == "leader" and got[VICTIM].role == "follower"

    wait_until(leader_is_preferred, 20.0, f"node {LEADER} to lead (preferred leader)")
    wait_converged(cluster, CONVERGE_S)
    print(f"tmpfs after start: {_df(data)}")

    writers = Writers(cluster, "full", threads=2, body_bytes=BODY_BYTES).start()
    try:
        code = wait_until(
            lambda: cluster.exit_code(VICTIM),
            FILL_S,
            f"node {VICTIM} to exit on its full disk ({_df(data)})",
            ok=lambda rc: rc is not None,
        )
        at_exit = writers.count()
        print(f"node {VICTIM} exited with {code} after {at_exit} puts; tmpfs: {_df(data)}")
        wait_until(
            writers.count,
            30.0,
            f"{AFTER_EXIT_PUTS} puts acknowledged by the two nodes left",
            ok=lambda c: c >= at_exit + AFTER_EXIT_PUTS,
        )
    finally:
        acked = writers.join(stop=True)
    print(f"{len(acked)} puts acknowledged, {len(writers.errors)} failed")

    tail = cluster.log_tail(VICTIM, 40)
    assert code == 1, f"node {VICTIM} exited with {code}, not 1; its log ends:\n{tail}"
    critical = _critical_lines(cluster, VICTIM)
    print("\n".join(critical))
    full = [line for line in critical if ENOSPC_TEXT in line]
    assert full, f"no CRITICAL line names {ENOSPC_TEXT!r}; the log ends:\n{tail}"
    assert "Stopping; a restart recovers from disk" in full[0], full[0]
    # The segment that could not be allocated is not left behind, half there.
    named = re.search(r"cannot allocate segment (\S+) \((\d+) bytes\)", full[0])
    assert named is not None, full[0]
    assert not Path(named[1]).exists(), f"{named[1]} was left behind"
    log_text = cluster.specs[VICTIM].log_path.read_text(errors="replace")
    assert "retention (" not in log_text, "retention deleted segments on the full disk"
    assert at_exit >= 10, f"the follower filled up after only {at_exit} puts"

    grow(GROWN_MIB)
    cluster.start(VICTIM)
    with cluster.client() as client:
        last = client.put("full", b"after the restart")
    final = wait_converged(cluster, 2 * CONVERGE_S)
    print(f"converged: {summary(final)}; tmpfs: {_df(data)}")

    with node_stubs(cluster) as stubs:
        mine = read_all(stubs[VICTIM])
        theirs = read_all(stubs[LEADER])
    check_acked(acked, mine, f"node {VICTIM} after its restart")
    assert mine.get(last.commitlog_offset) is not None
    assert mine == theirs, f"node {VICTIM} serves other committed messages than the leader"

    log_text = cluster.specs[VICTIM].log_path.read_text(errors="replace")
    restarted = log_text.rsplit(f"starting node {VICTIM}", 1)[1]
    assert "after a crash" in restarted, "the restart did not recover as after a crash"
    cluster.stop(VICTIM)
    report = verify_store(data)
    assert report.ok, report.problems
