"""Client authentication and authorization in the style of RocketMQ's plain ACL.

Owns: the ACL file (TOML), `Account` and `Perm`, `Acl.authenticate` (who signed
this call) and the `require_*` checks (may they do this). What a client sends is
`common.signing`'s.

    [[accounts]]
    access_key = "orders-app"
    secret_key = "at least 16 characters"
    admin = false                       # admin: every topic and group, CleanNow,
                                        # TransferLeadership, raw ReadRange
    default_topic_perm = "DENY"         # DENY | PUB | SUB | PUB|SUB
    default_group_perm = "SUB"          # consumer groups: SUB lets it use the group
    topic_perms = { orders = "PUB|SUB", audit = "SUB" }
    group_perms = { billing = "SUB" }

A call carries three metadata entries: the access key, a timestamp (ms) and
HMAC-SHA256(secret key, "dledger-v1\\n" + access key + "\\n" + timestamp + "\\n" +
RPC name) in hex: a signature seen on the wire is good for that RPC alone.
Invariants: a signature is accepted only within SIGNATURE_WINDOW_S of the node's
clock; the secret key never travels; authentication failures are UNAUTHENTICATED,
missing rights PERMISSION_DENIED, and both say which key and what was refused.
"""

from __future__ import annotations

import enum
import hmac
import json
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dispatch.names import SYSTEM_TOPIC_PREFIX
from dledger_commitlog.common.signing import (
    ACCESS_KEY,
    SIGNATURE,
    SIGNATURE_WINDOW_S,
    TIMESTAMP,
    metadata_value,
    signature,
)
from store.fileio import write_atomically

_MIN_SECRET = 16
_NO_SECRET = "\0" * 32


class Perm(enum.IntFlag):
    DENY = 0
    PUB = 1
    SUB = 2

    @classmethod
    def parse(cls, text: str, where: str) -> Perm:
        perm = cls.DENY
        for part in text.replace(" ", "").upper().split("|"):
            if part not in ("DENY", "PUB", "SUB"):
                raise ValueError(f"{where}: {text!r} is not DENY, PUB, SUB or PUB|SUB")
            perm |= cls[part]
        return perm


@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.SUB
    topic_perms: Mapping[str, Perm] = field(default_factory=dict)
    group_perms: Mapping[str, Perm] = field(default_factory=dict)

    def topic_perm(self, topic: str) -> Perm:
        """Rights on `topic`; system topics (every group's offsets) are the admin's only."""
        if self.admin:
            return Perm.PUB | Perm.SUB
        if topic.startswith(SYSTEM_TOPIC_PREFIX):
            return Perm.DENY
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> Perm:
        if self.admin:
            return Perm.PUB | Perm.SUB
        return self.group_perms.get(group, self.default_group_perm)

    @property
    def reads_everything(self) -> bool:
        """May read every topic (raw commit-log reads hold all of them)."""
        return self.admin or (
            Perm.SUB in self.default_topic_perm
            and all(Perm.SUB in p for p in self.topic_perms.values())
        )


class AuthError(Exception):
    """A caller failed authentication (`denied` False) or authorization (True)."""

    def __init__(self, message: str, *, denied: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.denied = denied

    @property
    def status(self) -> grpc.StatusCode:
        return grpc.StatusCode.PERMISSION_DENIED if self.denied else grpc.StatusCode.UNAUTHENTICATED


class Acl:
    def __init__(self, accounts: Iterable[Account]) -> None:
        self.accounts: dict[str, Account] = {}
        for a in accounts:
            if a.access_key in self.accounts:
                raise ValueError(f"access key {a.access_key!r} appears twice")
            self.accounts[a.access_key] = a

    @classmethod
    def load(cls, path: str | Path) -> Acl:
        """Read an ACL file; ValueError names the file and what is wrong."""
        try:
            doc = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        entries = doc.get("accounts")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{path}: needs at least one [[accounts]] table")
        extra = set(doc) - {"accounts"}
        if extra:
            raise ValueError(f"{path}: unknown settings {sorted(extra)}")
        return cls(_account(e, f"{path}: account {i + 1}") for i, e in enumerate(entries))

    def authenticate(self, metadata: Sequence[tuple[str, Any]] | None, method: str) -> Account:
        """The account that signed this call of RPC `method`; AuthError otherwise."""
        ak = metadata_value(metadata, ACCESS_KEY)
        ts_text = metadata_value(metadata, TIMESTAMP)
        sig = metadata_value(metadata, SIGNATURE)
        if not ak or not ts_text or not sig:
            raise AuthError("no credentials: this cluster needs an access key and a signature")
        account = self.accounts.get(ak)
        try:
            ts_ms = int(ts_text)
        except ValueError:
            raise AuthError(f"access key {ak!r}: malformed timestamp") from None
        # As much work for an unknown key as for a known one: timing tells nothing.
        secret = account.secret_key if account is not None else _NO_SECRET
        expected = signature(ak, secret, ts_ms, method)
        if not hmac.compare_digest(sig.encode(errors="replace"), expected) or account is None:
            raise AuthError(f"access key {ak!r}: unknown key or wrong secret")
        skew = time.time() - ts_ms / 1000
        if abs(skew) > SIGNATURE_WINDOW_S:
            raise AuthError(
                f"access key {ak!r}: signature is {skew:.0f}s off the node's clock "
                f"(limit {SIGNATURE_WINDOW_S:.0f}s)"
            )
        return account

    def account(self, access_key: str) -> Account:
        """The account a peer forwarded a call for (the peer authenticated it)."""
        found = self.accounts.get(access_key)
        if found is None:
            raise AuthError(f"forwarded call for unknown access key {access_key!r}")
        return found


def require_topics(account: Account, topics: Iterable[str], perm: Perm) -> None:
    for topic in topics:
        if perm not in account.topic_perm(topic):
            raise AuthError(
                f"access key {account.access_key!r} has no {perm.name} right on topic {topic!r}",
                denied=True,
            )


def require_group(account: Account, group: str) -> None:
    if Perm.SUB not in account.group_perm(group):
        raise AuthError(
            f"access key {account.access_key!r} may not use group {group!r}", denied=True
        )


def require_admin(account: Account, what: str) -> None:
    if not account.admin:
        raise AuthError(
            f"access key {account.access_key!r} is not an admin: {what} needs one", denied=True
        )


def _account(e: Any, where: str) -> Account:
    if not isinstance(e, dict):
        raise ValueError(f"{where}: not a table")
    known = {
        "access_key",
        "secret_key",
        "admin",
        "default_topic_perm",
        "default_group_perm",
        "topic_perms",
        "group_perms",
    }
    extra = set(e) - known
    if extra:
        raise ValueError(f"{where}: unknown settings {sorted(extra)}")
    ak, sk = e.get("access_key"), e.get("secret_key")
    if not isinstance(ak, str) or not ak or ":" in ak:
        raise ValueError(f"{where}: access_key must be a non-empty string without ':'")
    if not isinstance(sk, str) or len(sk) < _MIN_SECRET:
        raise ValueError(
            f"{where} ({ak}): secret_key must be a string of at least {_MIN_SECRET} characters"
        )
    admin = e.get("admin", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where} ({ak}): admin must be true or false")

    def perms(name: str) -> dict[str, Perm]:
        table = e.get(name, {})
        if not isinstance(table, dict):
            raise ValueError(f'{where} ({ak}): {name} must be a table NAME = "PERM"')
        return {str(k): Perm.parse(str(v), f"{where} ({ak}) {name}.{k}") for k, v in table.items()}

    return Account(
        ak,
        sk,
        admin,
        Perm.parse(str(e.get("default_topic_perm", "DENY")), f"{where} ({ak})"),
        Perm.parse(str(e.get("default_group_perm", "SUB")), f"{where} ({ak})"),
        perms("topic_perms"),
        perms("group_perms"),
    )


def write_acl(path: Path, accounts: Sequence[Account]) -> None:
    """Write `accounts` as an ACL file readable by the owner only."""
    q = json.dumps  # a JSON string is a valid TOML basic string, escapes and all
    lines: list[str] = []
    for a in accounts:
        lines += [
            "[[accounts]]",
            f"access_key = {q(a.access_key)}",
            f"secret_key = {q(a.secret_key)}",
            f"admin = {'true' if a.admin else 'false'}",
            f"default_topic_perm = {q(_perm_text(a.default_topic_perm))}",
            f"default_group_perm = {q(_perm_text(a.default_group_perm))}",
        ]
        for name, table in (("topic_perms", a.topic_perms), ("group_perms", a.group_perms)):
            if table:
                body = ", ".join(f"{q(k)} = {q(_perm_text(v))}" for k, v in table.items())
                lines.append(f"{name} = {{ {body} }}")
        lines.append("")
    write_atomically(path, "\n".join(lines).encode(), mode=0o600)


def _perm_text(p: Perm) -> str:
    return "|".join(n for n in ("PUB", "SUB") if Perm[n] in p) or "DENY"
