"""Dispatch throughput, crash recovery and full rebuild speed (issue 5 targets).

One run, on one store that grows:
(1) build a 1 GiB log offline: 1 KiB messages, 8 topics x 4 queues, 2 keys each
    (plus the UNIQ_KEY), appended as Raft entries in batches of 64 with async
    flush (as bench/append.py's case (a)), queue fields set as the leader sets
    them; then dispatch it (consume queues and index, default file sizes) and
    compare the rates; dispatch again with the commit index moving 64 entries at
    a time (a leader dispatching each commit as it comes, not catching up) and
    time the commit-log read alone (what dispatch costs beyond it is its own); a cProfile
    of a dispatch run shows where the time goes;
(2) start a real single-node cluster on that store, put load through the gRPC
    client, kill -9 the node mid-load and time its restart (process start to
    answering Status as leader with every acknowledged put committed);
(3) delete consumequeue/ and index/ and time dledger_commitlog.verify.rebuild;
then extend the log to 4 GiB offline and repeat (2).
Segments are the default 1 GiB. Run: `.venv/bin/python bench/dispatch.py`
(`--small-gib 0.05 --large-gib 0.1` for a quick try). The whole run takes about
7 minutes; `--dispatch-only` runs step (1) alone (a minute or two for 0.25 GiB)
and updates only the keys that step measures in bench/results/dispatch.json,
keeping the others from the last full run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import RESULTS, report
from dispatch.dispatcher import Dispatcher
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, ClientError, MessageSpec, NodeStatus
from dledger_commitlog.log.commitlog import DLedgerCommitLog
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.verify import committed_view, read_layout, rebuild
from raft.hard_state import RaftStateFile
from raft.types import Entry, HardState
from store.flush import PeriodicFlush
from store.message import (
    QUEUE_OFFSET_POS,
    STORE_TIMESTAMP_POS,
    Message,
    encode_message,
    make_properties,
)

GIB = 1 << 30
BODY = bytes(range(256)) * 4  # 1 KiB
TOPICS = tuple(f"dispatch{t}" for t in range(8))
QUEUES = 4
TAGS = ("TagA", "TagB")
BATCH = 64
STORE_HOST = ("127.0.0.1", 7001)
BORN_HOST = ("10.0.0.7", 40123)
# The node's defaults, spelled out: 1 GiB data segments, 300,000 units per queue
# file, index files of 5,000,000 slots and 20,000,000 entries (sparse).
LAYOUT = {
    "data_segment_bytes": 1 << 30,
    "index_segment_bytes": 32 << 20,
    "cq_units_per_file": 300_000,
    "index_slots": 5_000_000,
    "index_entries": 20_000_000,
}
# Field positions the leader patches (dledger_commitlog.commitlog._flush_queued).
_QUEUE_ID_POS = 12
_BORN_TS_POS = 40
_STORE_HOST_POS = 64
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_RECOVERED = re.compile(
    r"recovered in ([0-9.]+)s after a (crash|clean shutdown): dispatch resumed at (\d+), "
    r"re-dispatched (\d+) messages"
)


def _keys(seq: int) -> tuple[str, str]:
    return f"order-{seq:012d}", f"user-{seq * 7919 % 1_000_000:07d}"


class Messages:
    """The bench's message mix in log order, encoded as the request path does (`prepare`).

    `fast` patches the sequence-dependent bytes of a per-(topic, tag) template
    instead of calling encode_message; the first messages are checked against it.
    """

    def __init__(self, first_seq: int, fast: bool) -> None:
        self.seq = first_seq
        self.fast = fast
        self.prefix = os.urandom(8).hex().upper()
        self._templates: dict[tuple[int, int], tuple[bytes, int, int, int]] = {}
        self._checked = 0

    def _uniq(self, seq: int) -> str:
        return f"{self.prefix}{seq:016X}"

    def encode(self, seq: int, born_ms: int) -> tuple[str, bytes]:
        topic, tags = TOPICS[seq % len(TOPICS)], TAGS[seq // len(TOPICS) % len(TAGS)]
        props = make_properties(keys=_keys(seq), tags=tags, uniq_key=self._uniq(seq))
        msg = Message(topic=topic, body=BODY, properties=props, born_timestamp_ms=born_ms,
                      born_host=BORN_HOST, store_host=STORE_HOST)  # fmt: skip
        return topic, encode_message(msg)

    def _template(self, t: int, g: int) -> tuple[bytes, int, int, int]:
        tpl = self._templates.get((t, g))
        if tpl is None:
            seq0 = t + g * len(TOPICS)  # a seq with this topic and tag, keys all zeros below
            _, raw = self.encode(seq0, 0)
            order, user = (k.encode() for k in _keys(seq0))
            a, b = raw.index(order) + 6, raw.index(user) + 5
            c = raw.index(self._uniq(seq0).encode()) + 16
            tpl = (raw, a, b, c)
            self._templates[(t, g)] = tpl
        return tpl

    def batch(self, n: int) -> list[tuple[str, bytes]]:
        born_ms = int(time.time() * 1000)
        out: list[tuple[str, bytes]] = []
        seq = self.seq
        if not self.fast:
            out = [self.encode(s, born_ms) for s in range(seq, seq + n)]
        else:
            nt = len(TOPICS)
            for s in range(seq, seq + n):
                raw, a, b, c = self._template(s % nt, s // nt % len(TAGS))
                buf = bytearray(raw)
                buf[a : a + 12] = b"%012d" % s
                buf[b : b + 7] = b"%07d" % (s * 7919 % 1_000_000)
                buf[c : c + 16] = b"%016X" % s
                _I64.pack_into(buf, _BORN_TS_POS, born_ms)
                out.append((TOPICS[s % nt], bytes(buf)))
            if self._checked < 256:
                for k, (topic, data) in enumerate(out):
                    if (topic, data) != self.encode(seq + k, born_ms):
                        raise AssertionError(f"template encoding of message {seq + k} differs")
                self._checked += n
        self.seq = seq + n
        return out


class Leader:
    """Queue assignment as `DLedgerCommitLog._flush_queued` does it, then the append."""

    def __init__(self, queue_next: dict[tuple[str, int], int]) -> None:
        self.queue_next = dict(queue_next)
        self.round_robin: dict[str, int] = {}
        self.host = socket.inet_aton(STORE_HOST[0]) + _I32.pack(STORE_HOST[1])

    def assign(self, batch: list[tuple[str, bytes]]) -> list[bytes]:
        now_ms = int(time.time() * 1000)
        datas: list[bytes] = []
        rr, nxt, host = self.round_robin, self.queue_next, self.host
        for topic, encoded in batch:
            qid = rr.get(topic, 0)
            rr[topic] = (qid + 1) % QUEUES
            key = (topic, qid)
            qoff = nxt.get(key, 0)
            nxt[key] = qoff + 1
            buf = bytearray(encoded)
            _I32.pack_into(buf, _QUEUE_ID_POS, qid)
            _I64.pack_into(buf, QUEUE_OFFSET_POS, qoff)
            _I64.pack_into(buf, STORE_TIMESTAMP_POS, now_ms)
            buf[_STORE_HOST_POS : _STORE_HOST_POS + 8] = host
            datas.append(bytes(buf))
        return datas


@dataclass(slots=True)
class BuildStats:
    entries: int = 0
    bytes: int = 0
    encode_s: float = 0.0
    encode_cpu_s: float = 0.0
    append_s: float = 0.0
    append_cpu_s: float = 0.0
    wall_s: float = 0.0


def append_until(
    store: EntryStore, msgs: Messages, leader: Leader, end_pos: int, term: int
) -> BuildStats:
    """Append batches of BATCH until the log reaches `end_pos`; async flush (PeriodicFlush).

    Encoding (the request path) is timed apart from assignment + append (the leader's).
    """
    st = BuildStats()
    start_pos = store.end_pos

    async def run() -> None:
        pf = PeriodicFlush(store, interval_ms=200, min_bytes=16 << 20)
        pf.start()
        index = store.last_index() + 1
        wall0 = time.perf_counter()
        clock, cpu = time.perf_counter, time.process_time
        while store.end_pos < end_pos:
            t0, c0 = clock(), cpu()
            batch = msgs.batch(BATCH)
            t1, c1 = clock(), cpu()
            datas = leader.assign(batch)
            store.append_entries([Entry(index + k, term, d) for k, d in enumerate(datas)])
            pf.poke()
            t2, c2 = clock(), cpu()
            st.encode_s += t1 - t0
            st.encode_cpu_s += c1 - c0
            st.append_s += t2 - t1
            st.append_cpu_s += c2 - c1
            index += len(datas)
            st.entries += len(datas)
            await asyncio.sleep(0)
        t0, c0 = clock(), cpu()
        await pf.close()  # the last flush counts
        st.append_s += clock() - t0
        st.append_cpu_s += cpu() - c0
        st.wall_s = clock() - wall0

    asyncio.run(run())
    st.bytes = store.end_pos - start_pos
    return st


def open_store(data_dir: Path) -> EntryStore:
    """The node's entry store in its data directory, with the node's segment sizes."""
    return EntryStore(
        data_dir / "commitlog",
        data_segment_bytes=LAYOUT["data_segment_bytes"],
        index_segment_bytes=LAYOUT["index_segment_bytes"],
    )


def _dispatcher(root: Path, store: EntryStore, upto_index: int) -> Dispatcher:
    view = committed_view(store, upto_index)
    d = Dispatcher(
        root,
        view,
        units_per_file=LAYOUT["cq_units_per_file"],
        index_slots=LAYOUT["index_slots"],
        index_entries=LAYOUT["index_entries"],
    )
    d.recover(view.committed_pos)
    return d


@dataclass(slots=True)
class DispatchStats:
    messages: int
    bytes: int
    wall_s: float
    cpu_s: float
    persist_s: float
    recover_s: float


def dispatch_all(
    data_dir: Path, store: EntryStore
) -> tuple[DispatchStats, dict[tuple[str, int], int]]:
    """Dispatch the whole committed log into `data_dir` (timed catch_up), persist, close."""
    t0 = time.perf_counter()
    d = _dispatcher(data_dir, store, store.last_index())
    recover_s = time.perf_counter() - t0
    start = d.dispatched_pos
    t0, c0 = time.perf_counter(), time.process_time()
    n = d.catch_up()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    d.persist(d.snapshot())
    persist_s = time.perf_counter() - t0
    queue_next = d.max_offsets()
    stats = DispatchStats(n, d.dispatched_pos - start, wall, cpu, persist_s, recover_s)
    d.close(clean=True)
    return stats, queue_next


def dispatch_in_batches(
    store: EntryStore, scratch: Path, entries: int, batch: int
) -> tuple[int, float]:
    """Dispatch the first `entries` entries as a leader does, commit by commit: the
    committed index moves `batch` entries at a time and each step is dispatched.
    Returns messages and the CPU seconds of the dispatch calls."""
    upto = min(entries, store.last_index())
    d = _dispatcher(scratch, store, 0)
    view = d.log
    assert isinstance(view, DLedgerCommitLog)
    n, cpu = 0, 0.0
    for index in range(batch, upto + batch, batch):
        view.start_at(min(index, upto))  # the commit index moves on
        c0 = time.process_time()
        while got := d.dispatch_batch():
            n += got
        cpu += time.process_time() - c0
    d.close(clean=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return n, cpu


def read_log(store: EntryStore) -> tuple[int, float]:
    """Read the committed log as dispatch does (read_committed), doing nothing with it:
    messages and CPU seconds."""
    view = committed_view(store, store.last_index())
    pos, n = view.min_pos, 0
    c0 = time.process_time()
    while pos < view.committed_pos:
        msgs, pos, _ = view.read_committed(pos, 4 << 20)
        n += len(msgs)
    return n, time.process_time() - c0


def _rate_beyond(total_rate: float, part_rate: float) -> float:
    """The rate of what remains of a job done at `total_rate` without a part of it that
    alone runs at `part_rate` (0 when the part takes all the time: noise)."""
    rest = 1 / total_rate - 1 / part_rate
    return 1 / rest if rest > 0 else 0.0


def profile_dispatch(store: EntryStore, scratch: Path, entries: int) -> tuple[str, float]:
    """cProfile a dispatch of the first `entries` entries into `scratch`: top 15 both ways."""
    d = _dispatcher(scratch, store, min(entries, store.last_index()))
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    n = d.catch_up()
    prof.disable()
    rate = n / (time.perf_counter() - t0)
    d.close(clean=True)
    shutil.rmtree(scratch, ignore_errors=True)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    out.write(f"dispatch of {n:,} messages under cProfile ({rate:,.0f}/s with its overhead)\n")
    stats.sort_stats("cumulative").print_stats(15)
    stats.sort_stats("tottime").print_stats(15)
    return out.getvalue(), rate


def seal(store: EntryStore, data_dir: Path, term: int) -> None:
    """What a node leaves behind: entries checkpoint and the raft state's commit index."""
    last = store.last_index()
    store.write_checkpoint(last)
    state = RaftStateFile(data_dir / "raft.state")
    if state.saved.term == 0:
        state.save(HardState(term, None, last))
    else:
        state.save_commit(last)


# ---------------------------------------------------------------- the node


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


# ---------------------------------------------------------------- the run


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
                "log_read_cpu_entries_per_s": read_n / read_cpu,
                "dispatch_beyond_read_cpu_entries_per_s": _rate_beyond(disp_cpu, read_n / read_cpu),
                "profiled_dispatch_entries_per_s": profiled_rate,
            }
            rows += [
                (f"log of {small}", f"{b.entries:,} entries", f"{b.bytes / 1e6:,.0f} MB, "
                 f"{len(TOPICS)} topics x {QUEUES} queues, 2 keys + UNIQ_KEY, 1 GiB segments"),
                ("encode (request path)", f"{m['encode_entries_per_s']:,.0f} entries/s",
                 "encode_message + make_properties, not in the append figure"),
                ("append, async flush", f"{append_eps:,.0f} entries/s",
                 f"{m['append_mb_per_s']:,.1f} MB/s; CPU-time rate {append_cpu:,.0f}/s "
                 f"(leader's queue patch + append_entries, batches of {BATCH})"),
                ("dispatch (catch_up)", f"{disp_eps:,.0f} entries/s",
                 f"{m['dispatch_mb_per_s']:,.1f} MB/s; CPU-time rate {disp_cpu:,.0f}/s; "
                 f"persist {dsp.persist_s:.2f} s"),
                ("dispatch / append", f"{disp_eps / append_eps:.2f}",
                 f"CPU-time ratio {disp_cpu / append_cpu:.2f} (target >= 2)"),
                ("dispatch, batches of 64", f"{small_n / small_cpu:,.0f} entries/s",
                 f"CPU-time rate over {small_n:,} entries, the commit index moving 64 at a time"),
                ("commit-log read alone", f"{read_n / read_cpu:,.0f} entries/s",
                 f"CPU-time rate of read_committed; dispatch beyond it "
                 f"{m['dispatch_beyond_read_cpu_entries_per_s']:,.0f}/s"),
            ]  # fmt: skip
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
            d = _dispatcher(data, store, store.last_index())
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
                (f"kill -9 recovery, {label}", f"{r.leader_s:.2f} s",
                 f"spawn -> leader, all {p.load.acked:,} acked puts committed (target < 5 s); "
                 f"port open {r.port_s:.2f} s, dispatched {r.dispatched_s:.2f} s"),
                ("    node's own figure", f"{p.node_s:.2f} s",
                 f"'recovered in ... after a {p.node_kind}', re-dispatched {p.redispatched:,}"),
                ("    first start (clean)", f"{p.first_start_s:.2f} s",
                 f"node's figure {p.first_start_node_s:.2f} s; load before the kill "
                 f"{p.load.acked / p.load.seconds:,.0f} msgs/s"),
            ]  # fmt: skip
        rows += [
            (f"full rebuild, {small}", f"{m['rebuild_mb_per_s']:,.1f} MB/s",
             f"{rebuild_s:.1f} s, {m['rebuild_entries_per_s']:,.0f} entries/s (verify.rebuild)"),
            (f"extension to {large}", f"{m['ext_dispatch_entries_per_s']:,.0f} dispatch/s",
             f"append {m['ext_append_entries_per_s']:,.0f}/s over "
             f"{e.entries:,} more entries (template encoding)"),
        ]  # fmt: skip
    m["loadavg_1m_end"] = os.getloadavg()[0]
    m["total_s"] = time.perf_counter() - began
    rows.append(("whole bench", f"{m['total_s']:.0f} s",
                 f"load average {m['loadavg_1m_start']:.1f} -> {m['loadavg_1m_end']:.1f} "
                 f"on {os.cpu_count()} cpus (shared machine)"))  # fmt: skip
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
