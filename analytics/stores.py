"""Which store a read uses: a node's files (`path`) or a cluster (`servers`).

Owns `open_store`, the one place that chooses between the two stores
(`file_store.OfflineStore`, `server_store.ServerStore`); both answer the
questions of `sources.MessageStore`, of one shard (shard 1: all of a
single-shard cluster). `open_shards` opens every data shard of either
(`shard_stores.ShardedStore`): what the Spark source reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from analytics.file_store import OfflineStore
from analytics.server_store import ServerStore
from analytics.shard_stores import ShardedStore
from dledger_commitlog.client import Access


def open_store(
    servers: Sequence[str] = (),
    path: str | None = None,
    timeout_s: float = 30.0,
    prefer: int = 0,
    access: Access | None = None,
    local_reads: bool = True,
) -> ServerStore | OfflineStore:
    """The files under `path` if given, else the cluster at `servers`."""
    if path:
        return OfflineStore(path)
    return _server(servers, timeout_s, prefer, access, local_reads)


def open_shards(
    servers: Sequence[str] = (),
    path: str | None = None,
    timeout_s: float = 30.0,
    prefer: int = 0,
    access: Access | None = None,
    local_reads: bool = True,
    shards: Sequence[int] | None = None,
) -> ShardedStore:
    """Every data shard of the files under `path` if given, else of the cluster at
    `servers`; `shards`: the data shards when known (else asked on first need)."""
    if path:
        return ShardedStore.files(path, shards)
    return ShardedStore(
        server=_server(servers, timeout_s, prefer, access, local_reads), shards=shards
    )


def _server(
    servers: Sequence[str],
    timeout_s: float,
    prefer: int,
    access: Access | None,
    local_reads: bool,
) -> ServerStore:
    return ServerStore(
        servers, timeout_s=timeout_s, prefer=prefer, access=access, local_reads=local_reads
    )
