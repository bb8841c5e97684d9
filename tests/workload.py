"""Workloads and checks shared by the integration, dispatch and chaos tests.

`Writers` are threads that put unique messages and record every acknowledged
put, with when it started and how long it took; `read_all` reads everything a node
has committed; `check_acked` asserts that every acknowledged put is there, once, at
its offset, with its body.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from chaos.checker import split_raw
from chaos.workload import body_for
from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import ClientError, PutResult
from proto import dledger_pb2 as pb
from store.entry_format import HEADER_SIZE
from store.message import StoredMessage, decode_message
from tests.conftest import wait_until


def split_messages(buf: bytes) -> list[StoredMessage]:
    """ReadRange's concatenated encoded messages, decoded one by one (totalSize first)."""
    return [decode_message(one) for _, one in split_raw(buf)]


def read_all(stub: Any, from_offset: int = 0) -> dict[int, StoredMessage]:
    """Every committed message a node holds from `from_offset` on, by commit-log offset."""
    out: dict[int, StoredMessage] = {}
    offset = from_offset
    while True:
        resp = stub.ReadRange(pb.ReadRangeRequest(from_offset=offset), timeout=5.0)
        for m in split_messages(resp.messages):
            out[m.physical_offset] = m
        if resp.next_offset - HEADER_SIZE >= resp.committed_offset:
            return out
        assert resp.next_offset > offset, f"ReadRange from {offset} made no progress"
        offset = resp.next_offset


def leader_and_follower(cluster: LocalCluster) -> tuple[int, int]:
    leader = cluster.wait_for_leader(timeout_s=10.0)
    return leader, next(s.id for s in cluster if s.id != leader)


@dataclass(frozen=True, slots=True)
class Acked:
    body: bytes
    result: PutResult
    started: float = 0.0  # time.monotonic() at the put's call
    seconds: float = 0.0  # until it was acknowledged (retries included)


class Writers:
    """Writer threads, each with its own Client, recording every acknowledged put."""

    def __init__(
        self,
        cluster: LocalCluster,
        topic: str,
        threads: int,
        body_bytes: int = 200,
        keyed: bool = False,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.threads = threads
        self.body_bytes = body_bytes
        self.keyed = keyed  # each put gets a key "w<writer>-<i>" and a tag "T<i % 3>"
        self.acked: list[Acked] = []
        self.errors: list[ClientError] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="writer")
        self._futures: list[Future[None]] = []

    def start(self, per_thread: int | None = None) -> Writers:
        self._futures = [self._pool.submit(self._run, w, per_thread) for w in range(self.threads)]
        return self

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def wait_for_more(self, more: int, timeout_s: float, what: str) -> None:
        """Wait until `more` puts beyond those acknowledged now are (fail naming `what`)."""
        target = self.count() + more
        wait_until(self.count, timeout_s, what, lambda n: n >= target)

    def _run(self, writer: int, limit: int | None) -> None:
        with self.cluster.client(timeout_s=10.0) as client:
            i = 0
            while not self._stop.is_set() and (limit is None or i < limit):
                body = body_for(f"{self.topic}/w{writer}/{i}", self.body_bytes)
                started = time.monotonic()
                try:
                    if self.keyed:
                        result = client.put(
                            self.topic, body, keys=[f"w{writer}-{i}"], tags=f"T{i % 3}"
                        )
                    else:
                        result = client.put(self.topic, body)
                except ClientError as exc:  # failover: outcome unknown or unavailable
                    with self._lock:
                        self.errors.append(exc)
                else:
                    seconds = time.monotonic() - started
                    with self._lock:
                        self.acked.append(Acked(body, result, started, seconds))
                i += 1

    def join(self, stop: bool = False) -> list[Acked]:
        """Wait for the writers (after telling them to stop, if `stop`); returns the acked puts.

        A writer's unexpected exception (anything but a ClientError) fails here.
        """
        if stop:
            self._stop.set()
        try:
            for f in self._futures:
                f.result(timeout=60.0)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        return list(self.acked)


def check_acked(acked: list[Acked], messages: dict[int, StoredMessage], where: str) -> None:
    """Every acknowledged put lies at the offset it was acknowledged with, with its body."""
    offsets = [a.result.commitlog_offset for a in acked]
    assert len(set(offsets)) == len(offsets), "two acknowledged puts share an offset"
    missing = [a for a in acked if a.result.commitlog_offset not in messages]
    assert not missing, f"{where}: {len(missing)} acknowledged puts are gone, e.g. {missing[:3]}"
    wrong = [a for a in acked if messages[a.result.commitlog_offset].body != a.body]
    assert not wrong, f"{where}: {len(wrong)} acknowledged offsets hold other bodies: {wrong[:3]}"
