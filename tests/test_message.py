"""The message codec: golden bytes, round trips, validation, and fuzzing of the decoder."""

from __future__ import annotations

import contextlib
import dataclasses
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.errors import CorruptEntry, InvalidMessage
from store.message import (
    BLANK_MAGIC_CODE,
    FIXED_PART_SIZE,
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    STORE_TIMESTAMP_POS,
    StoredMessage,
    decode_message,
    encode_message,
    encoded_size,
    java_string_hash,
    make_properties,
    patch_offsets,
    peek_header,
    tags_hash_code,
    validate_message,
)

GOLDEN_MESSAGE = StoredMessage(
    topic="T",
    body=b"hi",
    properties={"TAGS": "a"},
    queue_id=1,
    flag=0,
    queue_offset=2,
    physical_offset=3,
    sys_flag=0,
    born_timestamp_ms=4,
    born_host=("127.0.0.1", 5),
    store_timestamp_ms=6,
    store_host=("10.0.0.1", 7),
    reconsume_times=0,
    prepared_transaction_offset=0,
)

GOLDEN_HEX = " ".join(
    [
        "00000065",  # totalSize 101
        "daa320a7",  # magicCode
        "58932aac",  # bodyCRC: crc32(b"hi") & 0x7fffffff
        "00000001",  # queueId
        "00000000",  # flag
        "0000000000000002",  # queueOffset
        "0000000000000003",  # physicalOffset
        "00000000",  # sysFlag
        "0000000000000004",  # bornTimestamp
        "7f000001 00000005",  # bornHost 127.0.0.1:5
        "0000000000000006",  # storeTimestamp
        "0a000001 00000007",  # storeHost 10.0.0.1:7
        "00000000",  # reconsumeTimes
        "0000000000000000",  # preparedTransactionOffset
        "00000002 6869",  # bodyLength, body "hi"
        "01 54",  # topicLength, topic "T"
        "0007 54414753 01 61 02",  # propertiesLength, "TAGS\x01a\x02"
    ]
)


def sample(**changes: object) -> StoredMessage:
    base = StoredMessage(
        topic="TopicTest",
        body=b"x" * 100,
        properties=make_properties(tags="TagA", keys=["k1", "k2"], uniq_key="U1"),
        queue_id=3,
        queue_offset=7,
        physical_offset=4096,
        born_timestamp_ms=1_700_000_000_000,
        born_host=("192.168.0.1", 40000),
        store_timestamp_ms=1_700_000_000_123,
        store_host=("10.1.2.3", 10911),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_constants() -> None:
    assert MESSAGE_MAGIC_CODE == 0xDAA320A7 - (1 << 32)
    assert BLANK_MAGIC_CODE == 0xCBD43194 - (1 << 32)
    assert (QUEUE_OFFSET_POS, PHYSICAL_OFFSET_POS, STORE_TIMESTAMP_POS) == (20, 28, 56)
    assert FIXED_PART_SIZE == 88


def test_golden_bytes() -> None:
    assert zlib.crc32(b"hi") & 0x7FFFFFFF == 0x58932AAC
    assert encode_message(GOLDEN_MESSAGE) == bytes.fromhex(GOLDEN_HEX)
    assert decode_message(bytes.fromhex(GOLDEN_HEX)) == GOLDEN_MESSAGE
    assert encoded_size(GOLDEN_MESSAGE) == 101


def test_round_trip_and_helpers() -> None:
    msg = sample()
    raw = encode_message(msg)
    assert len(raw) == encoded_size(msg)
    back = decode_message(b"junk" + raw + b"more", offset=4)
    assert back == msg
    assert back.keys == ["k1", "k2"]
    assert back.tags == "TagA"
    assert back.uniq_key == "U1"
    assert back.tags_code == 2598919
    assert StoredMessage("t", b"").keys == []
    assert StoredMessage("t", b"").tags is None
    assert StoredMessage("t", b"", {"KEYS": " a  b "}).keys == ["a", "b"]


def test_positions_can_be_patched_in_place() -> None:
    raw = bytearray(encode_message(sample()))
    patch_offsets(raw, 11, 22)
    back = decode_message(raw)
    assert (back.queue_offset, back.physical_offset) == (11, 22)
    assert back == sample().with_positions(11, 22)


def test_peek_header() -> None:
    raw = encode_message(sample())
    head = peek_header(memoryview(raw))
    assert head.total_size == len(raw)
    assert (head.queue_id, head.queue_offset, head.physical_offset) == (3, 7, 4096)
    assert head.store_timestamp_ms == 1_700_000_000_123
    assert head.topic == "TopicTest"
    assert head.tags_code == tags_hash_code("TagA")
    assert head.keys == ["k1", "k2"]
    assert head.uniq_key == "U1"


def test_java_hash_code() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert java_string_hash("\u00e9\U0001f600") == 1996812  # surrogate pair, as UTF-16
    assert tags_hash_code(None) == 0
    assert tags_hash_code("") == 0


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (sample(topic=""), "non-empty"),
        (sample(topic="a" * 128), "at most 127"),
        (sample(topic="bad topic"), "may only contain"),
        (sample(topic="t\u00e9"), "may only contain"),
        (sample(properties={"a\x01": "b"}), "must not contain"),
        (sample(properties={"a": "b\x02"}), "must not contain"),
        (sample(properties={"": "b"}), "non-empty"),
        (sample(properties={"a": 1}), "strings"),
        (sample(properties={"a": "x" * 32766}), "at most 32767"),
        (sample(born_host=("::1", 1)), "IPv4"),
        (sample(store_host=("10.0.0.1",)), "pairs"),
        (sample(queue_id=1 << 31), "out of range"),
        (sample(physical_offset=-(1 << 63) - 1), "out of range"),
        (sample(sys_flag=1 << 4), "IPv6"),
        (sample(body="text"), "bytes"),
    ],
)
def test_invalid_messages(msg: StoredMessage, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        validate_message(msg)
    with pytest.raises(InvalidMessage):
        encode_message(msg)


def test_body_limit() -> None:
    validate_message(sample(body=b"x" * 4 * 1024 * 1024))
    with pytest.raises(InvalidMessage, match="at most 4194304"):
        validate_message(sample(body=b"x" * (4 * 1024 * 1024 + 1)))
    with pytest.raises(InvalidMessage, match="at most 10"):
        encode_message(sample(body=b"x" * 11), max_body_bytes=10)
    assert str(InvalidMessage("why")) == "invalid message: why"


def test_make_properties_refuses_keys_with_spaces() -> None:
    with pytest.raises(InvalidMessage):
        make_properties(keys=["a b"])


def corrupt(raw: bytes, at: int, value: bytes) -> bytes:
    return raw[:at] + value + raw[at + len(value) :]


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda r: r[:50], "cannot hold"),
        (lambda r: corrupt(r, 4, b"\0\0\0\0"), "bad magic"),
        (lambda r: corrupt(r, 0, b"\0\0\x10\0"), "total size"),
        (lambda r: corrupt(r, 8, b"\0\0\0\1"), "CRC"),
        (lambda r: corrupt(r, 84, b"\0\0\x10\0"), "body length"),
        (lambda r: corrupt(r, 88 + 100, b"\x00"), "topic length"),
        (lambda r: corrupt(r, 88 + 101, b" "), "characters"),
        (lambda r: corrupt(r, 36, b"\0\0\0\x20"), "IPv6"),
        (lambda r: r[:-1] + b"\x01", "separator"),
        (lambda r: corrupt(r, len(r) - 3, b"\xff"), "UTF-8"),
    ],
)
def test_decode_rejects(mangle: object, reason: str) -> None:
    raw = encode_message(sample())
    bad = mangle(raw)  # type: ignore[operator]
    with pytest.raises(CorruptEntry, match=reason) as info:
        decode_message(bad)
    assert info.value.file == "message"
    assert "corrupt entry at message offset 0" in str(info.value)


def test_decode_without_crc_check() -> None:
    bad = corrupt(encode_message(sample()), 8, b"\0\0\0\1")
    assert decode_message(bad, verify_crc=False).body == sample().body
    assert peek_header(bad).queue_offset == 7


# -- properties ----------------------------------------------------------------

_i32 = st.integers(-(1 << 31), (1 << 31) - 1)
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)
_prop_text = st.text(st.characters(blacklist_characters="\x01\x02", codec="utf-8"), max_size=20)
_host = st.tuples(st.ip_addresses(v=4).map(str), _i32)

messages = st.builds(
    StoredMessage,
    topic=st.text("abcXYZ019_%|-", min_size=1, max_size=127),
    body=st.binary(max_size=300),
    properties=st.dictionaries(_prop_text.filter(bool), _prop_text, max_size=5),
    queue_id=_i32,
    flag=_i32,
    queue_offset=_i64,
    physical_offset=_i64,
    sys_flag=_i32.map(lambda f: f & ~0x30),
    born_timestamp_ms=_i64,
    born_host=_host,
    store_timestamp_ms=_i64,
    store_host=_host,
    reconsume_times=_i32,
    prepared_transaction_offset=_i64,
)


@given(messages)
def test_round_trip_property(msg: StoredMessage) -> None:
    raw = encode_message(msg)
    assert len(raw) == encoded_size(msg)
    assert decode_message(raw) == msg
    head = peek_header(raw)
    assert (head.total_size, head.topic, head.keys) == (len(raw), msg.topic, msg.keys)


@given(st.binary(max_size=400), st.integers(0, 8))
def test_random_bytes_only_raise_corrupt_entry(raw: bytes, offset: int) -> None:
    with contextlib.suppress(CorruptEntry):
        peek_header(memoryview(raw), offset)
    try:
        msg = decode_message(raw, offset)
    except CorruptEntry:
        return
    assert encode_message(msg) == raw[offset : offset + len(encode_message(msg))]


@settings(max_examples=300)
@given(messages, st.data())
def test_mutations_are_caught_or_canonical(msg: StoredMessage, data: st.DataObject) -> None:
    raw = bytearray(encode_message(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        back = decode_message(bytes(raw))
        head = peek_header(bytes(raw))
    except CorruptEntry:
        return
    # Whatever decodes is canonical: it re-encodes to exactly the bytes read.
    assert encode_message(back, max_body_bytes=1 << 30) == bytes(raw)
    assert head.total_size == len(raw)


@given(st.text(max_size=1100))
def test_java_string_hash_matches_the_reference_loop(s: str) -> None:
    raw = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for unit in struct.unpack(f">{len(raw) // 2}H", raw):
        h = (31 * h + unit) & 0xFFFFFFFF
    assert java_string_hash(s) == (h - (1 << 32) if h & 0x80000000 else h)
