"""`dledger snapshot save` and `restore` (docs/backup.md) on real clusters and files.

One source cluster of two data shards (so shard 0, the routes, too) serves puts on
both data shards while it is saved; before the save it got a topic route, a
consumer group's committed progress, a delayed message and an undecided half
message. The snapshot is restored into a new three-node cluster, which must serve
every put acknowledged before the save at the same message id and queue offset,
continue the group where it was, keep the route, deliver the delayed message
once and take the half message's commit; `dledger verify` is clean on every
restored node and shard. The refusals run on copies of the saved snapshot, with
no cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.cluster_layout import shards_config
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import (
    Client,
    HalfResult,
    MessageSpec,
    RoutedClient,
    StoredMessage,
)
from dledger_commitlog.client.consumer import Consumer
from dledger_commitlog.client.groups import ConsumedMessage
from dledger_commitlog.log.verify import verify_store
from dledger_commitlog.node.config import shard_dir

from .conftest import SHARED_CONFIG, wait_until
from .multiraft_helpers import servers, shard_leaders, writer

SHARDS = 2
SETTINGS: dict[str, Any] = {
    **SHARED_CONFIG,
    **shards_config(SHARDS),
    "group_session_timeout_ms": 1000,
    "check_timeout_ms": 120_000,  # the half message waits for its commit after the restore
}
GROUP, GROUP_TOPIC, CONSUMED = "billing", "orders", 5
OLD_GROUP = "audit"  # its offset commit is retained away before the save


@dataclass
class Saved:
    source: LocalCluster
    path: Path
    before: dict[int, list[tuple[str, bytes, int]]]  # shard -> puts acknowledged before
    group_left: set[bytes]  # the group's messages not consumed before the save
    half: HalfResult
    due_ms: int  # the delayed message's delivery time


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Saved]:
    root = tmp_path_factory.mktemp("snapshot")
    with LocalCluster(root / "source", extra_config=SETTINGS) as source:
        source.up()
        shard_leaders(source, range(SHARDS + 1))
        with RoutedClient(servers(source), timeout_s=15.0) as rc:
            rc.topic_update("create", "routed", {1: 1, 2: 2})
        _retain(source)
        with Client(servers(source), cluster=source.cluster) as c:
            bodies = [b"order-%d" % i for i in range(12)]
            for i, body in enumerate(bodies):
                c.put(GROUP_TOPIC, body, queue_id=i % 2)
            consumed = _consume(source, CONSUMED)
            wait_until(
                lambda: sum(max(o, 0) for o in c.fetch_offset(GROUP, GROUP_TOPIC).values()),
                10.0,
                f"group {GROUP} to commit the offsets of {CONSUMED} messages",
                ok=lambda total: total == CONSUMED,
            )
            due_ms = int(time.time() * 1000) + 4000
            c.put("later", b"delayed", deliver_at_ms=due_ms, uniq_key="D1")
            half = c.put_half("pay", b"debit", producer_group="pg", uniq_key="T1", queue_id=0)
        stop = threading.Event()
        with writer(source, 1, "w", stop) as w1, writer(source, 2, "w", stop) as w2:
            wait_until(lambda: min(len(w1.puts), len(w2.puts)), 10.0, "puts", ok=lambda n: n > 20)
            before = {1: list(w1.puts), 2: list(w2.puts)}
            code = cli.main(
                [
                    "snapshot",
                    "save",
                    "--cluster",
                    str(source.cluster_file),
                    "--to",
                    str(root / "snap"),
                    "--json",
                ]
            )
            assert code == 0
            wait_until(
                lambda: len(w1.puts) + len(w2.puts),
                10.0,
                "puts after the save",
                ok=lambda n: n > sum(map(len, before.values())),
            )
        assert not w1.errors and not w2.errors
        yield Saved(source, root / "snap", before, set(bodies) - consumed, half, due_ms)


def _retain(source: LocalCluster) -> None:
    """Shard 1's log loses its oldest segments to retention, and with them the offset
    commit of group OLD_GROUP: the snapshot must carry that offset."""
    with Client(servers(source), cluster=source.cluster) as c:
        c.commit_offset(OLD_GROUP, GROUP_TOPIC, 0, 3)
        filler = [MessageSpec("filler", os.urandom(60_000)) for _ in range(16)]
        for _ in range(4):
            c.put_batch(filler)

        def cleaned() -> int:
            every = [c.clean_now(spec.client, force=True) for spec in source]
            return min(r.deleted_segments for r in every)

        wait_until(cleaned, 10.0, "retention on every node of shard 1", ok=lambda n: n > 0)


def _consume(cluster: LocalCluster, count: int) -> set[bytes]:
    got: list[bytes] = []
    lock = threading.Lock()

    def handle(m: ConsumedMessage) -> None:
        with lock:
            got.append(m.body)

    consumer = Consumer(
        servers(cluster),
        GROUP,
        [GROUP_TOPIC],
        handle,
        cluster=cluster.cluster,
        concurrency=1,
        batch=1,
    )
    consumer.run(max_messages=count, idle_exit_s=10.0)
    return set(got)


def test_a_restored_cluster_serves_what_was_acknowledged_before_the_save(
    saved: Saved, tmp_path: Path
) -> None:
    directory = tmp_path / "restored"
    assert cli.main(["snapshot", "restore", str(saved.path), "--dir", str(directory)]) == 0
    manifest = json.loads((saved.path / "manifest.json").read_bytes())
    assert {s["shard"]: s["first_index"] > 1 for s in manifest["shards"]}[1]  # retained
    with LocalCluster(directory) as restored:
        assert restored.cluster_file.exists() and len(restored.specs) == 3
        assert (directory / "cluster.secret").read_bytes() != (
            saved.source.directory / "cluster.secret"
        ).read_bytes()
        restored.up()
        shard_leaders(restored, range(SHARDS + 1))
        for shard, puts in saved.before.items():
            _same_messages(saved.source, restored, shard, puts)
        with RoutedClient(servers(restored), timeout_s=15.0) as rc:
            assert rc.route("routed").shards == ((1, 1), (2, 2))
        with Client(servers(restored), cluster=restored.cluster) as c:
            done = c.end_transaction(saved.half, commit=True)
            assert done.committed
            later = wait_until(
                lambda: _all(c, "later"), 15.0, "the delayed message", ok=lambda m: len(m) >= 1
            )
            assert [m.body for m in later] == [b"delayed"]
            assert [m.body for m in _all(c, "pay")] == [b"debit"]
            assert c.fetch_offset(OLD_GROUP, GROUP_TOPIC)[0] == 3
        left = _consume(restored, len(saved.group_left))
        assert left == saved.group_left
    for spec in restored:
        for shard in range(SHARDS + 1):
            report = verify_store(shard_dir(spec.data_dir, shard))
            assert report.ok, report.problems


def _same_messages(
    source: LocalCluster, restored: LocalCluster, shard: int, puts: list[tuple[str, bytes, int]]
) -> None:
    """Each put is served by the restored cluster as by the source: by id, and by its
    queue offset."""
    with Client(servers(source), shard=shard) as old, Client(servers(restored), shard=shard) as new:
        by_offset = {(m.queue_id, m.queue_offset): m.msg_id for q in (0, 1) for m in _queue(new, q)}
        for msg_id, body, queue_id in puts:
            was, now = old.get(msg_id), new.get(msg_id)
            assert (now.body, now.queue_id) == (body, queue_id)
            assert (now.queue_offset, now.commitlog_offset) == (
                was.queue_offset,
                was.commitlog_offset,
            )
            assert by_offset[(queue_id, was.queue_offset)] == msg_id


def _queue(c: Client, queue_id: int, topic: str = "w") -> list[StoredMessage]:
    out: list[StoredMessage] = []
    offset = 0
    while True:
        got = c.pull(topic, queue_id, offset, max_messages=512)
        if not got.messages:
            return out
        out.extend(got.messages)
        offset = got.next_offset


def _all(c: Client, topic: str) -> list[StoredMessage]:
    return [m for q in range(4) for m in _queue(c, q, topic)]


# ---------------------------------------------------------------- refusals


def _restore(path: Path, directory: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`dledger snapshot restore` that must be refused (exit 2); its stderr line."""
    assert cli.main(["snapshot", "restore", str(path), "--dir", str(directory)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


@pytest.fixture
def copy(saved: Saved, tmp_path: Path) -> Path:
    """A copy of the saved snapshot the test may damage."""
    return Path(shutil.copytree(saved.path, tmp_path / "copy"))


def _data_file(snapshot: Path) -> Path:
    return sorted((snapshot / "shard-1" / "commitlog" / "data").iterdir())[0]


def test_a_truncated_snapshot_is_refused_and_nothing_written(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = _data_file(copy)
    os.truncate(victim, victim.stat().st_size - 1)
    err = _restore(copy, tmp_path / "d", capsys)
    assert "truncated" in err and victim.name in err
    assert not (tmp_path / "d").exists()


def test_a_corrupt_file_is_refused_and_what_was_written_removed(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = _data_file(copy)
    with victim.open("r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    (tmp_path / "d").mkdir()  # an empty directory is taken, and left empty
    err = _restore(copy, tmp_path / "d", capsys)
    assert "SHA-256" in err and "corrupt" in err and victim.name in err
    assert list((tmp_path / "d").iterdir()) == []


def test_a_damaged_or_missing_manifest_is_refused(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = copy / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"shard": 1', b'"shard": 7', 1))
    assert "does not match manifest.sha256" in _restore(copy, tmp_path / "d", capsys)
    manifest.unlink()
    assert "interrupted" in _restore(copy, tmp_path / "d", capsys)
    assert not (tmp_path / "d").exists()


def test_restoring_over_a_non_empty_directory_is_refused(
    saved: Saved, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("mine")
    assert "not empty" in _restore(saved.path, tmp_path / "d", capsys)
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["keep"]


def test_saving_into_a_non_empty_directory_is_refused(
    saved: Saved, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("mine")
    args = ["snapshot", "save", "--cluster", str(saved.source.cluster_file), "--to"]
    assert cli.main([*args, str(tmp_path / "d")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["keep"]
    assert (
        cli.main(["snapshot", "save", "--cluster", str(tmp_path / "none.json"), "--to", "x"]) == 2
    )
    assert "no such cluster file" in capsys.readouterr().err
