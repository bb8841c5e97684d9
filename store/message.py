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

`peek_headers` is `peek_header` over a batch (dispatch): numpy reads the fixed
fields, topics, properties and key hashes of all messages at once, and hands any
message it is not sure of (a layout or properties check fails, non-ASCII
properties, a possible duplicate property name) to `peek_header` itself, so it
accepts, refuses and returns exactly what `peek_header` does message by message.
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
import numpy.typing as npt

from store.errors import CorruptEntry, InvalidMessage

__all__ = [
    "BLANK_MAGIC_CODE",
    "DEFAULT_MAX_BODY_BYTES",
    "FIXED_PART_SIZE",
    "MESSAGE_MAGIC_CODE",
    "PHYSICAL_OFFSET_POS",
    "POW31_U32",
    "PROPERTY_KEYS",
    "PROPERTY_TAGS",
    "PROPERTY_UNIQ_KEY",
    "QUEUE_OFFSET_POS",
    "STORE_TIMESTAMP_POS",
    "VECTOR_MIN_MESSAGES",
    "HeaderBatch",
    "Message",
    "MessageHeader",
    "decode_message",
    "encode_message",
    "encoded_size",
    "is_message",
    "java_hashes",
    "java_string_hash",
    "make_properties",
    "max_encoded_size",
    "patch_offsets",
    "peek_header",
    "peek_headers",
    "split_keys",
    "tags_hash_code",
    "validate_message",
]

MESSAGE_MAGIC_CODE = -626843481  # 0xdaa320a7 as a signed i32 (RocketMQ V1)
BLANK_MAGIC_CODE = -875286124  # 0xcbd43194: RocketMQ's end-of-file filler
QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
STORE_TIMESTAMP_POS = 56
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
_V6_FLAGS = _BORNHOST_V6_FLAG | _STOREHOST_V6_FLAG

# Everything up to and including bodyLength, in one precompiled struct.
_FIXED = struct.Struct(">iiiiiqqiq4siq4siiqi")
FIXED_PART_SIZE = _FIXED.size
_OFFSETS = struct.Struct(">qq")
_PROPS_LEN = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
assert FIXED_PART_SIZE == 88
assert _FIXED.size - 4 == 84  # bodyLength lies at 84, the body at 88

_MIN_SIZE = FIXED_PART_SIZE + 1 + 1 + 2  # a one-byte topic, no body, no properties
_TOPIC_RE = re.compile(r"[A-Za-z0-9_%|-]+")
_TOPIC_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_%|-")

Host = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Message:
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

    def with_positions(self, queue_offset: int, physical_offset: int) -> Message:
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


def encode_message(msg: Message, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> bytes:
    """The message's bytes; raises InvalidMessage for anything `decode_message` would refuse."""
    topic = _topic_bytes(msg.topic)
    body = msg.body
    if not isinstance(body, bytes | bytearray):
        raise InvalidMessage(f"body must be bytes, not {type(body).__name__}")
    if len(body) > max_body_bytes:
        raise InvalidMessage(f"body is {len(body)} bytes, at most {max_body_bytes} allowed")
    props = _properties_bytes(msg.properties)
    if msg.sys_flag & _V6_FLAGS:
        raise InvalidMessage("IPv6 host flags in sysFlag are not supported")
    try:
        born_ip, born_port = msg.born_host
        store_ip, store_port = msg.store_host
    except (TypeError, ValueError):
        raise InvalidMessage("hosts must be (IPv4 address, port) pairs") from None
    total = FIXED_PART_SIZE + len(body) + 1 + len(topic) + 2 + len(props)
    try:
        head = _FIXED.pack(
            total,
            MESSAGE_MAGIC_CODE,
            zlib.crc32(body) & 0x7FFFFFFF,
            msg.queue_id,
            msg.flag,
            msg.queue_offset,
            msg.physical_offset,
            msg.sys_flag,
            msg.born_timestamp_ms,
            _host_bytes(born_ip),
            born_port,
            msg.store_timestamp_ms,
            _host_bytes(store_ip),
            store_port,
            msg.reconsume_times,
            msg.prepared_transaction_offset,
            len(body),
        )
    except struct.error as exc:
        raise InvalidMessage(f"a numeric field is out of range: {exc}") from None
    return b"".join((head, body, bytes((len(topic),)), topic, _PROPS_LEN.pack(len(props)), props))


def encoded_size(msg: Message) -> int:
    """Length of `encode_message(msg)` for a valid message, without encoding the body."""
    props = _properties_bytes(msg.properties)
    return FIXED_PART_SIZE + len(msg.body) + 1 + len(_topic_bytes(msg.topic)) + 2 + len(props)


def validate_message(msg: Message, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
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
    return raw.decode("ascii") if _TOPIC_SAFE.issuperset(raw) else None


def _parse_layout(buf: _Buffer, offset: int) -> tuple[tuple[Any, ...], int, str, _Buffer]:
    """Check magic and lengths; returns (fixed fields, body end, topic, properties bytes)."""
    if offset < 0 or len(buf) - offset < _MIN_SIZE:
        raise _corrupt(offset, f"{max(len(buf) - offset, 0)} bytes cannot hold a message")
    fields = _FIXED.unpack_from(buf, offset)
    total, magic, body_len = fields[0], fields[1], fields[16]
    if magic != MESSAGE_MAGIC_CODE:
        raise _corrupt(offset, f"bad magic code {magic & 0xFFFFFFFF:#010x}")
    if total < _MIN_SIZE or total > len(buf) - offset:
        raise _corrupt(offset, f"total size {total} does not fit {len(buf) - offset} bytes")
    if fields[7] & _V6_FLAGS:
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


def decode_message(buf: _Buffer, offset: int = 0, verify_crc: bool = True) -> Message:
    """Decode the message at `buf[offset:]`; raises CorruptEntry on any inconsistency."""
    fields, body_end, topic, raw_props = _parse_layout(buf, offset)
    body = bytes(buf[offset + FIXED_PART_SIZE : body_end])
    if verify_crc and zlib.crc32(body) & 0x7FFFFFFF != fields[2]:
        raise _corrupt(offset, "body CRC mismatch")
    if fields[2] < 0:
        raise _corrupt(offset, f"body CRC {fields[2]} has its top bit set")
    return Message(
        topic=topic,
        body=body,
        properties=_parse_properties(raw_props, offset),
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


# -- decoding a batch (dispatch) ---------------------------------------------------

I64s = npt.NDArray[np.int64]
U32s = npt.NDArray[np.uint32]
_U8s = npt.NDArray[np.uint8]
_Bools = npt.NDArray[np.bool_]

# 31**k and 31**-k mod 2**32 for k < 2**16 (a property is at most 32767 bytes long).
POW31_U32: U32s = np.cumprod(np.r_[np.uint32(1), np.full((1 << 16) - 1, 31, np.uint32)],
                             dtype=np.uint32)  # fmt: skip
_INV31 = pow(31, -1, 1 << 32)
_INV31_POW: U32s = np.cumprod(np.r_[np.uint32(1), np.full((1 << 16) - 1, _INV31, np.uint32)],
                              dtype=np.uint32)  # fmt: skip
# The fields of the fixed part that dispatch reads, where they lie in it.
_HEAD = np.dtype(
    {
        "names": ["total", "magic", "queue_id", "queue_offset", "sys_flag", "ts", "body_len"],
        "formats": [">i4", ">i4", ">i4", ">i8", ">i4", ">i8", ">i4"],
        "offsets": [0, 4, 12, QUEUE_OFFSET_POS, 36, STORE_TIMESTAMP_POS, FIXED_PART_SIZE - 4],
        "itemsize": FIXED_PART_SIZE,
    }
)
_HASH_WIDTH = 64  # segments up to this long are hashed as the rows of one matrix
_PROPS_WIDTH = 4096  # properties longer than this (or than 4x the mean) go one by one
# Pads the message tails laid end to end: gathers of topics and properties read past
# a message's end up to this far.
_PAD = bytes(FIXED_PART_SIZE + MAX_TOPIC_BYTES + _PROPS_WIDTH + 8)
_TOPIC_OK: _Bools = np.zeros(256, np.bool_)
_TOPIC_OK[np.frombuffer(bytes(sorted(_TOPIC_SAFE)), np.uint8)] = True
_NAME_KEYS, _NAME_TAGS, _NAME_UNIQ = (
    (name.encode(), java_string_hash(name) & 0xFFFFFFFF)
    for name in (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY)
)
_SPACE = ord(KEY_SEPARATOR)
_NO_KEYS: tuple[I64s, I64s, I64s] = (np.zeros(0, np.int64),) * 3
# Below this many messages per-message decoding is cheaper than numpy's per-call cost.
VECTOR_MIN_MESSAGES = 80


class HeaderBatch(NamedTuple):
    """`peek_header` of every message of a batch, as columns (index i: message i).

    Keys are those dispatch indexes, in order: for each message its KEYS words, then
    its UNIQ_KEY when that is not empty; each as the message it belongs to, its Java
    `hashCode` (as an unsigned 32-bit value) and its length in UTF-16 code units.
    """

    total_size: I64s
    queue_id: I64s
    queue_offset: I64s
    store_timestamp_ms: I64s
    tags_code: I64s
    topic_index: I64s  # into `topics`
    topics: list[str]
    key_message: I64s  # nondecreasing
    key_hash: I64s
    key_units: I64s


def _strided(arr: _U8s, width: int) -> npt.NDArray[np.void]:
    """Every `width`-byte window of `arr`, by start: a gather of records at any offsets."""
    return np.ndarray(
        shape=(len(arr) - width + 1,), dtype=np.dtype(f"V{width}"), buffer=arr, strides=(1,)
    )


def _windows(arr: _U8s, starts: I64s, width: int) -> _U8s:
    """The `width` bytes of `arr` from each start, as the rows of a matrix."""
    rows: _U8s = _strided(arr, width)[starts].view(np.uint8).reshape(len(starts), width)
    return rows


def java_hashes(arr: _U8s, starts: I64s, lens: I64s) -> U32s:
    """`java_string_hash` of ASCII byte segments of `arr` (unsigned 32-bit values)."""
    out = np.zeros(len(lens), np.uint32)
    width = int(lens.max()) if len(lens) else 0
    if not width:
        return out
    if width <= _HASH_WIDTH and int(starts.max()) + width <= len(arr):
        # Zero-padded on the right, a row hashes to h * 31^pad: multiply that back out.
        rows = _windows(arr, starts, width)
        rows = np.where(np.arange(width) < lens[:, None], rows, 0).astype(np.uint8)
        padded: U32s = np.dot(rows, POW31_U32[width - 1 :: -1])
        return padded * _INV31_POW[width - lens]
    flat = np.cumsum(lens) - lens
    total = int(flat[-1] + lens[-1])
    if total:
        step = np.arange(total, dtype=np.int64)
        pos = np.repeat(starts - flat, lens) + step
        power = np.repeat(flat + lens - 1, lens) - step
        terms = arr[pos].astype(np.uint32) * POW31_U32[power]  # sum(c * 31^k) mod 2^32
        some = lens > 0
        out[some] = np.add.reduceat(terms, flat[some], dtype=np.uint32)
    return out


def _named(props: _U8s, starts: I64s, lens: I64s, hashes: U32s, name: tuple[bytes, int]) -> _Bools:
    """Which property names (segments of `props`, with their hashes) are exactly `name`
    (its bytes and hash)."""
    raw, want = name
    hit: _Bools = (lens == len(raw)) & (hashes == want)
    if hit.any():
        at = np.flatnonzero(hit)
        hit[at] = _strided(props, len(raw))[starts[at]] == np.frombuffer(raw, f"V{len(raw)}")[0]
    return hit


def peek_headers(datas: Sequence[_Buffer], vector_min: int | None = None) -> HeaderBatch:
    """`peek_header` of each buffer (one whole message each), batched; the first message
    `peek_header` refuses raises its CorruptEntry, before anything is returned.

    Fewer than `vector_min` (default VECTOR_MIN_MESSAGES) are decoded one by one.
    """
    n = len(datas)
    if n < max(VECTOR_MIN_MESSAGES if vector_min is None else vector_min, 1):
        return _one_by_one(datas, np.ones(n, np.bool_), None)
    lens = np.fromiter(map(len, datas), np.int64, n)
    short = lens < _MIN_SIZE
    if short.any():
        heads = [d[:FIXED_PART_SIZE] if len(d) >= _MIN_SIZE else _PAD[:FIXED_PART_SIZE]
                 for d in datas]  # fmt: skip
    else:
        heads = [d[:FIXED_PART_SIZE] for d in datas]
    fixed = np.frombuffer(b"".join(heads), _HEAD)
    total = fixed["total"].astype(np.int64)
    body_len = fixed["body_len"].astype(np.int64)
    # The checks of _parse_layout; a message failing one is left to peek_header.
    slow = (
        short
        | (fixed["magic"] != MESSAGE_MAGIC_CODE)
        | (total < _MIN_SIZE)
        | (total > lens)
        | ((fixed["sys_flag"] & _V6_FLAGS) != 0)
        | (body_len < 0)
        | (FIXED_PART_SIZE + body_len + 3 > total)
    )
    # The rest is read from the tails (topic and properties) laid end to end.
    cut = FIXED_PART_SIZE + body_len
    cut[slow] = lens[slow]
    arr = np.frombuffer(b"".join([*(d[c:] for d, c in zip(datas, cut.tolist(), strict=True)),
                                  _PAD]), np.uint8)  # fmt: skip
    tail_len = lens - cut
    body_end = np.cumsum(tail_len) - tail_len
    end = body_end + total - cut
    topic_len = arr[body_end].astype(np.int64)
    topic_end = body_end + 1 + topic_len
    slow |= (topic_len == 0) | (topic_len > MAX_TOPIC_BYTES) | (topic_end + 2 > end)
    topic_end[slow] = body_end[slow]
    props_len = (arr[topic_end].astype(np.int64) << 8) | arr[topic_end + 1]
    props_len[props_len >= 1 << 15] -= 1 << 16
    slow |= (props_len < 0) | (topic_end + 2 + props_len != end)
    topic_len[slow] = 1
    # Topics: one zero-padded row of bytes each, checked and numbered in one go.
    width = int(topic_len.max())
    inside = np.arange(width) < topic_len[:, None]
    rows = np.where(inside, _windows(arr, body_end + 1, width), 0).astype(np.uint8)
    slow |= (inside & ~_TOPIC_OK[rows]).any(axis=1)
    rows[slow] = 0  # their topics come from peek_header
    found, topic_index = np.unique(rows.view(f"V{width}")[:, 0], return_inverse=True)
    topics = [bytes(t).rstrip(b"\0").decode("ascii") for t in found]
    # Properties: those of unusual length go one by one (they would widen the matrix).
    props_len[slow] = 0
    limit = min(_PROPS_WIDTH, max(256, 4 * int(props_len.sum()) // n))
    slow |= props_len > limit
    props_len[slow] = 0
    tags_code = np.zeros(n, np.int64)
    keys = _NO_KEYS
    if props_len.any():
        tags_code, keys = _properties(arr, topic_end + 2, props_len, slow)
    batch = HeaderBatch(
        total, fixed["queue_id"].astype(np.int64), fixed["queue_offset"].astype(np.int64),
        fixed["ts"].astype(np.int64), tags_code, topic_index.reshape(n).astype(np.int64),
        topics, *keys,
    )  # fmt: skip
    if slow.any():
        return _one_by_one(datas, slow, batch)
    return batch


def _properties(
    arr: _U8s, props_at: I64s, props_len: I64s, slow: _Bools
) -> tuple[I64s, tuple[I64s, I64s, I64s]]:
    """Tag codes and keys from the properties of the messages not `slow`: each a row
    of a zero-padded matrix. Messages the fast path cannot take are marked `slow` (in
    place): not ASCII, not `name \x01 value \x02` pairs, a possible duplicate name."""
    n = len(props_len)
    width = int(props_len.max())
    flat = np.zeros(n * width + max(width, _HASH_WIDTH), np.uint8)  # a margin for windows
    matrix = flat[: n * width].reshape(n, width)
    np.copyto(matrix, _windows(arr, props_at, width), where=np.arange(width) < props_len[:, None])
    bad: _Bools = np.asarray((matrix >= 0x80).any(axis=1))
    has = np.flatnonzero(props_len)
    bad[has] |= matrix[has, props_len[has] - 1] != 2  # the last pair's separator
    body = flat[: n * width]
    seps = np.flatnonzero((body == 1) | (body == 2))
    kind = body[seps]
    owner = seps // width
    first = np.ones(len(seps), np.bool_)
    first[1:] = owner[1:] != owner[:-1]
    before = np.empty_like(kind)
    before[:1] = 0
    before[1:] = kind[:-1]
    bad[owner[np.where(first, kind != 1, kind == before)]] = True  # \x01 \x02 \x01 \x02 ...
    name_at = np.empty_like(seps)
    name_at[:1] = 0
    name_at[1:] = seps[:-1] + 1
    name_at[first] = owner[first] * width
    bad[owner[(kind == 1) & (seps == name_at)]] = True  # an empty name
    slow |= bad
    ok = ~slow[owner]
    is_eq = ok & (kind == 1)
    eq, owner, name_at = seps[is_eq], owner[is_eq], name_at[is_eq]
    stop = seps[ok & (kind == 2)]
    name_len = eq - name_at
    hashes = java_hashes(flat, name_at, name_len)
    tagged = np.sort((owner << 32) | hashes.astype(np.int64))
    twin = tagged[1:] == tagged[:-1]
    if twin.any():  # a duplicate name, or two that hash alike: peek_header decides
        slow[tagged[1:][twin] >> 32] = True
        keep = ~slow[owner]
        eq, stop, owner, name_at = eq[keep], stop[keep], owner[keep], name_at[keep]
        name_len, hashes = name_len[keep], hashes[keep]
    value_at, value_len = eq + 1, stop - eq - 1
    tags_code = np.zeros(n, np.int64)
    is_tags = _named(flat, name_at, name_len, hashes, _NAME_TAGS)
    tag_hashes = java_hashes(flat, value_at[is_tags], value_len[is_tags])
    tags_code[owner[is_tags]] = tag_hashes.view(np.int32)
    # KEYS: each word of the value (a run of non-spaces) is a key.
    is_keys = _named(flat, name_at, name_len, hashes, _NAME_KEYS)
    keys_at, keys_len = value_at[is_keys], value_len[is_keys]
    words_of, word_at, word_len = _NO_KEYS
    if len(keys_at) and keys_len.any():
        kw = int(keys_len.max())
        solid = np.zeros((len(keys_at), kw + 2), np.bool_)
        solid[:, 1:-1] = (_windows(flat, keys_at, kw) != _SPACE) & (
            np.arange(kw) < keys_len[:, None]
        )
        begins = np.flatnonzero(solid[:, 1:-1] & ~solid[:, :-2])
        ends = np.flatnonzero(solid[:, 1:-1] & ~solid[:, 2:]) + 1
        row = begins // kw
        words_of, word_at, word_len = owner[is_keys][row], keys_at[row] + begins % kw, ends - begins
    is_uniq = _named(flat, name_at, name_len, hashes, _NAME_UNIQ) & (value_len > 0)
    key_owner = np.concatenate([words_of, owner[is_uniq]])
    key_at = np.concatenate([word_at, value_at[is_uniq]])
    key_len = np.concatenate([word_len, value_len[is_uniq]])
    order = np.argsort(key_owner, kind="stable")  # a message's words, then its UNIQ_KEY
    key_owner, key_at, key_len = key_owner[order], key_at[order], key_len[order]
    key_hash = java_hashes(flat, key_at, key_len).astype(np.int64)
    return tags_code, (key_owner, key_hash, key_len)


def _one_by_one(datas: Sequence[_Buffer], which: _Bools, batch: HeaderBatch | None) -> HeaderBatch:
    """`peek_header` for the messages `which` (all when `batch` is None); the others keep
    their columns from `batch`."""
    n = len(datas)
    if batch is None:
        z, e = np.zeros((6, n), np.int64), np.zeros(0, np.int64)
        batch = HeaderBatch(z[0], z[1], z[2], z[3], z[4], z[5], [], e, e, e)
    topics = list(batch.topics)
    number = {t: i for i, t in enumerate(topics)}
    key_owner: list[int] = []
    keys: list[str] = []
    total, queue_id, queue_offset, ts, tags_code, topic_index = batch[:6]
    for i in np.flatnonzero(which).tolist():
        hdr = peek_header(datas[i])
        t = number.get(hdr.topic)
        if t is None:
            t = number[hdr.topic] = len(topics)
            topics.append(hdr.topic)
        total[i], queue_id[i], queue_offset[i] = hdr.total_size, hdr.queue_id, hdr.queue_offset
        ts[i], tags_code[i], topic_index[i] = hdr.store_timestamp_ms, hdr.tags_code, t
        mine = [*hdr.keys, hdr.uniq_key] if hdr.uniq_key else hdr.keys
        keys += mine
        key_owner += [i] * len(mine)
    joined = "".join(keys)
    if joined.isascii():  # all at once
        raw = np.frombuffer(joined.encode("ascii") + bytes(_HASH_WIDTH), np.uint8)
        units = np.fromiter(map(len, keys), np.int64, len(keys))
        hashes = java_hashes(raw, np.cumsum(units) - units, units).astype(np.int64)
    else:
        units = np.array([len(k.encode("utf-16-be", "surrogatepass")) // 2 for k in keys], np.int64)
        hashes = np.array([java_string_hash(k) & 0xFFFFFFFF for k in keys], np.int64)
    owner = np.array(key_owner, np.int64)
    if len(batch.key_message):
        fast = ~which[batch.key_message]
        owner = np.concatenate([batch.key_message[fast], owner])
        hashes = np.concatenate([batch.key_hash[fast], hashes])
        units = np.concatenate([batch.key_units[fast], units])
        order = np.argsort(owner, kind="stable")
        owner, hashes, units = owner[order], hashes[order], units[order]
    return batch._replace(topics=topics, key_message=owner, key_hash=hashes, key_units=units)
