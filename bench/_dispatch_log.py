"""bench/dispatch.py's log: built offline as a leader would, then dispatched offline.

`append_until` appends the bench's message mix (`Messages`: 1 KiB bodies, 8 topics
x 4 queues, 2 keys each plus the UNIQ_KEY) as Raft entries in batches of BATCH,
with queue fields stamped as the leader stamps them (`Leader`) and async flush;
`seal` leaves what a node leaves behind. The dispatch measurements (`dispatch_all`,
`dispatch_in_batches`, `read_log`, `profile_dispatch`) run the real Dispatcher over
a committed view of that log (`verify.open_dispatcher`).
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import os
import pstats
import shutil
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dledger_commitlog.log.committed_view import CommittedView
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.message_layout import stamp, store_host_bytes
from dledger_commitlog.log.verify import committed_view, open_dispatcher
from raft.types import Entry, HardState
from raftio.hard_state import RaftStateFile
from store.flush import PeriodicFlush
from store.message import StoredMessage, encode_message, make_properties

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
_BORN_TS_POS = 40  # bornTimestamp, which the template encoding patches
_I64 = struct.Struct(">q")


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
        msg = StoredMessage(
            topic=topic,
            body=BODY,
            properties=props,
            born_timestamp_ms=born_ms,
            born_host=BORN_HOST,
            store_host=STORE_HOST,
        )
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
        self.host = store_host_bytes(STORE_HOST)

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
            datas.append(stamp(encoded, qid, qoff, now_ms, host))
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
    d = open_dispatcher(data_dir, store, store.last_index(), LAYOUT)
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
    d = open_dispatcher(scratch, store, 0, LAYOUT)
    view = d.log
    assert isinstance(view, CommittedView)
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


def rate_beyond(total_rate: float, part_rate: float) -> float:
    """The rate of what remains of a job done at `total_rate` without a part of it that
    alone runs at `part_rate` (0 when the part takes all the time: noise)."""
    rest = 1 / total_rate - 1 / part_rate
    return 1 / rest if rest > 0 else 0.0


def profile_dispatch(store: EntryStore, scratch: Path, entries: int) -> tuple[str, float]:
    """cProfile a dispatch of the first `entries` entries into `scratch`: top 15 both ways."""
    d = open_dispatcher(scratch, store, min(entries, store.last_index()), LAYOUT)
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
