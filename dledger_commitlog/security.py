"""Who may talk to a node: TLS credentials, peer identity, and the bind rule.

Owns: `TlsIdentity` (one certificate per node, used on both ports, read once at
start; gRPC SSL credentials built from it), `PeerAuth` (the per-cluster shared secret: an HMAC
token a node presents when it opens a Raft stream or forwards a client's call, and
the check of one), `peer_identity` (which member a Raft stream comes from: the
mTLS certificate's common name, the token, or, in open mode, nobody in
particular) and `is_loopback`.

Invariants: the secret never travels, only HMAC-SHA256 tokens over the cluster
name, the sender and receiver ids, a timestamp and a random nonce; a token is
accepted only within TOKEN_WINDOW_S of this node's clock, only for this node as
receiver, and (for Raft streams) only once. With TLS on, a Raft stream's sender
is the member its certificate names, whatever the token says. Threat model:
docs/security.md.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from store.fileio import write_atomically

from .acl import Acl, AuthError
from .config import ConfigError, NodeConfig, parse_address

NODE_AUTH = "dledger-node-auth"  # metadata: "NODE_ID:TS_MS:NONCE:HMAC"
RAFT_SCOPE = "raft"  # a token's scope: the Raft stream, or "forward:RPC:ACCESS_KEY"
TOKEN_WINDOW_S = 300.0
_SEEN_MAX = 100_000  # nonces remembered for the window (Raft streams open rarely)


@dataclass(frozen=True, slots=True)
class TlsIdentity:
    """PEM bytes: the CA that signs every node (and trusted client) certificate, this
    node's certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes

    def server_credentials(self, *, require_client_cert: bool) -> Any:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca,
            require_client_auth=require_client_cert,
        )  # fmt: skip

    def channel_credentials(self) -> Any:
        """For dialing a node: verifies it against the CA and presents our certificate."""
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)


def read_secret(path: str) -> bytes:
    """A shared secret file's contents (surrounding whitespace dropped); >= 16 bytes."""
    raw = Path(path).read_bytes().strip()
    if len(raw) < 16:
        raise ValueError(f"{path}: a secret needs at least 16 bytes, found {len(raw)}")
    return raw


def write_secret(path: Path, nbytes: int = 32) -> None:
    """A new random secret (hex) at `path`, readable by the owner only; kept if present."""
    if not path.exists():
        write_atomically(path, (secrets.token_hex(nbytes) + "\n").encode(), mode=0o600)


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
        """The sender id a valid token for `dst` and `scope` names; AuthError otherwise.
        `once`: a token seen before (a replay) is refused."""
        if not token:
            raise AuthError("no peer token (is the cluster secret configured on both ends?)")
        try:
            src_text, ts_text, nonce, mac = token.split(":")
            src, ts_ms = int(src_text), int(ts_text)
        except ValueError:
            raise AuthError("malformed peer token") from None
        expected = self._mac(src, dst, ts_ms, nonce, scope).encode()
        if not hmac.compare_digest(mac.encode(errors="replace"), expected):
            raise AuthError(f"peer token claiming node {src} does not verify: another secret?")
        now = time.time()
        if abs(now - ts_ms / 1000) > TOKEN_WINDOW_S:
            raise AuthError(f"peer token from node {src} is {now - ts_ms / 1000:.0f}s off this "
                            f"node's clock (limit {TOKEN_WINDOW_S:.0f}s)")  # fmt: skip
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
            raise AuthError("peer token replayed")
        seen[nonce] = now


def certificate_node(auth_context: Mapping[str, Sequence[bytes]]) -> int | None:
    """The node id the peer's verified certificate names (None: no such certificate)."""
    from .certs import node_id_of  # lazily: clients never load the certificate toolkit

    for cn in auth_context.get("x509_common_name", ()):
        node = node_id_of(cn.decode(errors="replace"))
        if node is not None:
            return node
    return None


@dataclass(frozen=True, slots=True)
class NodeSecurity:
    """What a node's settings ask for, loaded and checked before it binds a port."""

    tls: TlsIdentity | None = None
    peers: PeerAuth | None = None
    acl: Acl | None = None

    @classmethod
    def load(cls, cfg: NodeConfig) -> NodeSecurity:
        """Read the files the settings name; ConfigError names the setting and the cause."""
        tls = None
        if cfg.tls_ca:
            pems: list[bytes] = []
            for name, path in (("tls.ca", cfg.tls_ca), ("tls.cert", cfg.tls_cert),
                               ("tls.key", cfg.tls_key)):  # fmt: skip
                try:
                    pems.append(Path(path).read_bytes())
                except OSError as exc:
                    raise ConfigError(f"{name} {path}: {exc.strerror}") from None
                if b"-----BEGIN" not in pems[-1]:
                    raise ConfigError(f"{name} {path}: not a PEM file")
            tls = TlsIdentity(*pems)
            from .certs import node_id_of, read_common_name

            try:
                cn = read_common_name(cfg.tls_cert)
            except ValueError as exc:
                raise ConfigError(f"tls.cert {cfg.tls_cert}: {exc}") from None
            if node_id_of(cn) != cfg.node_id:
                raise ConfigError(f"tls.cert {cfg.tls_cert} names {cn!r}, not node "
                                  f"{cfg.node_id} (its peers would refuse it)")  # fmt: skip
        peers = None
        if cfg.peer_secret_file:
            try:
                peers = PeerAuth(cfg.cluster, read_secret(cfg.peer_secret_file))
            except OSError as exc:
                raise ConfigError(f"security.peer_secret_file {cfg.peer_secret_file}: "
                                  f"{exc.strerror}") from None  # fmt: skip
            except ValueError as exc:
                raise ConfigError(f"security.peer_secret_file {exc}") from None
        acl = None
        if cfg.acl_file:
            try:
                acl = Acl.load(cfg.acl_file)
            except ValueError as exc:
                raise ConfigError(f"security.acl_file {exc}") from None
        check_exposure(cfg)
        return cls(tls, peers, acl)

    @property
    def peer_mode(self) -> str:
        """How Raft peers prove who they are: for logs and docs."""
        parts = [p for p, on in (("mTLS", self.tls), ("shared secret", self.peers)) if on]
        return " + ".join(parts) or "open (membership only: --insecure)"


def check_exposure(cfg: NodeConfig) -> None:
    """Unless `insecure`, refuse: a port reachable from other machines without TLS and
    client authentication (anyone reaching it could write, read and administer the
    cluster), and peers of a group that cannot prove who they are (neither TLS nor a
    cluster secret: any process that reaches a Raft port could pose as a member)."""
    if cfg.insecure:
        return
    if len(cfg.peers) > 1 and not (cfg.tls_ca or cfg.peer_secret_file):
        raise ConfigError(
            "Raft peers would not be authenticated: set security.peer_secret_file (the same "
            "secret file on every member; `dledger cluster up` makes one) or [tls], or pass "
            "--insecure (security.insecure = true) to accept any process as a member"
        )
    for what, address in (("listen.client", cfg.client_address),
                          ("listen.raft", cfg.raft_address)):  # fmt: skip
        if not is_loopback(address) and not (cfg.tls_ca and cfg.acl_file):
            raise ConfigError(
                f"{what} {address} is reachable from other machines, but TLS ([tls]) and "
                "client authentication (security.acl_file) are not both on: anyone who "
                "reaches it could write, read and administer the cluster. Turn them on, or "
                "pass --insecure (security.insecure = true) to accept that"
            )


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT listens on this machine only (a name must resolve to loopback)."""
    host = parse_address(address)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
