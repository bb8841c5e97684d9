"""Which store a read uses: a node's files (`path`) or a cluster (`servers`).

Owns `open_store`, the one place that chooses between the two stores
(`file_store.OfflineStore`, `server_store.ServerStore`); both answer the
questions of `sources.MessageStore`.
"""

from __future__ import annotations

from collections.abc import Sequence

from analytics.file_store import OfflineStore
from analytics.server_store import ServerStore
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
    return ServerStore(
        servers, timeout_s=timeout_s, prefer=prefer, access=access, local_reads=local_reads
    )
