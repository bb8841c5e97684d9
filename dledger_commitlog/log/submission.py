"""One caller's puts on their way through the commit log, and what they came to.

Owns `Submission` (the puts one caller handed over at once: their results by slot,
delivered into the caller's future when the last one commits, or the first failure)
and `Waiter` (one slot waiting for the entry at one index: the term it was proposed
in). A committed entry resolves its waiters directly: no future, callback or loop
pass per message; a batch of a thousand puts is one future. The put exceptions
(`PutFailed`, `OutcomeUnknown`, `Overloaded`) live here too.

Invariants: `done` is settled once (the results, the first failure, OutcomeUnknown at
the deadline, or cancelled by a caller that stopped waiting); what resolves after
that is dropped unseen; once `done` is settled the submission no longer counts as in
flight (`on_settled(count)`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from dledger_commitlog.common.protocol import PutResult


class PutFailed(Exception):
    """Definitely not stored (another entry took its place): safe to retry."""


class OutcomeUnknown(Exception):
    """Not committed before the deadline; it may still commit. Retry with the same key."""


class Overloaded(Exception):
    """Too many puts in flight."""


def fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail a put's future, marked as seen: its caller may have stopped waiting (a
    timeout, a cancelled RPC), and a failure nobody awaits is no error to log."""
    fut.set_exception(exc)
    fut.exception()


class Submission:
    """The puts of one caller (see the module docstring)."""

    __slots__ = ("_count", "_on_settled", "_results", "_timer", "done", "left")

    def __init__(
        self,
        count: int,
        done: asyncio.Future[list[PutResult]],
        timeout_s: float,
        on_settled: Callable[[int], None],
    ) -> None:
        self._results: list[PutResult | None] = [None] * count
        self._count = self.left = count
        self.done = done
        self._on_settled = on_settled
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._late, timeout_s)
        done.add_done_callback(self._settled)
        if not count:
            done.set_result([])

    def set(self, slot: int, result: PutResult) -> None:
        """Slot `slot` committed with `result`."""
        done = self.done
        if done.done():
            return
        self._results[slot] = result
        self.left -= 1
        if not self.left:
            done.set_result(cast(list[PutResult], self._results))

    def fail(self, exc: BaseException) -> None:
        """A slot failed: so does the submission (the first failure is the one told)."""
        if not self.done.done():
            fail(self.done, exc)

    def _late(self, timeout_s: float) -> None:
        self.fail(
            OutcomeUnknown(
                f"not committed within {timeout_s:.1f}s; it may still be: "
                "retry with the same uniq_key"
            )
        )

    def _settled(self, _done: asyncio.Future[list[PutResult]]) -> None:
        self._timer.cancel()
        self._on_settled(self._count)


class Waiter:
    """Slot `slot` of `submission`, waiting for the entry proposed in `term` at an index;
    `duplicate`: its put carried a UNIQ_KEY already in the log (answered with that entry)."""

    __slots__ = ("duplicate", "slot", "submission", "term")

    def __init__(self, term: int, submission: Submission, slot: int, duplicate: bool = False):
        self.term, self.submission, self.slot, self.duplicate = term, submission, slot, duplicate
