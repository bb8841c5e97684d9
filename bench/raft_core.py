"""Throughput of the pure Raft core: a 3-node cluster in one thread, no I/O.

MemoryStorage on every node, messages handed straight to the destination's
`step`, 1 KiB entries proposed in batches of 64. Counts entries committed (and
applied on all three nodes) per second of wall time, all three nodes' work
included. Writes bench/results/raft_core.json.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

from raft import Config, MemoryStorage, Message, RaftCore, Role

ENTRY_BYTES = 1024
BATCH = 64
BATCHES_PER_ROUND = int(os.environ.get("RAFT_BENCH_BATCHES_PER_ROUND", "4"))
TARGET_PER_S = 200_000


class Cluster:
    def __init__(self, n: int = 3) -> None:
        peers = tuple(range(1, n + 1))
        self.storages = {i: MemoryStorage() for i in peers}
        self.cores = {
            i: RaftCore(
                Config(
                    id=i,
                    peers=peers,
                    max_append_entries=512,
                    max_append_bytes=1 << 20,
                    max_inflight_msgs=16,
                    max_inflight_bytes=16 << 20,
                ),
                self.storages[i],
                rng=random.Random(i),
            )
            for i in peers
        }
        self.queue: deque[Message] = deque()
        self.applied = dict.fromkeys(peers, 0)

    def pump(self) -> None:
        """Run Readies and deliver messages until the cluster is quiet."""
        cores, queue = self.cores, self.queue
        busy = True
        while busy:
            busy = False
            for i, core in cores.items():
                if core.has_ready():
                    busy = True
                    rd = core.ready()
                    if rd.entries:
                        self.storages[i].append(rd.entries)
                    queue.extend(rd.messages)
                    if rd.committed_entries:
                        self.applied[i] = rd.committed_entries[-1].index
                    core.advance(rd)
            while queue:
                busy = True
                m = queue.popleft()
                cores[m.dst].step(m)

    def elect(self, node: int) -> RaftCore:
        core = self.cores[node]
        while core.role is not Role.LEADER:
            core.tick()
            self.pump()
        return core


def run(seconds: float) -> dict[str, float]:
    cluster = Cluster()
    leader = cluster.elect(1)
    batch = [bytes([i % 256]) * ENTRY_BYTES for i in range(BATCH)]
    start_index = leader.commit_index
    start_applied = min(cluster.applied.values())
    rounds = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(BATCHES_PER_ROUND):
            leader.propose(batch)
        cluster.pump()
        rounds += 1
    took = time.perf_counter() - t0
    committed = leader.commit_index - start_index
    applied_all = min(cluster.applied.values()) - start_applied
    return {
        "committed_entries_per_s": round(committed / took),
        "applied_on_all_nodes_per_s": round(applied_all / took),
        "committed_mib_per_s": round(committed * ENTRY_BYTES / took / (1 << 20), 1),
        "us_per_batch_of_64": round(took / (committed / BATCH) * 1e6, 1),
        "entries_committed": committed,
        "seconds": round(took, 2),
        "entry_bytes": ENTRY_BYTES,
        "batch_entries": BATCH,
        "batches_per_round": BATCHES_PER_ROUND,
        "target_entries_per_s": TARGET_PER_S,
    }


def main() -> int:
    seconds = float(os.environ.get("RAFT_BENCH_SECONDS", "3"))
    result: dict[str, object] = dict(run(seconds))
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)  # the cores are shared
    result["machine"] = f"{platform.node()} {os.cpu_count()} cpus {platform.python_version()}"
    result["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    width = max(map(len, result))
    print("raft core, 3 nodes in one thread, no I/O")
    for key, value in result.items():
        print(f"  {key:<{width}}  {value}")
    out = Path(__file__).resolve().parent / "results" / "raft_core.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    ok = float(str(result["committed_entries_per_s"])) >= TARGET_PER_S
    print(f"  {'target met' if ok else 'BELOW TARGET'} ({TARGET_PER_S:,} entries/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
