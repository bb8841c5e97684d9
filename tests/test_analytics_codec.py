"""The vectorized analytics decoder agrees with the canonical codec and refuses bad bytes."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.codec import ARROW_SCHEMA, COLUMNS, Expected, decode, decode_heads, walk
from dledger_commitlog.log.message_layout import make_msg_id
from store.errors import CorruptEntry
from store.message import (
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    StoredMessage,
    decode_message,
    encode_message,
    make_properties,
)

TOPIC = "orders"


def message(
    k: int,
    *,
    topic: str = TOPIC,
    queue_id: int = 3,
    body: bytes | None = None,
    keys: Sequence[str] = (),
    tags: str | None = None,
    extra: dict[str, str] | None = None,
) -> StoredMessage:
    return StoredMessage(
        topic=topic,
        body=f"body {k}".encode() * (k % 4) if body is None else body,
        properties=make_properties(tags=tags, keys=keys, uniq_key=f"{k:032X}", extra=extra),
        queue_id=queue_id,
        queue_offset=100 + k,
        physical_offset=5000 + 1000 * k,
        born_timestamp_ms=1_700_000_000_000 + k,
        store_timestamp_ms=1_700_000_000_500 + k,
        store_host=("10.1.2.3", 7001),
    )


def expected_row(m: StoredMessage) -> dict[str, Any]:
    """What the source must produce for `m`, from the canonical decoder's view of it."""
    return {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "commitlog_offset": m.physical_offset,
        "msg_id": make_msg_id(m.store_host, m.physical_offset),
        "keys": m.keys,
        "tags": m.tags,
        "properties": {k: v for k, v in m.properties.items() if k not in ("KEYS", "TAGS")},
        "born_timestamp_ms": m.born_timestamp_ms,
        "store_timestamp_ms": m.store_timestamp_ms,
        "body": m.body,
        "body_size": len(m.body),
    }


def rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    out = []
    for r in batch.to_pylist():
        if "properties" in r:
            r["properties"] = dict(r["properties"])
        for name in ("born_timestamp", "store_timestamp"):
            if name in r:
                ts = r.pop(name)
                r[name + "_ms"] = round(ts.timestamp() * 1000)
        out.append(r)
    return out


def concat(msgs: Sequence[StoredMessage]) -> bytes:
    return b"".join(encode_message(m) for m in msgs)


# ---------------------------------------------------------------- agreement

topics = st.text("abcXYZ019_-%|", min_size=1, max_size=20)
words = st.text(st.characters(codec="utf-8", exclude_characters="\x00\x01\x02 "), max_size=12)
messages = st.builds(
    lambda k, topic, body, keys, tags, extra: message(
        k, topic=topic, queue_id=k % 5, body=body, keys=keys, tags=tags, extra=extra
    ),
    st.integers(0, 10**6),
    topics,
    st.binary(max_size=300),
    st.lists(words.filter(bool), max_size=3),
    st.none() | words.filter(bool),
    st.dictionaries(
        words.filter(lambda w: bool(w) and w not in ("KEYS", "TAGS", "UNIQ_KEY")),
        words,
        max_size=3,
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(messages, min_size=1, max_size=40))
def test_decoded_rows_equal_the_canonical_codec(msgs: list[StoredMessage]) -> None:
    raw = concat(msgs)
    starts = walk(raw)
    assert starts.tolist() == np.cumsum([0, *(len(encode_message(m)) for m in msgs)])[:-1].tolist()
    batch = decode(raw, starts)
    assert batch.schema == ARROW_SCHEMA
    assert rows(batch) == [expected_row(decode_message(encode_message(m))) for m in msgs]


def test_walk_finds_runs_of_equal_sizes_and_the_sizes_between_them() -> None:
    same = [message(1, body=b"x" * 50) for _ in range(40)]
    varied = [message(k, body=b"y" * k) for k in range(300)]
    other = [message(2, body=b"z" * 70) for _ in range(20)]
    encoded = [encode_message(m) for m in [*same, *varied, *other, *same[:3]]]
    raw = b"".join(encoded)
    assert walk(raw).tolist() == np.cumsum([0, *map(len, encoded)])[:-1].tolist()
    with pytest.raises(CorruptEntry, match="overruns"):
        walk(raw[:-1])
    with pytest.raises(CorruptEntry, match="impossible"):
        walk(raw[: len(raw) - len(encoded[-1])] + bytes(len(encoded[-1])))


def test_a_column_subset_decodes_only_those_columns_in_the_order_asked() -> None:
    msgs = [message(k, keys=[f"k{k}"], tags="T") for k in range(10)]
    raw = concat(msgs)
    batch = decode(raw, walk(raw), ["body_size", "topic", "keys"])
    assert batch.schema.names == ["body_size", "topic", "keys"]
    assert batch.column("body_size").to_pylist() == [len(m.body) for m in msgs]
    assert batch.column("keys").to_pylist() == [[f"k{k}"] for k in range(10)]


def test_known_topic_and_queue_are_checked_and_used() -> None:
    msgs = [message(k) for k in range(20)]
    raw = concat(msgs)
    exp = Expected(topic=TOPIC, queue_id=3, first_queue_offset=100)
    batch = decode(raw, walk(raw), COLUMNS, exp)
    assert rows(batch) == [expected_row(m) for m in msgs]


def test_messages_need_not_be_contiguous_when_sizes_are_known() -> None:
    """Offline reads decode straight out of a segment: messages with gaps between them."""
    msgs = [message(k) for k in range(5)]
    gap = b"\xee" * 48
    raw = b"".join(gap + encode_message(m) for m in msgs)
    sizes = np.array([len(encode_message(m)) for m in msgs], np.int32)
    starts = np.cumsum([48, *(int(s) + 48 for s in sizes)])[:-1].astype(np.int64)
    exp = Expected(sizes=sizes, commitlog_offsets=np.array([m.physical_offset for m in msgs]))
    assert rows(decode(raw, starts, COLUMNS, exp)) == [expected_row(m) for m in msgs]


def test_empty_input_gives_an_empty_batch_of_the_asked_columns() -> None:
    batch = decode(b"", walk(b""), ["topic", "body"])
    assert batch.num_rows == 0
    assert batch.schema.names == ["topic", "body"]


# ---------------------------------------------------------------- refusals


def patched(raw: bytes, at: int, fmt: str, value: int) -> bytes:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, at, value)
    return bytes(buf)


def test_walk_refuses_truncated_or_impossible_sizes() -> None:
    raw = concat([message(1), message(2)])
    with pytest.raises(CorruptEntry, match="overruns"):
        walk(raw[:-1])
    with pytest.raises(CorruptEntry, match="impossible"):
        walk(patched(raw, 0, ">i", 3))
    with pytest.raises(CorruptEntry, match="truncated"):
        walk(raw + b"\x00\x00")


@pytest.mark.parametrize(
    ("pos", "fmt", "value", "reason"),
    [
        (4, ">i", 0x12345678, "bad magic code"),
        (36, ">i", 1 << 4, "IPv6 sysFlag"),
        (84, ">i", 10_000, "body length overruns"),
        (84, ">i", -1, "body length overruns"),
    ],
)
def test_decode_refuses_bad_layouts(pos: int, fmt: str, value: int, reason: str) -> None:
    msgs = [message(1), message(2)]
    raw = concat(msgs)
    second = len(encode_message(msgs[0]))
    with pytest.raises(CorruptEntry, match=reason) as info:
        decode(patched(raw, second + pos, fmt, value), walk(raw))
    assert info.value.offset == second


def test_decode_refuses_messages_that_are_not_the_expected_ones() -> None:
    msgs = [message(k) for k in range(3)]
    raw = concat(msgs)
    starts = walk(raw)
    with pytest.raises(CorruptEntry, match="topic"):
        decode(raw, starts, COLUMNS, Expected(topic="payments"))
    with pytest.raises(CorruptEntry, match="queue id"):
        decode(raw, starts, COLUMNS, Expected(queue_id=4))
    with pytest.raises(CorruptEntry, match="consecutive"):
        decode(raw, starts, COLUMNS, Expected(first_queue_offset=101))
    sizes = np.array([len(encode_message(m)) for m in msgs], np.int32)
    with pytest.raises(CorruptEntry, match="totalSize differs"):
        decode(raw, starts, COLUMNS, Expected(sizes=sizes + 1))
    phys = np.array([m.physical_offset for m in msgs], np.int64)
    with pytest.raises(CorruptEntry, match="physical offset"):
        decode(raw, starts, COLUMNS, Expected(commitlog_offsets=phys + 20))
    # Patching the fields the expectations check makes the same bytes acceptable.
    fixed = patched(patched(raw, QUEUE_OFFSET_POS, ">q", 7), PHYSICAL_OFFSET_POS, ">q", 9)
    batch = decode(fixed, starts[:1], ["queue_offset", "commitlog_offset"])
    assert batch.to_pylist() == [{"queue_offset": 7, "commitlog_offset": 9}]


def test_decode_refuses_start_offsets_outside_the_buffer() -> None:
    raw = concat([message(1)])
    with pytest.raises(CorruptEntry, match="does not fit"):
        decode(raw, np.array([len(raw) - 10], np.int64))
    with pytest.raises(CorruptEntry, match="totalSize overruns the buffer"):
        decode(raw[:-5], np.array([0], np.int64))


def test_decode_refuses_properties_that_are_not_pairs_or_not_utf8() -> None:
    m = message(1, extra={"a": "b"})
    raw = encode_message(m)
    at = raw.index(b"a\x01b\x02")
    no_pair = raw[:at] + b"ab\x02\x02" + raw[at + 4 :]
    with pytest.raises(CorruptEntry, match="name\\\\x01value pair"):
        decode(no_pair, walk(no_pair), ["properties"])
    bad_utf8 = raw[:at] + b"\xff\x01b\x02" + raw[at + 4 :]
    with pytest.raises(CorruptEntry, match="not UTF-8"):
        decode(bad_utf8, walk(bad_utf8), ["properties"])
    no_separator = raw[:-1] + b"x"
    with pytest.raises(CorruptEntry, match="separator"):
        decode(no_separator, walk(no_separator), ["tags"])


# ---------------------------------------------------------------- heads (no bodies)


def heads_of(raw: bytes, starts: Sequence[int]) -> tuple[bytes, bytes, bytes]:
    """What a server answers for messages asked without their bodies."""
    heads, tails, ends = [], [], [0]
    for s in starts:
        total, body_len = (
            struct.unpack_from(">i", raw, s)[0],
            struct.unpack_from(">i", raw, s + 84)[0],
        )
        heads.append(raw[s : s + 88])
        tails.append(raw[s + 88 + body_len : s + total])
        ends.append(ends[-1] + len(tails[-1]))
    return b"".join(heads), b"".join(tails), np.asarray(ends, "<i4").tobytes()


NO_BODY = [c for c in COLUMNS if c != "body"]


@settings(max_examples=40, deadline=None)
@given(st.lists(messages, min_size=1, max_size=30))
def test_heads_decode_as_the_whole_messages_do(msgs: list[StoredMessage]) -> None:
    raw = concat(msgs)
    starts = walk(raw)
    offsets = np.asarray([m.physical_offset for m in msgs], np.int64)
    got = decode_heads(*heads_of(raw, starts.tolist()), offsets, NO_BODY)
    assert rows(got) == rows(decode(raw, starts, NO_BODY))


def test_heads_refuse_a_tail_that_is_not_the_rest_of_the_message() -> None:
    raw = concat([message(1, extra={"a": "b"}), message(2)])
    starts = walk(raw).tolist()
    heads, tails, ends = heads_of(raw, starts)
    offsets = np.asarray([5000, 6000], np.int64)
    cut = np.frombuffer(ends, "<i4").copy()
    cut[1:] -= 1  # the first tail one byte short
    with pytest.raises(CorruptEntry, match="message 0: totalSize"):
        decode_heads(
            heads, tails[: cut[1]] + tails[cut[1] + 1 :], cut.tobytes(), offsets, ["topic"]
        )
    with pytest.raises(CorruptEntry, match="tail offsets"):
        decode_heads(heads, tails + b"x", ends, offsets, ["topic"])
    with pytest.raises(ValueError, match="body"):
        decode_heads(heads, tails, ends, offsets, ["topic", "body"])
