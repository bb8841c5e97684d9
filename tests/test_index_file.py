"""The key index (index_format, IndexFile, IndexService): golden layout, model-based
queries, rolling, recovery."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import index_file
from store.errors import CorruptEntry, StoreError
from store.index_file import IndexFile
from store.index_format import ENTRY_SIZE, HEADER_SIZE, build_key, index_key_hash
from store.index_service import IndexService

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


def service(root: Path, entries: int = 5) -> IndexService:
    return IndexService(root, slot_count=3, entry_count=entries)


def files_of(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "index").iterdir())}


def test_service_rolls_names_and_queries_across_files(tmp_path: Path) -> None:
    idx = service(tmp_path)
    assert idx.end_phy_offset == -1
    for i in range(10):
        assert idx.put_message("T", ["a", f"k{i}"], 100 * i, T0 + 1000 * i)
    # Two keys per message, four keys per file (entry 0 is unused): two messages a file.
    assert len(idx.files) == 5
    names = [f.path.name for f in idx.files]
    # Named by the store timestamp of each file's first message, yyyyMMddHHmmssSSS in UTC.
    assert names == [f"2023111422{1320 + 2 * i:04d}000" for i in range(5)]
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


def test_a_full_file_is_sealed_unflushed_and_the_next_flush_makes_it_durable(
    tmp_path: Path,
) -> None:
    """The writer never flushes (a full file is hundreds of MB; the writer is the
    event loop): a flush does, covering what was written before its plan was taken."""
    with mock.patch.object(IndexFile, "flush", autospec=True, side_effect=IndexFile.flush) as m:
        idx = service(tmp_path, entries=4)  # three keys a file
        for i in range(4):
            idx.put_message("T", [f"k{i}"], 100 * i, T0 + 1000 * i)
        a, b = (f.path.name for f in idx.files)
        plan = idx.flush_plan()
        assert [f.path.name for f in plan.sealed] == [a]
        assert plan.newest is not None and plan.newest.path.name == b
        for i in range(4, 7):  # b fills, c takes the writes
            idx.put_message("T", [f"k{i}"], 100 * i, T0 + 1000 * i)
        c = idx.files[-1].path.name
        assert m.call_count == 0
        idx.flush(plan)
        assert [f.path.name for f in idx.flush_plan().sealed] == [b]  # sealed after the plan
        idx.flush()
        assert idx.flush_plan().sealed == ()
        assert [call.args[0].path.name for call in m.call_args_list] == [a, b, b, c]
    idx.close()


def test_a_flush_is_an_fdatasync_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not mmap.flush, which holds the GIL for the whole msync (the event loop would
    stall even with the flush in a worker thread); a deleted file needs none."""
    f = IndexFile(tmp_path / "idx", slot_count=3, entry_count=4, create=True)
    synced: list[int] = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(os.fstat(fd).st_ino))
    f.flush()
    assert synced == [f.path.stat().st_ino]
    f.destroy()
    f.flush()
    assert len(synced) == 1


def test_names_increase_when_store_timestamps_do_not(tmp_path: Path) -> None:
    idx = IndexService(tmp_path, slot_count=3, entry_count=2, clock_ms=lambda: 0)  # one key a file
    for phy, ts in enumerate([T0, T0, T0 - 5000, T0 + 10]):
        idx.put_message("T", ["a"], phy, ts)
    assert [f.path.name for f in idx.files] == [
        "20231114221320000",
        "20231114221320001",  # the same timestamp: one ms after the previous name
        "20231114221320002",  # an earlier one too
        "20231114221320010",
    ]
    idx.close()


def test_a_file_left_empty_by_a_crash_is_made_again(tmp_path: Path) -> None:
    idx = service(tmp_path)
    idx.put_message("T", ["a", "b", "c", "d"], 0, T0)
    idx.close()
    # A crash between creating the next file and writing its first entry.
    IndexFile(tmp_path / "index" / "20991231000000000", 3, 5, create=True).close()
    again = service(tmp_path)
    assert again.put_message("T", ["e"], 10, T0 + 1000)
    assert [f.path.name for f in again.files] == ["20231114221320000", "20231114221321000"]
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


def test_truncate_cuts_in_place_and_delete_below(tmp_path: Path) -> None:
    idx = service(tmp_path)
    times = {100 * i: T0 + i for i in range(8)}
    for phy, ts in times.items():
        idx.put_message("T", ["a", "b"], phy, ts)
    assert len(idx.files) == 4
    first_names = [f.path.name for f in idx.files]
    # The file of 400 and 500 is cut after 400; the one of 600 and 700 goes.
    assert idx.truncate_to_commitlog_offset(450, times.__getitem__) == 401
    assert [f.path.name for f in idx.files] == first_names[:3]
    assert [f.entries for f in idx.files] == [4, 4, 2]
    assert idx.query("T", "a", 0, T0 * 2, 100) == [400, 300, 200, 100, 0]
    assert idx.put_message("T", ["a"], 500, T0 + 5)  # re-index from the returned offset on
    assert idx.delete_below_commitlog_offset(250) == 1
    assert idx.query("T", "a", 0, T0 * 2, 100) == [500, 400, 300, 200]
    assert idx.delete_below_commitlog_offset(10_000) == 1  # the newest file is kept
    assert idx.end_phy_offset == 500
    assert idx.truncate_to_commitlog_offset(0, times.__getitem__) == 0
    assert idx.files == []
    idx.close()


def test_truncate_without_timestamps_deletes_the_straddling_file(tmp_path: Path) -> None:
    idx = service(tmp_path)
    for i in range(4):
        idx.put_message("T", ["a", "b"], 100 * i, T0)
    assert idx.truncate_to_commitlog_offset(350) == 301  # nothing to cut: the call is fine
    assert idx.truncate_to_commitlog_offset(250) == 101  # the file of 200 and 300 goes whole
    assert len(idx.files) == 1
    idx.close()


def test_truncate_reads_back_only_the_messages_of_the_last_second(tmp_path: Path) -> None:
    idx = IndexService(tmp_path, slot_count=7, entry_count=64)
    times = {10 * i: T0 + 333 * i for i in range(4)}  # three messages a second
    times[40] = T0 + 1500
    times[50] = T0 + 1200  # a clock that stepped back
    for phy, ts in times.items():
        idx.put_message("T", ["a", "b"], phy, ts)
    asked: list[int] = []

    def store_timestamp_of(phy: int) -> int:
        asked.append(phy)
        return times[phy]

    # Kept 0..40: 40 has the largest time, which is the old end time: certain.
    assert idx.truncate_to_commitlog_offset(45, store_timestamp_of) == 41
    assert (asked, idx.end_timestamp_ms) == ([40], T0 + 1500)
    asked.clear()
    # Kept 0..30: T0+999 at 30 is the top of the largest stored second (0): certain.
    assert idx.truncate_to_commitlog_offset(31, store_timestamp_of) == 31
    assert (asked, idx.end_timestamp_ms) == ([30], T0 + 999)
    asked.clear()
    # Kept 0..20: nothing is certain until every message of second 0 is read.
    assert idx.truncate_to_commitlog_offset(30, store_timestamp_of) == 21
    assert (asked, idx.end_timestamp_ms) == ([20, 10, 0], T0 + 666)
    idx.close()


def test_truncate_refuses_a_timestamp_that_contradicts_the_entry(tmp_path: Path) -> None:
    idx = service(tmp_path, entries=10)
    for i in range(4):
        idx.put_message("T", ["a"], 100 * i, T0 + 1000 * i)
    with pytest.raises(CorruptEntry, match="does not give the entry's time diff"):
        idx.truncate_to_commitlog_offset(300, lambda phy: T0)
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
    assert again.truncate_to_commitlog_offset(300, lambda phy: T0) == 201
    assert again.query("T", "k0", 0, T0, 10) == [0]
    assert [again.query("T", f"k{i}", 0, T0, 10) for i in range(3)] == [[0], [100], [200]]
    assert not again.files[-1].repair_slots()
    again.close()
    fresh = service(tmp_path / "fresh", entries=10)
    for i in range(3):
        fresh.put_message("T", [f"k{i}"], 100 * i, T0)
    fresh.close()
    assert files_of(tmp_path) == files_of(tmp_path / "fresh")


def build_messages(root: Path, keys: str, slots: int = 1) -> IndexService:
    """One message per key, at physical offsets 0, 1, ...; timestamps T0."""
    idx = IndexService(root, slot_count=slots, entry_count=8)
    for phy, key in enumerate(keys):
        idx.put_message("T", [key], phy, T0)
    return idx


@pytest.mark.parametrize("undo_cost", [0, 1 << 40])
def test_truncate_undoes_puts_back_to_a_fresh_file(tmp_path: Path, undo_cost: int) -> None:
    with mock.patch.object(index_file, "_UNDO_COST", undo_cost):  # undo, or rebuild slots
        idx = build_messages(tmp_path, "abcab", slots=3)
        assert idx.truncate_to_commitlog_offset(2, lambda phy: T0) == 2
        assert idx.files[0].hash_slot_count == 2  # the slot of c is free again
        idx.close()
    build_messages(tmp_path / "fresh", "ab", slots=3).close()
    assert files_of(tmp_path) == files_of(tmp_path / "fresh")


@pytest.mark.parametrize("undo_cost", [0, 1 << 40])
def test_truncate_after_a_kill_in_the_middle_of_a_put(tmp_path: Path, undo_cost: int) -> None:
    idx = build_messages(tmp_path, "ab", slots=3)
    f = idx.files[0]
    header = bytes(f._mm[:HEADER_SIZE])
    assert index_key_hash("T#c") % 3 not in {index_key_hash(f"T#{k}") % 3 for k in "ab"}
    f.put("T#c", 2, T0)  # its entry and (so far unused) slot are written, not the header
    f._mm[:HEADER_SIZE] = header
    idx.close()
    again = IndexService(tmp_path, slot_count=3, entry_count=8)
    with mock.patch.object(index_file, "_UNDO_COST", undo_cost):
        assert again.truncate_to_commitlog_offset(5, lambda phy: T0) == 2
    assert again.files[0].hash_slot_count == 2
    again.close()
    build_messages(tmp_path / "fresh", "ab", slots=3).close()
    assert files_of(tmp_path) == files_of(tmp_path / "fresh")


@pytest.mark.parametrize("undo_cost", [0, 1 << 40])
def test_truncate_rebuilds_slots_when_a_counted_entry_was_lost(
    tmp_path: Path, undo_cost: int
) -> None:
    build_messages(tmp_path, "abc").close()  # one chain, in slot 0: a, b, c
    path = next((tmp_path / "index").iterdir())
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 4 + 3 * ENTRY_SIZE : HEADER_SIZE + 4 + 4 * ENTRY_SIZE] = bytes(ENTRY_SIZE)
    path.write_bytes(raw)  # the header counts c, whose page was lost
    again = IndexService(tmp_path, slot_count=1, entry_count=8)
    # Cut at 2 or later: c is lost, and b may have been a key of its message too.
    with mock.patch.object(index_file, "_UNDO_COST", undo_cost):
        assert again.truncate_to_commitlog_offset(5, lambda phy: T0) == 1
    assert again.query("T", "a", 0, T0, 5) == [0]
    assert again.query("T", "b", 0, T0, 5) == []
    again.close()
    build_messages(tmp_path / "fresh", "a").close()
    assert files_of(tmp_path) == files_of(tmp_path / "fresh")


def test_repair_slots_rebuilds_what_the_header_counts(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_count=3, entry_count=6, create=True)
    for i, key in enumerate(["a", "b", "a"]):
        f.put(key, i, T0)
    good = (tmp_path / "idx").read_bytes()
    f.put("b", 3, T0)
    f._mm[:HEADER_SIZE] = good[:HEADER_SIZE]  # the header of three entries, slots of four
    f.close()
    g = IndexFile(tmp_path / "idx", slot_count=3, entry_count=6, create=False)
    assert g.repair_slots()
    assert not g.repair_slots()
    assert g.query("b", 0, T0, 5) == [1]
    g.close()


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
    idx = service(root, entries=5)
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
            idx = service(root, entries=5)
        else:
            begin, end = T0 + step_ms, T0 + 4 * step_ms
            assert idx.query("T", keys[0], begin, end, 100) == model.query(keys[0], begin, end, 100)
            assert idx.query("T", keys[0], 0, 1 << 62, 2) == model.query(keys[0], 0, 1 << 62, 2)
    idx.close()


# -- truncation is the inverse of putting ------------------------------------------

Msg = tuple[str, list[str], int, int]  # topic, keys, physical offset, store timestamp


@st.composite
def message_logs(draw: st.DrawFn) -> tuple[list[Msg], int, int]:
    """A log of messages (0-3 keys each, increasing offsets) and small file geometry.

    Timestamps mostly increase; with `skew` a clock may also step back, and a jump
    can exceed what a time diff holds (it clamps).
    """
    skew = draw(st.booleans())
    steps = st.integers(-3000, 3000) if skew else st.integers(0, 2500)
    n = draw(st.integers(0, 40))
    log: list[Msg] = []
    phy, ts = draw(st.integers(0, 5)), T0
    for _ in range(n):
        topic = draw(st.sampled_from("TU"))
        keys = draw(st.lists(st.sampled_from("abcdefghij"), max_size=3))
        log.append((topic, keys, phy, ts))
        phy += draw(st.integers(1, 3))
        ts = max(0, ts + draw(steps))
        if skew and draw(st.integers(0, 30)) == 0:
            ts += draw(st.sampled_from([1 << 42, -(1 << 42)]))
            ts = max(0, ts)
    return log, draw(st.integers(1, 4)), draw(st.integers(2, 7))


def build(root: Path, log: list[Msg], slots: int, entries: int) -> IndexService:
    idx = IndexService(root, slot_count=slots, entry_count=entries)
    for topic, keys, phy, ts in log:
        idx.put_message(topic, keys, phy, ts)
    return idx


def answers(idx: IndexService, log: list[Msg]) -> list[list[int]]:
    times = sorted({ts for *_, ts in log}) or [T0]
    spans = [(0, 1 << 62), (times[len(times) // 3], times[2 * len(times) // 3])]
    return [
        idx.query(topic, key, begin, end, limit)
        for topic in "TU"
        for key in "abcdefghij"
        for begin, end in spans
        for limit in (1, 100)
    ]


def tear(idx: IndexService, root: Path, torn: str, phy: int) -> tuple[IndexService, int]:
    """Crash the last file; returns the service reopened and the offset below which
    its data is intact.

    "header": the entry and slot of a put are written but not the header (kill -9);
    "entry": that entry is lost as well (power failure); "counted": the header was
    written but the last entry it counts was lost (power failure).
    """
    intact = 1 << 62
    if not idx.files or idx.files[-1].is_full():
        return idx, intact
    last = idx.files[-1]
    path, number = last.path, last.index_count
    header = path.read_bytes()[:HEADER_SIZE]
    if torn != "counted":
        assert last.put("T#torn", phy, T0)
    elif last.entries:
        number -= 1  # the lost entry may belong to the message before: that goes too
        intact = last._entry(number - 1)[1] if number > 1 else last.begin_phy_offset
    idx.close()
    raw = bytearray(path.read_bytes())
    raw[:HEADER_SIZE] = header
    if torn != "header":
        at = HEADER_SIZE + last.slot_count * 4 + number * ENTRY_SIZE
        raw[at : at + ENTRY_SIZE] = bytes(ENTRY_SIZE)
    path.write_bytes(raw)
    return IndexService(root, slot_count=last.slot_count, entry_count=last.entry_count), intact


@settings(max_examples=100, deadline=None)
@given(
    data=message_logs(),
    cut=st.data(),
    torn=st.sampled_from(["no", "header", "entry", "counted"]),
    undo_cost=st.sampled_from([0, 1 << 40]),  # always undo puts, or always rebuild slots
)
def test_truncation_gives_the_files_of_a_fresh_build(
    data: tuple[list[Msg], int, int], cut: st.DataObject, torn: str, undo_cost: int
) -> None:
    log, slots, entries = data
    offsets = [phy for _, _, phy, _ in log]
    end = offsets[-1] + 1 if log else 1
    at = cut.draw(st.one_of(st.sampled_from([*offsets, end]), st.integers(0, end + 2)))
    times = {phy: ts for _, _, phy, ts in log}
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(index_file, "_UNDO_COST", undo_cost),
    ):
        root, fresh, full = Path(tmp) / "cut", Path(tmp) / "fresh", Path(tmp) / "full"
        idx = build(root, log, slots, entries)
        if torn != "no":
            idx, intact = tear(idx, root, torn, end + 10)  # truncation cuts below a loss
        else:
            intact = 1 << 62
        kept = [m for m in log if m[2] < min(at, intact)]
        expected = build(fresh, kept, slots, entries)
        again = idx.truncate_to_commitlog_offset(at, times.__getitem__)
        indexed = [phy for _, keys, phy, _ in kept if any(keys)]
        assert again == (indexed[-1] + 1 if indexed else 0)
        assert files_of(root) == files_of(fresh)
        assert answers(idx, log) == answers(expected, log)
        expected.close()
        idx.close()
        idx = IndexService(root, slot_count=slots, entry_count=entries)  # survives a reopen
        for topic, keys, phy, ts in log:
            if phy >= again:
                idx.put_message(topic, keys, phy, ts)
        whole = build(full, log, slots, entries)
        assert files_of(root) == files_of(full)
        assert answers(idx, log) == answers(whole, log)
        whole.close()
        idx.close()
