"""The chaos checker finds each kind of violation it claims to (pure, fast).

Each test builds a small history and replicas by hand, first one that keeps every
promise (the checker must call it valid), then breaks one promise and expects the
checker to name exactly that violation.
"""

from __future__ import annotations

import zlib

from chaos.checker import LeaderSeen, Replica, check, timings
from chaos.history import FAIL, OK, UNKNOWN, History
from chaos.workload import body_for
from store.message import StoredMessage, encode_message, make_properties

SIZE = 64


def stored(entries: list[tuple[int, str]]) -> bytes:
    """Encoded messages (offset, uniq key), concatenated as ReadRange serves them."""
    out = b""
    for offset, key in entries:
        m = StoredMessage(
            "chaos", body_for(key, SIZE), make_properties(uniq_key=key), physical_offset=offset
        )
        out += encode_message(m)
    return out


def put(h: History, key: str, outcome: str, offset: int = -1, process: int = 0) -> None:
    op = h.invoke(process, "put", key, crc=zlib.crc32(body_for(key, SIZE)))
    if outcome == OK:
        h.complete(op, OK, offset=offset)
    elif outcome != "open":
        h.complete(op, outcome, detail="test")


def base() -> tuple[History, list[tuple[int, str]]]:
    h = History()
    put(h, "A", OK, 0)
    put(h, "B", OK, 1000)
    put(h, "C", FAIL)
    put(h, "D", UNKNOWN)
    put(h, "E", "open")
    return h, [(0, "A"), (1000, "B"), (2000, "D")]


def replicas(entries: list[tuple[int, str]], n: int = 3) -> list[Replica]:
    return [Replica.from_raw(i, stored(entries)) for i in range(1, n + 1)]


def test_a_history_that_keeps_its_promises_is_valid() -> None:
    h, entries = base()
    v = check(h, replicas(entries), {}, [LeaderSeen(0.0, 1, 1), LeaderSeen(1.0, 2, 2)])
    assert v.valid, v.problems()
    assert (v.puts, v.acked, v.failed, v.unknown) == (5, 2, 1, 2)  # the open one is unknown
    assert v.unknown_present == 1


def test_an_acknowledged_put_missing_on_one_replica_is_lost() -> None:
    h, entries = base()
    reps = replicas(entries)
    reps[2] = Replica.from_raw(3, stored([e for e in entries if e[1] != "B"]))
    v = check(h, reps)
    assert v.lost == ["B@1000"] and not v.valid
    assert v.divergent  # replica 3's bytes differ from the others too


def test_an_acknowledged_put_at_another_offset_is_lost() -> None:
    h, _ = base()
    v = check(h, replicas([(0, "A"), (1500, "B")]))
    assert v.lost == ["B@1000"]


def test_a_put_stored_twice_is_a_duplicate() -> None:
    h, entries = base()
    v = check(h, replicas([*entries, (3000, "D")]))
    assert v.duplicates and "D" in v.duplicates[0] and not v.valid


def test_a_failed_put_that_appears_is_reported() -> None:
    h, entries = base()
    v = check(h, replicas([*entries, (3000, "C")]))
    assert len(v.failed_present) == 3 and not v.valid  # once per replica


def test_diverging_replicas_are_reported() -> None:
    h, entries = base()
    other = Replica.from_raw(3, stored([(0, "A"), (1000, "B"), (2000, "E")]))
    reps = [*replicas(entries, 2), other]
    v = check(h, reps)
    assert v.divergent and not v.valid


def test_a_removed_nodes_log_is_checked_as_a_prefix_of_the_final_one() -> None:
    """A node that left the group stops at its removal: a shorter log is fine (and is
    not asked to hold every acknowledged put), a different one is divergence."""
    h, entries = base()
    gone = Replica.from_raw(4, stored(entries[:1]))
    v = check(h, replicas(entries), removed=[gone, Replica.from_raw(5, b"")])
    assert v.valid and v.removed_checked == 2, v.problems()
    other = Replica.from_raw(4, stored([(0, "A"), (1000, "E")]))
    v = check(h, replicas(entries), removed=[other])
    assert not v.valid and v.removed_checked == 0
    assert "removed n4's committed log" in v.divergent[0], v.divergent


def test_a_read_whose_data_changed_later_is_stale() -> None:
    h, entries = base()
    op = h.invoke(1, "read", "B", offset=1000)
    h.complete(op, OK, key="B", crc=zlib.crc32(body_for("B", SIZE)))
    assert check(h, replicas(entries)).valid
    op = h.invoke(1, "read", "B", offset=1000)
    h.complete(op, OK, key="X", crc=1)
    v = check(h, replicas(entries))
    assert len(v.stale_reads) == 1 and not v.valid


def test_two_leaders_in_one_term_are_a_conflict() -> None:
    h, entries = base()
    seen = [LeaderSeen(0.0, 1, 5), LeaderSeen(0.5, 2, 5)]
    v = check(h, replicas(entries), {}, seen)
    assert v.leader_conflicts == {"5": [1, 2]} and not v.valid


def test_store_problems_make_a_run_invalid() -> None:
    h, entries = base()
    v = check(h, replicas(entries), {2: ["consume queue chaos/0 differs"], 1: []})
    assert list(v.store_problems) == ["2"] and not v.valid


def test_losses_inside_a_power_loss_window_are_excused_and_counted() -> None:
    h, _ = base()
    ack_b = next(o.end for o in h.operations("put") if o.key == "B")
    lost_b = [(0, "A"), (2000, "D")]
    v = check(h, replicas(lost_b), loss_windows=[(ack_b - 0.001, ack_b + 0.001)])
    assert v.valid and v.lost_in_window == ["B@1000"]
    v = check(h, replicas(lost_b), loss_windows=[(ack_b + 1.0, ack_b + 2.0)])
    assert v.lost == ["B@1000"]


def test_a_read_of_a_put_lost_in_a_power_loss_window_is_excused_too() -> None:
    """What async flush may lose may have been read first; a read of anything else
    that later disappears is still stale."""
    h, _ = base()
    for key, offset in (("B", 1000), ("A", 0)):
        op = h.invoke(1, "read", key, offset=offset)
        h.complete(op, OK, key=key, crc=zlib.crc32(body_for(key, SIZE)))
    acks = {o.key: o.end for o in h.operations("put") if o.type == OK}
    assert acks["A"] < acks["B"]
    window = [((acks["A"] + acks["B"]) / 2, acks["B"] + 0.001)]  # B's ack, not A's
    v = check(h, replicas([(0, "A"), (2000, "D")]), loss_windows=window)
    assert v.valid and v.reads_lost_in_window == 1 and not v.stale_reads, v.problems()
    v = check(h, replicas([(1000, "B"), (2000, "D")]), loss_windows=window)  # A is gone
    assert not v.valid and len(v.stale_reads) == 1 and v.lost == ["A@0"]
    v = check(h, replicas([(0, "A"), (2000, "D")]))  # no window: lost, and a stale read
    assert v.lost == ["B@1000"] and len(v.stale_reads) == 1


def test_timings_find_gaps_and_failover() -> None:
    h = History(started=0.0)
    h.now = lambda: clock[0]  # type: ignore[method-assign]
    clock = [0.0]
    for t in (0.1, 0.2, 0.3, 2.0, 2.1):
        clock[0] = t
        op = h.invoke(0, "put", f"k{t}")
        clock[0] = t + 0.01
        h.complete(op, OK, offset=int(t * 100))
    found = timings(h, leader_faults=[0.35], gap_s=0.5, end=2.2)
    assert [(round(a, 2), round(d, 2)) for a, d in found.unavailable] == [(0.31, 1.7)]
    assert [round(x, 2) for x in found.failovers] == [1.66]
    assert timings(h, leader_faults=[3.0]).failovers == [float("inf")]
