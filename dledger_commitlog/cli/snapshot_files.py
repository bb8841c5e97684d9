"""A snapshot directory's manifest, its checks, and the hashing copy both sides use.

Owns the layout of a snapshot (`dledger snapshot save`, docs/backup.md):

    PATH/manifest.json     what was saved (`Manifest`), written last
    PATH/manifest.sha256   the manifest's own SHA-256 (hex)
    PATH/shard-<g>/...     shard g's files, by their paths in its data directory

and `copy_hashed`, the one copy of a file's bytes that also takes their SHA-256 (the
save records it, the restore compares it), run for several files at once in threads
(`copy_many`: hashlib and file I/O release the GIL, so two files go at two cores).

Invariants `load_manifest` enforces before a restore writes anything: the manifest is
the one its checksum names (a manifest without one is an interrupted save), of this
format, every field of its type; every file path stays inside its shard's directory;
every file is there with exactly its recorded size (a truncated snapshot). A file
whose bytes differ from its recorded SHA-256 is found while it is copied
(`copy_hashed` then `SnapshotError`). Anything else is a SnapshotError naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from store.fileio import write_atomically

FORMAT = 1
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
_WORKERS = 2


class SnapshotError(ValueError):
    """A snapshot cannot be saved or restored; the message says why."""


@dataclass(frozen=True, slots=True)
class SavedFile:
    path: str  # relative to the snapshot's root, with "/"
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class SavedShard:
    """One shard's committed log as saved from one node."""

    shard: int
    node: int  # the node it was copied from (the shard's leader)
    term: int  # the leader's term during the save
    committed_index: int  # the last entry saved
    committed_pos: int  # where the saved log ends
    first_index: int  # the first entry saved (1, or after retention's base)
    start_pos: int  # where the saved log starts
    files: tuple[SavedFile, ...]

    @property
    def dir(self) -> str:
        return f"shard-{self.shard}"


@dataclass(frozen=True, slots=True)
class Manifest:
    cluster: str  # the saved cluster's name
    nodes: tuple[int, ...]  # its node ids
    created: str  # ISO 8601, UTC
    flush_mode: str
    extra_config: dict[str, Any]  # its nodes' shared settings (cluster.json)
    tls: bool
    acl: bool
    shards: tuple[SavedShard, ...]

    @property
    def data_bytes(self) -> int:
        return sum(f.size for s in self.shards for f in s.files)


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write the manifest and its checksum, each durably (the save's last step)."""
    doc = {"format": FORMAT, **asdict(manifest)}
    raw = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    write_atomically(root / MANIFEST, raw)
    write_atomically(root / MANIFEST_SUM, (hashlib.sha256(raw).hexdigest() + "\n").encode())


def load_manifest(root: Path) -> Manifest:
    """The manifest of the snapshot at `root`, checked (see the module doc)."""
    if not root.is_dir():
        raise SnapshotError(f"{root}: no such directory")
    try:
        raw = (root / MANIFEST).read_bytes()
        want = (root / MANIFEST_SUM).read_text().strip()
    except FileNotFoundError as exc:
        raise SnapshotError(
            f"{root}: no {Path(str(exc.filename)).name}: not a snapshot, or its save was "
            "interrupted"
        ) from None
    if hashlib.sha256(raw).hexdigest() != want:
        raise SnapshotError(f"{root / MANIFEST}: does not match {MANIFEST_SUM}: corrupt")
    try:
        manifest = _parse(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"{root / MANIFEST}: not a snapshot manifest ({exc})") from None
    for shard in manifest.shards:
        for f in shard.files:
            path = root / f.path
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise SnapshotError(f"{path}: missing: the snapshot is incomplete") from None
            if size != f.size:
                raise SnapshotError(
                    f"{path}: {size} bytes, the manifest says {f.size}: truncated or damaged"
                )
    return manifest


def _parse(doc: dict[str, Any]) -> Manifest:
    if doc.get("format") != FORMAT:
        raise ValueError(f"format {doc.get('format')!r}, this version reads {FORMAT}")
    shards = tuple(_parse_shard(s) for s in _typed(doc["shards"], list))
    if not shards or len({s.shard for s in shards}) != len(shards):
        raise ValueError("no shards, or a shard twice")
    extra = _typed(doc["extra_config"], dict)
    return Manifest(
        _typed(doc["cluster"], str),
        tuple(_typed(i, int) for i in _typed(doc["nodes"], list)),
        _typed(doc["created"], str),
        _typed(doc["flush_mode"], str),
        extra,
        _typed(doc["tls"], bool),
        _typed(doc["acl"], bool),
        shards,
    )


def _parse_shard(doc: dict[str, Any]) -> SavedShard:
    names = ("shard", "node", "term", "committed_index", "committed_pos", "first_index")
    ints = {k: _typed(doc[k], int) for k in (*names, "start_pos")}
    if min(ints.values()) < 0:
        raise ValueError(f"shard {ints['shard']}: a negative number")
    top = f"shard-{ints['shard']}"
    files = []
    for f in _typed(doc["files"], list):
        path = _typed(f["path"], str)
        parts = PurePosixPath(path).parts
        if len(parts) < 2 or parts[0] != top or ".." in parts or path.startswith("/"):
            raise ValueError(f"file {path!r} lies outside {top}/")
        size, digest = _typed(f["size"], int), _typed(f["sha256"], str)
        if size < 0 or len(digest) != 64:
            raise ValueError(f"file {path!r}: bad size or sha256")
        files.append(SavedFile(path, size, digest))
    return SavedShard(**ints, files=tuple(files))


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{value!r} is no {kind.__name__}")
    return value


# ---------------------------------------------------------------- copying


@dataclass(frozen=True, slots=True)
class CopyJob:
    """Copy the first `size` bytes of `source` (a file open for reading, a path, or the
    bytes themselves) to `dest`, a new file."""

    source: io.FileIO | Path | bytes
    dest: Path
    size: int
    name: str  # how errors name the source


def copy_hashed(job: CopyJob) -> str:
    """Copy the job's bytes to a new file, fsynced; their SHA-256 (hex). SnapshotError
    if the source ends early.

    A file is hashed through a read-only mapping and copied in the kernel
    (copy_file_range): its bytes never pass through a Python buffer. Both read the
    same range of the same open file, which nobody changes: the save copies only
    what is below the committed position, the restore only a snapshot's files."""
    src = job.source
    out = os.open(job.dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if isinstance(src, bytes):
            if len(src) < job.size:
                raise SnapshotError(f"{job.name}: ends {job.size - len(src)} bytes short")
            digest = hashlib.sha256(src[: job.size]).hexdigest()
            os.write(out, src[: job.size])
        else:
            with _opened(src) as f:
                digest = _copy_file(f.fileno(), out, job)
        os.fsync(out)
    finally:
        os.close(out)
    return digest


@contextlib.contextmanager
def _opened(src: io.FileIO | Path) -> Iterator[io.FileIO]:
    """`src` open for reading: a pinned file is closed when its copy ends."""
    f = src if isinstance(src, io.FileIO) else io.FileIO(src, "r")
    try:
        yield f
    finally:
        f.close()


def _copy_file(fd: int, out: int, job: CopyJob) -> str:
    have = os.fstat(fd).st_size
    if have < job.size:
        raise SnapshotError(f"{job.name}: ends {job.size - have} bytes short of {job.size}")
    if not job.size:
        return hashlib.sha256().hexdigest()
    with mmap.mmap(fd, job.size, access=mmap.ACCESS_READ) as view:
        digest = hashlib.sha256(view).hexdigest()
    done = 0
    while done < job.size:
        n = os.copy_file_range(fd, out, job.size - done, done, done)
        if n == 0:
            raise SnapshotError(f"{job.name}: ends {job.size - done} bytes short of {job.size}")
        done += n
    return digest


def copy_many(jobs: Sequence[CopyJob]) -> list[str]:
    """`copy_hashed` of every job, the largest first, two at a time; their digests in
    the jobs' order. The first failure is raised once every copy has ended."""
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i].size)
    with ThreadPoolExecutor(_WORKERS, thread_name_prefix="snapshot-copy") as pool:
        futures = {i: pool.submit(copy_hashed, jobs[i]) for i in order}
        return [futures[i].result() for i in range(len(jobs))]
