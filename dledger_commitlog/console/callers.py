"""Who an HTTP request runs as, and the cluster client it runs with.

Owns `ClusterAccess` (how the console reaches the cluster: servers, cluster name,
CA, its own credentials, whether the cluster has an ACL, the client deadline, the
nodes' metrics ports),
`Caller` (one request's identity and its `AsyncRoutedClient`) and `Callers` (the
clients by credentials, a bounded cache). With an ACL every request must sign in
with HTTP Basic (`Authorization: Basic base64(access_key:secret_key)`, `curl -u
AK:SK`): the console makes that user's client, so the cluster checks that user's
rights on every call, and the console holds no right of its own. Without an ACL
every request runs with the console's own credentials (those of the cluster file,
usually none).

Invariants: a request never runs with another user's credentials; at most `size`
clients are open (the least recently used is closed); credentials are never
logged or echoed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from dledger_commitlog.client import AsyncRoutedClient
from dledger_commitlog.console.http import Request
from dledger_commitlog.console.refusals import unauthenticated

_MAX_CREDENTIAL_BYTES = 1024


@dataclass(frozen=True, slots=True)
class ClusterAccess:
    """How the console reaches the cluster."""

    servers: tuple[str, ...]
    cluster: str = ""
    tls_ca: bytes | None = None
    credentials: tuple[str, str] | None = None  # the console's own (used without an ACL)
    acl: bool = False
    timeout_s: float = 10.0
    metrics: tuple[tuple[str, str], ...] = ()  # (client address, metrics HOST:PORT) per node

    def client(self, credentials: tuple[str, str] | None) -> AsyncRoutedClient:
        """A routed client of the cluster signing with `credentials`."""
        return AsyncRoutedClient(
            list(self.servers),
            cluster=self.cluster or None,
            tls_ca=self.tls_ca,
            credentials=credentials,
            timeout_s=self.timeout_s,
        )


@dataclass(frozen=True, slots=True)
class Caller:
    """A request's identity (`user`: its access key, "" without an ACL) and client."""

    user: str
    identity: str  # access key and a digest of the secret: who owns what it makes
    credentials: tuple[str, str] | None
    client: AsyncRoutedClient


class Callers:
    """The clients of the users who sign in, by credentials (at most `size` open)."""

    def __init__(self, access: ClusterAccess, size: int = 32) -> None:
        self.access = access
        self.size = size
        self._clients: OrderedDict[str, Caller] = OrderedDict()

    async def caller(self, request: Request) -> Caller:
        """Who `request` runs as (ApiError 401 where the ACL needs credentials and the
        request has none, or has them malformed)."""
        credentials = basic_credentials(request) if self.access.acl else self.access.credentials
        if self.access.acl and credentials is None:
            raise unauthenticated(
                "the cluster has an ACL: sign in with HTTP Basic (access key and secret key)"
            )
        identity = _identity(credentials)
        found = self._clients.get(identity)
        if found is not None:
            self._clients.move_to_end(identity)
            return found
        user = credentials[0] if credentials and self.access.acl else ""
        caller = Caller(user, identity, credentials, self.access.client(credentials))
        self._clients[identity] = caller
        while len(self._clients) > self.size:
            _, old = self._clients.popitem(last=False)
            await old.client.close()
        return caller

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for caller in clients:
            await caller.client.close()


def basic_credentials(request: Request) -> tuple[str, str] | None:
    """(access key, secret key) of an `Authorization: Basic` header (None: no header);
    ApiError 401 when it is not Basic or does not decode."""
    value = request.header("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    if scheme.lower() != b"basic" or len(token) > _MAX_CREDENTIAL_BYTES:
        raise unauthenticated("use HTTP Basic: Authorization: Basic base64(access_key:secret_key)")
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise unauthenticated("the Basic credentials are not base64 of UTF-8 text") from None
    access_key, sep, secret_key = text.partition(":")
    if not sep or not access_key:
        raise unauthenticated("the Basic credentials must be access_key:secret_key")
    return access_key, secret_key


def _identity(credentials: tuple[str, str] | None) -> str:
    if credentials is None:
        return ""
    digest = hashlib.sha256(f"{credentials[0]}\0{credentials[1]}".encode()).hexdigest()
    return f"{credentials[0]}:{digest}"
