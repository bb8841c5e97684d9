"""`store.fileio.same_contents`: equal bytes, holes read as zeros, any difference found."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.fileio import same_contents

SIZE = 64 << 20  # sparse: a few pages written


def sparse(path: Path, writes: dict[int, bytes], size: int = SIZE) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
        for at, data in writes.items():
            f.seek(at)
            f.write(data)
    return path


def test_equal_sparse_files_are_the_same(tmp_path: Path) -> None:
    writes = {0: b"head", 5 << 20: b"x" * 5000, SIZE - 3: b"end"}
    assert same_contents(sparse(tmp_path / "a", writes), sparse(tmp_path / "b", writes))


def test_written_zeros_equal_a_hole(tmp_path: Path) -> None:
    a = sparse(tmp_path / "a", {1 << 20: b"data"})
    b = sparse(tmp_path / "b", {1 << 20: b"data", 9 << 20: bytes(3 << 20)})
    assert same_contents(a, b) and same_contents(b, a)


@pytest.mark.parametrize("at", [0, 4095, 7 << 20, SIZE - 1])
def test_one_byte_anywhere_differs(tmp_path: Path, at: int) -> None:
    a = sparse(tmp_path / "a", {1 << 20: b"data"})
    b = sparse(tmp_path / "b", {1 << 20: b"data", at: b"\x01"})
    assert not same_contents(a, b) and not same_contents(b, a)


def test_a_different_size_differs(tmp_path: Path) -> None:
    a = sparse(tmp_path / "a", {}, SIZE)
    b = sparse(tmp_path / "b", {}, SIZE + 1)
    assert not same_contents(a, b)


def test_empty_files_are_the_same(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"")
    (tmp_path / "b").write_bytes(b"")
    assert same_contents(tmp_path / "a", tmp_path / "b")
