"""The light install: a wheel of the project, installed without extras into a fresh venv.

The base install is what a node, a client and the console need; `[analytics]` adds
PySpark, pyarrow and matplotlib, `[chaos]` what the chaos suite's tests use. Here a
wheel built from this tree goes into a new venv without extras (pip, from the
package index or its cache) and runs as a user would: `dledger cluster up`, a put, a
get, a consumer, `cluster down`, all from the installed package (never this tree).
The analytics commands and an import of the analytics package say, in one line,
which extra they need. The other half, `MissingExtra` in this tree's own venv, is
tested without a new venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTRA_LINE = "this needs the [analytics] extra: pip install 'dledger-py[analytics]'"
HEAVY = ("pyspark", "pyarrow", "matplotlib", "toxiproxy")
_NOT_SOURCES: tuple[str, ...] = (".git", ".venv", "build", "*.egg-info", "__pycache__", "*_cache")
_NOT_SOURCES += (".hypothesis", "run-demo", "data", "spark-warehouse", "metastore_db", "tests")


def call(
    cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    """`cmd`'s stdout; it must succeed."""
    done = call(cmd, cwd, env, timeout)
    assert done.returncode == 0, f"{cmd}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh venv with this tree's wheel installed without extras."""
    home = tmp_path_factory.mktemp("light-install")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # built from a copy: a build leaves build/ and *.egg-info beside the sources
    tree = home / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    # The build backend is this venv's setuptools (no isolated build env to make: the
    # wheel is the same), and this venv's pip installs into the new venv (`--python`),
    # which needs no pip of its own: 14 s less than an isolated build and ensurepip.
    pip = [sys.executable, "-m", "pip"]
    wheel_cmd = [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(home)]
    run([*wheel_cmd, str(tree)], home, env, timeout=300)
    (wheel,) = home.glob("dledger_py-*.whl")
    venv = home / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], home, env)
    install = [*pip, "--python", str(venv / "bin" / "python"), "install", "-q", str(wheel)]
    run(install, home, env, timeout=600)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    yield venv, env


@pytest.mark.slow
def test_a_wheel_without_extras_runs_a_cluster_a_put_a_get_and_a_consumer(
    base_venv: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    venv, env = base_venv
    python, dledger = str(venv / "bin" / "python"), str(venv / "bin" / "dledger")
    where = run(
        [python, "-c", "import dledger_commitlog; print(dledger_commitlog.__file__)"], tmp_path, env
    )
    assert where.startswith(str(venv)), where  # the installed package, not this tree
    probe = (
        "import importlib.util as u, json; print(json.dumps({m: bool(u.find_spec(m)) for m in %r}))"
    )
    assert json.loads(run([python, "-c", probe % (HEAVY,)], tmp_path, env)) == dict.fromkeys(
        HEAVY, False
    )
    cluster = tmp_path / "c"
    run([dledger, "cluster", "up", "--dir", str(cluster)], tmp_path, env)
    try:
        conn = ["--cluster", str(cluster / "cluster.json"), "--json"]
        put = json.loads(
            run(
                [dledger, "put", *conn, "--topic", "light", "--key", "k1", "--body", "hello"],
                tmp_path,
                env,
            )
        )
        got = json.loads(run([dledger, "get", *conn, "--msg-id", put["msg_id"]], tmp_path, env))
        assert got["body"] == "hello" and got["keys"] == ["k1"]
        consumed = run(
            [dledger, "consume", *conn, "--group", "g", "--topic", "light", "--max", "1"],
            tmp_path,
            env,
        )
        assert "hello" in consumed
        refused = call([dledger, "analytics", "lag", *conn, "--group", "g"], tmp_path, env)
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            f"dledger analytics: {EXTRA_LINE} (pyspark, pyarrow, matplotlib are not installed)"
        ]
        imported = call([python, "-c", "import analytics.datasource"], tmp_path, env)
        assert imported.returncode == 1 and EXTRA_LINE in imported.stderr.splitlines()[-1]
    finally:
        run([dledger, "cluster", "down", "--dir", str(cluster)], tmp_path, env)


def test_without_the_extra_only_the_analytics_commands_say_so() -> None:
    """In a process where PySpark cannot be imported: `dledger analytics` and `export` are
    one line and exit 2, and every other command is there as before."""
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from dledger_commitlog.cli.main import main, build_parser\n"
        "print(main(['analytics', 'lag', '--group', 'g']), main(['export', '--topic', 't']))\n"
        "print('put' in build_parser().format_help())\n"
    )
    done = call([sys.executable, "-c", code])
    assert done.stdout.split() == ["2", "2", "True"], done.stderr
    assert done.stderr.splitlines() == [
        f"dledger {name}: {EXTRA_LINE} (pyspark is not installed)"
        for name in ("analytics", "export")
    ]
