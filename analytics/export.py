"""`dledger export`: committed messages to Parquet, incrementally, for any engine to read natively.

Layout of the export directory DIR (Hive-style partitions, so `spark.read.parquet(DIR)`
yields `topic` and `date` columns from the paths):

    DIR/_manifest.json                               what has been exported
    DIR/topic=<topic>/date=<YYYY-MM-DD>/part-q<queue>-<first queue offset>.parquet

Each Parquet file holds the source schema (`analytics.codec.FIELDS`) minus
`topic`, rows of one queue in queue-offset order, split by the UTC date of
`store_timestamp`. The manifest records, per topic and queue, the next queue
offset to export, and the list of files that make up the export.

A run exports [manifest offset, committed end) of every selected queue (a queue
new to the manifest starts at its earliest retained offset). Crash safety: the
run writes its files under `DIR/_staging/` (ignored by Spark, as is every name
starting with `_`), moves them into place, then replaces the manifest atomically
(fsync, rename, fsync). A run that dies before the manifest leaves files the
manifest does not list; the next run deletes them before it starts, then
exports the same range again, so no message is ever exported twice or skipped.
Only one run at a time: `DIR/_export.lock` (flock).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analytics.codec import ARROW_TYPES, COLUMNS
from analytics.errors import SourceError
from analytics.offsets import Offsets, from_json, select, to_json
from analytics.sources import MessageStore
from store.fileio import fsync_dir, write_atomically

MANIFEST: Final = "_manifest.json"
STAGING: Final = "_staging"
LOCK: Final = "_export.lock"
FORMAT: Final = "dledger-export/1"
FILE_COLUMNS: Final = tuple(c for c in COLUMNS if c != "topic")
_DAY_US: Final = 86_400_000_000


@dataclass(slots=True)
class QueueExport:
    topic: str
    queue_id: int
    start: int
    end: int
    skipped: int = 0  # deleted by retention before they could be exported

    @property
    def messages(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class ExportResult:
    directory: Path
    queues: list[QueueExport] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    removed_orphans: list[str] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(q.messages for q in self.queues)


@dataclass(slots=True)
class Manifest:
    offsets: Offsets = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST
        if not path.exists():
            return cls()
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r} is not {FORMAT!r}")
            return cls(from_json(doc["offsets"]), list(doc["files"]), list(doc["runs"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"{path}: unreadable export manifest ({exc})") from None

    def save(self, directory: Path) -> None:
        doc = {
            "format": FORMAT,
            "offsets": to_json(self.offsets),
            "files": sorted(self.files),
            "runs": self.runs,
        }
        write_atomically(directory / MANIFEST, (json.dumps(doc, indent=1) + "\n").encode())


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    with (directory / LOCK).open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SourceError(f"{directory}: another export is running") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def export(
    store: MessageStore,
    directory: str | os.PathLike[str],
    topics: Sequence[str] | None = None,
    max_messages_per_queue: int | None = None,
) -> ExportResult:
    """Export what was committed since the last run (see the module doc)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        manifest = Manifest.load(root)
        result = ExportResult(root, removed_orphans=_remove_orphans(root, manifest))
        queues = select(store.queues(), tuple(topics) if topics else None)
        staging = root / STAGING
        staging.mkdir()
        staged: list[tuple[Path, str]] = []
        for q in queues:
            key = (q.topic, q.queue_id)
            start = manifest.offsets.get(key, q.min_offset)
            skipped = max(0, q.min_offset - start)
            start = max(start, q.min_offset)
            end = q.max_offset
            if max_messages_per_queue is not None:
                end = min(end, start + max_messages_per_queue)
            if start >= end and not skipped:
                continue
            result.queues.append(QueueExport(q.topic, q.queue_id, start, end, skipped))
            if start < end:
                staged += _write_queue(store, staging, q.topic, q.queue_id, start, end)
        for tmp, rel in staged:
            final = root / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            result.files.append(rel)
        for parent in {(root / rel).parent for _, rel in staged}:
            fsync_dir(parent)
        shutil.rmtree(staging)
        if result.queues:
            for qe in result.queues:
                manifest.offsets[(qe.topic, qe.queue_id)] = qe.end
            manifest.files += result.files
            manifest.runs.append(
                {
                    "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "messages": result.messages,
                    "files": len(result.files),
                    "skipped": sum(qe.skipped for qe in result.queues),
                }
            )
            manifest.save(root)
        return result


def _remove_orphans(root: Path, manifest: Manifest) -> list[str]:
    """Files of a run that died before its manifest: not part of the export."""
    listed = set(manifest.files)
    removed = []
    for path in sorted(root.glob("topic=*/date=*/*.parquet")):
        rel = path.relative_to(root).as_posix()
        if rel not in listed:
            path.unlink()
            removed.append(rel)
    shutil.rmtree(root / STAGING, ignore_errors=True)
    return removed


def _write_queue(
    store: MessageStore, staging: Path, topic: str, queue_id: int, start: int, end: int
) -> list[tuple[Path, str]]:
    """Write [start, end) of one queue, one file per UTC date; returns (staged path, final)."""
    writers: dict[int, tuple[pq.ParquetWriter, Path, str]] = {}
    schema = pa.schema([pa.field(c, ARROW_TYPES[c]) for c in FILE_COLUMNS])
    try:
        for batch in store.read(topic, queue_id, start, end, FILE_COLUMNS):
            micros = np.asarray(batch.column("store_timestamp").cast(pa.int64()), dtype=np.int64)
            days = micros // _DAY_US
            unique = np.unique(days)
            for day in unique.tolist():
                rows = batch if len(unique) == 1 else batch.filter(pa.array(days == day))
                if day not in writers:
                    first = rows.column("queue_offset")[0].as_py()
                    date = (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()
                    name = f"part-q{queue_id}-{first:020d}.parquet"
                    rel = f"topic={topic}/date={date}/{name}"
                    tmp = staging / f"{topic}-{date}-{name}"
                    writers[day] = (pq.ParquetWriter(tmp, schema), tmp, rel)
                writers[day][0].write_batch(rows)
    finally:
        for writer, _, _ in writers.values():
            writer.close()
    out = []
    for _, tmp, rel in writers.values():
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        out.append((tmp, rel))
    return out
