"""`ShardedStore`: every data shard of a multi-shard cluster (or of a node's files) as one store.

A multi-shard cluster (docs/scaling.md) keeps each data shard 1..N in a log of
its own, with its own queues (queue ids 0..n-1 in each shard), commit-log
offsets and leader; shard 0 holds only the topic routes. A read covers every
data shard: the shards come from a node's `Route` answer (`shard_count`; 1 from
a single-shard cluster) or, for files, from the directory layout (shard 1 at
the data directory's root, shard g at `groups/<g>`, `node.config.shard_dir`;
shard 0 skipped). Each shard is read by a store of its own (`ServerStore` over
the same channels, every call naming its shard; `OfflineStore` over the shard's
directory), and this store answers `sources`' questions for all of them:

- `queues` lists every shard's queues, each tagged with its shard (a topic's
  queues in shard g are those that shard's store lists: what it has committed,
  whatever the route says now);
- `read`, `read_piece` and `unit_span` go to the shard of the slice or piece
  (all slices of a piece are of one shard: `partitions` cuts per shard);
- `offsets_for_times` sends each shard its queries (`offsets.time_query`).

The `shard` column (a metadata column: not in the default schema, decoded
when named, `sources.METADATA_COLUMNS`) is added here, as a constant column of
each batch; the shard stores never see it.

Invariant: shard 1 is read as a store without shards reads it (no shard
metadata, the same keys and paths).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from analytics.codec import COLUMNS
from analytics.errors import SourceError
from analytics.file_store import LocalFiles, OfflineStore
from analytics.server_store import ServerStore
from analytics.sources import METADATA_COLUMNS, LogPiece, QueueInfo, Slice

if TYPE_CHECKING:
    from analytics.offsets import TimeQuery

SHARD_COLUMN = "shard"
assert SHARD_COLUMN in METADATA_COLUMNS


class ShardedStore:
    """Every data shard of a cluster (`servers`) or a node's directory (`files`)."""

    def __init__(
        self,
        server: ServerStore | None = None,
        path: str | None = None,
        shards: Sequence[int] | None = None,
    ) -> None:
        """One of `server` (shard 1's store; the others share its channels) and `path`;
        `shards`: the data shards, when known (else found on first need)."""
        self._server = server
        self._path = Path(path) if path is not None else None
        self._shards = list(shards) if shards is not None else None
        self._stores: dict[int, ServerStore | OfflineStore] = {}

    @classmethod
    def files(cls, path: str, shards: Sequence[int] | None = None) -> ShardedStore:
        return cls(path=path, shards=shards)

    @property
    def offline(self) -> bool:
        return self._path is not None

    def shards(self) -> list[int]:
        """The data shards read, in order (asked once)."""
        if self._shards is None:
            if self._server is not None:
                self._shards = list(range(1, self._server.shard_count() + 1))
            else:
                assert self._path is not None
                self._shards = file_shards(self._path)
        return self._shards

    def shard(self, g: int) -> ServerStore | OfflineStore:
        """Shard `g`'s store (opened on first use)."""
        store = self._stores.get(g)
        if store is None:
            if self._server is not None:
                store = self._server if g == 1 else self._server.for_shard(g)
            else:
                assert self._path is not None
                store = OfflineStore(self._path if g == 1 else self._path / "groups" / str(g))
            self._stores[g] = store
        return store

    def close(self) -> None:
        for store in self._stores.values():
            if isinstance(store, OfflineStore):
                store.close()
        if self._server is not None:
            self._server.close()  # the channels every shard's store shares
        self._stores.clear()

    # -- planning ----------------------------------------------------------------

    def queues(self, topic: str = "") -> list[QueueInfo]:
        out = []
        for g in self.shards():
            found = self.shard(g).queues(topic)
            out += found if g == 1 else [replace(q, shard=g) for q in found]
        return out

    def offered(self, g: int) -> LocalFiles | None:
        """The files shard `g`'s last QueueOffsets answer offered (servers only)."""
        store = self.shard(g)
        return store.offered if isinstance(store, ServerStore) else None

    def segment_bytes(self, g: int) -> int | None:
        store = self.shard(g)
        return store.segment_bytes if isinstance(store, OfflineStore) else None

    def unit_span(self, slices: Sequence[Slice]) -> tuple[int, int, int] | None:
        """As the stores' (the slices must be of one shard)."""
        if not slices:
            return None
        g = _one_shard(slices)
        return self.shard(g).unit_span(slices)

    def offsets_for_times(self, queries: Sequence[TimeQuery]) -> list[int]:
        """Per query (`offsets.time_query`), the first offset stored at or after it."""
        by_shard: dict[int, list[int]] = {}
        for k, query in enumerate(queries):
            by_shard.setdefault(query[3] if len(query) > 3 else 1, []).append(k)
        out = [0] * len(queries)
        for g, ks in by_shard.items():
            asked = [(queries[k][0], queries[k][1], queries[k][2]) for k in ks]
            for k, offset in zip(ks, self.shard(g).offsets_for_times(asked), strict=True):
                out[k] = offset
        return out

    # -- reading -----------------------------------------------------------------

    def read(
        self, piece: Slice, columns: Sequence[str] = COLUMNS, hint: LocalFiles | None = None
    ) -> Iterator[pa.RecordBatch]:
        """One queue's messages [piece.start, piece.end) (of the piece's shard)."""
        store = self.shard(piece.shard)
        asked = _store_columns(columns)
        if isinstance(store, OfflineStore):
            batches = store.read(piece.topic, piece.queue_id, piece.start, piece.end, asked)
        else:
            batches = store.read(piece.topic, piece.queue_id, piece.start, piece.end, asked, hint)
        return with_shard(batches, columns, piece.shard)

    def read_piece(
        self, piece: LogPiece, columns: Sequence[str], hint: LocalFiles | None = None
    ) -> Iterator[pa.RecordBatch]:
        store = self.shard(piece.shard)
        asked = _store_columns(columns)
        if isinstance(store, OfflineStore):
            batches = store.read_piece(piece, asked)
        else:
            batches = store.read_piece(piece, asked, hint)
        return with_shard(batches, columns, piece.shard)

    def last_path(self, g: int) -> str:
        store = self.shard(g)
        return store.last_path if isinstance(store, ServerStore) else "files"


def file_shards(root: Path) -> list[int]:
    """The data shards of a node's directory: 1 (its root) and every `groups/<g>`, g > 1,
    that holds a commit log (shard 0, the routes, holds no user data)."""
    found = [1]
    base = root / "groups"  # the data directory keeps shard g in groups/<g>
    if base.is_dir():
        for p in base.iterdir():
            if p.name.isdigit() and int(p.name) > 1 and (p / "commitlog" / "data").is_dir():
                found.append(int(p.name))
    if not (root / "commitlog" / "data").is_dir() and len(found) > 1:
        found.remove(1)  # a node that does not host shard 1
    return sorted(found)


def _one_shard(slices: Sequence[Slice]) -> int:
    shards = {s.shard for s in slices}
    if len(shards) != 1:
        raise SourceError(f"a read of several shards at once ({sorted(shards)})")
    return shards.pop()


def _store_columns(columns: Sequence[str]) -> list[str]:
    """The columns a shard's store decodes (the metadata columns are added here)."""
    asked = [c for c in columns if c not in METADATA_COLUMNS]
    return asked or ["queue_id"]  # a read of shard only: the rows, cheaply


def with_shard(
    batches: Iterator[pa.RecordBatch], columns: Sequence[str], shard: int
) -> Iterator[pa.RecordBatch]:
    """`batches` with the columns asked for, in order, `shard` added when asked."""
    if SHARD_COLUMN not in columns:
        yield from batches
        return
    for batch in batches:
        arrays: list[Any] = []
        for c in columns:
            if c == SHARD_COLUMN:
                arrays.append(pa.array(np.full(batch.num_rows, shard, np.int32)))
            else:
                arrays.append(batch.column(c))
        yield pa.RecordBatch.from_arrays(arrays, names=list(columns))
