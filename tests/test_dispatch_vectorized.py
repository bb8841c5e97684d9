"""Batched dispatch against the per-message code it replaced, byte for byte.

- `peek_headers` (numpy over a batch) against `peek_header` of each message, on
  random messages and on corrupted ones: same fields, keys and hashes, or the same
  CorruptEntry;
- `IndexService.put_batch` against `put_message` of each message, on random
  batches over small files (rolls, messages larger than a file, replays, clock
  skew, a torn slot, reopens): the same file names and bytes;
- the dispatcher against the per-message `_apply` it had before, over the same
  log in random batches: the same consume queue and index files, group offsets
  and timestamps.

Randomized tests name their seed in every assertion message.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from dispatch import dispatcher
from dispatch.dispatcher import OFFSETS_TOPIC, Dispatcher, encode_offset_commit
from store import consume_queue, index_file, message_batch
from store.consume_queue import UNIT_DTYPE, ConsumeQueue, units_array
from store.errors import ConflictingWrite, CorruptEntry, OffsetOutOfRange
from store.index_file import IndexFile
from store.index_format import HEADER_SIZE, SLOT, build_key, index_key_hash, topic_key_hashes
from store.index_service import IndexService
from store.message import StoredMessage, encode_message, java_string_hash, peek_header
from store.message_batch import java_hashes, peek_headers
from tests.dispatch_helpers import files_of

T0 = 1_700_000_000_000


def small_or_large(monkeypatch: pytest.MonkeyPatch, seed: int) -> str:
    """Pick by seed how batches go: numpy for any size, per item for any, or as shipped
    (each step has a per-item path for small batches, where numpy's per-call cost rules)."""
    how = ("numpy", "per item", "shipped")[seed % 3]
    if how != "shipped":
        few = 0 if how == "numpy" else 10**9
        monkeypatch.setattr(message_batch, "VECTOR_MIN_MESSAGES", few)
        monkeypatch.setattr(consume_queue, "_FEW_UNITS", few)
        monkeypatch.setattr(index_file, "_FEW_ENTRIES", few)
        monkeypatch.setattr(dispatcher, "ONE_BY_ONE_MAX", 0 if how == "numpy" else few)
    return how


# Names whose Java hashCode equals another's: "Aa"/"BB", and "KEZ4", "TAH4",
# "UNIQ_KF:" collide with KEYS, TAGS, UNIQ_KEY (the fast path must compare bytes).
NAMES = ["Aa", "BB", "KEZ4", "TAH4", "UNIQ_KF:", "KEY", "KEYSX", "x", "TRAN_MSG"]
WORDS = ["a", "b", "k1", "user-7", "ü", "日本", "Aa", "BB", "x" * 70, "y" * 300, "😀"]


def _utf16_units(s: str) -> int:
    return len(s.encode("utf-16-be", "surrogatepass")) // 2


def random_message(
    rng: random.Random, i: int, topics: Sequence[str] = ("t0", "t1"), wild_times: bool = True
) -> StoredMessage:
    """Keys ASCII or not, long or short, empty words; names that collide with others."""
    props: dict[str, str] = {}
    if rng.random() < 0.85:
        words = [rng.choice(WORDS) for _ in range(rng.randrange(0, 4))]
        props["KEYS"] = rng.choice([" ", "", "  "]).join(words) + rng.choice(["", " "])
    if rng.random() < 0.7:
        props["TAGS"] = rng.choice(["TagA", "TagB", "", "é", "Aa"])
    if rng.random() < 0.85:
        props["UNIQ_KEY"] = rng.choice([f"U{i:08X}", "", "u v", "ü"])
    for _ in range(rng.randrange(0, 3)):
        props[rng.choice(NAMES)] = rng.choice(["", "1", "v\x03w", "z" * rng.randrange(0, 600)])
    ts = T0 + rng.randrange(10**6)
    if wild_times and rng.random() < 0.3:
        ts = rng.randrange(-(1 << 63), 1 << 63)
    return StoredMessage(
        topic=rng.choice(topics),
        body=rng.randbytes(rng.randrange(0, 40)),
        properties=props,
        queue_id=rng.randrange(-2, 6),
        queue_offset=rng.randrange(1 << 40),
        store_timestamp_ms=ts,
    )


def one_by_one(datas: Sequence[bytes]) -> list[tuple[object, ...]]:
    """What dispatch read of each message before: peek_header, keys hashed one by one."""
    rows: list[tuple[object, ...]] = []
    for data in datas:
        h = peek_header(data)
        keys = [*h.keys, h.uniq_key] if h.uniq_key else h.keys
        hashes = [(java_string_hash(k) & 0xFFFFFFFF, _utf16_units(k)) for k in keys]
        row = (h.total_size, h.queue_id, h.queue_offset, h.store_timestamp_ms, h.tags_code)
        rows.append((*row, h.topic, hashes))
    return rows


def batched(datas: Sequence[bytes], vector_min: int) -> list[tuple[object, ...]]:
    b = peek_headers(datas, vector_min)
    assert list(b.key_message) == sorted(b.key_message.tolist())
    rows: list[tuple[object, ...]] = []
    for i in range(len(datas)):
        at = np.flatnonzero(b.key_message == i).tolist()
        hashes = [(int(b.key_hash[k]), int(b.key_units[k])) for k in at]
        row = (
            b.total_size[i],
            b.queue_id[i],
            b.queue_offset[i],
            b.store_timestamp_ms[i],
            b.tags_code[i],
        )
        rows.append((*(int(v) for v in row), b.topics[b.topic_index[i]], hashes))
    return rows


def outcome(f: object, *args: object) -> tuple[object, str | None]:
    try:
        return f(*args), None  # type: ignore[operator]
    except CorruptEntry as exc:
        return None, str(exc)


@pytest.mark.parametrize("seed", range(6))
def test_peek_headers_is_peek_header_of_each_message(seed: int) -> None:
    rng = random.Random(seed)
    for trial in range(40):
        datas = [encode_message(random_message(rng, i)) for i in range(rng.randrange(0, 80))]
        want = one_by_one(datas)
        for vector_min in (0, 24, 10**9):
            assert batched(datas, vector_min) == want, f"seed {seed} trial {trial} {vector_min}"


@pytest.mark.parametrize("seed", range(6))
def test_peek_headers_refuses_what_peek_header_refuses(seed: int) -> None:
    """Corrupt one message of a batch (a byte set, cut, grown): the batch decodes to
    what peek_header gives each message, or raises peek_header's CorruptEntry."""
    rng = random.Random(seed)
    refused = 0
    for trial in range(300):
        datas = [encode_message(random_message(rng, i)) for i in range(rng.randrange(1, 40))]
        k = rng.randrange(len(datas))
        raw = bytearray(datas[k])
        for _ in range(rng.randrange(1, 3)):
            what = rng.random()
            if what < 0.7 and raw:
                raw[rng.randrange(len(raw))] = rng.choice(
                    [0, 1, 2, 32, 0x80, 0xFF, rng.randrange(256)]
                )
            elif what < 0.85:
                del raw[rng.randrange(len(raw) + 1) :]
            else:
                raw += bytes([rng.randrange(256)])
        datas[k] = bytes(raw)
        want = outcome(one_by_one, datas)
        refused += want[1] is not None
        assert outcome(batched, datas, 0) == want, f"seed {seed} trial {trial}"
    assert refused > 50, f"seed {seed}: only {refused} corruptions were refused"


def test_duplicate_property_names_are_refused_in_a_batch() -> None:
    good = encode_message(StoredMessage("t", b"x", {"KEYS": "a", "Aa": "1", "BB": "2"}))
    assert batched([good] * 30, 0) == one_by_one([good] * 30)  # a hash collision, not a twin
    props = b"KEYS\x01a\x02Aa\x011\x02KEYS\x01b\x02"
    at = good.index(b"KEYS\x01a\x02")
    twin = bytearray(good[:at] + props)
    twin[0:4] = len(twin).to_bytes(4, "big")
    twin[at - 2 : at] = len(props).to_bytes(2, "big")
    with pytest.raises(CorruptEntry, match="duplicate or empty property name"):
        peek_headers([good] * 29 + [bytes(twin)], 0)


def test_java_hashes_of_short_and_long_segments() -> None:
    rng = random.Random(7)
    text = "".join(rng.choice("abcXYZ09 #-_") for _ in range(5000)).encode()
    arr = np.frombuffer(text, np.uint8)
    for top in (0, 1, 8, 64, 65, 700):
        lens = np.array([rng.randrange(top + 1) for _ in range(50)], np.int64)
        starts = np.array([rng.randrange(len(text) - int(n)) for n in lens], np.int64)
        got = java_hashes(arr, starts, lens).tolist()
        want = [
            java_string_hash(text[s : s + n].decode()) & 0xFFFFFFFF
            for s, n in zip(starts.tolist(), lens.tolist(), strict=True)
        ]
        assert got == want, f"segments up to {top} bytes"


def test_topic_key_hashes_are_index_key_hashes() -> None:
    rng = random.Random(3)
    topics = ["t", "%SYS%OFFSETS", "dispatch7"]
    keys = [rng.choice(WORDS) + str(rng.randrange(10**6)) for _ in range(300)] + [
        "polygenelubricants"
    ]
    which = np.array([rng.randrange(3) for _ in keys], np.int64)
    got = topic_key_hashes(
        topics,
        which,
        np.array([java_string_hash(k) & 0xFFFFFFFF for k in keys], np.int64),
        np.array([_utf16_units(k) for k in keys], np.int64),
    )
    want = [index_key_hash(build_key(topics[t], k)) for t, k in zip(which, keys, strict=True)]
    assert got.tolist() == want
    # A key whose "topic#key" hashes to Integer.MIN_VALUE indexes as 0, as RocketMQ's abs.
    assert index_key_hash("polygenelubricants") == 0


# -- the index: put_batch writes what put_message writes -----------------------------


Msg = tuple[str, list[str], int, int]  # topic, keys, physical offset, store timestamp


def random_batches(rng: random.Random, per_file: int) -> list[list[Msg]]:
    """Batches in log order; some start below the end of the one before (a replay)."""
    batches: list[list[Msg]] = []
    phy, ts = rng.randrange(0, 5), T0
    for _ in range(rng.randrange(1, 12)):
        if batches and rng.random() < 0.2:
            phy = max(0, phy - rng.randrange(1, 40))
        batch = []
        for _ in range(rng.randrange(0, 60)):
            many = rng.random() < 0.05
            count = rng.randrange(per_file, 3 * per_file) if many else rng.randrange(0, 4)
            keys = [rng.choice([*WORDS, "", f"k{rng.randrange(50)}"]) for _ in range(count)]
            batch.append((rng.choice(["T", "U", "%SYS%OFFSETS"]), keys, phy, ts))
            phy += rng.randrange(1, 300)
            ts = max(0, ts + rng.choice([rng.randrange(0, 2500), rng.randrange(-3000, 3000)]))
            if rng.random() < 0.02:
                # Far ahead (file names stop at year 9999), back to 0, or a diff past i32.
                ts = rng.choice([ts + (1 << 42), 0, (1 << 47) + rng.randrange(1 << 40)])
        batches.append(batch)
    return batches


def put_batch(idx: IndexService, batch: list[Msg]) -> int:
    """put_batch the way the dispatcher calls it (hashes from the key columns)."""
    topics = sorted({t for t, *_ in batch})
    keys = [(i, topics.index(t), k) for i, (t, ks, _, _) in enumerate(batch) for k in ks if k]
    hashes = topic_key_hashes(
        topics,
        np.array([t for _, t, _ in keys], np.int64),
        np.array([java_string_hash(k) & 0xFFFFFFFF for *_, k in keys], np.int64),
        np.array([_utf16_units(k) for *_, k in keys], np.int64),
    )
    counts = np.bincount(np.array([i for i, *_ in keys], np.int64), minlength=len(batch))
    return idx.put_batch(
        np.array([phy for *_, phy, _ in batch], np.int64),
        np.array([ts for *_, ts in batch], np.int64),
        counts.astype(np.int64),
        hashes,
    )


def index_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "index").iterdir())}


@pytest.mark.parametrize("seed", range(45))
def test_put_batch_writes_the_bytes_of_put_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    how = small_or_large(monkeypatch, seed)
    rng = random.Random(seed)
    slots, entries = rng.randrange(1, 9), rng.randrange(2, 40)
    batches = random_batches(rng, entries - 1)

    def open_(name: str) -> IndexService:
        return IndexService(tmp_path / name, slot_count=slots, entry_count=entries)

    old, new = open_("old"), open_("new")
    rolled = 0
    torn = False  # a torn slot is repaired by recovery; here puts go on past it, unopened
    for b, batch in enumerate(batches):
        if rng.random() < 0.15 and not torn:  # a reopen between batches
            old.close()
            new.close()
            old, new = open_("old"), open_("new")
        if rng.random() < 0.1 and old.files and not old.files[-1].is_full():
            # A slot naming an entry past the header's count (a torn write): put checks it.
            slot, bogus = rng.randrange(slots), old.files[-1].index_count + rng.randrange(3)
            torn = True
            for idx in (old, new):
                SLOT.pack_into(idx.files[-1]._mm, HEADER_SIZE + slot * 4, bogus)
        files_before = len(old.files)
        want = sum(old.put_message(t, ks, phy, ts) for t, ks, phy, ts in batch)
        got = put_batch(new, batch)
        rolled += len(old.files) > files_before
        where = f"seed {seed} batch {b} ({slots} slots, {entries} entries, {how})"
        assert got == want, where
        assert [f.header() for f in new.files] == [f.header() for f in old.files], where
        assert index_files(tmp_path / "new") == index_files(tmp_path / "old"), where
    old.close()
    new.close()
    assert rolled or sum(len(b) for b in batches) < entries, f"seed {seed}: no file rolled"


def test_put_many_stops_at_a_full_file_and_releases_the_mapping(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_count=3, entry_count=5, create=True)
    hashes = np.array([index_key_hash(f"T#{k}") for k in "abcdef"], np.int64)
    phys = np.arange(10, 16, dtype=np.int64)
    times = np.full(6, T0, np.int64)
    assert f.put_many(hashes, phys, times) == 4  # entry 0 is never used
    assert f.is_full() and f.put_many(hashes, phys, times) == 0
    assert f.query("T#a", 0, 2 * T0, 5) == [10]
    f.close()  # no numpy view of the mapping is left behind (close would raise)
    g = IndexFile(tmp_path / "ref", slot_count=3, entry_count=5, create=True)
    for k, phy in zip("abcd", range(10, 14), strict=True):
        assert g.put(f"T#{k}", phy, T0)
    g.close()
    assert (tmp_path / "idx").read_bytes() == (tmp_path / "ref").read_bytes()


def test_put_many_with_timestamps_at_the_ends_of_int64(tmp_path: Path) -> None:
    rng = random.Random(5)
    extremes = [-(1 << 63), (1 << 63) - 1, 0, T0, -T0, (1 << 61) + 7]
    for trial in range(20):
        n = rng.randrange(1, 30)
        keys = [f"T#{rng.randrange(40)}" for _ in range(n)]
        times = [rng.choice(extremes) + rng.randrange(-3000, 3000) * (trial % 2) for _ in keys]
        times = [min(max(t, -(1 << 63)), (1 << 63) - 1) for t in times]
        old = IndexFile(tmp_path / f"old{trial}", slot_count=5, entry_count=n + 2, create=True)
        new = IndexFile(tmp_path / f"new{trial}", slot_count=5, entry_count=n + 2, create=True)
        for phy, (key, ts) in enumerate(zip(keys, times, strict=True)):
            assert old.put(key, phy, ts)
        hashes = np.array([index_key_hash(k) for k in keys], np.int64)
        assert new.put_many(hashes, np.arange(n, dtype=np.int64), np.array(times, np.int64)) == n
        assert new.header() == old.header(), f"trial {trial}"
        old.close()
        new.close()
        want = (tmp_path / f"old{trial}").read_bytes()
        assert (tmp_path / f"new{trial}").read_bytes() == want, f"trial {trial}"


# -- consume queues: append_units ----------------------------------------------------


def test_append_units_takes_a_slice_of_a_batch_and_checks_like_append_batch(
    tmp_path: Path,
) -> None:
    def cq(name: str) -> ConsumeQueue:
        return ConsumeQueue(tmp_path / name, "T", 0, units_per_file=4, preallocate=False)

    units = [(100 * i + 7, 50 + i, i - 3) for i in range(10)]
    batch = np.empty(13, UNIT_DTYPE)
    batch[:3] = units_array([(1, 1, 1)] * 3)
    batch[3:] = units_array(units)
    a, b = cq("a"), cq("b")
    assert a.append_batch(0, units) == 10
    assert b.append_units(0, batch[3:]) == 10  # a slice: written as it lies, across files
    assert a.get_range(0, 10) == b.get_range(0, 10)
    native = np.concatenate([units_array(units[8:]), units_array([(9999, 1, 0)])])
    assert native.dtype != UNIT_DTYPE  # host byte order: converted, not written as it lies
    assert b.append_units(8, native) == 1
    assert a.append_batch(10, [(9999, 1, 0)]) == 1
    assert a.get_range(0, 11) == b.get_range(0, 11)
    assert a.max_offset == b.max_offset == 11
    a.flush()
    b.flush()
    files = [[p.read_bytes() for p in sorted(q.directory.iterdir())] for q in (a, b)]
    assert len(files[0]) == 3 and files[0] == files[1]
    for queue in (a, b):
        with pytest.raises(ConflictingWrite, match=r"CqUnit\(commitlog_offset=307"):
            queue.append_units(3, units_array([(308, 53, 0)]))
        with pytest.raises(ValueError, match=r"unit \(5, 1\) after commit-log offset "):
            queue.append_batch(queue.max_offset, [(5, 1, 0)])
        with pytest.raises(ValueError, match=r"unit \(20000, 0\) after commit-log offset 10000"):
            queue.append_units(queue.max_offset, units_array([(10000, 1, 0), (20000, 0, 0)]))
    a.close()
    b.close()


# -- the dispatcher: the same files as the per-message code --------------------------


class MemoryLog:
    """A committed log in memory: messages at increasing offsets, queue offsets as the
    leader assigns them (consecutive per queue)."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, bytes]] = []
        self.end = 1000
        self.next_queue_offset: dict[tuple[str, int], int] = {}

    def append(self, msg: StoredMessage, gap: int = 48, skip: int = 0) -> None:
        """Append `msg`; `skip` > 0 jumps its queue's offsets (a queue starting later)."""
        key = (msg.topic, msg.queue_id)
        q = self.next_queue_offset.get(key, 0) + skip
        self.next_queue_offset[key] = q + 1
        data = encode_message(msg.with_positions(q, self.end + gap))
        self.messages.append((self.end + gap, data))
        self.end += gap + len(data)

    @property
    def committed_pos(self) -> int:
        return self.end

    @property
    def min_pos(self) -> int:
        return 0

    def read_committed(
        self, from_pos: int, max_bytes: int
    ) -> tuple[list[tuple[int, bytes]], int, int]:
        out: list[tuple[int, bytes]] = []
        size = 0
        for offset, data in self.messages:
            if offset < from_pos:
                continue
            if out and size + len(data) > max_bytes:
                return out, offset - 48, self.end
            out.append((offset, data))
            size += len(data)
        return out, self.end, self.end

    def read_message(self, commitlog_offset: int, size: int) -> bytes:
        for offset, data in self.messages:
            if offset == commitlog_offset:
                return data[:size]
        raise KeyError(commitlog_offset)


class PerMessageDispatcher(Dispatcher):
    """The dispatcher as it was: each message decoded, queued and indexed on its own."""

    def _apply(self, messages: Sequence[tuple[int, bytes]], committed: int) -> None:
        pending: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]] = {}
        ts = self.last_store_timestamp_ms
        for offset, data in messages:
            hdr = peek_header(data)
            if offset + hdr.total_size > committed:
                raise AssertionError(f"message at {offset} reaches past committed {committed}")
            key = (hdr.topic, hdr.queue_id)
            unit = (offset, hdr.total_size, hdr.tags_code)
            batch = pending.get(key)
            if batch is None:
                pending[key] = (hdr.queue_offset, [unit])
            elif hdr.queue_offset != batch[0] + len(batch[1]):
                self._append_per_message(key, *batch)
                pending[key] = (hdr.queue_offset, [unit])
            else:
                batch[1].append(unit)
            keys = [*hdr.keys, hdr.uniq_key] if hdr.uniq_key else hdr.keys
            if keys:
                self.index.put_message(hdr.topic, keys, offset, hdr.store_timestamp_ms)
            if hdr.topic == OFFSETS_TOPIC:
                self._apply_offset_commit(data, hdr.total_size)
            ts = max(ts, hdr.store_timestamp_ms)
        for key, (first, units) in pending.items():
            self._append_per_message(key, first, units)
        self.last_store_timestamp_ms = ts

    def _append_per_message(
        self, key: tuple[str, int], first: int, units: list[tuple[int, int, int]]
    ) -> None:
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root, key[0], key[1], units_per_file=self._units_per_file)
            self.queues[key] = cq
        cq.append_batch(first, units)


@pytest.mark.parametrize("seed", range(9))
def test_dispatch_writes_the_files_of_per_message_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    how = small_or_large(monkeypatch, seed)
    rng = random.Random(seed)
    log = MemoryLog()
    geometry = {
        "units_per_file": rng.randrange(3, 40),
        "index_slots": rng.randrange(1, 50),
        "index_entries": rng.randrange(10, 120),
    }
    old = PerMessageDispatcher(tmp_path / "old", log, **geometry, batch_bytes=1)
    new = Dispatcher(tmp_path / "new", log, **geometry, batch_bytes=1)
    for d in (old, new):
        d.recover(log.committed_pos)
    topics = ("orders", "t1", "%SYS%X")
    for round_ in range(rng.randrange(3, 8)):
        for i in range(rng.randrange(0, 150)):
            if rng.random() < 0.05:
                body = encode_offset_commit(f"g{rng.randrange(3)}", "orders", 0, i + 100 * round_)
                log.append(StoredMessage(OFFSETS_TOPIC, body, {"UNIQ_KEY": f"o{round_}-{i}"}))
            else:
                msg = random_message(rng, i, topics, wild_times=False)
                log.append(msg, gap=rng.choice([48, 48, 96]))
        batch_bytes = rng.choice([1, 2000, 30_000, 1 << 20])  # 1 message to all of them
        for d in (old, new):
            d._batch_bytes = batch_bytes
            d.catch_up()
            assert d.dispatched_pos == log.committed_pos
    where = f"seed {seed} {geometry} {how}"
    assert len(new.index.files) > 1 or sum(1 for _ in log.messages) < 20, where
    assert new.offsets == old.offsets, where
    assert new.last_store_timestamp_ms == old.last_store_timestamp_ms, where
    assert new.messages_dispatched == old.messages_dispatched == len(log.messages), where
    for d in (old, new):
        d.persist(d.snapshot())
        d.close(clean=True)
    assert files_of(tmp_path / "new") == files_of(tmp_path / "old"), where


def test_a_batch_is_checked_before_anything_is_written(tmp_path: Path) -> None:
    log = MemoryLog()
    for i in range(40):
        log.append(StoredMessage("t", b"body", {"KEYS": f"k{i}", "UNIQ_KEY": f"u{i}"}))
    offset, data = log.messages[30]
    log.messages[30] = (offset, data[:-1] + b"\x03")  # the last separator is damaged
    d = Dispatcher(tmp_path, log, units_per_file=10, index_slots=8, index_entries=50)
    d.recover(log.committed_pos)
    with pytest.raises(CorruptEntry, match="properties do not end with a separator"):
        d.catch_up()
    assert d.dispatched_pos == 0 and not d.queues and not d.index.files
    d.close(clean=True)


@pytest.mark.parametrize("batch_bytes", [1, 1 << 20])
def test_queues_that_start_late_or_jump(tmp_path: Path, batch_bytes: int) -> None:
    """A queue whose first offset is above 0 starts there (both ways alike); a jump in a
    queue that has units is a gap, refused the same way, after the same units."""
    log = MemoryLog()
    for i in range(60):
        log.append(
            StoredMessage("t", b"x", {"UNIQ_KEY": f"u{i}"}, queue_id=i % 3),
            skip=7 if i in (1, 2) else 0,
        )
    log.append(StoredMessage("t", b"x", {}, queue_id=0), skip=2)  # a gap in queue 0
    for _ in range(40):
        log.append(StoredMessage("t", b"y", {}, queue_id=1))
    errors, queues = [], []
    for name, cls in (("old", PerMessageDispatcher), ("new", Dispatcher)):
        d = cls(
            tmp_path / name,
            log,
            units_per_file=8,
            index_slots=8,
            index_entries=30,
            batch_bytes=batch_bytes,
        )
        d.recover(log.committed_pos)
        with pytest.raises(OffsetOutOfRange) as exc:
            d.catch_up()
        errors.append(str(exc.value))
        queues.append(sorted((k, q.min_offset, q.max_offset) for k, q in d.queues.items()))
        d.close(clean=False)
    assert errors[0] == errors[1]
    assert queues[0] == queues[1]
    if batch_bytes == 1:  # one message a batch: everything before the gap is dispatched
        assert queues[0] == [(("t", 0), 0, 20), (("t", 1), 7, 27), (("t", 2), 7, 27)]
        assert files_of(tmp_path / "new") == files_of(tmp_path / "old")
