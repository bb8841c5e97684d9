"""The chaos checker: did the cluster keep every promise the history shows it made?

Given a `History`, the final committed contents of every replica (read after the
faults healed and the replicas converged), the offline `verify_store` findings of
every node, and the leaders the monitor observed, `check` finds:

- lost: an acknowledged put that is not, exactly once, at the offset it was
  acknowledged with (with its body) on every replica;
- duplicates: a UNIQ_KEY stored more than once on a replica (an unknown put that
  was retried counts as long as it landed once);
- failed_present: a put that definitely failed but appears;
- divergent: replicas whose committed bytes differ over their common prefix, and
  a removed node's committed log (which stops at its removal) that is not a prefix
  of the final one;
- store_problems: consume queues, index or log that do not match a rebuild;
- leader_conflicts: two nodes that were leader in the same term;
- stale_reads: a read that returned data the final log does not hold at that offset
  (unless it read a put lost in a power-loss window: what may be lost may have
  been read before it was; such reads are counted in `reads_lost_in_window`).

`timings` derives what users feel: windows in which no put was acknowledged, and
per leader fault, the time until a put invoked after it was acknowledged.
Invariant: the checker only reads its inputs; everything it reports is a plain
number, string or list, so a report is JSON as is.
"""

from __future__ import annotations

import itertools
import statistics
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.history import FAIL, OK, UNKNOWN, History, Operation
from store.message import PROPERTY_UNIQ_KEY, decode_message


@dataclass(frozen=True, slots=True)
class StoredPut:
    key: str
    crc: int


@dataclass(slots=True)
class Replica:
    """A node's committed messages: the raw bytes ReadRange served, decoded by offset."""

    node: int
    raw: bytes
    messages: dict[int, StoredPut]

    @classmethod
    def from_raw(cls, node: int, raw: bytes) -> Replica:
        return cls(node, raw, decode_puts(raw))


def split_raw(raw: bytes) -> Iterable[tuple[int, bytes]]:
    """(position in `raw`, message bytes) of concatenated encoded messages."""
    at = 0
    while at < len(raw):
        size = int.from_bytes(raw[at : at + 4], "big", signed=True)
        if size <= 0 or at + size > len(raw):
            raise ValueError(f"bad message size {size} at {at} of {len(raw)} bytes")
        yield at, raw[at : at + size]
        at += size


def decode_puts(raw: bytes) -> dict[int, StoredPut]:
    out = {}
    for _, one in split_raw(raw):
        m = decode_message(one)
        out[m.physical_offset] = StoredPut(
            m.properties.get(PROPERTY_UNIQ_KEY, ""), zlib.crc32(m.body)
        )
    return out


@dataclass(frozen=True, slots=True)
class LeaderSeen:
    time: float
    node: int
    term: int


@dataclass(slots=True)
class Verdict:
    operations: int = 0
    puts: int = 0
    acked: int = 0
    failed: int = 0
    unknown: int = 0
    reads: int = 0
    reads_ok: int = 0
    lost: list[str] = field(default_factory=list)
    lost_in_window: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    failed_present: list[str] = field(default_factory=list)
    unknown_present: int = 0
    divergent: list[str] = field(default_factory=list)
    store_problems: dict[str, list[str]] = field(default_factory=dict)
    leader_conflicts: dict[str, list[int]] = field(default_factory=dict)
    stale_reads: list[str] = field(default_factory=list)
    reads_lost_in_window: int = 0
    removed_checked: int = 0  # removed nodes whose committed log was a prefix of the final

    @property
    def valid(self) -> bool:
        return not (
            self.lost
            or self.duplicates
            or self.failed_present
            or self.divergent
            or self.store_problems
            or self.leader_conflicts
            or self.stale_reads
        )

    def problems(self) -> list[str]:
        """One line per kind of violation, with a few examples."""
        out = []
        for name, items in (
            ("acknowledged puts lost", self.lost),
            ("UNIQ_KEYs stored twice", self.duplicates),
            ("failed puts present", self.failed_present),
            ("replicas diverge", self.divergent),
            ("reads changed later", self.stale_reads),
        ):
            if items:
                out.append(f"{len(items)} {name}, e.g. {items[:3]}")
        for node, found in self.store_problems.items():
            out.append(f"node {node}'s store differs from a rebuild: {found[:3]}")
        for term, nodes in self.leader_conflicts.items():
            out.append(f"term {term} had leaders {nodes}")
        return out


def check(
    history: History,
    replicas: Sequence[Replica],
    store_problems: Mapping[int, Sequence[str]] | None = None,
    leaders: Iterable[LeaderSeen] = (),
    loss_windows: Sequence[tuple[float, float]] = (),
    removed: Sequence[Replica] = (),
) -> Verdict:
    """Check the history against the replicas (see the module doc).

    `replicas` are the group's members at the end; `removed`, the committed logs of
    nodes that left the group (read from their stores; not a wiped node's): each must
    be a prefix of the final log, and nothing else is asked of them.

    `loss_windows`, (start, end) in history time: an acknowledged put whose
    acknowledgement falls in one may be lost (async flush's documented power-loss
    window); such losses are listed in `lost_in_window`, not `lost`.
    """
    v = Verdict()
    ops = history.operations()
    puts = [o for o in ops if o.f == "put"]
    reads = [o for o in ops if o.f == "read"]
    v.operations, v.puts, v.reads = len(ops), len(puts), len(reads)
    v.acked = sum(o.type == OK for o in puts)
    v.failed = sum(o.type == FAIL for o in puts)
    v.unknown = sum(o.type == UNKNOWN for o in puts)
    v.reads_ok = sum(o.type == OK for o in reads)
    for r in replicas:
        _check_replica(v, r, puts, loss_windows)
    _check_prefixes(v, replicas)
    _check_removed(v, replicas, removed)
    if replicas:
        _check_reads(v, replicas, reads)
    v.store_problems = {str(n): list(p) for n, p in (store_problems or {}).items() if p}
    by_term: dict[int, set[int]] = {}
    for seen in leaders:
        by_term.setdefault(seen.term, set()).add(seen.node)
    v.leader_conflicts = {str(t): sorted(n) for t, n in sorted(by_term.items()) if len(n) > 1}
    return v


def _check_replica(
    v: Verdict, r: Replica, puts: list[Operation], windows: Sequence[tuple[float, float]]
) -> None:
    where: dict[str, list[int]] = {}
    for offset, stored in r.messages.items():
        where.setdefault(stored.key, []).append(offset)
    for key, offsets in where.items():
        if len(offsets) > 1:
            v.duplicates.append(f"n{r.node}: {key} at {sorted(offsets)}")
    lost, in_window = set(v.lost), set(v.lost_in_window)
    for o in puts:
        if o.type == OK:
            got = r.messages.get(o.offset)
            if got != StoredPut(o.key, o.crc) or len(where.get(o.key, ())) != 1:
                excused = any(a <= o.end <= b for a, b in windows)
                (in_window if excused else lost).add(f"{o.key}@{o.offset}")
        elif o.type == FAIL and o.key in where:
            v.failed_present.append(f"n{r.node}: {o.key} ({o.detail[:80]})")
    v.lost, v.lost_in_window = sorted(lost), sorted(in_window)
    v.unknown_present = max(
        v.unknown_present, sum(o.type == UNKNOWN and o.key in where for o in puts)
    )


def _check_prefixes(v: Verdict, replicas: Sequence[Replica]) -> None:
    if not replicas:
        return
    shortest = min(replicas, key=lambda r: len(r.raw))
    for r in replicas:
        if not r.raw.startswith(shortest.raw):
            at = next(
                (i for i, (a, b) in enumerate(zip(r.raw, shortest.raw, strict=False)) if a != b),
                len(shortest.raw),
            )
            v.divergent.append(f"n{r.node} and n{shortest.node} differ at byte {at}")
        elif len(r.raw) != len(shortest.raw):
            v.divergent.append(
                f"n{r.node} holds {len(r.raw)} committed bytes, n{shortest.node} "
                f"{len(shortest.raw)} (not converged)"
            )


def _check_removed(v: Verdict, replicas: Sequence[Replica], removed: Sequence[Replica]) -> None:
    if not replicas:
        return
    final = max(replicas, key=lambda r: len(r.raw))
    for r in removed:
        if final.raw.startswith(r.raw):
            v.removed_checked += 1
            continue
        common = enumerate(zip(r.raw, final.raw, strict=False))
        at = next((i for i, (a, b) in common if a != b), len(final.raw))
        v.divergent.append(
            f"removed n{r.node}'s committed log ({len(r.raw)} bytes) is no "
            f"prefix of n{final.node}'s: they differ at byte {at}"
        )


def _check_reads(v: Verdict, replicas: Sequence[Replica], reads: list[Operation]) -> None:
    final = replicas[0].messages
    excused = set(v.lost_in_window)
    for o in reads:
        if o.type != OK:
            continue
        got = final.get(o.offset)
        if got == StoredPut(o.key, o.crc):
            continue
        if f"{o.key}@{o.offset}" in excused:
            v.reads_lost_in_window += 1
        else:
            v.stale_reads.append(f"read of {o.offset} at {o.end:.3f}s gave {o.key}, now {got}")


@dataclass(slots=True)
class Timings:
    unavailable: list[tuple[float, float]] = field(default_factory=list)  # (start, seconds)
    failovers: list[float] = field(default_factory=list)  # seconds, one per leader fault

    def as_json(self) -> dict[str, Any]:
        f = self.failovers
        finite = [x for x in f if x != float("inf")]
        return {
            "unavailability_windows": [[round(a, 3), round(d, 3)] for a, d in self.unavailable],
            "unavailable_s": round(sum(d for _, d in self.unavailable), 3),
            "failovers": len(f),
            "failovers_unfinished": len(f) - len(finite),
            "failover_p50_s": round(statistics.median(finite), 3) if finite else None,
            "failover_max_s": round(max(finite), 3) if finite else None,
        }


def timings(
    history: History, leader_faults: Sequence[float], gap_s: float = 0.5, end: float | None = None
) -> Timings:
    """Windows over `gap_s` without an acknowledged put; failover time per leader fault.

    A failover ends when a put invoked after the fault is acknowledged: only the
    new leader can have done that.
    """
    puts = [o for o in history.operations("put") if o.type == OK]
    done = sorted(o.end for o in puts)
    t = Timings()
    if done:
        edges = [*done, end if end is not None else done[-1]]
        t.unavailable = [(a, b - a) for a, b in itertools.pairwise(edges) if b - a > gap_s]
    for at in leader_faults:
        after = [o.end for o in puts if o.start >= at]
        t.failovers.append(min(after) - at if after else float("inf"))
    return t
