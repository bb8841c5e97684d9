"""Transactional messages: half messages, commit or rollback, check-back, over Raft.

RocketMQ's two-phase transactional messages. `put_half` stores the message in
the system topic `%SYS%TRANS_HALF` (RMQ_SYS_TRANS_HALF_TOPIC) with its real
topic and queue and the producer group in properties (REAL_TOPIC, REAL_QID,
PGROUP, TRAN_MSG): no consumer sees it (system topics are admin-only and never
dispatched to the real queue). The transaction id is the producer's UNIQ_KEY;
the half's own UNIQ_KEY is "half:" + it.

`end` (the leader's, on a producer's commit or rollback, a check answer, or the
check limit) decides once per transaction and records the decision as an op
message in `%SYS%TRANS_OP` with UNIQ_KEY "op:" + id (RocketMQ's op messages).
A commit first puts the real message under the producer's UNIQ_KEY: a message of
that key in the real topic *is* the commit, so a commit is visible exactly once
(a repeated commit finds it and puts nothing) and a rollback is refused once it
is there (a commit whose op message was lost in a failover is then repaired,
never rolled back). Before deciding, the leader settles its view
(SystemLog.settle) once per leadership and waits for dispatch to catch up with
what is committed, so the key index answers for everything decided before.

Check-back: `TransactionService.pass_once` (every node runs the loop; it acts
only while leading) walks the halves past its progress. A half still undecided
`check_timeout_ms` after it was stored is checked with a producer of its group
(through `CheckRegistry`, fed by the producers' check streams) and checked again
every `check_interval_ms`; each check is recorded as an op message
("chk:<id>:<n>"), so the count survives failover; after `max_checks` checks the
transaction is rolled back. The progress past decided halves is a `%SYS%TRANS`
group offset. Clock skew between leaders shifts check times, never outcomes.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from dledger_commitlog.common.protocol import PutResult
from dledger_commitlog.messaging.system_log import SystemLog, run_passes
from raft.errors import NotLeader
from store.errors import InvalidMessage
from store.message import PROPERTY_UNIQ_KEY, StoredMessage

log = logging.getLogger(__name__)

WAITING_SCAN = 2_000  # halves `waiting` reads at most

HALF_TOPIC = "%SYS%TRANS_HALF"
OP_TOPIC = "%SYS%TRANS_OP"
TRANS_GROUP = "%SYS%TRANS"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION = "TRAN_MSG"
HALF_KEY_PREFIX = "half:"
OP_KEY_PREFIX = "op:"
COMMIT = "commit"
ROLLBACK = "rollback"
_HALF_PROPS = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION,
)
_POLL_S = 0.1
_BATCH = 256


class UnknownTransaction(InvalidMessage):
    """No half message with that transaction id at that offset."""


class TransactionConflict(Exception):
    """The transaction was already decided the other way."""


@dataclass(frozen=True, slots=True)
class Ended:
    """A decision: its outcome, the real message's put result on commit, and whether
    this call found it already taken (`duplicate`)."""

    outcome: str
    result: PutResult | None
    duplicate: bool


@dataclass(frozen=True, slots=True)
class CheckRequest:
    transaction_id: str
    half_offset: int
    topic: str
    check_times: int
    message: StoredMessage


def half_properties(
    properties: dict[str, str], topic: str, queue_id: int | None, producer_group: str
) -> dict[str, str]:
    """A half message's properties: the producer's plus where it goes once committed."""
    if not producer_group:
        raise InvalidMessage("a transactional put needs a producer group")
    clash = sorted(set(properties) & set(_HALF_PROPS))
    if clash:
        raise InvalidMessage(f"properties {clash} are reserved for transactional messages")
    props = {
        **properties,
        PROPERTY_REAL_TOPIC: topic,
        PROPERTY_PRODUCER_GROUP: producer_group,
        PROPERTY_TRANSACTION: "true",
    }
    if queue_id is not None:
        props[PROPERTY_REAL_QID] = str(queue_id)
    return props


class CheckRegistry:
    """Producers' open check streams, per producer group."""

    def __init__(self) -> None:
        self._streams: dict[str, list[asyncio.Queue[CheckRequest]]] = collections.defaultdict(list)
        self._turn = 0

    def open(self, group: str) -> asyncio.Queue[CheckRequest]:
        q: asyncio.Queue[CheckRequest] = asyncio.Queue(maxsize=1024)
        self._streams[group].append(q)
        return q

    def close(self, group: str, q: asyncio.Queue[CheckRequest]) -> None:
        streams = self._streams.get(group, [])
        if q in streams:
            streams.remove(q)

    def connected(self, group: str) -> int:
        return len(self._streams.get(group, []))

    def ask(self, group: str, request: CheckRequest) -> bool:
        """Hand a check to one producer of `group` (round robin); False if none is there."""
        streams = [q for q in self._streams.get(group, []) if not q.full()]
        if not streams:
            return False
        self._turn += 1
        streams[self._turn % len(streams)].put_nowait(request)
        return True


class TransactionService:
    def __init__(
        self,
        log_view: SystemLog,
        registry: CheckRegistry,
        *,
        check_timeout_ms: int = 6_000,
        check_interval_ms: int = 60_000,
        max_checks: int = 15,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        timeout_s: float = 5.0,
    ) -> None:
        self._log = log_view
        self.registry = registry
        self._check_timeout_ms = check_timeout_ms
        self._check_interval_ms = check_interval_ms
        self._max_checks = max_checks
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s
        self._term: int | None = None
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # decisions per id
        self._next = 0  # half queue offset: every half before it is decided
        self._checks: dict[str, int] = {}  # checks recorded, per transaction (this term)
        self._decided: set[int] = set()  # half queue offsets decided (this term)
        self.pending = 0  # undecided halves seen by the last pass
        self.wakeup = asyncio.Event()

    # -- deciding ------------------------------------------------------------------------

    async def _leading(self) -> None:
        term = self._log.leading_term()
        if term is None:
            self._term = None
            raise NotLeader(None)
        if term != self._term:
            await self._log.settle(self._timeout_s)
            self._next = self._log.group_offset(TRANS_GROUP, HALF_TOPIC, 0)
            self._checks, self._decided = {}, set()
            self._term = term
        else:
            await self._log.caught_up(self._timeout_s)

    def _half(self, transaction_id: str, half_offset: int) -> StoredMessage:
        msg = self._log.message_at(half_offset)
        if (
            msg is None
            or msg.topic != HALF_TOPIC
            or msg.uniq_key != HALF_KEY_PREFIX + transaction_id
        ):
            raise UnknownTransaction(
                f"no half message of transaction {transaction_id!r} at offset {half_offset}"
            )
        return msg

    def waiting(self) -> dict[str, tuple[int, int]]:
        """Per producer group: the half messages not decided yet and the store time of
        the oldest, as this node's log says (past the committed progress, a half whose
        op message or real message is there is decided). At most WAITING_SCAN halves
        are looked at."""
        low, _end = self._log.queue_bounds(HALF_TOPIC, 0)
        start = max(low, self._log.group_offset(TRANS_GROUP, HALF_TOPIC, 0))
        out: dict[str, tuple[int, int]] = {}
        for unit in self._log.units(HALF_TOPIC, 0, start, WAITING_SCAN):
            half = self._log.message(unit)
            tx = (half.uniq_key or "").removeprefix(HALF_KEY_PREFIX)
            if self._decided_as(tx, half)[0] is not None:
                continue
            group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
            count, oldest = out.get(group, (0, 0))
            out[group] = (count + 1, oldest or half.store_timestamp_ms)
        return out

    def _decided_as(self, transaction_id: str, half: StoredMessage) -> tuple[str | None, bool]:
        """(outcome so far, whether its op message is in the log)."""
        found = self._log.find(OP_TOPIC, OP_KEY_PREFIX + transaction_id)
        if found is not None:
            return str(json.loads(found[1].body)["outcome"]), True
        if self._log.find(half.properties[PROPERTY_REAL_TOPIC], transaction_id) is not None:
            return COMMIT, False  # committed; its op message was lost with a leader
        return None, False

    async def end(
        self, transaction_id: str, half_offset: int, commit: bool, by: str = "producer"
    ) -> Ended:
        """Commit or roll back, once: raises UnknownTransaction, TransactionConflict,
        NotLeader (the caller forwards), or a put's failure (retry: it is idempotent)."""
        entry = self._locks.get(transaction_id)
        if entry is None:
            entry = self._locks[transaction_id] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                await self._leading()
                return await self._end(transaction_id, half_offset, commit, by)
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[transaction_id]

    async def _end(self, tx: str, half_offset: int, commit: bool, by: str) -> Ended:
        half = self._half(tx, half_offset)
        wanted = COMMIT if commit else ROLLBACK
        outcome, recorded = self._decided_as(tx, half)
        if outcome is not None and outcome != wanted:
            raise TransactionConflict(f"transaction {tx!r} was already {outcome_text(outcome)}")
        specs = []
        result: PutResult | None = None
        if outcome is None and commit:
            props = {k: v for k, v in half.properties.items() if k not in _HALF_PROPS}
            props[PROPERTY_UNIQ_KEY] = tx
            qid = half.properties.get(PROPERTY_REAL_QID)
            specs.append(
                self._log.prepare(
                    half.properties[PROPERTY_REAL_TOPIC],
                    half.body,
                    props,
                    uniq_key=tx,
                    queue_id=int(qid) if qid else None,
                    born_timestamp_ms=half.born_timestamp_ms,
                    flag=half.flag,
                    born_host=half.born_host,
                )
            )
        if not recorded:
            body = {"tx": tx, "half": half_offset, "outcome": wanted, "by": by}
            specs.append(
                self._log.prepare(
                    OP_TOPIC, json.dumps(body).encode(), {}, uniq_key=OP_KEY_PREFIX + tx, queue_id=0
                )
            )
        if specs:
            results = await self._log.put(specs, self._timeout_s)
            if outcome is None and commit:
                result = results[0]
            self.wakeup.set()
        if result is None and wanted == COMMIT:
            found = self._log.find(half.properties[PROPERTY_REAL_TOPIC], tx)
            result = None if found is None else self._log.result_of(found[0])
        return Ended(wanted, result, outcome is not None)

    # -- checking back -------------------------------------------------------------------

    async def run(self) -> None:
        await run_passes(
            "transaction check",
            self._log.node_id,
            self.pass_once,
            self.wakeup,
            _POLL_S,
            self._resettle,
            self.busy,
            self._log.next_commit,
        )

    def busy(self) -> bool:
        """Whether a pass may have work: this node leads and has not settled yet, or a
        stored half is undecided (or not read yet)."""
        term = self._log.leading_term()
        if term is None:
            return False
        return (
            term != self._term
            or self.pending > 0
            or self._log.queue_end(HALF_TOPIC, 0) > self._next
        )

    def _resettle(self) -> None:
        self._term = None
        self.pending = 0

    async def pass_once(self) -> int:
        """Check or roll back undecided halves that are due; returns how many were acted on."""
        if self._log.leading_term() is None:
            self._term = None
            self.pending = 0
            return 0
        await self._leading()
        now = self._clock_ms()
        acted = 0
        offset = self._next
        prefix_decided = True
        pending = 0
        while True:
            units = self._log.units(HALF_TOPIC, 0, offset, _BATCH)
            for k, unit in enumerate(units):
                q = offset + k
                if q not in self._decided:
                    half = self._log.message(unit)
                    tx = (half.uniq_key or "").removeprefix(HALF_KEY_PREFIX)
                    outcome, recorded = self._decided_as(tx, half)
                    if outcome is not None and recorded:
                        self._decided.add(q)
                    else:
                        pending += 1
                        acted += await self._check(tx, unit.commitlog_offset, half, outcome, now)
                if q in self._decided and prefix_decided:
                    self._next = q + 1
                else:
                    prefix_decided = False
            offset += len(units)
            if len(units) < _BATCH:
                break
        self.pending = pending
        stored = self._log.group_offset(TRANS_GROUP, HALF_TOPIC, 0)
        if self._next > stored:
            await self._log.put(
                [self._log.offset_commit(TRANS_GROUP, HALF_TOPIC, 0, self._next)], self._timeout_s
            )
            self._decided = {q for q in self._decided if q >= self._next}
        return acted

    async def _check(
        self, tx: str, half_offset: int, half: StoredMessage, outcome: str | None, now: int
    ) -> int:
        if outcome == COMMIT:  # committed, op message lost: record it
            await self.end(tx, half_offset, True, by="repair")
            return 1
        done = self._checks.get(tx)
        if done is None:
            done = 0
            while self._log.find(OP_TOPIC, _check_key(tx, done + 1)) is not None:
                done += 1
            self._checks[tx] = done
        due = half.store_timestamp_ms + self._check_timeout_ms + done * self._check_interval_ms
        if now < due:
            return 0
        if done >= self._max_checks:
            log.warning("transaction %s: no answer after %d checks: rolled back", tx, done)
            await self.end(tx, half_offset, False, by="check-limit")
            return 1
        body = {"tx": tx, "half": half_offset, "check": done + 1}
        await self._log.put(
            [
                self._log.prepare(
                    OP_TOPIC,
                    json.dumps(body).encode(),
                    {},
                    uniq_key=_check_key(tx, done + 1),
                    queue_id=0,
                )
            ],
            self._timeout_s,
        )
        self._checks[tx] = done + 1
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        self.registry.ask(group, CheckRequest(tx, half_offset, topic, done + 1, half))
        return 1


def _check_key(tx: str, n: int) -> str:
    return f"chk:{tx}:{n}"


def outcome_text(outcome: str) -> str:
    return "committed" if outcome == COMMIT else "rolled back"
