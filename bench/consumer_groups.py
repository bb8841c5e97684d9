"""Consumer groups on a local 3-node cluster: end-to-end throughput, latency, rebalance (issue 23).

(a) End to end, 1 consumer and then 3 consumers in one group (8 queues per
topic), each consumer a process of its own (`--worker`: an `AsyncConsumer` whose
handler notes each message and reports its notes as JSON lines on stdout). A
producer in this process puts 1 KiB messages, 32 in flight (paced to `--rate`
msgs/s, 0: as fast as they are acknowledged) for `--seconds`; then the consumers
drain what was put. Reported: msgs/s consumed (distinct messages over the time from
the first put to the last one handled), the producer's put rate (so a reader sees
which side was the bound), latency p50/p99 from the send time written in the body
(this host's clock) to the handler's call (the put's own latency, also reported,
is part of it), and duplicates (handler calls beyond one per message; 0 without
failures).

(c) Drain (the consumers' own capacity, which (a) does not reach when the
producer is the bound): `--backlog` messages (20,000) stored first, then one
consumer started; then 1 and 3 consumers settled in a fresh group while the
backlog is put in batches of 256, faster than they are handled. Msgs/s from the
first handler call to the last, and each node's CPU per message over the case
(the busiest node is the leader: every fetch and ack, and the puts when they run
meanwhile).

(b) Rebalance: 3 consumers on 8 queues while a producer puts 200 msgs/s on all
8; once the group is settled and every consumer has handled messages, SIGKILL
one. Measured from the kill: until the group's describe (polled every 20 ms)
shows all 8 queues owned by the 2 survivors (none revoking), and until a
survivor's handler is called on a message of one of the killed consumer's
queues (a survivor may get its first lost queue before all are settled, so the
second can come first). Each trial uses a fresh group and topic; median and max
over `--trials` (the issue's bound: < 5 s; a member is gone after the 3 s session
timeout).

Run: `.venv/bin/python bench/consumer_groups.py [--seconds 10] [--trials 3] [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import pstats
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import NamedTuple, Self

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._group_worker import HEAD, Seen, Worker, stop_all, worker_main
from bench._proc import loadavg, process_usage
from bench._report import report
from bench.cluster import async_client
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, ClientError, MessageSpec

ROOT = Path(__file__).resolve().parent.parent
QUEUES = 8
CONFIG = {
    "data_segment_bytes": 64 << 20,
    "index_segment_bytes": 32 << 20,
    "queues_per_topic": QUEUES,
}
BODY_BYTES = 1024
PAD = b"m" * (BODY_BYTES - HEAD.size)
INFLIGHT = 32
REBALANCE_RATE = 200  # msgs/s put during a rebalance trial, over all 8 queues
SETTLE_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 60.0
REBALANCE_TIMEOUT_S = 30.0
BOUND_S = 5.0  # the bound on a rebalance
Row = tuple[str, str, str]


def pct(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] if s else float("nan")


# -- the producer ---------------------------------------------------------------------


class Producer:
    """Puts 1 KiB messages on a topic from a thread (and event loop) of its own:
    `inflight` at once, paced to `rate` msgs/s (0: unpaced), on queue seq % `queues`
    (0: the server picks), until `stop()`."""

    def __init__(
        self, cl: LocalCluster, topic: str, *, inflight: int, rate: float, queues: int = 0
    ) -> None:
        self.cl, self.topic, self.queues = cl, topic, queues
        self.inflight, self.rate = inflight, rate
        self.acked: set[int] = set()
        self.put_ms: list[float] = []  # each acknowledged put's latency
        self.failed = 0
        self.started_s = self.ended_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="producer")

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def rate_achieved(self) -> float:
        return len(self.acked) / max(1e-9, self.ended_s - self.started_s)

    async def _run(self) -> None:
        async with async_client(self.cl) as client:
            counter = itertools.count()
            self.started_s = time.time()

            async def one() -> None:
                while not self._stop.is_set():
                    seq = next(counter)
                    if self.rate:
                        pause = self.started_s + seq / self.rate - time.time()
                        if pause > 0:
                            await asyncio.sleep(pause)
                    queue = seq % self.queues if self.queues else None
                    sent = time.time()
                    try:
                        await client.put(self.topic, HEAD.pack(seq, sent) + PAD, queue_id=queue)
                    except ClientError:
                        self.failed += 1
                        continue
                    self.put_ms.append((time.time() - sent) * 1e3)
                    self.acked.add(seq)

            await asyncio.gather(*(one() for _ in range(self.inflight)))
            self.ended_s = time.time()


# -- waiting on the group -------------------------------------------------------------


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> float:
    """Poll `check` until true; the time.time() it was first seen true. Raises on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return time.time()
        time.sleep(poll_s)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def owned_by(client: Client, group: str, topic: str, members: Collection[str]) -> bool:
    """Whether the group's describe shows all QUEUES queues of `topic` owned by the
    `members`, none revoking, each member owning one at least."""
    try:
        desc = client.group_describe(group)
    except ClientError:  # not yet known, or a leader change
        return False
    queues = [q for q in desc.queues if q.topic == topic]
    owners = {q.owner for q in queues}
    return len(queues) == QUEUES and owners == set(members) and not any(q.revoking for q in queues)


# -- (a) end to end -------------------------------------------------------------------


def e2e_case(cl: LocalCluster, consumers: int, seconds: float, rate: float) -> dict[str, float]:
    """One end-to-end case: metrics e2e_<n>c_* (see the module docstring)."""
    name = f"e2e{consumers}c"
    workers = [Worker(cl, name, name, f"{name}-{i}") for i in range(consumers)]
    try:
        with cl.client(timeout_s=5) as client:
            wait_for(
                f"{consumers} consumers to settle",
                lambda: owned_by(client, name, name, [w.member_id for w in workers]),
                SETTLE_TIMEOUT_S,
            )
        producer = Producer(cl, name, inflight=INFLIGHT, rate=rate).start()
        time.sleep(seconds)  # the measurement itself: a fixed interval of load
        producer.stop()

        def drained() -> bool:
            return producer.acked <= {s.seq for w in workers for s in w.seen}

        with contextlib.suppress(RuntimeError):  # what is missing is reported
            wait_for("the consumers to drain", drained, DRAIN_TIMEOUT_S, poll_s=0.1)
    finally:
        stop_all(workers)
    seen = [s for w in workers for s in w.seen if s.seq in producer.acked]
    first: dict[int, Seen] = {}
    for s in sorted(seen, key=lambda s: s.handled_s):
        first.setdefault(s.seq, s)
    lat = [s.latency_ms for s in first.values()]
    last = max((s.handled_s for s in first.values()), default=producer.started_s)
    p = f"e2e_{consumers}c"
    return {
        f"{p}_msgs_per_s": len(first) / max(1e-9, last - producer.started_s),
        f"{p}_p50_ms": pct(lat, 0.5),
        f"{p}_p99_ms": pct(lat, 0.99),
        f"{p}_duplicates": len(seen) - len(first),
        f"{p}_missing": len(producer.acked) - len(first),
        f"{p}_put_msgs_per_s": producer.rate_achieved,
        f"{p}_put_p50_ms": pct(producer.put_ms, 0.5),
        f"{p}_put_p99_ms": pct(producer.put_ms, 0.99),
        f"{p}_put_failures": producer.failed,
        f"{p}_messages": len(producer.acked),
        f"{p}_handled_per_consumer_min": min(len({s.seq for s in w.seen}) for w in workers),
    }


def e2e_rows(m: dict[str, float], consumers: int) -> list[Row]:
    p = f"e2e_{consumers}c"
    label = f"(a) e2e, {consumers} consumer{'s' if consumers > 1 else ''}"
    spread = (
        f", fewest on one consumer {m[f'{p}_handled_per_consumer_min']:,.0f}"
        if consumers > 1
        else ""
    )
    return [
        (
            label,
            f"{m[f'{p}_msgs_per_s']:,.0f} msgs/s",
            f"consumed; p50 {m[f'{p}_p50_ms']:.1f} ms, p99 {m[f'{p}_p99_ms']:.1f} ms",
        ),
        (
            "    producer",
            f"{m[f'{p}_put_msgs_per_s']:,.0f} msgs/s",
            f"put, {INFLIGHT} in flight: p50 {m[f'{p}_put_p50_ms']:.1f} ms, p99 "
            f"{m[f'{p}_put_p99_ms']:.1f} ms to the put's ack (part of the above); "
            f"{m[f'{p}_messages']:,.0f} messages, {m[f'{p}_put_failures']:.0f} failed",
        ),
        (
            "    duplicates / missing",
            f"{m[f'{p}_duplicates']:.0f} / {m[f'{p}_missing']:.0f}",
            f"(target 0 / 0){spread}",
        ),
    ]


# -- (c) drain ------------------------------------------------------------------------


def drain_case(
    cl: LocalCluster,
    consumers: int,
    backlog: int,
    *,
    stored: bool = False,
    profile: bool = False,
) -> dict[str, float]:
    """`consumers` settled in a fresh group, then `backlog` messages put in batches of
    256 (faster than they are handled); or (`stored`) the backlog put first, then the
    consumers started: msgs/s from the first handler call to the last, and each node's
    CPU per message meanwhile (the busiest node is the leader: it serves every fetch
    and ack, and stores the puts; a follower only replicates)."""
    name = f"drain{'stored' if stored else ''}{consumers}c"

    def put_backlog(client: Client) -> None:
        for start in range(0, backlog, 256):
            client.put_batch(
                [
                    MessageSpec(name, HEAD.pack(seq, time.time()) + PAD)
                    for seq in range(start, min(backlog, start + 256))
                ]
            )

    with cl.client(timeout_s=30) as client:
        if stored:
            put_backlog(client)
        pids = [pid for i in cl.specs if (pid := cl.pid(i)) is not None]
        cpu0 = [process_usage(pid)[0] for pid in pids]
        for pid in pids if profile else ():
            os.kill(pid, signal.SIGUSR1)  # bench/_profiled_node.py: start
        workers = [Worker(cl, name, name, f"{name}-{i}") for i in range(consumers)]
        try:
            if not stored:
                members = [w.member_id for w in workers]
                settled = lambda: owned_by(client, name, name, members)  # noqa: E731
                wait_for(f"{consumers} consumers to settle", settled, SETTLE_TIMEOUT_S)
                put_backlog(client)
            wait_for(
                f"{consumers} consumers to drain {backlog:,}",
                lambda: len({s.seq for w in workers for s in w.seen}) >= backlog,
                DRAIN_TIMEOUT_S * 2,
                poll_s=0.05,
            )
            cpu = [process_usage(pid)[0] - c for pid, c in zip(pids, cpu0, strict=True)]
            for pid in pids if profile else ():
                os.kill(pid, signal.SIGUSR2)  # stop; writes DLEDGER_PROFILE_DIR/node-PID.prof
        finally:
            stop_all(workers)
    seen = [s for w in workers for s in w.seen]
    first, last = min(s.handled_s for s in seen), max(s.handled_s for s in seen)
    p = f"drain_{'stored_' if stored else ''}{consumers}c"
    return {
        f"{p}_msgs_per_s": backlog / max(1e-9, last - first),
        f"{p}_duplicates": len(seen) - len({s.seq for s in seen}),
        f"{p}_leader_cpu_us_per_msg": max(cpu) / backlog * 1e6,
        f"{p}_follower_cpu_us_per_msg": min(cpu) / backlog * 1e6,
    }


def drain_rows(m: dict[str, float], consumers: int, stored: bool = False) -> list[Row]:
    p = f"drain_{'stored_' if stored else ''}{consumers}c"
    label = f"(c) drain, {consumers} consumer{'s' if consumers > 1 else ''}"
    how = (
        "the backlog stored before the consumer starts"
        if stored
        else "put in batches, faster than handled"
    )
    return [
        (
            label,
            f"{m[f'{p}_msgs_per_s']:,.0f} msgs/s",
            f"{how} (first to last handler call); {m[f'{p}_duplicates']:.0f} duplicates",
        ),
        (
            "    CPU per message",
            f"{m[f'{p}_leader_cpu_us_per_msg']:,.0f} us leader",
            f"a follower {m[f'{p}_follower_cpu_us_per_msg']:,.0f} us"
            + ("" if stored else "; the leader's includes storing the puts"),
        ),
    ]


def drain_profile(backlog: int, top: int = 25) -> None:
    """The 1-consumer drain of a stored backlog with the nodes under cProfile: the
    leader's top functions (its fetches and acks only)."""
    prof_dir = Path(tempfile.mkdtemp(prefix="cg-profile-"))
    os.environ["DLEDGER_PROFILE_DIR"] = str(prof_dir)
    prefix = lambda _i: [sys.executable, str(ROOT / "bench" / "_profiled_node.py")]  # noqa: E731
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), extra_config=CONFIG, command_prefix=prefix) as cl,
    ):
        cl.up()
        cl.wait_for_leader()
        m = drain_case(cl, 1, backlog, stored=True, profile=True)
    for row in drain_rows(m, 1, stored=True):
        print(*row)
    profiles = [pstats.Stats(str(f)) for f in prof_dir.glob("node-*.prof")]
    busiest = max(profiles, key=lambda st: st.total_tt)  # type: ignore[attr-defined]
    table = busiest.stats  # type: ignore[attr-defined]
    print("\nthe leader's event loop under cProfile (idle epoll waits left out), per message")
    idle = "<method 'poll' of 'select.epoll' objects>"
    for key in sorted((k for k in table if k[2] != idle), key=lambda k: -table[k][3])[:top]:
        _primitive, calls, own, cum, _callers = table[key]
        where = f"{Path(key[0]).name}:{key[1]}({key[2]})"
        print(
            f"{own / backlog * 1e6:8.1f} us own {cum / backlog * 1e6:8.1f} cum {calls:>8}  {where}"
        )


# -- (b) rebalance --------------------------------------------------------------------


class Trial(NamedTuple):
    owned_s: float  # kill -> all queues owned by the survivors
    first_msg_s: float  # kill -> a survivor handled a message of a lost queue
    lost_queues: int


def rebalance_trial(cl: LocalCluster, n: int) -> Trial:
    """3 consumers, kill one (see the module docstring)."""
    name = f"rebal{n}"
    workers = [Worker(cl, name, name, f"{name}-{i}") for i in range(3)]
    victim, survivors = workers[0], workers[1:]
    producer = Producer(cl, name, inflight=4, rate=REBALANCE_RATE, queues=QUEUES).start()
    try:
        with cl.client(timeout_s=5) as client:
            wait_for(
                "3 consumers to settle",
                lambda: owned_by(client, name, name, [w.member_id for w in workers]),
                SETTLE_TIMEOUT_S,
            )
            wait_for(
                "every consumer to handle messages",
                lambda: all(w.seen for w in workers),
                SETTLE_TIMEOUT_S,
            )
            desc = client.group_describe(name)
            lost = {
                q.queue_id for q in desc.queues if q.topic == name and q.owner == victim.member_id
            }
            killed_s = time.time()
            victim.kill()
            owned_s = wait_for(
                "the survivors to own every queue",
                lambda: owned_by(client, name, name, [w.member_id for w in survivors]),
                REBALANCE_TIMEOUT_S,
            )

            def taken_over() -> list[float]:
                return [
                    s.handled_s
                    for w in survivors
                    for s in w.seen
                    if s.queue_id in lost and s.handled_s >= killed_s
                ]

            wait_for(
                "a survivor to handle a lost queue's message",
                lambda: bool(taken_over()),
                REBALANCE_TIMEOUT_S,
            )
            return Trial(owned_s - killed_s, min(taken_over()) - killed_s, len(lost))
    finally:
        producer.stop()
        stop_all(survivors)
        if victim.proc.poll() is None:
            victim.kill()


def rebalance(cl: LocalCluster, trials: int) -> tuple[list[Row], dict[str, float]]:
    runs = [rebalance_trial(cl, n) for n in range(trials)]
    owned = [t.owned_s for t in runs]
    first = [t.first_msg_s for t in runs]
    m = {
        "rebalance_owned_s_median": statistics.median(owned),
        "rebalance_owned_s_max": max(owned),
        "rebalance_first_msg_s_median": statistics.median(first),
        "rebalance_first_msg_s_max": max(first),
        "rebalance_trials": len(runs),
    }
    over = "ok" if max(*owned, *first) < BOUND_S else f"FAILS (>= {BOUND_S:.0f} s)"
    rows = [
        (
            "(b) rebalance, kill 1 of 3",
            f"median {m['rebalance_owned_s_median']:.2f} s",
            f"until all {QUEUES} queues owned by the survivors; max "
            f"{m['rebalance_owned_s_max']:.2f} s over {len(runs)}: "
            + ", ".join(f"{x:.2f}" for x in owned),
        ),
        (
            "    first message of a lost queue",
            f"median {m['rebalance_first_msg_s_median']:.2f} s",
            f"handled by a survivor; max {m['rebalance_first_msg_s_max']:.2f} s: "
            + ", ".join(f"{x:.2f}" for x in first)
            + f" (queues lost per kill: {', '.join(str(t.lost_queues) for t in runs)})",
        ),
        ("    bound", f"< {BOUND_S:.0f} s", f"{over} (session timeout 3 s, long poll 1 s)"),
    ]
    return rows, m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0, help="producer time per e2e case")
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="pace the e2e producer to this many msgs/s (0: unpaced)",
    )
    ap.add_argument("--trials", type=int, default=3, help="rebalance trials")
    ap.add_argument("--backlog", type=int, default=20_000, help="messages each drain case handles")
    ap.add_argument(
        "--cprofile",
        action="store_true",
        help="only the 1-consumer drain, the nodes under cProfile: the "
        "leader's loop functions per message; writes no results",
    )
    ap.add_argument("--quick", action="store_true", help="2 s per e2e case, 1 rebalance trial")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON file (default bench/results/consumer_groups.json)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--servers", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--member", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        asyncio.run(worker_main(args.servers.split(","), args.group, args.topic, args.member))
        return
    if args.quick:
        args.seconds, args.trials, args.backlog = 2.0, 1, 2_000
    if args.trials < 1:
        ap.error("--trials must be at least 1")
    if args.cprofile:
        drain_profile(args.backlog)
        return
    rows: list[Row] = [("loadavg at start", loadavg(), "")]
    m: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), extra_config=CONFIG) as cl:
        cl.up()
        cl.wait_for_leader()
        for consumers in (1, 3):
            m |= e2e_case(cl, consumers, args.seconds, args.rate)
            rows += e2e_rows(m, consumers)
        m |= drain_case(cl, 1, args.backlog, stored=True)
        rows += drain_rows(m, 1, stored=True)
        for consumers in (1, 3):
            m |= drain_case(cl, consumers, args.backlog)
            rows += drain_rows(m, consumers)
        rebalance_rows, rebalance_m = rebalance(cl, args.trials)
        rows += rebalance_rows
        m |= rebalance_m
    rows.append(("loadavg at end", loadavg(), ""))
    report("consumer_groups", rows, m, out=args.out)


if __name__ == "__main__":
    main()
