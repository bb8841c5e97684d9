"""Helpers of the multi-Raft cluster tests (tests/test_multiraft_*.py) on real node
processes: per-shard status, leaders and transfers, and a writer that records
every acknowledged put.

Owns nothing the product has: `LocalCluster` answers for shard 1 only, so these
ask each node about shard g with a `Client(shard=g)` pinned to that node (a
Status call is never redirected). Every wait is `tests.conftest.wait_until`: a
condition with a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, ClientError, NodeStatus, StatusError
from dledger_commitlog.common.routes import shard_of_msg_id
from tests.conftest import wait_until

SHARD_LEADER_S = 30.0  # every shard of a (re)started cluster has a leader within this


def servers(cluster: LocalCluster) -> list[str]:
    return [s.client for s in cluster]


def shard_statuses(
    cluster: LocalCluster, shard: int, nodes: Iterable[int] | None = None
) -> dict[int, NodeStatus | StatusError]:
    """Each node's Status of `shard` (StatusError: it did not answer)."""
    ids = list(nodes) if nodes is not None else [s.id for s in cluster]
    out: dict[int, NodeStatus | StatusError] = {}
    with Client(servers(cluster), shard=shard, max_retries=0) as client:
        for i in ids:
            address = cluster.specs[i].client
            try:
                out[i] = client.status(address, timeout_s=1.0)
            except ClientError as exc:
                out[i] = StatusError(address, exc)
    return out


def leader_of(statuses: dict[int, NodeStatus | StatusError]) -> int | None:
    """The leader the nodes that answered agree on (None: none, or they disagree)."""
    got = [s for s in statuses.values() if isinstance(s, NodeStatus)]
    leaders = {s.node_id for s in got if s.role == "leader"}
    named = {s.leader_id for s in got}
    if len(leaders) == 1 and named == leaders:
        return next(iter(leaders))
    return None


def shard_leader(
    cluster: LocalCluster,
    shard: int,
    nodes: Iterable[int] | None = None,
    timeout_s: float = SHARD_LEADER_S,
) -> int:
    """Shard `shard`'s leader once the nodes (default: all) that answer agree on one."""
    ids = list(nodes) if nodes is not None else None
    found = wait_until(
        lambda: leader_of(shard_statuses(cluster, shard, ids)),
        timeout_s,
        f"shard {shard} to have one leader that its nodes agree on",
        ok=lambda leader: leader is not None,
    )
    assert found is not None
    return found


def shard_leaders(cluster: LocalCluster, shards: Iterable[int]) -> dict[int, int]:
    return {g: shard_leader(cluster, g) for g in shards}


def transfer(cluster: LocalCluster, shard: int, to: int) -> None:
    """Make node `to` the leader of `shard` (transfers until it leads)."""

    def moved() -> int | None:
        now = leader_of(shard_statuses(cluster, shard))
        if now is not None and now != to:
            with Client(servers(cluster), shard=shard) as client:
                client.transfer_leadership(to)
        return now

    wait_until(moved, 30.0, f"node {to} to lead shard {shard}", ok=lambda now: now == to)


@dataclass
class Acked:
    """What a writer was told: (msg id, body, queue id) of every acknowledged put."""

    shard: int
    topic: str
    puts: list[tuple[str, bytes, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@contextmanager
def writer(
    cluster: LocalCluster, shard: int, topic: str, stop: threading.Event, **client_kw: Any
) -> Iterator[Acked]:
    """A thread putting to `shard` until `stop` (or the block ends), recording each
    acknowledged put; an error (a leader gone, say) is recorded and retried."""
    acked = Acked(shard, topic)
    kw = {"timeout_s": 10.0, "max_retries": 20, **client_kw}

    def run() -> None:
        n = 0
        with Client(servers(cluster), shard=shard, **kw) as client:
            while not stop.is_set():
                body = b"g%d-%d" % (shard, n)
                try:
                    result = client.put(topic, body, queue_id=n % 2)
                except ClientError as exc:
                    acked.errors.append(str(exc))
                    continue
                assert shard_of_msg_id(result.msg_id) == shard
                acked.puts.append((result.msg_id, body, result.queue_id))
                n += 1

    thread = threading.Thread(target=run, name=f"writer-g{shard}", daemon=True)
    thread.start()
    try:
        yield acked
    finally:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), f"the writer of shard {shard} did not stop"
