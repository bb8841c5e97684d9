"""Consumer groups for operators: the dead-letter topic, offset resets, the figures.

Owns `GroupAdmin`, beside the coordinator (`groups.GroupService`, whose terms and
states it uses): reading a group's dead letters and resending them to its retry
topic (idempotently: a resend's UNIQ_KEY names the dead letter), moving a group's
offsets through the log (refused while it has live members, unless forced: their
deliveries then start over from the new offsets), and every group's lag, members,
retries and dead letters (the metrics and `dledger group list`). Retries and dead
letters are counted by the ends of the retry and dead-letter queues: they survive
a failover because they are messages. The age of a group's oldest unconsumed
message is the store time of the message at its acked frontier (the committed
offset, or the leader's frontier), the oldest over its queues.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatch.names import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.messaging.group_lease import Lease
from dledger_commitlog.messaging.group_state import (
    StaleLease,
    UnknownMessage,
    dlq_topic,
    retry_topic,
)
from dledger_commitlog.messaging.groups import PROPERTY_DLQ_REASON, GroupService, carried
from store.errors import InvalidMessage
from store.message import StoredMessage, check_name

_PUT_TIMEOUT_S = 10.0
_MAX_READ = 256


class GroupAdmin:
    def __init__(self, groups: GroupService) -> None:
        self._groups = groups
        self._log = groups.log

    # -- the dead-letter topic -------------------------------------------------------

    async def dlq(
        self, group: str, from_offset: int, max_messages: int, resend: Sequence[int] | None
    ) -> tuple[list[tuple[StoredMessage, int]], int, int, int]:
        """Read the dead-letter queue (messages, next offset, end) and resend some to the
        group's retry topic (`resend`: their DLQ offsets; empty: all read). A resend is
        idempotent: its UNIQ_KEY names the dead letter, and one already in the retry
        topic is not put again."""
        check_name(group, "group")
        await self._groups.states()
        topic = dlq_topic(group)
        low, high = self._log.queue_bounds(topic, 0)
        start = max(from_offset, low)
        count = max(1, min(max_messages or 32, _MAX_READ))
        found = [(start + i, u) for i, u in enumerate(self._log.units(topic, 0, start, count))]
        messages = [(self._log.message(u), u.size) for _o, u in found]
        resent = 0
        if resend is not None:
            wanted = set(resend) if resend else {o for o, _u in found}
            for offset in sorted(wanted):
                units = self._log.units(topic, 0, offset, 1) if low <= offset < high else []
                if not units:
                    raise UnknownMessage(
                        f"no dead letter at offset {offset} of {topic} (it holds [{low}, {high}))"
                    )
                msg = self._log.message(units[0])
                uniq = f"resend:{group}:{units[0].commitlog_offset}"
                if self._log.find(retry_topic(group), uniq) is not None:
                    continue
                props = carried(msg, 0)
                props.pop(PROPERTY_DLQ_REASON, None)
                copy = self._groups.prepare_copy(msg, uniq, retry_topic(group), 0, props)
                await self._log.put([copy], _PUT_TIMEOUT_S)
                resent += 1
        return messages, resent, start + len(found), high

    async def reset_offsets(
        self, group: str, topic: str, queue_ids: Sequence[int], to: str, value: int, force: bool
    ) -> list[tuple[int, int]]:
        """Move the group's offsets of `topic` (earliest, latest, offset, time): the new
        (queue, offset) pairs, committed through the log."""
        check_name(group, "group")
        states = await self._groups.states()
        state = states.get(group)
        if state is not None and state.members and not force:
            raise StaleLease(
                f"group {group!r} has {len(state.members)} live member(s): stop "
                "them first, or force it (their deliveries start over)"
            )
        targets = []
        for q in queue_ids:
            low, high = self._log.queue_bounds(topic, q)
            if to == "earliest":
                offset = low
            elif to == "latest":
                offset = high
            elif to == "offset":
                if not low <= value <= high:
                    raise InvalidMessage(
                        f"offset {value} is outside queue {topic}/{q}'s [{low}, {high}]"
                    )
                offset = value
            elif to == "time":
                offset = self._log.offset_for_time(topic, q, value)
            else:
                raise InvalidMessage(f"reset to {to!r}: one of earliest, latest, offset, time")
            targets.append((q, offset))
        # The leases first (nothing of the old frontiers is left to flush after ours),
        # and after the put those made meanwhile (a member joined: they start from the
        # old offsets); not those reset before, whose members may have read again since.
        done = self._reset_leases(group, topic, targets, [])
        specs = [self._log.offset_commit(group, topic, q, o) for q, o in targets]
        if specs:
            await self._log.put(specs, _PUT_TIMEOUT_S)
        self._reset_leases(group, topic, targets, done)
        return targets

    def _reset_leases(
        self, group: str, topic: str, targets: Sequence[tuple[int, int]], done: list[Lease]
    ) -> list[Lease]:
        """Reset the group's leases of `targets` but those `done` before; the leases."""
        state = self._groups.live_states().get(group)
        if state is None:
            return []
        out = []
        for q, offset in targets:
            lease = state.leases.get((topic, q))
            if lease is None or not any(lease is x for x in done):
                state.reset(topic, q, offset)
            out.append(state.leases[(topic, q)])
        self._groups.poke(group)
        return out

    def stored_ms(self, topic: str, queue_id: int, offset: int) -> int:
        """The store time of the first message of a queue at or past `offset` (0: none):
        the oldest a group whose frontier is `offset` has not consumed."""
        low, _high = self._log.queue_bounds(topic, queue_id)
        units = self._log.units(topic, queue_id, max(offset, low), 1)
        return self._log.message(units[0]).store_timestamp_ms if units else 0

    def summaries(self, ages: bool = False) -> dict[str, dict[str, int | str | bool]]:
        """Every known group (committed offsets or live members): its figures now; with
        `ages`, the store time of its oldest unconsumed message too (a read per queue
        behind: the RPCs ask for it, the metrics' gauges each second do not)."""
        offsets = self._log.group_offsets()
        states = self._groups.live_states()
        lag: dict[str, int] = {}
        oldest: dict[str, int] = {}

        def behind(group: str, topic: str, q: int, done: int) -> None:
            high = self._log.queue_bounds(topic, q)[1]
            lag[group] = lag.get(group, 0) + max(0, high - done)
            stored = self.stored_ms(topic, q, done) if ages and done < high else 0
            if stored and (group not in oldest or stored < oldest[group]):
                oldest[group] = stored

        for (group, topic, q), committed in offsets.items():
            if group.startswith(SYSTEM_TOPIC_PREFIX):
                continue
            state = states.get(group)
            lease = state.leases.get((topic, q)) if state is not None else None
            behind(group, topic, q, lease.frontier if lease is not None else committed)
        for group, state in states.items():
            for (topic, q), lease in state.leases.items():
                if (group, topic, q) not in offsets:
                    behind(group, topic, q, lease.frontier)
        out: dict[str, dict[str, int | str | bool]] = {}
        for group in sorted(set(lag) | set(states)):
            state = states.get(group)
            out[group] = {
                "members": len(state.members) if state is not None else 0,
                "lag": lag.get(group, 0),
                "oldest_unconsumed_ms": oldest.get(group, 0),
                "retries": self._log.queue_bounds(retry_topic(group), 0)[1],
                "dead_letters": self._log.queue_bounds(dlq_topic(group), 0)[1],
                "strategy": state.settings.strategy if state is not None else "",
                "orderly": state.settings.orderly if state is not None else False,
                "generation": state.generation if state is not None else 0,
            }
        return out
