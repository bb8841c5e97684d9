"""`export`: incremental Parquet with a manifest; every message exactly once, crash or not."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from analytics import export as export_module
from analytics.errors import OptionError, SourceError
from analytics.export import MANIFEST, Manifest, export
from analytics.file_store import OfflineStore
from tests.test_analytics_offline import SyntheticNode, key, plain


def exported_rows(directory: Path) -> list[dict[str, Any]]:
    """The export read back natively (Hive partitions), shaped like the source's rows."""
    table = ds.dataset(directory, format="parquet", partitioning="hive").to_table()
    rows = plain(table.to_pylist())
    for r in rows:
        r.pop("date")
    return rows


def dates_of(directory: Path) -> set[str]:
    return {p.name.removeprefix("date=") for p in directory.glob("topic=*/date=*")}


@pytest.fixture
def node(tmp_path: Path) -> SyntheticNode:
    n = SyntheticNode(tmp_path / "node", segment_bytes=1 << 15, step_ms=3_600_000)
    n.append(300)  # 300 hours: spread over 13 UTC dates
    return n


def test_export_writes_every_message_once_partitioned_by_topic_and_date(
    node: SyntheticNode, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    result = export(OfflineStore(node.root), out)
    assert result.messages == 300
    assert sorted(exported_rows(out), key=key) == sorted(node.rows, key=key)
    want_dates = {
        dt.datetime.fromtimestamp(r["store_timestamp_ms"] / 1000, dt.UTC).date().isoformat()
        for r in node.rows
    }
    assert dates_of(out) == want_dates and len(want_dates) > 10
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["offsets"] == {"orders": {"0": 75, "1": 75}, "pay": {"0": 75, "1": 75}}
    assert sorted(manifest["files"]) == sorted(result.files)
    assert {p.relative_to(out).as_posix() for p in out.rglob("*.parquet")} == set(result.files)


def test_export_is_incremental_and_resumes_from_the_manifest(
    node: SyntheticNode, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    first = export(OfflineStore(node.root), out, max_messages_per_queue=20)
    assert first.messages == 80
    assert export(OfflineStore(node.root), out).messages == 220
    assert export(OfflineStore(node.root), out).messages == 0  # nothing new: nothing written
    node.append(100, topics=("orders", "pay", "audit"))
    again = export(OfflineStore(node.root), out)
    assert {(q.topic, q.queue_id, q.start) for q in again.queues} >= {("audit", 0, 0)}
    assert again.messages == 100
    rows = exported_rows(out)
    assert len(rows) == len({key(r) for r in rows}) == 400
    assert sorted(rows, key=key) == sorted(node.rows, key=key)
    assert len(Manifest.load(out).runs) == 3  # runs that exported something


def test_a_run_that_dies_before_its_manifest_is_redone_without_duplicates(
    node: SyntheticNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "export"
    export(OfflineStore(node.root), out, max_messages_per_queue=10)
    node.append(40)

    def crash(self: Manifest, directory: Path) -> None:
        raise OSError("disk gone")

    with monkeypatch.context() as m:
        m.setattr(Manifest, "save", crash)
        with pytest.raises(OSError, match="disk gone"):
            export(OfflineStore(node.root), out)
    orphans = set(p.relative_to(out).as_posix() for p in out.rglob("*.parquet"))
    orphans -= set(Manifest.load(out).files)
    assert orphans  # the dead run's files are in place, but not in the manifest
    result = export(OfflineStore(node.root), out)
    assert set(result.removed_orphans) == orphans
    assert result.messages == 300  # 340 messages, 40 exported by the first run
    rows = exported_rows(out)
    assert sorted(rows, key=key) == sorted(node.rows, key=key)


def test_only_one_export_runs_at_a_time(node: SyntheticNode, tmp_path: Path) -> None:
    out = tmp_path / "export"
    out.mkdir()
    inside, release = threading.Event(), threading.Event()
    real = export_module._remove_orphans

    def slow(root: Path, manifest: Manifest) -> list[str]:
        inside.set()
        assert release.wait(10)
        return real(root, manifest)

    errors: list[BaseException] = []

    def run() -> None:
        try:
            export(OfflineStore(node.root), out)
        except BaseException as exc:
            errors.append(exc)

    export_module._remove_orphans = slow
    try:
        t = threading.Thread(target=run)
        t.start()
        assert inside.wait(10)
        with pytest.raises(SourceError, match="another export is running"):
            export(OfflineStore(node.root), out)
        release.set()
        t.join(10)
    finally:
        export_module._remove_orphans = real
    assert not errors
    assert len(exported_rows(out)) == 300


def test_messages_lost_to_retention_are_counted_as_skipped(
    node: SyntheticNode, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    export(OfflineStore(node.root), out, max_messages_per_queue=5)
    data = node.root / "commitlog" / "data"
    sorted(data.iterdir())[0].unlink()  # retention deleted the first segment
    result = export(OfflineStore(node.root), out)
    skipped = sum(q.skipped for q in result.queues)
    assert skipped > 0
    assert len(exported_rows(out)) + skipped == 300
    assert Manifest.load(out).runs[-1]["skipped"] == skipped


def test_bad_export_requests_are_refused(node: SyntheticNode, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="unknown topic"):
        export(OfflineStore(node.root), tmp_path / "e", ["nope"])
    (tmp_path / "e" / MANIFEST).write_text("{not json")
    with pytest.raises(SourceError, match="unreadable export manifest"):
        export(OfflineStore(node.root), tmp_path / "e")
