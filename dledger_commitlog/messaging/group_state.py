"""Consumer groups as the leader keeps them: members, queue leases, deliveries, acks.

Owns `GroupState`, one consumer group in the leader's memory, and the rules of
clustering consumption (RocketMQ's rebalance, Kafka's and JetStream's words for
the same things). Pure: no I/O and no clock; every call is given `now_ms`, and what
it needs of the log (a queue's committed offset, how many queues a topic has) comes
through `QueueSource`. `messaging.groups.GroupService` does the I/O around it. One
queue's lease and the bookkeeping of its deliveries are a `group_lease.Lease`.

- Members heartbeat; one silent for `session_timeout_ms` is gone. The live
  members' queues are allocated by the group's strategy (`allocation.allocate`):
  the queues of each topic among the members that subscribe to it, and the group's
  retry queue among all of them.
- A queue is leased to one member at a time, with an epoch that grows with every
  grant (across leaders too: `Epochs` starts each term above the last). A queue
  that must move is *revoked* first: its owner gets no more of it, and it moves
  when the owner's deliveries are acked or nacked or their ack-wait ran out (or
  the owner is gone). So no two members consume a queue at once, and an ack,
  nack or offset commit under a lease the member no longer holds is refused
  (`StaleLease`).
- Deliveries: a queue's `cursor` is the next offset never delivered; below it an
  offset is in flight (delivered, with a deadline), or acked. The *frontier* is
  the lowest offset not yet acked; everything below it is done, and it is what
  the service commits through the Raft log as the group's offset. An in-flight
  message whose ack-wait passed is delivered again (concurrent mode).
- Orderly mode: a queue is served only while nothing of it is in flight, in
  offset order; a nack retries the message in place (the queue pauses for the
  delay, then delivers it and what follows again) up to the group's maximum.
  Once the ack-wait of all it has in flight passed, it delivers again from the
  frontier (a fetch's answer may have been lost: the queue must not stall).
- A new leader knows nothing of the old one's leases: for `session_timeout_ms`
  after it starts (`grace_until_ms`) it grants no queue and serves no fetch, and
  members claim the queues they hold in their heartbeats (adopted, with what they
  still have in flight; of two claims of a queue the one of the newer epoch
  wins: the other member lost it before the election). After that it serves and
  rebalances as usual.

Lost with a leader (and stated in docs/consumer-groups.md): acks not yet
committed as an offset (those messages are delivered again: at least once), and
the count of in-place retries of orderly mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dledger_commitlog.messaging.allocation import STRATEGIES, allocate, share_out
from dledger_commitlog.messaging.group_lease import Lease, QueueRef

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
DEFAULT_MAX_RECONSUME = 16
DEFAULT_ACK_WAIT_MS = 30_000
DEFAULT_FIRST_RETRY_LEVEL = 3
MAX_IN_FLIGHT_PER_QUEUE = 1024  # a member gets no more of a queue until it acks
NOBODY = ""  # a lease's target while it is revoked for no member (nobody subscribes)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


class GroupError(Exception):
    """A group request refused; the message says why."""


class StaleLease(GroupError):
    """The member does not hold the queue (any more) under that epoch; or is not a member."""


class UnknownMessage(GroupError):
    """An ack or nack of a message that was never delivered to the group."""


class GroupConflict(GroupError):
    """A member's settings disagree with the group's (strategy, mode)."""


@dataclass(frozen=True, slots=True)
class Settings:
    strategy: str = "average"
    orderly: bool = False
    max_reconsume: int = DEFAULT_MAX_RECONSUME
    ack_wait_ms: int = DEFAULT_ACK_WAIT_MS
    first_retry_level: int = DEFAULT_FIRST_RETRY_LEVEL


@dataclass(frozen=True, slots=True)
class Claim:
    """A queue a member says it holds (its heartbeat), for a new leader to adopt."""

    topic: str
    queue_id: int
    epoch: int
    next_offset: int
    in_flight: int
    unacked_from: int


@dataclass(slots=True)
class Member:
    member_id: str
    client: str
    subscriptions: dict[str, tuple[str, str]]  # topic -> (filter kind, expression)
    last_seen_ms: int


@dataclass(frozen=True, slots=True)
class Read:
    """What a fetch reads of one queue: `redeliver` offsets, then up to `count` from `start`."""

    topic: str
    queue_id: int
    epoch: int
    redeliver: tuple[int, ...]
    start: int
    count: int


class Epochs:
    """Lease epochs of one leader: above every epoch an earlier term could give."""

    def __init__(self, term: int) -> None:
        self.floor = term << 32  # every epoch of this term is above it, every older one not
        self._next = self.floor

    def next(self) -> int:
        self._next += 1
        return self._next


class QueueSource:
    """What the state needs of the log (the service gives the node's view)."""

    def __init__(
        self,
        queue_count: Callable[[str], int],
        start_offset: Callable[[str, str, int], int],
    ) -> None:
        self.queue_count = queue_count  # topic -> its queues
        self.start_offset = start_offset  # (group, topic, queue) -> where the group starts


class GroupState:
    """One consumer group on the leader (see the module docstring)."""

    def __init__(
        self,
        group: str,
        source: QueueSource,
        epochs: Epochs,
        *,
        session_timeout_ms: int,
        grace_until_ms: int,
    ) -> None:
        self.group = group
        self.settings = Settings()
        self.members: dict[str, Member] = {}
        self.leases: dict[QueueRef, Lease] = {}
        self.generation = 0
        self.session_timeout_ms = session_timeout_ms
        self.grace_until_ms = grace_until_ms
        self._source = source
        self._epochs = epochs
        self._plan: dict[QueueRef, str] = {}  # the allocation the leases move towards
        self._turn = 0  # which queue a fetch's remainder starts at (plan_fetch)

    # -- members ---------------------------------------------------------------------

    def heartbeat(
        self,
        member_id: str,
        client: str,
        subscriptions: Mapping[str, tuple[str, str]],
        settings: Settings,
        claims: Iterable[Claim],
        now_ms: int,
    ) -> list[Lease]:
        """Register or refresh a member; its leases now (GroupConflict, ValueError)."""
        if settings.strategy not in STRATEGIES:
            raise GroupConflict(
                f"unknown allocation strategy {settings.strategy!r}: one of {', '.join(STRATEGIES)}"
            )
        others = [m for m in self.members if m != member_id]
        if others and (settings.strategy, settings.orderly) != (
            self.settings.strategy,
            self.settings.orderly,
        ):
            mode = "orderly" if self.settings.orderly else "concurrent"
            raise GroupConflict(
                f"group {self.group!r} runs in {mode} mode with strategy "
                f"{self.settings.strategy!r} ({len(others)} live member(s)): a member "
                "must use the same strategy and mode"
            )
        self.settings = settings
        member = self.members.get(member_id)
        if member is None or member.subscriptions != dict(subscriptions):
            self.members[member_id] = Member(member_id, client, dict(subscriptions), now_ms)
            self._replan()
        else:
            member.last_seen_ms = now_ms
        for claim in claims:
            self._adopt(member_id, claim, now_ms)
        self.tick(now_ms)
        return self.leases_of(member_id)

    def leave(self, member_id: str, now_ms: int) -> None:
        """A member left on its own: its queues move at once (deliveries redelivered)."""
        if self.members.pop(member_id, None) is None:
            return
        self._release(member_id)
        self._replan()
        self.tick(now_ms)

    def leases_of(self, member_id: str) -> list[Lease]:
        return sorted(
            (x for x in self.leases.values() if x.owner == member_id), key=lambda x: x.ref
        )

    def _release(self, member_id: str) -> None:
        for lease in self.leases.values():
            if lease.owner == member_id:
                lease.owner = None
                lease.target = None
                lease.rewind()

    def _adopt(self, member_id: str, claim: Claim, now_ms: int) -> None:
        """A new leader takes a member's word for a queue it held under the old one."""
        ref = (claim.topic, claim.queue_id)
        if now_ms >= self.grace_until_ms or claim.epoch > self._epochs.floor:
            return  # claims are for the grace period after an election, of older epochs
        lease = self.leases.get(ref)
        if (
            lease is not None
            and lease.owner is not None
            and not (lease.claimed and claim.epoch > lease.tenure_epoch)
        ):
            return  # settled here: the heartbeat's answer tells the member
        lease = self._lease(ref)
        lease.owner = member_id
        lease.epoch = self._epochs.next()
        lease.tenure_epoch = claim.epoch
        lease.target = None
        lease.claimed = True
        lease.rewind()  # a newer claim replaces an older one's deliveries
        acked_to = claim.next_offset if claim.in_flight == 0 else claim.unacked_from
        if acked_to > lease.frontier:
            lease.frontier = lease.cursor = acked_to
        if claim.next_offset > lease.cursor:
            for offset in range(lease.cursor, claim.next_offset):
                lease.in_flight[offset] = now_ms + self.settings.ack_wait_ms
            lease.cursor = claim.next_offset
        self.generation += 1

    def _lease(self, ref: QueueRef) -> Lease:
        lease = self.leases.get(ref)
        if lease is None:
            start = self._source.start_offset(self.group, *ref)
            lease = self.leases[ref] = Lease(ref[0], ref[1], start, start, start)
        return lease

    # -- allocation ------------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted({t for m in self.members.values() for t in m.subscriptions})

    def _replan(self) -> None:
        """The allocation the leases should reach: per topic among its subscribers."""
        plan: dict[QueueRef, str] = {}
        for topic in self.topics():
            subscribers = [m for m, x in self.members.items() if topic in x.subscriptions]
            queues = [(topic, q) for q in range(self._source.queue_count(topic))]
            for member, refs in allocate(self.settings.strategy, queues, subscribers).items():
                plan.update(dict.fromkeys(refs, member))
        if self.members:
            retry = [(retry_topic(self.group), 0)]
            for member, refs in allocate(self.settings.strategy, retry, list(self.members)).items():
                plan.update(dict.fromkeys(refs, member))
        self._plan = plan
        self.generation += 1

    def tick(self, now_ms: int) -> bool:
        """Expire silent members and move leases towards the plan; whether anything moved."""
        moved = False
        for member_id in [
            m for m, x in self.members.items() if now_ms - x.last_seen_ms > self.session_timeout_ms
        ]:
            del self.members[member_id]
            self._release(member_id)
            self._replan()
            moved = True
        if now_ms < self.grace_until_ms:  # claims still come in: nothing moves yet
            if moved:
                self.generation += 1
            return moved
        for ref, member_id in self._plan.items():
            lease = self._lease(ref)
            if lease.owner == member_id:
                lease.target = None
                continue
            if lease.owner is None:
                self._grant(lease, member_id)
                moved = True
                continue
            lease.target = member_id  # revoking: it moves once its deliveries end
            if all(deadline <= now_ms for deadline in lease.in_flight.values()):
                lease.rewind()
                self._grant(lease, member_id)
                moved = True
        for ref, lease in self.leases.items():
            if ref not in self._plan and lease.owner is not None:
                # nobody subscribes to it any more: revoked like any other, then free
                if any(deadline > now_ms for deadline in lease.in_flight.values()):
                    lease.target = NOBODY
                    continue
                lease.owner = None
                lease.target = None
                lease.rewind()
                moved = True
        if moved:
            self.generation += 1
        return moved

    def _grant(self, lease: Lease, member_id: str) -> None:
        lease.claimed = False
        lease.owner = member_id
        lease.epoch = lease.tenure_epoch = self._epochs.next()
        lease.target = None

    # -- deliveries ------------------------------------------------------------------

    def check_lease(self, member_id: str, topic: str, queue_id: int, epoch: int) -> Lease:
        """The lease `member_id` holds on the queue under `epoch`, or StaleLease."""
        if member_id not in self.members:
            raise StaleLease(
                f"{member_id!r} is not a live member of group {self.group!r} "
                "(session expired or never joined): heartbeat again"
            )
        lease = self.leases.get((topic, queue_id))
        # the epoch of its grant, or the one it claimed and this leader's on adopting it
        if (
            lease is None
            or lease.owner != member_id
            or epoch not in (lease.tenure_epoch, lease.epoch)
        ):
            holder = "nobody" if lease is None or lease.owner is None else repr(lease.owner)
            now = 0 if lease is None else lease.epoch
            raise StaleLease(
                f"stale lease: queue {topic}/{queue_id} of group {self.group!r} "
                f"is held by {holder} under epoch {now}, not by {member_id!r} "
                f"under epoch {epoch}"
            )
        return lease

    def plan_fetch(
        self,
        member_id: str,
        max_messages: int,
        now_ms: int,
        ends: Callable[[str, int], int] | None = None,
    ) -> list[Read]:
        """What to read for a member's fetch (StaleLease if it is not a member): at most
        `max_messages`, shared out (`allocation.share_out`) among its queues that want
        some: redeliveries due, and what lies past the cursor (up to the queue's
        dispatched end, `ends(topic, queue_id)`; without `ends`, as much as it may
        take). A queue that wants nothing is not read."""
        member = self.members.get(member_id)
        if member is None:
            raise StaleLease(
                f"{member_id!r} is not a live member of group {self.group!r} "
                "(session expired or never joined): heartbeat again"
            )
        member.last_seen_ms = now_ms
        if now_ms < self.grace_until_ms:
            return []  # claims still come in: the newest of a queue's wins, then it serves
        wants: list[tuple[Lease, tuple[int, ...], int]] = []
        for lease in self.leases_of(member_id):
            if lease.target is not None or lease.suspended_until_ms > now_ms:
                continue
            due: tuple[int, ...] = ()
            if self.settings.orderly:
                if lease.in_flight and all(d <= now_ms for d in lease.in_flight.values()):
                    lease.rewind()  # nothing acked in time (a lost answer?): again, in order
                if lease.in_flight:
                    continue
            elif lease.in_flight:
                limit = self.settings.max_reconsume  # past it: `poisoned`, dead-lettered
                counts = lease.deliveries
                due = tuple(
                    sorted(
                        o
                        for o, d in lease.in_flight.items()
                        if d <= now_ms and counts.get(o, 0) <= limit
                    )
                )
            room = MAX_IN_FLIGHT_PER_QUEUE - len(lease.in_flight)
            if ends is not None:
                room = min(room, ends(lease.topic, lease.queue_id) - lease.cursor)
            new = lease.readable(room) if room > 0 else 0
            if due or new:
                wants.append((lease, due, new))
        self._turn += 1
        shares = share_out([len(due) + new for _, due, new in wants], max_messages, self._turn)
        return [
            Read(x.topic, x.queue_id, x.epoch, due[:n], x.cursor, min(new, n - len(due[:n])))
            for (x, due, new), n in zip(wants, shares, strict=True)
            if n
        ]

    def record(
        self,
        member_id: str,
        read: Read,
        delivered: Sequence[int],
        skipped: Sequence[int],
        next_offset: int,
        now_ms: int,
    ) -> list[int] | None:
        """After a read: `delivered` go in flight, `skipped` (filtered out, or gone to
        retention) count as acked, the cursor moves to `next_offset`. The delivery
        count of each delivered offset, or None if the lease changed meanwhile (the
        read is dropped: nothing was recorded, nothing may be handed out)."""
        lease = self.leases.get((read.topic, read.queue_id))
        if lease is None or lease.owner != member_id or lease.epoch != read.epoch:
            return None
        if lease.target is not None:
            return None
        lease.in_flight.update(dict.fromkeys(delivered, now_ms + self.settings.ack_wait_ms))
        times = lease.deliveries.get
        counts = [times(offset, 0) + 1 for offset in delivered]
        lease.deliveries.update(zip(delivered, counts, strict=True))
        for offset in skipped:
            lease.mark_acked(offset)
        if next_offset > lease.cursor and read.count:
            lease.cursor = next_offset
            lease.skip_acked()
        return counts

    def ack(
        self,
        member_id: str,
        topic: str,
        queue_id: int,
        epoch: int,
        start: int,
        end: int,
        queue_end: int | Callable[[], int],
        now_ms: int | None = None,
    ) -> int:
        """Ack [start, end) of a queue (end <= start: just `start`); newly acked count.
        StaleLease, or UnknownMessage for an offset never delivered to the group. In
        orderly mode an ack (at `now_ms`) is the run's progress: the ack wait of what
        the run still has in flight starts again, so a run of many slow messages does
        not expire while it advances (and its queue does not move under it)."""
        lease = self.check_lease(member_id, topic, queue_id, epoch)
        end = max(end, start + 1)
        if start < 0:
            raise UnknownMessage(f"queue offset {start} is negative")
        if end > lease.cursor:
            first = max(start, lease.cursor)
            raise UnknownMessage(
                f"no message at {topic}/{queue_id} offset {first} was delivered to group "
                f"{self.group!r} (delivered up to {lease.cursor}, the queue ends at "
                f"{queue_end() if callable(queue_end) else queue_end})"
            )
        acked = lease.mark_range(start, end)
        if acked and now_ms is not None and self.settings.orderly:
            deadline = now_ms + self.settings.ack_wait_ms
            for offset in lease.in_flight:
                lease.in_flight[offset] = deadline
        return acked

    def poisoned(self, now_ms: int) -> list[tuple[Lease, int]]:
        """Concurrent mode: messages whose ack wait ran out more than `max_reconsume`
        times (a handler that never finishes, or kills its consumer): the caller
        dead-letters them instead of delivering them again (never in plan_fetch)."""
        if self.settings.orderly:
            return []
        limit = self.settings.max_reconsume
        return [
            (lease, o)
            for lease in self.leases.values()
            for o, d in lease.in_flight.items()
            if d <= now_ms and lease.deliveries.get(o, 0) > limit
        ]

    def delivered(self, lease: Lease, offset: int) -> None:
        """UnknownMessage unless `offset` is in flight or acked-pending on `lease`."""
        if offset < lease.frontier or offset >= lease.cursor:
            raise UnknownMessage(
                f"no delivery of {lease.topic}/{lease.queue_id} offset {offset} is open in "
                f"group {self.group!r} (open: [{lease.frontier}, {lease.cursor}))"
            )
        if offset in lease.acked:
            raise UnknownMessage(
                f"{lease.topic}/{lease.queue_id} offset {offset} is acked "
                "already: it cannot be nacked"
            )

    def retry_in_place(self, lease: Lease, offset: int, delay_ms: int, now_ms: int) -> int:
        """Orderly nack: the queue pauses, then delivers `offset` and what follows again.
        Returns the in-place retries so far (the caller dead-letters past the maximum)."""
        lease.attempts[offset] = n = lease.attempts.get(offset, 0) + 1
        for later in [o for o in lease.in_flight if o >= offset]:
            del lease.in_flight[later]
        lease.cursor = offset
        lease.suspended_until_ms = now_ms + delay_ms
        return n

    # -- offsets ---------------------------------------------------------------------

    def unflushed(self) -> list[tuple[str, int, int]]:
        """(topic, queue, frontier) of leases whose frontier is not committed yet."""
        return [
            (x.topic, x.queue_id, x.frontier)
            for x in self.leases.values()
            if x.frontier > x.flushed
        ]

    def flushed(self, topic: str, queue_id: int, offset: int) -> None:
        lease = self.leases.get((topic, queue_id))
        if lease is not None and offset > lease.flushed:
            lease.flushed = offset

    def reset(self, topic: str, queue_id: int, offset: int) -> None:
        self._lease((topic, queue_id)).reset(offset)
