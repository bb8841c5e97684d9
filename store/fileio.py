"""Small durable-file helpers shared by every store file that is replaced whole.

`write_atomically` leaves either the old or the new content at `path`, never a
mix, and returns only once the new content and its directory entry are on disk.
`same_contents` compares two (sparse, preallocated) files reading only where
either holds data.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from store.errors import DirectoryInUse


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


def write_atomically(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a temp file, fsync it, rename it over `path`, fsync the directory.

    The file gets exactly `mode` (0o600 for secrets), whatever the umask or a
    leftover temp file had."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)
    fsync_dir(p.parent)


_COMPARE_CHUNK = 1 << 20


def _data_at(fd: int, pos: int, size: int) -> int:
    """Where the next data at or after `pos` starts (`size`: only a hole is left)."""
    try:
        return os.lseek(fd, pos, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # anything but "no data after pos" is an error
            raise
        return size


def same_contents(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two files hold the same bytes. A hole reads as zeros, so only the
    extents where either file holds data are read and compared (a 420 MB index file
    with a few pages written costs a few reads, not 420 MB of them)."""
    size = os.path.getsize(a)
    if os.path.getsize(b) != size:
        return False
    fa, fb = os.open(a, os.O_RDONLY), os.open(b, os.O_RDONLY)
    try:
        pos = 0
        while pos < size:
            start = min(_data_at(fa, pos, size), _data_at(fb, pos, size))
            if start >= size:
                return True
            end = max(os.lseek(fa, start, os.SEEK_HOLE), os.lseek(fb, start, os.SEEK_HOLE))
            while start < end:
                n = min(_COMPARE_CHUNK, end - start)
                if os.pread(fa, n, start) != os.pread(fb, n, start):
                    return False
                start += n
            pos = end
        return True
    finally:
        os.close(fa)
        os.close(fb)


class DirectoryLock:
    """An exclusive `flock` on `path` (created if missing), held until `release`.

    The kernel drops the lock when the process dies, so a crash never leaves a
    stale lock behind; the file keeps the holder's pid for the error message.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip()
            self.release()
            raise DirectoryInUse(str(self.path.parent), f"pid {holder or 'unknown'}") from None
        except BaseException:
            self.release()
            raise
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the lock
            self._fd = None
