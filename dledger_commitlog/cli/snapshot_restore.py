"""`dledger snapshot restore`: a new local cluster whose every shard starts from a snapshot.

Like `etcdutl snapshot restore`, the result is a NEW cluster: directory D gets the
layout of `dledger cluster up --dir D` (`cluster_layout.ClusterLayout`: new ports,
a new peer secret, with TLS a new CA, with an ACL a new admin account) of N nodes,
the saved cluster's settings (its name unless another is given), and in every
node's data directory, per shard, the saved log:

- the data segments, entry index, base and entry checkpoint as saved, each
  compared with its SHA-256 as it is copied into the first node's directory;
- that store opened once (its recovery rescans from the checkpoint to the end,
  rebuilding the index slots the save could not take), checked to end at the
  manifest's entry and position, and checkpointed at its last entry;
- `raft.state`: the term of the last entry, no vote, everything committed, and
  no configuration (the membership is the new nodes', from their configs; the
  old cluster's configuration entries lie below the commit index and are not
  replayed);
- the layout file, and for a log retention had cut, the group offsets it took.

The first node's shard directory is then copied to the others: the replicas of a
shard are byte-identical, as Raft keeps them. Consume queues, the key index, group
offsets and the idempotency window are rebuilt by each node from its log when it
starts (node.recovery). Every message keeps its commit-log offset, so its id and
queue offset.

Refused before anything is written: a snapshot `load_manifest` refuses, a
directory that exists and is not empty, settings whose file layout differs from
the saved store's. A file whose checksum fails while copying removes everything
the restore wrote.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dledger_commitlog.cli.cluster_layout import ClusterLayout, shards_config
from dledger_commitlog.cli.snapshot_files import (
    CopyJob,
    Manifest,
    SavedShard,
    SnapshotError,
    copy_many,
    load_manifest,
)
from dledger_commitlog.cli.snapshot_save import remove_written
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.verify import LAYOUT_FILE
from dledger_commitlog.node.config import shard_config, shard_dir
from dledger_commitlog.node.recovery import store_layout
from raft.types import HardState
from raftio.hard_state import RaftStateFile
from store.errors import CorruptEntry
from store.fileio import fsync_dir, mkdir_durably


def restore(
    root: Path, directory: Path, nodes: int, name: str | None = None
) -> tuple[Manifest, ClusterLayout]:
    """Make `directory` a new cluster of `nodes` nodes from the snapshot at `root`."""
    manifest = load_manifest(root)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise SnapshotError(f"{directory}: exists and is not empty; restore makes a new cluster")
    extra = dict(manifest.extra_config)
    count = int(extra.get("shard_count", 1))
    extra.update(shards_config(count))  # every node hosts every shard
    if sorted(s.shard for s in manifest.shards) != shard_ids(count):
        raise SnapshotError(f"{root}: the manifest's shards are not those of {count} shard(s)")
    created = not directory.exists()
    layout = ClusterLayout(
        directory,
        nodes=nodes,
        flush_mode=manifest.flush_mode,
        extra_config=extra,
        cluster=name or manifest.cluster,
        tls=manifest.tls,
        acl=manifest.acl,
    )
    for shard in manifest.shards:
        _check_layout(root, shard, layout)
    try:
        layout.write()
        for shard in manifest.shards:
            dirs = [Path(shard_dir(spec.data_dir, shard.shard)) for spec in layout]
            _restore_shard(root, shard, dirs)
    except BaseException:
        remove_written(directory, created)
        raise
    return manifest, layout


def _check_layout(root: Path, shard: SavedShard, layout: ClusterLayout) -> None:
    try:
        saved = json.loads((root / shard.dir / LAYOUT_FILE).read_bytes())
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{root / shard.dir / LAYOUT_FILE}: unreadable ({exc})") from None
    for cfg in layout.configs.values():
        if store_layout(shard_config(cfg, shard.shard)) != saved:
            raise SnapshotError(
                f"shard {shard.shard}: the store was saved with {saved}, the settings give "
                f"{store_layout(shard_config(cfg, shard.shard))}"
            )


def _restore_shard(root: Path, shard: SavedShard, dirs: Sequence[Path]) -> None:
    first = dirs[0]
    jobs = [
        CopyJob(
            root / f.path,
            first / Path(f.path).relative_to(shard.dir),
            f.size,
            str(root / f.path),
        )
        for f in shard.files
    ]
    for d in {j.dest.parent for j in jobs}:
        mkdir_durably(d)
    for f, digest in zip(shard.files, copy_many(jobs), strict=True):
        if digest != f.sha256:
            raise SnapshotError(
                f"{root / f.path}: its SHA-256 differs from the manifest's: corrupt"
            )
    term = _open_store(first, shard)
    RaftStateFile(first / "raft.state").save(HardState(term, None, shard.committed_index))
    for d in {first, *(j.dest.parent for j in jobs)}:
        fsync_dir(d)
    with ThreadPoolExecutor(2, thread_name_prefix="snapshot-clone") as pool:
        for done in [pool.submit(_clone, first, d) for d in dirs[1:]]:
            done.result()


def _open_store(data: Path, shard: SavedShard) -> int:
    """Recover the restored store, check it ends where the manifest says, checkpoint it
    at its last entry; the term of that entry."""
    layout = json.loads((data / LAYOUT_FILE).read_bytes())
    want = (shard.first_index, shard.committed_index, shard.committed_pos)
    try:
        store = EntryStore(
            data / "commitlog",
            data_segment_bytes=layout["data_segment_bytes"],
            index_segment_bytes=layout["index_segment_bytes"],
            committed_index=shard.committed_index,
            preallocate=False,
        )
    except (CorruptEntry, ValueError) as exc:
        raise SnapshotError(f"shard {shard.shard}: the saved log does not open: {exc}") from None
    try:
        last = store.last_index()
        end = sum(store.locate(last)) if last >= store.first_index() else shard.start_pos
        if (store.first_index(), last, end) != want:
            raise SnapshotError(
                f"shard {shard.shard}: the saved log holds entries {store.first_index()}..{last} "
                f"ending at {end}, the manifest says {want[0]}..{want[1]} ending at {want[2]}"
            )
        store.write_checkpoint(last)
        return store.term(last)
    finally:
        store.close()


def _clone(src: Path, dst: Path) -> None:
    """Copy the directory tree `src` to `dst`, every file and directory fsynced."""
    for here, subdirs, files in os.walk(src):
        target = dst / Path(here).relative_to(src)
        mkdir_durably(target)
        for name in files:
            shutil.copyfile(Path(here) / name, target / name)
            fd = os.open(target / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for name in subdirs:
            (target / name).mkdir(exist_ok=True)
        fsync_dir(target)
