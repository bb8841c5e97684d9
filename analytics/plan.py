"""Options of the `dledger` source and planning of what to read: pure functions, no Spark.

What to read, as with Spark's Kafka source: `topics` (or `subscribe`), a
`subscribePattern` (a regular expression a topic name must match as a whole) or
`assign` (`{"orders": [0, 2]}`: only those queues); at most one of them, and
without any every user topic. Offsets are per consume queue: `startingOffsets` /
`endingOffsets` are "earliest", "latest", or JSON naming topics and queues,
`{"orders": {"0": 23, "1": -2}}`, where -2 means the queue's earliest offset and
-1 its latest (committed end). Queues and topics a JSON leaves out start at
earliest and end at latest. As with Kafka, a batch query may not start at
"latest" nor end at "earliest", and a streaming query takes no `endingOffsets`.
Timestamps (ms since the epoch, of `store_timestamp`) stand for offsets:
`startingTimestamp` / `endingTimestamp` (every queue) and
`startingOffsetsByTimestamp` / `endingOffsetsByTimestamp` (JSON per queue) resolve
to each queue's first offset stored at or after them; precedence: timestamp,
then by-timestamp JSON, then offsets. A starting timestamp after a queue's last
message fails the query (`startingOffsetsByTimestampStrategy=error`, Kafka's
default) or starts at its end (`latest`); an ending one reads to the end.

A read covers [start, end) of each queue. How it is cut into partitions
(`partitioning`): `queue`: each queue's range into pieces of at most
`messagesPerPartition` (fewer when `minPartitions` asks for more partitions);
`log`: the commit-log range the messages occupy into about `minPartitions`
(default: this host's cores) ranges of bytes, each read in one pass over the
log by a partition; `auto` (default): `log` when the messages read fill at
least 40% of the log range they span (every topic, most topics, any read of
files), else `queue` (a few topics of many over the servers).

Filters Spark pushes down (`pushFilters`) narrow the read: `topic` = / IN and
`queue_id` comparisons select queues exactly, `queue_offset` comparisons cut
each queue's range exactly, and `store_timestamp` bounds become offsets by binary
search, widened by `timestampSlackMs` (a leader's clock may step back a little);
Spark checks those rows again.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from analytics.codec import COLUMNS
from analytics.errors import OptionError, SourceError
from analytics.sources import SYSTEM_TOPIC_PREFIX, LogPiece, QueueInfo
from analytics.sources import Slice as Slice  # re-exported: a queue's offset range

EARLIEST: Final = -2
LATEST: Final = -1
QueueKey = tuple[str, int]
Offsets = dict[QueueKey, int]
OffsetSpec = str | dict[str, dict[int, int]]  # "earliest" | "latest" | per topic and queue

DEFAULT_MESSAGES_PER_PARTITION: Final = 500_000
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60 * 1000  # Kafka's default, 15m
DEFAULT_TIMESTAMP_SLACK_MS: Final = 1000
LOG_MODE_DENSITY: Final = 0.4  # auto: a log-range read when the messages fill this much
MIN_PIECE_BYTES: Final = 4 << 20  # log ranges are not cut finer than this
MAX_PIECE_BYTES: Final = 1 << 30  # nor left larger
PARTITIONINGS: Final = ("auto", "log", "queue")
# name (lower case, as Spark hands options over) -> the spelling users write
OPTIONS: Final = {
    name.lower(): name
    for name in (
        "servers",
        "path",
        "topics",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "messagesPerPartition",
        "minPartitions",
        "partitioning",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "failOnDataLoss",
        "timeoutSeconds",
        "timestampSlackMs",
        "localReads",
        "columns",
        "tlsCa",
        "credentials",
    )
}


@dataclass(frozen=True, slots=True)
class ReadOptions:
    servers: tuple[str, ...]
    path: str | None
    topics: tuple[str, ...] | None
    starting: OffsetSpec
    ending: OffsetSpec
    messages_per_partition: int
    min_partitions: int
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    timeout_s: float
    tls_ca: str | None = None  # PEM file of the CA a TLS cluster's certificates chain to
    credentials: str | None = None  # TOML file with access_key and secret_key (an ACL)
    pattern: str | None = None  # subscribePattern
    assign: dict[str, tuple[int, ...]] | None = None
    starting_ts: TimeSpec | None = None  # startingTimestamp / startingOffsetsByTimestamp
    ending_ts: TimeSpec | None = None
    ts_strategy: str = "error"  # startingOffsetsByTimestampStrategy
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    partitioning: str = "auto"
    local_reads: bool = True
    columns: tuple[str, ...] | None = None
    timestamp_slack_ms: int = DEFAULT_TIMESTAMP_SLACK_MS
    min_partitions_given: bool = False


TimeSpec = int | dict[str, dict[int, int]]  # one timestamp for all, or per topic and queue


def parse_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        known = ", ".join(OPTIONS.values())
        raise OptionError(f"unknown option(s) {', '.join(unknown)} for dledger (known: {known})")
    servers = tuple(s.strip() for s in opts.get("servers", "").split(",") if s.strip())
    path = opts.get("path") or None
    if bool(servers) == bool(path):
        raise OptionError(
            "give exactly one of the options `servers` (host:port,... of a cluster) "
            "and `path` (a stopped node's data directory)"
        )
    for address in servers:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise OptionError(f"servers: {address!r} is not host:port")
    topics, pattern, assign = _subscription(opts)
    default_start = "latest" if streaming else "earliest"
    starting = parse_offsets(opts.get("startingoffsets", default_start), "startingOffsets")
    if streaming and "endingoffsets" in opts:
        raise OptionError("endingOffsets is for batch queries; a stream has no end")
    if streaming and ("endingtimestamp" in opts or "endingoffsetsbytimestamp" in opts):
        raise OptionError("endingTimestamp and endingOffsetsByTimestamp are for batch queries")
    ending = parse_offsets(opts.get("endingoffsets", "latest"), "endingOffsets")
    starting_ts = _time_spec(opts, "startingTimestamp", "startingOffsetsByTimestamp")
    ending_ts = _time_spec(opts, "endingTimestamp", "endingOffsetsByTimestamp")
    if not streaming:
        if starting_ts is None and (starting == "latest" or _has(starting, LATEST)):
            raise OptionError("startingOffsets: a batch query cannot start at latest")
        if ending_ts is None and (ending == "earliest" or _has(ending, EARLIEST)):
            raise OptionError("endingOffsets: a batch query cannot end at earliest")
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
        if not streaming and name.lower() in opts:
            raise OptionError(f"{name} is for streaming queries")
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"startingOffsetsByTimestampStrategy: {strategy!r} is neither error nor latest"
        )
    partitioning = opts.get("partitioning", "auto").strip().lower()
    if partitioning not in PARTITIONINGS:
        raise OptionError(
            f"partitioning: {partitioning!r} is not one of {', '.join(PARTITIONINGS)}"
        )
    limit = opts.get("maxoffsetspertrigger")
    least = opts.get("minoffsetspertrigger")
    return ReadOptions(
        servers=servers,
        path=path,
        topics=topics,
        starting=starting,
        ending=ending,
        messages_per_partition=_int(
            opts, "messagesPerPartition", DEFAULT_MESSAGES_PER_PARTITION, 1
        ),
        min_partitions=_int(opts, "minPartitions", 1, 1),
        max_offsets_per_trigger=None if limit is None else _int(opts, "maxOffsetsPerTrigger", 0, 1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        timeout_s=_float(opts, "timeoutSeconds", 30.0),
        tls_ca=_readable(opts, "tlsCa"),
        credentials=_readable(opts, "credentials"),
        pattern=pattern,
        assign=assign,
        starting_ts=starting_ts,
        ending_ts=ending_ts,
        ts_strategy=strategy,
        min_offsets_per_trigger=None if least is None else _int(opts, "minOffsetsPerTrigger", 0, 1),
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        partitioning=partitioning,
        local_reads=_bool(opts, "localReads", True),
        columns=_columns(opts),
        timestamp_slack_ms=_int(opts, "timestampSlackMs", DEFAULT_TIMESTAMP_SLACK_MS, 0),
        min_partitions_given="minpartitions" in opts,
    )


def _subscription(
    opts: Mapping[str, str],
) -> tuple[tuple[str, ...] | None, str | None, dict[str, tuple[int, ...]] | None]:
    """topics / subscribe, subscribePattern, assign: at most one (none: every user topic)."""
    given = [n for n in ("topics", "subscribe", "subscribePattern", "assign") if n.lower() in opts]
    if len(given) > 1:
        raise OptionError(f"give at most one of {', '.join(given)} (they all say what to read)")
    topics = pattern = assign = None
    name = given[0] if given else None
    if name in ("topics", "subscribe"):
        text = opts[name.lower()]
        topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not topics:
            raise OptionError(f"{name}: give at least one topic name (or leave the option out)")
    elif name == "subscribePattern":
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(
                f"subscribePattern: {pattern!r} is not a regular expression ({exc})"
            ) from None
    elif name == "assign":
        assign = _parse_assign(opts["assign"])
    return topics, pattern, assign


def _parse_assign(text: str) -> dict[str, tuple[int, ...]]:
    """`{"orders": [0, 2], "pay": [1]}`: the queues to read."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise OptionError(
            f'assign: {text!r} is not JSON like {{"topic": [0, 1]}} ({exc})'
        ) from None
    if not isinstance(doc, dict) or not doc:
        raise OptionError('assign: the JSON must be a non-empty object {"topic": [queue ids]}')
    out: dict[str, tuple[int, ...]] = {}
    for topic, ids in doc.items():
        if not isinstance(ids, list) or not ids:
            raise OptionError(f"assign: topic {topic!r} must map to a non-empty list of queue ids")
        for q in ids:
            if isinstance(q, bool) or not isinstance(q, int) or q < 0:
                raise OptionError(f"assign: queue id {q!r} of {topic!r} is not an integer >= 0")
        out[str(topic)] = tuple(sorted(set(ids)))
    return out


def _time_spec(opts: Mapping[str, str], one: str, per_queue: str) -> TimeSpec | None:
    """A timestamp for every queue (`one`) or JSON per queue (`per_queue`); `one` wins."""
    if one.lower() in opts:
        text = opts[one.lower()].strip()
        try:
            value = int(text)
        except ValueError:
            raise OptionError(
                f"{one}: {text!r} is not a number (milliseconds since the epoch)"
            ) from None
        if value < 0:
            raise OptionError(f"{one}: {value} is negative")
        return value
    if per_queue.lower() not in opts:
        return None
    text = opts[per_queue.lower()]
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise OptionError(
            f'{per_queue}: {text!r} is not JSON like {{"topic": {{"0": 1700000000000}}}} ({exc})'
        ) from None
    if not isinstance(doc, dict):
        raise OptionError(f'{per_queue}: the JSON must be an object {{"topic": {{"queue": ms}}}}')
    out: dict[str, dict[int, int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{per_queue}: topic {topic!r} must map queue ids to timestamps")
        out[topic] = {}
        for queue, ts in queues.items():
            if not (isinstance(queue, str) and queue.isdigit()):
                raise OptionError(f"{per_queue}: queue id {queue!r} of {topic!r} is not a number")
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise OptionError(
                    f"{per_queue}: timestamp {ts!r} of {topic}/{queue} must be an integer >= 0 "
                    "(milliseconds since the epoch)"
                )
            out[topic][int(queue)] = ts
    return out


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    """`15m`, `30s`, `500ms`, `1h` (a bare number is milliseconds)."""
    text = opts.get(name.lower())
    if text is None:
        return default
    m = _DURATION.fullmatch(text)
    if m is None:
        raise OptionError(f"{name}: {text!r} is not a duration like 15m, 30s, 500ms or 1h")
    return round(float(m.group(1)) * _UNIT_MS[(m.group(2) or "ms").lower()])


def columns_option(options: Mapping[str, str]) -> tuple[str, ...] | None:
    """The `columns` option of (raw) options, checked; None when not given."""
    return _columns({str(k).lower(): str(v) for k, v in options.items()})


def _columns(opts: Mapping[str, str]) -> tuple[str, ...] | None:
    """`columns`: the source columns to read (the schema), comma-separated."""
    if "columns" not in opts:
        return None
    names = tuple(dict.fromkeys(c.strip() for c in opts["columns"].split(",") if c.strip()))
    unknown = [c for c in names if c not in COLUMNS]
    if not names or unknown:
        raise OptionError(
            f"columns: {', '.join(unknown) or 'none given'} "
            f"(columns of the source: {', '.join(COLUMNS)})"
        )
    return names


def _readable(opts: Mapping[str, str], name: str) -> str | None:
    """A file option: checked on the driver (workers read it too: use a shared path)."""
    path = opts.get(name.lower()) or None
    if path is not None and not os.access(path, os.R_OK):
        raise OptionError(f"{name}: {path} is not a readable file")
    return path


def _has(spec: OffsetSpec, value: int) -> bool:
    return isinstance(spec, dict) and any(value in q.values() for q in spec.values())


def _int(opts: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    text = opts.get(name.lower())
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name}: {text!r} is not an integer") from None
    if value < minimum:
        raise OptionError(f"{name}: {value} is below the minimum {minimum}")
    return value


def _float(opts: Mapping[str, str], name: str, default: float) -> float:
    text = opts.get(name.lower())
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"{name}: {text!r} is not a number") from None
    if not value > 0:
        raise OptionError(f"{name}: must be positive, not {text}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    text = opts.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"{name}: {text!r} is not true or false")
    return text.strip().lower() == "true"


def parse_offsets(text: str, name: str) -> OffsetSpec:
    """`earliest`, `latest` or `{"topic": {"queue id": offset}}` (-2: earliest, -1: latest)."""
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return stripped.lower()
    try:
        doc = json.loads(stripped)
    except ValueError as exc:
        raise OptionError(
            f"{name}: {text!r} is neither earliest, latest nor JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}} ({exc})'
        ) from None
    if not isinstance(doc, dict):
        raise OptionError(f'{name}: the JSON must be an object {{"topic": {{"queue": offset}}}}')
    out: dict[str, dict[int, int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{name}: topic {topic!r} must map queue ids to offsets")
        out[topic] = {}
        for queue, offset in queues.items():
            if not (isinstance(queue, str) and queue.isdigit()):
                raise OptionError(f"{name}: queue id {queue!r} of {topic!r} is not a number")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(
                    f"{name}: offset {offset!r} of {topic}/{queue} must be an integer >= 0, "
                    "or -2 (earliest) or -1 (latest)"
                )
            out[topic][int(queue)] = offset
    return out


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
        have = {(q.topic, q.queue_id) for q in chosen}
        for topic, ids in opts.assign.items():
            missing = [q for q in ids if (topic, q) not in have]
            if missing:
                known = sorted(q for t, q in have if t == topic)
                raise OptionError(f"assign: {topic} has no queue(s) {missing} (queues: {known})")
        return [q for q in chosen if q.queue_id in opts.assign[q.topic]]
    return select(queues, opts.topics)


def named_topics(opts: ReadOptions) -> tuple[str, ...]:
    """The topics `opts` names (system topics are read only when named)."""
    if opts.topics is not None:
        return opts.topics
    return tuple(opts.assign) if opts.assign is not None else ()


Lookup = Callable[[Sequence[tuple[str, int, int]]], list[int]]  # store.offsets_for_times


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
        key = (q.topic, q.queue_id)
        if key not in found:
            continue
        if (
            found[key] >= q.max_offset
            and q.max_offset > q.min_offset
            and opts.ts_strategy == "error"
        ):
            ts = opts.starting_ts if isinstance(opts.starting_ts, int) else "the given timestamp"
            raise OptionError(
                f"{name}: no message of {q.topic}/{q.queue_id} was stored at or after {ts} "
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


def resolve_times(
    spec: TimeSpec, queues: Sequence[QueueInfo], lookup: Lookup, name: str, default: int
) -> Offsets:
    """Per queue with a timestamp, the first offset stored at or after it."""
    by_key = {(q.topic, q.queue_id): q for q in queues}
    wanted: dict[QueueKey, int] = {}
    if isinstance(spec, int):
        wanted = dict.fromkeys(by_key, spec)
    else:
        topics = {q.topic for q in queues}
        for topic, per_queue in spec.items():
            if topic not in topics:
                raise OptionError(f"{name} names topic {topic!r}, which is not read "
                                  f"(read: {', '.join(sorted(topics)) or 'none'})")  # fmt: skip
            for queue_id, ts in per_queue.items():
                if (topic, queue_id) not in by_key:
                    ids = sorted(q.queue_id for q in queues if q.topic == topic)
                    raise OptionError(f"{name}: {topic} has no queue {queue_id} (queues: {ids})")
                wanted[(topic, queue_id)] = ts
    keys = sorted(k for k in wanted if by_key[k].max_offset > by_key[k].min_offset)
    offsets = lookup([(t, q, wanted[(t, q)]) for t, q in keys]) if keys else []
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
    by_key = {(q.topic, q.queue_id): q for q in queues}
    default = LATEST if spec == "latest" or name == "endingOffsets" else EARLIEST
    given: dict[QueueKey, int] = {}
    if isinstance(spec, dict):
        topics = {q.topic for q in queues}
        for topic, per_queue in spec.items():
            if topic not in topics:
                raise OptionError(
                    f"{name} names topic {topic!r}, which is not read "
                    f"(read: {', '.join(sorted(topics)) or 'none'})"
                )
            for queue_id, offset in per_queue.items():
                if (topic, queue_id) not in by_key:
                    ids = sorted(q.queue_id for q in queues if q.topic == topic)
                    raise OptionError(f"{name}: {topic} has no queue {queue_id} (queues: {ids})")
                given[(topic, queue_id)] = offset
    out: Offsets = {}
    for key, q in by_key.items():
        offset = given.get(key, default)
        if offset == EARLIEST:
            offset = q.min_offset
        elif offset == LATEST:
            offset = q.max_offset
        elif offset > q.max_offset:
            raise OptionError(
                f"{name}: offset {offset} of {q.topic}/{q.queue_id} is beyond its committed "
                f"end {q.max_offset}"
            )
        elif offset < q.min_offset:
            if fail_on_data_loss:
                raise OptionError(
                    f"{name}: offset {offset} of {q.topic}/{q.queue_id} is below its first "
                    f"retained offset {q.min_offset} (deleted by retention); set "
                    "failOnDataLoss=false to start there instead"
                )
            offset = q.min_offset
        out[key] = offset
    return out


def ranges(start: Offsets, end: Offsets) -> list[Slice]:
    """Non-empty [start, end) per queue of `end` (a queue missing from `start` starts at 0)."""
    out = []
    for (topic, queue_id), hi in sorted(end.items()):
        lo = start.get((topic, queue_id), 0)
        if lo > hi:
            raise OptionError(
                f"{topic}/{queue_id}: starting offset {lo} is after the ending offset {hi}"
            )
        if lo < hi:
            out.append(Slice(topic, queue_id, lo, hi))
    return out


def stream_ranges(
    start: Offsets, end: Offsets, queues: Iterable[QueueInfo], fail_on_data_loss: bool = True
) -> list[Slice]:
    """A micro-batch's ranges: queues new since `start` begin at their earliest offset, and
    a queue whose start retention has deleted meanwhile fails (or skips ahead)."""
    begin = dict(start)
    for q in queues:
        key = (q.topic, q.queue_id)
        if key not in end:
            continue
        if key not in begin:
            begin[key] = q.min_offset
        elif begin[key] < q.min_offset:
            if fail_on_data_loss:
                raise SourceError(
                    f"{q.topic}/{q.queue_id}: offsets {begin[key]}..{q.min_offset - 1} were "
                    "deleted by retention before this query read them; set "
                    "failOnDataLoss=false to skip them"
                )
            begin[key] = min(q.min_offset, end[key])
    return ranges(begin, end)


def split(slices: Iterable[Slice], per_partition: int, min_partitions: int = 1) -> list[Slice]:
    """Cut each range into pieces of at most `per_partition` (smaller for `min_partitions`)."""
    slices = list(slices)
    total = sum(s.end - s.start for s in slices)
    size = per_partition
    if min_partitions > 1 and total:
        size = max(1, min(size, math.ceil(total / min_partitions)))
    out = []
    for s in slices:
        for lo in range(s.start, s.end, size):
            out.append(Slice(s.topic, s.queue_id, lo, min(s.end, lo + size)))
    return out


# ---------------------------------------------------------------- log ranges


def use_log_ranges(partitioning: str, files: bool, span: tuple[int, int, int] | None) -> bool:
    """Cut by commit-log range? (see the module doc; `span`: store.unit_span)."""
    if span is None or partitioning == "queue":
        return False
    if partitioning == "log" or files:
        return True
    lo, hi, size = span
    return hi > lo and size >= LOG_MODE_DENSITY * (hi - lo)


def log_pieces(
    slices: Sequence[Slice],
    span: tuple[int, int, int],
    partitions: int,
    segment_bytes: int | None,
    exact: bool = False,
) -> list[LogPiece]:
    """The range [lo, hi) the slices' messages occupy, cut into about `partitions` pieces of
    equal bytes (none over MAX_PIECE_BYTES; unless `exact`, none under MIN_PIECE_BYTES
    but the only one), cuts moved onto data-segment boundaries when one is close."""
    lo, hi, _ = span
    size = hi - lo
    count = max(1, partitions if exact else min(partitions, math.ceil(size / MIN_PIECE_BYTES)))
    count = max(count, math.ceil(size / MAX_PIECE_BYTES))
    step = size / count
    cuts = {lo, hi}
    for k in range(1, count):
        cut = lo + round(k * step)
        if segment_bytes:
            boundary = round(cut / segment_bytes) * segment_bytes
            if abs(boundary - cut) <= step / 8 and lo < boundary < hi:
                cut = boundary
        cuts.add(cut)
    bounds = sorted(cuts)
    queues = tuple(s for s in slices if s.start < s.end)
    return [LogPiece(a, b, queues) for a, b in itertools.pairwise(bounds) if a < b]


def default_partitions(opts: ReadOptions) -> int:
    """Log ranges: `minPartitions` if given, else this host's cores (Spark's default
    parallelism in local mode)."""
    return opts.min_partitions if opts.min_partitions_given else max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------- filters


@dataclass(frozen=True, slots=True)
class Narrowing:
    """What pushed-down filters leave to read (see the module doc). Bounds: ints,
    low inclusive, high exclusive; None: no bound."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    queue_id_range: tuple[int | None, int | None] = (None, None)
    offset_range: tuple[int | None, int | None] = (None, None)
    time_range: tuple[int | None, int | None] = (None, None)  # store timestamps, ms
    pushed: tuple[str, ...] = field(default=())  # descriptions, for explain and tests

    def with_topics(self, names: Iterable[str], what: str) -> Narrowing:
        new = frozenset(names)
        topics = new if self.topics is None else self.topics & new
        return replace(self, topics=topics, pushed=(*self.pushed, what))

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
        keys = sorted(k for k in e if e[k] > s.get(k, 0))
        if lo is not None and keys:
            found = lookup([(t, q, max(0, lo - slack_ms)) for t, q in keys])
            for k, o in zip(keys, found, strict=True):
                s[k] = max(s.get(k, 0), min(o, e[k]))
        if hi is not None and keys:
            found = lookup([(t, q, hi + slack_ms) for t, q in keys])
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


def cap(start: Offsets, latest: Offsets, max_messages: int | None) -> Offsets:
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


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Offsets as Spark stores them in checkpoints: {"topic": {"queue id": offset}}."""
    out: dict[str, dict[str, int]] = {}
    for (topic, queue_id), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(queue_id)] = offset
    return out


def from_json(doc: Mapping[str, Any]) -> Offsets:
    try:
        return {
            (str(topic), int(queue)): int(offset)
            for topic, queues in doc.items()
            for queue, offset in queues.items()
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise OptionError(f"not a dledger offset: {doc!r} ({exc})") from None
