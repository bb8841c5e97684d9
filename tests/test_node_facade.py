"""The node's one surface: the client service and the leader-side services reach the
node only through `RaftNode`'s public methods (its facade), never through its parts.

The import contracts (`lint-imports`, pyproject.toml) keep the layers apart; this
test checks what they cannot see: every attribute read of the node in `service/`
and `messaging/` names a method or property the facade defines, or a part it hands
out (`committed`, the committed reads; `membership`, the members and changes of
them), never another part (`commitlog`, `core`, `dispatcher`, `store`) to reach
through. A recovered node's
status is read back through the facade as the Status RPC reads it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path

import dledger_commitlog
from dledger_commitlog.node.node import RaftNode
from dledger_commitlog.service.admin import status_pb
from tests.lone_node import lone_config

_PACKAGE = Path(dledger_commitlog.__file__).parent
_NODE_NAMES = ("node", "_node")  # how the service and the system log hold the node


def _facade() -> set[str]:
    """The public methods and properties RaftNode's class defines."""
    return {
        name
        for name, member in vars(RaftNode).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def _node_reads(path: Path) -> list[tuple[int, str]]:
    """(line, attribute) of every `self.node.X` / `self._node.X` / `node.X` in a module."""
    found = []
    for n in ast.walk(ast.parse(path.read_text())):
        if not isinstance(n, ast.Attribute):
            continue
        holder = n.value
        name = holder.attr if isinstance(holder, ast.Attribute) else getattr(holder, "id", "")
        if name in _NODE_NAMES:
            found.append((n.lineno, n.attr))
    return found


def test_the_service_and_messaging_use_only_the_facade() -> None:
    facade = _facade()
    assert {"put", "prepare", "read_index", "status", "committed", "membership"} <= facade
    assert not {"commitlog", "core", "dispatcher", "store"} & facade
    modules = sorted((_PACKAGE / "service").glob("*.py")) + sorted(
        (_PACKAGE / "messaging").glob("*.py")
    )
    reads = {p.name: _node_reads(p) for p in modules}
    assert sum(len(r) for r in reads.values()) > 30, "the check finds the node's uses"
    beyond = [
        f"{name}:{line}: node.{attr}"
        for name, found in reads.items()
        for line, attr in found
        if attr not in facade
    ]
    assert beyond == [], "reached through the node instead of its facade"


def test_every_facade_method_is_documented() -> None:
    undocumented = [
        name for name in sorted(_facade()) if not inspect.getdoc(getattr(RaftNode, name))
    ]
    assert undocumented == []


def test_status_reads_a_recovered_node_through_the_facade(tmp_path: Path) -> None:
    cfg = lone_config(tmp_path, cluster="c1")
    node = RaftNode(cfg)
    try:
        status = status_pb(node.status(), cfg)
        assert (status.node_id, status.cluster, status.flush_mode) == (1, "c1", "sync")
        assert (status.role, status.leader_id, status.leader_address) == ("follower", 0, "")
        assert status.committed_pos == node.commitlog.committed_pos
        assert status.dispatched_pos == node.dispatcher.dispatched_pos
        assert status.last_index == node.store.last_index()
    finally:
        asyncio.run(node.close())
