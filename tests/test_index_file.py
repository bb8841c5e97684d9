"""IndexFile and IndexService: golden layout, model-based queries, rolling, recovery."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.errors import CorruptEntry, StoreError
from store.index_file import (
    ENTRY_SIZE,
    HEADER_SIZE,
    IndexFile,
    IndexService,
    build_key,
    index_key_hash,
)

T0 = 1_700_000_000_000


def test_key_hash_is_rocketmq_abs_hash_code() -> None:
    assert index_key_hash("T#k") == 81916
    assert index_key_hash("hello") == 99162322
    assert index_key_hash("polygenelubricants") == 0  # Math.abs(Integer.MIN_VALUE) < 0
    assert build_key("T", "k") == "T#k"


def test_golden_layout(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_count=4, entry_count=8, create=True)
    assert f.put("T#k", 0x1000, T0)
    assert f.put("T#k", 0x2000, T0 + 2500)
    f.flush()
    raw = (tmp_path / "idx").read_bytes()
    assert len(raw) == HEADER_SIZE + 4 * 4 + 8 * ENTRY_SIZE
    assert raw[:HEADER_SIZE].hex() == (
        "0000018bcfe56800"  # beginTimestamp
        "0000018bcfe571c4"  # endTimestamp
        "0000000000001000"  # beginPhyOffset
        "0000000000002000"  # endPhyOffset
        "00000001"  # hashSlotCount
        "00000003"  # indexCount: entries 1 and 2 used
    )
    # 81916 % 4 == 0: slot 0 holds the newest entry, 2.
    assert raw[HEADER_SIZE : HEADER_SIZE + 16].hex() == "00000002" + "00000000" * 3
    entries = HEADER_SIZE + 16
    assert raw[entries : entries + ENTRY_SIZE] == bytes(ENTRY_SIZE)  # entry 0 unused
    assert raw[entries + ENTRY_SIZE : entries + 3 * ENTRY_SIZE].hex() == (
        "00013ffc"
        "0000000000001000"
        "00000000"
        "00000000"  # hash, phy, 0 s, no prev
        "00013ffc"
        "0000000000002000"
        "00000002"
        "00000001"  # 2.5 s -> 2, prev 1
    )
    assert f.query("T#k", 0, T0 * 2, 10) == [0x2000, 0x1000]
    assert f.query("T#k", 0, T0 * 2, 1) == [0x2000]
    assert f.query("T#x", 0, T0 * 2, 10) == []
    # Times are known to the second: 2.5 s lies in [T0+2000, T0+2999].
    assert f.query("T#k", T0 + 2999, T0 + 2999, 10) == [0x2000]
    assert f.query("T#k", T0 + 3000, T0 * 2, 10) == []
    assert f.query("T#k", 0, T0 - 1, 10) == []
    f.close()


def test_full_file_refuses_puts_and_reopens(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_count=2, entry_count=3, create=True)
    assert [f.put(f"k{i}", i, T0) for i in range(3)] == [True, True, False]  # 0 is unused
    assert f.is_full()
    f.close()
    g = IndexFile(tmp_path / "idx", slot_count=2, entry_count=3, create=False)
    assert g.entries == 2
    assert g.query("k1", T0, T0, 5) == [1]
    g.close()
    with pytest.raises(StoreError, match="expected"):
        IndexFile(tmp_path / "idx", slot_count=3, entry_count=3, create=False)


def test_corrupt_header(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_count=2, entry_count=3, create=True)
    f.close()
    with (tmp_path / "idx").open("r+b") as fh:
        fh.seek(36)
        fh.write((99).to_bytes(4, "big"))
    with pytest.raises(CorruptEntry, match="header out of range"):
        IndexFile(tmp_path / "idx", slot_count=2, entry_count=3, create=False)


def clock() -> itertools.count[int]:
    return itertools.count(T0, 1)  # a fresh file every call gets a later name


def service(
    root: Path, entries: int = 5, ticks: itertools.count[int] | None = None
) -> IndexService:
    ticks = ticks or clock()
    return IndexService(root, slot_count=3, entry_count=entries, clock_ms=lambda: next(ticks))


def test_service_rolls_names_and_queries_across_files(tmp_path: Path) -> None:
    idx = service(tmp_path, ticks=itertools.count(T0, 0))  # a stuck clock
    assert idx.end_phy_offset == -1
    for i in range(10):
        assert idx.put_message("T", ["a", f"k{i}"], 100 * i, T0 + 1000 * i)
    # Two keys per message, four keys per file (entry 0 is unused): two messages a file.
    assert len(idx.files) == 5
    names = [f.path.name for f in idx.files]
    assert names == sorted(names)
    assert names[0] == "20231114221320000"  # T0 in UTC, yyyyMMddHHmmssSSS
    assert names[1] == "20231114221320001"  # the clock did not move; names still increase
    assert idx.query("T", "a", 0, T0 * 2, 100) == [100 * i for i in reversed(range(10))]
    assert idx.query("T", "a", 0, T0 * 2, 3) == [900, 800, 700]
    assert idx.query("T", "a", T0 + 3000, T0 + 5000, 100) == [500, 400, 300]
    assert idx.query("T", "k7", 0, T0 * 2, 100) == [700]
    assert idx.query("U", "a", 0, T0 * 2, 100) == []
    assert (idx.end_phy_offset, idx.end_timestamp_ms) == (900, T0 + 9000)
    assert not idx.put_message("T", ["a"], 900, T0)  # already indexed: replay is a no-op
    assert not idx.put_message("T", [], 1000, T0)
    idx.close()
    again = service(tmp_path)
    assert [f.path.name for f in again.files] == names
    assert again.query("T", "a", 0, T0 * 2, 100) == [100 * i for i in reversed(range(10))]
    again.close()


def test_keys_of_one_message_stay_in_one_file(tmp_path: Path) -> None:
    idx = service(tmp_path, entries=5)
    idx.put_message("T", ["a", "b", "c"], 0, T0)
    idx.put_message("T", ["d", "e"], 10, T0)  # does not fit the 1 entry left: rolls
    assert [f.entries for f in idx.files] == [3, 2]
    idx.put_message("T", ["f", "g", "h", "i", "j", "k"], 20, T0)  # more than a file holds
    assert [f.entries for f in idx.files] == [3, 2, 4, 2]
    assert idx.query("T", "k", 0, T0, 5) == [20]
    idx.close()


def test_truncate_and_delete_below(tmp_path: Path) -> None:
    idx = service(tmp_path)
    for i in range(8):
        idx.put_message("T", ["a", "b"], 100 * i, T0 + i)
    assert len(idx.files) == 4
    assert idx.truncate_to_commitlog_offset(450) == 301  # files ending at 500 and 700 go
    assert len(idx.files) == 2
    assert idx.query("T", "a", 0, T0 * 2, 100) == [300, 200, 100, 0]
    assert idx.put_message("T", ["a"], 500, T0 + 5)  # re-index from the returned offset on
    assert idx.delete_below_commitlog_offset(250) == 1
    assert idx.query("T", "a", 0, T0 * 2, 100) == [500, 300, 200]
    assert idx.delete_below_commitlog_offset(10_000) == 1  # the newest file is kept
    assert idx.end_phy_offset == 500
    assert idx.truncate_to_commitlog_offset(0) == 0
    assert idx.files == []
    idx.close()


def test_recovery_repairs_slots_written_past_the_header(tmp_path: Path) -> None:
    idx = service(tmp_path, entries=10)
    for i in range(3):
        idx.put_message("T", [f"k{i}"], 100 * i, T0)
    f = idx.files[-1]
    idx.flush()
    header = (tmp_path / "index" / f.path.name).read_bytes()[:HEADER_SIZE]
    idx.put_message("T", ["k0"], 300, T0)  # not flushed: only its slot page "survives" a crash
    idx.close()
    path = tmp_path / "index" / f.path.name
    raw = bytearray(path.read_bytes())
    raw[:HEADER_SIZE] = header
    raw[HEADER_SIZE + 3 * 4 + 4 * ENTRY_SIZE : HEADER_SIZE + 3 * 4 + 5 * ENTRY_SIZE] = bytes(20)
    path.write_bytes(raw)
    again = service(tmp_path, entries=10)
    assert again.query("T", "k0", 0, T0, 10) == []  # the torn slot hides entry 1
    assert again.truncate_to_commitlog_offset(300) == 201
    assert again.query("T", "k0", 0, T0, 10) == [0]
    assert [again.query("T", f"k{i}", 0, T0, 10) for i in range(3)] == [[0], [100], [200]]
    assert not again.files[-1].repair_slots()
    again.close()


# -- model-based ---------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(st.sampled_from("abcdefg"), max_size=3)),
        st.tuples(st.just("reopen"), st.just([])),
        st.tuples(st.just("query"), st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=1)),
    ),
    max_size=40,
)


class Model:
    """What the index should answer: entries with the time the file stores for them."""

    def __init__(self, entries_per_file: int) -> None:
        self.per_file = entries_per_file
        self.entries: list[tuple[int, int, int]] = []  # (key hash, phy, stored time)
        self.room = 0
        self.begin = 0

    def put(self, keys: list[str], phy: int, now: int) -> None:
        if keys and self.room < len(keys) and self.room < self.per_file:
            self.room = 0  # the service rolls before a message that does not fit
        for key in keys:
            if self.room == 0:
                self.room, self.begin = self.per_file, now
            self.room -= 1
            stored = self.begin + (now - self.begin) // 1000 * 1000
            self.entries.append((index_key_hash(build_key("T", key)), phy, stored))

    def query(self, key: str, begin: int, end: int, max_count: int) -> list[int]:
        want = index_key_hash(build_key("T", key))
        found = [
            p for h, p, t in reversed(self.entries) if h == want and begin <= t + 999 and t <= end
        ]
        return found[:max_count]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations, step_ms=st.integers(0, 2500))
def test_service_matches_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, list[str]]], step_ms: int
) -> None:
    root = tmp_path_factory.mktemp("idx")
    ticks = clock()
    idx = service(root, entries=5, ticks=ticks)
    model = Model(4)
    phy = 0
    for op, keys in ops:
        if op == "put":
            now = T0 + phy * step_ms
            idx.put_message("T", keys, phy, now)
            model.put(keys, phy, now)
            phy += 1
        elif op == "reopen":
            idx.close()
            idx = service(root, entries=5, ticks=ticks)
        else:
            begin, end = T0 + step_ms, T0 + 4 * step_ms
            assert idx.query("T", keys[0], begin, end, 100) == model.query(keys[0], begin, end, 100)
            assert idx.query("T", keys[0], 0, 1 << 62, 2) == model.query(keys[0], 0, 1 << 62, 2)
    idx.close()
