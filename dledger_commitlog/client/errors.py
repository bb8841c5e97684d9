"""What a call of either client can fail with: `ClientError` and its kinds.

Owns the error classes only; which gRPC status becomes which error is decided in
`retry.py`. Invariant: an error names the status it came from (`code`, "" when
the client itself refused) and the server that said so (`address`), and an error
that leaves a write's fate open is an `OutcomeUnknown` carrying the uniq keys a
retry must reuse.
"""

from __future__ import annotations

from collections.abc import Sequence


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


class ChangeRefused(ClientError):
    """The cluster refused a membership change as things stand (an id that exists, the
    last voter, an unknown node, a learner still behind, a change pending), or a drain
    that would leave a shard without a voter that may lead: nothing changed. The
    message says why."""


class GroupRefused(ClientError):
    """The group coordinator refused: a lease the member no longer holds (a stale
    owner is fenced), a member whose session ended, or settings that disagree with
    its group's. A consumer heartbeats again; the message says which."""


class WrongCluster(ClientError):
    """The server belongs to another cluster than the one this client names."""


class Unauthenticated(ClientError):
    """The cluster wants credentials, and these are missing, unknown or wrong."""


class PermissionDenied(ClientError):
    """The credentials are good but lack the right for this call."""
