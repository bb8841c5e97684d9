"""An earlier release of dledger-py, installed in a virtualenv of its own, for
mixed-version tests (tests/test_upgrade.py).

`compat_python()` is the Python of a venv holding dledger-py as built from the
commit that tests/compat_commit.txt names (an earlier commit of main): built once
per machine and commit under ~/.cache/dledger-py/compat-<commit>/ (outside the
clone, so `git clean` and a fresh worktree keep it), from a `git worktree` of that
commit that is removed again once installed (pip copies what it installs). A second
test run that wants it meanwhile waits on the directory's lock rather than building
it twice; a build that failed half-way leaves no `ready` marker and is redone. A
clone without that commit (a shallow clone, an export) cannot build it:
`CompatUnavailable` says so in one line, and the test skips.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMIT_FILE = Path(__file__).with_name("compat_commit.txt")
CACHE = Path.home() / ".cache" / "dledger-py"


class CompatUnavailable(Exception):
    """The earlier release cannot be built here (the message says why, in one line)."""


def compat_commit() -> str:
    """The full hash of the earlier commit (tests/compat_commit.txt)."""
    return COMMIT_FILE.read_text().split()[0]


def compat_python() -> Path:
    """The Python of the earlier release's venv, built first if need be."""
    commit = compat_commit()
    home = CACHE / f"compat-{commit}"
    python = home / "venv" / "bin" / "python"
    if (home / "ready").exists():
        return python
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f"compat-{commit}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent run waits here for the build
        if not (home / "ready").exists():
            _build(commit, home)
    return python


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )


def _build(commit: str, home: Path) -> None:
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        why = "a shallow clone" if shallow else "no such commit in this clone's history"
        raise CompatUnavailable(f"cannot build the earlier release {commit[:10]}: {why}")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    source = home / "src"
    started = time.monotonic()
    added = _git("worktree", "add", "--detach", str(source), commit)
    if added.returncode != 0:
        raise CompatUnavailable(f"git worktree add {commit[:10]}: {added.stderr.strip()}")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
        pip = [str(home / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, str(source)], check=True, capture_output=True)
    except subprocess.CalledProcessError as exc:
        output = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise CompatUnavailable(
            f"cannot install {commit[:10]}: {output[-1] if output else exc}"
        ) from None
    finally:
        _git("worktree", "remove", "--force", str(source))
    (home / "ready").write_text(f"built in {time.monotonic() - started:.0f}s\n")
