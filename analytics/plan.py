"""Options of the `dledger` source and planning of what to read: pure functions, no Spark.

Offsets are per consume queue, in the manner of Spark's Kafka source:
`startingOffsets` / `endingOffsets` are "earliest", "latest", or JSON naming
topics and queues, `{"orders": {"0": 23, "1": -2}}`, where -2 means the queue's
earliest offset and -1 its latest (committed end). Queues and topics a JSON
leaves out start at earliest and end at latest. As with Kafka, a batch query may
not start at "latest" nor end at "earliest", and a streaming query takes no
`endingOffsets`. A read covers [start, end) of each queue; each range is cut into
partitions of at most `messagesPerPartition` messages (fewer when `minPartitions`
asks for more partitions).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .errors import OptionError, SourceError
from .sources import SYSTEM_TOPIC_PREFIX, QueueInfo

EARLIEST: Final = -2
LATEST: Final = -1
QueueKey = tuple[str, int]
Offsets = dict[QueueKey, int]
OffsetSpec = str | dict[str, dict[int, int]]  # "earliest" | "latest" | per topic and queue

DEFAULT_MESSAGES_PER_PARTITION: Final = 500_000
# name (lower case, as Spark hands options over) -> the spelling users write
OPTIONS: Final = {
    name.lower(): name
    for name in (
        "servers",
        "path",
        "topics",
        "startingOffsets",
        "endingOffsets",
        "messagesPerPartition",
        "minPartitions",
        "maxOffsetsPerTrigger",
        "failOnDataLoss",
        "timeoutSeconds",
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


@dataclass(frozen=True, slots=True)
class Slice:
    """Queue offsets [start, end) of one queue: what one Spark partition reads."""

    topic: str
    queue_id: int
    start: int
    end: int


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
    topics = None
    if "topics" in opts:
        topics = tuple(dict.fromkeys(t.strip() for t in opts["topics"].split(",") if t.strip()))
        if not topics:
            raise OptionError("topics: give at least one topic name (or leave the option out)")
    default_start = "latest" if streaming else "earliest"
    starting = parse_offsets(opts.get("startingoffsets", default_start), "startingOffsets")
    if streaming and "endingoffsets" in opts:
        raise OptionError("endingOffsets is for batch queries; a stream has no end")
    ending = parse_offsets(opts.get("endingoffsets", "latest"), "endingOffsets")
    if not streaming:
        if starting == "latest" or _has(starting, LATEST):
            raise OptionError("startingOffsets: a batch query cannot start at latest")
        if ending == "earliest" or _has(ending, EARLIEST):
            raise OptionError("endingOffsets: a batch query cannot end at earliest")
    if not streaming and "maxoffsetspertrigger" in opts:
        raise OptionError("maxOffsetsPerTrigger is for streaming queries")
    limit = opts.get("maxoffsetspertrigger")
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
    )


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
