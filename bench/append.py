"""Entry-store append throughput against a raw write+fsync baseline (issue 2 targets).

(a) batched appends, async flush;  (b) sync group commit with 1, 16 and 64
concurrent writers;  (c) raw baselines writing and fsyncing the same bytes with
plain file writes, in the same run. Run: `.venv/bin/python bench/append.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import report
from dledger_commitlog.log.entry_store import EntryStore
from raft.types import Entry
from store.flush import GroupCommit, PeriodicFlush

ENTRY_BYTES = 1024
BODY = bytes(range(256)) * (ENTRY_BYTES // 256)
SEGMENT = 256 << 20


def entries_per_s_async(root: Path, total: int, batch: int) -> tuple[float, float]:
    store = EntryStore(root / "a", data_segment_bytes=SEGMENT)
    bodies = [BODY] * batch

    async def run() -> float:
        pf = PeriodicFlush(store, interval_ms=200, min_bytes=16 << 20)
        pf.start()
        started = time.perf_counter()
        index = 1
        while index <= total:
            store.append_entries([Entry(index + k, 1, b) for k, b in enumerate(bodies)])
            index += batch
            pf.poke()
            await asyncio.sleep(0)
        await pf.close()  # the last flush counts
        return time.perf_counter() - started

    elapsed = asyncio.run(run())
    written, count = store.end_pos, store.last_index()
    store.close()
    return count / elapsed, written / elapsed / 1e6


def raw_async(root: Path, total_bytes: int, chunk: int) -> float:
    """Plain pwrite of the same bytes in the same chunk size, fsync every 16 MiB."""
    path = root / "raw-a"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    os.posix_fallocate(fd, 0, total_bytes)
    buf = os.urandom(chunk)
    started = time.perf_counter()
    pos = unsynced = 0
    while pos < total_bytes:
        os.pwrite(fd, buf, pos)
        pos += chunk
        unsynced += chunk
        if unsynced >= 16 << 20:
            os.fdatasync(fd)
            unsynced = 0
    os.fdatasync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    path.unlink()
    return total_bytes / elapsed / 1e6


def group_commit(
    root: Path, writers: int, seconds: float, buffer: int
) -> tuple[float, float, float]:
    """(entries/s, fsyncs/s, entries per fsync) with `writers` tasks each awaiting its fsync."""
    store = EntryStore(
        root / f"g{writers}-{buffer}", data_segment_bytes=SEGMENT, write_buffer_bytes=buffer
    )

    async def run() -> tuple[int, float, int]:
        gc = GroupCommit(store)
        count = 0
        deadline = time.perf_counter() + seconds

        async def writer() -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                index = store.last_index() + 1
                (pos,) = store.append_entries([Entry(index, 1, BODY)])
                await gc.sync(pos + 48 + len(BODY))
                count += 1

        started = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        elapsed = time.perf_counter() - started
        fsyncs = gc.fsync_count
        await gc.close()
        return count, elapsed, fsyncs

    count, elapsed, fsyncs = asyncio.run(run())
    store.close()
    return count / elapsed, fsyncs / elapsed, count / max(1, fsyncs)


def raw_sync(root: Path, per_fsync: float, seconds: float) -> float:
    """Plain writes of `per_fsync` entries' bytes then fdatasync, repeated: entries/s."""
    path = root / "raw-s"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    os.posix_fallocate(fd, 0, 512 << 20)
    n = max(1, round(per_fsync))
    buf = os.urandom((ENTRY_BYTES + 48) * n)
    pos = count = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        os.pwrite(fd, buf, pos % (500 << 20))
        os.fdatasync(fd)
        pos += len(buf)
        count += n
    elapsed = time.perf_counter() - started
    os.close(fd)
    path.unlink()
    return count / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    rows: list[tuple[str, str, str]] = []
    metrics: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        eps, mbps = entries_per_s_async(root, args.entries, args.batch)
        raw = raw_async(root, args.entries * (ENTRY_BYTES + 48), args.batch * (ENTRY_BYTES + 48))
        metrics |= {
            "async_entries_per_s": eps,
            "async_mb_per_s": mbps,
            "raw_write_mb_per_s": raw,
            "async_ratio_to_raw": mbps / raw,
        }
        rows += [
            (f"(a) async, batches of {args.batch}", f"{eps:,.0f} entries/s", f"{mbps:,.1f} MB/s"),
            ("(c) raw write+fsync", f"{raw:,.1f} MB/s", "same bytes, same chunk size"),
            (
                "(a)/(c) bandwidth ratio",
                f"{mbps / raw:.2f}",
                "target >= 0.50; entries/s >= 150,000",
            ),
        ]
        for writers in (1, 16, 64):
            # Sync flush buffers appends in memory (nothing is acknowledged unflushed).
            eps, fps, per = group_commit(root, writers, args.seconds, 4 << 20)
            raw_eps = raw_sync(root, per, args.seconds)
            metrics |= {
                f"sync_{writers}w_entries_per_s": eps,
                f"sync_{writers}w_fsyncs_per_s": fps,
                f"sync_{writers}w_entries_per_fsync": per,
                f"sync_{writers}w_raw_entries_per_s": raw_eps,
                f"sync_{writers}w_ratio_to_raw": eps / raw_eps,
            }
            rows += [
                (
                    f"(b) sync, {writers} writers",
                    f"{eps:,.0f} entries/s",
                    f"{fps:,.0f} fsync/s, {per:.1f} entries/fsync, {eps * 1.072e-3:,.1f} MB/s",
                ),
                (
                    f"(c) raw at {per:.1f} entries/fsync",
                    f"{raw_eps:,.0f} entries/s",
                    f"ratio {eps / raw_eps:.2f}" + ("  (target >= 0.70)" if writers == 64 else ""),
                ),
            ]
        eps, fps, per = group_commit(root, 64, args.seconds, 0)
        raw_eps = raw_sync(root, per, args.seconds)
        metrics |= {
            "sync_64w_write_through_entries_per_s": eps,
            "sync_64w_write_through_ratio_to_raw": eps / raw_eps,
        }
        note = f"{per:.1f} entries/fsync, ratio {eps / raw_eps:.2f} (a pwrite per append)"
        rows.append(("(b') 64 writers, write-through", f"{eps:,.0f} entries/s", note))
    report("append", rows, metrics)


if __name__ == "__main__":
    main()
