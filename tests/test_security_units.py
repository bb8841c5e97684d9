"""The pure pieces of the trust boundary: peer-message bounds, peer tokens, the ACL,
and the settings a node refuses before it binds (docs/security.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.cli.certs import make_dev_pki
from dledger_commitlog.common.signing import sign
from dledger_commitlog.node.acl import (
    Account,
    Acl,
    AuthError,
    Perm,
    require_topics,
    write_acl,
)
from dledger_commitlog.node.config import ConfigError, NodeConfig, Peer
from dledger_commitlog.node.security import (
    NodeSecurity,
    check_exposure,
    is_loopback,
    write_secret,
)
from netkit.peer_auth import TOKEN_WINDOW_S, PeerAuth, PeerAuthError
from raft import (
    AppendEntries,
    AppendResponse,
    Entry,
    Heartbeat,
    Message,
    ReadIndexResponse,
    RequestVote,
    Snapshot,
    TimeoutNow,
    VoteResponse,
)
from raft.validate import MAX_TERM, MAX_TERM_JUMP, InvalidPeerMessage, check_peer_message

PEERS = (1, 2, 3)


def check(msg: Message, term: int = 5, max_entry_bytes: int = 100) -> None:
    check_peer_message(msg, me=1, peers=PEERS, term=term, max_entry_bytes=max_entry_bytes)


def entries(first: int, *terms: int) -> tuple[Entry, ...]:
    return tuple(Entry(first + k, t, b"x") for k, t in enumerate(terms))


@pytest.mark.parametrize(
    "msg",
    [
        AppendEntries(2, 1, 7, 10, 5, entries(11, 5, 6, 7), 12),
        AppendEntries(2, 1, 5 + MAX_TERM_JUMP, 0, 0, (), 0),
        Heartbeat(3, 1, 6, 3),
        Snapshot(2, 1, 6, 100, 6, 100, b"meta"),
        RequestVote(3, 1, 6 + MAX_TERM_JUMP - 1, 50, 5, pre_vote=True),
        AppendResponse(2, 1, 5, 10, reject=True, hint_index=9, hint_term=4),
        VoteResponse(2, 1, 5, True),
        TimeoutNow(2, 1, 5),
        ReadIndexResponse(2, 1, 5, b"ctx", 7),
    ],
)
def test_well_formed_messages_pass(msg: Message) -> None:
    check(msg)


@pytest.mark.parametrize(
    ("msg", "membership", "why"),
    [
        (Heartbeat(99, 1, 5, 0), True, "not a member"),
        (Heartbeat(1, 1, 5, 0), True, "not a member"),  # ourselves
        (Heartbeat(2, 3, 5, 0), True, "not this node"),
        (Heartbeat(2, 1, (1 << 63) - 1, 0), False, "out of range"),
        (Heartbeat(2, 1, -1, 0), False, "out of range"),
        (Heartbeat(2, 1, 5, -3), False, "index -3"),
        (RequestVote(2, 1, 5 + MAX_TERM_JUMP + 1, 1, 1), False, "jumps"),
        (Heartbeat(2, 1, 5 + MAX_TERM_JUMP + 1, 0), False, "jumps"),
        (AppendEntries(2, 1, MAX_TERM - 1, 0, 0, (), 0), False, "jumps"),
        (TimeoutNow(2, 1, 5 + MAX_TERM_JUMP + 1), False, "jumps"),
        (VoteResponse(2, 1, 5 + MAX_TERM_JUMP + 1, False), False, "jumps"),
        (RequestVote(2, 1, 6, 1, 7), False, "log term 7"),
        (AppendEntries(2, 1, 7, 10, 8, (), 10), False, "log term 8"),
        (AppendEntries(2, 1, 7, 10, 5, entries(12, 5), 10), False, "entry 12 where 11"),
        (AppendEntries(2, 1, 7, 10, 5, entries(11, 6, 5), 10), False, "has term 5"),
        (AppendEntries(2, 1, 7, 10, 5, entries(11, 8), 10), False, "has term 8"),
        (AppendEntries(2, 1, 7, 10, 5, entries(11, 4), 10), False, "has term 4"),
        (AppendEntries(2, 1, 7, 10, 5, (Entry(11, 5, b"y" * 101),), 10), False, "101 bytes"),
        (AppendEntries(2, 1, 7, MAX_TERM, 5, (), 10), False, "out of range"),
        (Snapshot(2, 1, 6, 100, 7, 100), False, "log term 7"),
        (ReadIndexResponse(2, 1, 5, b"", -1), False, "index -1"),
    ],
)
def test_malformed_or_foreign_messages_are_refused(
    msg: Message, membership: bool, why: str
) -> None:
    with pytest.raises(InvalidPeerMessage, match=why) as err:
        check(msg)
    assert err.value.membership is membership


def test_peer_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = PeerAuth("c", b"s" * 32)
    token = auth.token(2, 1)
    assert auth.check(token, 1, once=True) == 2
    with pytest.raises(PeerAuthError, match="replayed"):
        auth.check(token, 1, once=True)
    assert auth.check(token, 1) == 2  # forwarded calls are not one-shot
    with pytest.raises(PeerAuthError, match="does not verify"):
        auth.check(token, 1, scope="forward:CleanNow:admin")  # made for the Raft stream
    fwd = auth.token(2, 1, "forward:PutBatch:app")
    assert auth.check(fwd, 1, scope="forward:PutBatch:app") == 2
    with pytest.raises(PeerAuthError, match="does not verify"):
        auth.check(fwd, 1, scope="forward:PutBatch:admin")
    with pytest.raises(PeerAuthError, match="does not verify"):
        auth.check(token[:-1] + "\u00e9", 1)
    with pytest.raises(PeerAuthError, match="does not verify"):
        auth.check(token, 3)  # made for node 1
    with pytest.raises(PeerAuthError, match="does not verify"):
        PeerAuth("other-cluster", b"s" * 32).check(token, 1)
    with pytest.raises(PeerAuthError, match="does not verify"):
        PeerAuth("c", b"t" * 32).check(token, 1)
    for bad in (None, "", "1:2:3", "x:y:z:w"):
        with pytest.raises(PeerAuthError):
            auth.check(bad, 1)
    old = auth.token(2, 1)
    later = time.time() + TOKEN_WINDOW_S + 5
    monkeypatch.setattr(time, "time", lambda: later)
    with pytest.raises(PeerAuthError, match="off this node's clock"):
        auth.check(old, 1)


def test_acl_file_signatures_and_rights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "acl.toml"
    write_acl(
        path,
        [
            Account("admin", "a" * 16, admin=True),
            Account(
                "app",
                "b" * 16,
                default_topic_perm=Perm.SUB,
                topic_perms={"orders": Perm.PUB | Perm.SUB, "secret": Perm.DENY},
            ),
        ],
    )
    assert path.stat().st_mode & 0o777 == 0o600
    acl = Acl.load(path)
    app = acl.authenticate(sign("app", "b" * 16, "Put"), "Put")
    require_topics(app, ["orders"], Perm.PUB)
    require_topics(app, ["anything"], Perm.SUB)
    with pytest.raises(AuthError, match="no PUB right on topic 'anything'") as err:
        require_topics(app, ["anything"], Perm.PUB)
    assert err.value.denied
    with pytest.raises(AuthError, match="no SUB right on topic 'secret'"):
        require_topics(app, ["secret"], Perm.SUB)
    assert not app.reads_everything and acl.accounts["admin"].reads_everything
    with pytest.raises(AuthError, match="wrong secret") as err:
        acl.authenticate(sign("app", "c" * 16, "Put"), "Put")
    assert not err.value.denied
    with pytest.raises(AuthError, match="unknown key"):
        acl.authenticate(sign("nobody", "b" * 16, "Put"), "Put")
    with pytest.raises(AuthError, match="no credentials"):
        acl.authenticate((), "Put")
    with pytest.raises(AuthError, match="wrong secret"):  # a Put's signature is for Put only
        acl.authenticate(sign("app", "b" * 16, "Put"), "CleanNow")
    with pytest.raises(AuthError, match="wrong secret"):  # not ASCII: refused, not a crash
        acl.authenticate(
            (
                ("dledger-access-key", "app"),
                ("dledger-timestamp", "1"),
                ("dledger-signature", "\u00e9" * 64),
            ),
            "Put",
        )
    stale = sign("app", "b" * 16, "Put")
    later = time.time() + 400
    monkeypatch.setattr(time, "time", lambda: later)
    with pytest.raises(AuthError, match="off the node's clock"):
        acl.authenticate(stale, "Put")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "at least one"),
        ("[[accounts]]\naccess_key = 'a'\nsecret_key = 'short'\n", "at least 16"),
        ("[[accounts]]\naccess_key = 'a:b'\nsecret_key = '0123456789abcdef'\n", "without ':'"),
        (
            "[[accounts]]\naccess_key = 'a'\nsecret_key = '0123456789abcdef'\nadmin = 1\n",
            "true or false",
        ),
        (
            "[[accounts]]\naccess_key = 'a'\nsecret_key = '0123456789abcdef'\n"
            "default_topic_perm = 'WRITE'\n",
            "not DENY, PUB, SUB",
        ),
        (
            "[[accounts]]\naccess_key = 'a'\nsecret_key = '0123456789abcdef'\nroles = []\n",
            "unknown settings",
        ),
        (
            "[[accounts]]\naccess_key = 'a'\nsecret_key = '0123456789abcdef'\n"
            "[[accounts]]\naccess_key = 'a'\nsecret_key = '0123456789abcdef'\n",
            "twice",
        ),
        ("not toml [", "acl.toml"),
    ],
)
def test_a_bad_acl_file_is_one_clear_error(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=why):
        Acl.load(path)


def config(**kw: Any) -> NodeConfig:
    host = kw.pop("host", "127.0.0.1")
    peers = tuple(Peer(i, f"{host}:{7100 + i}", f"{host}:{7000 + i}") for i in (1, 2, 3))
    return NodeConfig(node_id=1, data_dir="d", peers=peers, **kw)


def test_settings_that_go_together() -> None:
    with pytest.raises(ConfigError, match="ca, cert and key together"):
        config(tls_ca="ca.pem")
    with pytest.raises(ConfigError, match=r"needs security\.peer_secret_file"):
        config(acl_file="acl.toml")
    with pytest.raises(ConfigError, match="must be a path"):
        config(acl_file=3)
    with pytest.raises(ConfigError, match="true or false"):
        config(insecure="yes")


def test_a_port_reachable_from_other_machines_needs_tls_and_acl_or_insecure() -> None:
    assert is_loopback("127.0.0.1:1") and is_loopback("[::1]:1") and is_loopback("localhost:1")
    assert not is_loopback("10.1.2.3:1") and not is_loopback("0.0.0.0:1")
    check_exposure(config(peer_secret_file="s"))
    with pytest.raises(ConfigError, match="Raft peers would not be authenticated"):
        check_exposure(config())  # open mode: any process could pose as a member
    check_exposure(config(insecure=True))
    with pytest.raises(ConfigError, match=r"listen\.client 10\.0\.0\.1:7001 is reachable"):
        check_exposure(config(host="10.0.0.1", peer_secret_file="s"))
    with pytest.raises(ConfigError, match="--insecure"):
        check_exposure(config(listen_raft="0.0.0.0:7101", peer_secret_file="s"))
    check_exposure(config(host="10.0.0.1", insecure=True))
    check_exposure(
        config(
            host="10.0.0.1",
            tls_ca="a",
            tls_cert="b",
            tls_key="c",
            acl_file="acl",
            peer_secret_file="s",
        )
    )


def test_node_security_loads_and_names_what_is_wrong(tmp_path: Path) -> None:
    pki = make_dev_pki(tmp_path / "pki", [1, 2, 3], [])
    secret = tmp_path / "secret"
    write_secret(secret)
    assert secret.stat().st_mode & 0o777 == 0o600
    tls = {
        "tls_ca": str(pki.ca),
        "tls_cert": str(pki.node_cert(1)),
        "tls_key": str(pki.node_key(1)),
    }
    sec = NodeSecurity.load(config(peer_secret_file=str(secret), **tls))
    assert sec.tls is not None and sec.peers is not None and sec.acl is None
    assert sec.peer_mode == "mTLS + shared secret"
    assert NodeSecurity.load(config(insecure=True)).peer_mode.startswith("open")
    with pytest.raises(ConfigError, match=r"names 'dledger-node-2', not node 1"):
        NodeSecurity.load(config(**{**tls, "tls_cert": str(pki.node_cert(2))}))
    with pytest.raises(ConfigError, match=r"tls\.key .*: No such file"):
        NodeSecurity.load(config(**{**tls, "tls_key": str(tmp_path / "missing")}))
    (tmp_path / "junk").write_text("junk")
    with pytest.raises(ConfigError, match=r"tls\.ca .*not a PEM file"):
        NodeSecurity.load(config(**{**tls, "tls_ca": str(tmp_path / "junk")}))
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        NodeSecurity.load(config(peer_secret_file=str(tmp_path / "short")))
    with pytest.raises(ConfigError, match="would not be authenticated"):
        NodeSecurity.load(config(**{**tls, "tls_ca": "", "tls_cert": "", "tls_key": ""}))
    with pytest.raises(ConfigError, match=r"security.acl_file .*Expected '='"):
        NodeSecurity.load(config(peer_secret_file=str(secret), acl_file=str(tmp_path / "junk")))
