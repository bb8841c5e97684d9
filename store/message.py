"""The message codec: RocketMQ's commit-log message layout (V1, IPv4 hosts), big-endian.

One codec for every reader and writer of message bytes (put path, dispatch,
consumers, recovery, Spark, tests):

    totalSize i32 | magicCode i32 | bodyCRC i32 | queueId i32 | flag i32
    | queueOffset i64 | physicalOffset i64 | sysFlag i32 | bornTimestamp i64
    | bornHost (IPv4 4 bytes + port i32) | storeTimestamp i64
    | storeHost (IPv4 4 bytes + port i32) | reconsumeTimes i32
    | preparedTransactionOffset i64 | bodyLength i32 | body
    | topicLength u8 | topic | propertiesLength i16 | properties

`totalSize` counts every byte; `bodyCRC` is CRC32(body) & 0x7fffffff as in
RocketMQ's UtilAll.crc32. Properties are UTF-8 `name \x01 value \x02` pairs.

Invariants: `encode_message` accepts exactly the messages `validate_message`
accepts, and `decode_message` accepts exactly the bytes `encode_message` can
produce (canonical form), so `encode(decode(b)) == b` whenever decoding succeeds.
Decoding never raises anything but `CorruptEntry`; encoding anything but
`InvalidMessage`. The queue and physical offsets sit at fixed positions
(`QUEUE_OFFSET_POS`, `PHYSICAL_OFFSET_POS`) so a writer can patch them in place.

The layout of the fixed part is defined once, here: `_FIXED` (struct, for one
message) and `HEADER_DTYPE` (numpy, for many), with the positions derived from
it. `store.message_batch` holds the vectorized side (the same layout checks over
many messages, `peek_headers` for dispatch), which the Spark decoder
(`analytics.codec`) uses as well.
"""

from __future__ import annotations

import operator
import re
import socket
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np

from store.errors import CorruptEntry, InvalidMessage

__all__ = [
    "BLANK_MAGIC_CODE",
    "BODY_LENGTH_POS",
    "DEFAULT_MAX_BODY_BYTES",
    "FIXED_PART_SIZE",
    "HEADER_DTYPE",
    "IPV6_FLAGS",
    "MAX_PROPERTIES_BYTES",
    "MAX_TOPIC_BYTES",
    "MESSAGE_MAGIC_CODE",
    "MIN_MESSAGE_SIZE",
    "PHYSICAL_OFFSET_POS",
    "PROPERTY_KEYS",
    "PROPERTY_TAGS",
    "PROPERTY_UNIQ_KEY",
    "QUEUE_OFFSET_POS",
    "STORE_HOST_POS",
    "STORE_TIMESTAMP_POS",
    "TOPIC_BYTES",
    "MessageHeader",
    "StoredMessage",
    "check_name",
    "decode_fields",
    "decode_message",
    "decode_messages",
    "encode_message",
    "encoded_size",
    "is_message",
    "java_string_hash",
    "make_properties",
    "max_encoded_size",
    "message_id",
    "patch_offsets",
    "peek_header",
    "split_keys",
    "tags_hash_code",
    "validate_message",
]

MESSAGE_MAGIC_CODE = -626843481  # 0xdaa320a7 as a signed i32 (RocketMQ V1)
BLANK_MAGIC_CODE = -875286124  # 0xcbd43194: RocketMQ's end-of-file filler
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# sysFlag bits whose layouts we do not support (RocketMQ's IPv6 host flags).
_BORNHOST_V6_FLAG = 1 << 4
_STOREHOST_V6_FLAG = 1 << 5
IPV6_FLAGS = _BORNHOST_V6_FLAG | _STOREHOST_V6_FLAG

# The fixed part, up to and including bodyLength: for many messages at once (numpy)...
HEADER_DTYPE = np.dtype(
    [
        ("total_size", ">i4"),
        ("magic_code", ">i4"),
        ("body_crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("physical_offset", ">i8"),
        ("sys_flag", ">i4"),
        ("born_timestamp_ms", ">i8"),
        ("born_ip", "V4"),
        ("born_port", ">i4"),
        ("store_timestamp_ms", ">i8"),
        ("store_ip", "V4"),
        ("store_port", ">i4"),
        ("reconsume_times", ">i4"),
        ("prepared_transaction_offset", ">i8"),
        ("body_length", ">i4"),
    ]
)
# ... and for one (the same fields in the same order).
_FIXED = struct.Struct(">iiiiiqqiq4siq4siiqi")
FIXED_PART_SIZE = _FIXED.size
assert FIXED_PART_SIZE == HEADER_DTYPE.itemsize == 88
assert HEADER_DTYPE.names is not None and len(HEADER_DTYPE.names) == len(_FIXED.unpack(bytes(88)))


def _position(name: str) -> int:
    fields = HEADER_DTYPE.fields
    assert fields is not None
    return int(fields[name][1])


QUEUE_ID_POS = _position("queue_id")  # 12
QUEUE_OFFSET_POS = _position("queue_offset")  # 20
PHYSICAL_OFFSET_POS = _position("physical_offset")  # 28
STORE_TIMESTAMP_POS = _position("store_timestamp_ms")  # 56
STORE_HOST_POS = _position("store_ip")  # 64: IPv4 address, then port
BODY_LENGTH_POS = _position("body_length")  # 84: the body follows at 88
assert (QUEUE_OFFSET_POS, PHYSICAL_OFFSET_POS, STORE_TIMESTAMP_POS) == (20, 28, 56)
assert BODY_LENGTH_POS + 4 == FIXED_PART_SIZE
_OFFSETS = struct.Struct(">qq")
_PROPS_LEN = struct.Struct(">h")

MIN_MESSAGE_SIZE = FIXED_PART_SIZE + 1 + 1 + 2  # a one-byte topic, no body, no properties
_TOPIC_RE = re.compile(r"[A-Za-z0-9_%|-]+")
TOPIC_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_%|-")

Host = tuple[str, int]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A commit-log message; the offsets and store fields are filled in by the store."""

    topic: str
    body: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: Host = ("0.0.0.0", 0)
    store_timestamp_ms: int = 0
    store_host: Host = ("0.0.0.0", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(PROPERTY_KEYS))

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def tags_code(self) -> int:
        return tags_hash_code(self.tags)

    def with_positions(self, queue_offset: int, physical_offset: int) -> StoredMessage:
        return replace(self, queue_offset=queue_offset, physical_offset=physical_offset)


class MessageHeader(NamedTuple):
    """What dispatch needs from a message, read without copying the body."""

    total_size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp_ms: int
    topic: str
    tags_code: int
    keys: list[str]
    uniq_key: str | None


def make_properties(
    *,
    tags: str | None = None,
    keys: Iterable[str] = (),
    uniq_key: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build a properties dict with the well-known names set RocketMQ-style."""
    props: dict[str, str] = dict(extra or {})
    key_list = list(keys)
    for key in key_list:
        if not key or KEY_SEPARATOR in key:
            raise InvalidMessage(f"key {key!r} must be non-empty and contain no space")
    if key_list:
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(key_list)
    if tags is not None:
        props[PROPERTY_TAGS] = tags
    if uniq_key is not None:
        props[PROPERTY_UNIQ_KEY] = uniq_key
    return props


def split_keys(keys: str | None) -> list[str]:
    """The space-separated KEYS property as a list, empty parts dropped (as RocketMQ does)."""
    return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []


# -- hashing -------------------------------------------------------------------


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode()` (over UTF-16 code units) as a signed 32-bit int."""
    if s.isascii():
        units: Sequence[int] = s.encode("ascii")
    else:
        raw = s.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    n = len(units)
    if n <= _POW_LEN:  # sum(unit * 31^(n-1-i)) mod 2^32, in C rather than a Python loop
        h = int(sum(map(operator.mul, units, _POW31[_POW_LEN - n :]))) & 0xFFFFFFFF
    else:
        h = 0
        for unit in units:
            h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


_POW_LEN = 1024
_POW31 = [pow(31, k, 1 << 32) for k in range(_POW_LEN)][::-1]  # 31^(len-1) .. 31^0


@lru_cache(maxsize=65536)
def tags_hash_code(tags: str | None) -> int:
    """RocketMQ's tagsCode: `tags.hashCode()` widened to i64, 0 for no tags."""
    return java_string_hash(tags) if tags else 0


# -- encoding ------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _topic_bytes(topic: str) -> bytes:
    check_name(topic)
    return topic.encode("ascii")


def check_name(name: str, what: str = "topic") -> None:
    """A topic (or consumer group) name: [A-Za-z0-9_%|-], 1 to MAX_TOPIC_BYTES long."""
    if not isinstance(name, str) or not name:
        raise InvalidMessage(f"{what} must be a non-empty string")
    if _TOPIC_RE.fullmatch(name) is None:
        raise InvalidMessage(f"{what} {name!r} may only contain [A-Za-z0-9_%|-]")
    if len(name) > MAX_TOPIC_BYTES:
        raise InvalidMessage(f"{what} is {len(name)} bytes, at most {MAX_TOPIC_BYTES} allowed")


@lru_cache(maxsize=1024)
def _host_bytes(ip: str) -> bytes:
    try:
        return socket.inet_pton(socket.AF_INET, ip)
    except (OSError, TypeError):
        raise InvalidMessage(f"host {ip!r} is not an IPv4 address") from None


@lru_cache(maxsize=1024)
def _host_str(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET, raw)


def _properties_bytes(props: Mapping[str, str]) -> bytes:
    if not props:
        return b""
    try:
        # "\x01".join raises TypeError for a name or value that is not a str.
        text = "\x02".join(map("\x01".join, props.items())) + "\x02"
        raw = text.encode("utf-8")
    except (TypeError, UnicodeEncodeError):
        raise InvalidMessage("property names and values must be encodable strings") from None
    n = len(props)
    if text.count(NAME_VALUE_SEPARATOR) != n or text.count(PROPERTY_SEPARATOR) != n:
        raise InvalidMessage("property names and values must not contain \\x01 or \\x02")
    if "" in props:
        raise InvalidMessage("property names must be non-empty")
    if len(raw) > MAX_PROPERTIES_BYTES:
        raise InvalidMessage(
            f"properties are {len(raw)} bytes encoded, at most {MAX_PROPERTIES_BYTES} allowed"
        )
    return raw


def max_encoded_size(max_body_bytes: int) -> int:
    """The most bytes `encode_message` returns for a body of at most `max_body_bytes`."""
    return FIXED_PART_SIZE + max_body_bytes + 1 + MAX_TOPIC_BYTES + 2 + MAX_PROPERTIES_BYTES


def encode_message(msg: StoredMessage, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> bytes:
    """The message's bytes; raises InvalidMessage for anything `decode_message` would refuse."""
    if msg.sys_flag & IPV6_FLAGS:
        raise InvalidMessage("IPv6 host flags in sysFlag are not supported")
    return encode_fields(
        msg.topic,
        msg.body,
        msg.properties,
        max_body_bytes=max_body_bytes,
        queue_id=msg.queue_id,
        flag=msg.flag,
        queue_offset=msg.queue_offset,
        physical_offset=msg.physical_offset,
        sys_flag=msg.sys_flag,
        born_timestamp_ms=msg.born_timestamp_ms,
        born_host=msg.born_host,
        store_timestamp_ms=msg.store_timestamp_ms,
        store_host=msg.store_host,
        reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=msg.prepared_transaction_offset,
    )


def encode_fields(
    topic: str,
    body: bytes,
    properties: Mapping[str, str],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp_ms: int = 0,
    born_host: Host = ("0.0.0.0", 0),
    store_timestamp_ms: int = 0,
    store_host: Host = ("0.0.0.0", 0),
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> bytes:
    """`encode_message` of the message with these fields, without making the StoredMessage (the
    put path encodes every message it takes once, here)."""
    raw_topic = _topic_bytes(topic)
    if not isinstance(body, bytes | bytearray):
        raise InvalidMessage(f"body must be bytes, not {type(body).__name__}")
    if len(body) > max_body_bytes:
        raise InvalidMessage(f"body is {len(body)} bytes, at most {max_body_bytes} allowed")
    props = _properties_bytes(properties)
    if sys_flag & IPV6_FLAGS:
        raise InvalidMessage("IPv6 host flags in sysFlag are not supported")
    try:
        born_ip, born_port = born_host
        store_ip, store_port = store_host
    except (TypeError, ValueError):
        raise InvalidMessage("hosts must be (IPv4 address, port) pairs") from None
    total = FIXED_PART_SIZE + len(body) + 1 + len(raw_topic) + 2 + len(props)
    try:
        head = _FIXED.pack(
            total,
            MESSAGE_MAGIC_CODE,
            zlib.crc32(body) & 0x7FFFFFFF,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp_ms,
            _host_bytes(born_ip),
            born_port,
            store_timestamp_ms,
            _host_bytes(store_ip),
            store_port,
            reconsume_times,
            prepared_transaction_offset,
            len(body),
        )
    except struct.error as exc:
        raise InvalidMessage(f"a numeric field is out of range: {exc}") from None
    return b"".join(
        (head, body, bytes((len(raw_topic),)), raw_topic, _PROPS_LEN.pack(len(props)), props)
    )


def encoded_size(msg: StoredMessage) -> int:
    """Length of `encode_message(msg)` for a valid message, without encoding the body."""
    props = _properties_bytes(msg.properties)
    return FIXED_PART_SIZE + len(msg.body) + 1 + len(_topic_bytes(msg.topic)) + 2 + len(props)


def validate_message(msg: StoredMessage, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
    """Raise InvalidMessage(reason) unless `msg` can be stored (the same checks as encoding)."""
    encode_message(msg, max_body_bytes=max_body_bytes)


def patch_offsets(buf: bytearray, queue_offset: int, physical_offset: int, at: int = 0) -> None:
    """Overwrite the queue and physical offsets of the encoded message at `buf[at:]`."""
    _OFFSETS.pack_into(buf, at + QUEUE_OFFSET_POS, queue_offset, physical_offset)


# -- decoding ------------------------------------------------------------------

_Buffer = bytes | bytearray | memoryview


def _corrupt(offset: int, reason: str) -> CorruptEntry:
    return CorruptEntry("message", offset, reason)


@lru_cache(maxsize=4096)
def _decode_topic(raw: bytes) -> str | None:
    return raw.decode("ascii") if TOPIC_BYTES.issuperset(raw) else None


def _parse_layout(buf: _Buffer, offset: int) -> tuple[tuple[Any, ...], int, str, _Buffer]:
    """Check magic and lengths; returns (fixed fields, body end, topic, properties bytes)."""
    if offset < 0 or len(buf) - offset < MIN_MESSAGE_SIZE:
        raise _corrupt(offset, f"{max(len(buf) - offset, 0)} bytes cannot hold a message")
    fields = _FIXED.unpack_from(buf, offset)
    total, magic, body_len = fields[0], fields[1], fields[16]
    if magic != MESSAGE_MAGIC_CODE:
        raise _corrupt(offset, f"bad magic code {magic & 0xFFFFFFFF:#010x}")
    if total < MIN_MESSAGE_SIZE or total > len(buf) - offset:
        raise _corrupt(offset, f"total size {total} does not fit {len(buf) - offset} bytes")
    if fields[7] & IPV6_FLAGS:
        raise _corrupt(offset, "IPv6 host flags in sysFlag are not supported")
    end = offset + total
    body_end = offset + FIXED_PART_SIZE + body_len
    if body_len < 0 or body_end + 3 > end:
        raise _corrupt(offset, f"body length {body_len} overruns total size {total}")
    topic_len = buf[body_end]
    topic_end = body_end + 1 + topic_len
    if topic_len == 0 or topic_len > MAX_TOPIC_BYTES or topic_end + 2 > end:
        raise _corrupt(offset, f"topic length {topic_len} is invalid")
    raw_topic = bytes(buf[body_end + 1 : topic_end])
    topic = _decode_topic(raw_topic)
    if topic is None:
        raise _corrupt(offset, f"topic {raw_topic!r} has characters outside [A-Za-z0-9_%|-]")
    (props_len,) = _PROPS_LEN.unpack_from(buf, topic_end)
    if props_len < 0 or topic_end + 2 + props_len != end:
        raise _corrupt(offset, f"properties length {props_len} disagrees with total size {total}")
    return fields, body_end, topic, buf[topic_end + 2 : end]


def is_message(buf: _Buffer) -> bool:
    """Whether `buf` is exactly one message whose layout checks out (body CRC not read)."""
    try:
        fields = _parse_layout(buf, 0)[0]
    except CorruptEntry:
        return False
    return bool(fields[0] == len(buf))


def _parse_properties(raw: _Buffer, offset: int) -> dict[str, str]:
    if not raw:
        return {}
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError:
        raise _corrupt(offset, "properties are not UTF-8") from None
    if text[-1] != PROPERTY_SEPARATOR:
        raise _corrupt(offset, "properties do not end with a separator")
    items = text[:-1].split(PROPERTY_SEPARATOR)
    try:
        # dict() refuses any item that does not split into exactly (name, value).
        props = dict(map(str.split, items, repeat(NAME_VALUE_SEPARATOR)))
    except ValueError:
        raise _corrupt(offset, "a property is not one name\\x01value pair") from None
    if len(props) != len(items) or "" in props:
        raise _corrupt(offset, "duplicate or empty property name")
    return props


def decode_fields(
    buf: _Buffer, offset: int = 0, verify_crc: bool = True
) -> tuple[tuple[Any, ...], str, bytes, dict[str, str]]:
    """`decode_message` without building the StoredMessage: the fixed part's fields (in
    `HEADER_DTYPE`'s order, hosts as their raw 4-byte addresses), the topic, the body
    and the properties; for a reader that builds its own value of them."""
    fields, body_end, topic, raw_props = _parse_layout(buf, offset)
    body = bytes(buf[offset + FIXED_PART_SIZE : body_end])
    if verify_crc and zlib.crc32(body) & 0x7FFFFFFF != fields[2]:
        raise _corrupt(offset, "body CRC mismatch")
    if fields[2] < 0:
        raise _corrupt(offset, f"body CRC {fields[2]} has its top bit set")
    return fields, topic, body, _parse_properties(raw_props, offset)


def decode_message(buf: _Buffer, offset: int = 0, verify_crc: bool = True) -> StoredMessage:
    """Decode the message at `buf[offset:]`; raises CorruptEntry on any inconsistency."""
    fields, topic, body, properties = decode_fields(buf, offset, verify_crc)
    return StoredMessage(
        topic=topic,
        body=body,
        properties=properties,
        queue_id=fields[3],
        flag=fields[4],
        queue_offset=fields[5],
        physical_offset=fields[6],
        sys_flag=fields[7],
        born_timestamp_ms=fields[8],
        born_host=(_host_str(fields[9]), fields[10]),
        store_timestamp_ms=fields[11],
        store_host=(_host_str(fields[12]), fields[13]),
        reconsume_times=fields[14],
        prepared_transaction_offset=fields[15],
    )


def decode_messages(
    buf: _Buffer,
) -> list[tuple[int, tuple[tuple[Any, ...], str, bytes, dict[str, str]]]]:
    """The messages laid end to end in `buf`: where each starts and its `decode_fields`
    (its size is the first field); CorruptEntry if one does not decode or `buf` ends
    inside one."""
    out = []
    at = 0
    while at < len(buf):
        parts = decode_fields(buf, at)
        out.append((at, parts))
        at += parts[0][0]  # its total size, checked against the buffer
    return out


def message_id(buf: _Buffer, offset: int = 0) -> str:
    """The id of the stored message at `buf[offset:]` (RocketMQ's: its storeHost, IPv4
    address and port, then its physicalOffset; 32 upper-case hex digits), the id a put
    answered for it (`log.message_layout`)."""
    host = buf[offset + STORE_HOST_POS : offset + STORE_HOST_POS + 8]
    at = buf[offset + PHYSICAL_OFFSET_POS : offset + PHYSICAL_OFFSET_POS + 8]
    return (bytes(host) + bytes(at)).hex().upper()


def peek_header(buf: _Buffer, offset: int = 0) -> MessageHeader:
    """The dispatch fields of the message at `buf[offset:]`, without copying or checking the body.

    Layout and properties are checked as strictly as by `decode_message`; the body
    CRC is not (the entry holding the message carries its own CRC).
    """
    fields, _body_end, topic, raw_props = _parse_layout(buf, offset)
    props = _parse_properties(raw_props, offset)
    return MessageHeader(
        total_size=fields[0],
        queue_id=fields[3],
        queue_offset=fields[5],
        physical_offset=fields[6],
        sys_flag=fields[7],
        store_timestamp_ms=fields[11],
        topic=topic,
        tags_code=tags_hash_code(props.get(PROPERTY_TAGS)),
        keys=split_keys(props.get(PROPERTY_KEYS)),
        uniq_key=props.get(PROPERTY_UNIQ_KEY),
    )
