"""The Raft core is sans-I/O: its modules import no clock, network, disk or randomness."""

from __future__ import annotations

import ast
from pathlib import Path

import raft

CORE_MODULES = (
    "__init__",
    "config",
    "confchange",
    "core",
    "election",
    "errors",
    "log",
    "membership",
    "messages",
    "progress",
    "quorum",
    "readonly",
    "ready",
    "replication",
    "state",
    "storage",
    "tracker",
    "types",
    "validate",
)
FORBIDDEN = {
    "asyncio",
    "grpc",
    "h2grpc",
    "ssl",
    "time",
    "os",
    "random",
    "socket",
    "threading",
    "datetime",
}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_modules_import_no_io_or_randomness() -> None:
    package = Path(raft.__file__).parent
    for name in CORE_MODULES:
        bad = imported_roots(package / f"{name}.py") & FORBIDDEN
        assert not bad, f"raft/{name}.py imports {sorted(bad)}"


def test_the_checker_sees_imports() -> None:
    source = "import os\nfrom time import monotonic\nimport random as r\nfrom grpc.aio import x\n"
    tree_file = Path(__file__).parent / "_purity_probe.txt"
    tree_file.write_text(source)
    try:
        assert imported_roots(tree_file) >= {"os", "time", "random", "grpc"}
    finally:
        tree_file.unlink()
