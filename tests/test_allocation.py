"""Queue allocation (dledger_commitlog/messaging/allocation.py): RocketMQ's averaged blocks,
the consistent-hash ring, and the properties both keep (a disjoint, complete cover; the
same answer whatever the order of the input), with the balance of "average" and the
minimal movement of "consistent-hash" when a member leaves or joins.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger_commitlog.messaging.allocation import STRATEGIES, QueueRef, allocate

ROOT = Path(__file__).resolve().parents[1]

queue_refs = st.lists(
    st.tuples(st.sampled_from(["TopicA", "TopicB", "t", "%RETRY%g"]), st.integers(0, 63)),
    max_size=80,
)
member_ids = st.lists(st.text(min_size=1, max_size=12), max_size=12)
strategies = st.sampled_from(STRATEGIES)


def topic(name: str, n: int) -> list[QueueRef]:
    return [(name, i) for i in range(n)]


def owners(allocation: dict[str, list[QueueRef]]) -> dict[QueueRef, str]:
    return {q: member for member, qs in allocation.items() for q in qs}


def test_strategies() -> None:
    assert STRATEGIES == ("average", "consistent-hash")


@pytest.mark.parametrize("strategy", ["", "AVERAGE", "hash", "round-robin"])
def test_unknown_strategy_names_the_known_ones(strategy: str) -> None:
    with pytest.raises(ValueError, match="unknown allocation strategy") as err:
        allocate(strategy, topic("T", 4), ["a"])
    assert "average" in str(err.value) and "consistent-hash" in str(err.value)
    with pytest.raises(ValueError):
        allocate(strategy, [], [])  # checked before anything else


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_members_no_allocation(strategy: str) -> None:
    assert allocate(strategy, topic("T", 8), []) == {}
    assert allocate(strategy, [], []) == {}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_queues_every_member_gets_none(strategy: str) -> None:
    assert allocate(strategy, [], ["b", "a"]) == {"a": [], "b": []}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_member_takes_everything(strategy: str) -> None:
    queues = topic("B", 3) + topic("A", 2)
    assert allocate(strategy, queues, ["only"]) == {"only": sorted(queues)}


# ---------------------------------------------------------------- average


def test_average_blocks_like_rocketmq() -> None:
    # AllocateMessageQueueAveragely: 8 queues over 3 consumers -> 3, 3, 2 in order
    assert allocate("average", topic("T", 8), ["c", "a", "b"]) == {
        "a": [("T", 0), ("T", 1), ("T", 2)],
        "b": [("T", 3), ("T", 4), ("T", 5)],
        "c": [("T", 6), ("T", 7)],
    }
    assert allocate("average", topic("T", 6), ["x", "y", "z"]) == {
        "x": [("T", 0), ("T", 1)],
        "y": [("T", 2), ("T", 3)],
        "z": [("T", 4), ("T", 5)],
    }


def test_average_more_members_than_queues() -> None:
    assert allocate("average", topic("T", 2), ["d", "c", "b", "a"]) == {
        "a": [("T", 0)],
        "b": [("T", 1)],
        "c": [],
        "d": [],
    }


def test_average_sorts_queues_by_topic_then_number() -> None:
    queues = topic("B", 2) + topic("A", 12)
    got = allocate("average", queues, ["m1", "m2"])
    assert got["m1"] == [("A", i) for i in range(7)]  # ("A", 10) after ("A", 9)
    assert got["m2"] == [("A", i) for i in range(7, 12)] + topic("B", 2)


def rocketmq_average(queues: list[QueueRef], members: list[str], me: str) -> list[QueueRef]:
    """AllocateMessageQueueAveragely.allocate, line by line."""
    index = members.index(me)
    mod = len(queues) % len(members)
    if len(queues) <= len(members):
        average = 1
    elif mod > 0 and index < mod:
        average = len(queues) // len(members) + 1
    else:
        average = len(queues) // len(members)
    start = index * average if mod > 0 and index < mod else index * average + mod
    size = min(average, len(queues) - start)
    return [queues[(start + i) % len(queues)] for i in range(max(size, 0))]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(1, 12))
def test_average_is_rocketmqs(n_queues: int, n_members: int) -> None:
    queues = topic("T", n_queues)
    members = [f"m{i:02d}" for i in range(n_members)]
    got = allocate("average", queues, members)
    for m in members:
        assert got[m] == rocketmq_average(queues, members, m)


@settings(max_examples=200, deadline=None)
@given(queue_refs, member_ids.filter(bool))
def test_average_is_balanced_and_contiguous(queues: list[QueueRef], members: list[str]) -> None:
    got = allocate("average", queues, members)
    ordered = sorted(set(members))
    sizes = [len(got[m]) for m in ordered]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first ones take the extra queues
    assert [q for m in ordered for q in got[m]] == sorted(set(queues))


# ---------------------------------------------------------------- both


@settings(max_examples=200, deadline=None)
@given(strategies, queue_refs, member_ids)
def test_disjoint_complete_sorted(
    strategy: str, queues: list[QueueRef], members: list[str]
) -> None:
    got = allocate(strategy, queues, members)
    if not members:
        assert got == {}
        return
    assert set(got) == set(members)
    taken = [q for qs in got.values() for q in qs]
    assert len(taken) == len(set(taken))  # disjoint
    assert set(taken) == set(queues)  # complete
    for qs in got.values():
        assert qs == sorted(qs)


@settings(max_examples=200, deadline=None)
@given(strategies, queue_refs, member_ids, st.randoms(use_true_random=False))
def test_order_and_duplicates_do_not_matter(
    strategy: str, queues: list[QueueRef], members: list[str], rnd: random.Random
) -> None:
    shuffled_queues = queues + rnd.sample(queues, len(queues) // 2)
    shuffled_members = members + rnd.sample(members, len(members) // 2)
    rnd.shuffle(shuffled_queues)
    rnd.shuffle(shuffled_members)
    assert allocate(strategy, shuffled_queues, shuffled_members) == allocate(
        strategy, queues, members
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_inputs_are_not_modified(strategy: str) -> None:
    queues = [("T", 3), ("T", 1), ("T", 2)]
    members = ["b", "a"]
    allocate(strategy, queues, members)
    assert queues == [("T", 3), ("T", 1), ("T", 2)] and members == ["b", "a"]


def test_tuple_inputs() -> None:
    got = allocate("consistent-hash", (("T", 0), ("T", 1)), ("a", "b"))
    assert sorted(q for qs in got.values() for q in qs) == [("T", 0), ("T", 1)]


# ---------------------------------------------------------------- consistent-hash


def test_consistent_hash_is_pinned() -> None:
    """The ring's hash is blake2b, not Python's hash(): this exact answer, in any process."""
    got = allocate("consistent-hash", topic("T", 8), ["c", "a", "b"])
    assert got == {
        "a": [("T", 2), ("T", 3), ("T", 4), ("T", 7)],
        "b": [("T", 0), ("T", 5)],
        "c": [("T", 1), ("T", 6)],
    }


def test_consistent_hash_does_not_depend_on_the_hash_seed() -> None:
    code = (
        "from dledger_commitlog.messaging.allocation import allocate\n"
        "print(sorted(allocate('consistent-hash', [('T', i) for i in range(64)],"
        " ['a', 'b', 'c', 'd']).items()))"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_consistent_hash_spreads_queues() -> None:
    members = [f"consumer-{i}" for i in range(10)]
    got = allocate("consistent-hash", topic("T", 1000), members)
    sizes = sorted(len(qs) for qs in got.values())
    assert sizes[0] >= 50 and sizes[-1] <= 200, sizes  # 100 each on average


@settings(max_examples=200, deadline=None)
@given(queue_refs, member_ids.filter(bool), st.data())
def test_a_leaving_member_moves_only_its_queues(
    queues: list[QueueRef], members: list[str], data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(members))
    before = owners(allocate("consistent-hash", queues, members))
    after = owners(allocate("consistent-hash", queues, [m for m in members if m != gone]))
    for q, owner in before.items():
        if owner != gone:
            assert after.get(q, owner) == owner  # (nobody left at all: no allocation)


@settings(max_examples=200, deadline=None)
@given(queue_refs, member_ids, st.text(min_size=1, max_size=12))
def test_a_joining_member_takes_queues_only_to_itself(
    queues: list[QueueRef], members: list[str], new: str
) -> None:
    before = owners(allocate("consistent-hash", queues, members))
    after = owners(allocate("consistent-hash", queues, [*members, new]))
    for q, owner in after.items():
        assert owner == new or before[q] == owner


def test_a_joining_member_takes_a_fair_share() -> None:
    members = [f"consumer-{i}" for i in range(4)]
    queues = topic("T", 500)
    before = owners(allocate("consistent-hash", queues, members))
    after = owners(allocate("consistent-hash", queues, [*members, "consumer-4"]))
    moved = [q for q in queues if before[q] != after[q]]
    assert all(after[q] == "consumer-4" for q in moved)
    assert 50 <= len(moved) <= 200  # a fifth of 500 on average


def test_average_moves_more_than_consistent_hash() -> None:
    """Why the ring exists: one member leaving reshuffles most of the average blocks."""
    members = [f"consumer-{i}" for i in range(5)]
    queues = topic("T", 100)

    def moved(strategy: str) -> int:
        before = owners(allocate(strategy, queues, members))
        after = owners(allocate(strategy, queues, members[1:]))
        return sum(before[q] != after[q] for q in queues)

    assert moved("consistent-hash") == len(allocate("consistent-hash", queues, members)[members[0]])
    assert moved("average") > moved("consistent-hash")
