"""Python clients of the DLedgerClient service: `Client` (blocking) and `AsyncClient` (asyncio).

Leader discovery, redirects and retries are decided by two I/O-free pieces both
clients share: `_Router` (what this client knows of the cluster: its servers, the
leader, which configured address a leader hint stands for) and `_Attempts` (the
policy of one call: which address next, how long to wait, when to give up).
Invariants: a put's uniq_key is fixed before its first attempt, so every retry
carries the same one and is idempotent; no call outlives its deadline (`timeout_s`);
INVALID_ARGUMENT, NOT_FOUND and OUT_OF_RANGE are never retried; protobuf stays in
this module: results are frozen dataclasses converted at the edge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, cast

import grpc
import grpc.aio

from dledger_commitlog.client.put_pipe import PipeFailure, PutPipe
from dledger_commitlog.common.protocol import MAX_MESSAGE_BYTES_LIMIT
from dledger_commitlog.common.protocol import PutResult as PutResult
from dledger_commitlog.common.signing import sign
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc

R = TypeVar("R")


# ---------------------------------------------------------------- errors


class ClientError(Exception):
    """A call failed; `code` is the gRPC status name, `address` the server that said so."""

    def __init__(self, message: str, *, code: str = "", address: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.address = address


class InvalidArgument(ClientError):
    """Bad input (client- or server-side): nothing was stored."""


class NotFound(ClientError):
    """Unknown message id, or no message at that offset."""


class OffsetOutOfRange(ClientError):
    """Offset below the minimum retained or beyond the committed end."""


class Unavailable(ClientError):
    """No leader or no server answered before the deadline; nothing was written."""


class OutcomeUnknown(ClientError):
    """A write may or may not have been stored. Retrying with the same `uniq_keys` is safe."""

    def __init__(self, message: str, *, uniq_keys: Sequence[str] = (), **kw: str) -> None:
        super().__init__(message, **kw)
        self.uniq_keys = tuple(uniq_keys)


class TransactionConflict(ClientError):
    """The transaction was already decided the other way (ABORTED)."""


class ResourceExhausted(ClientError):
    """The leader kept refusing: too many puts in flight, or its disk is too full."""


class WrongCluster(ClientError):
    """The server belongs to another cluster than the one this client names."""


class Unauthenticated(ClientError):
    """The cluster wants credentials, and these are missing, unknown or wrong."""


class PermissionDenied(ClientError):
    """The credentials are good but lack the right for this call."""


# ---------------------------------------------------------------- values


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
            uniq_key=self.uniq_key or uuid.uuid4().hex.upper(),
            born_timestamp_ms=now_ms,
            flag=self.flag,
            queue_id=-1 if self.queue_id is None else self.queue_id,
            has_queue_id=self.queue_id is not None,
            delay_level=self.delay_level,
            deliver_at_ms=self.deliver_at_ms,
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


def stored_message(msg: pb.StoredMessage) -> StoredMessage:
    return cast(
        StoredMessage,
        _convert(StoredMessage, msg, keys=tuple(msg.keys), properties=dict(msg.properties)),
    )


def node_status(address: str, msg: pb.StatusResponse) -> NodeStatus:
    peers = tuple(cast(PeerStatus, _convert(PeerStatus, p)) for p in msg.peers)
    return cast(NodeStatus, _convert(NodeStatus, msg, address=address, peers=peers))


@dataclass(frozen=True, slots=True)
class Access:
    """How a client reaches a cluster: the CA to trust (TLS; None: plaintext) and the
    (access key, secret key) to sign every call with (None: anonymous)."""

    tls_ca: bytes | None = None
    credentials: tuple[str, str] | None = None

    @classmethod
    def load(cls, tls_ca: str | None = None, credentials: str | None = None) -> Access:
        """From files: a PEM CA, a credentials TOML (ValueError/OSError if unreadable)."""
        return cls(
            Path(tls_ca).read_bytes() if tls_ca else None,
            load_credentials(credentials) if credentials else None,
        )

    def channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        if self.tls_ca is None:
            return grpc.insecure_channel(address, options=options)
        creds = grpc.ssl_channel_credentials(self.tls_ca)
        return grpc.secure_channel(address, creds, options=options)

    def aio_channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
        if self.tls_ca is None:
            return grpc.aio.insecure_channel(address, options=options)
        creds = grpc.ssl_channel_credentials(self.tls_ca)
        return grpc.aio.secure_channel(address, creds, options=options)

    def metadata(self, method: str) -> tuple[tuple[str, str], ...] | None:
        """The signature of a call of RPC `method` made now (None: no credentials)."""
        return sign(*self.credentials, method) if self.credentials else None


def cluster_security(doc: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The CA file and the credentials file a cluster.json records (None: not used)."""
    security = doc.get("security") or {}
    return security.get("tls_ca") or None, security.get("credentials") or None


def load_credentials(path: str | Path) -> tuple[str, str]:
    """(access key, secret key) from a TOML file with `access_key` and `secret_key`."""
    import tomllib

    try:
        doc = tomllib.loads(Path(path).read_text())
        return str(doc["access_key"]), str(doc["secret_key"])
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: not a credentials file with access_key and secret_key "
                         f"({exc})") from None  # fmt: skip


# ---------------------------------------------------------------- retry policy

LEADER_METADATA = "dledger-leader"
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
]
_NOT_RETRIED: dict[str, type[ClientError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "NOT_FOUND": NotFound,
    "OUT_OF_RANGE": OffsetOutOfRange,
    "FAILED_PRECONDITION": WrongCluster,  # only without a leader hint: see `_Attempts.failed`
    "ABORTED": TransactionConflict,
}
_AUTH: dict[str, type[ClientError]] = {
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
}
_DISCOVERY_TIMEOUT_S = 1.0  # Status is cheap: a node slower than this is not worth leading to
_RETRIED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED"})
# gRPC's wording when the connection was never made: the request cannot have arrived.
_CONNECT_FAILURES = ("failed to connect", "connection refused", "dns resolution failed")


class _FailedAttempt(Exception):
    """An attempt that failed outside a unary call (a framed put)."""

    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure.details)
        self.failure = failure


class _Failure:
    """One failed attempt, read off a grpc.RpcError (sync and aio ones alike)."""

    __slots__ = ("code", "details", "leader_hint")

    def __init__(self, code: str, details: str, leader_hint: str | None = None) -> None:
        self.code = code
        self.details = details
        self.leader_hint = leader_hint  # None: no metadata; "": the node knows no leader

    @classmethod
    def of(cls, exc: grpc.RpcError) -> _Failure:
        code = exc.code()
        hint = None
        for key, value in exc.trailing_metadata() or ():
            if key == LEADER_METADATA:
                hint = value.decode() if isinstance(value, bytes) else str(value)
        return cls(getattr(code, "name", str(code)), exc.details() or "", hint)

    def error(self, address: str, write: bool = False) -> ClientError:
        if write and self.too_large:
            return InvalidArgument(f"{self.details}: nothing was stored", code=self.code,
                                   address=address)  # fmt: skip
        kind = _NOT_RETRIED.get(self.code, _AUTH.get(self.code, Unavailable if self.code in
                                _RETRIED else ClientError))  # fmt: skip
        return kind(self.details or self.code, code=self.code, address=address)

    @property
    def too_large(self) -> bool:
        """gRPC refused the request for its size (ours or the server's limit): not stored."""
        return self.code == "RESOURCE_EXHAUSTED" and "larger than max" in self.details

    @property
    def never_sent(self) -> bool:
        text = self.details.lower()
        return self.code == "UNAVAILABLE" and any(s in text for s in _CONNECT_FAILURES)


class _Router:
    """The client's view of the cluster, shared by all its calls."""

    def __init__(self, servers: Sequence[str]) -> None:
        self.servers = list(dict.fromkeys(s.strip() for s in servers if s.strip()))
        if not self.servers:
            raise ValueError("a client needs at least one server address (host:port)")
        self.leader: str | None = None
        self._by_id: dict[int, str] = {}  # node id -> the address we reach it at
        self._aliases: dict[str, str] = {}  # address the cluster uses -> the one we use
        self._next = 0

    def next_server(self, avoid: str | None = None) -> str:
        for _ in range(len(self.servers)):
            address = self.servers[self._next % len(self.servers)]
            self._next += 1
            if address != avoid or len(self.servers) == 1:
                return address
        return self.servers[0]

    def redirect(self, hint: str) -> str:
        address = self._aliases.get(hint, hint)
        if address not in self.servers:
            self.servers.append(address)
        self.leader = address
        return address

    def forget(self, address: str) -> None:
        if self.leader == address:
            self.leader = None

    def learn(self, answers: Sequence[NodeStatus]) -> None:
        """Record Status answers; the leader is the one the highest term names."""
        for st in answers:
            self._by_id[st.node_id] = st.address
            if st.role == "leader" and st.leader_address:
                self._aliases[st.leader_address] = st.address
        best: NodeStatus | None = None
        for st in answers:
            if st.leader_id and (best is None or st.term > best.term):
                best = st
        if best is None:
            return
        if best.leader_id in self._by_id:
            if best.leader_address:
                self._aliases[best.leader_address] = self._by_id[best.leader_id]
            self.leader = self._by_id[best.leader_id]
        elif best.leader_address:
            self.redirect(best.leader_address)


class _Attempts:
    """The retry policy of one call. `failed` returns the back-off or raises the error."""

    def __init__(self, client: _Base, op: _Op[Any]) -> None:
        self.router = client._router
        self.op = op.name
        self.write = op.write
        self.uniq_keys = op.uniq_keys
        self.timeout_s = client.timeout_s
        self.deadline = time.monotonic() + client.timeout_s
        self.attempt_timeout_s = client.attempt_timeout_s
        self.max_retries = client.max_retries
        self.backoff_base_s = client.backoff_base_s
        self.backoff_max_s = client.backoff_max_s
        self.rng = client._rng
        self.attempts = 0
        self.maybe_applied = False
        self.last: tuple[str, _Failure] | None = None
        self._backoffs = 0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def next_address(self) -> str:
        if self.router.leader is not None:
            return self.router.leader
        return self.router.next_server(avoid=self.last[0] if self.last else None)

    def timeout(self, floor_s: float = 0.0, cap_s: float | None = None) -> float:
        remaining = self.remaining()
        if remaining <= 0:
            raise self.give_up()
        return min(remaining, cap_s or max(self.attempt_timeout_s, floor_s))

    def failed(self, address: str, failure: _Failure) -> float:
        self.attempts += 1
        self.last = (address, failure)
        delay: float
        if failure.code == "FAILED_PRECONDITION" and failure.leader_hint is not None:
            if failure.leader_hint:
                was = self.router.leader
                target = self.router.redirect(failure.leader_hint)
                delay = 0.0 if target not in (address, was) else self._backoff()
            else:  # the node is not the leader and knows none: an election is under way
                self.router.forget(address)
                delay = self._backoff()
        elif failure.code in _NOT_RETRIED or (self.write and failure.too_large):
            raise failure.error(address, self.write)
        elif failure.code in _RETRIED:
            if not failure.never_sent:
                self.maybe_applied = True
            if failure.code != "RESOURCE_EXHAUSTED":
                self.router.forget(address)
            delay = self._backoff()
        else:
            raise failure.error(address)
        if self.attempts > self.max_retries or self.remaining() <= delay:
            raise self.give_up()
        return delay

    def _backoff(self) -> float:
        cap = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** min(self._backoffs, 30))
        self._backoffs += 1
        return cap / 2 + self.rng.uniform(0, cap / 2)

    def give_up(self) -> ClientError:
        what = f"{self.op}: gave up after {self.attempts} attempt(s) in {self.timeout_s:g}s"
        if self.last is None:
            return Unavailable(f"{what}: no attempt was made", code="DEADLINE_EXCEEDED")
        address, failure = self.last
        why = f"{what}; last error from {address}: {failure.code}: {failure.details}"
        if self.write and self.maybe_applied:
            return OutcomeUnknown(why, code=failure.code, address=address, uniq_keys=self.uniq_keys)
        if failure.code == "RESOURCE_EXHAUSTED":
            return ResourceExhausted(why, code=failure.code, address=address)
        return Unavailable(why, code=failure.code, address=address)


@dataclass(frozen=True, slots=True)
class _Op(Generic[R]):
    """One client operation, as both clients run it."""

    name: str
    method: str  # the RPC
    request: Any
    convert: Callable[[Any], R]
    write: bool = False
    uniq_keys: tuple[str, ...] = ()
    floor_s: float = 0.0  # an attempt may take this long however short attempt_timeout_s is
    forgets_leader: bool = False
    framed: bool = False  # a single put: sent through the server's PutFrames stream


def _now_ms() -> int:
    return int(time.time() * 1000)


def _chunks(items: Iterable[MessageSpec], size: int) -> Iterator[list[MessageSpec]]:
    chunk: list[MessageSpec] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Base:
    """Configuration, requests and results shared by `Client` and `AsyncClient`."""

    def __init__(
        self,
        servers: Sequence[str] | str,
        *,
        cluster: str | None = None,
        timeout_s: float = 10.0,
        max_retries: int = 32,
        attempt_timeout_s: float | None = None,
        backoff_base_s: float = 0.05,
        backoff_max_s: float = 0.25,
        seed: int | None = None,
        tls_ca: str | bytes | None = None,
        credentials: tuple[str, str] | None = None,
        framed: bool = True,
    ) -> None:
        """`tls_ca`: the CA (PEM path or bytes) that signed the servers' certificates:
        the client then speaks TLS. `credentials`: (access key, secret key) to sign
        every call with, for a cluster with an ACL. `framed`: single puts travel over
        one PutFrames stream per server, concurrent ones coalesced into frames (False:
        one unary Put each, as servers before PutFrames need)."""
        if isinstance(servers, str):
            servers = servers.split(",")
        if timeout_s <= 0 or max_retries < 0 or backoff_base_s < 0:
            raise ValueError("need timeout_s > 0, max_retries >= 0 and backoff_base_s >= 0")
        self._router = _Router(servers)
        self.cluster = cluster or ""
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.attempt_timeout_s = attempt_timeout_s or min(max(1.0, timeout_s / 4), 5.0)
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = max(backoff_max_s, backoff_base_s)
        self._rng = random.Random(seed)
        self._stubs: dict[str, Any] = {}
        if isinstance(tls_ca, str):
            tls_ca = Path(tls_ca).read_bytes()
        self.access = Access(tls_ca, credentials)
        self._metadata = self.access.metadata
        self.framed = framed
        self._pipes: dict[str, PutPipe] = {}

    def _aio_stub(self, address: str) -> Any:
        """An asyncio stub for `address` (call inside the loop the pipes run in)."""
        raise NotImplementedError

    async def _framed_put(self, address: str, message: pb.MessageData, timeout_s: float) -> Any:
        """One put through `address`'s PutFrames stream (coalesced with concurrent ones):
        a PutResponse, or _FailedAttempt."""
        pipe = self._pipes.get(address)
        if pipe is None or pipe.broken is not None:
            pipe = self._pipes[address] = PutPipe(
                self._aio_stub(address), cluster=self.cluster,
                metadata=lambda: self._metadata("PutFrames"),
            )  # fmt: skip
        try:
            async with asyncio.timeout(timeout_s):
                result = await pipe.put(message)
        except PipeFailure as exc:
            raise _FailedAttempt(_Failure(exc.code, exc.details, exc.leader)) from None
        except TimeoutError:
            raise _FailedAttempt(_Failure("DEADLINE_EXCEEDED", "no answer in time")) from None
        return pb.PutResponse(result=result)

    def _unframe(self, exc: _FailedAttempt) -> bool:
        """A server without PutFrames (an older version): unary puts from now on."""
        if exc.failure.code != "UNIMPLEMENTED":
            return False
        self.framed = False
        return True

    async def _close_pipes(self) -> None:
        pipes, self._pipes = list(self._pipes.values()), {}
        for pipe in pipes:
            await pipe.close()

    @classmethod
    def from_cluster_file(cls, path: str | Path, **kwargs: Any) -> Self:
        """A client of the cluster a `cluster.json` describes (see `cluster.py`)."""
        try:
            doc = json.loads(Path(path).read_text())
            servers = [str(node["client"]) for node in doc["nodes"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a readable cluster file ({exc})") from exc
        kwargs.setdefault("cluster", doc.get("cluster") or None)
        tls_ca, credentials = cluster_security(doc)
        if tls_ca:
            kwargs.setdefault("tls_ca", tls_ca)
        if credentials and kwargs.get("credentials") is None:
            kwargs["credentials"] = load_credentials(credentials)
        return cls(servers, **kwargs)

    @property
    def servers(self) -> list[str]:
        return list(self._router.servers)

    @property
    def leader(self) -> str | None:
        """The address this client currently believes is the leader's."""
        return self._router.leader

    def _status_target(self, server: str | None) -> str:
        return server or self._router.leader or self._router.servers[0]

    def _accept(self, address: str, resp: pb.StatusResponse) -> NodeStatus:
        st = node_status(address, resp)
        if self.cluster and st.cluster and st.cluster != self.cluster:
            raise WrongCluster(
                f"{address} serves cluster {st.cluster!r}, not {self.cluster!r}", address=address
            )
        return st

    def _op_put(self, spec: MessageSpec) -> _Op[PutResult]:
        msg = spec.to_pb(_now_ms())
        request = pb.PutRequest(message=msg, cluster=self.cluster)
        return _Op("put", "Put", request, lambda r: put_result(r.result), True, (msg.uniq_key,),
                   framed=self.framed)  # fmt: skip

    def _op_batch(self, specs: Sequence[MessageSpec]) -> _Op[list[PutResult]]:
        now = _now_ms()
        msgs = [s.to_pb(now) for s in specs]
        request = pb.PutBatchRequest(messages=msgs, cluster=self.cluster)
        keys = tuple(m.uniq_key for m in msgs)
        return _Op(
            "put_batch",
            "PutBatch",
            request,
            lambda r: [put_result(x) for x in r.results],
            True,
            keys,
        )

    def _op_put_half(self, spec: MessageSpec, producer_group: str) -> _Op[HalfResult]:
        msg = spec.to_pb(_now_ms())
        request = pb.PutHalfRequest(message=msg, producer_group=producer_group,
                                    cluster=self.cluster)  # fmt: skip

        def convert(r: pb.PutHalfResponse) -> HalfResult:
            return HalfResult(r.transaction_id, r.result.commitlog_offset, put_result(r.result))

        return _Op("put_half", "PutHalf", request, convert, True, (msg.uniq_key,))

    def _op_end(
        self, half: HalfResult | str, half_offset: int | None, commit: bool
    ) -> _Op[TransactionEnd]:
        if isinstance(half, HalfResult):
            tx, offset = half.transaction_id, half.half_offset
        elif half_offset is None:
            raise InvalidArgument("give the half offset with a transaction id")
        else:
            tx, offset = half, half_offset
        request = pb.EndTransactionRequest(transaction_id=tx, half_offset=offset, commit=commit,
                                           cluster=self.cluster)  # fmt: skip

        def convert(r: pb.EndTransactionResponse) -> TransactionEnd:
            result = put_result(r.result) if r.HasField("result") else None
            return TransactionEnd(r.committed, result, r.duplicate)

        # Retried like a put: ending a transaction twice the same way changes nothing.
        return _Op("end_transaction", "EndTransaction", request, convert, True, (tx,))

    def _op_get(
        self, msg_id: str | None, offset: int | None, linearizable: bool
    ) -> _Op[StoredMessage]:
        if (msg_id is None) == (offset is None):
            raise ValueError("get: give exactly one of msg_id and offset")
        if msg_id is not None:
            request = pb.GetRequest(msg_id=msg_id, linearizable=linearizable)
        else:
            request = pb.GetRequest(commitlog_offset=offset, linearizable=linearizable)
        return _Op("get", "Get", request, lambda r: stored_message(r.message))

    def _op_pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: str,
        wait_ms: int,
        linearizable: bool = False,
    ) -> _Op[PullResult]:
        request = pb.PullRequest(
            topic=topic,
            queue_id=queue_id,
            queue_offset=offset,
            max_messages=max_messages,
            tag_expression=tags,
            wait_ms=wait_ms,
            linearizable=linearizable,
        )

        def convert(r: pb.PullResponse) -> PullResult:
            msgs = tuple(stored_message(m) for m in r.messages)
            return PullResult(msgs, r.next_offset, r.min_offset, r.max_offset)

        return _Op("pull", "Pull", request, convert, floor_s=1 + wait_ms / 1000)

    def _op_query(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_messages: int
    ) -> _Op[list[StoredMessage]]:
        request = pb.QueryByKeyRequest(
            topic=topic, key=key, begin_ms=begin_ms, end_ms=end_ms, max_messages=max_messages
        )
        return _Op(
            "query", "QueryByKey", request, lambda r: [stored_message(m) for m in r.messages]
        )

    def _op_range(self, offset: int, max_messages: int, max_bytes: int) -> _Op[ReadRangeResult]:
        request = pb.ReadRangeRequest(
            from_offset=offset, max_messages=max_messages, max_bytes=max_bytes
        )

        def convert(r: pb.ReadRangeResponse) -> ReadRangeResult:
            return ReadRangeResult(r.messages, r.next_offset, r.committed_offset, r.min_offset)

        return _Op("read_range", "ReadRange", request, convert)

    def _op_queue_offsets(self, topic: str, linearizable: bool) -> _Op[list[QueueOffset]]:
        request = pb.QueueOffsetsRequest(topic=topic, linearizable=linearizable)

        def convert(r: pb.QueueOffsetsResponse) -> list[QueueOffset]:
            return [QueueOffset(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in r.queues]

        return _Op("queue_offsets", "QueueOffsets", request, convert)

    def _op_commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> _Op[None]:
        request = pb.CommitOffsetRequest(
            group=group, topic=topic, queue_id=queue_id, offset=offset, cluster=self.cluster
        )
        # Setting an offset twice is harmless: a retry after an unknown outcome is safe.
        return _Op("commit_offset", "CommitOffset", request, lambda r: None)

    def _op_fetch_offset(
        self, group: str, topic: str, queue_id: int, linearizable: bool
    ) -> _Op[dict[int, int]]:
        request = pb.FetchOffsetRequest(
            group=group, topic=topic, queue_id=queue_id, linearizable=linearizable
        )
        return _Op("fetch_offset", "FetchOffset", request,
                   lambda r: {o.queue_id: o.offset for o in r.offsets})  # fmt: skip

    def _op_transfer(self, target: int, timeout_ms: int) -> _Op[int]:
        request = pb.TransferLeadershipRequest(target_node_id=target, timeout_ms=timeout_ms)
        return _Op(
            "transfer_leadership",
            "TransferLeadership",
            request,
            lambda r: int(r.leader_id),
            floor_s=1 + timeout_ms / 1000,
            forgets_leader=True,
        )


class _LoopThread:
    """An event loop in a daemon thread: the blocking client's framed puts run there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="dledger-puts",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Cancel what still runs there (gRPC's own call tasks too), as asyncio.run does."""
        self.run(_cancel_others())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _cancel_others() -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class Client(_Base):
    """Blocking client: one gRPC channel per server, reused across calls."""

    def __init__(self, servers: Sequence[str] | str, **kwargs: Any) -> None:
        super().__init__(servers, **kwargs)
        self._channels: dict[str, grpc.Channel] = {}
        self._aio_channels: dict[str, grpc.aio.Channel] = {}
        self._aio_stubs: dict[str, Any] = {}
        self._loop: _LoopThread | None = None  # the framed puts' event loop
        self._loop_lock = threading.Lock()  # puts from several threads start one loop

    def _framing_loop(self) -> _LoopThread:
        with self._loop_lock:
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    def _aio_stub(self, address: str) -> Any:
        if address not in self._aio_stubs:
            channel = self.access.aio_channel(address, _CHANNEL_OPTIONS)
            self._aio_channels[address] = channel
            self._aio_stubs[address] = pb_grpc.DLedgerClientStub(channel)
        return self._aio_stubs[address]

    def _stub(self, address: str) -> Any:
        if address not in self._stubs:
            channel = self.access.channel(address, _CHANNEL_OPTIONS)
            self._channels[address] = channel
            self._stubs[address] = pb_grpc.DLedgerClientStub(channel)
        return self._stubs[address]

    def _run(self, op: _Op[R]) -> R:
        attempts = _Attempts(self, op)
        while True:
            if self._router.leader is None:
                self._discover(attempts)
            address = attempts.next_address()
            try:
                if op.framed:
                    coro = self._framed_put(address, op.request.message, attempts.timeout())
                    resp = self._framing_loop().run(coro)
                else:
                    call = getattr(self._stub(address), op.method)
                    resp = call(op.request, timeout=attempts.timeout(op.floor_s),
                                metadata=self._metadata(op.method))  # fmt: skip
            except grpc.RpcError as exc:
                time.sleep(attempts.failed(address, _Failure.of(exc)))
                continue
            except _FailedAttempt as exc:
                if self._unframe(exc):
                    op = dataclasses.replace(op, framed=False)
                    continue
                time.sleep(attempts.failed(address, exc.failure))
                continue
            if op.forgets_leader:
                self._router.leader = None
            return op.convert(resp)

    def _discover(self, attempts: _Attempts) -> None:
        answers: list[NodeStatus] = []
        for address in list(self._router.servers):
            if attempts.remaining() <= 0:
                break
            try:
                timeout = attempts.timeout(cap_s=_DISCOVERY_TIMEOUT_S)
                answers.append(self.status(address, timeout_s=timeout))
            except ClientError:
                continue
        self._router.learn(answers)

    def put(
        self,
        topic: str,
        body: bytes | str,
        *,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        uniq_key: str | None = None,
        queue_id: int | None = None,
        delay_level: int = 0,
        deliver_at_ms: int = 0,
    ) -> PutResult:
        """Put one message; with `delay_level` or `deliver_at_ms` it reaches its topic
        later (docs/delayed-and-transactional.md) and the result is the stored copy's."""
        spec = MessageSpec(topic, body, keys, tags, properties, uniq_key, queue_id,
                           delay_level=delay_level, deliver_at_ms=deliver_at_ms)  # fmt: skip
        return self._run(self._op_put(spec))

    def put_half(
        self,
        topic: str,
        body: bytes | str,
        *,
        producer_group: str,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        uniq_key: str | None = None,
        queue_id: int | None = None,
    ) -> HalfResult:
        """Store a transactional (half) message: no consumer sees it until
        `end_transaction(..., commit=True)`; `uniq_key` is the transaction id."""
        spec = MessageSpec(topic, body, keys, tags, properties, uniq_key, queue_id)
        return self._run(self._op_put_half(spec, producer_group))

    def end_transaction(
        self, half: HalfResult | str, half_offset: int | None = None, *, commit: bool
    ) -> TransactionEnd:
        """Commit (the message becomes visible, once) or roll back (never visible).
        Raises TransactionConflict if it was decided the other way, NotFound if no
        such half message exists."""
        return self._run(self._op_end(half, half_offset, commit))

    def put_batch(self, messages: Sequence[MessageSpec]) -> list[PutResult]:
        """Put messages atomically as one batch (one bad message fails all)."""
        return self._run(self._op_batch(messages))

    def put_stream(self, messages: Iterable[MessageSpec], batch: int = 64) -> Iterator[PutResult]:
        """Put an unbounded sequence in order, `batch` messages per PutBatch call."""
        for chunk in _chunks(messages, batch):
            yield from self.put_batch(chunk)

    def get(
        self, msg_id: str | None = None, offset: int | None = None, linearizable: bool = False
    ) -> StoredMessage:
        """By message id or by commit-log offset (exactly one)."""
        return self._run(self._op_get(msg_id, offset, linearizable))

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        tag_expression: str = "*",
        wait_ms: int = 0,
        linearizable: bool = False,
    ) -> PullResult:
        """One queue's messages from `offset`; waits up to `wait_ms` when there are none."""
        return self._run(
            self._op_pull(
                topic, queue_id, offset, max_messages, tag_expression, wait_ms, linearizable
            )
        )

    def queue_offsets(self, topic: str = "", linearizable: bool = False) -> list[QueueOffset]:
        """Min and max offsets of the topic's queues (every user topic's when empty)."""
        return self._run(self._op_queue_offsets(topic, linearizable))

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record `offset` (the next to consume) for `group` through the Raft log."""
        self._run(self._op_commit_offset(group, topic, queue_id, offset))

    def fetch_offset(
        self, group: str, topic: str, queue_id: int = -1, linearizable: bool = False
    ) -> dict[int, int]:
        """Queue id -> the group's committed offset (-1: nothing committed)."""
        return self._run(self._op_fetch_offset(group, topic, queue_id, linearizable))

    def clean_now(self, server: str, force: bool = False, timeout_s: float = 30.0) -> CleanResult:
        """Run retention now on the node at `server` (each node cleans its own store)."""
        try:
            r = self._stub(server).CleanNow(pb.CleanNowRequest(force=force), timeout=timeout_s,
                                            metadata=self._metadata("CleanNow"))  # fmt: skip
        except grpc.RpcError as exc:
            raise _Failure.of(exc).error(server) from None
        return CleanResult(r.deleted_segments, r.min_offset, r.reason)

    def query(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 0, max_messages: int = 32
    ) -> list[StoredMessage]:
        return self._run(self._op_query(topic, key, begin_ms, end_ms, max_messages))

    def read_range(
        self, from_offset: int, max_messages: int = 1024, max_bytes: int = 4 << 20
    ) -> ReadRangeResult:
        """Raw committed messages from `from_offset` on, for bulk readers (analytics)."""
        return self._run(self._op_range(from_offset, max_messages, max_bytes))

    def transfer_leadership(self, target_node_id: int, timeout_ms: int = 5000) -> int:
        """Ask the leader to hand over to `target_node_id`; returns the new leader's id."""
        return self._run(self._op_transfer(target_node_id, timeout_ms))

    def status(self, server: str | None = None, timeout_s: float | None = None) -> NodeStatus:
        """Status of one server (default: the leader, else the first server); one attempt."""
        address = self._status_target(server)
        try:
            resp = self._stub(address).Status(pb.StatusRequest(), timeout=timeout_s or 2.0,
                                              metadata=self._metadata("Status"))  # fmt: skip
        except grpc.RpcError as exc:
            raise _Failure.of(exc).error(address) from None
        return self._accept(address, resp)

    def status_all(self, timeout_s: float | None = None) -> list[NodeStatus | StatusError]:
        out: list[NodeStatus | StatusError] = []
        for address in self.servers:
            try:
                out.append(self.status(address, timeout_s))
            except ClientError as exc:
                out.append(StatusError(address, exc))
        return out

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.run(self._close_aio())
            loop.close()

    async def _close_aio(self) -> None:
        await self._close_pipes()
        for channel in self._aio_channels.values():
            await channel.close()
        self._aio_channels.clear()
        self._aio_stubs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(_Base):
    """asyncio client (grpc.aio), the same API with coroutines; use it in one event loop."""

    def __init__(self, servers: Sequence[str] | str, **kwargs: Any) -> None:
        super().__init__(servers, **kwargs)
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> Any:
        if address not in self._stubs:
            channel = self.access.aio_channel(address, _CHANNEL_OPTIONS)
            self._channels[address] = channel
            self._stubs[address] = pb_grpc.DLedgerClientStub(channel)
        return self._stubs[address]

    async def _run(self, op: _Op[R]) -> R:
        attempts = _Attempts(self, op)
        while True:
            if self._router.leader is None:
                await self._discover(attempts)
            address = attempts.next_address()
            try:
                if op.framed:
                    timeout = attempts.timeout()
                    resp = await self._framed_put(address, op.request.message, timeout)
                else:
                    call = getattr(self._stub(address), op.method)
                    resp = await call(op.request, timeout=attempts.timeout(op.floor_s),
                                      metadata=self._metadata(op.method))  # fmt: skip
            except grpc.RpcError as exc:
                await asyncio.sleep(attempts.failed(address, _Failure.of(exc)))
                continue
            except _FailedAttempt as exc:
                if self._unframe(exc):
                    op = dataclasses.replace(op, framed=False)
                    continue
                await asyncio.sleep(attempts.failed(address, exc.failure))
                continue
            if op.forgets_leader:
                self._router.leader = None
            return op.convert(resp)

    async def _discover(self, attempts: _Attempts) -> None:
        results = await self.status_all(timeout_s=attempts.timeout(cap_s=_DISCOVERY_TIMEOUT_S))
        self._router.learn([r for r in results if isinstance(r, NodeStatus)])

    async def put(
        self,
        topic: str,
        body: bytes | str,
        *,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        uniq_key: str | None = None,
        queue_id: int | None = None,
        delay_level: int = 0,
        deliver_at_ms: int = 0,
    ) -> PutResult:
        spec = MessageSpec(topic, body, keys, tags, properties, uniq_key, queue_id,
                           delay_level=delay_level, deliver_at_ms=deliver_at_ms)  # fmt: skip
        return await self._run(self._op_put(spec))

    async def put_half(
        self,
        topic: str,
        body: bytes | str,
        *,
        producer_group: str,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        uniq_key: str | None = None,
        queue_id: int | None = None,
    ) -> HalfResult:
        spec = MessageSpec(topic, body, keys, tags, properties, uniq_key, queue_id)
        return await self._run(self._op_put_half(spec, producer_group))

    async def end_transaction(
        self, half: HalfResult | str, half_offset: int | None = None, *, commit: bool
    ) -> TransactionEnd:
        return await self._run(self._op_end(half, half_offset, commit))

    async def put_batch(self, messages: Sequence[MessageSpec]) -> list[PutResult]:
        return await self._run(self._op_batch(messages))

    async def put_stream(
        self, messages: Iterable[MessageSpec], batch: int = 64
    ) -> AsyncIterator[PutResult]:
        for chunk in _chunks(messages, batch):
            for result in await self.put_batch(chunk):
                yield result

    async def get(
        self, msg_id: str | None = None, offset: int | None = None, linearizable: bool = False
    ) -> StoredMessage:
        return await self._run(self._op_get(msg_id, offset, linearizable))

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        tag_expression: str = "*",
        wait_ms: int = 0,
        linearizable: bool = False,
    ) -> PullResult:
        return await self._run(
            self._op_pull(
                topic, queue_id, offset, max_messages, tag_expression, wait_ms, linearizable
            )
        )

    async def queue_offsets(self, topic: str = "", linearizable: bool = False) -> list[QueueOffset]:
        return await self._run(self._op_queue_offsets(topic, linearizable))

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self._run(self._op_commit_offset(group, topic, queue_id, offset))

    async def fetch_offset(
        self, group: str, topic: str, queue_id: int = -1, linearizable: bool = False
    ) -> dict[int, int]:
        return await self._run(self._op_fetch_offset(group, topic, queue_id, linearizable))

    async def query(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 0, max_messages: int = 32
    ) -> list[StoredMessage]:
        return await self._run(self._op_query(topic, key, begin_ms, end_ms, max_messages))

    async def read_range(
        self, from_offset: int, max_messages: int = 1024, max_bytes: int = 4 << 20
    ) -> ReadRangeResult:
        return await self._run(self._op_range(from_offset, max_messages, max_bytes))

    async def transfer_leadership(self, target_node_id: int, timeout_ms: int = 5000) -> int:
        return await self._run(self._op_transfer(target_node_id, timeout_ms))

    async def status(self, server: str | None = None, timeout_s: float | None = None) -> NodeStatus:
        address = self._status_target(server)
        try:
            resp = await self._stub(address).Status(
                pb.StatusRequest(), timeout=timeout_s or 2.0, metadata=self._metadata("Status")
            )
        except grpc.RpcError as exc:
            raise _Failure.of(exc).error(address) from None
        return self._accept(address, resp)

    async def status_all(self, timeout_s: float | None = None) -> list[NodeStatus | StatusError]:
        async def one(address: str) -> NodeStatus | StatusError:
            try:
                return await self.status(address, timeout_s)
            except ClientError as exc:
                return StatusError(address, exc)

        return list(await asyncio.gather(*(one(s) for s in self.servers)))

    def _aio_stub(self, address: str) -> Any:
        return self._stub(address)

    async def close(self) -> None:
        await self._close_pipes()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
