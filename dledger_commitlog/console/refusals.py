"""How a client error becomes an HTTP status: the gRPC API's semantics over HTTP.

Owns `refusal` (a `ClientError` -> `ApiError`) and the table behind it:

- InvalidArgument (INVALID_ARGUMENT): 400 invalid_argument, naming the field
- OffsetOutOfRange (OUT_OF_RANGE): 400 out_of_range
- NotFound (NOT_FOUND): 404 not_found
- GroupRefused (FAILED_PRECONDITION: a stale lease, an ended session): 409 stale_lease
- TransactionConflict (ABORTED): 409 conflict
- ChangeRefused (a membership change refused as things stand: the last voter, an
  unknown node, a learner still behind, a change pending): 409 change_refused
- Unauthenticated: 401 unauthenticated (with WWW-Authenticate: Basic)
- PermissionDenied: 403 permission_denied
- ResourceExhausted: 429 resource_exhausted, Retry-After
- Unavailable (no leader): 503 unavailable, Retry-After
- OutcomeUnknown (a write may be stored): 503 outcome_unknown, Retry-After (retry
  with the same idempotency key)
- WrongCluster and anything else: 502 bad_gateway

Invariant: a refusal names the request field at fault when the cluster's message
starts with one (`topic ...`, `keys ...`), so a 400 says what to fix.
"""

from __future__ import annotations

from dledger_commitlog.client import (
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
)
from dledger_commitlog.console.http import ApiError

RETRY_AFTER_S = 1
# The first word of a cluster's INVALID_ARGUMENT message -> the HTTP request's field.
_FIELDS = {
    "topic": "topic",
    "keys": "key",
    "key": "key",
    "tags": "tag",
    "tag": "tag",
    "properties": "property",
    "property": "property",
    "uniq_key": "uniq_key",
    "body": "body",
    "queue": "queue",
    "queue_id": "queue",
    "delay_level": "delay_level",
    "deliver_at_ms": "deliver_at_ms",
    "sharding_key": "sharding_key",
    "message": "msg_id",
    "group": "group",
}
_AUTH_HEADERS = (("WWW-Authenticate", 'Basic realm="dledger", charset="UTF-8"'),)


def refusal(exc: ClientError) -> ApiError:
    """The HTTP refusal of a failed client call (see the module's table)."""
    text = exc.message
    retry = (("Retry-After", str(RETRY_AFTER_S)),)
    if isinstance(exc, InvalidArgument):
        return ApiError(400, "invalid_argument", text, _field_of(text))
    if isinstance(exc, OffsetOutOfRange):
        return ApiError(400, "out_of_range", text, "offset")
    if isinstance(exc, NotFound):
        return ApiError(404, "not_found", text)
    if isinstance(exc, GroupRefused):
        return ApiError(409, "stale_lease", text)
    if isinstance(exc, TransactionConflict):
        return ApiError(409, "conflict", text)
    if isinstance(exc, ChangeRefused):
        return ApiError(409, "change_refused", text)
    if isinstance(exc, Unauthenticated):
        return ApiError(401, "unauthenticated", text, headers=_AUTH_HEADERS)
    if isinstance(exc, PermissionDenied):
        return ApiError(403, "permission_denied", text)
    if isinstance(exc, ResourceExhausted):
        return ApiError(429, "resource_exhausted", text, headers=retry)
    if isinstance(exc, OutcomeUnknown):
        keys = ", ".join(exc.uniq_keys)
        why = f"{text} (retry with the same idempotency key: {keys})" if keys else text
        return ApiError(503, "outcome_unknown", why, headers=retry)
    if isinstance(exc, Unavailable):
        return ApiError(503, "unavailable", text, headers=retry)
    return ApiError(502, "bad_gateway", f"{exc.code or type(exc).__name__}: {text}")


def unauthenticated(message: str) -> ApiError:
    """A request without usable credentials where the cluster has an ACL."""
    return ApiError(401, "unauthenticated", message, headers=_AUTH_HEADERS)


def _field_of(message: str) -> str | None:
    first = message.split(" ", 1)[0].strip(":'\"").lower()
    return _FIELDS.get(first)
