"""A message's placement, read and written at fixed places of its encoding.

Owns what the put path reads of an encoded message without decoding it (`placement_of`:
topic, queue, queue offset, store time, UNIQ_KEY), what the leader writes into it
when it assigns the queue (`stamp`), and message ids (RocketMQ's layout: store host
and commit-log offset). Invariant: these read and write the layout of
store/message.py at its fixed positions, so they agree with `decode_message` on
every message the log holds (a leader encoded it; a follower refuses an append
holding anything else).
"""

from __future__ import annotations

import functools
import socket
import struct
from typing import NamedTuple

from dledger_commitlog.common.routes import SHARD_ZERO_CODE
from store.errors import InvalidMessage
from store.message import (
    BODY_LENGTH_POS,
    FIXED_PART_SIZE,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    STORE_HOST_POS,
    STORE_TIMESTAMP_POS,
)

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MSG_ID = struct.Struct(">4siq")
_UNIQ_NAME = b"UNIQ_KEY\x01"  # properties (name \x01 value \x02 ...) end a message
_ROUTE = struct.Struct(f">{QUEUE_ID_POS}xi{QUEUE_OFFSET_POS - QUEUE_ID_POS - 4}xq")


class Placement(NamedTuple):
    """What the put path's tables need of a committed message (see `placement_of`)."""

    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int
    uniq_key: str | None


@functools.lru_cache(maxsize=4096)
def _topic_text(raw: bytes) -> str:
    return raw.decode("ascii")


def placement_of(data: bytes) -> Placement:
    """Topic, queue, offset, store time and UNIQ_KEY of an encoded message, read at their
    fixed places without decoding the properties: for entries the log already checked
    (a leader encoded them, a follower refused an append holding anything else)."""
    queue_id, queue_offset = _ROUTE.unpack_from(data, 0)
    (store_ms,) = _I64.unpack_from(data, STORE_TIMESTAMP_POS)
    at = FIXED_PART_SIZE + _I32.unpack_from(data, BODY_LENGTH_POS)[0]
    topic = _topic_text(data[at + 1 : at + 1 + data[at]])
    return Placement(topic, queue_id, queue_offset, store_ms, _uniq_in(data, at + 3 + data[at]))


def uniq_of(data: bytes) -> str | None:
    """The UNIQ_KEY property of an encoded message, None if it has none (or is no message)."""
    try:
        at = FIXED_PART_SIZE + _I32.unpack_from(data, BODY_LENGTH_POS)[0]
        return _uniq_in(data, at + 3 + data[at])
    except (struct.error, IndexError, UnicodeDecodeError):
        return None


def _uniq_in(data: bytes, props: int) -> str | None:
    """UNIQ_KEY in the properties starting at `props` (name \x01 value \x02 ...)."""
    found = data.find(_UNIQ_NAME, props)
    while found > props and data[found - 1] != 2:  # inside another name ("XUNIQ_KEY")
        found = data.find(_UNIQ_NAME, found + 1)
    if found < 0:
        return None
    start = found + len(_UNIQ_NAME)
    end = data.find(b"\x02", start)
    return data[start : end if end >= 0 else len(data)].decode()


def store_host_bytes(store_host: tuple[str, int]) -> bytes:
    """The 8 bytes of a storeHost field: IPv4 address and port."""
    return socket.inet_aton(store_host[0]) + _I32.pack(store_host[1])


def stamp(
    encoded: bytes, queue_id: int, queue_offset: int, store_timestamp_ms: int, store_host: bytes
) -> bytes:
    """`encoded` with what the leader assigns at proposal time: queue id and offset,
    store time and store host (`store_host_bytes`)."""
    buf = bytearray(encoded)
    _I32.pack_into(buf, QUEUE_ID_POS, queue_id)
    _I64.pack_into(buf, QUEUE_OFFSET_POS, queue_offset)
    _I64.pack_into(buf, STORE_TIMESTAMP_POS, store_timestamp_ms)
    buf[STORE_HOST_POS : STORE_HOST_POS + 8] = store_host
    return bytes(buf)


def make_msg_id(store_host: tuple[str, int], commitlog_offset: int) -> str:
    """RocketMQ's layout: store host (IPv4, port) and commit-log offset, hex upper."""
    return (
        _MSG_ID.pack(socket.inet_aton(store_host[0]), store_host[1], commitlog_offset).hex().upper()
    )


def msg_id_of(encoded: bytes, commitlog_offset: int) -> str:
    """The id of an encoded message: its own store host and the offset it lies at."""
    host = encoded[STORE_HOST_POS : STORE_HOST_POS + 8]
    return (host + _I64.pack(commitlog_offset)).hex().upper()


# Multi-Raft (docs/scaling.md): the store host's port field carries the message's
# shard above the port's 16 bits, so that ids of two shards led by one process never
# collide (a single-shard cluster's ids, shard 1's, are RocketMQ's layout unchanged);
# `common.routes.shard_of_msg_id` reads it back.
def shard_port(port: int, shard: int) -> int:
    """The store host port field of shard `shard`'s messages stored at `port`."""
    code = 0 if shard == 1 else SHARD_ZERO_CODE if shard == 0 else shard
    return port | code << 16


def _raw_msg_id(msg_id: str) -> bytes:
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise InvalidMessage(f"message id {msg_id!r} is not hex") from exc
    if len(raw) != _MSG_ID.size:
        raise InvalidMessage(f"message id {msg_id!r} must be {2 * _MSG_ID.size} hex digits")
    return raw


def offset_of_msg_id(msg_id: str) -> int:
    """The commit-log offset a message id names; InvalidMessage if it is no id."""
    return int(_MSG_ID.unpack(_raw_msg_id(msg_id))[2])
