"""What a node is: its software version and the Raft wire versions it speaks.

Owns `software_version` (the installed package's version, "unknown" when run from a
tree that was never installed) and re-exports `raftio.wire.WIRE_VERSIONS`, the wire
versions this node speaks. The Status RPC and the `dledger_build_info` metric report
both; which versions may run side by side is docs/upgrades.md's rule.
"""

from __future__ import annotations

import functools
import importlib.metadata

from raftio.wire import WIRE_VERSIONS as WIRE_VERSIONS

PACKAGE = "dledger-py"


@functools.cache
def software_version() -> str:
    """The version of the installed dledger-py package ("unknown": not installed)."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
