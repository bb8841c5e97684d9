"""Small durable-file helpers shared by every store file that is replaced whole.

`write_atomically` leaves either the old or the new content at `path`, never a
mix, and returns only once the new content and its directory entry are on disk.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durably(directory: str | os.PathLike[str]) -> None:
    """`mkdir -p`, making each directory it creates durable in its parent.

    Without the parent's fsync a power loss can forget a new directory, and with
    it files whose data was fsynced (fdatasync does not cover directory entries).
    """
    path = Path(directory)
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
        fsync_dir(new.parent)
    if not Path(directory).is_dir():
        raise NotADirectoryError(f"{directory} exists and is not a directory")


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a temp file, fsync it, rename it over `path`, fsync the directory."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)
    fsync_dir(p.parent)
