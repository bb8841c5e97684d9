"""numpy views of byte buffers, shared by the vectorized codecs (messages, entries, index).

A record at an arbitrary byte offset cannot be read by plain slicing in numpy
without a Python loop; seen as overlapping `width`-byte items, one starting at
every byte, the records at any set of offsets are one fancy-index gather.

Invariants: `windows` is a view (no copy) of its argument and is valid as long as
that buffer is; `rows` returns a copy, so nothing of the caller's buffer outlives
the call through it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Bools", "I64s", "U8s", "rows", "windows"]

I64s = npt.NDArray[np.int64]
U8s = npt.NDArray[np.uint8]
Bools = npt.NDArray[np.bool_]


def windows(arr: U8s, width: int) -> npt.NDArray[np.void]:
    """Every `width`-byte window of `arr`, by start: `windows(arr, w)[starts]` gathers the
    records of `w` bytes at `starts` (each start at most `len(arr) - w`)."""
    return np.ndarray(
        shape=(len(arr) - width + 1,), dtype=np.dtype(f"V{width}"), buffer=arr, strides=(1,)
    )


def rows(arr: U8s, starts: I64s, width: int) -> U8s:
    """The `width` bytes of `arr` from each start, as the rows of a matrix (a copy)."""
    out: U8s = windows(arr, width)[starts].view(np.uint8).reshape(len(starts), width)
    return out
