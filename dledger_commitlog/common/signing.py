"""What a client signs a call with, and how a node reads it back (RocketMQ's plain ACL).

A call carries three metadata entries: the access key, a timestamp (ms) and
HMAC-SHA256(secret key, "dledger-v1\\n" + access key + "\\n" + timestamp + "\\n" +
RPC name) in hex: a signature seen on the wire is good for that RPC alone, for
SIGNATURE_WINDOW_S. The client signs (`sign`); the node's ACL (`node.acl`) checks
with the same `signature`. The secret key never travels.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Any

ACCESS_KEY = "dledger-access-key"
TIMESTAMP = "dledger-timestamp"
SIGNATURE = "dledger-signature"
SIGNATURE_WINDOW_S = 300.0


def metadata_value(metadata: Sequence[tuple[str, Any]] | None, key: str) -> str | None:
    """The value of `key` in a call's metadata (None: absent)."""
    for k, v in metadata or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def signature(access_key: str, secret_key: str, ts_ms: int, method: str) -> bytes:
    text = f"dledger-v1\n{access_key}\n{ts_ms}\n{method}".encode()
    return hmac.new(secret_key.encode(), text, hashlib.sha256).hexdigest().encode()


def sign(access_key: str, secret_key: str, method: str) -> tuple[tuple[str, str], ...]:
    """The metadata of a call of RPC `method` ("Put"), good for SIGNATURE_WINDOW_S."""
    ts_ms = int(time.time() * 1000)
    return (
        (ACCESS_KEY, access_key),
        (TIMESTAMP, str(ts_ms)),
        (SIGNATURE, signature(access_key, secret_key, ts_ms, method).decode()),
    )
