"""StoreCheckpoint: golden record, atomic replace, corruption, and the abort marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.checkpoint import (
    CHECKPOINT_SIZE,
    AbortMarker,
    Checkpoint,
    StoreCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from store.errors import CorruptEntry

GOLDEN = Checkpoint(1, 2, 3, 4, 5, 6)
GOLDEN_HEX = (
    "444c4350"  # magic "DLCP"
    "00000001"  # version
    "0000000000000001"  # physicMsgTimestamp
    "0000000000000002"  # logicsMsgTimestamp
    "0000000000000003"  # indexMsgTimestamp
    "0000000000000004"  # dispatchedPosition
    "0000000000000005"  # committedPosition
    "0000000000000006"  # flushedPosition
    "00000000"  # reserved
)


def test_golden_record() -> None:
    raw = encode_checkpoint(GOLDEN)
    assert len(raw) == CHECKPOINT_SIZE == 64
    assert raw[:60].hex() == GOLDEN_HEX
    assert decode_checkpoint(raw) == GOLDEN
    assert GOLDEN.min_timestamp_ms == 1


def test_missing_file_is_fresh(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path / "checkpoint") is None
    cp = StoreCheckpoint(tmp_path / "checkpoint")
    assert cp.fresh
    assert cp.current == Checkpoint()


def test_write_read_and_flush_only_when_changed(tmp_path: Path) -> None:
    path = tmp_path / "store" / "checkpoint"
    cp = StoreCheckpoint(path)
    assert cp.flush()  # a fresh store writes its first record
    assert not cp.flush()
    cp.update(dispatched_position=100, physic_msg_timestamp_ms=7)
    assert cp.current.dispatched_position == 100
    assert read_checkpoint(path) == Checkpoint()
    assert cp.flush()
    assert read_checkpoint(path) == Checkpoint(physic_msg_timestamp_ms=7, dispatched_position=100)
    again = StoreCheckpoint(path)
    assert not again.fresh
    assert again.current == cp.current
    assert not again.flush()
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint"]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "0 bytes"),
        (encode_checkpoint(GOLDEN)[:-1], "63 bytes"),
        (bytes(1) + encode_checkpoint(GOLDEN)[1:], "CRC"),
    ],
)
def test_corrupt_record(tmp_path: Path, raw: bytes, reason: str) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(raw)
    with pytest.raises(CorruptEntry, match=reason) as info:
        StoreCheckpoint(path)
    assert info.value.file == str(path)


def test_bad_magic_and_version_with_valid_crc() -> None:
    import zlib

    raw = encode_checkpoint(GOLDEN)
    for at, reason in ((0, "magic"), (7, "version")):
        body = bytearray(raw[:60])
        body[at] ^= 0xFF
        with pytest.raises(CorruptEntry, match=reason):
            decode_checkpoint(bytes(body) + zlib.crc32(body).to_bytes(4, "big"))


def test_leftover_temp_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(path, GOLDEN)
    (tmp_path / "checkpoint.tmp").write_bytes(b"torn")
    assert read_checkpoint(path) == GOLDEN
    write_checkpoint(path, Checkpoint(9))
    assert read_checkpoint(path) == Checkpoint(9)
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_abort_marker(tmp_path: Path) -> None:
    marker = AbortMarker(tmp_path / "abort")
    assert not marker.exists()
    assert marker.create() is False  # clean start
    assert marker.exists()
    assert AbortMarker(tmp_path / "abort").create() is True  # found: the last run crashed
    marker.remove()
    assert not marker.exists()
    marker.remove()  # idempotent
