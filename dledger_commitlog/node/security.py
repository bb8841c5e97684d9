"""Who may talk to a node, as its settings say: loaded and checked before it binds a port.

Owns `NodeSecurity` (the node's TLS identity and cluster secret, whose checks are
`netkit.peer_auth`'s, plus the clients' ACL, `common.acl`), loaded from the files
the settings name with one clear error per bad file; the cluster-secret file
(`read_secret`, `write_secret`); the certificate's common name
(`read_common_name`); and the bind rule (`check_exposure`: no port reachable
from other machines without TLS and client authentication, unless `--insecure`).
Threat model: docs/security.md.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from dledger_commitlog.node.acl import Acl
from dledger_commitlog.node.config import ConfigError, NodeConfig, parse_address
from netkit.peer_auth import PeerAuth, PeerSecurity, TlsIdentity, node_id_of
from store.fileio import write_atomically


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


@dataclass(frozen=True, slots=True)
class NodeSecurity(PeerSecurity):
    """What a node's settings ask for, loaded and checked before it binds a port: its
    peer identity (`netkit.peer_auth`) and the clients' ACL."""

    acl: Acl | None = None

    @classmethod
    def load(cls, cfg: NodeConfig) -> NodeSecurity:
        """Read the files the settings name; ConfigError names the setting and the cause."""
        tls = None
        if cfg.tls_ca:
            pems: list[bytes] = []
            for name, path in (
                ("tls.ca", cfg.tls_ca),
                ("tls.cert", cfg.tls_cert),
                ("tls.key", cfg.tls_key),
            ):
                try:
                    pems.append(Path(path).read_bytes())
                except OSError as exc:
                    raise ConfigError(f"{name} {path}: {exc.strerror}") from None
                if b"-----BEGIN" not in pems[-1]:
                    raise ConfigError(f"{name} {path}: not a PEM file")
            tls = TlsIdentity(*pems)
            try:
                cn = read_common_name(cfg.tls_cert)
            except ValueError as exc:
                raise ConfigError(f"tls.cert {cfg.tls_cert}: {exc}") from None
            if node_id_of(cn) != cfg.node_id:
                raise ConfigError(
                    f"tls.cert {cfg.tls_cert} names {cn!r}, not node "
                    f"{cfg.node_id} (its peers would refuse it)"
                )
        peers = None
        if cfg.peer_secret_file:
            try:
                peers = PeerAuth(cfg.cluster, read_secret(cfg.peer_secret_file))
            except OSError as exc:
                raise ConfigError(
                    f"security.peer_secret_file {cfg.peer_secret_file}: {exc.strerror}"
                ) from None
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


def read_common_name(cert_file: str | os.PathLike[str]) -> str:
    """The subject common name of the (first) certificate in the PEM file `cert_file`.

    ValueError (its message does not repeat the path) if the file holds no PEM
    certificate or the subject has no single common name; OSError if unreadable.
    """
    from cryptography import x509  # lazily: only a node with TLS reads a certificate
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    except ValueError as exc:
        raise ValueError(f"not a PEM certificate ({exc})") from None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise ValueError(f"the subject has {len(names)} common names, not one")
    value = names[0].value
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def check_exposure(cfg: NodeConfig) -> None:
    """Unless `insecure`, refuse: a port reachable from other machines without TLS and
    client authentication (anyone reaching it could write, read and administer the
    cluster), and peers that cannot prove who they are (neither TLS nor a
    cluster secret: any process that reaches a Raft port could pose as a member)."""
    if cfg.insecure:
        return
    if len(cfg.peers) > 1 and not (cfg.tls_ca or cfg.peer_secret_file):
        raise ConfigError(
            "Raft peers would not be authenticated: set security.peer_secret_file (the same "
            "secret file on every member; `dledger cluster up` makes one) or [tls], or pass "
            "--insecure (security.insecure = true) to accept any process as a member"
        )
    for what, address in (
        ("listen.client", cfg.client_address),
        ("listen.raft", cfg.raft_address),
        ("listen.console", cfg.listen_console),
    ):
        if address and not is_loopback(address) and not (cfg.tls_ca and cfg.acl_file):
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
