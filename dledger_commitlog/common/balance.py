"""Which shard leaders to move so that the leaders spread over the nodes.

Owns `plan_moves`, the plan of `dledger shard balance` and of the console's
`POST /api/v1/shards/balance` (docs/scaling.md): a pure function of the leaders,
the nodes that serve each shard and the cluster's nodes; the callers read those
from the nodes' Status and make the moves by leadership transfer.

Invariants: a shard without a leader is left to its election; a shard moves only to
a node that serves it; after the moves no node leads more than ceil(shards / nodes
serving), unless a shard's preferred node is the one over (it may keep its own).
"""

from __future__ import annotations

import math
from collections import Counter

from dledger_commitlog.common.routes import preferred_leader


def plan_moves(
    leaders: dict[int, int | None], candidates: dict[int, list[int]], nodes: list[int]
) -> list[tuple[int, int, int]]:
    """(shard, from node, to node) moves: each shard to its preferred node (among all
    `nodes`) when that one serves the shard (`candidates[g]`), then, from any node
    that would lead more than ceil(shards / nodes serving), to the candidate leading
    fewest. Shards without a leader are left to their election."""
    serving = sorted({n for c in candidates.values() for n in c})
    if not serving:
        return []
    cap = math.ceil(len(leaders) / len(serving))
    target: dict[int, int] = {}
    for g, now in leaders.items():
        if now is not None:
            want = preferred_leader(g, nodes)
            target[g] = want if want in candidates.get(g, ()) else now
    load = Counter(target.values())
    for g in sorted(target):
        here = target[g]
        # A node prefers at most ceil(shards / nodes) <= cap shards: what exceeds the
        # cap is shards kept where their preferred node cannot take them.
        if load[here] <= cap or here == preferred_leader(g, nodes):
            continue
        free = [n for n in candidates.get(g, ()) if load[n] < cap]
        if free:
            to = min(free, key=lambda n: (load[n], n))
            load[here] -= 1
            load[to] += 1
            target[g] = to
    return [
        (g, now, target[g])
        for g, now in sorted(leaders.items())
        if now is not None and target[g] != now
    ]
