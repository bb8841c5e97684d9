"""A topic's route in a multi-shard cluster, as a node and a client both see it.

Owns `TopicRoute` (which shards hold a topic's queues, and how the topic's queue k
maps to a (shard, queue id) pair) and the shard that a message id names
(`shard_of_msg_id`; the id's layout is `log.message_layout`'s). The node keeps the
table in shard 0 (`messaging.routes`); the clients cache it (`client.routing`).
docs/scaling.md describes the model.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

SHARD_ZERO_CODE = 0x7FFF  # shard 0's code in a message id (0 is shard 1's; see below)


@dataclass(frozen=True, slots=True, init=False)
class TopicRoute:
    """Where a topic's queues live: `shards`, (shard, queue count) in the order the
    topic's queues are numbered (its queue k is the k-th queue of this concatenation).
    `configured`: set through shard 0 (else the default: every data shard).
    `groups` is the old name of `shards`, as a keyword and as an attribute."""

    topic: str
    shards: tuple[tuple[int, int], ...]
    configured: bool = False

    def __init__(
        self,
        topic: str,
        shards: tuple[tuple[int, int], ...] | None = None,
        configured: bool = False,
        *,
        groups: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        if groups is not None:
            _renamed("TopicRoute(groups=...) is now TopicRoute(shards=...)")
            shards = groups
        if shards is None:
            raise TypeError("TopicRoute() needs its shards")
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "shards", shards)
        object.__setattr__(self, "configured", configured)

    @property
    def groups(self) -> tuple[tuple[int, int], ...]:
        """The old name of `shards`."""
        _renamed("TopicRoute.groups is renamed to TopicRoute.shards")
        return self.shards

    @property
    def total_queues(self) -> int:
        return sum(n for _, n in self.shards)

    def locate(self, queue: int) -> tuple[int, int]:
        """The topic's queue `queue` (0..total_queues-1) as (shard, queue id there)."""
        left = queue
        if left >= 0:
            for shard, count in self.shards:
                if left < count:
                    return shard, left
                left -= count
        raise IndexError(f"queue {queue} outside the {self.total_queues} queues of {self.topic!r}")

    def queue_of_key(self, key: str) -> int:
        """The topic's queue a sharding key maps to (crc32, as a node maps it in one
        shard): every message of the key goes to one queue of one shard, in order."""
        return zlib.crc32(key.encode()) % self.total_queues


def _renamed(what: str) -> None:
    warnings.warn(f"{what}; the old name works for one more release", FutureWarning, stacklevel=3)


def default_route(topic: str, shard_count: int, queues_per_topic: int) -> TopicRoute:
    """The route of a topic nobody configured: every data shard, `queues_per_topic`
    queues each."""
    return TopicRoute(topic, tuple((g, queues_per_topic) for g in range(1, shard_count + 1)))


def shard_ids(shard_count: int) -> list[int]:
    """Every shard of a cluster of `shard_count` data shards: [1] for one, else
    shard 0 (the routes) and 1..shard_count."""
    return [1] if shard_count == 1 else list(range(shard_count + 1))


def preferred_leader(shard: int, node_ids: Sequence[int]) -> int:
    """Shard `shard`'s preferred leader among the bootstrap nodes `node_ids`: the nodes
    taken in turn (shard g: the (g mod n)-th in id order), so that the leaders of a
    cluster's shards spread evenly and no node leads more than ceil(shards / nodes)."""
    ids = sorted(node_ids)
    return ids[shard % len(ids)]


def shard_of_msg_id(msg_id: str) -> int:
    """The shard a message id names (1 for a single-shard cluster's ids): the
    store host's port field carries it above the port's 16 bits. ValueError if
    `msg_id` is no message id."""
    raw = bytes.fromhex(msg_id)
    if len(raw) != 16:
        raise ValueError(f"message id {msg_id!r} must be 32 hex digits")
    code = int.from_bytes(raw[4:8], "big", signed=True) >> 16 & SHARD_ZERO_CODE
    return 1 if code == 0 else 0 if code == SHARD_ZERO_CODE else code
