"""The backup commands: `dledger snapshot save` and `dledger snapshot restore` (docs/backup.md).

`save --cluster FILE --to PATH` copies every shard's committed log from the live
local cluster FILE names (snapshot_save: from each shard's leader, on this host);
`restore PATH --dir D [--nodes N] [--name NAME]` makes D a new cluster from it
(snapshot_restore) that `dledger cluster up --dir D` starts. A snapshot or a
directory they refuse is one line on stderr and exit code 2, with nothing written.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from dledger_commitlog.cli.cluster_layout import ClusterLayout
from dledger_commitlog.cli.commands import UsageError, command, emit, make_client, table
from dledger_commitlog.cli.snapshot_files import Manifest, SnapshotError
from dledger_commitlog.cli.snapshot_restore import restore
from dledger_commitlog.cli.snapshot_save import save
from dledger_commitlog.client import Client


def _save_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", required=True, metavar="PATH", help="a new or empty directory")


@command("snapshot save", "copy every shard's committed log of a live local cluster", _save_args)
def _save(args: argparse.Namespace) -> int:
    cluster_file = args.cluster or os.environ.get("DLEDGER_CLUSTER")
    if not cluster_file:
        raise UsageError("which cluster? pass --cluster FILE (its cluster.json)")
    if args.servers:
        raise UsageError("save copies the nodes' files: pass --cluster FILE, not --servers")
    if not Path(cluster_file).is_file():
        raise UsageError(f"{cluster_file}: no such cluster file")
    layout = ClusterLayout(Path(cluster_file).parent)

    def client_of(shard: int) -> Client:
        return make_client(args, shard=shard)

    started = time.perf_counter()
    try:
        manifest = save(layout, client_of, Path(args.to), args.timeout)
    except SnapshotError as exc:
        raise UsageError(str(exc)) from None
    _report(args, manifest, time.perf_counter() - started, f"saved to {args.to}")
    return 0


def _restore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="a snapshot `snapshot save` wrote")
    p.add_argument("--dir", required=True, metavar="D", help="the new cluster's directory")
    p.add_argument("--nodes", type=int, default=3, choices=(1, 3, 5), help="(default 3)")
    p.add_argument("--name", metavar="NAME", help="the new cluster's name (default: the saved)")


@command("snapshot restore", "make a new local cluster from a snapshot", _restore_args)
def _restore(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        manifest, layout = restore(Path(args.path), Path(args.dir), args.nodes, args.name)
    except SnapshotError as exc:
        raise UsageError(str(exc)) from None
    line = (
        f"restored into {layout.directory} ({len(layout.specs)} nodes, cluster "
        f"{layout.cluster!r}); start it with: dledger cluster up --dir {layout.directory}"
    )
    _report(args, manifest, time.perf_counter() - started, line)
    return 0


def _report(args: argparse.Namespace, manifest: Manifest, seconds: float, line: str) -> None:
    mb = manifest.data_bytes / 1e6
    rows = [
        (
            s.shard,
            s.node,
            f"{s.first_index}..{s.committed_index}",
            f"{s.start_pos}..{s.committed_pos}",
            len(s.files),
            f"{sum(f.size for f in s.files) / 1e6:.1f}",
        )
        for s in manifest.shards
    ]
    text = table(("shard", "from node", "entries", "log bytes", "files", "MB"), rows)
    rate = mb / seconds if seconds > 0 else 0.0
    text += f"\n{line}\n{mb:.1f} MB in {seconds:.2f} s ({rate:.0f} MB/s)"
    doc = {
        "cluster": manifest.cluster,
        "shards": [
            {
                "shard": s.shard,
                "node": s.node,
                "first_index": s.first_index,
                "committed_index": s.committed_index,
                "start_pos": s.start_pos,
                "committed_pos": s.committed_pos,
                "files": len(s.files),
            }
            for s in manifest.shards
        ],
        "bytes": manifest.data_bytes,
        "seconds": round(seconds, 3),
    }
    emit(args, doc, text)
