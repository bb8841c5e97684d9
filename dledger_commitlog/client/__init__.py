"""Python clients of a dledger cluster: `Client` (blocking) and `AsyncClient` (asyncio).

    from dledger_commitlog.client import Client
    with Client.from_cluster_file("/tmp/c1/cluster.json") as client:
        result = client.put("orders", b"hello", keys=["o-1"])

Both discover the leader, follow redirects and retry with back-off through one
core (`retry.py`); every operation is written once (`api.py`); `blocking.py` and
`aio.py` only perform its steps. Values in and out are in `values.py`, errors in
`errors.py`, TLS and credentials in `access.py`, coalesced single puts in
`put_pipe.py`, transaction check-backs in `tx_producer.py`, consumer groups in
`groups.py` (the calls), `consumer.py` (`Consumer`, `AsyncConsumer`) and `quota.py`
(a `max_messages` shared), the routed clients of a multi-Raft cluster in
`routing.py` (`RoutedClient`, `AsyncRoutedClient`, `RoutedConsumer`). The client
imports nothing of the server side.
"""

from dledger_commitlog.client.access import Access, cluster_security, load_credentials
from dledger_commitlog.client.aio import AsyncClient
from dledger_commitlog.client.async_consumer import AsyncConsumer
from dledger_commitlog.client.blocking import Client
from dledger_commitlog.client.consumer import ConsumedMessage, Consumer, Retry
from dledger_commitlog.client.errors import (
    ChangeRefused,
    ClientError,
    GroupRefused,
    InvalidArgument,
    NotFound,
    OffsetOutOfRange,
    OutcomeUnknown,
    PermissionDenied,
    ResourceExhausted,
    TransactionConflict,
    Unauthenticated,
    Unavailable,
    WrongCluster,
)
from dledger_commitlog.client.groups import (
    DeadLetters,
    Delivery,
    GroupDescription,
    GroupSummary,
    Subscription,
)
from dledger_commitlog.client.routing import AsyncRoutedClient, RoutedClient, RoutedConsumer
from dledger_commitlog.client.tx_producer import (
    AsyncTransactionProducer,
    TransactionCheck,
    TransactionProducer,
)
from dledger_commitlog.client.values import (
    CleanResult,
    DrainResult,
    GroupLeader,
    HalfResult,
    MemberChange,
    MemberInfo,
    MessageSpec,
    NodeStatus,
    PeerStatus,
    PullResult,
    PutResult,
    QueueOffset,
    ReadRangeResult,
    Routes,
    StatusError,
    StoredMessage,
    TopicRoute,
    TransactionEnd,
    node_status,
    put_result,
    stored_message,
)

__all__ = [
    "Access",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncRoutedClient",
    "AsyncTransactionProducer",
    "ChangeRefused",
    "CleanResult",
    "Client",
    "ClientError",
    "ConsumedMessage",
    "Consumer",
    "DeadLetters",
    "Delivery",
    "DrainResult",
    "GroupDescription",
    "GroupLeader",
    "GroupRefused",
    "GroupSummary",
    "HalfResult",
    "InvalidArgument",
    "MemberChange",
    "MemberInfo",
    "MessageSpec",
    "NodeStatus",
    "NotFound",
    "OffsetOutOfRange",
    "OutcomeUnknown",
    "PeerStatus",
    "PermissionDenied",
    "PullResult",
    "PutResult",
    "QueueOffset",
    "ReadRangeResult",
    "ResourceExhausted",
    "Retry",
    "RoutedClient",
    "RoutedConsumer",
    "Routes",
    "StatusError",
    "StoredMessage",
    "Subscription",
    "TopicRoute",
    "TransactionCheck",
    "TransactionConflict",
    "TransactionEnd",
    "TransactionProducer",
    "Unauthenticated",
    "Unavailable",
    "WrongCluster",
    "cluster_security",
    "load_credentials",
    "node_status",
    "put_result",
    "stored_message",
]
