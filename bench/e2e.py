"""End to end through one consumer group, in the style of the OpenMessaging Benchmark (issue 31).

A local 3-node cluster (sync flush, bench/consumer_groups.py's settings: 8 queues
per topic), 1 KiB messages, one consumer group; every producer and consumer is a
process of its own: a producer is bench/_e2e_worker.py (an AsyncClient; single
puts travel coalesced over the PutFrames stream), a consumer is
bench/consumer_groups.py's worker (an AsyncConsumer, batch 32, 8 handlers). This
process only starts them and collects what they noted. Latency across processes
uses the send time written into each body (time.time(): one host, one clock).
Every case has a fresh topic and group, a `--warmup` (2 s) before its measured
`--seconds` (10 s); CPU is read from /proc over the measured window.

(i) Closed loop: `--producers` processes (1) with `--inflight` puts each (32),
first with no consumer (the produce-only rate), then with one consumer in the
group: msgs/s produced and consumed over the window, and the backlog when it
ends (acknowledged, not yet handled; bounded: under 1 s of production). The
sustained rate (the lower of the two) over the produce-only one: the ratio
(target >= 0.90).

(ii) Open loop, paced: one producer at a fixed rate, one task per message created
at its scheduled time (a late scheduler sends what is due at once and reports
how late), one consumer: at a near-idle `--idle-rate` (20/s: the unloaded
latency), at each of `--rates` (250, 500, 1000, 2000) and at 80% of (i)'s
produce-only rate. For each: the achieved rate (puts sent in the window and
acknowledged, per second: failed puts are counted and their kinds shown),
publish-ack latency (send to the put's result) and end-to-end latency (send to
the handler's call) p50/p99/max, CPU microseconds per message of the leader,
each follower, the producer and the consumer process (and of this one, which
reads their reports), messages per PutFrames frame (the producer's) and per
proposal (the leader's `dledger_proposal_batch_messages`), the leader's fsyncs per
message and their mean duration (`dledger_fsync_seconds`: an inline fsync holds the
leader's loop that long). Targets: at 1,000/s
ack p50 <= 5 ms, ack p99 <= 25 ms, e2e p99 <= 30 ms; up to 80% of the closed-loop
maximum the p50 within 3x the unloaded p50; server CPU per message falling as
the rate rises; e2e p50 <= 1.5x and e2e p99 <= 3x the same case's ack figure.

(iii) Drain: `--backlog` messages (200,000) put first with PutBatch (256 a call,
`--batch-inflight` 4 calls at once; that rate is reported), then drained by one
consumer, then (a fresh group) by three: msgs/s from the first handler call to
the last, and CPU per message from the first report of a handled message to the
last. Targets: one consumer drains >= 2x as fast as the batched puts arrived,
with <= 15 us of leader CPU per message.

Every case checks that each acknowledged put was handled by the group (missing,
duplicates). `--linger-ms` is the producers' AsyncClient(linger_ms=...): how long a
put waits for more to share its frame while earlier ones are unanswered (default
the client's, 1 ms).

Run: `.venv/bin/python bench/e2e.py [--seconds 10] [--rates 250,500,1000,2000]
[--backlog 200000] [--inflight 32] [--producers 1] [--skip closed,paced,drain1,drain3]
[--quick]` (3 s per case, backlog 20,000, rates 250,1000); writes bench/results/e2e.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._e2e_report import Row, check_note, cpu_note, failure_rows, lat_note, ok, targets
from bench._e2e_worker import Producer, Result
from bench._group_worker import Seen, Worker, stop_all
from bench._proc import loadavg, process_usage
from bench._report import report
from bench.consumer_groups import CONFIG, SETTLE_TIMEOUT_S, owned_by, pct, wait_for
from dledger_commitlog.cli.launcher import LocalCluster

SEQ_STRIDE = 10**9  # producer p numbers its messages from p * SEQ_STRIDE
DRAIN_TIMEOUT_S = 120.0  # after the producers stop, for the consumers to catch up
BATCH = 256  # messages per PutBatch call of the drain's backlog
NAN = float("nan")


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def role_pids(cl: LocalCluster) -> tuple[int, dict[str, list[int]]]:
    """The leader's node id; the pids of "leader", "follower1", "follower2" (by node id)."""
    leader = cl.leader_id()
    order = [leader, *sorted(i for i in cl.specs if i != leader)]
    names = ["leader"] + [f"follower{k}" for k in range(1, len(order))]
    pids: dict[str, list[int]] = {}
    for name, i in zip(names, order, strict=True):
        pid = cl.pid(i)
        assert pid is not None, f"node {i} does not run"
        pids[name] = [pid]
    return leader, pids


def cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far, summed per role (a process that ended counts nothing)."""
    out: dict[str, float] = {}
    for role, group in pids.items():
        out[role] = 0.0
        for pid in group:
            with contextlib.suppress(OSError):
                out[role] += process_usage(pid)[0]
    return out


_COUNTED = (
    "dledger_proposal_batch_messages_sum",
    "dledger_proposal_batch_messages_count",
    "dledger_fsync_seconds_sum",
    "dledger_fsync_seconds_count",
)


def proposals(cl: LocalCluster, node_id: int) -> tuple[float, ...]:
    """The node's `dledger_proposal_batch_messages` and `dledger_fsync_seconds`
    histograms so far: (messages, proposals, fsync seconds, fsyncs)."""
    want = {name: i for i, name in enumerate(_COUNTED)}
    got = [NAN] * len(_COUNTED)
    try:
        with urllib.request.urlopen(f"http://{cl.specs[node_id].metrics}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return tuple(got)
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        name = sample.partition("{")[0]  # labelled with the shard
        if name in want:
            got[want[name]] = float(value)
    return tuple(got)


def first_seen(seen: Iterable[Seen]) -> dict[int, Seen]:
    """Each message's first handler call."""
    first: dict[int, Seen] = {}
    for s in seen:
        if s.seq not in first or s.handled_s < first[s.seq].handled_s:
            first[s.seq] = s
    return first


def drained(workers: Sequence[Worker], want: set[int]) -> bool:
    """Whether the workers reported every message of `want` (the count checked first: cheap)."""
    if sum(len(w.seen) for w in workers) < len(want):
        return False
    return want <= {s.seq for w in workers for s in w.seen}


@dataclass
class Case:
    """What one load case noted: the producers' puts, the consumers' handler calls,
    the measured window, each role's CPU seconds in it, the leader's proposals."""

    results: list[Result]
    seen: list[Seen]
    window: tuple[float, float]
    cpu_s: dict[str, float]
    proposals: tuple[float, ...]  # messages, proposals, fsync seconds, fsyncs
    consumers: int

    @property
    def acked(self) -> list[tuple[int, float, float]]:
        return [a for r in self.results for a in r.acked]


def run_load(
    cl: LocalCluster,
    name: str,
    mode: str,
    *,
    consumers: int,
    producers: int,
    warmup: float,
    seconds: float,
    **opts: float,
) -> Case:
    """Topic and group `name`: `consumers` settled, then `producers` processes in
    `mode` for warmup + seconds; the consumers then catch up."""
    servers = [s.client for s in cl.specs.values()]
    workers: list[Worker] = []
    prods: list[Producer] = []
    try:
        workers = [Worker(cl, name, name, f"{name}-{i}") for i in range(consumers)]
        if workers:
            members = [w.member_id for w in workers]
            with cl.client(timeout_s=5) as client:
                settled = lambda: owned_by(client, name, name, members)  # noqa: E731
                wait_for(f"{name}: {consumers} consumer(s) to settle", settled, SETTLE_TIMEOUT_S)
        prods = [
            Producer(
                servers, name, mode, base=p * SEQ_STRIDE, warmup=warmup, seconds=seconds, **opts
            )
            for p in range(producers)
        ]
        for p in prods:
            p.ready()
        leader, pids = role_pids(cl)
        pids["producer"] = [p.pid for p in prods]
        if workers:
            pids["consumer"] = [w.proc.pid for w in workers]
        pids["orchestrator"] = [os.getpid()]  # this process: it reads what they report
        start = time.time() + 0.3
        for p in prods:
            p.go(start)
        w0, w1 = start + warmup, start + warmup + seconds
        sleep_until(w0)
        c0, m0 = cpu(pids), proposals(cl, leader)
        sleep_until(w1)
        c1, m1 = cpu(pids), proposals(cl, leader)
        results = [p.result(timeout_s=120) for p in prods]
        want = {a[0] for r in results for a in r.acked}
        if workers:
            with contextlib.suppress(RuntimeError):  # what is missing is reported
                wait_for(
                    f"{name}: the consumers to catch up",
                    lambda: drained(workers, want),
                    DRAIN_TIMEOUT_S,
                    poll_s=0.2,
                )
    finally:
        stop_all(workers)
        for p in prods:
            p.close()
    return Case(
        results,
        [s for w in workers for s in w.seen],
        (w0, w1),
        {k: c1[k] - c0[k] for k in c0},
        tuple(b - a for a, b in zip(m0, m1, strict=True)),
        consumers,
    )


def cpu_metrics(p: str, cpu_s: dict[str, float], messages: int) -> dict[str, float]:
    return {f"{p}_{role}_cpu_us_per_msg": s / max(1, messages) * 1e6 for role, s in cpu_s.items()}


def load_metrics(p: str, case: Case) -> dict[str, float]:
    """Metrics P_* of a load case over its window: the puts sent in it (and acked)."""
    w0, w1 = case.window
    sent = [a for a in case.acked if w0 <= a[1] < w1]
    ack_ms = [(a[2] - a[1]) * 1e3 for a in sent]
    frames = sum(r.frames for r in case.results)
    m = {
        f"{p}_msgs_per_s": len(sent) / (w1 - w0),
        f"{p}_ack_p50_ms": pct(ack_ms, 0.5),
        f"{p}_ack_p99_ms": pct(ack_ms, 0.99),
        f"{p}_ack_max_ms": max(ack_ms, default=NAN),
        f"{p}_put_failures": sum(r.failed for r in case.results),
        f"{p}_behind_max_ms": max(r.behind_max_ms for r in case.results),
        f"{p}_behind_p99_ms": max(r.behind_p99_ms for r in case.results),
        f"{p}_late_msgs": sum(r.late_msgs for r in case.results),
        f"{p}_msgs_per_frame": sum(r.framed_msgs for r in case.results) / max(1, frames),
        f"{p}_msgs_per_proposal": case.proposals[0] / case.proposals[1]
        if case.proposals[1]
        else NAN,
        f"{p}_leader_fsyncs_per_msg": case.proposals[3] / max(1, len(sent)),
        f"{p}_leader_fsync_mean_us": case.proposals[2] / case.proposals[3] * 1e6
        if case.proposals[3]
        else NAN,
    } | cpu_metrics(p, case.cpu_s, len(sent))
    if case.consumers:
        first = first_seen(case.seen)
        e2e = [first[a[0]].latency_ms for a in sent if a[0] in first]
        acked_by_w1 = {a[0] for a in case.acked if a[2] < w1}
        handled_by_w1 = {q for q, s in first.items() if s.handled_s < w1}
        m |= {
            f"{p}_e2e_p50_ms": pct(e2e, 0.5),
            f"{p}_e2e_p99_ms": pct(e2e, 0.99),
            f"{p}_e2e_max_ms": max(e2e, default=NAN),
            f"{p}_consumed_msgs_per_s": sum(w0 <= s.handled_s < w1 for s in first.values())
            / (w1 - w0),
            f"{p}_backlog_msgs": len(acked_by_w1 - handled_by_w1),
            f"{p}_missing": len({a[0] for a in case.acked} - first.keys()),
            f"{p}_duplicates": len(case.seen) - len(first),
        }
    return m


# -- (i) closed loop ----------------------------------------------------------------------


def linger(args: argparse.Namespace) -> dict[str, float]:
    """The producers' linger option, when one is given."""
    return {} if args.linger_ms is None else {"linger-ms": args.linger_ms}


def closed_loop(cl: LocalCluster, args: argparse.Namespace) -> tuple[list[Row], dict[str, float]]:
    common = {
        "producers": args.producers,
        "warmup": args.warmup,
        "seconds": args.seconds,
        "inflight": args.inflight,
        **linger(args),
    }
    po_case = run_load(cl, "closed-po", "closed", consumers=0, **common)
    case = run_load(cl, "closed", "closed", consumers=1, **common)
    po = load_metrics("closed_produce_only", po_case)
    m = po | load_metrics("closed", case)
    produced, consumed = m["closed_msgs_per_s"], m["closed_consumed_msgs_per_s"]
    m["closed_produce_only_msgs_per_s"] = po_rate = po["closed_produce_only_msgs_per_s"]
    m["closed_produced_msgs_per_s"] = produced
    m["closed_sustained_msgs_per_s"] = sustained = min(produced, consumed)
    m["closed_backlog_s"] = m["closed_backlog_msgs"] / max(1.0, produced)
    m["closed_bounded"] = float(m["closed_backlog_s"] < 1.0)
    m["closed_ratio"] = sustained / po_rate if po_rate else NAN
    how = f"{args.producers} producer(s) x {args.inflight} in flight"
    rows = [
        (
            "(i) closed loop, produce only",
            f"{po_rate:,.0f} msgs/s",
            f"{how}, no consumer; {lat_note(m, 'closed_produce_only')}",
        ),
        (
            "",
            "",
            f"{cpu_note(m, 'closed_produce_only')}; "
            f"{m['closed_produce_only_msgs_per_frame']:.1f} msgs/frame, "
            f"{m['closed_produce_only_msgs_per_proposal']:.1f} msgs/proposal",
        ),
        (
            "(i) closed loop, 1 consumer",
            f"{sustained:,.0f} msgs/s",
            f"sustained: produced {produced:,.0f}/s, consumed {consumed:,.0f}/s; backlog at the "
            f"end {m['closed_backlog_msgs']:,.0f} msgs = {m['closed_backlog_s']:.2f} s "
            f"({'bounded' if m['closed_bounded'] else 'NOT bounded'}: < 1 s)",
        ),
        ("", "", f"{lat_note(m, 'closed')}; {cpu_note(m, 'closed')}"),
        (
            "",
            "",
            f"{m['closed_msgs_per_frame']:.1f} msgs/frame, "
            f"{m['closed_msgs_per_proposal']:.1f} msgs/proposal; {check_note(m, 'closed')}",
        ),
        ("    ratio sustained / produce only", f"{m['closed_ratio']:.2f}", "(target >= 0.90)"),
    ]
    return rows + failure_rows(po_case.results + case.results), m


# -- (ii) paced -------------------------------------------------------------------------


def paced(
    cl: LocalCluster, args: argparse.Namespace, rates: list[tuple[str, float]]
) -> tuple[list[Row], dict[str, float]]:
    rows: list[Row] = []
    m: dict[str, float] = {}
    for label, rate in sorted(rates, key=lambda lr: lr[1]):
        p = f"paced{label}"
        case = run_load(
            cl,
            p,
            "paced",
            consumers=1,
            producers=1,
            warmup=args.warmup,
            seconds=args.seconds,
            rate=rate,
            **linger(args),
        )
        m |= load_metrics(p, case) | {f"{p}_rate": rate}
        m[f"{p}_server_cpu_us_per_msg"] = sum(
            m[f"{p}_{r}_cpu_us_per_msg"] for r in ("leader", "follower1", "follower2")
        )
        e50 = m[f"{p}_e2e_p50_ms"] / m[f"{p}_ack_p50_ms"]
        e99 = m[f"{p}_e2e_p99_ms"] / m[f"{p}_ack_p99_ms"]
        m[f"{p}_e2e_over_ack_p50"], m[f"{p}_e2e_over_ack_p99"] = e50, e99
        busy = m[f"{p}_producer_cpu_us_per_msg"] * m[f"{p}_msgs_per_s"] / 1e4
        m[f"{p}_producer_core_pct"] = busy
        rows += [
            (
                f"(ii) paced {rate:,.0f}/s" + (" (80% of max)" if label == "80pct" else ""),
                f"{m[f'{p}_msgs_per_s']:,.0f} msgs/s",
                lat_note(m, p),
            ),
            (
                "",
                "",
                f"{cpu_note(m, p)}; servers {m[f'{p}_server_cpu_us_per_msg']:,.0f}; "
                f"the producer busy {busy:.0f}% of a core",
            ),
            (
                "",
                "",
                f"{m[f'{p}_msgs_per_frame']:.1f} msgs/frame, "
                f"{m[f'{p}_msgs_per_proposal']:.1f} msgs/proposal; leader fsyncs "
                f"{m[f'{p}_leader_fsyncs_per_msg']:.2f}/msg, "
                f"{m[f'{p}_leader_fsync_mean_us']:.0f} us each; behind schedule: max "
                f"{m[f'{p}_behind_max_ms']:.1f} ms, p99 {m[f'{p}_behind_p99_ms']:.1f} ms, "
                f"{m[f'{p}_late_msgs']:,.0f} msgs > 1 ms late; {check_note(m, p)}",
            ),
            (
                "",
                "",
                f"e2e/ack p50 {e50:.2f}x ({ok(e50 <= 1.5)}: <= 1.5x), "
                f"p99 {e99:.2f}x ({ok(e99 <= 3.0)}: <= 3x)",
            ),
            *failure_rows(case.results),
        ]
    return rows, m


# -- (iii) drain --------------------------------------------------------------------------


def drain_case(cl: LocalCluster, consumers: int, want: set[int]) -> dict[str, float]:
    """`consumers` in a fresh group drain the stored topic "drain"."""
    name = f"drain{consumers}"
    workers: list[Worker] = []
    try:
        _, pids = role_pids(cl)
        workers = [Worker(cl, name, "drain", f"{name}-{i}") for i in range(consumers)]
        pids["consumer"] = [w.proc.pid for w in workers]
        pids["orchestrator"] = [os.getpid()]
        wait_for(
            f"{name}: a first handled message",
            lambda: any(w.seen for w in workers),
            SETTLE_TIMEOUT_S,
            poll_s=0.01,
        )
        t0, c0 = time.time(), cpu(pids)
        with contextlib.suppress(RuntimeError):  # what is missing is reported
            wait_for(
                f"{name}: the drain",
                lambda: drained(workers, want),
                max(DRAIN_TIMEOUT_S, len(want) / 500),
                poll_s=0.2,
            )
        c1 = cpu(pids)
    finally:
        stop_all(workers)
    seen = [s for w in workers for s in w.seen]
    first = first_seen(seen)
    times = [s.handled_s for s in first.values()]
    in_window = sum(t >= t0 for t in times)
    span = max(times) - min(times) if times else NAN
    return {
        f"{name}_msgs_per_s": len(first) / max(1e-9, span),
        f"{name}_missing": len(want - first.keys()),
        f"{name}_duplicates": len(seen) - len(first),
        f"{name}_handled_min_per_consumer": min(len(w.seen) for w in workers),
    } | cpu_metrics(name, {k: c1[k] - c0[k] for k in c0}, in_window)


def drain(cl: LocalCluster, args: argparse.Namespace) -> tuple[list[Row], dict[str, float]]:
    servers = [s.client for s in cl.specs.values()]
    prod = Producer(
        servers, "drain", "batch", count=args.backlog, batch=BATCH, inflight=args.batch_inflight
    )
    try:
        prod.ready()
        _, pids = role_pids(cl)
        c0 = cpu(pids)
        prod.go(time.time())
        r = prod.result(timeout_s=max(120.0, args.backlog / 200))
        c1 = cpu(pids)
    finally:
        prod.close()
    put_rate = len(r.acked) / max(1e-9, r.ended - r.started)
    m = {"drain_batched_put_msgs_per_s": put_rate, "drain_batched_put_failures": r.failed}
    used = {k: c1[k] - c0[k] for k in c0} | {"producer": r.cpu_s}  # (it has ended: its own)
    m |= cpu_metrics("drain_batched_put", used, len(r.acked))
    rows: list[Row] = [
        (
            "(iii) backlog put, PutBatch",
            f"{put_rate:,.0f} msgs/s",
            f"{len(r.acked):,} msgs, {BATCH} a call x {args.batch_inflight} in flight; "
            f"{cpu_note(m, 'drain_batched_put')}; {r.failed} failed",
        ),
        *failure_rows([r]),
    ]
    want = {a[0] for a in r.acked}
    for n in (1, 3):
        if f"drain{n}" in args.skip:
            continue
        m |= drain_case(cl, n, want)
        p = f"drain{n}"
        spread = (
            f"; fewest on one consumer {m[f'{p}_handled_min_per_consumer']:,.0f}" if n > 1 else ""
        )
        rows += [
            (
                f"(iii) drain, {n} consumer{'s' if n > 1 else ''}",
                f"{m[f'{p}_msgs_per_s']:,.0f} msgs/s",
                f"first to last handler call; {cpu_note(m, p)}",
            ),
            (
                "",
                "",
                f"missing {m[f'{p}_missing']:,.0f}, duplicates {m[f'{p}_duplicates']:,.0f}{spread}",
            ),
        ]
    if "drain1_msgs_per_s" in m:
        m["drain_vs_batched_put_ratio"] = m["drain1_msgs_per_s"] / put_rate
        ratio = m["drain_vs_batched_put_ratio"]
        rows.append(("    drain (1 consumer) / batched put", f"{ratio:.2f}", "(target >= 2)"))
    return rows, m


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="measured time per load case")
    ap.add_argument("--warmup", type=float, default=2.0, help="load before each measured window")
    ap.add_argument("--rates", default="250,500,1000,2000", help="paced rates, msgs/s")
    ap.add_argument("--idle-rate", type=float, default=20.0, help="the unloaded paced rate")
    ap.add_argument("--backlog", type=int, default=200_000, help="messages of the drain")
    ap.add_argument("--inflight", type=int, default=32, help="closed loop: puts in flight each")
    ap.add_argument("--producers", type=int, default=1, help="closed loop: producer processes")
    ap.add_argument("--batch-inflight", type=int, default=4, help="backlog: PutBatch in flight")
    ap.add_argument(
        "--linger-ms",
        type=float,
        default=None,
        help="the producers' AsyncClient linger_ms (default: the client's)",
    )
    ap.add_argument("--skip", default="", help="cases to skip: closed,paced,drain1,drain3")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="3 s per case (1 s warm-up), backlog 20,000, rates 250,1000",
    )
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/e2e.json")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.backlog, args.rates = 3.0, 1.0, 20_000, "250,1000"
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if "drain" in args.skip:
        args.skip |= {"drain1", "drain3"}
    unknown = args.skip - {"closed", "paced", "drain", "drain1", "drain3"}
    if unknown:
        ap.error(f"--skip: unknown {', '.join(sorted(unknown))}")
    rows: list[Row] = [("loadavg at start", loadavg(), "")]
    m: dict[str, float] = {}
    paced_labels: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), extra_config=CONFIG) as cl:
        cl.up()
        cl.wait_for_leader()
        if "closed" not in args.skip:
            r, cm = closed_loop(cl, args)
            rows, m = rows + r, m | cm
        if "paced" not in args.skip:
            rates = [(f"{args.idle_rate:g}", args.idle_rate)]
            rates += [(f"{float(x):g}", float(x)) for x in args.rates.split(",") if x.strip()]
            if "closed_produce_only_msgs_per_s" in m:
                rates.append(("80pct", round(0.8 * m["closed_produce_only_msgs_per_s"])))
            r, pm = paced(cl, args, rates)
            rows, m = rows + r, m | pm
            paced_labels = [lb for lb, _ in sorted(rates, key=lambda lr: lr[1])]
        if not {"drain1", "drain3"} <= args.skip:
            r, dm = drain(cl, args)
            rows, m = rows + r, m | dm
    rows += targets(m, paced_labels)
    rows.append(("loadavg at end", loadavg(), ""))
    report("e2e", rows, m, out=args.out)


if __name__ == "__main__":
    main()
