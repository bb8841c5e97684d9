"""The put path on a one-replica commit log (tests/dispatch_helpers.py's `LocalLog`):
queue offsets and the idempotency window across a restart and a new leadership, a
retry answered by the entry a dead leader appended, the same uniq_key twice in one
batch, and a put that times out or is cancelled (its entry still commits or is
replaced, and no error is left unretrieved).
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.log.commitlog import Draft, OutcomeUnknown, PutSpec
from raft.types import Entry, EntryKind
from store.entry_format import HEADER_SIZE
from tests.dispatch_helpers import LocalLog


def test_a_new_leadership_assigns_queue_offsets_after_the_committed_ones(tmp_path: Path) -> None:
    """The leader's tables load before the first put of a term takes queue offsets
    (before, a put racing the leadership's first Ready reused offset 0). The node
    starts a leadership right after the step or tick that begins it, before any put
    is assigned offsets: here that is the become_leader call before the put."""
    first = LocalLog(tmp_path / "node")
    first.put([{"topic": "t", "body": b"x", "uniq_key": f"a{i}", "queue_id": 0} for i in range(5)])
    first.close()
    again = LocalLog(tmp_path / "node")  # its leader tables are empty (loaded before dispatch)
    try:
        d = again.dispatcher()
        d.recover(again.cl.committed_pos)
        d.catch_up()
        again.cl.load_committed(again.store.last_index(), d.max_offsets())
        again.cl.become_leader(2, [])
        (r,) = again.put([{"topic": "t", "body": b"y", "uniq_key": "b", "queue_id": 0}])
        assert r.queue_offset == 5
        d.catch_up()
        assert d.queue("t", 0) is not None and d.queue("t", 0).max_offset == 6  # type: ignore[union-attr]
    finally:
        again.close()


def test_a_restart_reloads_the_idempotency_window_from_the_log_tail(tmp_path: Path) -> None:
    first = LocalLog(tmp_path / "node")
    sent: list[dict[str, object]] = [
        {
            "topic": "t",
            "body": b"UNIQ_KEY\x01fake",
            "uniq_key": f"key-{i}",
            "properties": {"MY_UNIQ_KEY": "no"},
            "keys": ["a"],
            "tags": "T",
        }
        for i in range(30)
    ]
    results = first.put(sent)
    first.close()
    again = LocalLog(tmp_path / "node")
    try:
        again.cl.load_committed(again.store.last_index(), {})
        (dup,) = asyncio.run(
            again.cl.put([again.cl.prepare(Draft(**sent[7]))], 1.0)  # type: ignore[arg-type]
        )
        assert dup.duplicate and dup.commitlog_offset == results[7].commitlog_offset
    finally:
        again.close()


def test_a_retry_reaching_a_new_leader_before_its_first_proposal_is_stored_once(
    tmp_path: Path,
) -> None:
    """The old leader appended a put's first attempt and died; the new leader holds
    it in its uncommitted tail. A retry must be answered by that entry, not appended
    again (a chaos leader-kill run found the UNIQ_KEY stored twice). The node loads
    the tail when the leadership starts (right after the step or tick that begins it),
    before any put is assigned: here the become_leader call before the retries."""
    log = LocalLog(tmp_path / "node")

    def spec() -> PutSpec:
        return log.cl.prepare(Draft("t", b"once", "K"))

    errors: list[dict[str, object]] = []  # e.g. a batch proposed with nothing left in it

    async def run() -> list[PutResult]:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        first = asyncio.ensure_future(log.cl.put([spec()], 5.0))
        for _ in range(10):
            if log.store.last_index() == 1:
                break
            await asyncio.sleep(0)
        first.cancel()  # the old leader died: its client gives up on this attempt
        log.cl.become_leader(2, [])  # the tables of a node that has not led yet
        tail = list(log._pending)  # the first attempt, appended and not committed
        log.cl.become_leader(3, tail)
        retries = [asyncio.ensure_future(log.cl.put([spec()], 5.0)) for _ in range(2)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert log.store.last_index() == 1, "the retry was appended again"
        log.commit()
        return [(await r)[0] for r in retries]

    try:
        results = asyncio.run(run())
        assert [(r.duplicate, r.commitlog_offset) for r in results] == [(True, HEADER_SIZE)] * 2
        assert not errors, errors
    finally:
        log.close()


def test_the_same_uniq_key_twice_in_one_batch_is_stored_once(tmp_path: Path) -> None:
    log = LocalLog(tmp_path / "node")

    async def run() -> list[PutResult]:
        puts = [log.cl.put([log.cl.prepare(Draft("t", b"x", "K"))], 5.0) for _ in range(3)]
        tasks = [asyncio.ensure_future(p) for p in puts]
        for _ in range(10):
            await asyncio.sleep(0)
        assert log.store.last_index() == 1
        log.commit()
        return [(await t)[0] for t in tasks]

    try:
        results = asyncio.run(run())
        assert [r.duplicate for r in results] == [False, True, True]
        assert len({r.commitlog_offset for r in results}) == 1
    finally:
        log.close()


def test_a_put_past_its_timeout_is_unknown_and_its_entry_still_commits(tmp_path: Path) -> None:
    """The caller stops waiting (OutcomeUnknown), the entry does not go away: a retry
    with the same uniq_key is answered by it. A put abandoned that way and failed
    later (a newer leader replaced its entry) leaves no unretrieved error behind."""
    log = LocalLog(tmp_path / "node")
    errors: list[dict[str, object]] = []

    async def run() -> PutResult:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        specs = [log.cl.prepare(Draft("t", b"slow", f"S{i}")) for i in range(3)]
        with pytest.raises(OutcomeUnknown, match="retry with the same uniq_key"):
            await log.cl.put(specs, 0.05)
        assert log.store.last_index() == 3  # proposed, not committed
        log.commit(2)
        (again,) = await log.cl.put([log.cl.prepare(Draft("t", b"slow", "S1"))], 5.0)
        # Entry 3 replaced by a newer leader's: its abandoned future fails unheard.
        gone = log._pending.pop()
        log.cl.apply([Entry(gone.index, 2, gone.data, EntryKind.NORMAL)])
        return again

    try:
        again = asyncio.run(run())
        gc.collect()
        assert again.duplicate and again.commitlog_offset > HEADER_SIZE
        assert not errors, errors
    finally:
        log.close()


def test_a_cancelled_put_whose_entry_is_replaced_leaves_no_unretrieved_error(
    tmp_path: Path,
) -> None:
    """The caller's task is cancelled (its client went away) while the put waits; the
    entry is later replaced by a newer leader's: its failure is heard by nobody, quietly."""
    log = LocalLog(tmp_path / "node")
    errors: list[dict[str, object]] = []

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        task = asyncio.ensure_future(log.cl.put([log.cl.prepare(Draft("t", b"c", "C"))], 5.0))
        for _ in range(10):
            if log._pending:
                break
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gone = log._pending.pop()
        log.cl.apply([Entry(gone.index, 2, gone.data, EntryKind.NORMAL)])

    try:
        asyncio.run(run())
        gc.collect()
        assert not errors, errors
    finally:
        log.close()
