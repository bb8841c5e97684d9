"""`dledger export` from the command line: output, exit codes, clear errors (no Spark needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import analytics.commands  # registers `export` and `analytics ...` (as cli.build_parser does)
from analytics import charts, jobs
from dledger_commitlog.cli import main as cli
from tests.test_analytics_export import exported_rows
from tests.test_analytics_offline import SyntheticNode

assert analytics.commands


@pytest.fixture
def node(tmp_path: Path) -> SyntheticNode:
    n = SyntheticNode(tmp_path / "node", segment_bytes=1 << 15)
    n.append(120)
    return n


def test_export_from_a_data_directory(
    node: SyntheticNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    args = ["export", "--path", str(node.root), "--to", str(out), "--topics", "pay"]
    assert cli.main([*args, "--max-per-queue", "10"]) == 0
    text = capsys.readouterr().out
    assert "exported 20 messages in 2 files" in text
    assert cli.main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["messages"] == 40
    assert [(q["topic"], q["queue"], q["from"], q["to"]) for q in doc["queues"]] == [
        ("pay", 0, 10, 30),
        ("pay", 1, 10, 30),
    ]
    assert len(exported_rows(out)) == 60


def test_an_unknown_topic_is_a_usage_error(
    node: SyntheticNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--path", str(node.root), "--to", str(tmp_path / "e"), "--topics", "nope"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown topic(s) 'nope'" in err


def test_a_bad_number_is_refused_by_the_parser(
    node: SyntheticNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--path", str(node.root), "--to", str(tmp_path / "e")]
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--max-per-queue", "0"])
    assert info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_export_of_a_directory_that_is_not_a_node_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["export", "--path", str(tmp_path), "--to", str(tmp_path / "e")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dledger: ") and "not a dledger data directory" in err


def test_export_needs_a_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export", "--to", str(tmp_path / "e")]) == 2
    assert "no servers" in capsys.readouterr().err


def test_analytics_commands_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["analytics", "--help"])
    text = capsys.readouterr().out
    for job in ("rate", "top-keys", "sizes", "lag"):
        assert job in text


def test_charts_of_every_job(tmp_path: Path) -> None:
    tables = [
        jobs.Table(
            "rate",
            ("minute", "topic", "messages", "bytes"),
            [("2024-01-01 00:00", "a", 3, 30), ("2024-01-01 00:01", "a", 5, 50)],
            "lines",
        ),
        jobs.Table("keys", ("topic", "rank", "key", "messages"), [("a", 1, "k", 9)], "bars"),
        jobs.Table(
            "lag",
            ("topic", "queue", "committed_end", "group_offset", "lag", "oldest_unconsumed_s"),
            [("a", 0, 9, None, 9, 1.5)],
            "bars",
        ),
    ]
    for k, table in enumerate(tables):
        png = charts.write_chart(table, tmp_path / f"c{k}.png")
        assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 5000


def test_export_of_a_multi_raft_directory_takes_one_shard_at_a_time(
    node: SyntheticNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node directory of shards 1 and 2 (docs/scaling.md): `export` without
    --shard is a usage error naming the shards, --shard 2 exports shard 2's
    files (its own queues and offsets) to a directory of its own, a shard that is
    not there is refused."""
    two = SyntheticNode(node.root / "groups" / "2", segment_bytes=1 << 15)
    two.append(30)
    base = ["export", "--path", str(node.root)]
    assert cli.main([*base, "--to", str(tmp_path / "all")]) == 2
    err = capsys.readouterr().err
    assert "the data shards are 1, 2: export one at a time" in err, err
    assert not (tmp_path / "all").exists()
    assert cli.main([*base, "--to", str(tmp_path / "g2"), "--shard", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["messages"] == 30
    assert len(exported_rows(tmp_path / "g2")) == 30
    assert cli.main([*base, "--to", str(tmp_path / "g1"), "--shard", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["messages"] == 120
    assert cli.main([*base, "--to", str(tmp_path / "g3"), "--shard", "3"]) == 2
    assert "--shard 3: not a data shard here" in capsys.readouterr().err
