"""Encoded messages to Arrow record batches, vectorized: the analytics decoder.

`store.message.decode_message` is the canonical codec, one message per call;
Spark needs millions of rows per second from a Python worker, so this module
decodes a whole buffer of messages at once with numpy and Arrow compute: the
88-byte fixed part of every message is gathered in one numpy operation and read
as a structured array (the store's one definition of the layout,
`store.message.HEADER_DTYPE`, checked by the store's vectorized layout checks,
`store.message_batch.Frames`), variable-length fields (body, topic, properties)
become Arrow *view* arrays over the buffer that Arrow copies out in C++, and properties
are split with Arrow's string kernels. Only `walk`, which finds the boundaries
of concatenated messages, steps message by message, and only where sizes vary.

Checks (a failure raises `CorruptEntry`, never returns garbage): every message
lies whole inside the buffer, its totalSize matches the expected size (when
known: a consume-queue unit's size), magic code, supported sysFlag, body, topic
and properties lengths that add up to totalSize exactly, and, when the caller
knows them, the topic, queue id, queue offsets and commit-log offsets, either
one queue's (consecutive offsets) or per row (a read of many queues at once,
from a commit-log range); properties must be UTF-8 `name\\x01value\\x02`
pairs when a property column is decoded. Only the requested columns are built
(`columns`): a `topic`-only read gathers the fixed 88-byte part of each message,
checks it, and builds one string column. The body CRC is not recomputed here (it
would cost more than all the rest): a server checks it before it serves raw
entries (ReadLog, once per process); files are read as the node left them, as
`dledger verify` would check them.

The schema (`FIELDS`) is that of the `dledger` Spark source; `properties` holds
the message's properties except KEYS and TAGS, which have their own columns.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from store.arrays import windows
from store.errors import CorruptEntry
from store.message import (
    FIXED_PART_SIZE,
    HEADER_DTYPE,
    MAX_TOPIC_BYTES,
    MIN_MESSAGE_SIZE,
    PHYSICAL_OFFSET_POS,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    STORE_HOST_POS,
)
from store.message_batch import FAULTS, Frames

__all__ = [
    "ARROW_SCHEMA",
    "COLUMNS",
    "FIELDS",
    "SPARK_DDL",
    "Expected",
    "decode",
    "decode_heads",
    "empty_batch",
    "walk",
]

TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
# (name, Arrow type, Spark type): the source's schema, in order.
FIELDS: Final[tuple[tuple[str, pa.DataType, str], ...]] = (
    ("topic", pa.string(), "string"),
    ("queue_id", pa.int32(), "int"),
    ("queue_offset", pa.int64(), "bigint"),
    ("commitlog_offset", pa.int64(), "bigint"),
    ("msg_id", pa.string(), "string"),
    ("keys", pa.list_(pa.string()), "array<string>"),
    ("tags", pa.string(), "string"),
    ("properties", pa.map_(pa.string(), pa.string()), "map<string,string>"),
    ("born_timestamp", TIMESTAMP, "timestamp"),
    ("store_timestamp", TIMESTAMP, "timestamp"),
    ("body", pa.binary(), "binary"),
    ("body_size", pa.int32(), "int"),
)
COLUMNS: Final = tuple(name for name, _, _ in FIELDS)
ARROW_TYPES: Final = {name: t for name, t, _ in FIELDS}
SPARK_TYPES: Final = {name: t for name, _, t in FIELDS}
ARROW_SCHEMA: Final = pa.schema([pa.field(name, t) for name, t, _ in FIELDS])
SPARK_DDL: Final = ", ".join(f"{name} {t}" for name, _, t in FIELDS)

_I32 = struct.Struct(">i")
_MIN_RUN = 8  # equal-size messages worth a vectorized stride in `walk`
_MAX_RUN = 1 << 16
_SCALAR_STEPS = 256

_AR12 = np.arange(12, dtype=np.int64)
# Byte -> its two hex digits, as one uint16 whose memory holds them in order.
_HEX2 = np.frombuffer(b"".join(f"{b:02X}".encode() for b in range(256)), np.uint16)
_PROPERTY_COLUMNS = frozenset({"keys", "tags", "properties"})
# After tails laid end to end: the layout checks of a bad one may read this far past it.
_TAIL_PAD = bytes(1 + MAX_TOPIC_BYTES + 2 + 8)
# Arrow's binary view: a value of up to 12 bytes inline, a longer one by reference.
_VIEW = np.dtype([("length", "<i4"), ("inline", "V12")])
_LONG_VIEW = np.dtype([("length", "<i4"), ("prefix", "V4"), ("buffer", "<i4"), ("offset", "<i4")])
_KEEP = np.tril(np.ones((13, 12), np.uint8), -1)  # row k: k ones, then zeros

Int64s = npt.NDArray[np.int64]
Ints = npt.NDArray[np.int32]
Bytes = npt.NDArray[np.uint8]


class Expected:
    """What the caller knows about the messages it asks `decode` to check against.

    One queue's run: `topic`, `queue_id`, `first_queue_offset` (the rest follow
    consecutively). Rows of many queues: `topics` (the distinct names) with
    `topic_codes` (per row, an index into `topics`), `queue_ids` and
    `queue_offsets` per row. `sizes` and `commitlog_offsets` (consume-queue units)
    are per row in both cases.
    """

    __slots__ = (
        "commitlog_offsets",
        "first_queue_offset",
        "queue_id",
        "queue_ids",
        "queue_offsets",
        "sizes",
        "topic",
        "topic_codes",
        "topics",
    )

    def __init__(
        self,
        *,
        topic: str | None = None,
        queue_id: int | None = None,
        first_queue_offset: int | None = None,
        sizes: Ints | None = None,
        commitlog_offsets: Int64s | None = None,
        topics: Sequence[str] | None = None,
        topic_codes: Ints | None = None,
        queue_ids: Ints | None = None,
        queue_offsets: Int64s | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.first_queue_offset = first_queue_offset
        self.sizes = sizes
        self.commitlog_offsets = commitlog_offsets
        self.topics = tuple(topics) if topics is not None else None
        self.topic_codes = topic_codes
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets
        if (topics is None) != (topic_codes is None):
            raise ValueError("give topics and topic_codes together")

    def take(self, rows: npt.NDArray[np.int64] | slice) -> Expected:
        """The expectations of a subset of the rows (per-row fields only)."""

        def pick(a: npt.NDArray[Any] | None) -> npt.NDArray[Any] | None:
            return None if a is None else a[rows]

        return Expected(
            topic=self.topic,
            queue_id=self.queue_id,
            sizes=pick(self.sizes),
            commitlog_offsets=pick(self.commitlog_offsets),
            topics=self.topics,
            topic_codes=pick(self.topic_codes),
            queue_ids=pick(self.queue_ids),
            queue_offsets=pick(self.queue_offsets),
        )


def walk(raw: bytes | memoryview, where: str = "message buffer") -> Int64s:
    """Start offsets of the messages concatenated in `raw` (each begins with its totalSize).

    Runs of equal-size messages (common: one queue, one producer) are found with
    numpy, a stride at a time; sizes that vary are walked one message at a time.
    """
    end = len(raw)
    arr = np.frombuffer(raw, np.uint8)
    parts: list[Int64s] = []
    single: list[int] = []
    unpack = _I32.unpack_from
    off = 0
    try:
        while off < end:
            size = unpack(raw, off)[0]
            if size < MIN_MESSAGE_SIZE:
                raise CorruptEntry(where, off, f"message size {size} is impossible")
            k = _equal_run(arr, off, size, min((end - off) // size, _MAX_RUN))
            if k >= _MIN_RUN:
                if single:
                    parts.append(np.asarray(single, np.int64))
                    single = []
                parts.append(off + size * np.arange(k, dtype=np.int64))
                off += k * size
                continue
            for _ in range(_SCALAR_STEPS):  # sizes vary here: walk them one by one
                single.append(off)
                off += size
                if off >= end:
                    break
                size = unpack(raw, off)[0]
                if size < MIN_MESSAGE_SIZE:
                    raise CorruptEntry(where, off, f"message size {size} is impossible")
    except struct.error:
        raise CorruptEntry(where, off, "truncated message header") from None
    if single:
        parts.append(np.asarray(single, np.int64))
    starts = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if off != end:
        raise CorruptEntry(where, int(starts[-1]), f"message overruns the buffer end {end}")
    return starts


def _equal_run(arr: Bytes, off: int, size: int, limit: int) -> int:
    """How many messages of `size` follow one another from `off` (at most `limit`), galloping."""
    k, step = 0, 16
    while k < limit:
        m = min(step, limit - k)
        same = _i32_at(arr, off + size * np.arange(k, k + m, dtype=np.int64)) == size
        if not same.all():
            return k + int(np.argmin(same))
        k, step = k + m, step * 4
    return k


def _i32_at(arr: Bytes, pos: Int64s) -> Ints:
    """Big-endian i32 at each position (all within `arr`)."""
    out: Ints = windows(arr, 4)[pos].view(">i4")
    return out


def empty_batch(columns: Sequence[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([], ARROW_TYPES[c]) for c in columns], names=list(columns)
    )


def decode(
    buf: bytes | pa.Buffer,
    starts: Int64s,
    columns: Sequence[str] = COLUMNS,
    expected: Expected | None = None,
    where: str = "message buffer",
) -> pa.RecordBatch:
    """The messages at `buf[starts[i]:]` as a record batch of `columns` (see the module doc)."""
    return _Decoder(buf, starts, expected or Expected(), where).batch(columns)


def decode_heads(
    heads: bytes,
    tails: bytes,
    tail_offsets: bytes,
    offsets: Int64s,
    columns: Sequence[str],
    expected: Expected | None = None,
    where: str = "message heads",
) -> pa.RecordBatch:
    """Messages sent without their bodies (ReadLog's heads: `heads`, each message's
    88-byte fixed part; `tails`, what follows each body, end to end, cut at
    `tail_offsets`, little-endian int32) as a record batch of `columns`, which must
    not hold `body`. Checked as `decode` checks whole messages, the tail's length
    against totalSize included; `offsets` (where each message lies) name a bad one."""
    if "body" in columns:
        raise ValueError("the body column needs whole messages (decode)")
    n = len(offsets)
    if len(heads) != n * FIXED_PART_SIZE or len(tail_offsets) != (n + 1) * 4:
        raise CorruptEntry(
            where, int(offsets[0]) if n else 0, f"{len(heads)} bytes of heads for {n} messages"
        )
    ends = np.frombuffer(tail_offsets, "<i4").astype(np.int64)
    if ends[0] != 0 or (np.diff(ends) < 0).any() or ends[-1] != len(tails):
        raise CorruptEntry(where, int(offsets[0]) if n else 0, "tail offsets do not add up")
    return _Decoder(
        tails + _TAIL_PAD, offsets, expected or Expected(), where, heads=(heads, ends)
    ).batch(columns)


class _Decoder:
    """Whole messages at `starts` in `buf`; or, given `heads` (fixed parts, tail ends),
    their tails laid end to end in `buf` and `starts` where they lie in the log."""

    def __init__(
        self,
        buf: bytes | pa.Buffer,
        starts: Int64s,
        exp: Expected,
        where: str,
        heads: tuple[bytes, Int64s] | None = None,
    ) -> None:
        self.data = buf if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)
        self.arr: Bytes = np.frombuffer(self.data, dtype=np.uint8)
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.n = len(self.starts)
        self.exp = exp
        self.where = where
        self._heads = heads
        self._check_layout()

    def _frames(self) -> Frames:
        if self._heads is None:
            return Frames.in_buffer(self.arr, self.starts)
        raw, ends = self._heads
        head = np.frombuffer(raw, HEADER_DTYPE)
        tail_len = np.diff(ends)
        body_len = head["body_length"].astype(np.int64)
        # Room as if the body were there: a tail of another length than totalSize says
        # fails as a totalSize overrunning the buffer would.
        room = FIXED_PART_SIZE + np.maximum(body_len, 0) + tail_len
        frames = Frames(head, room)
        frames.checks[2] |= frames.total_size != room
        frames.bad |= frames.checks[2]
        frames.check_tail(self.arr, ends[:-1].copy(), ends[1:])
        return frames

    def _fail(self, bad: npt.NDArray[np.bool_], reason: str) -> None:
        if bad.any():
            i = int(np.argmax(bad))
            raise CorruptEntry(self.where, int(self.starts[i]), f"message {i}: {reason}")

    def _check_layout(self) -> None:
        arr, exp = self.arr, self.exp
        if self.n == 0:
            return
        if len(arr) >= 2**31:
            raise ValueError("decode buffers are limited to 2 GiB")
        # One gather of every fixed part, then fields are views into it; the layout
        # checks are the store's (in its order, the expected size after the first).
        frames = self._frames()
        self._fail(frames.checks[0], FAULTS[0])
        head = self.head = frames.head
        self.head_bytes = head.view(np.uint8).reshape(self.n, FIXED_PART_SIZE)
        if exp.sizes is not None:
            self._fail(frames.total_size != exp.sizes, "totalSize differs from the expected size")
        for check, reason in zip(frames.checks[1:], FAULTS[1:], strict=True):
            self._fail(check, reason)
        body_len, topic_len, props_len = (
            frames.body_length,
            frames.topic_length,
            frames.properties_length,
        )
        body_end, topic_end, end = frames.body_end, frames.topic_end, frames.end
        self.body_len, self.topic_len, self.props_len = body_len, topic_len, props_len
        self.body_end, self.topic_end = body_end, topic_end
        if exp.queue_id is not None:
            self._fail(head["queue_id"] != exp.queue_id, f"queue id is not {exp.queue_id}")
        if exp.queue_ids is not None:
            self._fail(head["queue_id"] != exp.queue_ids, "queue id differs from its unit's queue")
        if exp.first_queue_offset is not None:
            first = exp.first_queue_offset
            want = np.arange(first, first + self.n, dtype=np.int64)
            self._fail(head["queue_offset"] != want, "queue offsets are not consecutive")
        if exp.queue_offsets is not None:
            bad = head["queue_offset"] != exp.queue_offsets
            self._fail(bad, "queue offset differs from its unit's offset")
        if exp.commitlog_offsets is not None:
            bad = head["physical_offset"] != exp.commitlog_offsets
            self._fail(bad, "physical offset differs from its unit")
        if exp.topic is not None:
            raw = exp.topic.encode()
            self._fail(topic_len != len(raw), f"topic is not {exp.topic!r}")
            got = windows(arr, len(raw))[body_end + 1]
            self._fail(got != np.frombuffer(raw, f"V{len(raw)}")[0], "topic differs")
        if exp.topics is not None and exp.topic_codes is not None:
            self._check_topics(exp.topics, exp.topic_codes)
        self.end = end

    def _check_topics(self, topics: tuple[str, ...], codes: Ints) -> None:
        """Each row's topic is topics[codes[row]]: one vectorized compare per topic."""
        arr = self.arr
        encoded = [t.encode() for t in topics]
        lengths = np.fromiter((len(b) for b in encoded), np.int64, len(encoded))
        self._fail(self.topic_len != lengths[codes], "topic differs from its unit's topic")
        for code, raw in enumerate(encoded):
            rows = np.flatnonzero(codes == code) if len(encoded) > 1 else None
            at = self.body_end + 1 if rows is None else self.body_end[rows] + 1
            if len(at) == 0:
                continue
            got = windows(arr, len(raw))[at]
            bad = got != np.frombuffer(raw, f"V{len(raw)}")[0]
            if bad.any():
                row = int(np.argmax(bad)) if rows is None else int(rows[np.argmax(bad)])
                raise CorruptEntry(
                    self.where,
                    int(self.starts[row]),
                    f"message {row}: topic is not {topics[code]!r}",
                )

    # -- columns ---------------------------------------------------------------

    def batch(self, columns: Sequence[str]) -> pa.RecordBatch:
        if self.n == 0:
            return empty_batch(columns)
        props = self._properties() if _PROPERTY_COLUMNS & set(columns) else {}
        arrays = []
        for c in columns:
            if c in props:
                arrays.append(props[c])
            else:
                arrays.append(getattr(self, "_col_" + c)())
        return pa.RecordBatch.from_arrays(arrays, names=list(columns))

    def _col_topic(self) -> pa.Array:
        exp = self.exp
        if exp.topics is not None and exp.topic_codes is not None:
            return pa.array(exp.topics, pa.string()).take(pa.array(exp.topic_codes))
        if self.exp.topic is not None:
            raw = self.exp.topic.encode()
            offsets = np.arange(self.n + 1, dtype=np.int32) * len(raw)
            return pa.Array.from_buffers(
                pa.string(), self.n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * self.n)]
            )
        return self._text(self.body_end + 1, self.topic_len, "topic")

    def _col_queue_id(self) -> pa.Array:
        if self.exp.queue_id is not None:
            return pa.array(np.full(self.n, self.exp.queue_id, np.int32))
        if self.exp.queue_ids is not None:
            return pa.array(self.exp.queue_ids.astype(np.int32))
        return pa.array(self.head["queue_id"].astype(np.int32))

    def _col_queue_offset(self) -> pa.Array:
        return pa.array(self.head["queue_offset"].astype(np.int64))

    def _col_commitlog_offset(self) -> pa.Array:
        return pa.array(self.head["physical_offset"].astype(np.int64))

    def _col_msg_id(self) -> pa.Array:
        """RocketMQ's id: store host (IPv4, port) and commit-log offset, 32 hex digits."""
        raw = np.empty((self.n, 16), np.uint8)
        raw[:, :8] = self.head_bytes[:, STORE_HOST_POS : STORE_HOST_POS + 8]
        raw[:, 8:] = self.head_bytes[:, PHYSICAL_OFFSET_POS : PHYSICAL_OFFSET_POS + 8]
        text = _HEX2[raw]  # (n, 16) uint16: 32 characters a row
        offsets = np.arange(self.n + 1, dtype=np.int32) * 32
        return pa.Array.from_buffers(
            pa.string(), self.n, [None, pa.py_buffer(offsets), pa.py_buffer(text)]
        )

    def _timestamp(self, field: str) -> pa.Array:
        return pa.array(self.head[field].astype(np.int64) * 1000, TIMESTAMP)

    def _col_born_timestamp(self) -> pa.Array:
        return self._timestamp("born_timestamp_ms")

    def _col_store_timestamp(self) -> pa.Array:
        return self._timestamp("store_timestamp_ms")

    def _col_body(self) -> pa.Array:
        assert self._heads is None, "heads carry no bodies"
        return self._binary(self.starts + FIXED_PART_SIZE, self.body_len)

    def _col_body_size(self) -> pa.Array:
        return pa.array(self.body_len.astype(np.int32))

    # -- variable-length fields --------------------------------------------------

    def _binary(self, starts: Int64s, lengths: Int64s) -> pa.Array:
        """`buf[starts[i] : starts[i] + lengths[i]]` as a binary array, built in C++."""
        views = _view_structs(self.arr, starts, lengths)
        view = pa.Array.from_buffers(
            pa.binary_view(), self.n, [None, pa.py_buffer(views), self.data]
        )
        return view.cast(pa.binary())

    def _text(self, starts: Int64s, lengths: Int64s, what: str) -> pa.Array:
        try:
            return self._binary(starts, lengths).cast(pa.string())
        except pa.ArrowInvalid:
            bad = np.zeros(self.n, bool)
            for i, v in enumerate(self._binary(starts, lengths).to_pylist()):
                try:
                    bytes(v).decode()
                except UnicodeDecodeError:
                    bad[i] = True
            self._fail(bad, f"{what} is not UTF-8")
            raise

    def _properties(self) -> dict[str, pa.Array]:
        """keys, tags and properties, from every message's `name\\x01value\\x02` pairs.

        The properties of all messages are copied out once (checked as UTF-8) and lie
        end to end, each message's ending with a separator. The separators are found
        with numpy; well-formed, they alternate \\x01, \\x02 (checked), and one string
        array over the copy, cut at them, holds every name, separator and value
        (pieces of UTF-8 cut at ASCII bytes are UTF-8), from which the columns are
        taken."""
        n = self.n
        # The properties end with a separator when there are any.
        has_props = self.props_len > 0
        last = self.arr[np.where(has_props, self.end - 1, self.body_end)]
        self._fail(has_props & (last != 2), "properties do not end with a separator")
        text = self._text(self.topic_end + 2, self.props_len, "properties")
        data = text.buffers()[2] or pa.py_buffer(b"")
        raw: Bytes = np.frombuffer(data, np.uint8)
        text_offsets = np.frombuffer(text.buffers()[1], np.int32, n + 1, text.offset * 4)
        seps = np.flatnonzero((raw - np.uint8(1)) < 2)  # every \x01 and \x02
        kinds = raw[seps]
        if len(seps) % 2 or (kinds[0::2] != 1).any() or (kinds[1::2] != 2).any():
            self._fail_pairs(raw, text_offsets)
        mid, ends = seps[0::2], seps[1::2]  # each pair's \x01 and \x02
        starts = np.empty(len(ends), np.int64)  # where each pair starts
        starts[:1] = 0
        starts[1:] = ends[:-1] + 1
        per_row = np.diff(np.searchsorted(ends, text_offsets))
        parent = np.repeat(np.arange(n, dtype=np.int64), per_row)
        name_len = mid - starts
        if (name_len == 0).any():
            empty_name = np.zeros(n, bool)
            empty_name[parent[name_len == 0]] = True
            self._fail(empty_name, "empty property name")
        # Pieces 4j..4j+3: name j, \x01, value j, \x02.
        cuts = np.empty((len(ends), 4), np.int32)
        cuts[:, 0], cuts[:, 1], cuts[:, 2], cuts[:, 3] = starts, mid, mid + 1, ends
        cuts_flat = np.append(cuts.ravel(), np.int32(len(raw)))
        pieces = pa.Array.from_buffers(
            pa.string(), len(cuts_flat) - 1, [None, pa.py_buffer(cuts_flat), data]
        )
        is_keys, is_tags = (
            _is_name(raw, starts, name_len, name) for name in (PROPERTY_KEYS, PROPERTY_TAGS)
        )

        def value_of(hit: npt.NDArray[np.bool_]) -> pa.Array:
            """Per row, the value of its (last) pair where `hit`, null where none."""
            idx = np.full(n, -1, np.int64)
            idx[parent[hit]] = np.flatnonzero(hit) * 4 + 2
            return pieces.take(pa.array(idx, mask=idx < 0))

        tags = value_of(is_tags)
        split = pc.split_pattern(value_of(is_keys), " ")
        key_items = split.flatten()
        key_parent = np.asarray(pc.list_parent_indices(split), dtype=np.int64)
        nonempty = np.asarray(pc.not_equal(key_items, ""), dtype=bool)
        keys = pa.ListArray.from_arrays(
            _offsets(key_parent[nonempty], n), key_items.filter(pa.array(nonempty))
        )
        other = np.flatnonzero(~(is_keys | is_tags))
        properties = pa.MapArray.from_arrays(
            _offsets(parent[other], n), pieces.take(other * 4), pieces.take(other * 4 + 2)
        )
        return {"keys": keys, "tags": tags, "properties": properties}

    def _fail_pairs(self, raw: Bytes, offsets: Ints) -> None:
        """Raise for the first message with a property that is not one name\\x01value pair."""
        bad = np.zeros(self.n, bool)
        for row in range(self.n):
            items = raw[offsets[row] : offsets[row + 1]].tobytes().split(b"\x02")[:-1]
            bad[row] = any(item.count(b"\x01") != 1 for item in items)
        self._fail(bad, "a property is not one name\\x01value pair")
        raise AssertionError("separators out of order, yet every property is a pair")


def _is_name(raw: Bytes, starts: Int64s, lengths: Int64s, name: str) -> npt.NDArray[np.bool_]:
    """Which segments `raw[starts[i] : starts[i] + lengths[i]]` are `name` (ASCII)."""
    want = name.encode()
    hit: npt.NDArray[np.bool_] = lengths == len(want)
    if hit.any():
        at = np.flatnonzero(hit)
        hit[at] = windows(raw, len(want))[starts[at]] == np.frombuffer(want, f"V{len(want)}")[0]
    return hit


def _view_structs(arr: Bytes, starts: Int64s, lengths: Int64s) -> npt.NDArray[np.void]:
    """Arrow's 16-byte binary-view structs of `arr[starts[i] : starts[i] + lengths[i]]`
    (data buffer 0 is the buffer `arr` views): the length, then the bytes inline up to
    12, else a 4-byte prefix, buffer 0 and the offset."""
    n = len(starts)
    views = np.zeros(n, _VIEW)
    if not n or not len(arr):  # (an empty buffer holds only empty values)
        return views
    views["length"] = lengths
    room = len(arr) - 12
    near = starts > room
    if not near.any():
        views["inline"] = windows(arr, 12)[starts]
    else:  # the last few bytes of the buffer: those byte by byte
        far = ~near
        if room >= 0:
            views["inline"][far] = windows(arr, 12)[starts[far]]
        tail = arr[np.minimum(starts[near][:, None] + _AR12, len(arr) - 1)]
        views["inline"][near] = tail.view("V12")[:, 0]
    inline = views.view(np.uint8).reshape(n, 16)[:, 4:]
    np.multiply(inline, _KEEP[np.minimum(lengths, 12)], out=inline)  # zero past the value
    long = lengths > 12
    if long.any():
        as_long = views.view(_LONG_VIEW)
        as_long["buffer"] = np.where(long, 0, as_long["buffer"])
        as_long["offset"] = np.where(long, starts, as_long["offset"])
    return views


def _offsets(parent: Int64s, n: int) -> pa.Array:
    counts = np.bincount(parent, minlength=n)
    out = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=out[1:])
    return pa.array(out)
