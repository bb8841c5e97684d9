"""What the dispatcher tests (tests/test_dispatch*.py) share: `LocalLog`, a one-replica
commit log on a real entry store whose "Raft" commits when the test says so (puts go
through the real put path, `DLedgerCommitLog.prepare/put`), its `LAYOUT`, seeded
`messages`, and `files_of`, the consume-queue and index files of a node's directory.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import cast

from dispatch.dispatcher import Dispatcher
from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.log import reads
from dledger_commitlog.log.commitlog import DLedgerCommitLog, Draft
from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.verify import write_layout
from raft import HardState, ProposalDropped, RaftCore
from raft.types import Entry, EntryKind
from raftio.hard_state import RaftStateFile

LAYOUT = {
    "data_segment_bytes": 1 << 20,
    "index_segment_bytes": 32 * 4096,
    "cq_units_per_file": 50,
    "index_slots": 64,
    "index_entries": 150,
}


class _OneReplica:
    """What the commit log asks of its Raft core, for a log of one replica in term 1:
    a proposal is appended at once and commits on `LocalLog.commit()`."""

    term = 1

    def __init__(self, log: LocalLog) -> None:
        self._log = log

    def propose(self, datas: list[bytes]) -> tuple[int, int]:
        if not datas:  # as RaftCore.propose, which drops an empty batch
            raise ProposalDropped("empty batch")
        store = self._log.store
        first = store.last_index() + 1
        entries = [Entry(first + k, 1, d, EntryKind.NORMAL) for k, d in enumerate(datas)]
        store.append_entries(entries)
        self._log._pending.extend(entries)
        return first, first + len(datas) - 1


class LocalLog:
    """A one-replica commit log: puts are appended at once and commit on `commit()`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        write_layout(root, LAYOUT)
        self.store = EntryStore(
            root / "commitlog",
            data_segment_bytes=LAYOUT["data_segment_bytes"],
            index_segment_bytes=LAYOUT["index_segment_bytes"],
        )
        self.cl = DLedgerCommitLog(
            self.store,
            store_host=("127.0.0.1", 9000),
            queues_per_topic=4,
            max_message_bytes=1 << 16,
            max_pending=100_000,
            idempotency_window=1000,
            core=cast(RaftCore, _OneReplica(self)),
        )
        self.cl.start_at(self.store.last_index())
        self.cl.become_leader(1, [])
        self._pending: list[Entry] = []

    def put(self, messages: list[dict[str, object]], commit: bool = True) -> list[PutResult]:
        async def run() -> list[PutResult]:
            specs = [self.cl.prepare(Draft(**m)) for m in messages]  # type: ignore[arg-type]
            task = asyncio.ensure_future(self.cl.put(specs, 5.0))
            for _ in range(10):  # the put proposes its batch within a few loop passes
                if len(self._pending) >= len(specs):
                    break
                await asyncio.sleep(0)
            assert len(self._pending) == len(specs)
            if not commit:
                task.cancel()
                return []
            self.commit()
            return await task

        return asyncio.run(run())

    def commit(self, upto: int | None = None) -> None:
        upto = self.store.last_index() if upto is None else upto
        now = [e for e in self._pending if e.index <= upto]
        self._pending = [e for e in self._pending if e.index > upto]
        self.cl.apply(now)
        RaftStateFile(self.root / "raft.state").save(HardState(1, 1, upto))

    def dispatcher(self) -> Dispatcher:
        return Dispatcher(
            self.root,
            self.cl,
            units_per_file=LAYOUT["cq_units_per_file"],
            index_slots=LAYOUT["index_slots"],
            index_entries=LAYOUT["index_entries"],
        )

    def pull(
        self,
        d: Dispatcher,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: frozenset[str] | None,
        *,
        end_offset: int = 0,
    ) -> reads.Found:
        """A Pull's answer as a node serves it: `reads.pull_scan` over views of `d`
        and of the commit log."""
        queue = reads.queue_view(d, topic, queue_id, LAYOUT["cq_units_per_file"])
        return reads.pull_scan(
            queue,
            reads.log_view(self.cl),
            offset,
            max_messages,
            tags,
            max_bytes=4 << 20,
            end_offset=end_offset,
        )

    def close(self) -> None:
        self.store.close()


def messages(n: int, seed: int, topics: int = 3) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [
        {
            "topic": f"t{rng.randrange(topics)}",
            "body": f"body-{seed}-{i}".encode() * rng.randrange(1, 20),
            "keys": [f"k{i}", f"user{i % 7}"][: rng.randrange(0, 3)],
            "tags": rng.choice([None, "TagA", "TagB"]),
            "uniq_key": f"U{seed}-{i}",
            "born_timestamp_ms": 1_700_000_000_000 + i,
        }
        for i in range(n)
    ]


def files_of(root: Path) -> dict[str, bytes]:
    out = {}
    for sub in ("consumequeue", "index"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out
