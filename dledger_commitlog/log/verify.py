"""Offline checks of a stopped node's store (`dledger verify`), and rebuilds from its log.

`verify_store` reads the whole commit log: every entry's body CRC and chainCrc
link, the entry index against the data, then rebuilds consume queues, the key
index and group offsets from the log into a scratch directory (the same code
that dispatches live) and compares them with the store's, up to the dispatched
position the store's checkpoint records. It reports every mismatch and never
writes to the store, except that opening the log cuts a torn tail (as a
restart would).

`open_dispatcher` is the one way to build consume queues and the index from an
entry log outside a running node: a `CommittedView` of the log, committed up to
an index, and a `Dispatcher` over it, recovered against that view (verify's
rebuild, bench/dispatch.py).

The store's layout parameters (segment sizes, units per queue file, index
sizes) come from `layout.json`, which every node writes at start.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dispatch.dispatcher import Dispatcher
from dledger_commitlog.log.committed_view import CommittedView
from dledger_commitlog.log.entry_store import EntryStore
from raftio.hard_state import RaftStateFile
from store.checkpoint import read_checkpoint
from store.consume_queue import ConsumeQueue, discover_queues
from store.entry_format import chain_crc
from store.errors import CorruptEntry
from store.fileio import same_contents, write_atomically

LAYOUT_FILE = "layout.json"
Progress = Callable[[int, int, str], None]


def write_layout(data_dir: Path, layout: dict[str, int]) -> None:
    write_atomically(data_dir / LAYOUT_FILE, json.dumps(layout, sort_keys=True).encode())


def read_layout(data_dir: Path) -> dict[str, int]:
    try:
        doc = json.loads((data_dir / LAYOUT_FILE).read_bytes())
    except FileNotFoundError:
        raise ValueError(
            f"{data_dir} holds no {LAYOUT_FILE}: not a node's data directory"
        ) from None
    return {k: int(v) for k, v in doc.items()}


@dataclass(slots=True)
class VerifyReport:
    data_dir: str
    first_index: int = 0
    last_index: int = 0
    entries_checked: int = 0
    log_bytes: int = 0
    dispatched_pos: int = 0
    queues_checked: int = 0
    index_files_checked: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {
            "data_dir": self.data_dir,
            "ok": self.ok,
            "first_index": self.first_index,
            "last_index": self.last_index,
            "entries_checked": self.entries_checked,
            "log_bytes": self.log_bytes,
            "dispatched_pos": self.dispatched_pos,
            "queues_checked": self.queues_checked,
            "index_files_checked": self.index_files_checked,
            "seconds": round(self.seconds, 3),
            "problems": self.problems,
        }


def open_log(data_dir: Path, layout: dict[str, int]) -> tuple[EntryStore, CommittedView]:
    """The node's entry log and a read-only commit-log view committed up to its raft state."""
    commit = RaftStateFile(data_dir / "raft.state").saved.commit
    store = EntryStore(
        data_dir / "commitlog",
        data_segment_bytes=layout["data_segment_bytes"],
        index_segment_bytes=layout["index_segment_bytes"],
        preallocate=False,
    )
    return store, committed_view(store, min(commit, store.last_index()))


def committed_view(store: EntryStore, committed_index: int) -> CommittedView:
    """A commit-log view of `store` that takes no puts, committed up to an index."""
    view = CommittedView(store)
    view.start_at(committed_index)
    return view


def open_dispatcher(
    root: Path, store: EntryStore, committed_index: int, layout: dict[str, int]
) -> Dispatcher:
    """A dispatcher of `store` committed up to `committed_index`, its files under `root`
    (sized by `layout`), recovered against that view: ready to `catch_up`."""
    view = committed_view(store, committed_index)
    d = Dispatcher(
        root,
        view,
        units_per_file=layout["cq_units_per_file"],
        index_slots=layout["index_slots"],
        index_entries=layout["index_entries"],
    )
    d.recover(view.committed_pos)
    return d


def rebuild(
    data_dir: Path, into: Path, layout: dict[str, int], upto_pos: int | None = None
) -> Dispatcher:
    """Consume queues, index and group offsets rebuilt from the log into `into`."""
    store, cl = open_log(data_dir, layout)
    upto = cl.committed_index
    if upto_pos is not None and upto_pos < cl.committed_pos:
        upto = store.get_by_pos(store.next_entry_pos(upto_pos)).index - 1
    d = open_dispatcher(into, store, upto, layout)
    d.catch_up()
    d.persist(d.snapshot())
    store.close()
    return d


def verify_store(data_dir: str | Path, progress: Progress | None = None) -> VerifyReport:
    started = time.perf_counter()
    root = Path(data_dir)
    report = VerifyReport(str(root))
    layout = read_layout(root)
    _verify_log(root, layout, report, progress)
    if report.ok:
        _verify_dispatch(root, layout, report)
    report.seconds = time.perf_counter() - started
    return report


def _verify_log(
    root: Path, layout: dict[str, int], report: VerifyReport, progress: Progress | None
) -> None:
    try:
        store, _ = open_log(root, layout)
    except (CorruptEntry, ValueError) as exc:
        report.problems.append(f"commit log does not open: {exc}")
        return
    try:
        first, last = store.first_index(), store.last_index()
        report.first_index, report.last_index = first, last
        total = max(1, last - first + 1)
        index = first
        base = store.base
        prev_chain: int | None = base[3] if base is not None else (0 if first == 1 else None)
        while index <= last:
            batch = store.stored_entries(index, last + 1, 8 << 20)
            for e in batch:
                if prev_chain is not None:
                    want = chain_crc(
                        prev_chain, e.size, e.index, e.term, e.pos, e.channel, e.body_crc
                    )
                    if want != e.chain_crc:
                        report.problems.append(f"entry {e.index} at {e.pos}: chainCrc mismatch")
                prev_chain = e.chain_crc
                report.log_bytes += e.size
            report.entries_checked += len(batch)
            index = batch[-1].index + 1
            if progress is not None:
                progress(index - first, total, "entries")
    except CorruptEntry as exc:
        report.problems.append(f"commit log: {exc}")
    finally:
        store.close()


def _verify_dispatch(root: Path, layout: dict[str, int], report: VerifyReport) -> None:
    cp = read_checkpoint(root / "checkpoint")
    dispatched = cp.dispatched_position if cp is not None else 0
    report.dispatched_pos = dispatched
    with tempfile.TemporaryDirectory(prefix="dledger-verify-") as tmp:
        rebuilt = rebuild(root, Path(tmp), layout, upto_pos=dispatched)
        if rebuilt.dispatched_pos != dispatched:
            report.problems.append(
                f"checkpoint says dispatched to {dispatched}, the log only reaches "
                f"{rebuilt.dispatched_pos}"
            )
        live_queues = set(discover_queues(root))
        want_queues = set(rebuilt.queues)
        for missing in sorted(want_queues - live_queues):
            report.problems.append(f"consume queue {missing[0]}/{missing[1]} is missing")
        for extra in sorted(live_queues - want_queues):
            report.problems.append(
                f"consume queue {extra[0]}/{extra[1]} has no messages in the log"
            )
        for key in sorted(want_queues & live_queues):
            report.problems.extend(_compare_queue(root, rebuilt, key, layout))
            report.queues_checked += 1
        live_index = sorted(p.name for p in (root / "index").glob("*"))
        want_index = sorted(p.name for p in (Path(tmp) / "index").glob("*"))
        if live_index != want_index:
            report.problems.append(f"index files {live_index} differ from a rebuild's {want_index}")
        else:
            for name in want_index:
                report.index_files_checked += 1
                if not same_contents(root / "index" / name, Path(tmp) / "index" / name):
                    report.problems.append(f"index file {name} differs from a rebuild")
        for cq in rebuilt.queues.values():
            cq.close()
        rebuilt.index.close()


def _compare_queue(
    root: Path, rebuilt: Dispatcher, key: tuple[str, int], layout: dict[str, int]
) -> list[str]:
    want = rebuilt.queues[key]
    with tempfile.TemporaryDirectory(prefix="dledger-verify-cq-") as tmp:
        # Read the live queue from a copy: opening a queue recovers (may write) its files.
        src = root / "consumequeue" / key[0] / str(key[1])
        shutil.copytree(src, Path(tmp) / "consumequeue" / key[0] / str(key[1]))
        live = ConsumeQueue(
            tmp, key[0], key[1], units_per_file=layout["cq_units_per_file"], preallocate=False
        )
        try:
            name = f"{key[0]}/{key[1]}"
            if live.max_offset != want.max_offset:
                return [
                    f"queue {name}: max offset {live.max_offset}, a rebuild has {want.max_offset}"
                ]
            lo = max(live.min_offset, want.min_offset)
            step = 65536
            for q in range(lo, want.max_offset, step):
                n = min(step, want.max_offset - q)
                if live.get_range(q, n) != want.get_range(q, n):
                    return [f"queue {name}: units from {q} differ from a rebuild"]
            return []
        finally:
            live.close()


def progress_bar(stream: TextIO = sys.stderr, width: int = 30) -> Progress:
    """A text progress bar redrawn in place (at most ten times a second)."""
    last = [0.0]

    def show(done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1 and done < total:
            return
        last[0] = now
        filled = width * done // max(total, 1)
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what}")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show
