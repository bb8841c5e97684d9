"""ConsumeQueue: golden units, idempotent appends, recovery, truncation, retention, model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.consume_queue import (
    BLANK_UNIT,
    UNIT_SIZE,
    ConsumeQueue,
    CqUnit,
    _count_valid_units,
    discover_queues,
    encode_units,
)
from store.errors import ConflictingWrite, OffsetOutOfRange
from store.message import tags_hash_code

PER_FILE = 4
FILE_BYTES = PER_FILE * UNIT_SIZE
BLANK_HEX = "0000000000000000 7fffffff 0000000000000000"


def queue(root: Path, per_file: int = PER_FILE) -> ConsumeQueue:
    return ConsumeQueue(root, "TopicA", 3, units_per_file=per_file, preallocate=False)


def units(n: int, start: int = 0) -> list[tuple[int, int, int]]:
    return [(1000 * (start + i), 100 + start + i, start + i) for i in range(n)]


def test_golden_units(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    assert cq.append(0, 0x1000, 100, tags_hash_code("TagA"))
    assert cq.append(1, 0x2000, 7, tags_hash_code("polygenelubricants"))
    cq.flush()
    path = tmp_path / "consumequeue" / "TopicA" / "3" / "00000000000000000000"
    assert path.read_bytes()[: 2 * UNIT_SIZE] == bytes.fromhex(
        "0000000000001000 00000064 000000000027a807"  # offset, size 100, tagsCode 2598919
        "0000000000002000 00000007 ffffffff80000000"  # a negative hashCode, widened to i64
    )
    assert cq.get(1) == CqUnit(0x2000, 7, -(1 << 31))
    cq.close()


def test_append_read_and_replay(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    assert (cq.min_offset, cq.max_offset, cq.max_commitlog_offset) == (0, 0, -1)
    assert cq.get_range(0, 10) == []
    assert cq.append_batch(0, units(6)) == 6  # spans two files
    assert cq.file_starts() == [0, FILE_BYTES]
    assert cq.get_range(2, 3) == [CqUnit(*u) for u in units(3, 2)]
    assert cq.get_range(4, 100) == [CqUnit(*u) for u in units(6)[4:]]
    assert cq.max_commitlog_offset == 5000 + 105
    assert cq.append_batch(3, units(5)[3:]) == 0  # a replay: no-op
    assert cq.append_batch(5, [units(6)[5], (9000, 1, 0)]) == 1  # half replay, half new
    assert not cq.append(6, 9000, 1, 0)
    with pytest.raises(ConflictingWrite, match="offset 2") as info:
        cq.append_batch(1, [units(6)[1], (2000, 999, 0)])
    assert info.value.offset == 2
    with pytest.raises(OffsetOutOfRange, match="outside"):
        cq.append(8, 10_000, 1, 0)  # a gap
    with pytest.raises(ValueError, match="increase"):
        cq.append(7, 9000, 1, 0)
    with pytest.raises(ValueError, match="positive"):
        cq.append(7, 10_000, 0, 0)
    with pytest.raises(OffsetOutOfRange):
        cq.get(7)
    with pytest.raises(OffsetOutOfRange):
        cq.get_range(8, 1)
    cq.close()


def test_reopen_recovers_the_end(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    cq.append_batch(0, units(9))
    cq.close()
    again = queue(tmp_path)
    assert (again.min_offset, again.max_offset) == (0, 9)
    assert again.get_range(0, 100) == [CqUnit(*u) for u in units(9)]
    again.append(9, 9000, 1, 0)
    again.close()
    assert queue(tmp_path).max_offset == 10


def test_recovery_stops_at_a_hole_and_zeroes_what_follows(tmp_path: Path) -> None:
    cq = queue(tmp_path, per_file=8)
    cq.append_batch(0, units(7))
    cq.close()
    path = tmp_path / "consumequeue" / "TopicA" / "3" / "00000000000000000000"
    raw = bytearray(path.read_bytes())
    raw[3 * UNIT_SIZE : 4 * UNIT_SIZE] = bytes(UNIT_SIZE)  # a unit lost in the crash
    path.write_bytes(raw)
    # A preallocated next file left behind by the crash holds only zeros.
    (path.parent / f"{8 * UNIT_SIZE:020d}").write_bytes(bytes(8 * UNIT_SIZE))
    again = queue(tmp_path, per_file=8)
    assert again.max_offset == 3
    assert path.read_bytes()[3 * UNIT_SIZE :] == bytes(5 * UNIT_SIZE)
    assert again.file_starts() == [0]
    again.append_batch(3, units(2, 3))
    assert again.get_range(0, 10) == [CqUnit(*u) for u in units(5)]
    again.close()


def test_recovery_of_full_files(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    cq.append_batch(0, units(8))  # exactly two full files
    cq.close()
    again = queue(tmp_path)
    assert again.max_offset == 8
    again.append(8, 8000, 1, 0)
    assert again.file_starts() == [0, FILE_BYTES, 2 * FILE_BYTES]
    again.close()


def test_truncate_to_commitlog_offset(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    cq.append_batch(0, units(10))
    assert cq.truncate_to_commitlog_offset(20_000) == 10  # nothing that far
    assert cq.truncate_to_commitlog_offset(4500) == 5
    assert cq.max_offset == 5
    assert cq.max_commitlog_offset == 4000 + 104
    assert cq.file_starts() == [0, FILE_BYTES]
    cq.append_batch(5, units(2, 5))
    assert cq.truncate_to_commitlog_offset(0) == 0
    assert (cq.min_offset, cq.max_offset) == (0, 0)
    cq.close()
    assert queue(tmp_path).max_offset == 0


def test_delete_below_commitlog_offset(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    cq.append_batch(0, units(10))
    assert cq.delete_below_commitlog_offset(5000) == 5
    assert cq.file_starts() == [FILE_BYTES, 2 * FILE_BYTES]
    with pytest.raises(OffsetOutOfRange):
        cq.get(4)
    assert cq.get(5) == CqUnit(*units(10)[5])
    assert cq.delete_below_commitlog_offset(0) == 5  # the minimum never moves back
    assert cq.delete_below_commitlog_offset(1 << 40) == 10  # all gone, the newest file stays
    assert cq.file_starts() == [2 * FILE_BYTES]
    assert cq.get_range(10, 5) == []
    cq.close()
    again = queue(tmp_path)
    assert (again.min_offset, again.max_offset) == (8, 10)  # a reopen starts at the first file
    assert again.delete_below_commitlog_offset(1 << 40) == 10
    again.close()


def test_delete_below_moves_min_inside_a_file_and_again_after_reopen(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    cq.append_batch(0, units(7))
    assert cq.delete_below_commitlog_offset(1500) == 2  # inside the first file: nothing deleted
    assert cq.file_starts() == [0, FILE_BYTES]
    with pytest.raises(OffsetOutOfRange):
        cq.get_range(1, 1)
    assert cq.get_range(2, 1) == [CqUnit(*units(7)[2])]
    cq.close()
    again = queue(tmp_path)
    assert again.min_offset == 0  # the caller corrects it with the commit log's minimum
    assert again.delete_below_commitlog_offset(1500) == 2
    assert again.delete_below_commitlog_offset(4000) == 4
    assert again.file_starts() == [FILE_BYTES]
    again.close()


def test_a_queue_can_start_above_zero(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    assert cq.append_batch(6, units(3, 6)) == 3  # a log that begins at queue offset 6
    assert (cq.min_offset, cq.max_offset) == (6, 9)
    assert cq.file_starts() == [FILE_BYTES, 2 * FILE_BYTES]
    path = tmp_path / "consumequeue" / "TopicA" / "3" / f"{FILE_BYTES:020d}"
    assert path.read_bytes()[: 2 * UNIT_SIZE] == bytes.fromhex(BLANK_HEX * 2)
    assert bytes.fromhex(BLANK_HEX) == encode_units([BLANK_UNIT])
    with pytest.raises(OffsetOutOfRange):
        cq.get(5)
    assert cq.get_range(6, 10) == [CqUnit(*u) for u in units(3, 6)]
    cq.close()
    again = queue(tmp_path)  # the blanks are neither the end of the data nor units
    assert (again.min_offset, again.max_offset) == (6, 9)
    assert again.append_batch(6, units(4, 6)) == 1  # replay, then one more
    assert again.delete_below_commitlog_offset(0) == 6
    assert again.truncate_to_commitlog_offset(0) == 6  # to nothing: empty at 6
    assert (again.min_offset, again.max_offset, again.max_commitlog_offset) == (6, 6, -1)
    again.close()
    empty = queue(tmp_path)
    assert (empty.min_offset, empty.max_offset, empty.max_commitlog_offset) == (6, 6, -1)
    assert empty.get_range(6, 5) == []
    empty.append(6, 6000, 106, 6)
    assert empty.get(6) == CqUnit(*units(1, 6)[0])
    empty.close()


def test_a_start_on_a_file_boundary(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    cq.append_batch(8, units(1, 8))
    assert cq.file_starts() == [2 * FILE_BYTES]
    cq.close()
    again = queue(tmp_path)
    assert (again.min_offset, again.max_offset) == (8, 9)
    # Truncated to nothing, no file would say where the queue is: a file of blanks does.
    assert again.truncate_to_commitlog_offset(0) == 8
    assert queue_files(tmp_path) == {f"{FILE_BYTES:020d}": bytes.fromhex(BLANK_HEX * PER_FILE)}
    again.close()
    empty = queue(tmp_path)
    assert (empty.min_offset, empty.max_offset, empty.max_commitlog_offset) == (8, 8, -1)
    empty.close()


def test_a_queue_emptied_by_retention_restarts_later(tmp_path: Path) -> None:
    cq = queue(tmp_path)
    cq.append_batch(0, units(6))
    with pytest.raises(OffsetOutOfRange):
        cq.append(9, 9000, 1, 0)  # a gap in a queue with live units is still an error
    assert cq.delete_below_commitlog_offset(1 << 40) == 6  # the commit log lost its prefix
    assert cq.append_batch(13, units(2, 13)) == 2  # its new log starts at queue offset 13
    assert (cq.min_offset, cq.max_offset) == (13, 15)
    assert cq.file_starts() == [3 * FILE_BYTES]  # the old files are gone
    with pytest.raises(OffsetOutOfRange):
        cq.append(12, 12_000, 1, 0)
    cq.close()
    fresh = queue(tmp_path / "fresh")
    fresh.append_batch(13, units(2, 13))
    fresh.close()
    assert queue_files(tmp_path) == queue_files(tmp_path / "fresh")


def queue_files(root: Path) -> dict[str, bytes]:
    directory = root / "consumequeue" / "TopicA" / "3"
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_discover_queues(tmp_path: Path) -> None:
    assert discover_queues(tmp_path) == []
    for topic, qid in (("B", 1), ("A", 0), ("A", 2)):
        ConsumeQueue(tmp_path, topic, qid, preallocate=False).close()
    assert discover_queues(tmp_path) == [("A", 0), ("A", 2), ("B", 1)]


def test_count_valid_units() -> None:
    good = encode_units(units(5, 1))
    assert _count_valid_units(good) == 5
    assert _count_valid_units(good + bytes(20) + good) == 5
    assert _count_valid_units(encode_units([(1, 5, 0), (2, -1, 0), (3, 5, 0)])) == 1
    assert _count_valid_units(encode_units([(1, 5, 0), (-2, 1, 0)])) == 1
    assert _count_valid_units(encode_units([(1, 1 << 24, 0), (2, 256, 0)])) == 2
    assert _count_valid_units(good[:-1]) == 4
    assert _count_valid_units(b"") == 0


# -- model-based ---------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 7)),
        st.tuples(st.just("replay"), st.integers(1, 7)),
        st.tuples(st.just("truncate"), st.integers(0, 40)),
        st.tuples(st.just("delete"), st.integers(0, 40)),
        st.tuples(st.just("reopen"), st.just(0)),
        st.tuples(st.just("restart"), st.integers(1, 7)),
    ),
    max_size=30,
)

Unit = tuple[int, int, int]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops)
def test_matches_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    root = tmp_path_factory.mktemp("cq")
    cq = queue(root, per_file=3)
    model: list[Unit | None] = []  # units by queue offset; None below `base`
    base = low = 0  # the model's first unit and min offset
    next_phy = 0

    def kept_below(phy: int) -> int:
        """The queue offset of the first unit at or after commit-log offset `phy`."""
        return base + sum(1 for u in model[base:] if u is not None and u[0] < phy)

    for op, n in ops:
        if op == "append" or (op == "restart" and low < len(model)):
            batch = [(next_phy + 10 * i, 10, next_phy + i) for i in range(n)]
            if op == "restart":  # a gap in a queue with live units
                with pytest.raises(OffsetOutOfRange):
                    cq.append_batch(len(model) + n, batch)
                continue
            assert cq.append_batch(len(model), batch) == n
            model.extend(batch)
            next_phy += 10 * n
        elif op == "restart":  # no live units: the log now starts n units further on
            batch = [(next_phy, 10, 0)]
            assert cq.append_batch(len(model) + n, batch) == 1
            model.extend([None] * n)
            model.extend(batch)
            base = low = len(model) - 1
            next_phy += 10
        elif op == "replay" and len(model) > low:
            first = max(low, len(model) - n)
            assert cq.append_batch(first, model[first:]) == 0  # type: ignore[arg-type]
        elif op == "truncate":
            keep = kept_below(10 * n)
            if keep < low:
                continue  # committed data below retention is never truncated
            assert cq.truncate_to_commitlog_offset(10 * n) == keep
            del model[keep:]
        elif op == "delete":
            low = max(low, kept_below(10 * n))
            assert cq.delete_below_commitlog_offset(10 * n) == low
        elif op == "reopen":
            cq.close()
            cq = queue(root, per_file=3)
            assert cq.min_offset <= low
            low = max(cq.delete_below_commitlog_offset(_phy_floor(model, low)), low)
        assert (cq.min_offset, cq.max_offset) == (low, len(model))
        assert cq.get_range(low, 100) == [CqUnit(*u) for u in model[low:] if u is not None]
    cq.close()
    # The files are those of a queue built from `base` on (minus what retention deleted),
    # except files of blanks that keep the position of a queue truncated to nothing.
    fresh = queue(root / "fresh", per_file=3)
    fresh.append_batch(base, [u for u in model[base:] if u is not None])
    fresh.close()
    files, expected = queue_files(root), queue_files(root / "fresh")
    blank_or_zero = {encode_units([BLANK_UNIT]), bytes(UNIT_SIZE)}
    for name, raw in files.items():
        units_of = {raw[k : k + UNIT_SIZE] for k in range(0, len(raw), UNIT_SIZE)}
        assert expected.get(name) == raw or units_of <= blank_or_zero
    if low < len(model):
        assert max(files) == max(expected)


def _phy_floor(model: list[Unit | None], low: int) -> int:
    """The commit-log minimum that makes `low` the first live unit."""
    if low < len(model) and (unit := model[low]) is not None:
        return unit[0]
    return max((u[0] + 1 for u in model if u is not None), default=0)
