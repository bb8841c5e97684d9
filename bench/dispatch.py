"""Dispatch throughput, crash recovery and full rebuild speed (issue 5 targets).

One run, on one store that grows:
(1) build a 1 GiB log offline: 1 KiB messages, 8 topics x 4 queues, 2 keys each
    (plus the UNIQ_KEY), appended as Raft entries in batches of 64 with async
    flush (as bench/append.py's case (a)), queue fields set as the leader sets
    them; then dispatch it (consume queues and index, default file sizes) and
    compare the rates; dispatch again with the commit index moving 64 entries at
    a time (a leader dispatching each commit as it comes, not catching up) and 1
    at a time (a sequential put), and time the commit-log read alone (what
    dispatch costs beyond it is its own); a cProfile of a dispatch run shows
    where the time goes;
(2) start a real single-node cluster on that store, put load through the gRPC
    client, kill -9 the node mid-load and time its restart (process start to
    answering Status as leader with every acknowledged put committed);
(3) delete consumequeue/ and index/ and time dledger_commitlog.log.verify.rebuild;
then extend the log to 4 GiB offline and repeat (2).
Steps (1) and the extension live in bench/_dispatch_log.py, (2) in
bench/_dispatch_node.py; this file runs them and reports.
Segments are the default 1 GiB. Run: `.venv/bin/python bench/dispatch.py`
(`--small-gib 0.05 --large-gib 0.1` for a quick try). The whole run takes about
7 minutes; `--dispatch-only` runs step (1) alone (a minute or two for 0.25 GiB)
and updates only the keys that step measures in bench/results/dispatch.json,
keeping the others from the last full run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._dispatch_log import (
    BATCH,
    GIB,
    LAYOUT,
    QUEUES,
    TOPICS,
    Leader,
    Messages,
    append_until,
    dispatch_all,
    dispatch_in_batches,
    open_store,
    profile_dispatch,
    rate_beyond,
    read_log,
    seal,
)
from bench._dispatch_node import node_phase
from bench._report import RESULTS, report
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.log.verify import open_dispatcher, read_layout, rebuild
from raftio.hard_state import RaftStateFile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--small-gib", type=float, default=1.0, help="first log size")
    ap.add_argument("--large-gib", type=float, default=4.0, help="the log is extended to this")
    ap.add_argument("--profile-entries", type=int, default=40_000)
    ap.add_argument("--load-s", type=float, default=3.0, help="load before each kill -9")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument(
        "--dispatch-only",
        action="store_true",
        help="step (1) only: build the small log, dispatch it, profile; keep the other keys",
    )
    args = ap.parse_args()
    small, large = f"{args.small_gib:g}gib", f"{args.large_gib:g}gib"
    began = time.perf_counter()
    m: dict[str, float] = {"loadavg_1m_start": os.getloadavg()[0]}
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="dledger-bench-dispatch-") as tmp:
        root = Path(tmp)
        with LocalCluster(root / "cluster", nodes=1, extra_config=LAYOUT) as cl:
            data = Path(cl.specs[1].data_dir)
            data.mkdir(parents=True)

            # (1) build the small log: append rate, then dispatch rate, profile.
            print(f"building a {small} log (append, then dispatch) ...", flush=True)
            store = open_store(data)
            msgs = Messages(0, fast=False)
            b = append_until(store, msgs, Leader({}), int(args.small_gib * GIB), term=1)
            seal(store, data, term=1)
            dsp, _ = dispatch_all(data, store)
            small_n, small_cpu = dispatch_in_batches(store, root / "batches", 100_000, 64)
            one_n, one_cpu = dispatch_in_batches(store, root / "ones", 20_000, 1)
            read_n, read_cpu = read_log(store)
            profile, profiled_rate = profile_dispatch(store, root / "profile", args.profile_entries)
            built_small = store.end_pos
            store.close()
            append_eps, append_cpu = b.entries / b.append_s, b.entries / b.append_cpu_s
            disp_eps, disp_cpu = dsp.messages / dsp.wall_s, dsp.messages / dsp.cpu_s
            m |= {
                "entries_small": b.entries,
                "log_bytes_small": b.bytes,
                "encode_entries_per_s": b.entries / b.encode_s,
                "append_entries_per_s": append_eps,
                "append_cpu_entries_per_s": append_cpu,
                "append_mb_per_s": b.bytes / b.append_s / 1e6,
                "dispatch_entries_per_s": disp_eps,
                "dispatch_cpu_entries_per_s": disp_cpu,
                "dispatch_mb_per_s": dsp.bytes / dsp.wall_s / 1e6,
                "dispatch_to_append_ratio": disp_eps / append_eps,
                "dispatch_to_append_cpu_ratio": disp_cpu / append_cpu,
                "dispatch_persist_s": dsp.persist_s,
                "dispatch_batch64_cpu_entries_per_s": small_n / small_cpu,
                "dispatch_one_cpu_us_per_entry": one_cpu / one_n * 1e6,
                "log_read_cpu_entries_per_s": read_n / read_cpu,
                "dispatch_beyond_read_cpu_entries_per_s": rate_beyond(disp_cpu, read_n / read_cpu),
                "profiled_dispatch_entries_per_s": profiled_rate,
            }
            rows += [
                (
                    f"log of {small}",
                    f"{b.entries:,} entries",
                    f"{b.bytes / 1e6:,.0f} MB, "
                    f"{len(TOPICS)} topics x {QUEUES} queues, 2 keys + UNIQ_KEY, 1 GiB segments",
                ),
                (
                    "encode (request path)",
                    f"{m['encode_entries_per_s']:,.0f} entries/s",
                    "encode_message + make_properties, not in the append figure",
                ),
                (
                    "append, async flush",
                    f"{append_eps:,.0f} entries/s",
                    f"{m['append_mb_per_s']:,.1f} MB/s; CPU-time rate {append_cpu:,.0f}/s "
                    f"(leader's queue patch + append_entries, batches of {BATCH})",
                ),
                (
                    "dispatch (catch_up)",
                    f"{disp_eps:,.0f} entries/s",
                    f"{m['dispatch_mb_per_s']:,.1f} MB/s; CPU-time rate {disp_cpu:,.0f}/s; "
                    f"persist {dsp.persist_s:.2f} s",
                ),
                (
                    "dispatch / append",
                    f"{disp_eps / append_eps:.2f}",
                    f"CPU-time ratio {disp_cpu / append_cpu:.2f} (target >= 2)",
                ),
                (
                    "dispatch, batches of 64",
                    f"{small_n / small_cpu:,.0f} entries/s",
                    f"CPU-time rate over {small_n:,} entries, the commit index moving 64 at a time",
                ),
                (
                    "dispatch, one at a time",
                    f"{one_cpu / one_n * 1e6:,.1f} us CPU/entry",
                    f"over {one_n:,} entries, the commit index moving 1 at a time "
                    "(a sequential put; ONE_BY_ONE_MAX)",
                ),
                (
                    "commit-log read alone",
                    f"{read_n / read_cpu:,.0f} entries/s",
                    f"CPU-time rate of read_committed; dispatch beyond it "
                    f"{m['dispatch_beyond_read_cpu_entries_per_s']:,.0f}/s",
                ),
            ]
            if args.dispatch_only:
                print("\n" + profile)
                _report_dispatch_only(m, rows, began)
                return

            # (2) kill -9 under load on the small log.
            print(f"node on the {small} log: start, load, kill -9, restart ...", flush=True)
            p1 = node_phase(cl, built_small, args.load_s)

            # (3) full rebuild of the small log's queues and index.
            print(f"rebuilding consumequeue/ and index/ of the {small} log ...", flush=True)
            shutil.rmtree(data / "consumequeue")
            shutil.rmtree(data / "index")
            t0 = time.perf_counter()
            d = rebuild(data, data, read_layout(data))
            rebuild_s = time.perf_counter() - t0
            rebuilt_bytes, rebuilt_msgs = d.dispatched_pos, d.messages_dispatched
            d.close(clean=True)
            m |= {
                "rebuild_s": rebuild_s,
                "rebuild_mb_per_s": rebuilt_bytes / rebuild_s / 1e6,
                "rebuild_entries_per_s": rebuilt_msgs / rebuild_s,
            }

            # Extend the log to the large size offline (template encoding), dispatch it.
            print(f"extending the log to {large} ...", flush=True)
            store = open_store(data)
            term = RaftStateFile(data / "raft.state").saved.term
            t0 = time.perf_counter()
            d = open_dispatcher(data, store, store.last_index(), LAYOUT)
            open_s = time.perf_counter() - t0
            queue_next = d.max_offsets()
            d.close(clean=True)
            ext_msgs = Messages(msgs.seq, fast=True)
            e = append_until(store, ext_msgs, Leader(queue_next), int(args.large_gib * GIB), term)
            seal(store, data, term)
            edsp, _ = dispatch_all(data, store)
            built_large = store.end_pos
            store.close()
            m |= {
                "entries_large": store.last_index(),
                "log_bytes_large": built_large,
                "ext_append_entries_per_s": e.entries / e.append_s,
                "ext_dispatch_entries_per_s": edsp.messages / edsp.wall_s,
                "ext_dispatch_cpu_entries_per_s": edsp.messages / edsp.cpu_s,
                "offline_dispatcher_open_s_small": open_s,
            }

            # (2) again on the large log.
            print(f"node on the {large} log: start, load, kill -9, restart ...", flush=True)
            p2 = node_phase(cl, built_large, args.load_s)

        for label, p in ((small, p1), (large, p2)):
            r = p.restart
            m |= {
                f"recovery_s_{label}": r.leader_s,
                f"recovery_node_s_{label}": p.node_s,
                f"recovery_port_open_s_{label}": r.port_s,
                f"recovery_dispatched_s_{label}": r.dispatched_s,
                f"recovery_redispatched_{label}": p.redispatched,
                f"first_start_s_{label}": p.first_start_s,
                f"first_start_node_s_{label}": p.first_start_node_s,
                f"load_msgs_per_s_{label}": p.load.acked / p.load.seconds,
            }
            rows += [
                (
                    f"kill -9 recovery, {label}",
                    f"{r.leader_s:.2f} s",
                    f"spawn -> leader, all {p.load.acked:,} acked puts committed (target < 5 s); "
                    f"port open {r.port_s:.2f} s, dispatched {r.dispatched_s:.2f} s",
                ),
                (
                    "    node's own figure",
                    f"{p.node_s:.2f} s",
                    f"'recovered in ... after a {p.node_kind}', re-dispatched {p.redispatched:,}",
                ),
                (
                    "    first start (clean)",
                    f"{p.first_start_s:.2f} s",
                    f"node's figure {p.first_start_node_s:.2f} s; load before the kill "
                    f"{p.load.acked / p.load.seconds:,.0f} msgs/s",
                ),
            ]
        rows += [
            (
                f"full rebuild, {small}",
                f"{m['rebuild_mb_per_s']:,.1f} MB/s",
                f"{rebuild_s:.1f} s, {m['rebuild_entries_per_s']:,.0f} entries/s (verify.rebuild)",
            ),
            (
                f"extension to {large}",
                f"{m['ext_dispatch_entries_per_s']:,.0f} dispatch/s",
                f"append {m['ext_append_entries_per_s']:,.0f}/s over "
                f"{e.entries:,} more entries (template encoding)",
            ),
        ]
    m["loadavg_1m_end"] = os.getloadavg()[0]
    m["total_s"] = time.perf_counter() - began
    rows.append(
        (
            "whole bench",
            f"{m['total_s']:.0f} s",
            f"load average {m['loadavg_1m_start']:.1f} -> {m['loadavg_1m_end']:.1f} "
            f"on {os.cpu_count()} cpus (shared machine)",
        )
    )
    print("\n" + profile)
    report("dispatch", rows, m)


def _report_dispatch_only(
    m: dict[str, float], rows: list[tuple[str, str, str]], began: float
) -> None:
    """Step (1)'s figures over those of the last full run (the other keys stay)."""
    previous: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError, ValueError):
        doc = json.loads((RESULTS / "dispatch.json").read_text())
        previous = {k: v for k, v in doc.items() if isinstance(v, int | float)}
    m["loadavg_1m_end"] = os.getloadavg()[0]
    m["dispatch_only_s"] = time.perf_counter() - began
    load = f"load average {m['loadavg_1m_start']:.1f} -> {m['loadavg_1m_end']:.1f}"
    note = f"{load} on {os.cpu_count()} cpus (shared); other keys: last full run"
    rows.append(("dispatch-only run", f"{m['dispatch_only_s']:.0f} s", note))
    report("dispatch", rows, previous | m)


if __name__ == "__main__":
    main()
