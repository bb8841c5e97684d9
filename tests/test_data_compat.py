"""A data directory written by an earlier release opens, and every message reads back.

tests/testdata/compat/one_group_6f63912.tar.gz is node 1's data directory of a
one-node, one-group cluster written by commit 6f63912 (before a single-group
cluster became a process hosting one Raft group, built by the code that builds
several): 150 messages on two topics, with keys and tags, single puts and a batch.
The .json beside it is what those puts answered. The node opens it under today's
code with a config in the layout of that release (naming `listen.client_transport`,
read with a warning now), and every message is found by its id, by its queue and
by its key, unchanged.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).parent / "testdata" / "compat" / "one_group_6f63912"
# The settings the directory was written with (its layout.json holds them too).
STORE = {
    "data_segment_bytes": 1 << 20,
    "max_message_bytes": 64 << 10,
    "index_segment_bytes": 32 * 4096,
    "cq_units_per_file": 64,
    "index_slots": 64,
    "index_entries": 256,
}


def test_a_one_group_directory_of_an_earlier_release_reads_back_whole(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = json.loads(FIXTURE.with_suffix(".json").read_text())
    cluster = LocalCluster(tmp_path / "compat", nodes=1, extra_config=STORE)
    try:
        cluster.up()  # the layout: ports, the cluster secret; then the old directory
        cluster.down()
        spec = cluster.specs[1]
        shutil.rmtree(spec.data_dir)
        with tarfile.open(FIXTURE.with_suffix(".tar.gz")) as tar:
            tar.extractall(Path(spec.data_dir).parent, filter="data")
        spec.config_path.write_text(  # as that release wrote it
            f'node_id = 1\ncluster = "{cluster.cluster}"\ndata_dir = "{spec.data_dir}"\n'
            'flush_mode = "sync"\n\n[listen]\n'
            f'client = "{spec.client}"\nraft = "{spec.raft}"\nmetrics = "{spec.metrics}"\n'
            'client_transport = "h2"\n\n[store]\n'
            + "".join(f"{k} = {v}\n" for k, v in STORE.items())
            + f'\n[security]\npeer_secret_file = "{cluster.secret_path}"\n\n'
            f'[[peers]]\nid = 1\nraft = "{spec.raft}"\nclient = "{spec.client}"\n'
        )
        cluster.start(1)
        cluster.wait_for_leader()
        with cluster.client() as client:
            for m in sent:
                got = client.get(m["msg_id"])
                assert (got.topic, got.body, got.queue_id, got.queue_offset) == (
                    m["topic"],
                    m["body"].encode(),
                    m["queue_id"],
                    m["queue_offset"],
                ), m
            for topic in ("orders", "audit"):
                mine = [m for m in sent if m["topic"] == topic]
                for queue in sorted({m["queue_id"] for m in mine}):
                    pulled = client.pull(topic, queue, 0, max_messages=200).messages
                    want = sorted(
                        (m for m in mine if m["queue_id"] == queue), key=lambda m: m["queue_offset"]
                    )
                    assert [p.msg_id for p in pulled] == [m["msg_id"] for m in want]
            for m in sent:
                if m["key"]:
                    found = client.query(m["topic"], m["key"])
                    assert [f.msg_id for f in found] == [m["msg_id"]]
        assert "listen.client_transport is no longer read" in cluster.log_tail(1, 400)
    finally:
        cluster.down()
