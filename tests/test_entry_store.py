"""EntryStore: DLedger entry format, fillers, truncation, retention and recovery."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from dledger_commitlog.log.entry_store import EntryStore
from raft.types import Entry, EntryKind
from store.entry_format import (
    ENTRY_MAGIC,
    FILLER_MAGIC,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    encode_entry,
)
from store.errors import CorruptEntry
from store.message import StoredMessage, decode_message, encode_message

SEG = 4096
ISEG = 32 * 64


def open_store(path: Path, committed_index: int = 0) -> EntryStore:
    return EntryStore(
        path, data_segment_bytes=SEG, index_segment_bytes=ISEG, committed_index=committed_index
    )


def body(i: int, size: int = 300) -> bytes:
    return (f"entry-{i}-".encode() * (size // 8 + 1))[:size]


def fill(store: EntryStore, n: int, term: int = 1, size: int = 300) -> None:
    start = store.last_index() + 1
    store.append([Entry(i, term, body(i, size)) for i in range(start, start + n)])


def test_golden_header_bytes() -> None:
    header, chain = encode_entry(0, index=1, term=2, pos=0, channel=0, body=b"hello")
    assert header.hex() == (
        "cafebabe"
        "00000035"
        "0000000000000001"
        "0000000000000002"
        "0000000000000000"
        "00000000"
        f"{chain:08x}"
        "3610a686"
        "00000005"
    )
    assert HEADER_SIZE == 48


def test_append_and_read_back(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    assert (s.first_index(), s.last_index(), s.term(0)) == (1, 0, 0)
    fill(s, 30, term=1)
    fill(s, 5, term=3)
    assert (s.first_index(), s.last_index()) == (1, 35)
    assert s.term(30) == 1 and s.term(31) == 3 and s.term(35) == 3
    e = s.get(17)
    assert (e.index, e.term, e.body) == (17, 1, body(17))
    assert s.get_by_pos(e.pos) == e
    with pytest.raises(IndexError):
        s.get_by_pos(e.pos + 1)
    got = s.entries(3, 36, max_bytes=1 << 20)
    assert [x.index for x in got] == list(range(3, 36))
    assert [x.data for x in got[:2]] == [body(3), body(4)]
    assert len(s.entries(3, 36, max_bytes=700)) == 2
    assert len(s.entries(3, 36, max_bytes=1)) == 1
    assert s.read_raw(e.pos, HEADER_SIZE) == HEADER.pack(
        ENTRY_MAGIC, e.size, 17, 1, e.pos, 0, e.chain_crc, e.body_crc, len(e.body)
    )
    s.close()


def test_entries_never_straddle_a_segment(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 40, size=700)  # 748-byte entries: five fit in 4096 with room for a filler
    for i in range(1, 41):
        e = s.get(i)
        assert e.pos // SEG == (e.pos + e.size - 1) // SEG
    first_in_second = s.get(6)
    assert first_in_second.pos == SEG
    filler_at = s.get(5).pos + s.get(5).size
    assert struct.unpack(">ii", s.read_raw(filler_at, 8)) == (FILLER_MAGIC, SEG - filler_at)
    s.close()


def test_entry_larger_than_a_segment_is_refused(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    with pytest.raises(ValueError, match="exceeds the segment size"):
        s.append([Entry(1, 1, bytes(SEG))])
    assert s.last_index() == 0
    s.close()


def test_gaps_and_term_regressions_are_refused(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 3, term=2)
    with pytest.raises(ValueError, match="gap"):
        s.append([Entry(5, 2, b"x")])
    with pytest.raises(ValueError, match="does not follow"):
        s.append([Entry(4, 1, b"x")])
    s.close()


def test_append_truncates_a_conflicting_suffix_and_it_stays_gone(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 20, term=1)
    s.append([Entry(15, 2, b"new-15"), Entry(16, 2, b"new-16")])
    assert s.last_index() == 16
    assert s.get(15).body == b"new-15" and s.term(16) == 2
    s.flush()
    s.close()
    r = open_store(tmp_path)
    assert r.last_index() == 16
    assert [e.data for e in r.entries(14, 17, 1 << 20)] == [body(14), b"new-15", b"new-16"]
    r.close()


def test_truncate_suffix_then_reopen_without_new_writes(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 25)
    s.truncate_suffix(11)
    assert (s.last_index(), s.term(10)) == (10, 1)
    s.flush()
    s.close()
    r = open_store(tmp_path)
    assert r.last_index() == 10  # the old 11..25 chain validly from 10 but were zeroed
    r.close()


def test_delete_prefix_keeps_the_term_of_the_entry_before_first(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 20, term=1, size=700)
    fill(s, 20, term=2, size=700)
    first = s.delete_prefix(23)
    assert 1 < first <= 23
    assert s.first_index() == first
    term_before_first = s.term(first - 1)
    assert term_before_first == (1 if first - 1 <= 20 else 2)
    with pytest.raises(IndexError):
        s.get(first - 1)
    assert s.get(first).index == first
    s.write_checkpoint(40)
    s.close()
    r = open_store(tmp_path)
    assert (r.first_index(), r.last_index()) == (first, 40)
    assert r.term(first - 1) == term_before_first
    r.close()


def test_message_bodies_get_their_physical_offset(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 3)
    raw = encode_message(StoredMessage(topic="orders", body=b"payload"))
    s.append([Entry(4, 1, raw), Entry(5, 1, raw, EntryKind.NORMAL)])
    for i in (4, 5):
        e = s.get(i)
        assert decode_message(e.body).physical_offset == e.pos + HEADER_SIZE
    assert s.get(1).body == body(1)  # not a message: untouched
    s.close()


def test_replicas_appending_the_same_entries_are_byte_identical(tmp_path: Path) -> None:
    raw = encode_message(StoredMessage(topic="t", body=b"x" * 500))
    entries = [Entry(i, 1 + i // 7, raw if i % 2 else body(i)) for i in range(1, 60)]
    a, b = open_store(tmp_path / "a"), open_store(tmp_path / "b")
    a.append(entries)
    for k in range(0, len(entries), 9):  # the follower gets them in other batches
        b.append(entries[k : k + 9])
    assert a.read_raw(0, a.end_pos) == b.read_raw(0, b.end_pos)
    assert a.last_chain_crc == b.last_chain_crc
    a.close()
    b.close()


def _last_segment(path: Path) -> Path:
    return sorted((path / "data").iterdir())[-1]


@pytest.mark.parametrize("seed", range(12))
def test_cut_tail_recovers_to_last_whole_entry(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    s = open_store(tmp_path)
    fill(s, rng.randint(10, 40), size=rng.randint(50, 900))
    before = {e.index: e for e in s.stored_entries(1, s.last_index() + 1, 1 << 30)}
    end = s.end_pos
    s.flush()
    s.close()
    cut = rng.randint(end - end % SEG, end)
    with open(_last_segment(tmp_path), "r+b") as f:
        f.truncate(cut - (end - end % SEG))
    r = open_store(tmp_path)
    last = r.last_index()
    assert all(before[i].pos + before[i].size <= cut for i in range(1, last + 1)), f"seed={seed}"
    assert last == max(i for i, e in before.items() if e.pos + e.size <= cut), f"seed={seed}"
    for i in range(1, last + 1):
        assert r.get(i) == before[i], f"seed={seed}"
    fill(r, 3, term=5)  # and the store keeps working
    assert r.get(last + 3).term == 5
    r.close()


@pytest.mark.parametrize("seed", range(12))
def test_flipped_tail_byte_cuts_that_entry_and_after(tmp_path: Path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    s = open_store(tmp_path)
    size = rng.randint(50, 600)
    fill(s, 30, size=size)
    victim = s.get(rng.randint(25, 30))
    s.flush()
    s.close()
    _flip(tmp_path, victim.pos + rng.randrange(victim.size), rng)
    r = open_store(tmp_path)
    assert r.last_index() == victim.index - 1, f"seed={seed}"
    assert r.get(victim.index - 1).body == body(victim.index - 1, size)
    r.close()


def _flip(path: Path, pos: int, rng: random.Random) -> None:
    seg = sorted((path / "data").iterdir())[pos // SEG]
    with open(seg, "r+b") as f:
        f.seek(pos % SEG)
        b = f.read(1)[0]
        f.seek(pos % SEG)
        f.write(bytes([b ^ (1 << rng.randrange(8))]))


@pytest.mark.parametrize("seed", range(6))
def test_flip_above_the_checkpoint_cuts_the_log_and_names_what_is_missing(
    tmp_path: Path, seed: int
) -> None:
    """A committed entry damaged above the checkpoint: the log is cut there, never
    served, and the store reports the committed entries it must get back."""
    rng = random.Random(2000 + seed)
    s = open_store(tmp_path)
    fill(s, 20)
    s.write_checkpoint(8)
    fill(s, 20)
    victim = s.get(rng.randint(12, 35))
    s.flush()
    s.close()
    _flip(tmp_path, victim.pos + rng.randrange(victim.size), rng)
    s = open_store(tmp_path, committed_index=40)
    assert s.last_index() == victim.index - 1, f"seed={seed}"
    cut = s.tail_cut
    assert cut is not None and cut.pos == victim.pos and cut.index == victim.index
    assert cut.file.endswith(f"{victim.pos // SEG * SEG:020d}"), f"seed={seed}"
    assert s.missing_through == 40, f"seed={seed}"
    s.close()


def test_a_checkpointed_entry_that_changed_is_an_error(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 10)
    s.write_checkpoint(10)
    target = s.get(10)
    s.close()
    _flip(tmp_path, target.pos + HEADER_SIZE + 3, random.Random(0))
    with pytest.raises(CorruptEntry, match="checkpointed entry 10"):
        open_store(tmp_path)


def test_corruption_before_the_scan_is_caught_on_read(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 40)
    s.write_checkpoint(40)
    old = s.get(3)
    s.close()
    _flip(tmp_path, old.pos + HEADER_SIZE + 10, random.Random(1))
    r = open_store(tmp_path)
    assert r.last_index() == 40
    with pytest.raises(CorruptEntry, match="body CRC"):
        r.get(3)
    r.close()


def test_index_is_rebuilt_when_it_disagrees_or_is_gone(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 30)
    expected = s.stored_entries(1, 31, 1 << 30)
    s.flush()
    s.close()
    seg = sorted((tmp_path / "index").iterdir())[0]
    with open(seg, "r+b") as f:  # wreck entry 20's unit
        f.seek(20 * 32)
        f.write(INDEX_UNIT.pack(ENTRY_MAGIC, 1, 2, 3, 4))
    r = open_store(tmp_path)
    assert r.stored_entries(1, 31, 1 << 30) == expected
    r.close()
    for p in (tmp_path / "index").iterdir():
        p.unlink()
    r = open_store(tmp_path)
    assert r.stored_entries(1, 31, 1 << 30) == expected
    r.close()


def test_torn_first_write_gives_an_empty_store(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 1)
    s.close()
    with open(_last_segment(tmp_path), "r+b") as f:
        f.truncate(20)
    r = open_store(tmp_path)
    assert (r.first_index(), r.last_index()) == (1, 0)
    fill(r, 2)
    assert r.last_index() == 2
    r.close()
    assert os.listdir(tmp_path / "data")


def test_committed_entries_cannot_be_truncated(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 10)
    s.write_checkpoint(7)
    with pytest.raises(ValueError, match="committed"):
        s.append([Entry(7, 2, b"rewrite")])
    s.append([Entry(8, 2, b"fine")])
    assert (s.last_index(), s.get(7).body) == (8, body(7))
    s.close()


# --- recovery after a power loss: the on-disk states the driver simulation found --


def _index_files(path: Path) -> list[Path]:
    return sorted((path / "index").iterdir())


def _wreck_index(path: Path, from_byte: int, how: str, rng: random.Random) -> None:
    """What a power loss leaves of index bytes written since its last fsync (the index
    is buffered and fsynced only by an entry checkpoint): zeros, junk, or no file."""
    for seg in _index_files(path):
        start = int(seg.name)
        if how == "missing" and start >= from_byte - from_byte % ISEG:
            seg.unlink()
            continue
        raw = bytearray(seg.read_bytes())
        keep = max(0, from_byte - start)
        if keep < len(raw):
            n = len(raw) - keep
            raw[keep:] = rng.randbytes(n) if how == "garbage" else bytes(n)
            seg.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["zeroed", "garbage", "missing"])
def test_a_power_loss_before_any_checkpoint_keeps_the_whole_index(tmp_path: Path, how: str) -> None:
    """No checkpoint: the index never reached the disk. Recovery rebuilds it from the
    log's start (the sentinel), not only over the last segments it used to scan."""
    s = open_store(tmp_path)
    fill(s, 60, term=1)
    fill(s, 10, term=2)  # 70 entries of 348 bytes: 7 segments
    expected = s.stored_entries(1, 71, 1 << 30)
    s.flush()
    s.close()
    _wreck_index(tmp_path, 0, how, random.Random(7))
    r = open_store(tmp_path)
    assert (r.first_index(), r.last_index(), r.term(0)) == (1, 70, 0)
    assert [r.term(i) for i in (1, 60, 61, 70)] == [1, 1, 2, 2]
    assert r.stored_entries(1, 71, 1 << 30) == expected
    r.close()


def test_index_files_gone_below_the_checkpoint_are_rebuilt_from_the_data(tmp_path: Path) -> None:
    """With a checkpoint the index below it is trusted (fsynced by the checkpoint):
    checked at both ends of that range, it is rebuilt from the data when missing."""
    s = open_store(tmp_path)
    fill(s, 70)
    expected = s.stored_entries(1, 71, 1 << 30)
    s.write_checkpoint(65)
    s.close()
    for seg in _index_files(tmp_path):
        seg.unlink()
    r = open_store(tmp_path)
    assert (r.first_index(), r.last_index(), r.term(0)) == (1, 70, 0)
    assert r.stored_entries(1, 71, 1 << 30) == expected
    r.close()


def _restore_near_a_segment_end(path: Path) -> EntryStore:
    """A follower restored from a snapshot whose base (entry 10) ends 30 bytes before
    its segment does: entry 11 opens the next segment, after a filler."""
    s = open_store(path)
    s.restore(10, 1, struct.pack(">qqqI", 10, 1, SEG - 30, 12345))
    return s


@pytest.mark.parametrize("checkpoint", [False, True])
def test_recovery_after_a_restore_skips_the_filler_after_the_base(
    tmp_path: Path, checkpoint: bool
) -> None:
    s = _restore_near_a_segment_end(tmp_path)
    fill(s, 4)
    assert s.get(11).pos == SEG
    expected = s.stored_entries(11, 15, 1 << 30)
    if checkpoint:
        s.write_checkpoint(12)
    s.flush()
    s.close()
    r = open_store(tmp_path, committed_index=12)
    assert (r.first_index(), r.last_index(), r.term(10)) == (11, 14, 1)
    assert r.tail_cut is None and r.missing_through == 0
    assert r.stored_entries(11, 15, 1 << 30) == expected
    fill(r, 1)
    assert r.get(15).index == 15
    r.close()


def test_a_torn_filler_after_the_base_cuts_back_to_the_base(tmp_path: Path) -> None:
    """Nothing after the base reached the disk but entry 11's bytes (not fsynced):
    the log restarts after the base, and the next append lands where the leader's did."""
    s = _restore_near_a_segment_end(tmp_path)
    fill(s, 2)
    s.close()
    with open(sorted((tmp_path / "data").iterdir())[0], "r+b") as f:
        f.seek(SEG - 30)
        f.write(bytes(30))  # the filler's sector never reached the disk
    r = open_store(tmp_path)
    assert (r.first_index(), r.last_index(), r.term(10)) == (11, 10, 1)
    fill(r, 1)
    assert r.get(11).pos == SEG
    r.close()


def test_retention_after_a_restore_near_a_segment_end(tmp_path: Path) -> None:
    """The first segment holds only the filler after the base: nothing to drop until
    retention reaches past entry 11's segment."""
    s = _restore_near_a_segment_end(tmp_path)
    fill(s, 30)  # 11 entries a segment: 11..21 from SEG, 22..32 from 2 * SEG
    assert s.delete_prefix(15) == 11
    assert (s.first_index(), s.term(10), s.base) == (11, 1, (10, 1, SEG - 30, 12345))
    assert s.delete_prefix(25) == 22
    assert (s.first_index(), s.term(21)) == (22, 1)
    s.close()
    r = open_store(tmp_path)
    assert (r.first_index(), r.last_index(), r.term(21)) == (22, 40, 1)
    assert r.get(22).index == 22
    r.close()


@pytest.mark.parametrize("how", ["zeroed", "garbage"])
def test_retention_beyond_the_checkpoint_then_a_power_loss(tmp_path: Path, how: str) -> None:
    """The slot of the entry before the new first one was written after the last
    checkpoint's fsync: recovery rebuilds it from entries.base."""
    s = open_store(tmp_path)
    fill(s, 30, term=1)
    s.write_checkpoint(5)  # fsyncs the index: slots 0..30
    fill(s, 30, term=2)
    fill(s, 20, term=3)
    s.flush()
    first = s.delete_prefix(70)
    assert 61 < first <= 70
    expected = s.stored_entries(first, 81, 1 << 30)
    s.close()
    _wreck_index(tmp_path, 31 * 32, how, random.Random(3))
    r = open_store(tmp_path)
    assert (r.first_index(), r.last_index(), r.term(first - 1)) == (first, 80, 3)
    assert r.stored_entries(first, 81, 1 << 30) == expected
    r.close()


def _tear_header_tail(path: Path, pos: int) -> None:
    """A header straddling a sector boundary whose second sector never reached the
    disk: its last 16 bytes (channel, chainCrc, bodyCrc, bodyLen) are zeros."""
    seg = sorted((path / "data").iterdir())[pos // SEG]
    with open(seg, "r+b") as f:
        f.seek(pos % SEG + HEADER_SIZE - 16)
        f.write(bytes(16))


@pytest.mark.parametrize("restored", [False, True])
def test_a_torn_first_entry_is_cut_not_served(tmp_path: Path, restored: bool) -> None:
    """An empty NOOP whose header tail is zeros still passes every check but its chain
    link (it would come back as an empty NORMAL entry): the first entry's link to the
    sentinel or to the base is checked."""
    s = _restore_near_a_segment_end(tmp_path) if restored else open_store(tmp_path)
    first = s.last_index() + 1
    s.append([Entry(first, 1, b"", EntryKind.NOOP)])
    pos = s.get(first).pos
    s.flush()
    s.close()
    _tear_header_tail(tmp_path, pos)
    r = open_store(tmp_path)
    assert r.last_index() == first - 1
    assert r.tail_cut is not None and r.tail_cut.index == first and r.tail_cut.pos == pos
    fill(r, 1)
    assert r.get(first).body == body(first)
    r.close()


def test_a_checkpointed_first_entry_with_a_changed_channel_is_an_error(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.append([Entry(1, 1, b"", EntryKind.NOOP)])
    s.write_checkpoint(1)
    s.close()
    seg = sorted((tmp_path / "data").iterdir())[0]
    with open(seg, "r+b") as f:
        f.seek(32)  # the channel (not covered by the body CRC): NOOP -> NORMAL
        f.write(bytes(4))
    with pytest.raises(CorruptEntry, match="checkpointed entry 1"):
        open_store(tmp_path)


def test_what_recovery_finds_is_made_durable_before_it_counts_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a process crash the entries it appended but never fsynced are still in the
    files (the page cache), and the reopened store reports them durable (the driver
    acknowledges them): so opening fdatasyncs every data segment first, else a power
    loss soon after could take acknowledged entries."""
    s = open_store(tmp_path)
    s.append_entries([Entry(i, 1, body(i)) for i in range(1, 40)])  # several segments
    s.close()  # no flush: as a kill -9 leaves them
    segments = {p.name for p in (tmp_path / "data").iterdir()}
    assert len(segments) > 1
    synced: list[str] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    reopened = open_store(tmp_path)
    assert reopened.last_index() == 39
    assert segments <= set(synced)
    reopened.close()


def _one_by_one(s: EntryStore, lo: int, hi: int, max_bytes: int) -> list[Entry]:
    return [
        Entry(e.index, e.term, e.body, EntryKind(e.channel))
        for e in s.stored_entries(lo, hi, max_bytes)
    ]


def test_runs_read_from_the_files_are_the_entries_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of entries not in memory (a leader catching a follower up) is read and
    checked at once, and is what decoding them one by one gives, cut by size alike,
    fillers at segment ends and NOOP entries included."""
    s = open_store(tmp_path)
    rng = random.Random(5)
    for i in range(1, 201):
        kind = EntryKind.NOOP if i % 37 == 0 else EntryKind.NORMAL
        s.append([Entry(i, 1 + i // 50, b"" if kind else body(i, rng.randrange(1, 700)), kind)])
    s.write_checkpoint(200)
    s.close()
    r = open_store(tmp_path, committed_index=200)  # nothing in memory
    for lo, hi, max_bytes in [
        (1, 201, 1 << 30),
        (1, 201, 5000),
        (3, 60, 1),
        (17, 40, 2500),
        (150, 201, 9000),
        (180, 200, 0),
    ]:
        with monkeypatch.context() as m:  # the run's own read, not the one-by-one one
            m.setattr(r, "stored_entries", None)
            got = r.entries(lo, hi, max_bytes)
        assert got == _one_by_one(r, lo, hi, max_bytes), (lo, hi, max_bytes)
    assert len(r.entries(1, 201, 1 << 30)) == 200
    r.close()


@pytest.mark.parametrize("where", ["body", "magic", "position"])
def test_a_damaged_entry_in_a_run_is_the_same_corrupt_entry_as_one_by_one(
    tmp_path: Path, where: str
) -> None:
    s = open_store(tmp_path)
    fill(s, 60)
    s.write_checkpoint(60)
    bad = s.get(33)
    s.close()
    seg = SEG * (bad.pos // SEG)
    path = tmp_path / "data" / f"{seg:020d}"
    raw = bytearray(path.read_bytes())
    at = bad.pos - seg + {"body": HEADER_SIZE + 5, "magic": 0, "position": 28}[where]
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    r = open_store(tmp_path, committed_index=60)
    with pytest.raises(CorruptEntry) as one:
        _one_by_one(r, 20, 50, 1 << 30)
    with pytest.raises(CorruptEntry) as run:
        r.entries(20, 50, 1 << 30)
    assert str(run.value) == str(one.value)
    assert r.entries(1, 33, 1 << 30) == _one_by_one(r, 1, 33, 1 << 30)  # before it: served
    r.close()
