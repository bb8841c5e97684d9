"""Drain: a node that campaigns for nothing and hands over what it leads (docs/upgrades.md).

Owns `Drain`, one shard's drained flag on this node and the hand-over a drain
starts. A drained node follows, votes and replicates like any other; its core may
not campaign (a `TimeoutNow` sent to it is ignored), and its heartbeat answers say
so (`raft.HeartbeatResponse.no_lead`), so that no leader transfers to it, not even
as the shard's preferred leader. Draining the shard's leader hands the leadership
to a voter that may lead (its last heartbeat answer said so and it was heard from
within the election timeout), the most caught up first; the transfer itself is the
core's (`RaftCore.transfer_leadership`: bring the target up to date, then
`TimeoutNow`), so the term moves by one and no election timeout passes.

Invariants:
- a follower's drain returns once a heartbeat answer has told the leader (or after an
  election timeout without one): a hand-over asked of that leader next never picks it.
- a drain that would leave the shard without a voter that may lead (the only voter;
  the others drained, down or not heard from; no leader known) is refused with
  `DrainRefused` and changes nothing; a hand-over that does not finish in time
  (TimeoutError) leaves the node undrained, as it was.
- the flag lives in this process's memory: a restarted node is a new process and
  starts undrained, unless it is started drained (`NodeConfig.drained`, `dledger
  serve --drained`), as `dledger cluster rolling-restart` does, so that it does
  not campaign before it has caught up; `undrain` then ends it.
- a node whose log is damaged (`damaged()`) stays out of elections, drained or not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from raft import HeartbeatResponse, Message, RaftCore, Role


class DrainRefused(Exception):
    """The drain would leave the shard without a voter that may lead (nothing changed)."""


class Drain:
    """A shard's drained flag on this node and the hand-over a drain starts."""

    def __init__(
        self,
        core: RaftCore,
        *,
        drained: bool,
        damaged: Callable[[], bool],
        transfer: Callable[[int, float], Awaitable[int]],
        election_timeout_s: float,
        tick_s: float,
    ) -> None:
        self._core = core
        self._damaged = damaged
        self._transfer = transfer
        self._election_timeout_s = election_timeout_s
        self._tick_s = tick_s
        self._drained = False
        self.set(drained)
        self.waiting = False  # a drain waits for a heartbeat answer to leave (`sent`)
        self._told = asyncio.Event()

    @property
    def drained(self) -> bool:
        return self._drained

    def set(self, drained: bool) -> None:
        """Drain or undrain now, without handing anything over (`drain` does that)."""
        self._drained = drained
        self._core.may_campaign = not drained and not self._damaged()

    async def drain(self, drained: bool, timeout_s: float, dry_run: bool = False) -> bool:
        """Drain (`drained`) this shard here: if this node leads it, hand the leadership
        to a voter that may lead and return once that one leads (True: it moved); or
        undrain. `dry_run`: only check that it could be done. DrainRefused,
        TimeoutError."""
        if not drained:
            if not dry_run:
                self.set(False)
            return False
        core = self._core
        if core.role is not Role.LEADER:
            if core.leader_id is None and not self._drained:
                raise DrainRefused(
                    "the shard has no leader now (an election is under way): "
                    "drain once one is elected"
                )
            if not dry_run:
                self.set(True)
                await self._tell_leader()
            return False
        target = await self._target()
        if dry_run:
            return False
        was = self._drained
        self.set(True)
        try:
            await self._transfer(target, timeout_s)
        except BaseException:
            self.set(was)
            raise
        return True

    def sent(self, messages: Sequence[Message]) -> None:
        """The node sends `messages` (only while `waiting`): a heartbeat answer saying
        this node will not lead ends the wait of `_tell_leader`."""
        if any(isinstance(m, HeartbeatResponse) and m.no_lead for m in messages):
            self._told.set()

    async def _tell_leader(self) -> None:
        """Wait until a heartbeat answer has told the leader that this node will not lead
        (an election timeout at most), so that the leader, asked to hand over right
        after, does not pick this node."""
        self._told.clear()
        self.waiting = True
        try:
            await asyncio.wait_for(self._told.wait(), self._election_timeout_s)
        except TimeoutError:
            pass  # no heartbeat meanwhile (a leader lost): the next answer will tell
        finally:
            self.waiting = False

    async def _target(self) -> int:
        """The voter to hand over to: one that may lead and answered lately, the most
        caught up (DrainRefused). Waits up to an election timeout for one (a new
        leader has no answers yet; recent activity is counted afresh every timeout)."""
        core = self._core
        others = [v for v in core.membership.voters if v != core.id]
        if not others:
            raise DrainRefused(f"node {core.id} is the shard's only voter: nobody can take over")
        deadline = time.monotonic() + self._election_timeout_s
        while True:
            progress = core.progress
            ready = [v for v in others if progress[v].may_lead and progress[v].recent_active]
            if ready:
                return max(ready, key=lambda v: progress[v].match)
            if time.monotonic() >= deadline or core.role is not Role.LEADER:
                break
            await asyncio.sleep(self._tick_s)
        drained = [v for v in others if progress[v].may_lead is False]
        silent = [v for v in others if v not in drained]
        why = []
        if drained:
            why.append(f"drained or kept from leading: {_ids(drained)}")
        if silent:
            why.append(f"not heard from: {_ids(silent)}")
        raise DrainRefused(
            f"no other voter can lead the shard ({'; '.join(why)}): "
            f"draining node {core.id} would leave it without a leader"
        )


def _ids(nodes: list[int]) -> str:
    return ", ".join(f"node {n}" for n in nodes)
