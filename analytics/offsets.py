"""Which queues a read covers, and the queue offsets [start, end) of each: pure, no Spark.

`choose` picks the queues the options name (topics, a pattern or an assignment;
system topics only by name); `resolve_start` and `resolve_end` turn the
options' offsets and timestamps (`analytics.options`) into concrete offsets
(timestamps through the store's `offsets_for_times`); `ranges` and
`stream_ranges` give the non-empty `Slice`s between them. A stream keeps its
offsets in Spark's checkpoints as JSON (`to_json`, `from_json`), and `cap`
bounds a micro-batch (Kafka's maxOffsetsPerTrigger).

Filters Spark pushes down (`pushFilters`) narrow the read: `topic` = / IN and
`queue_id` comparisons and `shard` = / IN select queues exactly, `queue_offset` comparisons cut
each queue's range exactly, and `store_timestamp` bounds become offsets by binary
search, widened by `timestampSlackMs` (a leader's clock may step back a little);
Spark checks those rows again.

shards (a multi-shard cluster, docs/analytics.md): a queue is keyed by
(topic, queue id) in shard 1 and (topic, queue id, shard) in any other
(`analytics.sources.QueueKey`), so a read of shard 1 alone keys its queues,
checkpoints included, by (topic, queue id). In JSON (options and checkpoints) a
queue is "Q" (shard 1) or "G:Q" (shard G): `to_json` writes every queue of a
read that holds any shard but 1 as "G:Q", else as "Q"; `from_json` takes both.
A store's timestamp lookups are (topic, queue id, ms) in shard 1 and (topic,
queue id, ms, shard) otherwise (`time_query`).

Invariants: the offsets `resolve` and `resolve_times` give lie within each
queue's [min_offset, max_offset] (an offset outside is an `OptionError` naming
it, or, below, the first retained one when failOnDataLoss=false); no range ends
before it starts; narrowing by filters only ever shrinks a range.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from analytics.errors import OptionError, SourceError
from analytics.options import EARLIEST, LATEST, OffsetSpec, ReadOptions, TimeSpec
from analytics.sources import (
    SYSTEM_TOPIC_PREFIX,
    QueueInfo,
    QueueKey,
    QueueRef,
    Slice,
    key_parts,
    parse_queue_ref,
    queue_label,
    queue_name,
    ref_key,
)

Offsets = dict[QueueKey, int]
K = TypeVar("K", bound=QueueKey)  # offsets of any keys (shard 1's alone: (topic, queue id))
TimeQuery = tuple[str, int, int] | tuple[str, int, int, int]  # see the module doc
Lookup = Callable[[Sequence[TimeQuery]], list[int]]  # store.offsets_for_times


def time_query(key: QueueKey, ts: int) -> TimeQuery:
    """The lookup of the first offset of queue `key` stored at or after `ts`."""
    topic, queue_id, shard = key_parts(key)
    return (topic, queue_id, ts) if shard == 1 else (topic, queue_id, ts, shard)


def queue_ids(queues: Iterable[QueueInfo], topic: str) -> list[int] | list[str]:
    """A topic's queues, for messages: ids (shard 1 only), else "G:Q" names."""
    keys = sorted((q.shard, q.queue_id) for q in queues if q.topic == topic)
    if all(g == 1 for g, _ in keys):
        return [q for _, q in keys]
    return [f"{g}:{q}" for g, q in keys]


def select(queues: Iterable[QueueInfo], topics: tuple[str, ...] | None) -> list[QueueInfo]:
    """The queues of `topics` (default: every user topic); an unknown topic is an error."""
    queues = list(queues)
    if topics is None:
        return [q for q in queues if not q.topic.startswith(SYSTEM_TOPIC_PREFIX)]
    known = sorted({q.topic for q in queues})
    unknown = [t for t in topics if t not in known]
    if unknown:
        have = ", ".join(t for t in known if not t.startswith(SYSTEM_TOPIC_PREFIX)) or "none"
        raise OptionError(
            f"unknown topic(s) {', '.join(map(repr, unknown))}: no committed messages "
            f"(topics with data: {have})"
        )
    return [q for q in queues if q.topic in topics]


def choose(queues: Iterable[QueueInfo], opts: ReadOptions) -> list[QueueInfo]:
    """The queues `opts` reads: its topics, pattern or assignment (see the module doc)."""
    queues = list(queues)
    if opts.pattern is not None:
        regex = re.compile(opts.pattern)
        return [
            q
            for q in queues
            if not q.topic.startswith(SYSTEM_TOPIC_PREFIX) and regex.fullmatch(q.topic)
        ]
    if opts.assign is not None:
        chosen = select(queues, tuple(opts.assign))
        have = {q.key for q in chosen}
        wanted = set()
        for topic, refs in opts.assign.items():
            keys = [ref_key(topic, r) for r in refs]
            missing = [queue_name(k) if len(k) > 2 else k[1] for k in keys if k not in have]
            if missing:
                known = queue_ids(chosen, topic)
                raise OptionError(f"assign: {topic} has no queue(s) {missing} (queues: {known})")
            wanted.update(keys)
        return [q for q in chosen if q.key in wanted]
    return select(queues, opts.topics)


def named_topics(opts: ReadOptions) -> tuple[str, ...]:
    """The topics `opts` names (system topics are read only when named)."""
    if opts.topics is not None:
        return opts.topics
    return tuple(opts.assign) if opts.assign is not None else ()


def resolve_start(opts: ReadOptions, queues: Sequence[QueueInfo], lookup: Lookup) -> Offsets:
    """Starting offsets: by timestamp when one is given, else `startingOffsets`."""
    if opts.starting_ts is None:
        return resolve(opts.starting, queues, "startingOffsets", opts.fail_on_data_loss)
    name = (
        "startingTimestamp" if isinstance(opts.starting_ts, int) else "startingOffsetsByTimestamp"
    )
    found = resolve_times(opts.starting_ts, queues, lookup, name, EARLIEST)
    out = resolve("earliest", queues, "startingOffsets")
    for q in queues:
        key = q.key
        if key not in found:
            continue
        if (
            found[key] >= q.max_offset
            and q.max_offset > q.min_offset
            and opts.ts_strategy == "error"
        ):
            ts = opts.starting_ts if isinstance(opts.starting_ts, int) else "the given timestamp"
            raise OptionError(
                f"{name}: no message of {queue_label(key)} was stored at or after {ts} "
                "(set startingOffsetsByTimestampStrategy=latest to start at its end instead)"
            )
        out[key] = found[key]
    return out


def resolve_end(opts: ReadOptions, queues: Sequence[QueueInfo], lookup: Lookup) -> Offsets:
    """Ending offsets: by timestamp when one is given (none after it: the end)."""
    if opts.ending_ts is None:
        return resolve(opts.ending, queues, "endingOffsets")
    name = "endingTimestamp" if isinstance(opts.ending_ts, int) else "endingOffsetsByTimestamp"
    found = resolve_times(opts.ending_ts, queues, lookup, name, LATEST)
    return {**resolve("latest", queues, "endingOffsets"), **found}


def _named(
    spec: Mapping[str, dict[QueueRef, int]],
    queues: Sequence[QueueInfo],
    by_key: Mapping[QueueKey, QueueInfo],
    name: str,
) -> Iterator[tuple[QueueKey, int]]:
    """(queue, value) of each queue option `name` names per topic, each checked: a topic
    the read does not cover, or a queue it does not have, is an OptionError naming it."""
    topics = {q.topic for q in queues}
    for topic, per_queue in spec.items():
        if topic not in topics:
            raise OptionError(
                f"{name} names topic {topic!r}, which is not read "
                f"(read: {', '.join(sorted(topics)) or 'none'})"
            )
        for ref, value in per_queue.items():
            key = ref_key(topic, ref)
            if key not in by_key:
                ids = queue_ids(queues, topic)
                raise OptionError(f"{name}: {topic} has no queue {queue_name(key)} (queues: {ids})")
            yield key, value


def resolve_times(
    spec: TimeSpec, queues: Sequence[QueueInfo], lookup: Lookup, name: str, default: int
) -> Offsets:
    """Per queue with a timestamp, the first offset stored at or after it."""
    by_key = {q.key: q for q in queues}
    wanted: dict[QueueKey, int] = {}
    if isinstance(spec, int):
        wanted = dict.fromkeys(by_key, spec)
    else:
        wanted = dict(_named(spec, queues, by_key, name))
    keys = sorted((k for k in wanted if by_key[k].max_offset > by_key[k].min_offset), key=key_parts)
    offsets = lookup([time_query(k, wanted[k]) for k in keys]) if keys else []
    out = {
        k: max(by_key[k].min_offset, min(o, by_key[k].max_offset))
        for k, o in zip(keys, offsets, strict=True)
    }
    for k in wanted:
        out.setdefault(k, by_key[k].max_offset if default == LATEST else by_key[k].min_offset)
    return out


def resolve(
    spec: OffsetSpec, queues: Iterable[QueueInfo], name: str, fail_on_data_loss: bool = True
) -> Offsets:
    """Concrete offsets of `queues` for `spec`, checked against each queue's [min, max]."""
    queues = list(queues)
    by_key = {q.key: q for q in queues}
    default = LATEST if spec == "latest" or name == "endingOffsets" else EARLIEST
    given: dict[QueueKey, int] = {}
    if isinstance(spec, dict):
        given = dict(_named(spec, queues, by_key, name))
    out: Offsets = {}
    for key, q in by_key.items():
        offset = given.get(key, default)
        if offset == EARLIEST:
            offset = q.min_offset
        elif offset == LATEST:
            offset = q.max_offset
        elif offset > q.max_offset:
            raise OptionError(
                f"{name}: offset {offset} of {queue_label(key)} is beyond its committed "
                f"end {q.max_offset}"
            )
        elif offset < q.min_offset:
            if fail_on_data_loss:
                raise OptionError(
                    f"{name}: offset {offset} of {queue_label(key)} is below its first "
                    f"retained offset {q.min_offset} (deleted by retention); set "
                    "failOnDataLoss=false to start there instead"
                )
            offset = q.min_offset
        out[key] = offset
    return out


def ranges(start: Mapping[K, int], end: Mapping[K, int]) -> list[Slice]:
    """Non-empty [start, end) per queue of `end` (a queue missing from `start` starts at 0)."""
    out = []
    for key, hi in sorted(end.items(), key=lambda kv: key_parts(kv[0])):
        lo = start.get(key, 0)
        if lo > hi:
            raise OptionError(
                f"{queue_label(key)}: starting offset {lo} is after the ending offset {hi}"
            )
        if lo < hi:
            topic, queue_id, shard = key_parts(key)
            out.append(Slice(topic, queue_id, lo, hi, shard))
    return out


def stream_ranges(
    start: Mapping[K, int],
    end: Mapping[K, int],
    queues: Iterable[QueueInfo],
    fail_on_data_loss: bool = True,
) -> list[Slice]:
    """A micro-batch's ranges: queues new since `start` begin at their earliest offset, and
    a queue whose start retention has deleted meanwhile fails (or skips ahead)."""
    begin: Offsets = dict(start.items())
    ends: Offsets = dict(end.items())
    for q in queues:
        key = q.key
        if key not in end:
            continue
        if key not in begin:
            begin[key] = q.min_offset
        elif begin[key] < q.min_offset:
            if fail_on_data_loss:
                raise SourceError(
                    f"{queue_label(key)}: offsets {begin[key]}..{q.min_offset - 1} were "
                    "deleted by retention before this query read them; set "
                    "failOnDataLoss=false to skip them"
                )
            begin[key] = min(q.min_offset, ends[key])
    return ranges(begin, ends)


def cap(start: Mapping[K, int], latest: Mapping[K, int], max_messages: int | None) -> dict[K, int]:
    """`latest`, moved back so that at most `max_messages` are read after `start`.

    The budget is shared in proportion to what each queue has available (as
    Kafka's maxOffsetsPerTrigger); every queue with data gets at least one.
    """
    avail = {k: hi - start.get(k, hi) for k, hi in latest.items()}
    total = sum(avail.values())
    if max_messages is None or total <= max_messages:
        return dict(latest)
    out = dict(latest)
    for k, n in avail.items():
        if n > 0:
            out[k] = start[k] + max(1, n * max_messages // total)
    return out


def to_json(offsets: Mapping[K, int]) -> dict[str, dict[str, int]]:
    """Offsets as Spark stores them in checkpoints: {"topic": {"queue id": offset}}, or,
    when any queue is of a shard but 1, {"topic": {"shard:queue id": offset}}."""
    sharded = any(key_parts(k)[2] != 1 for k in offsets)
    out: dict[str, dict[str, int]] = {}
    for key, offset in sorted(offsets.items(), key=lambda kv: key_parts(kv[0])):
        out.setdefault(key[0], {})[queue_name(key, sharded)] = offset
    return out


def from_json(doc: Mapping[str, Any]) -> Offsets:
    """What `to_json` wrote (either form: "Q" and "G:Q" keys)."""
    out: Offsets = {}
    try:
        for topic, queues in doc.items():
            for queue, offset in queues.items():
                ref = parse_queue_ref(str(queue))
                if ref is None:
                    raise ValueError(
                        f'queue {queue!r} of {topic!r} is neither a queue id nor "shard:queue id"'
                    )
                out[ref_key(str(topic), ref)] = int(offset)
    except (AttributeError, TypeError, ValueError) as exc:
        raise OptionError(f"not a dledger offset: {doc!r} ({exc})") from None
    return out


# ---------------------------------------------------------------- filters


@dataclass(frozen=True, slots=True)
class Narrowing:
    """What pushed-down filters leave to read (see the module doc). Bounds: ints,
    low inclusive, high exclusive; None: no bound."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    shards: frozenset[int] | None = None  # shard = / IN
    queue_id_range: tuple[int | None, int | None] = (None, None)
    offset_range: tuple[int | None, int | None] = (None, None)
    time_range: tuple[int | None, int | None] = (None, None)  # store timestamps, ms
    pushed: tuple[str, ...] = field(default=())  # descriptions, for explain and tests

    def with_topics(self, names: Iterable[str], what: str) -> Narrowing:
        new = frozenset(names)
        topics = new if self.topics is None else self.topics & new
        return replace(self, topics=topics, pushed=(*self.pushed, what))

    def with_shards(self, ids: Iterable[int], what: str) -> Narrowing:
        new = frozenset(ids)
        got = new if self.shards is None else self.shards & new
        return replace(self, shards=got, pushed=(*self.pushed, what))

    def with_queue_ids(self, ids: Iterable[int], what: str) -> Narrowing:
        new = frozenset(ids)
        got = new if self.queue_ids is None else self.queue_ids & new
        return replace(self, queue_ids=got, pushed=(*self.pushed, what))

    def bounded(self, which: str, lo: int | None, hi: int | None, what: str) -> Narrowing:
        """Tighter bounds on `which`: queue_id_range, offset_range or time_range."""
        old_lo, old_hi = getattr(self, which)
        new_lo = lo if old_lo is None else old_lo if lo is None else max(lo, old_lo)
        new_hi = hi if old_hi is None else old_hi if hi is None else min(hi, old_hi)
        pushed = (*self.pushed, what)
        if which == "queue_id_range":
            return replace(self, queue_id_range=(new_lo, new_hi), pushed=pushed)
        if which == "offset_range":
            return replace(self, offset_range=(new_lo, new_hi), pushed=pushed)
        assert which == "time_range", which
        return replace(self, time_range=(new_lo, new_hi), pushed=pushed)

    def queues(self, queues: Iterable[QueueInfo]) -> list[QueueInfo]:
        lo, hi = self.queue_id_range
        return [
            q
            for q in queues
            if (self.topics is None or q.topic in self.topics)
            and (self.queue_ids is None or q.queue_id in self.queue_ids)
            and (self.shards is None or q.shard in self.shards)
            and (lo is None or q.queue_id >= lo)
            and (hi is None or q.queue_id < hi)
        ]

    def offsets(self, start: Offsets, end: Offsets) -> tuple[Offsets, Offsets]:
        """Queue offsets cut by the queue_offset bounds (exact)."""
        lo, hi = self.offset_range
        if lo is None and hi is None:
            return start, end
        s = {k: max(v, lo) if lo is not None else v for k, v in start.items()}
        e = {k: min(v, hi) if hi is not None else v for k, v in end.items()}
        return s, {k: max(v, s.get(k, v)) for k, v in e.items()}

    def times(
        self, start: Offsets, end: Offsets, lookup: Lookup, slack_ms: int
    ) -> tuple[Offsets, Offsets]:
        """Queue offsets cut by the store_timestamp bounds, each widened by `slack_ms`."""
        lo, hi = self.time_range
        s, e = dict(start), dict(end)
        keys = sorted((k for k in e if e[k] > s.get(k, 0)), key=key_parts)
        if lo is not None and keys:
            found = lookup([time_query(k, max(0, lo - slack_ms)) for k in keys])
            for k, o in zip(keys, found, strict=True):
                s[k] = max(s.get(k, 0), min(o, e[k]))
        if hi is not None and keys:
            found = lookup([time_query(k, hi + slack_ms) for k in keys])
            for k, o in zip(keys, found, strict=True):
                e[k] = max(s.get(k, 0), min(o, e[k]))
        return s, e


def to_ms(value: Any, *, up: bool) -> int | None:
    """A filter's timestamp value as ms since the epoch (rounded `up` or down), or None."""
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        us = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
        return -((-us) // 1000) if up else us // 1000
    if isinstance(value, dt.date):
        return to_ms(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC), up=up)
    return None
