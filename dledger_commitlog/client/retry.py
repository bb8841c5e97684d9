"""The one retry/redirect core under both clients: what a call does next.

Owns `Op` (one operation: its RPC, request, result conversion and how it may be
retried), `Router` (the client's view of the cluster: its servers, the leader,
which configured address a leader hint stands for, whether it speaks PutFrames),
`Attempts` (one call's policy: which address next, how long an attempt may take,
how long to back off, when to give up), `Failure` (one failed attempt, read off a
gRPC error or a framed put's outcome) and `Run`, which drives an Op without doing
any I/O: it says what to do next (`Attempt` a call, `Pause`, `Discover` the
leader) and is told what came of it. `Client` and `AsyncClient` only perform those
steps, blocking or awaiting. Reads that any replica may answer (the analytics
source's) run under `ReplicaReads`: the next replica after a refusal worth
another, sticking to the one that answered; `Backoff` is the jittered exponential
pause both policies take.

Invariants: a put's uniq_key is fixed before its first attempt, so every retry
carries the same one and is idempotent; no call outlives its deadline;
INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE, ABORTED, UNAUTHENTICATED and
PERMISSION_DENIED are never retried; a write that may have been applied and then
gave up is an `OutcomeUnknown`, never a plain `Unavailable`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc

from dledger_commitlog.client import errors
from dledger_commitlog.client.values import NodeStatus, StatusError

R = TypeVar("R")

LEADER_METADATA = "dledger-leader"
_NOT_RETRIED: dict[str, type[errors.ClientError]] = {
    "INVALID_ARGUMENT": errors.InvalidArgument,
    "NOT_FOUND": errors.NotFound,
    "OUT_OF_RANGE": errors.OffsetOutOfRange,
    "FAILED_PRECONDITION": errors.WrongCluster,  # without a leader hint: see `Attempts.failed`
    "ABORTED": errors.TransactionConflict,
}
_AUTH: dict[str, type[errors.ClientError]] = {
    "UNAUTHENTICATED": errors.Unauthenticated,
    "PERMISSION_DENIED": errors.PermissionDenied,
}
_DISCOVERY_TIMEOUT_S = 1.0  # Status is cheap: a node slower than this is not worth leading to
_RETRIED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED"})
# gRPC's wording when the connection was never made: the request cannot have arrived.
NO_ANSWER = "no answer in time"  # a framed put's attempt cut by the client's deadline
# An attempt the client's own deadline ended (grpc's words for a unary call, ours above).
_OWN_DEADLINE = frozenset({NO_ANSWER, "Deadline Exceeded"})
_CONNECT_FAILURES = ("failed to connect", "connection refused", "dns resolution failed")


@dataclass(frozen=True, slots=True)
class Op(Generic[R]):
    """One client operation, as both clients run it."""

    name: str
    method: str  # the RPC
    request: Any
    convert: Callable[[Any], R]  # the RPC's response -> the caller's result
    write: bool = False
    uniq_keys: tuple[str, ...] = ()
    floor_s: float = 0.0  # an attempt may take this long however short attempt_timeout_s is
    forgets_leader: bool = False
    framed: bool = False  # a single put: through the server's PutFrames stream if it has one
    pinned: str | None = None  # this server only, one attempt (status, clean_now)
    timeout_s: float | None = None  # its own deadline instead of the client's
    # FAILED_PRECONDITION without a leader hint is this error (None: WrongCluster)
    refusal: type[errors.ClientError] | None = None
    # A timeout leaves it open (a membership change may still commit): OutcomeUnknown at
    # once instead of a retry that would be refused as a second change.
    unknown_on_timeout: bool = False

    def call(self, stub: Any, timeout_s: float, metadata: Callable[[str], Any]) -> Any:
        """Make the unary call on `stub` (a blocking stub's answer, an asyncio one's call)."""
        rpc = getattr(stub, self.method)
        return rpc(self.request, timeout=timeout_s, metadata=metadata(self.method))


class Policy(Protocol):
    """A client's retry settings, read at the start of each call (see `ClientBase`)."""

    timeout_s: float
    max_retries: int
    attempt_timeout_s: float
    backoff_base_s: float
    backoff_max_s: float
    rng: random.Random  # the back-off jitter


class Failure:
    """One failed attempt, read off a grpc.RpcError (blocking and asyncio ones alike)."""

    __slots__ = ("code", "details", "leader_hint")

    def __init__(self, code: str, details: str, leader_hint: str | None = None) -> None:
        self.code = code
        self.details = details
        self.leader_hint = leader_hint  # None: no metadata; "": the node knows no leader

    @classmethod
    def of(cls, exc: grpc.RpcError) -> Failure:
        code = exc.code()
        hint = None
        for key, value in exc.trailing_metadata() or ():
            if key == LEADER_METADATA:
                hint = value.decode() if isinstance(value, bytes) else str(value)
        return cls(getattr(code, "name", str(code)), exc.details() or "", hint)

    def error(
        self, address: str, write: bool = False, refusal: type[errors.ClientError] | None = None
    ) -> errors.ClientError:
        if write and self.too_large:
            why = f"{self.details}: nothing was stored"
            return errors.InvalidArgument(why, code=self.code, address=address)
        retried = errors.Unavailable if self.code in _RETRIED else errors.ClientError
        kind = _NOT_RETRIED.get(self.code, _AUTH.get(self.code, retried))
        if (
            refusal is not None
            and self.code == "FAILED_PRECONDITION"
            and not self.details.startswith("wrong cluster")
        ):
            kind = refusal
        return kind(self.details or self.code, code=self.code, address=address)

    @property
    def too_large(self) -> bool:
        """gRPC refused the request for its size (ours or the server's limit): not stored."""
        return self.code == "RESOURCE_EXHAUSTED" and "larger than max" in self.details

    @property
    def answered(self) -> bool:
        """Whether a server said this (not the client's own deadline cutting the attempt)."""
        return not (self.code == "DEADLINE_EXCEEDED" and self.details in _OWN_DEADLINE)

    @property
    def never_sent(self) -> bool:
        text = self.details.lower()
        return self.code == "UNAVAILABLE" and any(s in text for s in _CONNECT_FAILURES)


class Backoff:
    """Pauses between attempts: each between half and all of a cap that doubles from
    `base_s` up to `max_s` (jittered, so that clients do not retry in step)."""

    __slots__ = ("_base_s", "_count", "_max_s", "_rng")

    def __init__(self, base_s: float, max_s: float, rng: random.Random) -> None:
        self._base_s, self._max_s, self._rng = base_s, max_s, rng
        self._count = 0

    def next(self) -> float:
        cap = min(self._max_s, self._base_s * 2.0 ** min(self._count, 30))
        self._count += 1
        return cap / 2 + self._rng.uniform(0, cap / 2)


class ReplicaRefused(Exception):
    """A replica refused a read in a way no other replica would answer otherwise."""

    def __init__(self, what: str, address: str, failure: Failure) -> None:
        self.address, self.failure = address, failure
        super().__init__(
            f"{what}: {address} answered {failure.code}: {failure.details or failure.code}"
        )


class ReplicasExhausted(Exception):
    """No replica answered a read before its deadline (the message names what each said)."""


class ReplicaReads:
    """The retry policy of reads any replica may answer: each attempt on the next
    replica, starting from the one that answered last (it stays first until one fails
    over), a round of them and then a back-off, until the read's deadline. A failure
    `retried` does not accept ends the read at once (`ReplicaRefused`)."""

    def __init__(self, servers: Sequence[str], first: int = 0) -> None:
        self.servers = list(servers)
        self._first = first % len(self.servers)
        self._rng = random.Random()

    @property
    def current(self) -> str:
        """The replica tried first: the last that answered, unless failed over since."""
        return self.servers[self._first]

    def in_order(self) -> list[str]:
        """Every replica, the current one first."""
        n = len(self.servers)
        return [self.servers[(self._first + k) % n] for k in range(n)]

    def fail_over(self) -> None:
        """Try the next replica first from now on."""
        self._first = (self._first + 1) % len(self.servers)

    def call(
        self,
        attempt: Callable[[str, float], R],
        what: str,
        *,
        timeout_s: float,
        attempt_s: float,
        retried: Callable[[Failure], bool],
    ) -> R:
        """`attempt(address, timeout)` on one replica after another (see the class)."""
        deadline = time.monotonic() + timeout_s
        said: dict[str, str] = {}
        pauses = Backoff(0.1, 2.0, self._rng)
        while True:
            for k, address in enumerate(self.in_order()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    answer = attempt(address, min(attempt_s, remaining))
                except grpc.RpcError as exc:
                    failure = Failure.of(exc)
                    if not retried(failure):
                        raise ReplicaRefused(what, address, failure) from None
                    said[address] = f"{failure.code}: {failure.details or failure.code}"
                    continue
                self._first = (self._first + k) % len(self.servers)  # stick to what works
                return answer
            pause = pauses.next()
            if time.monotonic() + pause >= deadline:
                tried = "; ".join(f"{a}: {e}" for a, e in said.items()) or "no attempt"
                raise ReplicasExhausted(f"{what}: no server answered in {timeout_s:g}s ({tried})")
            time.sleep(pause)


class Router:
    """The client's view of the cluster, shared by all its calls."""

    def __init__(self, servers: Sequence[str], framed: bool = True) -> None:
        self.servers = list(dict.fromkeys(s.strip() for s in servers if s.strip()))
        if not self.servers:
            raise ValueError("a client needs at least one server address (host:port)")
        self.leader: str | None = None
        self.framed = framed  # single puts go through PutFrames (False: the cluster lacks it)
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

    def learn(self, statuses: Sequence[NodeStatus | StatusError]) -> None:
        """Record Status answers; the leader is the one the highest term names."""
        answers = [st for st in statuses if isinstance(st, NodeStatus)]
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


class Attempts:
    """The retry policy of one call. `failed` returns the back-off or raises the error."""

    def __init__(self, router: Router, policy: Policy, op: Op[Any]) -> None:
        self.router = router
        self.op = op
        self.timeout_s = op.timeout_s or policy.timeout_s
        self.deadline = time.monotonic() + self.timeout_s
        self.attempt_timeout_s = op.timeout_s or policy.attempt_timeout_s
        self.max_retries = policy.max_retries
        self.backoff_base_s = policy.backoff_base_s
        self.backoff_max_s = policy.backoff_max_s
        self.rng = policy.rng
        self.attempts = 0
        self.maybe_applied = False
        self.last: tuple[str, Failure] | None = None
        self.last_answer: tuple[str, Failure] | None = None  # the last a server said
        self._pauses = Backoff(policy.backoff_base_s, policy.backoff_max_s, policy.rng)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def next_address(self) -> str:
        if self.op.pinned is not None:
            return self.op.pinned
        if self.router.leader is not None:
            return self.router.leader
        return self.router.next_server(avoid=self.last[0] if self.last else None)

    def timeout(self, floor_s: float = 0.0, cap_s: float | None = None) -> float:
        remaining = self.remaining()
        if remaining <= 0:
            raise self.give_up()
        return min(remaining, cap_s or max(self.attempt_timeout_s, floor_s))

    def failed(self, address: str, failure: Failure) -> float:
        self.attempts += 1
        self.last = (address, failure)
        if failure.answered:
            self.last_answer = (address, failure)
        write = self.op.write
        delay: float
        if self.op.pinned is not None:
            raise failure.error(address, refusal=self.op.refusal)
        if failure.code == "FAILED_PRECONDITION" and failure.leader_hint is not None:
            if failure.leader_hint:
                was = self.router.leader
                target = self.router.redirect(failure.leader_hint)
                delay = 0.0 if target not in (address, was) else self._backoff()
            else:  # the node is not the leader and knows none: an election is under way
                self.router.forget(address)
                delay = self._backoff()
        elif failure.code in _NOT_RETRIED or (write and failure.too_large):
            raise failure.error(address, write, self.op.refusal)
        elif failure.code in _RETRIED:
            if not failure.never_sent:
                self.maybe_applied = True
            if self.op.unknown_on_timeout and failure.code == "DEADLINE_EXCEEDED":
                raise self.give_up()
            if failure.code != "RESOURCE_EXHAUSTED":
                self.router.forget(address)
            delay = self._backoff()
        else:
            raise failure.error(address)
        if self.attempts > self.max_retries or self.remaining() <= delay:
            raise self.give_up()
        return delay

    def _backoff(self) -> float:
        return self._pauses.next()

    def give_up(self) -> errors.ClientError:
        op = self.op
        what = f"{op.name}: gave up after {self.attempts} attempt(s) in {self.timeout_s:g}s"
        if self.last is None:
            return errors.Unavailable(f"{what}: no attempt was made", code="DEADLINE_EXCEEDED")
        address, failure = self.last
        why = f"{what}; last error from {address}: {failure.code}: {failure.details}"
        if not failure.answered and self.last_answer is not None:
            # Time ran out in the last attempt: what the servers last said says more.
            said_by, said = self.last_answer
            why = (
                f"{what}; last answer from {said_by}: {said.code}: {said.details} (the "
                "last attempt got no answer in time)"
            )
        if op.write and self.maybe_applied:
            keys = op.uniq_keys
            return errors.OutcomeUnknown(why, code=failure.code, address=address, uniq_keys=keys)
        if failure.code == "RESOURCE_EXHAUSTED":
            return errors.ResourceExhausted(why, code=failure.code, address=address)
        return errors.Unavailable(why, code=failure.code, address=address)


# ---------------------------------------------------------------- the steps of a run


@dataclass(frozen=True, slots=True)
class Attempt:
    """Call `op` on `address` within `timeout_s`; answer: its response, or a Failure.
    `framed`: put `op.request.message` through the server's PutFrames stream."""

    address: str
    op: Op[Any]
    timeout_s: float
    framed: bool


@dataclass(frozen=True, slots=True)
class Pause:
    """Back off for `delay_s`; answer: None."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class Discover:
    """Ask the servers' Status, each within `budget_s()`, until `deadline` (monotonic);
    answer: the NodeStatus and StatusError of those asked."""

    deadline: float
    cap_s: float

    def budget_s(self) -> float:
        """How long the next Status may take (<= 0: ask no more)."""
        return min(self.cap_s, self.deadline - time.monotonic())


Step = Attempt | Pause | Discover


class Run(Generic[R]):
    """One call of `op`, step by step: perform `step`, `answer` with its outcome, until
    `step` is None and `result` holds the call's result (or `answer` raised its error).

    The client's shell loop is all that differs between the clients:
        run = Run(router, policy, op)
        while run.step is not None:
            run.answer(perform(run.step))   # or: await perform(run.step)
        return run.result
    """

    def __init__(self, router: Router, policy: Policy, op: Op[R]) -> None:
        self._steps = _steps(router, Attempts(router, policy, op))
        self.step: Step | None = next(self._steps)
        self.result: R

    def answer(self, outcome: Any) -> None:
        try:
            self.step = self._steps.send(outcome)
        except StopIteration as done:
            self.step = None
            self.result = done.value


def _steps(router: Router, attempts: Attempts) -> Generator[Step, Any, Any]:
    op = attempts.op
    while True:
        if op.pinned is None and router.leader is None:
            cap_s = attempts.timeout(cap_s=_DISCOVERY_TIMEOUT_S)
            router.learn((yield Discover(attempts.deadline, cap_s)))
        address = attempts.next_address()
        framed = op.framed and router.framed
        outcome = yield Attempt(address, op, attempts.timeout(op.floor_s), framed)
        if not isinstance(outcome, Failure):
            if op.forgets_leader:
                router.leader = None
            return op.convert(outcome)
        if framed and outcome.code == "UNIMPLEMENTED":
            router.framed = False  # a server from before PutFrames: unary puts from now on
            continue
        yield Pause(attempts.failed(address, outcome))
