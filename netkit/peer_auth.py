"""Who a Raft peer is: its certificate's name, the cluster-secret token it presents.

Owns the peer identity the transport checks (`raftio.transport`): `TlsIdentity`
(one certificate per node, read once at start; gRPC SSL credentials built from
it, or an `ssl.SSLContext` for the link on asyncio), `PeerAuth` (the per-cluster
shared secret: an HMAC token a node presents when it opens a Raft stream or
forwards a client's call, and the check of one), the mapping between a node id
and its certificate's common name (`node_common_name`, `node_id_of`, and
`certificate_node` or `peercert_node` for a verified certificate), and
`PeerSecurity`, what of it a node has configured. Loading it from the settings
is the node's (`dledger_commitlog.node.security`).

Invariants: the secret never travels, only HMAC-SHA256 tokens over the cluster
name, the sender and receiver ids, a timestamp and a random nonce; a token is
accepted only within TOKEN_WINDOW_S of this node's clock, only for this node as
receiver, and (for Raft streams) only once. With TLS on, a Raft stream's sender
is the member its certificate names, whatever the token says. Only the canonical
common name `dledger-node-{id}` names a node. Threat model: docs/security.md.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import re
import secrets
import ssl
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc

NODE_AUTH = "dledger-node-auth"  # metadata: "NODE_ID:TS_MS:NONCE:HMAC"
RAFT_SCOPE = "raft"  # a token's scope: the Raft stream, or "forward:RPC:ACCESS_KEY"
TOKEN_WINDOW_S = 300.0
_SEEN_MAX = 100_000  # nonces remembered for the window (Raft streams open rarely)
NODE_CN_PREFIX: Final = "dledger-node-"
_NODE_CN = re.compile(re.escape(NODE_CN_PREFIX) + r"([1-9][0-9]*)", re.ASCII)


class PeerAuthError(Exception):
    """A peer's token or certificate does not prove what it claims."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class TlsIdentity:
    """PEM bytes: the CA that signs every node (and trusted client) certificate, this
    node's certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes

    def expires_at(self) -> float:
        """When this node's certificate expires (Unix time)."""
        from cryptography import x509  # only a node with TLS loads it

        return x509.load_pem_x509_certificate(self.cert).not_valid_after_utc.timestamp()

    def server_credentials(self, *, require_client_cert: bool) -> Any:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.ca,
            require_client_auth=require_client_cert,
        )

    def channel_credentials(self) -> Any:
        """For dialing a node: verifies it against the CA and presents our certificate."""
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def ssl_context(self, *, server: bool) -> ssl.SSLContext:
        """The same identity for a link on asyncio (h2grpc): as a server it requires a
        certificate from the CA; as a client it verifies the peer against the CA and the
        host it dials; both present ours, and speak HTTP/2 (ALPN), TLS 1.2 at least."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=self.ca.decode("ascii"))
        ctx.set_alpn_protocols(["h2"])
        with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain reads files only
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(self.cert)
            with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(self.key)
            ctx.load_cert_chain(cert, key)
        return ctx


class PeerAuth:
    """Tokens made with and checked against the cluster's shared secret."""

    def __init__(self, cluster: str, secret: bytes) -> None:
        self._cluster = cluster
        self._key = hashlib.sha256(b"dledger-peer\0" + secret).digest()
        self._seen: collections.OrderedDict[str, float] = collections.OrderedDict()

    def _mac(self, src: int, dst: int, ts_ms: int, nonce: str, scope: str) -> str:
        text = f"{self._cluster}\n{src}\n{dst}\n{ts_ms}\n{nonce}\n{scope}".encode()
        return hmac.new(self._key, text, hashlib.sha256).hexdigest()

    def token(self, src: int, dst: int, scope: str = RAFT_SCOPE) -> str:
        """A token from node `src` for node `dst`, good for `scope` only (the Raft
        stream, or one forwarded RPC on behalf of one access key)."""
        ts_ms, nonce = int(time.time() * 1000), secrets.token_hex(12)
        return f"{src}:{ts_ms}:{nonce}:{self._mac(src, dst, ts_ms, nonce, scope)}"

    def check(
        self, token: str | None, dst: int, *, scope: str = RAFT_SCOPE, once: bool = False
    ) -> int:
        """The sender id a valid token for `dst` and `scope` names; PeerAuthError otherwise.
        `once`: a token seen before (a replay) is refused."""
        if not token:
            raise PeerAuthError("no peer token (is the cluster secret configured on both ends?)")
        try:
            src_text, ts_text, nonce, mac = token.split(":")
            src, ts_ms = int(src_text), int(ts_text)
        except ValueError:
            raise PeerAuthError("malformed peer token") from None
        expected = self._mac(src, dst, ts_ms, nonce, scope).encode()
        if not hmac.compare_digest(mac.encode(errors="replace"), expected):
            raise PeerAuthError(f"peer token claiming node {src} does not verify: another secret?")
        now = time.time()
        if abs(now - ts_ms / 1000) > TOKEN_WINDOW_S:
            raise PeerAuthError(
                f"peer token from node {src} is {now - ts_ms / 1000:.0f}s off this "
                f"node's clock (limit {TOKEN_WINDOW_S:.0f}s)"
            )
        if once:
            self._remember(nonce, now)
        return src

    def _remember(self, nonce: str, now: float) -> None:
        seen = self._seen
        while seen and (
            len(seen) >= _SEEN_MAX or next(iter(seen.values())) < now - 2 * TOKEN_WINDOW_S
        ):
            seen.popitem(last=False)
        if nonce in seen:
            raise PeerAuthError("peer token replayed")
        seen[nonce] = now


def certificate_node(auth_context: Mapping[str, Sequence[bytes]]) -> int | None:
    """The node id the peer's verified certificate names (None: no such certificate)."""
    for cn in auth_context.get("x509_common_name", ()):
        node = node_id_of(cn.decode(errors="replace"))
        if node is not None:
            return node
    return None


def peercert_node(cert: Mapping[str, Any] | None) -> int | None:
    """`certificate_node` of a verified certificate as `ssl` gives it (`getpeercert()`)."""
    names = [
        value.encode()
        for rdn in (cert or {}).get("subject", ())
        for key, value in rdn
        if key == "commonName"
    ]
    return certificate_node({"x509_common_name": names})


def node_common_name(node_id: int) -> str:
    """The subject CN of node `node_id`'s certificate: `dledger-node-{id}`."""
    return NODE_CN_PREFIX + str(check_node_id(node_id))


def node_id_of(common_name: str) -> int | None:
    """The node id a certificate's common name stands for, or None if it names no node.

    Only the canonical form `node_common_name` produces counts: `dledger-node-7`
    is 7; `dledger-node-0`, `dledger-node-07`, `dledger-node-+7`, `dledger-node-x`,
    `dledger-node-7 ` and anything without the prefix are None.
    """
    match = _NODE_CN.fullmatch(common_name)
    return int(match.group(1)) if match else None


def check_node_id(node_id: int) -> int:
    """`node_id` if it is a valid node id (a whole number >= 1); ValueError otherwise."""
    if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 1:
        raise ValueError(f"a node id is a whole number >= 1, not {node_id!r}")
    return node_id


@dataclass(frozen=True, slots=True)
class PeerSecurity:
    """How this node proves itself to its peers and checks them (None: not configured)."""

    tls: TlsIdentity | None = None
    peers: PeerAuth | None = None

    @property
    def peer_mode(self) -> str:
        """How Raft peers prove who they are: for logs and docs."""
        parts = [p for p, on in (("mTLS", self.tls), ("shared secret", self.peers)) if on]
        return " + ".join(parts) or "open (membership only: --insecure)"
