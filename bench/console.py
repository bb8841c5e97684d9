"""The web console against issue 33's speed targets, on one local cluster.

A local 3-node cluster (`LocalCluster`, one data shard) and real `dledger console`
processes (`--cluster FILE --port 0`), measured over real HTTP:

(2) Search by key: `--messages` (1,000,000) 100-byte messages put to one topic in
    batches of 256, 8 batches in flight (`AsyncClient.put_batch`, the fastest put
    path); message i carries key `k{i % (messages / 5)}`, so every key has 5
    matches spread over the whole log. Reported: the load's time and rate, and
    `GET /api/v1/topics/{topic}/messages?key=K` for `--searches` random keys (each
    must answer its 5 messages) and for a key no message has: median and max ms.
    Target: under 200 ms.
(1) The cluster page with `--topics` (1,000) topics, each with a message in each
    of its 4 queues (put in batches), and `--groups` (100) consumer groups (an
    offset committed for each). The page's load waits on one API call: the first
    `snapshot` event of `GET /api/v1/events` (static/app.js opens the stream; the
    cluster view draws from that event: the cluster and the topics views). Timed on
    a console just started (its client has no route cached yet) and then warm
    (median of 5), beside `GET /cluster`, `/topics` and `/groups` (the groups
    page's poll). With Debian's chromium and Playwright: a real page load, from
    `goto` to the first shard's card drawn in `#cluster-shards` (a new browser
    context each time: the first and the median of 3), and, noted in the page, when
    its document was loaded, the first snapshot arrived and the page had handled it
    (the median). Target: under 1 s.
(3) HTTP puts vs the gRPC client: bench/http_put.py's `interleaved` (1 KiB
    messages, sequential and 32 in flight, rounds run A B A B). Target: HTTP at
    least 60% of each gRPC rate.
(4) Leader CPU: a steady load of `--rate` (200) 1 KiB puts a second (4 in flight,
    bench/consumer_groups.py's `Producer`); the leader's CPU (/proc/PID/stat) over
    `--seconds` (8) with no console running, with a console and one open event
    stream, and with three; the phases run in turn, `--cpu-rounds` (3) times, each
    figure the median. Reported in percent of one core, and the difference from no
    console in percentage points. Target: at most 2 points. Beside it, less noisy,
    what one snapshot (the cluster and topics views read over HTTP) costs the leader
    with nothing else running: a stream adds that a second.

Run: `nice .venv/bin/python bench/console.py [--messages N] [--no-browser]`; writes
bench/results/console.json.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import http_put
from bench._proc import loadavg, process_usage
from bench._report import report
from bench.cluster import async_client
from bench.consumer_groups import Producer
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import MessageSpec

Row = tuple[str, str, str]
# 4,000 queues: a queue's file preallocates cq_units_per_file x 20 bytes (6 MB by
# default: 24 GB a node), so 80 KB files here.
CONFIG = {
    "data_segment_bytes": 256 << 20,
    "index_segment_bytes": 32 << 20,
    "cq_units_per_file": 4096,
}
SEARCH_TOPIC = "search"
MATCHES = 5  # messages per key in the search topic
BODY = b"s" * 100
BATCH = 256
INFLIGHT_BATCHES = 8
QUEUES = 4  # the cluster's default queues per topic
# A node makes a new queue's files on its loop: one batch of 1,024 new queues held it
# past the election timeout. So the topics are put 64 messages a batch.
TOPIC_BATCH = 64
SNAPSHOTS = 50  # cluster and topics views read to weigh a snapshot on the leader
PAGE_SELECTOR = "#cluster-shards .shard"
PAGE_MS = 1000.0
SEARCH_MS = 200.0
CPU_POINTS = 2.0


def ms(seconds: float) -> float:
    return seconds * 1e3


# -- the console ------------------------------------------------------------------------


@contextmanager
def console(cluster: LocalCluster) -> Iterator[tuple[int, int]]:
    """A console of `cluster` (its port and pid), stopped when the block ends."""
    proc, port = http_put.start_console(cluster)
    try:
        yield port, proc.pid
    finally:
        http_put.stop_console(proc)


def get(conn: http.client.HTTPConnection, path: str) -> tuple[float, Any]:
    """The seconds a GET took (its whole body read) and its JSON."""
    started = time.perf_counter()
    conn.request("GET", path)
    reply = conn.getresponse()
    body = reply.read()
    took = time.perf_counter() - started
    if reply.status != 200:
        raise RuntimeError(f"GET {path}: {reply.status} {body[:200]!r}")
    return took, json.loads(body)


class Stream:
    """One `GET /api/v1/events` stream read by a thread of its own, as a page keeps it:
    the time to its first snapshot, and the snapshots read until `close`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.snapshots = 0
        self.first_s = 0.0
        self.last: dict[str, Any] = {}
        self.failed = ""
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="events", daemon=True)
        self._started = time.perf_counter()
        self._thread.start()

    def first(self, timeout_s: float = 30.0) -> dict[str, Any]:
        if not self._first.wait(timeout_s) or self.failed:
            raise RuntimeError(f"no snapshot from /api/v1/events: {self.failed or 'timeout'}")
        return self.last

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _read(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/api/v1/events")
            reply = conn.getresponse()
            if reply.status != 200:
                raise RuntimeError(f"status {reply.status}")
            event = ""
            while not self._stop.is_set():
                line = reply.readline().decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event == "snapshot":
                    if not self.snapshots:
                        self.first_s = time.perf_counter() - self._started
                    self.last = json.loads(line.removeprefix("data: "))
                    self.snapshots += 1
                    self._first.set()
        except Exception as exc:  # reported by `first`
            self.failed = f"{type(exc).__name__}: {exc}"
            self._first.set()
        finally:
            conn.close()


# -- filling the cluster ----------------------------------------------------------------


def put_all(cluster: LocalCluster, batches: Iterator[list[MessageSpec]], inflight: int) -> None:
    """Put every batch, `inflight` batches at a time."""

    async def run() -> None:
        async with async_client(cluster) as client:

            async def worker() -> None:
                for batch in batches:  # the workers share the iterator
                    await client.put_batch(batch)

            await asyncio.gather(*(worker() for _ in range(inflight)))

    asyncio.run(run())


def search_batches(messages: int) -> Iterator[list[MessageSpec]]:
    keys = max(1, messages // MATCHES)
    for first in range(0, messages, BATCH):
        yield [
            MessageSpec(SEARCH_TOPIC, BODY, keys=(f"k{i % keys}",))
            for i in range(first, min(messages, first + BATCH))
        ]


def topic_batches(topics: int) -> Iterator[list[MessageSpec]]:
    specs = [
        MessageSpec(f"topic-{t:04}", b"t", queue_id=q) for t in range(topics) for q in range(QUEUES)
    ]
    for first in range(0, len(specs), TOPIC_BATCH):
        yield specs[first : first + TOPIC_BATCH]


def commit_groups(cluster: LocalCluster, groups: int) -> None:
    """One committed offset for each of `groups` groups (on topic-0000's queue 0)."""

    async def run() -> None:
        async with async_client(cluster) as client:
            await asyncio.gather(
                *(client.commit_offset(f"group-{g:03}", "topic-0000", 0, 1) for g in range(groups))
            )

    asyncio.run(run())


# -- (2) search by key ------------------------------------------------------------------


def search(port: int, messages: int, searches: int) -> dict[str, float]:
    keys = max(1, messages // MATCHES)
    want = min(MATCHES, messages)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    path = f"/api/v1/topics/{SEARCH_TOPIC}/messages?key="
    get(conn, path + "k0")  # the connection, the route
    found: list[float] = []
    for key in random.Random(33).sample(range(keys), min(keys, searches)):
        took, doc = get(conn, f"{path}k{key}")
        if len(doc["messages"]) != want:
            raise RuntimeError(f"key k{key}: {len(doc['messages'])} messages, not {want}")
        found.append(ms(took))
    missed = []
    for n in range(5):
        took, doc = get(conn, f"{path}absent-{n}")
        if doc["messages"]:
            raise RuntimeError(f"key absent-{n} found {len(doc['messages'])} messages")
        missed.append(ms(took))
    conn.close()
    return {
        "search_hit_median_ms": statistics.median(found),
        "search_hit_max_ms": max(found),
        "search_miss_median_ms": statistics.median(missed),
        "search_miss_max_ms": max(missed),
    }


# -- (1) the cluster page ---------------------------------------------------------------


def page_api(cluster: LocalCluster, topics: int, groups: int) -> dict[str, float]:
    """The page's API calls: cold (a console just started), then warm."""
    out: dict[str, float] = {}
    with console(cluster) as (port, _):
        stream = Stream(port)
        doc = stream.first()
        stream.close()
        out["page_events_first_cold_ms"] = ms(stream.first_s)
        if doc["errors"] or len(doc["topics"]) < topics:
            raise RuntimeError(f"snapshot: {len(doc['topics'])} topics, errors {doc['errors']}")
        firsts = []
        for _ in range(5):
            stream = Stream(port)
            stream.first()
            stream.close()
            firsts.append(ms(stream.first_s))
        out["page_events_first_warm_ms"] = statistics.median(firsts)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for name in ("cluster", "topics", "groups"):
            times = []
            for _ in range(5):
                took, doc = get(conn, f"/api/v1/{name}")
                times.append(ms(took))
            if name == "groups" and len(doc["groups"]) < groups:
                raise RuntimeError(f"/groups lists {len(doc['groups'])} groups, not {groups}")
            out[f"page_get_{name}_ms"] = statistics.median(times)
        # What a snapshot (the cluster and the topics views) costs the leader, with no
        # other load: the CPU of SNAPSHOTS of them, back to back.
        leader = cluster.pid(cluster.leader_id())
        assert leader is not None
        before = process_usage(leader)[0]
        for _ in range(SNAPSHOTS):
            get(conn, "/api/v1/cluster")
            get(conn, "/api/v1/topics")
        spent = process_usage(leader)[0] - before
        out["leader_cpu_ms_per_snapshot"] = ms(spent / SNAPSHOTS)
        conn.close()
    return out


# Run in the page before its own scripts: notes (ms since the navigation began) when
# the first snapshot event arrives and when the page's own handlers of it are done
# (a timer set in the first listener runs after every listener of the event).
MARKS_JS = """
const Native = window.EventSource;
window.__marks = {};
window.EventSource = class extends Native {
  constructor(...args) {
    super(...args);
    this.addEventListener("snapshot", () => {
      if (window.__marks.snapshot !== undefined) return;
      window.__marks.snapshot = performance.now();
      setTimeout(() => { window.__marks.handled = performance.now(); }, 0);
    });
  }
};
"""


def page_browser(cluster: LocalCluster, loads: int) -> dict[str, float] | str:
    """A real page load in chromium, `loads` times (else why it was skipped): from
    `goto` to the cluster view drawn, and in the page when its document was loaded, the
    first snapshot arrived and the page had handled it."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "skipped: Playwright is not installed"
    if chromium is None:
        return "skipped: no chromium on PATH"
    runs: dict[str, list[float]] = {}
    with console(cluster) as (port, _), sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                context.add_init_script(MARKS_JS)
                page = context.new_page()
                started = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/#cluster")
                page.wait_for_selector(PAGE_SELECTOR, timeout=30_000)
                runs.setdefault("drawn", []).append(ms(time.perf_counter() - started))
                marks = page.evaluate(
                    "() => ({...window.__marks, dom: performance.getEntriesByType("
                    "'navigation')[0].domContentLoadedEventEnd})"
                )
                for name in ("dom", "snapshot", "handled"):
                    runs.setdefault(name, []).append(float(marks[name]))
                context.close()
        finally:
            browser.close()
    out = {"page_browser_first_ms": runs["drawn"][0]}
    out |= {f"page_browser_{k}_median_ms": statistics.median(v) for k, v in runs.items()}
    return out


# -- (4) leader CPU ---------------------------------------------------------------------


def leader_cpu(cluster: LocalCluster, seconds: float, rounds: int, rate: float) -> dict[str, float]:
    """The leader's CPU (% of a core) under a steady put load, per phase (see the doc);
    the points each console phase adds are the median of the rounds' differences."""
    phases: dict[str, list[float]] = {"none": [], "streams1": [], "streams3": []}
    console_cpu: dict[str, list[float]] = {"streams1": [], "streams3": []}
    events: list[float] = []  # snapshots a second each stream read while measured
    producer = Producer(cluster, "steady", inflight=4, rate=rate).start()
    try:
        time.sleep(2.0)  # the producer at its pace
        for _ in range(rounds):
            leader = cluster.pid(cluster.leader_id())
            assert leader is not None
            phases["none"].append(cpu_percents([leader], seconds)[0])
            for name, streams in (("streams1", 1), ("streams3", 3)):
                with console(cluster) as (port, pid):
                    opened = [Stream(port) for _ in range(streams)]
                    for s in opened:
                        s.first()
                    before = [s.snapshots for s in opened]
                    ours, theirs = cpu_percents([leader, pid], seconds)
                    events += [
                        (s.snapshots - b) / seconds for s, b in zip(opened, before, strict=True)
                    ]
                    phases[name].append(ours)
                    console_cpu[name].append(theirs)
                    for s in opened:
                        s.close()
                        if s.failed:
                            raise RuntimeError(f"an event stream failed: {s.failed}")
            if cluster.pid(cluster.leader_id()) != leader:
                print("warning: the leader changed during a round", file=sys.stderr)
    finally:
        producer.stop()
    out = {f"leader_cpu_{k}_pct": statistics.median(v) for k, v in phases.items()}
    for name in ("streams1", "streams3"):
        added = [with_ - none for with_, none in zip(phases[name], phases["none"], strict=True)]
        out[f"leader_cpu_{name}_added_points"] = statistics.median(added)
        out[f"console_cpu_{name}_pct"] = statistics.median(console_cpu[name])
    out["steady_put_msgs_per_s"] = producer.rate_achieved
    out["events_min_per_s"] = min(events)
    return out


def cpu_percents(pids: list[int], seconds: float) -> list[float]:
    """Each process's CPU over the next `seconds`, in % of one core."""
    before, started = [process_usage(p)[0] for p in pids], time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    return [(process_usage(p)[0] - b) / took * 100 for p, b in zip(pids, before, strict=True)]


# -- the run ----------------------------------------------------------------------------


def timed(what: Callable[[], Any]) -> float:
    started = time.perf_counter()
    what()
    return time.perf_counter() - started


def measure(cluster: LocalCluster, args: argparse.Namespace) -> tuple[dict[str, float], str]:
    """Every figure, in the order of the module doc's list; and why the browser was not
    used ("" when it was)."""
    m: dict[str, float] = {}
    m["load_s"] = timed(lambda: put_all(cluster, search_batches(args.messages), INFLIGHT_BATCHES))
    m["load_msgs_per_s"] = args.messages / m["load_s"]
    m["populate_s"] = timed(lambda: put_all(cluster, topic_batches(args.topics), 1))
    m["populate_s"] += timed(lambda: commit_groups(cluster, args.groups))
    with console(cluster) as (port, _):
        m |= search(port, args.messages, args.searches)
    m |= page_api(cluster, args.topics, args.groups)
    browser = "skipped: --no-browser" if args.no_browser else ""
    if not browser:
        loaded = page_browser(cluster, 3)
        if isinstance(loaded, str):
            browser = loaded
        else:
            m |= loaded
    with console(cluster) as (port, pid):
        rates = http_put.interleaved(cluster, pid, port, args.count, args.rounds)
    m |= {f"put_{k}": v for k, v in rates.items()}
    m |= leader_cpu(cluster, args.seconds, args.cpu_rounds, args.rate)
    return m, browser


def verdict(ok: bool, target: str) -> str:
    return f"{'ok' if ok else 'MISSED'}: target {target}"


def table(m: dict[str, float], args: argparse.Namespace, browser: str) -> list[Row]:
    rows: list[Row] = []
    load = f"(2) load {args.messages:,} x 100 B, put_batch {BATCH} x {INFLIGHT_BATCHES}"
    rows.append((load, f"{m['load_s']:.1f} s", f"{m['load_msgs_per_s']:.0f} msgs/s"))
    for kind, matches in (("hit", MATCHES), ("miss", 0)):
        med, top = m[f"search_{kind}_median_ms"], m[f"search_{kind}_max_ms"]
        label = f"(2) search by key, {matches} matches, median / max"
        value = f"{med:.1f} / {top:.1f} ms"
        rows.append((label, value, verdict(top < SEARCH_MS, f"< {SEARCH_MS:.0f} ms")))
    populate = f"(1) populate {args.topics} topics x {QUEUES} queues, {args.groups} groups"
    rows.append((populate, f"{m['populate_s']:.1f} s", ""))
    for key, label in (
        ("page_events_first_cold_ms", "(1) first snapshot of /events, console just started"),
        ("page_events_first_warm_ms", "(1) first snapshot of /events, warm, median"),
        ("page_get_cluster_ms", "(1) GET /cluster, median"),
        ("page_get_topics_ms", "(1) GET /topics, median"),
        ("page_get_groups_ms", "(1) GET /groups (the groups page), median"),
        ("page_browser_first_ms", "(1) chromium: to the cluster view drawn, first"),
        ("page_browser_drawn_median_ms", "(1) chromium: to the cluster view drawn, median"),
    ):
        if key in m:
            rows.append(
                (label, f"{m[key]:.0f} ms", verdict(m[key] < PAGE_MS, f"< {PAGE_MS:.0f} ms"))
            )
    if browser:
        rows.append(("(1) chromium", browser, ""))
    else:
        for name, label in (
            ("dom", "document loaded"),
            ("snapshot", "first snapshot arrived"),
            ("handled", "the page handled it"),
        ):
            mark = m[f"page_browser_{name}_median_ms"]
            rows.append((f"(1) chromium: {label}, median", f"{mark:.0f} ms", "in the page"))
    rates = {k.removeprefix("put_"): v for k, v in m.items() if k.startswith("put_")}
    rows += [(f"(3) {label}", value, note) for label, value, note in http_put.rows(rates)]
    steady = f"steady {m['steady_put_msgs_per_s']:.0f} puts/s"
    for name, label in (
        ("none", "no console"),
        ("streams1", "console, 1 event stream"),
        ("streams3", "console, 3 event streams"),
    ):
        rows.append((f"(4) leader CPU, {label}", f"{m[f'leader_cpu_{name}_pct']:.1f} %", steady))
    for name, streams in (("streams1", 1), ("streams3", 3)):
        added = m[f"leader_cpu_{name}_added_points"]
        note = verdict(added <= CPU_POINTS, f"<= {CPU_POINTS:.0f} points")
        note += f"; the console's CPU {m[f'console_cpu_{name}_pct']:.0f} %"
        rows.append((f"(4) leader CPU added, {streams} stream(s)", f"{added:+.1f} points", note))
    per = m["leader_cpu_ms_per_snapshot"]
    note = f"a stream: {per / 10:.2f} points (a snapshot a second)"
    rows.append(("(4) leader CPU per snapshot, nothing else running", f"{per:.1f} ms", note))
    events = f"{m['events_min_per_s']:.1f} / s"
    rows.append(("(4) snapshots read by the slowest stream", events, "one a second is live"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to search")
    parser.add_argument("--searches", type=int, default=20, help="keys searched")
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--count", type=int, default=2000, help="puts per HTTP/gRPC run")
    parser.add_argument("--rounds", type=int, default=2, help="A B A B rounds of HTTP/gRPC")
    parser.add_argument("--seconds", type=float, default=8.0, help="each CPU window")
    parser.add_argument("--cpu-rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0, help="steady puts/s for the CPU")
    parser.add_argument("--no-browser", action="store_true", help="skip the chromium load")
    args = parser.parse_args()
    began = time.perf_counter()
    start = loadavg()
    with (
        tempfile.TemporaryDirectory(prefix="console-bench-") as tmp,
        LocalCluster(Path(tmp) / "c", extra_config=CONFIG) as cluster,
    ):
        cluster.up()
        try:
            m, browser = measure(cluster, args)
        except BaseException:
            for node in cluster.specs:
                print(f"-- node {node}'s log:\n{cluster.log_tail(node, 30)}", file=sys.stderr)
            raise
    m |= {"messages": args.messages, "topics": args.topics, "groups": args.groups}
    m["bench_s"] = time.perf_counter() - began
    rows = [("loadavg at start", start, ""), *table(m, args, browser)]
    rows.append(("loadavg at end", loadavg(), f"the bench took {m['bench_s']:.0f} s"))
    report("console", rows, m)


if __name__ == "__main__":
    main()
