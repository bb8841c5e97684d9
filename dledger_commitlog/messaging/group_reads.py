"""What a consumer-group fetch reads, in the read pool: one run of each queue it plans.

Owns `QueueRead` (one queue's part of a fetch as the loop hands it over: the
plan's `Read`, the queue's snapshot, the subscription's filter), `Batch` (what
the read found) and `read_batches`, the work itself. Nothing here touches the
group's state, the dispatcher or the node: the loop plans before
(`GroupState.plan_fetch`) and records after (`GroupState.record`, see
`group_fetch`), and every read goes through `log.reads` with snapshots taken on
the loop (`LogView`, `QueueView`: its thread-safety rules; each message checked
against its entry there, `run_reads`).

A queue's units are read in one read, its messages through one map per
commit-log segment, and they stay as stored: a fetch hands them to the client
as they are (a DeliveryRun), so nothing is decoded here unless a filter needs it.
A subscription's filter runs here, on the server and off the loop: a TAG filter
on the units' tag hashes first (a message whose hash is none of the tags' is not
read), then on the tag itself; any other on each message's properties (decoded by
the one codec, `store.message`). A message the filter drops is `skipped` (the
group counts it as acked). Redeliveries are not filtered again: they passed when
first delivered.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from dispatch.dispatcher import parse_tag_expression
from dledger_commitlog.log import reads, run_reads
from dledger_commitlog.messaging.filters import MessageFilter
from dledger_commitlog.messaging.group_state import Read
from store.message import (
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    StoredMessage,
    decode_message,
    tags_hash_code,
)


@dataclass(frozen=True, slots=True)
class QueueRead:
    """One queue's part of a fetch, for the read pool."""

    read: Read  # the plan's
    queue: reads.QueueView | None  # the snapshot the plan's counts come from
    start: int  # where new messages start (past what retention removed)
    redeliver: tuple[int, ...]  # the plan's redeliveries still stored
    filter: MessageFilter | None  # None: every message


@dataclass(frozen=True, slots=True)
class Batch:
    """What a read found of one queue: its messages to deliver, rising (redeliveries
    first), as stored; what the filter dropped; where the cursor goes next."""

    offsets: list[int]
    messages: list[bytes]
    skipped: list[int]
    next_offset: int


def read_batches(view: reads.LogView, jobs: Sequence[QueueRead], max_bytes: int) -> list[Batch]:
    """Each job's batch (in the read pool; `view` taken on the loop with the queues'):
    the units of each queue in one read, the messages of all in one pass, about
    `max_bytes` of them in all (at least one; the jobs first in the list first)."""
    spans: list[run_reads.Span] = []
    for job in jobs:
        if job.queue is not None:
            spans += [(job.queue, a, b, None) for a, b in _spans(job.redeliver)]
            if _end(job) > job.start:
                spans.append((job.queue, job.start, _end(job), _tag_codes(job.filter)))
    found = iter(run_reads.queue_runs(view, spans, max_bytes))
    return [_batch(job, found) for job in jobs]


def _batch(job: QueueRead, found: Iterator[tuple[list[int], list[bytes], int]]) -> Batch:
    """One job's batch from its spans' runs (the next ones `found`)."""
    offsets: list[int] = []
    messages: list[bytes] = []
    if job.queue is not None:
        for _span in _spans(job.redeliver):
            got, raw, _stop = next(found)
            offsets += got
            messages += raw
    if _end(job) <= job.start:
        return Batch(offsets, messages, [], job.start)
    got, raw, end = next(found)
    skipped = [] if len(got) == end - job.start else sorted(set(range(job.start, end)) - set(got))
    flt = job.filter
    if flt is None:
        return Batch(offsets + got, messages + raw, skipped, end)
    for offset, data in zip(got, raw, strict=True):
        msg = decode_message(data, verify_crc=False)  # the entry's CRC covers it
        if flt.matches(msg.tags, filter_properties(msg)):
            offsets.append(offset)
            messages.append(data)
        else:
            skipped.append(offset)
    return Batch(offsets, messages, sorted(skipped), end)


def _end(job: QueueRead) -> int:
    """Where the job's new messages end: the plan's count, within the queue."""
    return 0 if job.queue is None else min(job.queue.max_offset, job.start + job.read.count)


def _tag_codes(flt: MessageFilter | None) -> frozenset[int] | None:
    """The tag hashes a TAG filter takes (None: a filter of another kind, or none)."""
    tags = parse_tag_expression(flt.expression) if flt is not None and flt.kind == "TAG" else None
    return None if tags is None else frozenset(map(tags_hash_code, tags))


def _spans(offsets: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Rising offsets as [a, b) runs of consecutive ones."""
    for _k, run in itertools.groupby(enumerate(offsets), lambda io: io[1] - io[0]):
        members = [o for _i, o in run]
        yield members[0], members[-1] + 1


def filter_properties(msg: StoredMessage) -> dict[str, str]:
    """The properties a SQL92 filter sees: the user's, KEYS and TAGS (the expression's
    `TAGS` is the tag itself), not UNIQ_KEY."""
    props = dict(msg.properties)
    if msg.keys:
        props[PROPERTY_KEYS] = " ".join(msg.keys)
    props.pop(PROPERTY_UNIQ_KEY, None)
    return props
