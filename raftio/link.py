"""A Raft peer link, written once for both gRPC stacks: the outgoing queue and the
gate every incoming stream passes.

Owns `PeerLink`, the sending side of one ordered pair of nodes: a bounded queue of
(message, size bound) pairs (`send` never blocks the loop; past MAX_QUEUED the
oldest are dropped), cut into batches (`next_batch`: one RaftBatch of MAX_BATCH
messages and MAX_BATCH_BYTES at most, one message at least), and the loop that
keeps one stream open to the peer (`_stream_once` is the stack's), retrying an
unreachable peer every 50 ms, backing off to 300 ms, so that a restarted peer is
reached again well within an election timeout. And `PeerGate`, the receiving side:
who a stream comes from (`sender`: certificate, peer token, claimed id,
membership) and the parse, check and delivery of each batch (`receive`). A refusal
is a `Refusal` naming a gRPC status, which the stack (`raftio.h2`) answers as that
call's status.

Invariants: messages to one peer leave in the order they were queued; a broken
stream loses what was queued for it (Raft retransmits), never reorders, except what
a refusal says the peer never read (BATCHES_READ; a batch refused for membership
counts as not read): that goes first on the next stream, so a message queued while
the peer refused a sender it would take a moment later (a joining node) is not
lost; nothing waits for a peer but the link's own task (a slow peer holds its sender in HTTP/2
flow control, while `send` keeps dropping the oldest past MAX_QUEUED); nothing of a
stream reaches the core before its sender is proven, nothing of a batch that does
not decode whole, and nothing after the first message refused.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from netkit.peer_auth import NODE_AUTH, PeerAuthError, PeerSecurity
from netkit.tasks import cancel_and_wait
from proto import dledger_pb2 as pb
from raft.messages import Message
from raft.validate import InvalidPeerMessage
from raftio.wire import (
    BATCHES_READ,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MAX_QUEUED,
    PEER_ID,
    WIRE,
    WIRE_VERSIONS,
    from_proto,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 0.2  # a peer that has not answered by then is tried again
_RETRY_MIN_S = 0.05  # attempts to an unreachable peer: at most one per this, doubling...
_RETRY_MAX_S = 0.3  # ...up to this
_REFUSED_PAUSE_S = 1.0  # after a refusal (another cluster, a bad token): retrying can wait
# A stream's last batches kept, for a refusal (`_end_stream`): this many, this size at most.
_SENT_KEPT, _SENT_KEPT_BYTES = 64, MAX_BATCH_BYTES
# Statuses that say the peer will not take our stream as it is (logged as errors).
REFUSALS = frozenset(
    {"FAILED_PRECONDITION", "UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT"}
)


class LinkRefused(Exception):
    """The peer ended our stream with one of REFUSALS; `read`: how many of the stream's
    batches it took off it (BATCHES_READ; None from a peer that does not say)."""

    def __init__(self, code: str, details: str, read: int | None = None) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details, self.read = code, details, read


def batches_read(trailing: Iterable[tuple[str, Any]] | None) -> int | None:
    """BATCHES_READ of a refusal's trailing metadata, if the peer said it."""
    for key, value in trailing or ():
        text = value.decode() if isinstance(value, bytes) else str(value)
        if key == BATCHES_READ and text.isdigit():
            return int(text)
    return None


class LinkBroken(Exception):
    """The stream, once open, broke (the peer stopped, the connection died)."""


class PeerLink:
    """The outgoing stream to one peer, reopened when it breaks.

    With TLS the connection verifies the peer against the CA and presents this
    node's certificate; with a cluster secret each stream opens with a fresh peer
    token (`metadata`). A stack subclasses it with `_stream_once`.
    """

    def __init__(
        self,
        cluster: str,
        peer_id: int,
        address: str,
        *,
        me: int = 0,
        security: PeerSecurity | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.address = address
        self._cluster = cluster
        self._me = me
        self._security = security or PeerSecurity()
        self._queue: collections.deque[tuple[pb.RaftMessage, int]] = collections.deque()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.dropped = 0
        self.stream_id = 0  # counts the streams opened; `next_batch` serves the current one
        # The current stream's last batches (index, messages with size bounds, size),
        # _SENT_KEPT and _SENT_KEPT_BYTES at most: what a refusal says the peer never
        # read is sent again on the next stream.
        self._sent: collections.deque[tuple[int, list[tuple[pb.RaftMessage, int]], int]]
        self._sent = collections.deque()
        self._sent_count = self._sent_bytes = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"peer-{self.peer_id}"
        )

    def send(self, messages: Sequence[tuple[pb.RaftMessage, int]]) -> None:
        """Queue (message, size bound) pairs (`wire.to_wire`) for the stream."""
        self._queue.extend(messages)
        self._drop_past_bound()
        self._ready.set()

    def _drop_past_bound(self) -> None:
        while len(self._queue) > MAX_QUEUED:
            self._queue.popleft()
            self.dropped += 1

    async def next_batch(self, stream: int | None = None) -> pb.RaftBatch | None:
        """The next batch to send, once a message is queued. With `stream` (the
        `stream_id` it was opened as): None once that stream is over, so that a
        stream's request iterator that outlives it (grpc.aio's consumer of a refused
        stream) never takes a message the next stream should carry."""
        while stream is None or stream == self.stream_id:
            if self._queue:
                return pb.RaftBatch(cluster=self._cluster, messages=self._take_batch())
            self._ready.clear()
            await self._ready.wait()
        return None

    def _take_batch(self) -> list[pb.RaftMessage]:
        """The next messages of the queue: MAX_BATCH, MAX_BATCH_BYTES at most (one at
        least), kept in `_sent` until the stream ends."""
        first = self._queue.popleft()
        pairs, size = [first], first[1]
        while self._queue and len(pairs) < MAX_BATCH:
            size += self._queue[0][1]
            if size > MAX_BATCH_BYTES:
                break
            pairs.append(self._queue.popleft())
        self._sent.append((self._sent_count, pairs, size))
        self._sent_count += 1
        self._sent_bytes += size
        while len(self._sent) > 1 and (
            self._sent_bytes > _SENT_KEPT_BYTES or len(self._sent) > _SENT_KEPT
        ):
            self._sent_bytes -= self._sent.popleft()[2]
        return [msg for msg, _ in pairs]

    def _end_stream(self, read: int | None) -> None:
        """The stream is over: with `read` (a refusal said how many of its batches the
        peer took), put the batches after those back at the head of the queue."""
        if read is not None:
            unread = [pair for index, pairs, _ in self._sent if index >= read for pair in pairs]
            self._queue.extendleft(reversed(unread))
            self._drop_past_bound()
        self._sent.clear()
        self._sent_count = self._sent_bytes = 0
        self.connected = False
        self.stream_id += 1
        self._ready.set()  # what waits for the stream that ended returns

    def metadata(self) -> list[tuple[str, str]]:
        """What a new stream opens with: the id we claim, the wire versions we speak
        and, with a cluster secret, a fresh token proving it (a token is good for one
        stream only)."""
        meta = [(PEER_ID, str(self._me)), (WIRE, ",".join(map(str, WIRE_VERSIONS)))]
        if self._security.peers is not None:
            meta.append((NODE_AUTH, self._security.peers.token(self._me, self.peer_id)))
        return meta

    async def _stream_once(self) -> None:
        """Open a stream, set `connected`, and send batches on it until it ends:
        TimeoutError or OSError if the peer cannot be reached, LinkRefused or
        LinkBroken once it was."""
        raise NotImplementedError

    async def _run(self) -> None:
        delay_s = _RETRY_MIN_S
        while True:
            started = time.monotonic()
            read: int | None = None
            try:
                await self._stream_once()
            except asyncio.CancelledError:
                raise
            except LinkRefused as exc:
                read = exc.read
                if exc.code != "PERMISSION_DENIED":
                    log.error(
                        "peer %d refused our stream: %s: %s", self.peer_id, exc.code, exc.details
                    )
                    await asyncio.sleep(_REFUSED_PAUSE_S)
                    continue
                # Not a member there (yet): a joining node whose addition that peer has
                # not appended. It will be in a moment: retry as for an unreachable peer.
                log.info("peer %d does not take our stream (yet): %s", self.peer_id, exc.details)
            except LinkBroken as exc:
                log.info("stream to peer %d broke: %s", self.peer_id, exc)
            except (TimeoutError, OSError):
                pass  # not reachable (yet): try again soon, on a fresh connection
            except Exception as exc:  # a stack's error no case above names: never end the link
                log.warning("stream to peer %d failed: %r", self.peer_id, exc)
            finally:
                self._end_stream(read)
            if time.monotonic() - started > CONNECT_TIMEOUT_S:
                delay_s = _RETRY_MIN_S  # it was up for a while: the peer may be back at once
                continue
            await asyncio.sleep(delay_s)
            delay_s = min(2 * delay_s, _RETRY_MAX_S)

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)


class Refusal(Exception):
    """A stream or a batch this node refuses. `code` names the gRPC status (the same
    name in `grpc.StatusCode` and h2grpc's `frames.STATUS_NAMES`); `why` is what the peer is told;
    `again`: the refused batch is to be sent again (a membership refusal: the sender
    may be a member a moment later), so BATCHES_READ does not count it."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why
        self.again = False

    def batches_read(self, taken: int) -> str:
        """BATCHES_READ of this refusal, given how many batches the stream `taken`."""
        return str(taken - 1 if self.again else taken)


class PeerGate:
    """Checks peers' streams and hands each message of theirs to `deliver`.

    A stream is accepted only from a member: the one its mTLS certificate names
    (TLS on), the one its peer token proves (cluster secret), or any member in
    open mode; every message on it must then come from that member. A stream whose
    sender speaks none of this node's wire versions (metadata WIRE) is refused
    FAILED_PRECONDITION, naming both.
    `deliver` raises InvalidPeerMessage for a message it refuses: the stream
    ends with INVALID_ARGUMENT (PERMISSION_DENIED for a membership violation),
    logged and counted by `on_reject(reason)`, and nothing of its batch reaches
    the core. A batch that does not parse is INVALID_ARGUMENT too ("malformed").
    """

    def __init__(
        self,
        cluster: str,
        deliver: Callable[[Message], None],
        *,
        me: int = 0,
        members: Collection[int] | Callable[[], Collection[int]] = (),
        security: PeerSecurity | None = None,
        on_reject: Callable[[str], None] | None = None,
        shards: Callable[[int], Callable[[Message], None] | None] | None = None,
    ) -> None:
        self.cluster = cluster
        self._deliver = deliver
        # Several shards (raftio/multiplex.py): the deliver of the shard a message names (None:
        # the process hosts no such shard); without it every message goes to `deliver`.
        self._shards = shards
        self._unknown_shards: set[int] = set()
        self._me = me
        # The live membership (a callable: the node's, which changes) or a fixed set.
        fixed = frozenset(members) if not callable(members) else frozenset()
        self._members = members if callable(members) else (lambda: fixed)
        self.security = security or PeerSecurity()
        self._on_reject = on_reject or (lambda reason: None)

    def refuse(self, peer: str, code: str, reason: str, why: str) -> Refusal:
        """Log and count a refusal (`reason`: the on_reject label); the Refusal to raise."""
        log.warning("refused a raft stream from %s: %s", peer, why)
        self._on_reject(reason)
        return Refusal(code, why)

    def sender(self, metadata: Mapping[str, str], cert_node: int | None, peer: str) -> int | None:
        """The member a stream comes from (None in open mode: any member), given its
        metadata and, with TLS, the node its verified certificate names."""
        claimed_text = metadata.get(PEER_ID)
        claimed = int(claimed_text) if claimed_text and claimed_text.isdigit() else None
        sender: int | None = None
        sec = self.security
        if sec.tls is not None:
            sender = cert_node
            if sender is None:
                raise self.refuse(
                    peer, "UNAUTHENTICATED", "certificate", "its certificate names no dledger node"
                )
        if sec.peers is not None:
            try:
                proven = sec.peers.check(metadata.get(NODE_AUTH), self._me, once=True)
                if sender is not None and proven != sender:
                    raise PeerAuthError(f"token for node {proven} on node {sender}'s certificate")
            except PeerAuthError as exc:
                raise self.refuse(peer, "UNAUTHENTICATED", "token", exc.message) from None
            sender = proven
        if sender is not None and claimed is not None and claimed != sender:
            raise self.refuse(
                peer,
                "UNAUTHENTICATED",
                "identity",
                f"claims to be node {claimed} but is node {sender}",
            )
        self._check_wire(metadata.get(WIRE), claimed if sender is None else sender, peer)
        if sender is not None and (sender not in self._members() or sender == self._me):
            raise self.refuse(
                peer,
                "PERMISSION_DENIED",
                "membership",
                f"node {sender} is not a peer of node {self._me}",
            )
        return sender

    def _check_wire(self, text: str | None, node: int | None, peer: str) -> None:
        """Refuse a stream whose sender speaks no wire version this node speaks
        (absent: version 1, a node older than the field)."""
        theirs = [int(v) for v in (text or "1").split(",") if v.strip().isdigit()]
        if set(theirs) & set(WIRE_VERSIONS):
            return
        who = f"node {node}" if node is not None else peer
        raise self.refuse(
            peer,
            "FAILED_PRECONDITION",
            "wire",
            f"{who} speaks Raft wire version {_versions(theirs)}, node {self._me} speaks "
            f"{_versions(WIRE_VERSIONS)}: they cannot run side by side (docs/upgrades.md)",
        )

    def receive(self, raw: bytes, sender: int | None, peer: str) -> None:
        """Parse one RaftBatch, check it and deliver its messages: all or none of them."""
        try:
            batch = pb.RaftBatch.FromString(raw)
        except DecodeError as exc:
            raise self.refuse(
                peer, "INVALID_ARGUMENT", "malformed", f"malformed raft batch: {exc}"
            ) from None
        if batch.cluster != self.cluster:
            raise Refusal(
                "FAILED_PRECONDITION",
                f"wrong cluster: this node belongs to "
                f"{self.cluster!r}, the stream to {batch.cluster!r}",
            )
        try:  # the whole batch decodes, or none of it is delivered
            messages = [from_proto(p) for p in batch.messages]
        except ValueError as exc:
            raise self.refuse(
                peer, "INVALID_ARGUMENT", "malformed", f"malformed raft message: {exc}"
            ) from None
        delivers = self._delivers(batch) if self._shards is not None else None
        for i, msg in enumerate(messages):
            try:
                if sender is not None and msg.src != sender:
                    raise InvalidPeerMessage(
                        f"message from node {msg.src} on node {sender}'s stream",
                        membership=True,
                    )
                if delivers is None:
                    self._deliver(msg)
                elif delivers[i] is not None:
                    delivers[i](msg)  # type: ignore[misc]
            except InvalidPeerMessage as exc:
                code = "PERMISSION_DENIED" if exc.membership else "INVALID_ARGUMENT"
                reason = "membership" if exc.membership else "invalid"
                refusal = self.refuse(peer, code, reason, exc.reason)
                refusal.again = exc.membership
                raise refusal from None

    def _delivers(self, batch: pb.RaftBatch) -> list[Callable[[Message], None] | None]:
        """Per message of `batch`, the deliver of the shard it names (absent: shard 1);
        None for a shard this process does not serve (logged once per shard: a peer
        configured with a shard this process was not, or a shard stopped here); the
        rest of the batch is delivered, so that one such shard never stalls the others."""
        assert self._shards is not None
        out: list[Callable[[Message], None] | None] = []
        for p in batch.messages:
            shard = p.group if p.HasField("group") else 1
            deliver = self._shards(shard)
            if deliver is None and shard not in self._unknown_shards:
                self._unknown_shards.add(shard)
                log.error(
                    "node %d got Raft messages of shard %d, which this process does "
                    "not serve (not hosted, or stopped): dropped",
                    self._me,
                    shard,
                )
            out.append(deliver)
        return out


def _versions(versions: Sequence[int]) -> str:
    return ",".join(map(str, versions)) or "(none)"
