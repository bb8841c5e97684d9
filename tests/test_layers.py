"""The layers hold: `lint-imports` (the contracts in pyproject.toml) passes on the tree,
and an import against the layers fails it with a message naming the import.

The failing case runs on a copy of the packages with one wrong import added, so the
contracts are shown to catch what they are meant to catch (a contract that can never
fail would pass either way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "proto",
    "h2grpc",
    "netkit",
    "store",
    "raft",
    "raftio",
    "dispatch",
    "dledger_commitlog",
    "analytics",
    "chaos",
)
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(where))
    return subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        # the server package imports nothing above it
        ("dledger_commitlog/log/commitlog.py", "import analytics.session", "Top-level"),
        # the log is below the node
        ("dledger_commitlog/log/retention.py", "import dledger_commitlog.node.config", "Inside"),
        # the client never imports the server side (type-only imports count)
        (
            "dledger_commitlog/client/put_pipe.py",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    import dledger_commitlog.node.node",
            "The client never imports",
        ),
        # the consensus library has no network and no gRPC (even its driver)
        ("raft/driver.py", "import grpc", "raft is the consensus library"),
        ("raft/driver.py", "import netkit.tasks", "raft is the consensus library"),
        # the Raft core stays pure
        ("raft/log.py", "import raft.driver", "The Raft core is pure"),
        # what both ports share imports nothing of ours
        ("netkit/tasks.py", "import raftio.wire", "netkit (what both ports share)"),
        # store imports nothing of ours
        ("store/fileio.py", "import raft.errors", "store imports nothing"),
        # nor does the gRPC layer
        ("h2grpc/frames.py", "import raftio.wire", "h2grpc (gRPC over HTTP/2) imports nothing"),
    ],
)
def test_a_wrong_import_fails_with_a_clear_message(
    tmp_path: Path, module: str, wrong_import: str, contract: str
) -> None:
    tree = _copy(tmp_path)
    path = tree / module
    path.write_text(path.read_text() + "\n" + wrong_import + "\n")
    done = _lint(tree)
    assert done.returncode != 0, done.stdout
    assert "BROKEN" in done.stdout
    broken = done.stdout[done.stdout.index("Broken contracts") :]
    assert contract in broken
    importer = module.removesuffix(".py").replace("/", ".")
    assert importer in broken, broken
