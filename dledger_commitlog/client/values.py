"""The values both clients take and give: `MessageSpec` in; results out.

Owns the frozen dataclasses a caller sees (`StoredMessage`, `PullResult`,
`NodeStatus`, ...) and their conversion from protobuf at the edge (`put_result`,
`stored_message`, `node_status`), so no caller handles protobuf. Invariant: a
`MessageSpec` that exists is valid as far as the client can tell (bad input is an
`InvalidArgument` before anything is sent, and nothing is stored).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from dledger_commitlog.client.errors import ClientError, InvalidArgument
from dledger_commitlog.common.protocol import MAX_MESSAGE_BYTES_LIMIT
from dledger_commitlog.common.protocol import PutResult as PutResult
from dledger_commitlog.common.routes import TopicRoute as TopicRoute
from dledger_commitlog.common.routes import default_route
from proto import dledger_pb2 as pb
from store.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    message_id,
    split_keys,
)

# What `store.message.decode_fields` gives: fixed fields, topic, body, properties.
StoredParts = tuple[tuple[Any, ...], str, bytes, dict[str, str]]


def new_uniq_key() -> str:
    """A new idempotency key: 32 upper-case hex digits, 128 random bits (as a UUID4's
    hex, without building the UUID)."""
    return os.urandom(16).hex().upper()


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """A message to put. `uniq_key` None: the client draws one before the first attempt."""

    topic: str
    body: bytes | str
    keys: Sequence[str] = ()
    tags: str | None = None
    properties: Mapping[str, str] | None = None
    uniq_key: str | None = None
    queue_id: int | None = None
    flag: int = 0
    delay_level: int = 0  # 1..N of the cluster's delay levels (0: none)
    deliver_at_ms: int = 0  # deliver at this time, ms since the epoch (0: none)
    sharding_key: str = ""  # ordered messages: the same key, the same queue

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise InvalidArgument(f"topic must be a non-empty string, not {self.topic!r}")
        if not isinstance(self.body, bytes | bytearray | memoryview | str):
            raise InvalidArgument(f"body must be bytes or str, not {type(self.body).__name__}")
        if isinstance(self.keys, str) or not all(isinstance(k, str) for k in self.keys):
            raise InvalidArgument(f"keys must be a sequence of strings, not {self.keys!r}")
        props = self.properties or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
            raise InvalidArgument("properties must map strings to strings")
        if self.queue_id is not None and (not isinstance(self.queue_id, int) or self.queue_id < 0):
            raise InvalidArgument(f"queue_id must be a non-negative int, not {self.queue_id!r}")
        for name in ("delay_level", "deliver_at_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"{name} must be a non-negative int, not {value!r}")
        if not isinstance(self.sharding_key, str):
            raise InvalidArgument(f"sharding_key must be a string, not {self.sharding_key!r}")
        if self.sharding_key and self.queue_id is not None:
            raise InvalidArgument("give a queue_id or a sharding_key, not both")
        size = len(self.body.encode() if isinstance(self.body, str) else self.body)
        if size > MAX_MESSAGE_BYTES_LIMIT:
            raise InvalidArgument(
                f"body of {size} bytes: no server takes more than {MAX_MESSAGE_BYTES_LIMIT}; "
                "nothing was sent or stored"
            )

    def to_pb(self, now_ms: int) -> pb.MessageData:
        body = self.body.encode() if isinstance(self.body, str) else bytes(self.body)
        return pb.MessageData(
            topic=self.topic,
            body=body,
            keys=list(self.keys),
            tags=self.tags or "",
            properties=dict(self.properties or {}),
            uniq_key=self.uniq_key or new_uniq_key(),
            born_timestamp_ms=now_ms,
            flag=self.flag,
            queue_id=-1 if self.queue_id is None else self.queue_id,
            has_queue_id=self.queue_id is not None,
            delay_level=self.delay_level,
            deliver_at_ms=self.deliver_at_ms,
            sharding_key=self.sharding_key,
        )


@dataclass(frozen=True, slots=True)
class StoredMessage:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    body: bytes
    keys: tuple[str, ...]
    tags: str
    properties: Mapping[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    body_size: int
    size: int
    uniq_key: str
    flag: int


@dataclass(frozen=True, slots=True)
class HalfResult:
    """A stored half message: end it with `end_transaction`."""

    transaction_id: str
    half_offset: int
    result: PutResult


@dataclass(frozen=True, slots=True)
class Waiting:
    """Messages waiting: how many, and the store time of the oldest (0: none)."""

    messages: int
    oldest_stored_ms: int


@dataclass(frozen=True, slots=True)
class Backlog:
    """Delayed messages not yet delivered, per level (1..N; 0: deliver-at times) with
    its delay in ms, and half messages not yet decided, per producer group."""

    delayed: tuple[tuple[int, int, Waiting], ...]  # (level, delay ms, waiting)
    halves: tuple[tuple[str, Waiting], ...]  # (producer group, waiting)


@dataclass(frozen=True, slots=True)
class TransactionEnd:
    committed: bool
    result: PutResult | None  # the real message's, on commit
    duplicate: bool  # decided before: this call changed nothing


@dataclass(frozen=True, slots=True)
class PullResult:
    messages: tuple[StoredMessage, ...]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueueOffset:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int  # the next committed message's queue offset


@dataclass(frozen=True, slots=True)
class CleanResult:
    deleted_segments: int
    min_offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReadRangeResult:
    messages: bytes  # concatenated encoded messages (store.message format), committed only
    next_offset: int
    committed_offset: int
    min_offset: int


@dataclass(frozen=True, slots=True)
class PeerStatus:
    node_id: int
    match_index: int
    next_index: int
    recent_active: bool


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """One member of the shard: `role` "voter" or "learner"; `match_index` and `lag`
    (the leader's last index - match_index) as the leader knows them, -1 elsewhere."""

    id: int
    role: str
    raft: str
    client: str
    match_index: int
    lag: int


@dataclass(frozen=True, slots=True)
class MemberChange:
    """A committed membership change: its configuration entry and the members after it."""

    config_index: int
    members: tuple[MemberInfo, ...]


@dataclass(frozen=True, slots=True)
class NodeStatus:
    address: str  # the address this client asked
    node_id: int
    role: str
    term: int
    leader_id: int
    leader_address: str
    first_index: int
    last_index: int
    committed_index: int
    committed_pos: int
    flushed_pos: int
    dispatched_pos: int
    applied_index: int
    cluster: str
    peers: tuple[PeerStatus, ...]
    last_chain_crc: int
    flush_mode: str
    loop_lag_max_ms: float = 0.0  # longest the node's event loop was late (see loop_probe)
    members: tuple[MemberInfo, ...] = ()  # voters and learners, lag known on the leader
    drained: bool = False  # campaigns for nothing, takes no leadership (docs/upgrades.md)
    version: str = ""  # the node's software version ("": a node older than the field)
    wire_versions: tuple[int, ...] = (1,)  # the Raft wire versions it speaks


@dataclass(frozen=True, slots=True)
class DrainResult:
    """`drain`'s answer: the node's drained flag, the shard's leader it knows (0: none)
    and whether it handed the leadership over."""

    drained: bool
    leader_id: int
    moved: bool


@dataclass(frozen=True, slots=True)
class StatusError:
    """`status_all`'s entry for a server that did not answer."""

    address: str
    error: ClientError


def _convert(cls: Any, msg: Any, **given: Any) -> Any:
    names = [f.name for f in dataclasses.fields(cls) if f.name not in given]
    return cls(**{name: getattr(msg, name) for name in names}, **given)


def put_result(msg: pb.PutResult) -> PutResult:
    return cast(PutResult, _convert(PutResult, msg))


def stored_message_of(raw: bytes, at: int, parts: StoredParts) -> StoredMessage:
    """The message stored at `raw[at:]`, decoded into `parts` by the message codec
    (`store.message.decode_fields`), as `stored_message` gives it from protobuf."""
    fields, topic, body, props = parts
    keys = props.pop(PROPERTY_KEYS, None)
    tags = props.pop(PROPERTY_TAGS, "")
    uniq_key = props.pop(PROPERTY_UNIQ_KEY, "")
    return StoredMessage(
        topic,
        fields[3],
        fields[5],
        fields[6],
        message_id(raw, at),
        body,
        tuple(split_keys(keys)),
        tags,
        props,
        fields[8],
        fields[11],
        len(body),
        fields[0],
        uniq_key,
        fields[4],
    )


def stored_message(msg: pb.StoredMessage) -> StoredMessage:
    return cast(
        StoredMessage,
        _convert(StoredMessage, msg, keys=tuple(msg.keys), properties=dict(msg.properties)),
    )


def node_status(address: str, msg: pb.StatusResponse) -> NodeStatus:
    peers = tuple(cast(PeerStatus, _convert(PeerStatus, p)) for p in msg.peers)
    return cast(
        NodeStatus,
        _convert(
            NodeStatus,
            msg,
            address=address,
            peers=peers,
            members=member_infos(msg.members),
            wire_versions=tuple(msg.wire_versions) or (1,),  # absent: a version-1 node
        ),
    )


def member_infos(members: Sequence[pb.Member]) -> tuple[MemberInfo, ...]:
    return tuple(cast(MemberInfo, _convert(MemberInfo, m)) for m in members)


def member_change(msg: pb.MemberChangeResponse) -> MemberChange:
    return MemberChange(msg.config_index, member_infos(msg.members))


@dataclass(frozen=True, slots=True)
class GroupLeader:
    """A shard of a multi-shard cluster as the answering process knows it."""

    group: int
    leader_id: int | None
    leader: str | None  # its client address
    members: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Routes:
    """A multi-shard cluster's routes (docs/scaling.md): the data shards, the queues per
    topic a shard holds by default, the configured routes by topic (a topic asked for
    by name is here even with the default route), the leaders the answering process
    knows, the table's version, and how old it may be (`age_ms`: 0 confirmed current or
    from shard 0's leader; else since the answering node heard from that leader; -1
    unknown)."""

    shard_count: int
    queues_per_topic: int
    routes: Mapping[str, TopicRoute]
    leaders: Mapping[int, GroupLeader]
    version: int
    age_ms: int = 0

    def route(self, topic: str) -> TopicRoute:
        """`topic`'s route: the configured one, or every data shard's default queues."""
        found = self.routes.get(topic)
        return found or default_route(topic, self.shard_count, self.queues_per_topic)


def topic_route(msg: pb.TopicRoute) -> TopicRoute:
    return TopicRoute(msg.topic, tuple((q.group, q.queues) for q in msg.groups), msg.configured)


def routes(msg: pb.RouteResponse) -> Routes:
    leaders = {
        x.group: GroupLeader(x.group, x.leader_id or None, x.leader or None, tuple(x.members))
        for x in msg.leaders
    }
    table = {r.topic: topic_route(r) for r in msg.routes}
    return Routes(msg.data_groups, msg.queues_per_topic, table, leaders, msg.version, msg.age_ms)
