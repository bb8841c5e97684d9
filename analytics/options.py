"""Options of the `dledger` source, parsed and checked: pure functions, no Spark.

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

`parse_options` turns the options Spark hands over (names in any case) into a
`ReadOptions`, or raises `OptionError` naming the option and what it takes;
nothing is looked up yet: offsets and timestamps stay as given (`OffsetSpec`,
`TimeSpec`) until `analytics.offsets` resolves them against the queues.
`schema_columns` checks a user schema's fields as `columns` is checked (a column
under its old name, RENAMED_COLUMNS, is read, with the same warning).
Invariant: a `ReadOptions` is consistent: exactly one of servers and path, at
most one subscription, no option of the other kind of query (endingOffsets on
a stream, trigger limits on a batch).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from analytics.codec import COLUMNS, SPARK_TYPES
from analytics.errors import OptionError
from analytics.sources import METADATA_COLUMNS, QueueRef, parse_queue_ref

EARLIEST: Final = -2
LATEST: Final = -1
# "earliest" | "latest" | per topic and queue (a queue id: shard 1; (shard, queue id): another)
OffsetSpec = str | dict[str, dict[QueueRef, int]]

DEFAULT_MESSAGES_PER_PARTITION: Final = 500_000
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60 * 1000  # Kafka's default, 15m
DEFAULT_TIMESTAMP_SLACK_MS: Final = 1000
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
    assign: dict[str, tuple[QueueRef, ...]] | None = None
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


TimeSpec = int | dict[str, dict[QueueRef, int]]  # one timestamp for all, or per topic and queue


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
) -> tuple[tuple[str, ...] | None, str | None, dict[str, tuple[QueueRef, ...]] | None]:
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


def _parse_assign(text: str) -> dict[str, tuple[QueueRef, ...]]:
    """`{"orders": [0, 2], "pay": [1]}`: the queues to read (of another shard than 1:
    `"G:Q"` strings, `{"orders": ["2:0", "3:1"]}`)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise OptionError(
            f'assign: {text!r} is not JSON like {{"topic": [0, 1]}} ({exc})'
        ) from None
    if not isinstance(doc, dict) or not doc:
        raise OptionError('assign: the JSON must be a non-empty object {"topic": [queue ids]}')
    out: dict[str, tuple[QueueRef, ...]] = {}
    for topic, ids in doc.items():
        if not isinstance(ids, list) or not ids:
            raise OptionError(f"assign: topic {topic!r} must map to a non-empty list of queue ids")
        refs: set[QueueRef] = set()
        for q in ids:
            ref = parse_queue_ref(q) if isinstance(q, str) else None
            if ref is not None:
                refs.add(ref)
                continue
            if isinstance(q, bool) or not isinstance(q, int) or q < 0:
                raise OptionError(
                    f"assign: queue id {q!r} of {topic!r} is not an integer >= 0 "
                    '(nor "shard:queue id")'
                )
            refs.add(q)
        out[str(topic)] = tuple(sorted(refs, key=_ref_order))
    return out


def _ref_order(ref: QueueRef) -> tuple[int, int]:
    return (1, ref) if isinstance(ref, int) else ref


def _queue_ref(text: object, name: str, topic: str) -> QueueRef:
    """A queue of an offsets JSON: "Q" or "G:Q" (see `analytics.sources.parse_queue_ref`)."""
    ref = parse_queue_ref(text) if isinstance(text, str) else None
    if ref is None:
        raise OptionError(
            f"{name}: queue id {text!r} of {topic!r} is not a number, nor "
            '"shard:queue id" ("2:0": queue 0 of shard 2)'
        )
    return ref


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
    out: dict[str, dict[QueueRef, int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{per_queue}: topic {topic!r} must map queue ids to timestamps")
        out[topic] = {}
        for queue, ts in queues.items():
            if not (isinstance(queue, str) and queue.isdigit()):
                ref = _queue_ref(queue, per_queue, topic)
            else:
                ref = int(queue)
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise OptionError(
                    f"{per_queue}: timestamp {ts!r} of {topic}/{queue} must be an integer >= 0 "
                    "(milliseconds since the epoch)"
                )
            out[topic][ref] = ts
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


# Columns under an old name, read for one more release with a warning naming the new.
RENAMED_COLUMNS: Final = {"raft_group": "shard"}
# Every column a schema may name, with its Spark type.
SOURCE_TYPES: Final = {**SPARK_TYPES, **METADATA_COLUMNS}


def _renamed_column(name: str) -> str:
    new = RENAMED_COLUMNS.get(name)
    if new is None:
        return name
    warnings.warn(
        f"column {name} is now {new} (the old name works for one more release)",
        FutureWarning,
        stacklevel=3,
    )
    return new


def schema_columns(
    fields: Sequence[tuple[str, str]], wanted: tuple[str, ...] | None = None
) -> list[str]:
    """The source columns a user schema asks for, its fields given as (name, Spark
    type), checked against the source's. A field under a column's old name
    (RENAMED_COLUMNS) reads that column, with the `columns` option's warning; the rows
    keep the field's name. `wanted`: the `columns` option too, which must agree."""
    out: list[str] = []
    named: dict[str, str] = {}  # column -> the field that named it first
    for name, got in fields:
        column = _renamed_column(name)
        want = SOURCE_TYPES.get(column)
        if want is None:
            raise OptionError(
                f"schema: {name!r} is not a column of the dledger source "
                f"(columns: {', '.join(SOURCE_TYPES)})"
            )
        if got != want:
            raise OptionError(f"schema: column {name} is {want}, not {got}")
        first = named.setdefault(column, name)
        if first != name:
            raise OptionError(f"schema: {first} and {name} are both column {column}: name it once")
        out.append(column)
    if not out:
        raise OptionError("schema: no columns")
    if wanted is not None and tuple(out) != wanted:
        raise OptionError(
            f"columns: {','.join(wanted)} differs from the schema given ({','.join(out)}): "
            "give one or the other"
        )
    return out


def _columns(opts: Mapping[str, str]) -> tuple[str, ...] | None:
    """`columns`: the source columns to read (the schema), comma-separated."""
    if "columns" not in opts:
        return None
    names = tuple(
        dict.fromkeys(_renamed_column(c.strip()) for c in opts["columns"].split(",") if c.strip())
    )
    unknown = [c for c in names if c not in COLUMNS and c not in METADATA_COLUMNS]
    if not names or unknown:
        raise OptionError(
            f"columns: {', '.join(unknown) or 'none given'} "
            f"(columns of the source: {', '.join((*COLUMNS, *METADATA_COLUMNS))})"
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
    out: dict[str, dict[QueueRef, int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{name}: topic {topic!r} must map queue ids to offsets")
        out[topic] = {}
        for queue, offset in queues.items():
            if not (isinstance(queue, str) and queue.isdigit()):
                ref = _queue_ref(queue, name, topic)
            else:
                ref = int(queue)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(
                    f"{name}: offset {offset!r} of {topic}/{queue} must be an integer >= 0, "
                    "or -2 (earliest) or -1 (latest)"
                )
            out[topic][ref] = offset
    return out
