"""A development PKI for a cluster: one CA, a certificate per node, one per client.

Owns the files of one directory D and what is in them: `D/ca.pem` + `D/ca.key`
(a self-signed CA), `D/node-{id}.pem` + `D/node-{id}.key` for every node (subject
CN `dledger-node-{id}`, serverAuth + clientAuth: a node serves clients and peers
and dials its peers with the same certificate) and `D/{name}.pem` + `D/{name}.key`
for every client (CN `{name}`, clientAuth only). Keys are ECDSA P-256, PKCS#8 PEM,
unencrypted; the common names are `netkit.peer_auth`'s (`node_common_name`), which is
how a server tells which peer dialled it. `run` is the `dledger certs` subcommand.

Invariants: a key file is never readable by anyone but its owner (created 0600,
never widened); every file is written whole to a temporary name in D, fsynced and
renamed over the old one, so a reader sees the old file or the new one, never half
of one; `ca.pem` is written after `ca.key`; an existing CA is never replaced
unless asked (`overwrite=True`) and is otherwise only ever reused (`reuse_ca=True`);
no client name can produce a node's common name, so a client certificate never
passes for a node's; a certificate issued from a reused CA never outlives the CA.
Not for production: the CA key sits unencrypted next to the certificates.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import secrets
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from netkit.peer_auth import NODE_CN_PREFIX, check_node_id, node_common_name
from store.fileio import write_atomically

DEFAULT_DAYS: Final = 825  # the longest validity clients such as Apple's accept for TLS servers
CA_CERT: Final = "ca.pem"
CA_KEY: Final = "ca.key"
# A client name is a file name and a common name: no separators, no dot files.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
# Preferred-name syntax, plus `_` (Docker Compose service names) and a leading `*.`.
_DNS_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"(?:\*\.)?(?:{_DNS_LABEL}\.)*{_DNS_LABEL}", re.ASCII)
_DEFAULT_DNS: Final = ("localhost",)
_DEFAULT_IPS: Final = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
_BACKDATE: Final = datetime.timedelta(hours=1)  # tolerate clocks a little behind ours

_SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Pki:
    """Where the files of a development PKI are (paths only; nothing is read)."""

    directory: Path
    node_ids: tuple[int, ...] = ()
    clients: tuple[str, ...] = ()
    new_ca: bool = True  # False: the CA already in `directory` issued the certificates

    @property
    def ca(self) -> Path:
        return self.directory / CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.directory / CA_KEY

    def node_cert(self, node_id: int) -> Path:
        return self.directory / f"node-{check_node_id(node_id)}.pem"

    def node_key(self, node_id: int) -> Path:
        return self.directory / f"node-{check_node_id(node_id)}.key"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{_check_client_name(name)}.pem"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{_check_client_name(name)}.key"

    def written(self) -> tuple[Path, ...]:
        """The files `make_dev_pki` wrote, in the order it wrote them."""
        files = [self.ca_key, self.ca] if self.new_ca else []
        for node_id in self.node_ids:
            files += [self.node_key(node_id), self.node_cert(node_id)]
        for name in self.clients:
            files += [self.client_key(name), self.client_cert(name)]
        return tuple(files)


def make_dev_pki(
    directory: str | os.PathLike[str],
    node_ids: Iterable[int],
    hosts: Iterable[str],
    *,
    clients: Iterable[str] = ("client",),
    days: int = DEFAULT_DAYS,
    overwrite: bool = False,
    reuse_ca: bool = False,
) -> Pki:
    """Write a CA and certificates for `node_ids` and `clients` into `directory`.

    Every node certificate's SubjectAlternativeName holds DNS `localhost`, IPs
    127.0.0.1 and ::1, and each of `hosts` (an IP literal becomes an IPAddress
    entry, `[v6]` too; anything else must be a DNS name). Certificates are valid
    from an hour ago for `days` days (the CA too).

    A directory that already has a CA (`ca.pem` or `ca.key`) is refused with
    ValueError unless `overwrite=True` (a new CA replaces it; certificates of the
    old one left in the directory no longer verify) or `reuse_ca=True` (the
    existing CA issues the new certificates; without one, a new CA is made). Node
    and client files are always (re)written. Every argument is checked before
    anything is written. Raises ValueError for bad arguments, OSError for the disk.
    """
    if overwrite and reuse_ca:
        raise ValueError("overwrite=True and reuse_ca=True contradict each other")
    ids = _unique("node id", (check_node_id(i) for i in _not_a_string(node_ids, "node_ids")))
    names = _unique(
        "client name", (_check_client_name(n) for n in _not_a_string(clients, "clients"))
    )
    dns_names, ips = _parse_hosts(_not_a_string(hosts, "hosts"))
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"days must be a whole number >= 1, not {days!r}")

    root = Path(directory)
    pki = Pki(root, ids, names)
    now = datetime.datetime.now(datetime.UTC)
    existing = [p for p in (pki.ca, pki.ca_key) if p.exists()]
    if existing and reuse_ca:
        ca_cert, ca_key = _load_ca(pki, now)
        pki = Pki(root, ids, names, new_ca=False)
    elif existing and not overwrite:
        raise ValueError(
            f"{existing[0]} already exists: refusing to replace the CA "
            "(overwrite=True / --force makes a new one, reuse_ca=True / --reuse-ca issues from it)"
        )
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _ca_certificate(ca_key, now, days)

    root.mkdir(parents=True, exist_ok=True)
    if pki.new_ca:
        write_atomically(pki.ca_key, _key_pem(ca_key), mode=0o600)
        write_atomically(pki.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    server_and_client = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    san = x509.SubjectAlternativeName(
        [x509.DNSName(d) for d in dns_names] + [x509.IPAddress(ip) for ip in ips]
    )
    for node_id in ids:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(
            node_common_name(node_id),
            key,
            ca_cert,
            ca_key,
            now,
            not_after,
            server_and_client,
            san,
        )
        write_atomically(pki.node_key(node_id), _key_pem(key), mode=0o600)
        write_atomically(pki.node_cert(node_id), _cert_pem(cert))
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(
            name, key, ca_cert, ca_key, now, not_after, [ExtendedKeyUsageOID.CLIENT_AUTH], None
        )
        write_atomically(pki.client_key(name), _key_pem(key), mode=0o600)
        write_atomically(pki.client_cert(name), _cert_pem(cert))
    return pki


def make_server_cert(
    directory: str | os.PathLike[str], name: str, hosts: Iterable[str], *, days: int = DEFAULT_DAYS
) -> tuple[Path, Path]:
    """Issue `D/{name}.pem` + `D/{name}.key` from the CA already in `directory`: a server
    certificate (serverAuth only, so it never passes for a node or a client) for the
    default names and `hosts`. (certificate, key). ValueError if the CA is missing."""
    pki = Pki(Path(directory), clients=(_check_client_name(name),), new_ca=False)
    dns_names, ips = _parse_hosts(_not_a_string(hosts, "hosts"))
    now = datetime.datetime.now(datetime.UTC)
    ca_cert, ca_key = _load_ca(pki, now)
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    san = x509.SubjectAlternativeName(
        [x509.DNSName(d) for d in dns_names] + [x509.IPAddress(ip) for ip in ips]
    )
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH]
    cert = _leaf_certificate(name, key, ca_cert, ca_key, now, not_after, usages, san)
    write_atomically(pki.client_key(name), _key_pem(key), mode=0o600)
    write_atomically(pki.client_cert(name), _cert_pem(cert))
    return pki.client_cert(name), pki.client_key(name)


# ---------------------------------------------------------------- certificates


def _ca_certificate(
    key: ec.EllipticCurvePrivateKey, now: datetime.datetime, days: int
) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dledger-py development"),
            # distinct CAs get distinct names: "which CA signed this?" stays answerable
            x509.NameAttribute(NameOID.COMMON_NAME, f"dledger dev CA {secrets.token_hex(4)}"),
        ]
    )
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(signs_certificates=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _leaf_certificate(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: _SigningKey,
    now: datetime.datetime,
    not_after: datetime.datetime,
    usages: list[x509.ObjectIdentifier],
    san: x509.SubjectAlternativeName | None,
) -> x509.Certificate:
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(signs_certificates=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _load_ca(pki: Pki, now: datetime.datetime) -> tuple[x509.Certificate, _SigningKey]:
    for path in (pki.ca, pki.ca_key):
        if not path.exists():
            raise ValueError(f"{path} is missing: the CA in {pki.directory} is incomplete")
    try:
        cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{pki.ca} is not a PEM certificate: {exc}") from None
    try:
        key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:  # TypeError: the key is encrypted
        raise ValueError(f"{pki.ca_key} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"{pki.ca_key} is neither an EC nor an RSA key")
    if key.public_key() != cert.public_key():
        raise ValueError(f"{pki.ca_key} is not the key of {pki.ca}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{pki.ca} is not a CA certificate")
    if cert.not_valid_after_utc <= now:
        raise ValueError(f"the CA {pki.ca} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    return cert, key


def _key_pem(key: _SigningKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


# ---------------------------------------------------------------- arguments


def _check_client_name(name: str) -> str:
    if not isinstance(name, str) or not _CLIENT_NAME.fullmatch(name):
        raise ValueError(
            f"bad client name {name!r}: 1-64 of A-Z a-z 0-9 . _ -, not starting with . _ -"
        )
    if name == "ca" or name.startswith(("node-", NODE_CN_PREFIX)):
        # ca.pem / node-N.pem are taken; CN dledger-node-N would pass for node N
        raise ValueError(f"client name {name!r} is reserved (ca, node-*, {NODE_CN_PREFIX}*)")
    return name


def _not_a_string(values: Iterable[_T], what: str) -> Iterable[_T]:
    if isinstance(values, str | bytes):
        raise ValueError(f"{what} is a collection of values, not one string: {values!r}")
    return values


def _unique(what: str, values: Iterable[_T]) -> tuple[_T, ...]:
    seen: list[_T] = []
    for value in values:
        if value in seen:
            raise ValueError(f"{what} {value!r} given twice")
        seen.append(value)
    return tuple(seen)


def _parse_hosts(
    hosts: Iterable[str],
) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """(DNS names, IPs) of the SubjectAlternativeName: the defaults, then `hosts`, no repeats."""
    dns_names = list(_DEFAULT_DNS)
    ips = list(_DEFAULT_IPS)
    for host in hosts:
        value = parse_host(host)
        if isinstance(value, str):
            if value not in dns_names:
                dns_names.append(value)
        elif value not in ips:
            ips.append(value)
    return dns_names, ips


def parse_host(host: str) -> str | ipaddress.IPv4Address | ipaddress.IPv6Address:
    """`host` as a certificate names it: an IP address (`[v6]` too; no zone index) or a
    DNS name (lower case, no trailing dot; a last label of digits only is no name, so
    10.0.0.300 is refused). ValueError naming `host` otherwise."""
    if not isinstance(host, str):
        raise ValueError(f"a host is a string, not {host!r}")
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):  # [fd00::1]
        text = text[1:-1]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        ip = None
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            raise ValueError(f"host {host!r}: a zone index (%...) cannot be in a certificate")
        return ip
    if text.count(":") == 1 and text.rsplit(":", 1)[1].isdigit():
        raise ValueError(f"host {host!r} looks like host:port; give the host alone")
    name = text.rstrip(".").lower()
    if len(name) > 253 or not _DNS_NAME.fullmatch(name) or name.rsplit(".", 1)[-1].isdigit():
        raise ValueError(f"host {host!r} is neither an IP address nor a DNS name")
    return name


# ---------------------------------------------------------------- files


# ---------------------------------------------------------------- command line


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise _UsageError(message)


def _node_list(text: str) -> list[int]:
    ids = []
    for part in text.split(","):
        item = part.strip()
        if not item.isascii() or not item.isdigit() or int(item) < 1:
            raise argparse.ArgumentTypeError(f"bad node id {item!r} in {text!r} (ids are >= 1)")
        ids.append(int(item))
    return ids


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `dledger certs` (for `main`, or for wiring into another parser)."""
    parser.add_argument("--dir", required=True, type=Path, metavar="DIR", help="write here")
    parser.add_argument("--nodes", required=True, type=_node_list, metavar="1,2,3", help="node ids")
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="H",
        help="another name or IP of the nodes, for every node certificate (repeatable; "
        "localhost, 127.0.0.1 and ::1 are always in)",
    )
    parser.add_argument(
        "--client",
        action="append",
        default=None,
        metavar="NAME",
        help="a client certificate NAME.pem (repeatable; default: one named client)",
    )
    parser.add_argument(
        "--days", type=int, default=DEFAULT_DAYS, metavar="N", help="validity (default 825)"
    )
    ca = parser.add_mutually_exclusive_group()
    ca.add_argument("--force", action="store_true", help="replace an existing CA")
    ca.add_argument("--reuse-ca", action="store_true", help="issue from the existing CA")


def run(args: argparse.Namespace) -> int:
    """`dledger certs` on parsed arguments: 0, or 2 after one line on stderr."""
    try:
        pki = make_dev_pki(
            args.dir,
            args.nodes,
            args.host,
            clients=("client",) if args.client is None else args.client,
            days=args.days,
            overwrite=args.force,
            reuse_ca=args.reuse_ca,
        )
    except (ValueError, OSError) as exc:
        print(f"dledger certs: {exc}", file=sys.stderr)
        return 2
    if not pki.new_ca:
        print(f"using the existing CA {pki.ca}")
    for path in pki.written():
        print(f"wrote {path}")
    if pki.node_ids:
        first = pki.node_ids[0]
        print(
            f"node {first} uses: --tls-ca {pki.ca} --tls-cert {pki.node_cert(first)} "
            f"--tls-key {pki.node_key(first)} (node N: node-N.pem, node-N.key; "
            "clients: --tls-ca with their NAME.pem, NAME.key)"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`dledger certs --dir DIR --nodes 1,2,3 [--host H ...] [--client NAME ...] [--force]`."""
    parser = _Parser(
        prog="dledger certs",
        description="Write a development CA and TLS certificates for nodes and clients.",
    )
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(f"dledger certs: {exc}", file=sys.stderr)
        return 2
    return run(args)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures (TLS with ECDSA keys), and certificate and CRL signing for a CA."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )
