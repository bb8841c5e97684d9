"""bench/dispatch.py's node phase: a real one-node cluster on the bench's log.

`node_phase` starts the node, waits until it leads with everything committed
and dispatched (`wait_recovered`), puts load through the gRPC client, kills it
with `kill -9` mid-load (`load_then_kill`), and times its restart; the node's
own "recovered in" figure comes from its log (`node_recovered_line`).
"""

from __future__ import annotations

import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._dispatch_log import BATCH, BODY, TAGS, TOPICS
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, ClientError, MessageSpec, NodeStatus

_RECOVERED = re.compile(
    r"recovered in ([0-9.]+)s after a (crash|clean shutdown): dispatch resumed at (\d+), "
    r"re-dispatched (\d+) messages"
)


@dataclass(slots=True)
class Load:
    acked: int = 0
    max_offset: int = -1
    last_msg_id: str = ""
    seconds: float = 0.0


def load_then_kill(cl: LocalCluster, address: str, seconds: float, threads: int = 4) -> Load:
    """`threads` clients put batches of 64 for `seconds`; kill -9 the node with puts in flight."""
    out = Load()
    lock = threading.Lock()
    stop = threading.Event()
    counter = iter(range(1 << 62))

    def worker() -> None:
        with Client([address], timeout_s=2.0) as client:
            while not stop.is_set():
                with lock:
                    first = next(counter) * BATCH
                specs = [
                    MessageSpec(
                        TOPICS[s % len(TOPICS)],
                        BODY,
                        keys=(f"load-{s}", f"u-{s % 977}"),
                        tags=TAGS[s % len(TAGS)],
                    )
                    for s in range(first, first + BATCH)
                ]
                try:
                    results = client.put_batch(specs)
                except ClientError:
                    continue
                with lock:
                    out.acked += len(results)
                    last = max(results, key=lambda r: r.commitlog_offset)
                    if last.commitlog_offset > out.max_offset:
                        out.max_offset, out.last_msg_id = last.commitlog_offset, last.msg_id

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    time.sleep(seconds)  # the load runs for a fixed time (not a wait for a condition)
    alive = cl.is_running(1)
    stop.set()
    cl.kill(1, signal.SIGKILL)  # in-flight batches die with the node
    if not alive:
        raise RuntimeError(f"the node died under load:\n{cl.log_tail(1, 40)}")
    out.seconds = time.perf_counter() - started
    for t in pool:
        t.join()
    return out


@dataclass(slots=True)
class Restart:
    port_s: float  # process start -> client port accepting connections
    leader_s: float  # -> Status says leader, committed past every acknowledged put
    dispatched_s: float  # -> dispatched past every acknowledged put
    status: NodeStatus


def wait_recovered(cl: LocalCluster, address: str, past_offset: int, t0: float) -> Restart:
    """Poll until the node leads with everything up to `past_offset` committed (and dispatched).

    "Leads" means its own first entry of the term is committed (committed index ==
    last index): only then has the node taken over the queue-assignment state, so a
    put sent earlier may get stale queue offsets (see the report of this bench).
    """
    host, port = address.rsplit(":", 1)
    deadline = t0 + 300
    while True:  # a fresh channel after the port opens: no gRPC reconnect backoff in the figure
        if not cl.is_running(1):
            raise RuntimeError(f"the node exited during recovery:\n{cl.log_tail(1, 30)}")
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no client port after 300 s:\n{cl.log_tail(1, 30)}") from None
            time.sleep(0.005)
    port_s = time.monotonic() - t0
    leader_s = 0.0
    with Client([address], timeout_s=2.0) as client:
        while True:
            try:
                st = client.status(address, timeout_s=1.0)
            except ClientError:
                st = None
                if not cl.is_running(1):
                    raise RuntimeError(
                        f"the node exited during recovery:\n{cl.log_tail(1, 30)}"
                    ) from None
            now = time.monotonic() - t0
            if (
                st is not None
                and st.role == "leader"
                and st.committed_index >= st.last_index
                and st.committed_pos > past_offset
            ):
                leader_s = leader_s or now
                if st.dispatched_pos > past_offset:
                    return Restart(port_s, leader_s, now, st)
            if time.monotonic() > deadline:
                raise RuntimeError(f"not recovered after 300 s: {st}\n{cl.log_tail(1, 30)}")
            time.sleep(0.01)


def node_recovered_line(cl: LocalCluster) -> tuple[float, str, int]:
    """The node's own 'recovered in X s after a ...' figure, from its latest start."""
    text = cl.specs[1].log_path.read_text(errors="replace")
    last_start = text.rsplit("=== ", 1)[-1]
    m = _RECOVERED.search(last_start)
    if m is None:
        raise RuntimeError(f"no 'recovered in' line in the node's log:\n{cl.log_tail(1, 20)}")
    return float(m.group(1)), m.group(2), int(m.group(4))


@dataclass(slots=True)
class NodePhase:
    first_start_s: float
    first_start_node_s: float
    load: Load
    restart: Restart
    node_s: float
    node_kind: str
    redispatched: int


def node_phase(cl: LocalCluster, built_pos: int, load_s: float) -> NodePhase:
    address = cl.specs[1].client
    t0 = time.monotonic()
    cl.start(1)
    first = wait_recovered(cl, address, built_pos - 1, t0)
    first_node_s, _, _ = node_recovered_line(cl)
    load = load_then_kill(cl, address, load_s)
    if load.acked == 0:
        raise RuntimeError(f"no put was acknowledged under load:\n{cl.log_tail(1, 30)}")
    t0 = time.monotonic()
    cl.start(1)
    restart = wait_recovered(cl, address, load.max_offset, t0)
    node_s, kind, redispatched = node_recovered_line(cl)
    with Client([address], timeout_s=5.0) as client:  # the last acknowledged put is there
        got = client.get(msg_id=load.last_msg_id)
        if got.commitlog_offset != load.max_offset:
            raise AssertionError(f"get({load.last_msg_id}) came back at {got.commitlog_offset}")
    cl.down()
    return NodePhase(first.leader_s, first_node_s, load, restart, node_s, kind, redispatched)
