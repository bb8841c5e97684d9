from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MessageData(_message.Message):
    __slots__ = ("topic", "body", "keys", "tags", "properties", "uniq_key", "born_timestamp_ms", "flag", "queue_id", "has_queue_id", "delay_level", "deliver_at_ms", "sharding_key")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SHARDING_KEY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    body: bytes
    keys: _containers.RepeatedScalarFieldContainer[str]
    tags: str
    properties: _containers.ScalarMap[str, str]
    uniq_key: str
    born_timestamp_ms: int
    flag: int
    queue_id: int
    has_queue_id: bool
    delay_level: int
    deliver_at_ms: int
    sharding_key: str
    def __init__(self, topic: _Optional[str] = ..., body: _Optional[bytes] = ..., keys: _Optional[_Iterable[str]] = ..., tags: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., uniq_key: _Optional[str] = ..., born_timestamp_ms: _Optional[int] = ..., flag: _Optional[int] = ..., queue_id: _Optional[int] = ..., has_queue_id: _Optional[bool] = ..., delay_level: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ..., sharding_key: _Optional[str] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("topic", "filter_kind", "expression")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_KIND_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    filter_kind: str
    expression: str
    def __init__(self, topic: _Optional[str] = ..., filter_kind: _Optional[str] = ..., expression: _Optional[str] = ...) -> None: ...

class QueueLease(_message.Message):
    __slots__ = ("topic", "queue_id", "epoch", "next_offset", "in_flight", "unacked_from")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    UNACKED_FROM_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    epoch: int
    next_offset: int
    in_flight: int
    unacked_from: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., epoch: _Optional[int] = ..., next_offset: _Optional[int] = ..., in_flight: _Optional[int] = ..., unacked_from: _Optional[int] = ...) -> None: ...

class GroupHeartbeatRequest(_message.Message):
    __slots__ = ("group", "member_id", "subscriptions", "strategy", "orderly", "max_reconsume", "ack_wait_ms", "held", "client", "first_retry_level")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ORDERLY_FIELD_NUMBER: _ClassVar[int]
    MAX_RECONSUME_FIELD_NUMBER: _ClassVar[int]
    ACK_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    FIRST_RETRY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    group: str
    member_id: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    strategy: str
    orderly: bool
    max_reconsume: int
    ack_wait_ms: int
    held: _containers.RepeatedCompositeFieldContainer[QueueLease]
    client: str
    first_retry_level: int
    def __init__(self, group: _Optional[str] = ..., member_id: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., strategy: _Optional[str] = ..., orderly: _Optional[bool] = ..., max_reconsume: _Optional[int] = ..., ack_wait_ms: _Optional[int] = ..., held: _Optional[_Iterable[_Union[QueueLease, _Mapping]]] = ..., client: _Optional[str] = ..., first_retry_level: _Optional[int] = ...) -> None: ...

class GroupHeartbeatResponse(_message.Message):
    __slots__ = ("queues", "session_timeout_ms", "heartbeat_interval_ms", "generation")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueLease]
    session_timeout_ms: int
    heartbeat_interval_ms: int
    generation: int
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueLease, _Mapping]]] = ..., session_timeout_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class GroupFetchRequest(_message.Message):
    __slots__ = ("group", "member_id", "max_messages", "wait_ms", "runs")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    group: str
    member_id: str
    max_messages: int
    wait_ms: int
    runs: bool
    def __init__(self, group: _Optional[str] = ..., member_id: _Optional[str] = ..., max_messages: _Optional[int] = ..., wait_ms: _Optional[int] = ..., runs: _Optional[bool] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("message", "epoch", "reconsume_times", "origin_topic", "delivery_count")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TOPIC_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    message: StoredMessage
    epoch: int
    reconsume_times: int
    origin_topic: str
    delivery_count: int
    def __init__(self, message: _Optional[_Union[StoredMessage, _Mapping]] = ..., epoch: _Optional[int] = ..., reconsume_times: _Optional[int] = ..., origin_topic: _Optional[str] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class DeliveryRun(_message.Message):
    __slots__ = ("topic", "queue_id", "epoch", "messages", "delivery_counts", "reconsume_times")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNTS_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    epoch: int
    messages: bytes
    delivery_counts: _containers.RepeatedScalarFieldContainer[int]
    reconsume_times: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., epoch: _Optional[int] = ..., messages: _Optional[bytes] = ..., delivery_counts: _Optional[_Iterable[int]] = ..., reconsume_times: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupFetchResponse(_message.Message):
    __slots__ = ("deliveries", "queues", "generation", "runs")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    queues: _containers.RepeatedCompositeFieldContainer[QueueLease]
    generation: int
    runs: _containers.RepeatedCompositeFieldContainer[DeliveryRun]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., queues: _Optional[_Iterable[_Union[QueueLease, _Mapping]]] = ..., generation: _Optional[int] = ..., runs: _Optional[_Iterable[_Union[DeliveryRun, _Mapping]]] = ...) -> None: ...

class MessageHandle(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "epoch", "end_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    epoch: int
    end_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class GroupAckRequest(_message.Message):
    __slots__ = ("group", "member_id", "handles")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    group: str
    member_id: str
    handles: _containers.RepeatedCompositeFieldContainer[MessageHandle]
    def __init__(self, group: _Optional[str] = ..., member_id: _Optional[str] = ..., handles: _Optional[_Iterable[_Union[MessageHandle, _Mapping]]] = ...) -> None: ...

class GroupAckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class GroupNackRequest(_message.Message):
    __slots__ = ("group", "member_id", "handle", "delay_level")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    group: str
    member_id: str
    handle: MessageHandle
    delay_level: int
    def __init__(self, group: _Optional[str] = ..., member_id: _Optional[str] = ..., handle: _Optional[_Union[MessageHandle, _Mapping]] = ..., delay_level: _Optional[int] = ...) -> None: ...

class GroupNackResponse(_message.Message):
    __slots__ = ("outcome", "reconsume_times", "delay_ms")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    reconsume_times: int
    delay_ms: int
    def __init__(self, outcome: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class GroupLeaveRequest(_message.Message):
    __slots__ = ("group", "member_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    member_id: str
    def __init__(self, group: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class GroupLeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("group", "members", "lag", "retries", "dead_letters", "strategy", "orderly", "generation", "oldest_unconsumed_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ORDERLY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNCONSUMED_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    members: int
    lag: int
    retries: int
    dead_letters: int
    strategy: str
    orderly: bool
    generation: int
    oldest_unconsumed_ms: int
    def __init__(self, group: _Optional[str] = ..., members: _Optional[int] = ..., lag: _Optional[int] = ..., retries: _Optional[int] = ..., dead_letters: _Optional[int] = ..., strategy: _Optional[str] = ..., orderly: _Optional[bool] = ..., generation: _Optional[int] = ..., oldest_unconsumed_ms: _Optional[int] = ...) -> None: ...

class GroupListResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class GroupDescribeRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class GroupMemberInfo(_message.Message):
    __slots__ = ("member_id", "client", "last_seen_ms_ago", "queues")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    client: str
    last_seen_ms_ago: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueLease]
    def __init__(self, member_id: _Optional[str] = ..., client: _Optional[str] = ..., last_seen_ms_ago: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueLease, _Mapping]]] = ...) -> None: ...

class GroupQueueInfo(_message.Message):
    __slots__ = ("topic", "queue_id", "committed", "max_offset", "lag", "owner", "epoch", "in_flight", "revoking", "oldest_unconsumed_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REVOKING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNCONSUMED_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    committed: int
    max_offset: int
    lag: int
    owner: str
    epoch: int
    in_flight: int
    revoking: bool
    oldest_unconsumed_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., committed: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag: _Optional[int] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., in_flight: _Optional[int] = ..., revoking: _Optional[bool] = ..., oldest_unconsumed_ms: _Optional[int] = ...) -> None: ...

class GroupDescribeResponse(_message.Message):
    __slots__ = ("summary", "members", "queues", "subscriptions")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    summary: GroupSummary
    members: _containers.RepeatedCompositeFieldContainer[GroupMemberInfo]
    queues: _containers.RepeatedCompositeFieldContainer[GroupQueueInfo]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, summary: _Optional[_Union[GroupSummary, _Mapping]] = ..., members: _Optional[_Iterable[_Union[GroupMemberInfo, _Mapping]]] = ..., queues: _Optional[_Iterable[_Union[GroupQueueInfo, _Mapping]]] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class GroupResetOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "to", "value", "force")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    to: str
    value: int
    force: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., to: _Optional[str] = ..., value: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class GroupResetOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[GroupOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[GroupOffset, _Mapping]]] = ...) -> None: ...

class GroupDlqRequest(_message.Message):
    __slots__ = ("group", "from_offset", "max_messages", "resend_offsets", "resend_all")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RESEND_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    RESEND_ALL_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_offset: int
    max_messages: int
    resend_offsets: _containers.RepeatedScalarFieldContainer[int]
    resend_all: bool
    def __init__(self, group: _Optional[str] = ..., from_offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., resend_offsets: _Optional[_Iterable[int]] = ..., resend_all: _Optional[bool] = ...) -> None: ...

class GroupDlqResponse(_message.Message):
    __slots__ = ("messages", "resent", "next_offset", "max_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RESENT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    resent: int
    next_offset: int
    max_offset: int
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., resent: _Optional[int] = ..., next_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class BacklogRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DelayedBacklog(_message.Message):
    __slots__ = ("level", "delay_ms", "messages", "oldest_stored_ms")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_STORED_MS_FIELD_NUMBER: _ClassVar[int]
    level: int
    delay_ms: int
    messages: int
    oldest_stored_ms: int
    def __init__(self, level: _Optional[int] = ..., delay_ms: _Optional[int] = ..., messages: _Optional[int] = ..., oldest_stored_ms: _Optional[int] = ...) -> None: ...

class HalfBacklog(_message.Message):
    __slots__ = ("producer_group", "messages", "oldest_stored_ms")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_STORED_MS_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    messages: int
    oldest_stored_ms: int
    def __init__(self, producer_group: _Optional[str] = ..., messages: _Optional[int] = ..., oldest_stored_ms: _Optional[int] = ...) -> None: ...

class BacklogResponse(_message.Message):
    __slots__ = ("delayed", "halves")
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    HALVES_FIELD_NUMBER: _ClassVar[int]
    delayed: _containers.RepeatedCompositeFieldContainer[DelayedBacklog]
    halves: _containers.RepeatedCompositeFieldContainer[HalfBacklog]
    def __init__(self, delayed: _Optional[_Iterable[_Union[DelayedBacklog, _Mapping]]] = ..., halves: _Optional[_Iterable[_Union[HalfBacklog, _Mapping]]] = ...) -> None: ...

class MessageTraceRequest(_message.Message):
    __slots__ = ("msg_id",)
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    def __init__(self, msg_id: _Optional[str] = ...) -> None: ...

class TraceEvent(_message.Message):
    __slots__ = ("time_ms", "kind", "group", "topic", "queue_id", "queue_offset", "commitlog_offset", "member_id", "delivery_count", "delay_level", "reconsume_times", "outcome", "reason", "due_ms")
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DUE_MS_FIELD_NUMBER: _ClassVar[int]
    time_ms: int
    kind: str
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    member_id: str
    delivery_count: int
    delay_level: int
    reconsume_times: int
    outcome: str
    reason: str
    due_ms: int
    def __init__(self, time_ms: _Optional[int] = ..., kind: _Optional[str] = ..., group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commitlog_offset: _Optional[int] = ..., member_id: _Optional[str] = ..., delivery_count: _Optional[int] = ..., delay_level: _Optional[int] = ..., reconsume_times: _Optional[int] = ..., outcome: _Optional[str] = ..., reason: _Optional[str] = ..., due_ms: _Optional[int] = ...) -> None: ...

class TraceGroup(_message.Message):
    __slots__ = ("group", "consumed", "history_since_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    consumed: bool
    history_since_ms: int
    def __init__(self, group: _Optional[str] = ..., consumed: _Optional[bool] = ..., history_since_ms: _Optional[int] = ...) -> None: ...

class MessageTraceResponse(_message.Message):
    __slots__ = ("events", "groups")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TraceEvent]
    groups: _containers.RepeatedCompositeFieldContainer[TraceGroup]
    def __init__(self, events: _Optional[_Iterable[_Union[TraceEvent, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[TraceGroup, _Mapping]]] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("message", "cluster")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    message: MessageData
    cluster: str
    def __init__(self, message: _Optional[_Union[MessageData, _Mapping]] = ..., cluster: _Optional[str] = ...) -> None: ...

class PutResult(_message.Message):
    __slots__ = ("msg_id", "commitlog_offset", "queue_id", "queue_offset", "store_timestamp_ms", "duplicate")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    commitlog_offset: int
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int
    duplicate: bool
    def __init__(self, msg_id: _Optional[str] = ..., commitlog_offset: _Optional[int] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: PutResult
    def __init__(self, result: _Optional[_Union[PutResult, _Mapping]] = ...) -> None: ...

class PutBatchRequest(_message.Message):
    __slots__ = ("messages", "cluster")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[MessageData]
    cluster: str
    def __init__(self, messages: _Optional[_Iterable[_Union[MessageData, _Mapping]]] = ..., cluster: _Optional[str] = ...) -> None: ...

class PutBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutResult, _Mapping]]] = ...) -> None: ...

class PutFrame(_message.Message):
    __slots__ = ("seq", "messages", "cluster")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    seq: int
    messages: _containers.RepeatedCompositeFieldContainer[MessageData]
    cluster: str
    def __init__(self, seq: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[MessageData, _Mapping]]] = ..., cluster: _Optional[str] = ...) -> None: ...

class PutOutcome(_message.Message):
    __slots__ = ("result", "code", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: PutResult
    code: int
    error: str
    def __init__(self, result: _Optional[_Union[PutResult, _Mapping]] = ..., code: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class PutFrameResult(_message.Message):
    __slots__ = ("seq", "outcomes", "leader")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    seq: int
    outcomes: _containers.RepeatedCompositeFieldContainer[PutOutcome]
    leader: str
    def __init__(self, seq: _Optional[int] = ..., outcomes: _Optional[_Iterable[_Union[PutOutcome, _Mapping]]] = ..., leader: _Optional[str] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("msg_id", "commitlog_offset", "linearizable")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    commitlog_offset: int
    linearizable: bool
    def __init__(self, msg_id: _Optional[str] = ..., commitlog_offset: _Optional[int] = ..., linearizable: _Optional[bool] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "body", "keys", "tags", "properties", "born_timestamp_ms", "store_timestamp_ms", "body_size", "size", "uniq_key", "flag")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    body: bytes
    keys: _containers.RepeatedScalarFieldContainer[str]
    tags: str
    properties: _containers.ScalarMap[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    body_size: int
    size: int
    uniq_key: str
    flag: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commitlog_offset: _Optional[int] = ..., msg_id: _Optional[str] = ..., body: _Optional[bytes] = ..., keys: _Optional[_Iterable[str]] = ..., tags: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_timestamp_ms: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., body_size: _Optional[int] = ..., size: _Optional[int] = ..., uniq_key: _Optional[str] = ..., flag: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: StoredMessage
    def __init__(self, message: _Optional[_Union[StoredMessage, _Mapping]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "max_messages", "tag_expression", "wait_ms", "raw", "linearizable", "max_bytes", "end_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TAG_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    max_messages: int
    tag_expression: str
    wait_ms: int
    raw: bool
    linearizable: bool
    max_bytes: int
    end_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., tag_expression: _Optional[str] = ..., wait_ms: _Optional[int] = ..., raw: _Optional[bool] = ..., linearizable: _Optional[bool] = ..., max_bytes: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("messages", "next_offset", "min_offset", "max_offset", "raw_messages")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RAW_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    raw_messages: bytes
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., raw_messages: _Optional[bytes] = ...) -> None: ...

class QueueOffsetsRequest(_message.Message):
    __slots__ = ("topic", "linearizable")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    linearizable: bool
    def __init__(self, topic: _Optional[str] = ..., linearizable: _Optional[bool] = ...) -> None: ...

class QueueOffset(_message.Message):
    __slots__ = ("topic", "queue_id", "min_offset", "max_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class QueueOffsetsResponse(_message.Message):
    __slots__ = ("queues", "dispatched_offset", "local_files")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FILES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    dispatched_offset: int
    local_files: LocalFiles
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ..., dispatched_offset: _Optional[int] = ..., local_files: _Optional[_Union[LocalFiles, _Mapping]] = ...) -> None: ...

class LocalFiles(_message.Message):
    __slots__ = ("data_dir", "boot_id", "dir_device", "dir_inode", "log_file_end")
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    DIR_DEVICE_FIELD_NUMBER: _ClassVar[int]
    DIR_INODE_FIELD_NUMBER: _ClassVar[int]
    LOG_FILE_END_FIELD_NUMBER: _ClassVar[int]
    data_dir: str
    boot_id: str
    dir_device: int
    dir_inode: int
    log_file_end: int
    def __init__(self, data_dir: _Optional[str] = ..., boot_id: _Optional[str] = ..., dir_device: _Optional[int] = ..., dir_inode: _Optional[int] = ..., log_file_end: _Optional[int] = ...) -> None: ...

class CommitOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset", "cluster", "member_id", "epoch")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    cluster: str
    member_id: str
    epoch: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., cluster: _Optional[str] = ..., member_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class CommitOffsetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "linearizable")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    linearizable: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., linearizable: _Optional[bool] = ...) -> None: ...

class GroupOffset(_message.Message):
    __slots__ = ("topic", "queue_id", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class FetchOffsetResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[GroupOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[GroupOffset, _Mapping]]] = ...) -> None: ...

class CleanNowRequest(_message.Message):
    __slots__ = ("force",)
    FORCE_FIELD_NUMBER: _ClassVar[int]
    force: bool
    def __init__(self, force: _Optional[bool] = ...) -> None: ...

class CleanNowResponse(_message.Message):
    __slots__ = ("deleted_segments", "min_offset", "reason")
    DELETED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    deleted_segments: int
    min_offset: int
    reason: str
    def __init__(self, deleted_segments: _Optional[int] = ..., min_offset: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class QueryByKeyRequest(_message.Message):
    __slots__ = ("topic", "key", "begin_ms", "end_ms", "max_messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BEGIN_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    begin_ms: int
    end_ms: int
    max_messages: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., begin_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., max_messages: _Optional[int] = ...) -> None: ...

class QueryByKeyResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("reset_loop_lag",)
    RESET_LOOP_LAG_FIELD_NUMBER: _ClassVar[int]
    reset_loop_lag: bool
    def __init__(self, reset_loop_lag: _Optional[bool] = ...) -> None: ...

class PeerStatus(_message.Message):
    __slots__ = ("node_id", "match_index", "next_index", "recent_active")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NEXT_INDEX_FIELD_NUMBER: _ClassVar[int]
    RECENT_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    match_index: int
    next_index: int
    recent_active: bool
    def __init__(self, node_id: _Optional[int] = ..., match_index: _Optional[int] = ..., next_index: _Optional[int] = ..., recent_active: _Optional[bool] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "role", "term", "leader_id", "leader_address", "first_index", "last_index", "committed_index", "committed_pos", "flushed_pos", "dispatched_pos", "applied_index", "cluster", "peers", "last_chain_crc", "flush_mode", "loop_lag_max_ms", "members", "drained", "version", "wire_versions")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_POS_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_POS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_POS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHAIN_CRC_FIELD_NUMBER: _ClassVar[int]
    FLUSH_MODE_FIELD_NUMBER: _ClassVar[int]
    LOOP_LAG_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
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
    peers: _containers.RepeatedCompositeFieldContainer[PeerStatus]
    last_chain_crc: int
    flush_mode: str
    loop_lag_max_ms: float
    members: _containers.RepeatedCompositeFieldContainer[Member]
    drained: bool
    version: str
    wire_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader_address: _Optional[str] = ..., first_index: _Optional[int] = ..., last_index: _Optional[int] = ..., committed_index: _Optional[int] = ..., committed_pos: _Optional[int] = ..., flushed_pos: _Optional[int] = ..., dispatched_pos: _Optional[int] = ..., applied_index: _Optional[int] = ..., cluster: _Optional[str] = ..., peers: _Optional[_Iterable[_Union[PeerStatus, _Mapping]]] = ..., last_chain_crc: _Optional[int] = ..., flush_mode: _Optional[str] = ..., loop_lag_max_ms: _Optional[float] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., drained: _Optional[bool] = ..., version: _Optional[str] = ..., wire_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("target_node_id", "timeout_ms")
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    target_node_id: int
    timeout_ms: int
    def __init__(self, target_node_id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TransferLeadershipResponse(_message.Message):
    __slots__ = ("leader_id",)
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    def __init__(self, leader_id: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("drained", "dry_run", "timeout_ms")
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    drained: bool
    dry_run: bool
    timeout_ms: int
    def __init__(self, drained: _Optional[bool] = ..., dry_run: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("drained", "leader_id", "moved")
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    drained: bool
    leader_id: int
    moved: bool
    def __init__(self, drained: _Optional[bool] = ..., leader_id: _Optional[int] = ..., moved: _Optional[bool] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "raft", "client", "role", "match_index", "lag")
    ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    id: int
    raft: str
    client: str
    role: str
    match_index: int
    lag: int
    def __init__(self, id: _Optional[int] = ..., raft: _Optional[str] = ..., client: _Optional[str] = ..., role: _Optional[str] = ..., match_index: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class MemberListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberListResponse(_message.Message):
    __slots__ = ("members", "leader_id")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    leader_id: int
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., leader_id: _Optional[int] = ...) -> None: ...

class MemberAddRequest(_message.Message):
    __slots__ = ("id", "raft", "client", "learner", "timeout_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    raft: str
    client: str
    learner: bool
    timeout_ms: int
    def __init__(self, id: _Optional[int] = ..., raft: _Optional[str] = ..., client: _Optional[str] = ..., learner: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class MemberPromoteRequest(_message.Message):
    __slots__ = ("id", "timeout_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_ms: int
    def __init__(self, id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class MemberRemoveRequest(_message.Message):
    __slots__ = ("id", "timeout_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_ms: int
    def __init__(self, id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class MemberChangeResponse(_message.Message):
    __slots__ = ("config_index", "members")
    CONFIG_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    config_index: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, config_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("from_offset", "max_messages", "max_bytes")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    max_messages: int
    max_bytes: int
    def __init__(self, from_offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("messages", "next_offset", "committed_offset", "min_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: bytes
    next_offset: int
    committed_offset: int
    min_offset: int
    def __init__(self, messages: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., committed_offset: _Optional[int] = ..., min_offset: _Optional[int] = ...) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("from_pos", "end_pos", "chunk_bytes", "message_offsets")
    FROM_POS_FIELD_NUMBER: _ClassVar[int]
    END_POS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    from_pos: int
    end_pos: int
    chunk_bytes: int
    message_offsets: bytes
    def __init__(self, from_pos: _Optional[int] = ..., end_pos: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., message_offsets: _Optional[bytes] = ...) -> None: ...

class ReadLogChunk(_message.Message):
    __slots__ = ("pos", "data", "committed_pos", "min_pos", "heads", "tails", "tail_offsets")
    POS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_POS_FIELD_NUMBER: _ClassVar[int]
    MIN_POS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    TAILS_FIELD_NUMBER: _ClassVar[int]
    TAIL_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    pos: int
    data: bytes
    committed_pos: int
    min_pos: int
    heads: bytes
    tails: bytes
    tail_offsets: bytes
    def __init__(self, pos: _Optional[int] = ..., data: _Optional[bytes] = ..., committed_pos: _Optional[int] = ..., min_pos: _Optional[int] = ..., heads: _Optional[bytes] = ..., tails: _Optional[bytes] = ..., tail_offsets: _Optional[bytes] = ...) -> None: ...

class QueueRange(_message.Message):
    __slots__ = ("topic", "queue_id", "start_offset", "end_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    start_offset: int
    end_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class ReadUnitsRequest(_message.Message):
    __slots__ = ("queues", "from_pos", "to_pos")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    FROM_POS_FIELD_NUMBER: _ClassVar[int]
    TO_POS_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueRange]
    from_pos: int
    to_pos: int
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueRange, _Mapping]]] = ..., from_pos: _Optional[int] = ..., to_pos: _Optional[int] = ...) -> None: ...

class QueueUnits(_message.Message):
    __slots__ = ("topic", "queue_id", "first_offset", "units", "min_offset", "max_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    first_offset: int
    units: bytes
    min_offset: int
    max_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., first_offset: _Optional[int] = ..., units: _Optional[bytes] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class TimeQuery(_message.Message):
    __slots__ = ("topic", "queue_id", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class OffsetsForTimesRequest(_message.Message):
    __slots__ = ("queries",)
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[TimeQuery]
    def __init__(self, queries: _Optional[_Iterable[_Union[TimeQuery, _Mapping]]] = ...) -> None: ...

class OffsetsForTimesResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class PutHalfRequest(_message.Message):
    __slots__ = ("message", "producer_group", "cluster")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    message: MessageData
    producer_group: str
    cluster: str
    def __init__(self, message: _Optional[_Union[MessageData, _Mapping]] = ..., producer_group: _Optional[str] = ..., cluster: _Optional[str] = ...) -> None: ...

class PutHalfResponse(_message.Message):
    __slots__ = ("result", "transaction_id")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    result: PutResult
    transaction_id: str
    def __init__(self, result: _Optional[_Union[PutResult, _Mapping]] = ..., transaction_id: _Optional[str] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("transaction_id", "half_offset", "commit", "cluster")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    HALF_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    half_offset: int
    commit: bool
    cluster: str
    def __init__(self, transaction_id: _Optional[str] = ..., half_offset: _Optional[int] = ..., commit: _Optional[bool] = ..., cluster: _Optional[str] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ("committed", "result", "duplicate")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    result: PutResult
    duplicate: bool
    def __init__(self, committed: _Optional[bool] = ..., result: _Optional[_Union[PutResult, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class TransactionCheckAnswer(_message.Message):
    __slots__ = ("producer_group", "transaction_id", "half_offset", "action")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[TransactionCheckAnswer.Action]
        COMMIT: _ClassVar[TransactionCheckAnswer.Action]
        ROLLBACK: _ClassVar[TransactionCheckAnswer.Action]
    UNKNOWN: TransactionCheckAnswer.Action
    COMMIT: TransactionCheckAnswer.Action
    ROLLBACK: TransactionCheckAnswer.Action
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    HALF_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    transaction_id: str
    half_offset: int
    action: TransactionCheckAnswer.Action
    def __init__(self, producer_group: _Optional[str] = ..., transaction_id: _Optional[str] = ..., half_offset: _Optional[int] = ..., action: _Optional[_Union[TransactionCheckAnswer.Action, str]] = ...) -> None: ...

class TransactionCheck(_message.Message):
    __slots__ = ("transaction_id", "half_offset", "check_times", "message")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    HALF_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECK_TIMES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    half_offset: int
    check_times: int
    message: StoredMessage
    def __init__(self, transaction_id: _Optional[str] = ..., half_offset: _Optional[int] = ..., check_times: _Optional[int] = ..., message: _Optional[_Union[StoredMessage, _Mapping]] = ...) -> None: ...

class RaftMessage(_message.Message):
    __slots__ = ("type", "src", "dst", "term", "index", "log_term", "commit", "entries", "reject", "hint_index", "hint_term", "ctx", "pre_vote", "transfer", "granted", "snapshot", "quiet", "conf", "conf_index", "group", "no_lead")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        APPEND: _ClassVar[RaftMessage.Type]
        APPEND_RESPONSE: _ClassVar[RaftMessage.Type]
        HEARTBEAT: _ClassVar[RaftMessage.Type]
        HEARTBEAT_RESPONSE: _ClassVar[RaftMessage.Type]
        VOTE: _ClassVar[RaftMessage.Type]
        VOTE_RESPONSE: _ClassVar[RaftMessage.Type]
        TIMEOUT_NOW: _ClassVar[RaftMessage.Type]
        READ_INDEX: _ClassVar[RaftMessage.Type]
        READ_INDEX_RESPONSE: _ClassVar[RaftMessage.Type]
        SNAPSHOT: _ClassVar[RaftMessage.Type]
    APPEND: RaftMessage.Type
    APPEND_RESPONSE: RaftMessage.Type
    HEARTBEAT: RaftMessage.Type
    HEARTBEAT_RESPONSE: RaftMessage.Type
    VOTE: RaftMessage.Type
    VOTE_RESPONSE: RaftMessage.Type
    TIMEOUT_NOW: RaftMessage.Type
    READ_INDEX: RaftMessage.Type
    READ_INDEX_RESPONSE: RaftMessage.Type
    SNAPSHOT: RaftMessage.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    HINT_INDEX_FIELD_NUMBER: _ClassVar[int]
    HINT_TERM_FIELD_NUMBER: _ClassVar[int]
    CTX_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    QUIET_FIELD_NUMBER: _ClassVar[int]
    CONF_FIELD_NUMBER: _ClassVar[int]
    CONF_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NO_LEAD_FIELD_NUMBER: _ClassVar[int]
    type: RaftMessage.Type
    src: int
    dst: int
    term: int
    index: int
    log_term: int
    commit: int
    entries: bytes
    reject: bool
    hint_index: int
    hint_term: int
    ctx: bytes
    pre_vote: bool
    transfer: bool
    granted: bool
    snapshot: bytes
    quiet: bool
    conf: bytes
    conf_index: int
    group: int
    no_lead: bool
    def __init__(self, type: _Optional[_Union[RaftMessage.Type, str]] = ..., src: _Optional[int] = ..., dst: _Optional[int] = ..., term: _Optional[int] = ..., index: _Optional[int] = ..., log_term: _Optional[int] = ..., commit: _Optional[int] = ..., entries: _Optional[bytes] = ..., reject: _Optional[bool] = ..., hint_index: _Optional[int] = ..., hint_term: _Optional[int] = ..., ctx: _Optional[bytes] = ..., pre_vote: _Optional[bool] = ..., transfer: _Optional[bool] = ..., granted: _Optional[bool] = ..., snapshot: _Optional[bytes] = ..., quiet: _Optional[bool] = ..., conf: _Optional[bytes] = ..., conf_index: _Optional[int] = ..., group: _Optional[int] = ..., no_lead: _Optional[bool] = ...) -> None: ...

class GroupQueues(_message.Message):
    __slots__ = ("group", "queues")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    group: int
    queues: int
    def __init__(self, group: _Optional[int] = ..., queues: _Optional[int] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("topic", "groups", "configured")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupQueues]
    configured: bool
    def __init__(self, topic: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupQueues, _Mapping]]] = ..., configured: _Optional[bool] = ...) -> None: ...

class GroupLeader(_message.Message):
    __slots__ = ("group", "leader_id", "leader", "members")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group: int
    leader_id: int
    leader: str
    members: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader: _Optional[str] = ..., members: _Optional[_Iterable[int]] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("cluster", "topic", "linearizable")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    topic: str
    linearizable: bool
    def __init__(self, cluster: _Optional[str] = ..., topic: _Optional[str] = ..., linearizable: _Optional[bool] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("data_groups", "queues_per_topic", "routes", "leaders", "version", "age_ms")
    DATA_GROUPS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_PER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    LEADERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    data_groups: int
    queues_per_topic: int
    routes: _containers.RepeatedCompositeFieldContainer[TopicRoute]
    leaders: _containers.RepeatedCompositeFieldContainer[GroupLeader]
    version: int
    age_ms: int
    def __init__(self, data_groups: _Optional[int] = ..., queues_per_topic: _Optional[int] = ..., routes: _Optional[_Iterable[_Union[TopicRoute, _Mapping]]] = ..., leaders: _Optional[_Iterable[_Union[GroupLeader, _Mapping]]] = ..., version: _Optional[int] = ..., age_ms: _Optional[int] = ...) -> None: ...

class TopicUpdateRequest(_message.Message):
    __slots__ = ("cluster", "topic", "op", "groups")
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CREATE: _ClassVar[TopicUpdateRequest.Op]
        UPDATE: _ClassVar[TopicUpdateRequest.Op]
        DELETE: _ClassVar[TopicUpdateRequest.Op]
    CREATE: TopicUpdateRequest.Op
    UPDATE: TopicUpdateRequest.Op
    DELETE: TopicUpdateRequest.Op
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    topic: str
    op: TopicUpdateRequest.Op
    groups: _containers.RepeatedCompositeFieldContainer[GroupQueues]
    def __init__(self, cluster: _Optional[str] = ..., topic: _Optional[str] = ..., op: _Optional[_Union[TopicUpdateRequest.Op, str]] = ..., groups: _Optional[_Iterable[_Union[GroupQueues, _Mapping]]] = ...) -> None: ...

class TopicUpdateResponse(_message.Message):
    __slots__ = ("route", "version")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    route: TopicRoute
    version: int
    def __init__(self, route: _Optional[_Union[TopicRoute, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class RaftBatch(_message.Message):
    __slots__ = ("cluster", "messages")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    messages: _containers.RepeatedCompositeFieldContainer[RaftMessage]
    def __init__(self, cluster: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[RaftMessage, _Mapping]]] = ...) -> None: ...

class RaftAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
