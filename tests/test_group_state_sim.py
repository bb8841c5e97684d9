"""A seeded randomized simulation of the pure coordinator (messaging/group_state.py):
up to 5 members heartbeat with random subscriptions, fall silent and come back, fetch
(`plan_fetch` + `record`, as the service reads), ack (some under stale epochs) and nack,
leave; time advances and the leader changes now and then (a new `GroupState` on the next
term, starting from the flushed offsets, the members claiming what they hold). After
every step the invariants are checked against what the test itself tracked (who was
granted which epoch, what was acked, what each member has in hand); a failure names the
seed and the step.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

from dledger_commitlog.messaging.allocation import STRATEGIES
from dledger_commitlog.messaging.group_state import (
    NOBODY,
    Claim,
    Epochs,
    GroupConflict,
    GroupState,
    QueueSource,
    Settings,
    StaleLease,
    UnknownMessage,
    retry_topic,
)

GROUP = "g"
RETRY = retry_topic(GROUP)
SESSION_MS = 3000
TOPICS = {"A": 4, "B": 2}
MEMBERS = [f"m{i}" for i in range(5)]
SEEDS = 300
STEPS = 300
DRAIN_ROUNDS = 30  # 15 s: past a grace period and the longest ack-wait
Ref = tuple[str, int]
REFS: list[Ref] = [(t, q) for t, n in TOPICS.items() for q in range(n)] + [(RETRY, 0)]


@dataclass
class View:
    """One queue as a member sees it: the epoch it was told, what it has in hand."""

    epoch: int
    next_offset: int = 0
    unacked: dict[int, int] = field(default_factory=dict)  # offset -> ack deadline


def filtered(ref: Ref, offset: int) -> bool:
    """Whether the member's filter skips a message (the same answer every time)."""
    return zlib.crc32(f"{ref}:{offset}".encode()) % 5 == 0


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.seed = seed
        self.step = 0
        self.trace: list[str] = []  # the last steps, for a failure's message
        self.now = 0
        self.term = 1
        self.settings = Settings(
            strategy=rng.choice(STRATEGIES),
            orderly=rng.random() < 0.3,
            ack_wait_ms=rng.choice([500, 2000, 5000]),
            max_reconsume=3,
        )
        self.ends = {ref: rng.randrange(0, 5) for ref in REFS}  # the log's queue ends
        self.committed: dict[Ref, int] = {}  # the group's offsets flushed to the log
        self.acked: dict[Ref, set[int]] = {ref: set() for ref in REFS}  # by anyone
        self.subs: dict[str, dict[str, tuple[str, str]]] = {}  # members that run
        self.silent: set[str] = set()
        self.views: dict[str, dict[Ref, View]] = {m: {} for m in MEMBERS}
        self.stale: dict[str, list[tuple[Ref, int, int]]] = {m: [] for m in MEMBERS}
        # what the test saw of the leases: every (epoch, member) granted, in order, with
        # None where the queue was free (a release, or a new leader)
        self.history: dict[Ref, list[tuple[int, str] | None]] = {ref: [None] for ref in REFS}
        self.last_owner: dict[Ref, str | None] = dict.fromkeys(REFS)
        # the last owner was live when it lost the queue (None: a new leader, which
        # does not know; decided when the queue is granted again)
        self.freed_live: dict[Ref, bool | None] = dict.fromkeys(REFS, False)
        self.lost_until: dict[tuple[str, Ref], int] = {}  # what it had in hand, till when
        self.frontier: dict[Ref, int] = {}
        # done by a member whose ack was refused (a claim may vouch for them)
        self.done: dict[Ref, set[int]] = {ref: set() for ref in REFS}
        self.claimed: dict[Ref, tuple[str, int, int]] = {}  # the claims of this step
        self.state = self._new_state(grace_until_ms=0)

    # -- plumbing ----------------------------------------------------------------------

    def fail(self, what: str) -> AssertionError:
        return AssertionError(
            f"seed {self.seed} step {self.step} (now {self.now} ms, term "
            f"{self.term}, {self.settings}): {what}; last steps: " + "; ".join(self.trace[-12:])
        )

    def note(self, what: str) -> None:
        self.trace.append(f"{self.now}: {what}")

    def _new_state(self, grace_until_ms: int) -> GroupState:
        committed = dict(self.committed)
        source = QueueSource(
            lambda t: 1 if t.startswith("%") else TOPICS[t],
            lambda g, t, q: committed.get((t, q), 0),
        )
        return GroupState(
            GROUP,
            source,
            Epochs(self.term),
            session_timeout_ms=SESSION_MS,
            grace_until_ms=grace_until_ms,
        )

    def live(self) -> list[str]:
        return [m for m in self.subs if m not in self.silent]

    # -- what members do -----------------------------------------------------------------

    def heartbeat(self, m: str) -> None:
        if m not in self.state.members:
            self.forget(m)
        claims = [
            Claim(
                t, q, v.epoch, v.next_offset, len(v.unacked), min(v.unacked, default=v.next_offset)
            )
            for (t, q), v in sorted(self.views[m].items())
            if v.next_offset
        ]
        for c in claims:  # (who, under what, below what it vouches all done)
            acked_to = c.unacked_from if c.in_flight else c.next_offset
            self.claimed[(c.topic, c.queue_id)] = (m, c.epoch, acked_to)
        self.note(f"heartbeat {m} {sorted(self.subs[m])} claims {claims}")
        leases = self.state.heartbeat(m, "sim", self.subs[m], self.settings, claims, self.now)
        self.learn(m, [(x.ref, x.epoch) for x in leases])

    def learn(self, m: str, held: list[tuple[Ref, int]]) -> None:
        for ref, epoch in held:
            view = self.views[m].get(ref)
            if view is None:
                self.views[m][ref] = View(epoch)
            else:
                view.epoch = epoch

    def forget(self, m: str) -> None:
        """The member learns it is not a member (any more): it drops what it had."""
        for ref, view in self.views[m].items():
            self.stale[m].extend((ref, o, view.epoch) for o in view.unacked)
        self.views[m] = {}
        self.lost_until = {k: v for k, v in self.lost_until.items() if k[0] != m}

    def fetch(self, m: str) -> None:
        try:
            reads = self.state.plan_fetch(m, self.rng.choice([1, 4, 16]), self.now)
        except StaleLease as exc:
            if m in self.state.members:
                raise self.fail(f"{m} refused a fetch as a member") from exc
            self.forget(m)
            self.heartbeat(m)
            return
        for read in reads:
            ref = (read.topic, read.queue_id)
            new = list(range(read.start, min(self.ends[ref], read.start + read.count)))
            skipped = [o for o in new if filtered(ref, o)]
            delivered = [*read.redeliver, *(o for o in new if o not in skipped)]
            nxt = read.start + len(new)
            counts = self.state.record(m, read, delivered, skipped, nxt, self.now)
            self.note(f"{m} read {read} {delivered} skipped {skipped}")
            if counts is None:
                raise self.fail(f"a read planned just now was dropped: {read}")
            self.acked[ref].update(skipped)
            view = self.views[m].setdefault(ref, View(read.epoch))
            view.epoch = read.epoch
            for offset in delivered:
                view.unacked[offset] = self.now + self.settings.ack_wait_ms
                view.next_offset = max(view.next_offset, offset + 1)

    def legit(self, m: str, ref: Ref, epoch: int) -> bool:
        """Whether `m` holds `ref` under `epoch`: it was granted (or claimed) `epoch`
        and nobody else got the queue since (nor was it freed)."""
        if m not in self.state.members:
            return False
        history = self.history[ref]
        for i in range(len(history) - 1, -1, -1):
            entry = history[i]
            if entry is None or entry[1] != m:
                return False
            if entry[0] == epoch:
                return True
        return False

    def ack(self, m: str) -> None:
        rng = self.rng
        choices = [(ref, o, v.epoch) for ref, v in self.views[m].items() for o in v.unacked]
        if self.stale[m] and (not choices or rng.random() < 0.2):
            ref, offset, epoch = rng.choice(self.stale[m])
        elif choices:
            ref, offset, epoch = rng.choice(sorted(choices))
            if rng.random() < 0.1:
                epoch += rng.choice([-1, 1, 1 << 32])
        else:
            return
        end = offset + 1 + (rng.randrange(3) if rng.random() < 0.2 else 0)
        lease = self.state.leases.get(ref)
        cursor = lease.cursor if lease is not None else 0
        expect_ok = self.legit(m, ref, epoch)
        self.note(f"{m} acks {ref} [{offset}, {end}) @{epoch}")
        try:
            self.state.ack(m, *ref, epoch, offset, end, self.ends[ref])
        except StaleLease as exc:
            if expect_ok:
                raise self.fail(
                    f"{m} refused an ack of {ref}@{offset} under {epoch}, which "
                    f"it holds (history {self.history[ref][-4:]})"
                ) from exc
            self.done[ref].add(offset)  # the member did it, and forgets it (as the client)
            self.drop(m, ref, offset)
            return
        except UnknownMessage as exc:
            if end <= cursor:
                raise self.fail(
                    f"ack of {ref} [{offset}, {end}) below cursor {cursor} refused as unknown"
                ) from exc
            self.done[ref].add(offset)  # it did this one: the range ran past the cursor
            self.drop(m, ref, offset)
            return
        if not expect_ok:
            raise self.fail(
                f"{m} acked {ref}@{offset} under epoch {epoch}, which it does "
                f"not hold (history {self.history[ref][-4:]})"
            )
        if end > cursor:
            raise self.fail(f"ack of {ref} [{offset}, {end}) past cursor {cursor}")
        self.acked[ref].update(range(offset, end))
        view = self.views[m].get(ref)
        if view is not None:
            for o in range(offset, end):
                view.unacked.pop(o, None)

    def drop(self, m: str, ref: Ref, offset: int) -> None:
        self.stale[m] = [s for s in self.stale[m] if s[:2] != (ref, offset)]
        view = self.views[m].get(ref)
        if view is not None:
            view.unacked.pop(offset, None)

    def nack(self, m: str) -> None:
        choices = sorted((ref, o, v.epoch) for ref, v in self.views[m].items() for o in v.unacked)
        if not choices:
            return
        ref, offset, epoch = self.rng.choice(choices)
        if not self.legit(m, ref, epoch):
            return  # the service would refuse it (checked by acks)
        lease = self.state.check_lease(m, *ref, epoch)
        view = self.views[m][ref]
        self.note(f"{m} nacks {ref}@{offset}")
        try:
            self.state.delivered(lease, offset)
        except UnknownMessage as exc:
            # only a delivery whose ack-wait passed may have been taken back meanwhile
            if view.unacked[offset] > self.now:
                raise self.fail(f"{m}'s nack of {ref}@{offset} refused: {exc}") from exc
            del view.unacked[offset]
            return
        if self.settings.orderly:
            tries = self.state.retry_in_place(lease, offset, self.rng.choice([0, 200]), self.now)
            for o in [o for o in view.unacked if o >= offset]:
                del view.unacked[o]  # they come again
            # nor may its claim vouch for them (client/async_consumer.py's _Track keeps its
            # next_offset: a claim after an election then skips them, messages lost)
            retried = tries < self.settings.max_reconsume
            view.next_offset = min(view.next_offset, offset if retried else offset + 1)
            if retried:
                return
            lease.suspended_until_ms = 0  # dead-lettered
        else:
            self.ends[(RETRY, 0)] += 1  # a copy to the retry topic
            view.unacked.pop(offset)
        lease.mark_acked(offset)
        self.acked[ref].add(offset)

    # -- one step ------------------------------------------------------------------------

    def run_step(self) -> None:
        rng = self.rng
        self.claimed = {}
        roll = rng.random()
        if roll < 0.08:
            self.now += rng.choice([100, 500, 1500, 3500])
        elif roll < 0.12:
            ref = rng.choice(REFS)
            self.ends[ref] += rng.randrange(1, 6)  # producers
        elif roll < 0.17:
            self.change_membership()
        elif roll < 0.18:
            self.leader_change()
        elif roll < 0.20:
            state = self.state
            for t, q, frontier in state.unflushed():
                self.committed[(t, q)] = max(self.committed.get((t, q), 0), frontier)
                state.flushed(t, q, frontier)
        else:
            live = self.live()
            if live:
                m = rng.choice(live)
                action = rng.random()
                if action < 0.25:
                    self.heartbeat(m)
                elif action < 0.6:
                    self.fetch(m)
                elif action < 0.9:
                    self.ack(m)
                elif m in self.state.members:
                    self.nack(m)
        self.now += rng.choice([0, 10, 50])
        self.state.tick(self.now)
        self.dead_letter_poisoned()
        self.observe()

    def dead_letter_poisoned(self) -> None:
        """As the service's loop does: a message whose ack wait ran out more than
        max_reconsume times goes to the dead-letter topic (acked here)."""
        for lease, offset in self.state.poisoned(self.now):
            self.note(f"dead-letters {lease.ref}@{offset} (ack wait ran out too often)")
            lease.mark_acked(offset)
            self.acked[lease.ref].add(offset)

    def change_membership(self) -> None:
        rng = self.rng
        m = rng.choice(MEMBERS)
        what = rng.random()
        self.note(f"membership {m} {what:.2f}")
        if m not in self.subs:
            topics = rng.sample(sorted(TOPICS), rng.randint(1, len(TOPICS)))
            self.subs[m] = {t: ("TAG", "*") for t in topics}
            self.silent.discard(m)
            self.heartbeat(m)
        elif what < 0.3:
            self.silent ^= {m}  # falls silent, or comes back
        elif what < 0.55:
            topics = rng.sample(sorted(TOPICS), rng.randint(1, len(TOPICS)))
            self.subs[m] = {t: ("TAG", "*") for t in topics}
            if m not in self.silent:
                self.heartbeat(m)
        elif what < 0.7:
            other = Settings(strategy=self.settings.strategy, orderly=not self.settings.orderly)
            others = [x for x in self.state.members if x != m]
            try:
                self.state.heartbeat(m, "sim", self.subs[m], other, (), self.now)
            except GroupConflict as exc:
                if not others:
                    raise self.fail("a lone member was refused a change of mode") from exc
                return
            if others:
                raise self.fail(f"{m} joined in the other mode beside {others}")
            self.heartbeat(m)  # and back: the sim keeps one mode
        else:
            self.state.leave(m, self.now)
            del self.subs[m]
            self.forget(m)

    def leader_change(self) -> None:
        self.term += 1
        self.note("leader change")
        self.now += self.rng.choice([0, 300, 1000])
        self.state = self._new_state(grace_until_ms=self.now + SESSION_MS)
        for ref in REFS:
            self.history[ref].append(None)
            self.freed_live[ref] = None
            self.frontier.pop(ref, None)

    # -- invariants ----------------------------------------------------------------------

    def observe(self) -> None:
        state = self.state
        in_grace = self.now < state.grace_until_ms
        for m, member in state.members.items():
            if self.now - member.last_seen_ms > SESSION_MS:
                raise self.fail(f"{m} outlived its session after a tick")
        for ref in REFS:
            lease = state.leases.get(ref)
            history = self.history[ref]
            if lease is None or lease.owner is None:
                if history[-1] is not None:
                    history.append(None)
                    self.freed_live[ref] = self.last_owner[ref] in state.members
                if not in_grace:
                    self.views_lost(ref, keep=None)
                continue
            owner = lease.owner
            if owner not in state.members:
                raise self.fail(f"{ref} is owned by {owner}, not a member")
            if history[-1] != (lease.epoch, owner):
                if any(e is not None and e[0] >= lease.epoch for e in history):
                    raise self.fail(
                        f"{ref} granted under epoch {lease.epoch}, not above the "
                        f"earlier {history[-4:]}"
                    )
                claim = self.claimed.get(ref)
                if history[-1] is None and in_grace and claim is not None and claim[0] == owner:
                    history.append((claim[1], owner))  # adopted: the old epoch is good too
                    # the member vouches for what it did below its first unacked offset
                    self.acked[ref].update(o for o in self.done[ref] if o < claim[2])
                direct = history[-1] is not None
                history.append((lease.epoch, owner))
                self.moved(ref, owner, direct)
            self.views_lost(ref, keep=owner)
        for ref, lease in sorted(state.leases.items()):
            self.observe_frontier(ref, lease.frontier, lease.cursor)
        if not in_grace:
            self.check_allocated()

    def observe_frontier(self, ref: Ref, frontier: int, cursor: int) -> None:
        before = self.frontier.get(ref)
        if before is None:  # a new term: from the committed offset
            before = start = self.committed.get(ref, 0)
        else:
            start = before  # what is below was checked
        if frontier < before:
            raise self.fail(f"{ref} frontier went back from {before} to {frontier}")
        self.frontier[ref] = frontier
        missing = [o for o in range(start, frontier) if o not in self.acked[ref]]
        if missing:
            raise self.fail(f"{ref} frontier {frontier} passed offsets nobody acked: {missing[:5]}")
        if frontier > cursor:
            raise self.fail(f"{ref} frontier {frontier} past cursor {cursor}")

    def moved(self, ref: Ref, owner: str, direct: bool) -> None:
        """A new owner: the one before must have nothing unexpired in hand, or have
        been gone when it lost the queue."""
        before = self.last_owner[ref]
        self.last_owner[ref] = owner
        if before is None or before == owner:
            return
        live = self.freed_live[ref] if not direct else None
        if live is None:
            live = before in self.state.members
        if not live:
            return
        view = self.views[before].get(ref)
        until = max(
            [self.lost_until.pop((before, ref), 0), *(view.unacked.values() if view else ())]
        )
        if until > self.now:
            raise self.fail(
                f"{ref} went from {before} to {owner} while {before} "
                f"(live) had deliveries in hand till {until}"
            )

    def views_lost(self, ref: Ref, keep: str | None) -> None:
        """Members other than the owner learn they lost the queue (their next answer)."""
        for m, views in self.views.items():
            if m != keep and ref in views:
                view = views.pop(ref)
                self.stale[m].extend((ref, o, view.epoch) for o in view.unacked)
                if m in self.state.members:  # one gone has lost what it had
                    self.lost_until[(m, ref)] = max(view.unacked.values(), default=0)

    def check_allocated(self) -> None:
        """After grace and a tick: every queue of a subscribed topic is owned."""
        state = self.state
        topics = {t for x in state.members.values() for t in x.subscriptions}
        for ref in REFS:
            wanted = ref[0] in topics or (ref[0] == RETRY and state.members)
            lease = state.leases.get(ref)
            owned = lease is not None and lease.owner is not None
            if owned and not wanted and lease is not None and lease.target == NOBODY:
                continue  # revoked for nobody: its deliveries are still out
            if owned != bool(wanted):
                raise self.fail(f"{ref} owned={owned}, wanted={wanted}")
            if owned and lease is not None and lease.target is None and ref[0] != RETRY:
                subs = state.members[lease.owner or ""].subscriptions
                if ref[0] not in subs:
                    raise self.fail(
                        f"{ref} stays with {lease.owner}, which does not "
                        "subscribe to it, and is not moving"
                    )

    # -- the end: everything is consumed -------------------------------------------

    def drain(self) -> None:
        """Every member back, fetching and acking all it gets: every queue of a
        subscribed topic is consumed to its end (no queue stalls)."""
        if not self.subs:
            self.subs["m0"] = {t: ("TAG", "*") for t in TOPICS}
        self.silent.clear()
        for _ in range(DRAIN_ROUNDS):
            self.step += 1
            self.now += 500
            self.claimed = {}
            for m in sorted(self.subs):
                self.heartbeat(m)
                self.fetch(m)
                for ref, view in sorted(self.views[m].items()):
                    for offset in sorted(view.unacked):
                        try:
                            self.state.ack(m, *ref, view.epoch, offset, 0, self.ends[ref])
                        except (StaleLease, UnknownMessage):
                            pass
                        else:
                            self.acked[ref].add(offset)
                    view.unacked.clear()
            self.state.tick(self.now)
            self.dead_letter_poisoned()
            self.observe()
        topics = {t for x in self.state.members.values() for t in x.subscriptions}
        for ref in REFS:
            lease = self.state.leases.get(ref)
            if ref[0] in topics or ref[0] == RETRY:
                left = self.ends[ref] - (lease.frontier if lease else 0)
                if left:
                    raise self.fail(f"{ref} has {left} message(s) never consumed: {lease}")


def run(seed: int) -> None:
    sim = Sim(seed)
    try:
        for step in range(STEPS):
            sim.step = step
            sim.run_step()
        sim.drain()
    except AssertionError:
        raise
    except Exception as exc:  # an error the state raised where none was due
        raise sim.fail(f"{type(exc).__name__}: {exc}") from exc


def test_randomized_simulation_keeps_the_invariants() -> None:
    for seed in range(SEEDS):
        run(seed)
