"""What the GroupState tests (tests/test_group_state*.py) share: a group "g" over topics
A (4 queues) and B (2), its settings, a state on a fake `QueueSource`, and the calls
a test makes as a member and as the service does (`join`, `deliver`), with views of
who holds what (`owners`, `where`).
"""

from __future__ import annotations

from dledger_commitlog.messaging.group_lease import Lease
from dledger_commitlog.messaging.group_state import (
    Claim,
    Epochs,
    GroupState,
    QueueSource,
    Settings,
    retry_topic,
)

GROUP = "g"
RETRY = retry_topic(GROUP)
SESSION_MS = 3000
ACK_WAIT_MS = 5000
QUEUES = {"A": 4, "B": 2}
ALL_A = {"A": ("TAG", "*")}
ALL_B = {"B": ("TAG", "*")}
ALL_AB = {**ALL_A, **ALL_B}
CONCURRENT = Settings(ack_wait_ms=ACK_WAIT_MS)
ORDERLY = Settings(orderly=True, ack_wait_ms=ACK_WAIT_MS)


def source(committed: dict[tuple[str, int], int] | None = None) -> QueueSource:
    offsets = committed or {}
    return QueueSource(
        lambda topic: 1 if topic.startswith("%") else QUEUES[topic],
        lambda group, topic, queue_id: offsets.get((topic, queue_id), 0),
    )


def state(
    term: int = 1, grace_until_ms: int = 0, committed: dict[tuple[str, int], int] | None = None
) -> GroupState:
    return GroupState(
        GROUP,
        source(committed),
        Epochs(term),
        session_timeout_ms=SESSION_MS,
        grace_until_ms=grace_until_ms,
    )


def join(
    s: GroupState,
    member: str,
    now_ms: int,
    subs: dict[str, tuple[str, str]] = ALL_AB,
    settings: Settings = CONCURRENT,
    claims: tuple[Claim, ...] = (),
) -> list[tuple[str, int]]:
    return [x.ref for x in s.heartbeat(member, "host:1", subs, settings, claims, now_ms)]


def owners(s: GroupState) -> dict[tuple[str, int], str | None]:
    return {ref: x.owner for ref, x in sorted(s.leases.items())}


def where(lease: Lease) -> tuple[str | None, str | None, int]:
    """Who holds the lease, whom it goes to, its cursor (read afresh each time)."""
    return lease.owner, lease.target, lease.cursor


def deliver(
    s: GroupState, member: str, now_ms: int, end: int = 10, batch: int = 32
) -> dict[tuple[str, int], list[int]]:
    """A fetch as the service does it, every message of the queues up to `end`: the
    offsets delivered per queue (redeliveries first)."""
    out: dict[tuple[str, int], list[int]] = {}
    for read in s.plan_fetch(member, batch, now_ms):
        new = list(range(read.start, min(end, read.start + read.count)))
        delivered = [*read.redeliver, *new]
        nxt = read.start + len(new)
        assert s.record(member, read, delivered, [], nxt, now_ms) is not None
        if delivered:
            out[(read.topic, read.queue_id)] = delivered
    return out
