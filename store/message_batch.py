"""Messages in batches, vectorized: the layout checks over many messages, and dispatch's peek.

`store.message` is the one codec of a message, message by message; its layout
(`HEADER_DTYPE`, positions, limits) is defined there. This module checks that
layout over many messages at once with numpy, for the two readers that take
messages by the thousand: dispatch (`peek_headers`) and the Spark decoder
(`analytics.codec`, through `Frames`).

`Frames` runs the checks of `store.message._parse_layout` (the fixed part: size,
magic code, sysFlag, body length; then the topic and properties lengths), in that
order, on every message of a batch; each check is a boolean column (`checks`,
reasons in `FAULTS`). A message failing one check may fail later ones spuriously
(they read what its bad sizes point at, clamped to stay in the buffer), so the
first check a batch fails, at the first message failing it, is what the scalar
codec says of that message.

`peek_headers` is `peek_header` over a batch (dispatch): numpy reads the fixed
fields, topics, properties and key hashes of all messages at once, and hands any
message it is not sure of (a layout, topic or properties check fails, non-ASCII
properties, a possible duplicate property name) to `peek_header` itself, so it
accepts, refuses and returns exactly what `peek_header` does message by message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from store.arrays import Bools, I64s, U8s, rows, windows
from store.message import (
    FIXED_PART_SIZE,
    HEADER_DTYPE,
    IPV6_FLAGS,
    KEY_SEPARATOR,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC_CODE,
    MIN_MESSAGE_SIZE,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    TOPIC_BYTES,
    java_string_hash,
    peek_header,
)

__all__ = [
    "FAULTS",
    "POW31_U32",
    "VECTOR_MIN_MESSAGES",
    "Frames",
    "HeaderBatch",
    "java_hashes",
    "peek_headers",
]

U32s = npt.NDArray[np.uint32]
_Buffer = bytes | bytearray | memoryview

# 31**k and 31**-k mod 2**32 for k < 2**16 (a property is at most 32767 bytes long).
POW31_U32: U32s = np.cumprod(
    np.r_[np.uint32(1), np.full((1 << 16) - 1, 31, np.uint32)], dtype=np.uint32
)
_INV31 = pow(31, -1, 1 << 32)
_INV31_POW: U32s = np.cumprod(
    np.r_[np.uint32(1), np.full((1 << 16) - 1, _INV31, np.uint32)], dtype=np.uint32
)
_HASH_WIDTH = 64  # segments up to this long are hashed as the rows of one matrix
_PROPS_WIDTH = 4096  # properties longer than this (or than 4x the mean) go one by one
# Pads the message tails laid end to end: gathers of topics and properties read past
# a message's end up to this far.
_PAD = bytes(FIXED_PART_SIZE + MAX_TOPIC_BYTES + _PROPS_WIDTH + 8)
_TOPIC_OK: Bools = np.zeros(256, np.bool_)
_TOPIC_OK[np.frombuffer(bytes(sorted(TOPIC_BYTES)), np.uint8)] = True
_NAME_KEYS, _NAME_TAGS, _NAME_UNIQ = (
    (name.encode(), java_string_hash(name) & 0xFFFFFFFF)
    for name in (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY)
)
_SPACE = ord(KEY_SEPARATOR)
_NO_KEYS: tuple[I64s, I64s, I64s] = (np.zeros(0, np.int64),) * 3
# Below this many messages per-message decoding is cheaper than numpy's per-call cost.
VECTOR_MIN_MESSAGES = 80


# -- the layout checks ---------------------------------------------------------------

# What each check of `Frames.checks` refuses, in the order `_parse_layout` checks.
FAULTS = (
    "does not fit in the buffer",
    "bad magic code",
    "totalSize overruns the buffer",
    "IPv6 sysFlag",
    "body length overruns totalSize",
    "bad topic length",
    "bad properties length",
)


class Frames:
    """Where the parts of each message of a batch lie, and which layout checks fail.

    Built in two steps, as a reader gets at the bytes: `Frames(head, room)` checks
    the fixed parts (a `HEADER_DTYPE` array, `room` bytes available from each
    message's start); `check_tail(arr, body_end, end)` then reads the topic and
    properties lengths at `body_end` in `arr` (where the caller has laid the
    messages' tails; `body_end` of a message already `bad` must still be a valid
    position, with two bytes after it). `in_buffer` does both for messages at
    `starts` in one buffer.
    """

    head: npt.NDArray[np.void]  # the fixed parts, as HEADER_DTYPE records
    checks: list[Bools]  # per reason of FAULTS (those checked so far): which fail it
    bad: Bools  # which fail any check so far
    total_size: I64s
    body_length: I64s
    # Set by check_tail, as positions in its `arr`:
    body_end: I64s  # the topic length byte
    end: I64s
    topic_length: I64s
    topic_end: I64s  # the properties length
    properties_length: I64s

    def __init__(self, head: npt.NDArray[np.void], room: I64s) -> None:
        self.head = head
        total = self.total_size = head["total_size"].astype(np.int64)
        body_len = self.body_length = head["body_length"].astype(np.int64)
        short = room < MIN_MESSAGE_SIZE
        magic = head["magic_code"] != MESSAGE_MAGIC_CODE
        size = (total < MIN_MESSAGE_SIZE) | (total > room)
        flags = (head["sys_flag"] & IPV6_FLAGS) != 0
        body = (body_len < 0) | (FIXED_PART_SIZE + body_len + 3 > total)
        self.checks = [short, magic, size, flags, body]
        self.bad = short | magic | size | flags | body

    @classmethod
    def in_buffer(cls, arr: U8s, starts: I64s) -> Frames:
        """The messages at `starts` in `arr` (any start: one outside is a fault)."""
        room = len(arr) - starts
        fit = (starts >= 0) & (room >= MIN_MESSAGE_SIZE)
        at = starts
        if not fit.all():  # gathered from 0 instead, and failing the first check
            at, room = np.where(fit, starts, 0), np.where(fit, room, 0)
        padded = arr if len(arr) >= MIN_MESSAGE_SIZE else np.zeros(MIN_MESSAGE_SIZE, np.uint8)
        frames = cls(windows(padded, FIXED_PART_SIZE)[at].view(HEADER_DTYPE), room)
        body_end = at + FIXED_PART_SIZE + frames.body_length
        if frames.bad.any():
            body_end[frames.bad] = at[frames.bad]
        frames.check_tail(padded, body_end, at + frames.total_size)
        return frames

    def check_tail(self, arr: U8s, body_end: I64s, end: I64s) -> None:
        """The topic and properties lengths, read at `body_end` in `arr`; `end`: where
        each message ends in `arr`."""
        bad = self.bad
        topic_len = arr[body_end].astype(np.int64)
        topic_end = body_end + 1 + topic_len
        topic = (topic_len == 0) | (topic_len > MAX_TOPIC_BYTES) | (topic_end + 2 > end)
        bad = bad | topic
        if bad.any():
            topic_end[bad] = body_end[bad]
        props_len = windows(arr, 2)[topic_end].view(">i2").astype(np.int64)  # one gather
        props = (props_len < 0) | (topic_end + 2 + props_len != end)
        self.checks += [topic, props]
        self.bad = bad | props
        self.body_end, self.end = body_end, end
        self.topic_length, self.topic_end, self.properties_length = topic_len, topic_end, props_len


# -- hashing -------------------------------------------------------------------------


def java_hashes(arr: U8s, starts: I64s, lens: I64s) -> U32s:
    """`java_string_hash` of ASCII byte segments of `arr` (unsigned 32-bit values)."""
    out = np.zeros(len(lens), np.uint32)
    width = int(lens.max()) if len(lens) else 0
    if not width:
        return out
    if width <= _HASH_WIDTH and int(starts.max()) + width <= len(arr):
        # Zero-padded on the right, a row hashes to h * 31^pad: multiply that back out.
        matrix = rows(arr, starts, width)
        matrix = np.where(np.arange(width) < lens[:, None], matrix, 0).astype(np.uint8)
        padded: U32s = np.dot(matrix, POW31_U32[width - 1 :: -1])
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


def _named(props: U8s, starts: I64s, lens: I64s, hashes: U32s, name: tuple[bytes, int]) -> Bools:
    """Which property names (segments of `props`, with their hashes) are exactly `name`
    (its bytes and hash)."""
    raw, want = name
    hit: Bools = (lens == len(raw)) & (hashes == want)
    if hit.any():
        at = np.flatnonzero(hit)
        hit[at] = windows(props, len(raw))[starts[at]] == np.frombuffer(raw, f"V{len(raw)}")[0]
    return hit


# -- peek_headers --------------------------------------------------------------------


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


def peek_headers(datas: Sequence[_Buffer], vector_min: int | None = None) -> HeaderBatch:
    """`peek_header` of each buffer (one whole message each), batched; the first message
    `peek_header` refuses raises its CorruptEntry, before anything is returned.

    Fewer than `vector_min` (default VECTOR_MIN_MESSAGES) are decoded one by one.
    """
    n = len(datas)
    if n < max(VECTOR_MIN_MESSAGES if vector_min is None else vector_min, 1):
        return _one_by_one(datas, np.ones(n, np.bool_), None)
    lens = np.fromiter(map(len, datas), np.int64, n)
    short = lens < MIN_MESSAGE_SIZE
    if short.any():
        heads = [
            d[:FIXED_PART_SIZE] if len(d) >= MIN_MESSAGE_SIZE else _PAD[:FIXED_PART_SIZE]
            for d in datas
        ]
    else:
        heads = [d[:FIXED_PART_SIZE] for d in datas]
    fixed = np.frombuffer(b"".join(heads), HEADER_DTYPE)
    frames = Frames(fixed, lens)  # a message failing a check is left to peek_header
    # The rest is read from the tails (topic and properties) laid end to end.
    cut = FIXED_PART_SIZE + frames.body_length
    cut[frames.bad] = lens[frames.bad]
    arr = np.frombuffer(
        b"".join([*(d[c:] for d, c in zip(datas, cut.tolist(), strict=True)), _PAD]), np.uint8
    )
    tail_len = lens - cut
    body_end = np.cumsum(tail_len) - tail_len
    total = frames.total_size
    frames.check_tail(arr, body_end, body_end + total - cut)
    slow, topic_len, topic_end = frames.bad, frames.topic_length, frames.topic_end
    props_len = frames.properties_length
    topic_len[slow] = 1
    # Topics: one zero-padded row of bytes each, checked and numbered in one go.
    width = int(topic_len.max())
    inside = np.arange(width) < topic_len[:, None]
    names = np.where(inside, rows(arr, body_end + 1, width), 0).astype(np.uint8)
    slow |= (inside & ~_TOPIC_OK[names]).any(axis=1)
    names[slow] = 0  # their topics come from peek_header
    found, topic_index = np.unique(names.view(f"V{width}")[:, 0], return_inverse=True)
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
        total,
        fixed["queue_id"].astype(np.int64),
        fixed["queue_offset"].astype(np.int64),
        fixed["store_timestamp_ms"].astype(np.int64),
        tags_code,
        topic_index.reshape(n).astype(np.int64),
        topics,
        *keys,
    )
    if slow.any():
        return _one_by_one(datas, slow, batch)
    return batch


def _properties(
    arr: U8s, props_at: I64s, props_len: I64s, slow: Bools
) -> tuple[I64s, tuple[I64s, I64s, I64s]]:
    """Tag codes and keys from the properties of the messages not `slow`: each a row
    of a zero-padded matrix. Messages the fast path cannot take are marked `slow` (in
    place): not ASCII, not `name \x01 value \x02` pairs, a possible duplicate name."""
    n = len(props_len)
    width = int(props_len.max())
    flat = np.zeros(n * width + max(width, _HASH_WIDTH), np.uint8)  # a margin for windows
    matrix = flat[: n * width].reshape(n, width)
    np.copyto(matrix, rows(arr, props_at, width), where=np.arange(width) < props_len[:, None])
    bad: Bools = np.asarray((matrix >= 0x80).any(axis=1))
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
        solid[:, 1:-1] = (rows(flat, keys_at, kw) != _SPACE) & (np.arange(kw) < keys_len[:, None])
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


def _one_by_one(datas: Sequence[_Buffer], which: Bools, batch: HeaderBatch | None) -> HeaderBatch:
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
