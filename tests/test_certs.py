"""The development PKI (dledger_commitlog/certs.py), checked by real TLS handshakes.

The certificates are real (ECDSA P-256 made by `make_dev_pki`) and so is the
transport: a grpc.aio server on 127.0.0.1 with mutual TLS
(`require_client_auth=True`) serving grpc_health plus a `WhoAmI` method that
answers with the common name gRPC's auth context reports for the caller, and
clients dialling it with one certificate or another. Failures are asserted as
the status code a refused handshake gives (UNAVAILABLE), each next to a call that
succeeds on the same server, so a broken server cannot pass for a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dledger_commitlog.cli import certs
from dledger_commitlog.cli.certs import Pki, make_dev_pki
from dledger_commitlog.node.security import read_common_name
from netkit.peer_auth import NODE_CN_PREFIX, node_common_name, node_id_of

CALL_TIMEOUT_S: Final = 10.0  # refusals come back in milliseconds; this only bounds a hang
WHOAMI: Final = "/dledger.test.Identity/WhoAmI"
HOSTS: Final = ("db1.example", "10.1.2.3", "fd00::5")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_dev_pki(tmp_path_factory.mktemp("pki"), [1, 2, 3], HOSTS)


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second, unrelated CA with certificates of the same names."""
    return make_dev_pki(tmp_path_factory.mktemp("other"), [1, 2, 3], HOSTS)


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------- gRPC plumbing


async def _whoami(request: bytes, context: Any) -> bytes:
    """The caller's certificate common name, as gRPC's auth context has it."""
    names: list[bytes] = context.auth_context().get("x509_common_name", [])
    return b",".join(names)


@contextlib.asynccontextmanager
async def _serving(pki: Pki, node_id: int) -> AsyncIterator[int]:
    """A mutual-TLS server with node `node_id`'s certificate on 127.0.0.1; yields its port."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    identity = grpc.unary_unary_rpc_method_handler(_whoami)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("dledger.test.Identity", {"WhoAmI": identity})]
    )
    credentials = grpc.ssl_server_credentials(
        [(pki.node_key(node_id).read_bytes(), pki.node_cert(node_id).read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    assert port > 0
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


def _credentials(trusted_ca: Path, cert: Path | None = None, key: Path | None = None) -> Any:
    return grpc.ssl_channel_credentials(
        trusted_ca.read_bytes(),
        key.read_bytes() if key else None,
        cert.read_bytes() if cert else None,
    )


def _as_node(pki: Pki, node_id: int, trusted_ca: Path | None = None) -> Any:
    return _credentials(trusted_ca or pki.ca, pki.node_cert(node_id), pki.node_key(node_id))


async def _call(port: int, credentials: Any, server_name: str | None = None) -> bytes:
    """Health Check (must say SERVING), then WhoAmI; the caller's CN as the server saw it."""
    options = [] if server_name is None else [("grpc.ssl_target_name_override", server_name)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        reply = await check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        whoami = channel.unary_unary(WHOAMI)
        name: bytes = await whoami(b"", timeout=CALL_TIMEOUT_S)
        return name


async def _refused(port: int, credentials: Any, server_name: str | None = None) -> Any:
    """The status code of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await _call(port, credentials, server_name)
    return failed.value.code()


# ---------------------------------------------------------------- handshakes


def test_mutual_tls_names_the_calling_node(pki: Pki) -> None:
    async def scenario() -> list[bytes]:
        async with _serving(pki, 1) as port:
            return [
                await _call(port, _as_node(pki, 2)),
                await _call(port, _as_node(pki, 3)),
                await _call(
                    port, _credentials(pki.ca, pki.client_cert("client"), pki.client_key("client"))
                ),
            ]

    node2, node3, client = asyncio.run(scenario())
    assert node2 == b"dledger-node-2"
    assert node_id_of(node2.decode()) == 2
    assert node3 == b"dledger-node-3"
    assert client == b"client"
    assert node_id_of(client.decode()) is None


def test_server_name_is_checked_against_the_node_certificate(pki: Pki) -> None:
    async def scenario() -> tuple[list[bytes], Any]:
        async with _serving(pki, 1) as port:
            accepted = [
                await _call(port, _as_node(pki, 2), name)
                for name in ("localhost", "db1.example", "10.1.2.3", "fd00::5")
            ]
            return accepted, await _refused(port, _as_node(pki, 2), "elsewhere.example")

    accepted, refused = asyncio.run(scenario())
    assert accepted == [b"dledger-node-2"] * 4
    assert refused == grpc.StatusCode.UNAVAILABLE


def test_client_without_a_certificate_is_refused(pki: Pki) -> None:
    async def scenario() -> tuple[bytes, Any]:
        async with _serving(pki, 1) as port:
            return await _call(port, _as_node(pki, 2)), await _refused(port, _credentials(pki.ca))

    control, refused = asyncio.run(scenario())
    assert control == b"dledger-node-2"
    assert refused == grpc.StatusCode.UNAVAILABLE


def test_client_certificate_of_another_ca_is_refused(pki: Pki, other_pki: Pki) -> None:
    # it trusts the right CA and its certificate has the right name: only the issuer is wrong
    async def scenario() -> tuple[bytes, Any]:
        async with _serving(pki, 1) as port:
            impostor = _as_node(other_pki, 2, trusted_ca=pki.ca)
            return await _call(port, _as_node(pki, 2)), await _refused(port, impostor)

    control, refused = asyncio.run(scenario())
    assert control == b"dledger-node-2"
    assert refused == grpc.StatusCode.UNAVAILABLE


def test_client_not_trusting_the_ca_fails(pki: Pki, other_pki: Pki) -> None:
    async def scenario() -> tuple[bytes, Any]:
        async with _serving(pki, 1) as port:
            distrustful = _as_node(pki, 2, trusted_ca=other_pki.ca)
            return await _call(port, _as_node(pki, 2)), await _refused(port, distrustful)

    control, refused = asyncio.run(scenario())
    assert control == b"dledger-node-2"
    assert refused == grpc.StatusCode.UNAVAILABLE


def test_a_client_certificate_cannot_serve(pki: Pki) -> None:
    # clientAuth only: a client's key cannot stand in for a node's
    async def scenario() -> Any:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        credentials = grpc.ssl_server_credentials(
            [(pki.client_key("client").read_bytes(), pki.client_cert("client").read_bytes())],
            root_certificates=pki.ca.read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        try:
            return await _refused(port, _as_node(pki, 2), "localhost")
        finally:
            await server.stop(None)

    assert asyncio.run(scenario()) == grpc.StatusCode.UNAVAILABLE


def test_reused_ca_issues_certificates_the_old_ones_accept(tmp_path: Path) -> None:
    first = make_dev_pki(tmp_path, [1, 2], [])
    ca_before = first.ca.read_bytes()
    added = make_dev_pki(tmp_path, [4], [], clients=("alice",), reuse_ca=True)
    assert not added.new_ca
    assert added.ca.read_bytes() == ca_before
    assert added.written() == (
        added.node_key(4),
        added.node_cert(4),
        added.client_key("alice"),
        added.client_cert("alice"),
    )

    async def scenario() -> list[bytes]:
        async with _serving(first, 1) as port:
            return [
                await _call(port, _as_node(added, 4)),
                await _call(
                    port,
                    _credentials(added.ca, added.client_cert("alice"), added.client_key("alice")),
                ),
            ]

    assert asyncio.run(scenario()) == [b"dledger-node-4", b"alice"]


# ---------------------------------------------------------------- certificate contents


def test_node_certificate_contents(pki: Pki) -> None:
    ca = _load(pki.ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for node_id in (1, 2, 3):
        cert = _load(pki.node_cert(node_id))
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
            f"dledger-node-{node_id}"
        )
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == ["localhost", "db1.example"]
        assert san.get_values_for_type(x509.IPAddress) == [
            ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.1.2.3", "fd00::5")
        ]
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
        assert basic.critical and not basic.value.ca
        public = cert.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert isinstance(public.curve, ec.SECP256R1)
        assert cert.not_valid_after_utc - cert.not_valid_before_utc >= datetime.timedelta(days=825)


def test_client_certificate_contents(pki: Pki) -> None:
    cert = _load(pki.client_cert("client"))
    cert.verify_directly_issued_by(_load(pki.ca))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "client"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_hosts_are_normalised_and_deduplicated(tmp_path: Path) -> None:
    hosts = ["LOCALHOST", "db1.example.", "[fd00::5]", "::0001", "127.0.0.1", "db1.example"]
    pki = make_dev_pki(tmp_path, [1], hosts, clients=())
    san = _load(pki.node_cert(1)).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.DNSName) == ["localhost", "db1.example"]
    assert san.value.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "fd00::5")
    ]
    assert not pki.client_cert("client").exists()


# ---------------------------------------------------------------- files


def test_refuses_to_replace_an_existing_ca(tmp_path: Path) -> None:
    first = make_dev_pki(tmp_path, [1], [])
    ca_before, key_before = first.ca.read_bytes(), first.ca_key.read_bytes()
    node_before = first.node_cert(1).read_bytes()
    with pytest.raises(ValueError, match=r"ca\.pem already exists"):
        make_dev_pki(tmp_path, [1], [])
    assert first.ca.read_bytes() == ca_before
    assert first.ca_key.read_bytes() == key_before
    assert first.node_cert(1).read_bytes() == node_before  # nothing was touched

    first.ca.unlink()  # a key alone is a CA too
    with pytest.raises(ValueError, match=r"ca\.key already exists"):
        make_dev_pki(tmp_path, [1], [])
    with pytest.raises(ValueError, match=r"ca\.pem is missing"):
        make_dev_pki(tmp_path, [1], [], reuse_ca=True)

    again = make_dev_pki(tmp_path, [1], [], overwrite=True)
    assert again.new_ca
    assert again.ca_key.read_bytes() != key_before
    _load(again.node_cert(1)).verify_directly_issued_by(_load(again.ca))


def test_reuse_checks_the_ca_key_belongs_to_the_ca(tmp_path: Path, other_pki: Pki) -> None:
    mine = make_dev_pki(tmp_path, [1], [])
    mine.ca_key.write_bytes(other_pki.ca_key.read_bytes())
    with pytest.raises(ValueError, match=r"is not the key of"):
        make_dev_pki(tmp_path, [2], [], reuse_ca=True)
    mine.ca.write_bytes(mine.node_cert(1).read_bytes())
    mine.ca_key.write_bytes(mine.node_key(1).read_bytes())
    with pytest.raises(ValueError, match=r"is not a CA certificate"):
        make_dev_pki(tmp_path, [2], [], reuse_ca=True)


def test_reuse_without_a_ca_makes_one(tmp_path: Path) -> None:
    pki = make_dev_pki(tmp_path / "new", [1], [], reuse_ca=True)
    assert pki.new_ca
    _load(pki.node_cert(1)).verify_directly_issued_by(_load(pki.ca))


def test_key_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        pki = make_dev_pki(tmp_path, [1, 2], [], clients=("client", "ops"))
    finally:
        os.umask(old)
    keys = [pki.ca_key, pki.node_key(1), pki.node_key(2), pki.client_key("client")]
    keys.append(pki.client_key("ops"))
    assert {path: _mode(path) for path in keys} == dict.fromkeys(keys, 0o600)
    assert _mode(pki.ca) == _mode(pki.node_cert(1)) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in pki.written())

    pki.node_key(1).chmod(0o644)  # reissuing replaces the file, mode and all
    make_dev_pki(tmp_path, [1], [], clients=(), reuse_ca=True)
    assert _mode(pki.node_key(1)) == 0o600


@pytest.mark.parametrize(
    "arguments",
    [
        {"node_ids": [0]},
        {"node_ids": [-1]},
        {"node_ids": [True]},
        {"node_ids": [1, 1]},
        {"node_ids": "12"},
        {"hosts": "db1.example"},
        {"hosts": ["db1.example:9000"]},
        {"hosts": ["not a host"]},
        {"hosts": [""]},
        {"hosts": ["fe80::1%eth0"]},
        {"hosts": ["bücher.example"]},
        {"hosts": ["10.0.0.300"]},  # no IP, and a last label of digits is no DNS name
        {"clients": "client"},
        {"clients": ["ca"]},
        {"clients": ["node-4"]},
        {"clients": [NODE_CN_PREFIX + "1"]},  # would pass for node 1
        {"clients": ["../escape"]},
        {"clients": [".hidden"]},
        {"clients": ["a", "a"]},
        {"days": 0},
        {"overwrite": True, "reuse_ca": True},
    ],
)
def test_bad_arguments_write_nothing(tmp_path: Path, arguments: dict[str, Any]) -> None:
    call: dict[str, Any] = {"node_ids": [1], "hosts": [], **arguments}
    target = tmp_path / "pki"
    with pytest.raises(ValueError):
        make_dev_pki(target, **call)
    assert not target.exists()


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("common_name", "node_id"),
    [
        ("dledger-node-1", 1),
        ("dledger-node-2", 2),
        ("dledger-node-12345", 12345),
        ("dledger-node-0", None),  # ids start at 1
        ("dledger-node-01", None),  # one spelling per id
        ("dledger-node-x", None),
        ("dledger-node-", None),
        ("dledger-node--1", None),
        ("dledger-node-+1", None),
        ("dledger-node-1 ", None),
        (" dledger-node-1", None),
        ("dledger-node-1\n", None),
        ("dledger-node-1.5", None),
        ("dledger-node-\u0661", None),  # ARABIC-INDIC DIGIT ONE: str.isdigit, not an id
        ("DLEDGER-NODE-1", None),
        ("xdledger-node-1", None),
        ("client", None),
        ("", None),
    ],
)
def test_node_id_of(common_name: str, node_id: int | None) -> None:
    assert node_id_of(common_name) == node_id


def test_node_common_name_round_trips_and_rejects_non_ids() -> None:
    for node_id in (1, 7, 1000):
        assert node_common_name(node_id) == f"{NODE_CN_PREFIX}{node_id}"
        assert node_id_of(node_common_name(node_id)) == node_id
    for bad in (0, -3, True):
        with pytest.raises(ValueError):
            node_common_name(bad)


def test_read_common_name(pki: Pki, tmp_path: Path) -> None:
    assert read_common_name(pki.node_cert(2)) == "dledger-node-2"
    assert read_common_name(str(pki.client_cert("client"))) == "client"
    assert read_common_name(pki.ca).startswith("dledger dev CA ")
    chain = tmp_path / "chain.pem"  # a certificate followed by its CA: the first one counts
    chain.write_bytes(pki.node_cert(3).read_bytes() + pki.ca.read_bytes())
    assert read_common_name(chain) == "dledger-node-3"
    with pytest.raises(ValueError, match="not a PEM certificate"):
        read_common_name(pki.node_key(2))
    with pytest.raises(FileNotFoundError):
        read_common_name(tmp_path / "missing.pem")


# ---------------------------------------------------------------- command line


def test_cli_writes_and_says_how_to_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "tls"
    argv = ["--dir", str(d), "--nodes", "1,2,3", "--host", "db1.example", "--client", "ops"]
    assert certs.main(argv) == 0
    out, err = capsys.readouterr()
    pki = Pki(d, (1, 2, 3), ("ops",))
    assert out.splitlines()[:-1] == [f"wrote {path}" for path in pki.written()]
    assert (
        f"--tls-ca {d}/ca.pem --tls-cert {d}/node-1.pem --tls-key {d}/node-1.key"
        in (out.splitlines()[-1])
    )
    assert err == ""
    assert all(path.exists() for path in pki.written())
    assert not pki.client_cert("client").exists()  # --client replaces the default

    ca_before = pki.ca.read_bytes()
    assert certs.main(["--dir", str(d), "--nodes", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "already exists" in err and "--force" in err
    assert pki.ca.read_bytes() == ca_before

    assert certs.main(["--dir", str(d), "--nodes", "4", "--reuse-ca"]) == 0
    out, _ = capsys.readouterr()
    assert f"using the existing CA {d}/ca.pem" in out
    assert pki.ca.read_bytes() == ca_before

    assert certs.main(["--dir", str(d), "--nodes", "1", "--force"]) == 0
    capsys.readouterr()
    assert pki.ca.read_bytes() != ca_before


@pytest.mark.parametrize(
    "argv",
    [
        ["--nodes", "1"],
        ["--dir", "D"],
        ["--dir", "D", "--nodes", "1,x"],
        ["--dir", "D", "--nodes", "0"],
        ["--dir", "D", "--nodes", "1,1"],
        ["--dir", "D", "--nodes", "1", "--host", "h:1"],
        ["--dir", "D", "--nodes", "1", "--force", "--reuse-ca"],
        ["--dir", "D", "--nodes", "1", "--bogus"],
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    argv = [str(tmp_path / "D") if a == "D" else a for a in argv]
    assert certs.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("dledger certs: ") and err.count("\n") == 1, err
    assert not (tmp_path / "D").exists()


def test_cli_reports_a_directory_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert certs.main(["--dir", str(blocker / "tls"), "--nodes", "1"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("dledger certs: ") and err.count("\n") == 1, err
