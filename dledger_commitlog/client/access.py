"""How a client reaches a cluster: channels, TLS trust, and the credentials it signs with.

Owns `Access` (the CA and the access/secret key pair; builds blocking and asyncio
channels and the signature metadata of each call), `Channels` (a client's channel
and stub per server), `load_credentials` and `cluster_security` (what a
cluster.json says about TLS and credentials). Invariant: with credentials every
call is signed for its own RPC at the moment it is made; without a CA the channel
is plaintext.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from dledger_commitlog.common.protocol import shard_metadata
from dledger_commitlog.common.signing import sign
from netkit.reconnect import reconnect_options
from proto import dledger_pb2_grpc as pb_grpc

C = TypeVar("C", grpc.Channel, grpc.aio.Channel)

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # A node that restarts is back within an election timeout or two: reconnect
    # within a third of a second of it (gRPC's own default grows to 120 s).
    *reconnect_options(100, 300),
    ("grpc.keepalive_time_ms", 10_000),
]


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

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS of the clients' own HTTP/2 streams (the framed puts): the CA's
        trust, the server's name checked, HTTP/2 by ALPN (None: plaintext)."""
        if self.tls_ca is None:
            return None
        context = ssl.create_default_context(cadata=self.tls_ca.decode("ascii"))
        context.set_alpn_protocols(["h2"])
        return context

    def metadata(self, method: str) -> tuple[tuple[str, str], ...] | None:
        """The signature of a call of RPC `method` made now (None: no credentials)."""
        return sign(*self.credentials, method) if self.credentials else None

    def shard_metadata(self, shard: int) -> Callable[[str], tuple[tuple[str, str], ...] | None]:
        """`metadata` for calls of shard `shard` (docs/scaling.md): the shard named in
        every call's metadata besides the signature (shard 1: `metadata` itself)."""
        named = shard_metadata(shard)
        if not named:
            return self.metadata

        def metadata(method: str) -> tuple[tuple[str, str], ...]:
            return (*(self.metadata(method) or ()), *named)

        return metadata


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
        raise ValueError(
            f"{path}: not a credentials file with access_key and secret_key ({exc})"
        ) from None


class Channels(Generic[C]):
    """A client's channel and DLedgerClient stub per server address, opened at first use
    by `open_channel` (an asyncio channel: call inside the loop it will serve)."""

    def __init__(self, open_channel: Callable[[str], C]) -> None:
        self._open = open_channel
        self._channels: dict[str, C] = {}
        self._stubs: dict[str, Any] = {}

    def stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channels[address] = self._open(address)
            stub = self._stubs[address] = pb_grpc.DLedgerClientStub(channel)
        return stub

    def __len__(self) -> int:
        return len(self._channels)

    def take(self) -> list[C]:
        """The open channels, for the caller to close; the next `stub` opens anew."""
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        return channels
