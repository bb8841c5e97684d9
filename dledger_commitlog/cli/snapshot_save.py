"""`dledger snapshot save`: a consistent copy of every shard's committed log, taken live.

The state of a shard is its committed log: consume queues, the key index and group
offsets are dispatched from it (group offsets are messages of a system topic),
topic routes are shard 0's log, delayed and half messages are messages of system
topics with their progress as group offsets, and the idempotency window is read
back from the log's tail at start. So a snapshot is, per shard, the committed
prefix of the entry log, copied from a live node of this host while it serves puts:

1. The shard's leader is asked its position through the existing Status RPC: the
   leader, because every acknowledged put is committed there (a follower's commit
   index lags). It must report a commit index at least every other node's (a
   fresh leader's lags until it commits in its term), and its log must be flushed
   through the committed position (Status's flushed_pos; with sync flush the
   leader's appends wait in memory until their fsync). That position, entry I
   ending at byte E, is the snapshot's end: every put acknowledged before the save
   began is below it.
2. Before that, the small files that must not run ahead of E are read: the entry
   checkpoint (a committed entry whose index slots are on disk: the restored
   store rescans only from there) and, for a log retention has cut, the group
   offsets file (offsets dispatched up to a position below E: what retention
   took from the log).
3. The segments are pinned by opening them (a file retention deletes stays
   readable through its descriptor), then the base record is read (where a
   retained log starts). A segment below E never changes: committed entries are
   never rewritten, so every segment is copied while the node runs, the one
   holding E up to E only, the entry index up to slot I (slots past the
   checkpoint may still sit in the node's buffer: the restore rebuilds them).
   Each file's SHA-256 is taken as it is copied (snapshot_files).

The manifest is written last: a save that fails or is interrupted leaves no
manifest, and what it wrote is removed.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dledger_commitlog.cli.cluster_layout import ClusterError, ClusterLayout
from dledger_commitlog.cli.snapshot_files import (
    CopyJob,
    Manifest,
    SavedFile,
    SavedShard,
    SnapshotError,
    copy_many,
    write_manifest,
)
from dledger_commitlog.client import Client, NodeStatus
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.log.entry_records import BASE_FILE, CHECKPOINT_FILE, read_record
from dledger_commitlog.log.verify import LAYOUT_FILE, read_layout
from dledger_commitlog.node.config import shard_dir
from store.entry_format import INDEX_UNIT_SIZE
from store.fileio import fsync_dir, mkdir_durably

OFFSETS_FILE = "consumer_offsets.json"  # the dispatcher's group offsets (dispatch/)
_POLL_S = 0.05
_PIN_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Position:
    leader: NodeStatus
    index: int  # the last committed entry
    pos: int  # where it ends


def save(
    layout: ClusterLayout, client_of: Callable[[int], Client], root: Path, timeout_s: float
) -> Manifest:
    """Save every shard of the cluster `layout` describes into `root` (a new or empty
    directory); `client_of(shard)` is a client of that shard."""
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise SnapshotError(f"{root}: exists and is not an empty directory")
    created = not root.exists()
    mkdir_durably(root)
    try:
        shards = []
        for g in shard_ids(layout.shard_count):
            with client_of(g) as client:
                shards.append(_save_shard(layout, client, g, root, timeout_s))
        manifest = Manifest(
            cluster=layout.cluster,
            nodes=tuple(sorted(layout.specs)),
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            flush_mode=layout.flush_mode,
            extra_config=dict(layout.extra_config),
            tls=layout.tls,
            acl=layout.acl,
            shards=tuple(shards),
        )
        write_manifest(root, manifest)
        return manifest
    except BaseException:
        remove_written(root, created)
        raise


def remove_written(root: Path, created: bool) -> None:
    """Remove what a failed save or restore wrote under `root` (and `root` if it made it)."""
    if created:
        shutil.rmtree(root, ignore_errors=True)
        return
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _save_shard(
    layout: ClusterLayout, client: Client, shard: int, root: Path, timeout_s: float
) -> SavedShard:
    deadline = time.monotonic() + timeout_s
    leader = _leader(client, shard, deadline)
    data = Path(shard_dir(layout.specs[leader.node_id].data_dir, shard))
    if not (data / LAYOUT_FILE).exists():
        raise ClusterError(
            f"shard {shard}: node {leader.node_id} leads it, but its data directory {data} "
            "is not readable here (save runs on the host of the node it copies)"
        )
    store = read_layout(data)
    checkpoint = _read_small(data / "commitlog" / CHECKPOINT_FILE)
    offsets = _read_small(data / OFFSETS_FILE)
    at = _position(client, leader, shard, deadline)
    names = [
        (LAYOUT_FILE, (data / LAYOUT_FILE).read_bytes()),
        (f"commitlog/{CHECKPOINT_FILE}", checkpoint),
    ]
    pinned, base = _pin(data, at, store, deadline)
    try:
        first_index, start_pos = (1, 0) if base is None else (base[0] + 1, base[2])
        if base is not None:
            raw_base = (data / "commitlog" / BASE_FILE).read_bytes()
            names += [(f"commitlog/{BASE_FILE}", raw_base), (OFFSETS_FILE, offsets)]
        jobs: list[CopyJob] = []
        out = root / f"shard-{shard}"
        for rel, raw in names:
            if raw is not None:
                jobs.append(CopyJob(raw, out / rel, len(raw), str(data / rel)))
        for rel, (f, size) in pinned.items():
            jobs.append(CopyJob(f, out / rel, size, str(data / rel)))
        for d in {j.dest.parent for j in jobs}:
            mkdir_durably(d)
        digests = copy_many(jobs)
        for d in {j.dest.parent for j in jobs}:
            fsync_dir(d)
    finally:
        for f, _ in pinned.values():
            f.close()
    files = tuple(
        SavedFile(j.dest.relative_to(root).as_posix(), j.size, digest)
        for j, digest in zip(jobs, digests, strict=True)
    )
    return SavedShard(
        shard, leader.node_id, at.leader.term, at.index, at.pos, first_index, start_pos, files
    )


def _read_small(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _leader(client: Client, shard: int, deadline: float) -> NodeStatus:
    """The shard's leader, as the nodes that answer agree (waits up to the deadline)."""
    while True:
        answered = [s for s in client.status_all(timeout_s=2.0) if isinstance(s, NodeStatus)]
        leaders = [s for s in answered if s.role == "leader"]
        if leaders:
            return max(leaders, key=lambda s: s.term)
        if time.monotonic() > deadline:
            raise ClusterError(
                f"shard {shard} has no leader ({len(answered)} nodes answered): a snapshot "
                "is taken from the leader, which holds every acknowledged put"
            )
        time.sleep(_POLL_S)


def _position(client: Client, leader: NodeStatus, shard: int, deadline: float) -> Position:
    """The leader's committed position once it is at least every node's and flushed."""
    need = max(
        (s.committed_index for s in client.status_all(timeout_s=2.0) if isinstance(s, NodeStatus)),
        default=0,
    )
    first: NodeStatus | None = None
    while True:
        now = client.status(leader.address, timeout_s=2.0)
        if now.role != "leader" and first is None:
            raise ClusterError(f"shard {shard}: node {leader.node_id} stopped leading; save again")
        if first is None and now.committed_index >= need:
            first = now
        if first is not None and now.flushed_pos >= first.committed_pos:
            return Position(first, first.committed_index, first.committed_pos)
        if time.monotonic() > deadline:
            raise ClusterError(
                f"shard {shard}: leader {leader.node_id} is not caught up (commit "
                f"{now.committed_index} of {need}, flushed to {now.flushed_pos})"
            )
        time.sleep(_POLL_S)


def _pin(
    data: Path, at: Position, store: dict[str, int], deadline: float
) -> tuple[dict[str, tuple[io.FileIO, int]], tuple[int, int, int, int] | None]:
    """Open the segments the snapshot copies ({path: (file, bytes to copy)}), then read
    the base: retention may delete a segment between the listing and the open."""
    for _ in range(_PIN_ATTEMPTS):
        pinned: dict[str, tuple[io.FileIO, int]] = {}
        try:
            for sub, seg, end in (
                ("data", store["data_segment_bytes"], at.pos),
                ("index", store["index_segment_bytes"], (at.index + 1) * INDEX_UNIT_SIZE),
            ):
                for path in sorted((data / "commitlog" / sub).iterdir()):
                    start = int(path.name)
                    if start < end:
                        pinned[f"commitlog/{sub}/{path.name}"] = (
                            io.FileIO(path, "r"),
                            min(seg, end - start),
                        )
            base = read_record(data / "commitlog" / BASE_FILE)
            return _drop_before(pinned, base, store), base
        except FileNotFoundError:
            for f, _ in pinned.values():
                f.close()
            if time.monotonic() > deadline:
                break
    raise ClusterError(
        f"{data}: retention deleted segments while the save opened them, {_PIN_ATTEMPTS} "
        "times; save again"
    )


def _drop_before(
    pinned: dict[str, tuple[io.FileIO, int]],
    base: tuple[int, int, int, int] | None,
    store: dict[str, int],
) -> dict[str, tuple[io.FileIO, int]]:
    """Leave out segments wholly before the log's start (retention deletes them next)."""
    if base is None:
        return pinned
    keep_from = {"data": base[2], "index": base[0] * INDEX_UNIT_SIZE}
    sizes = {"data": store["data_segment_bytes"], "index": store["index_segment_bytes"]}
    out = {}
    for rel, (f, size) in pinned.items():
        sub, name = rel.split("/")[1:]
        if int(name) + sizes[sub] > keep_from[sub]:
            out[rel] = (f, size)
        else:
            with contextlib.suppress(OSError):
                f.close()
    return out
