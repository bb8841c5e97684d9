"""The one randomizer of the Raft `Config` for both simulators.

Owns: `random_config`, which tests/sim/simulation.py (cores over a fake disk)
and tests/sim/driver_sim.py (real Ready drivers over real entry stores) both
call with their seeded `random.Random`, so a tunable added to `Config` is
exercised by both or by neither. The returned config is node 1's; each node
takes it with its own id (`dataclasses.replace(config, id=...)`).

Where the two simulators' choices had drifted apart, the wider choice set is
kept: up to 64 entries per append from (1, 3, 4, 64), up to 16 appends in
flight from (1, 2, 4, 16). Cluster size and preferred leader had the same
choices with different weights; the core simulation's are kept (3 nodes two
times in three, a preferred leader one time in four): a run is a fixed number
of events, and a 3-node cluster spends fewer of them on ticks and messages, so
more on faults (in the core simulation, 5 nodes half the time cut the faults
per 300 seeds by about 15%).

Not drawn: `election_ticks`, 10 in both (with 10 ms ticks, election
timeouts of 100-200 ms: the simulators' pauses, partitions and convergence
deadlines are scaled to that), `check_quorum` and `pre_vote` (on, as the
product runs them), and `async_storage_writes`, which is the simulator's to
say: the core simulation's driver reports durability with `advance` (it never
calls `persisted`), the Ready driver of driver_sim only with `persisted`, so
each mode is invalid for the other simulator. With `membership` (the runs that
change the membership, tests/sim/membership.py), `max_promote_lag` is drawn too:
the default, or a few entries, so that promotions of a lagging learner are refused.
"""

from __future__ import annotations

import random

from raft import Config

ELECTION_TICKS = 10


def random_config(
    rng: random.Random,
    nodes: int | None = None,
    *,
    async_storage_writes: bool,
    membership: bool = False,
) -> Config:
    """Node 1's config of a cluster of `nodes` (drawn from 3 or 5 if None)."""
    n = nodes or rng.choice((3, 3, 5))
    append_bytes = rng.choice((64, 1 << 20))
    extra = {"max_promote_lag": rng.choice((1000, 1000, 8))} if membership else {}
    return Config(
        id=1,
        peers=tuple(range(1, n + 1)),
        election_ticks=ELECTION_TICKS,
        heartbeat_ticks=rng.choice((1, 2, 3)),
        max_append_entries=rng.choice((1, 3, 4, 64)),
        max_append_bytes=append_bytes,
        max_inflight_msgs=rng.choice((1, 2, 4, 16)),
        max_inflight_bytes=append_bytes * rng.choice((1, 4)),
        preferred_leader=rng.choice((None, None, None, 1)),
        async_storage_writes=async_storage_writes,
        **extra,  # type: ignore[arg-type]
    )
