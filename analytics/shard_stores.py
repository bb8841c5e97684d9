"""`ShardedStore`: every data group of a multi-Raft cluster (or of a node's files) as one store.

A multi-Raft cluster (docs/scaling.md) keeps each data group 1..N in a log of
its own, with its own queues (queue ids 0..n-1 in each group), commit-log
offsets and leader; group 0 holds only the topic routes. A read covers every
data group: the groups come from a node's `Route` answer (`shard_count`; 1 from
a single-group cluster) or, for files, from the directory layout (group 1 at
the data directory's root, group g at `groups/<g>`, `node.config.shard_dir`;
group 0 skipped). Each group is read by a store of its own (`ServerStore` over
the same channels, every call naming its group; `OfflineStore` over the group's
directory), and this store answers `sources`' questions for all of them:

- `queues` lists every group's queues, each tagged with its group (a topic's
  queues in group g are those that group's store lists: what it has committed,
  whatever the route says now);
- `read`, `read_piece` and `unit_span` go to the group of the slice or piece
  (all slices of a piece are of one group: `partitions` cuts per group);
- `offsets_for_times` sends each group its queries (`offsets.time_query`).

The `shard` column (a metadata column: not in the default schema, decoded
when named, `sources.METADATA_COLUMNS`) is added here, as a constant column of
each batch; the group stores never see it.

Invariant: group 1 is read as a store without groups reads it (no group
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
    """Every data group of a cluster (`servers`) or a node's directory (`files`)."""

    def __init__(
        self,
        server: ServerStore | None = None,
        path: str | None = None,
        groups: Sequence[int] | None = None,
    ) -> None:
        """One of `server` (group 1's store; the others share its channels) and `path`;
        `groups`: the data groups, when known (else found on first need)."""
        self._server = server
        self._path = Path(path) if path is not None else None
        self._groups = list(groups) if groups is not None else None
        self._stores: dict[int, ServerStore | OfflineStore] = {}

    @classmethod
    def files(cls, path: str, groups: Sequence[int] | None = None) -> ShardedStore:
        return cls(path=path, groups=groups)

    @property
    def offline(self) -> bool:
        return self._path is not None

    def groups(self) -> list[int]:
        """The data groups read, in order (asked once)."""
        if self._groups is None:
            if self._server is not None:
                self._groups = list(range(1, self._server.shard_count() + 1))
            else:
                assert self._path is not None
                self._groups = file_groups(self._path)
        return self._groups

    def group(self, g: int) -> ServerStore | OfflineStore:
        """Group `g`'s store (opened on first use)."""
        store = self._stores.get(g)
        if store is None:
            if self._server is not None:
                store = self._server if g == 1 else self._server.for_group(g)
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
            self._server.close()  # the channels every group's store shares
        self._stores.clear()

    # -- planning ----------------------------------------------------------------

    def queues(self, topic: str = "") -> list[QueueInfo]:
        out = []
        for g in self.groups():
            found = self.group(g).queues(topic)
            out += found if g == 1 else [replace(q, group=g) for q in found]
        return out

    def offered(self, g: int) -> LocalFiles | None:
        """The files group `g`'s last QueueOffsets answer offered (servers only)."""
        store = self.group(g)
        return store.offered if isinstance(store, ServerStore) else None

    def segment_bytes(self, g: int) -> int | None:
        store = self.group(g)
        return store.segment_bytes if isinstance(store, OfflineStore) else None

    def unit_span(self, slices: Sequence[Slice]) -> tuple[int, int, int] | None:
        """As the stores' (the slices must be of one group)."""
        if not slices:
            return None
        g = _one_group(slices)
        return self.group(g).unit_span(slices)

    def offsets_for_times(self, queries: Sequence[TimeQuery]) -> list[int]:
        """Per query (`offsets.time_query`), the first offset stored at or after it."""
        by_group: dict[int, list[int]] = {}
        for k, query in enumerate(queries):
            by_group.setdefault(query[3] if len(query) > 3 else 1, []).append(k)
        out = [0] * len(queries)
        for g, ks in by_group.items():
            asked = [(queries[k][0], queries[k][1], queries[k][2]) for k in ks]
            for k, offset in zip(ks, self.group(g).offsets_for_times(asked), strict=True):
                out[k] = offset
        return out

    # -- reading -----------------------------------------------------------------

    def read(
        self, piece: Slice, columns: Sequence[str] = COLUMNS, hint: LocalFiles | None = None
    ) -> Iterator[pa.RecordBatch]:
        """One queue's messages [piece.start, piece.end) (of the piece's group)."""
        store = self.group(piece.group)
        asked = _store_columns(columns)
        if isinstance(store, OfflineStore):
            batches = store.read(piece.topic, piece.queue_id, piece.start, piece.end, asked)
        else:
            batches = store.read(piece.topic, piece.queue_id, piece.start, piece.end, asked, hint)
        return with_group(batches, columns, piece.group)

    def read_piece(
        self, piece: LogPiece, columns: Sequence[str], hint: LocalFiles | None = None
    ) -> Iterator[pa.RecordBatch]:
        store = self.group(piece.group)
        asked = _store_columns(columns)
        if isinstance(store, OfflineStore):
            batches = store.read_piece(piece, asked)
        else:
            batches = store.read_piece(piece, asked, hint)
        return with_group(batches, columns, piece.group)

    def last_path(self, g: int) -> str:
        store = self.group(g)
        return store.last_path if isinstance(store, ServerStore) else "files"


def file_groups(root: Path) -> list[int]:
    """The data groups of a node's directory: 1 (its root) and every `groups/<g>`, g > 1,
    that holds a commit log (group 0, the routes, holds no user data)."""
    found = [1]
    base = root / "groups"
    if base.is_dir():
        for p in base.iterdir():
            if p.name.isdigit() and int(p.name) > 1 and (p / "commitlog" / "data").is_dir():
                found.append(int(p.name))
    if not (root / "commitlog" / "data").is_dir() and len(found) > 1:
        found.remove(1)  # a node that does not host group 1
    return sorted(found)


def _one_group(slices: Sequence[Slice]) -> int:
    groups = {s.group for s in slices}
    if len(groups) != 1:
        raise SourceError(f"a read of several Raft groups at once ({sorted(groups)})")
    return groups.pop()


def _store_columns(columns: Sequence[str]) -> list[str]:
    """The columns a group's store decodes (the metadata columns are added here)."""
    asked = [c for c in columns if c not in METADATA_COLUMNS]
    return asked or ["queue_id"]  # a read of shard only: the rows, cheaply


def with_group(
    batches: Iterator[pa.RecordBatch], columns: Sequence[str], group: int
) -> Iterator[pa.RecordBatch]:
    """`batches` with the columns asked for, in order, `shard` added when asked."""
    if SHARD_COLUMN not in columns:
        yield from batches
        return
    for batch in batches:
        arrays: list[Any] = []
        for c in columns:
            if c == SHARD_COLUMN:
                arrays.append(pa.array(np.full(batch.num_rows, group, np.int32)))
            else:
                arrays.append(batch.column(c))
        yield pa.RecordBatch.from_arrays(arrays, names=list(columns))
