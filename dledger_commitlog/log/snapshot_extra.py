"""The application part of a snapshot's description: one codec, leader and follower.

Owns the "extra" a leader appends to its entry store's base record in
`EntryStore.snapshot_data()` (the node sets `EntryStore.snapshot_extra`): what a
follower restored from the leader's retained log needs besides it, as compact JSON

    {"queue_next": [[topic, queue_id, next_queue_offset], ...],
     "offsets": [[group, topic, queue_id, offset], ...]}

sorted, one item per key. `encode_extra` writes it (leader side), `decode_extra`
reads it (follower side) and is the only judge of its shape.

Invariants `decode_extra` enforces, so that a description that passes it can be
restored without surprise: at most MAX_EXTRA_BYTES (what one gRPC message can carry:
a genuine leader never sends more); a JSON object with exactly the two keys; every
item a list of exactly its fields; topics and groups names the put and offset paths
accept (`store.message.check_name`); queue ids in [0, 2^31) (the message format's
i32); offsets in [0, 2^63); no key twice. Anything else is a ValueError naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from dispatch.dispatcher import GroupKey
from netkit.channel import MAX_MESSAGE_BYTES
from store.errors import InvalidMessage
from store.message import check_name

MAX_EXTRA_BYTES = MAX_MESSAGE_BYTES
MAX_QUEUE_ID = 1 << 31
MAX_OFFSET = 1 << 63

QueueKey = tuple[str, int]  # (topic, queue id)
K = TypeVar("K", QueueKey, GroupKey)


@dataclass(frozen=True, slots=True)
class SnapshotExtra:
    """What a restored follower's commit log and dispatcher start from."""

    queue_next: dict[QueueKey, int]  # the next queue offset of every queue
    offsets: dict[GroupKey, int]  # every consumer group's committed offset


def encode_extra(queue_next: Mapping[QueueKey, int], offsets: Mapping[GroupKey, int]) -> bytes:
    """The extra of a leader whose commit log and dispatcher hold these (sorted JSON)."""
    doc = {
        "queue_next": [[t, q, n] for (t, q), n in sorted(queue_next.items())],
        "offsets": [[g, t, q, o] for (g, t, q), o in sorted(offsets.items())],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_extra(raw: bytes) -> SnapshotExtra:
    """The extra `raw` describes; ValueError naming what breaks the format."""
    if len(raw) > MAX_EXTRA_BYTES:
        raise ValueError(f"extra of {len(raw)} bytes, over {MAX_EXTRA_BYTES}")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ValueError(f"extra is no JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"queue_next", "offsets"}:
        raise ValueError('extra is no object of exactly "queue_next" and "offsets"')
    names: set[str] = set()  # those check_name passed: many items share one
    queue_next: dict[QueueKey, int] = {}
    for item in _items(doc["queue_next"], "queue_next", 3):
        topic, queue_id, n = item
        key = (_name(item, topic, "topic", names), _queue_id(item, queue_id))
        _add_new(queue_next, key, _offset(item, n), item)
    offsets: dict[GroupKey, int] = {}
    for item in _items(doc["offsets"], "offsets", 4):
        group, topic, queue_id, off = item
        group_key = (
            _name(item, group, "group", names),
            _name(item, topic, "topic", names),
            _queue_id(item, queue_id),
        )
        _add_new(offsets, group_key, _offset(item, off), item)
    return SnapshotExtra(queue_next, offsets)


def _items(value: Any, name: str, width: int) -> list[list[Any]]:
    if not isinstance(value, list):
        raise ValueError(f"extra's {name} is no list")
    for item in value:
        if not isinstance(item, list) or len(item) != width:
            raise ValueError(f"extra's {name} has {_show(item)}, not a list of {width} fields")
    return value


def _name(item: list[Any], name: Any, what: str, names: set[str]) -> str:
    if isinstance(name, str) and name in names:
        return name
    try:
        check_name(name, what)
    except InvalidMessage as exc:
        raise ValueError(f"extra item {_show(item)}: {exc}") from None
    names.add(name)
    return str(name)


def _queue_id(item: list[Any], value: Any) -> int:
    if not _is_int(value) or not 0 <= value < MAX_QUEUE_ID:
        raise ValueError(f"extra item {_show(item)}: queue id not in [0, {MAX_QUEUE_ID})")
    return int(value)


def _offset(item: list[Any], value: Any) -> int:
    if not _is_int(value) or not 0 <= value < MAX_OFFSET:
        raise ValueError(f"extra item {_show(item)}: offset not in [0, {MAX_OFFSET})")
    return int(value)


def _add_new(into: dict[K, int], key: K, value: int, item: list[Any]) -> None:
    if key in into:
        raise ValueError(f"extra item {_show(item)}: its key appears twice")
    into[key] = value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(item: Any) -> str:
    """An item for an error message, cut short: a forged one may be huge."""
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."
