"""JSON views of what the client returns: one shape for `dledger ... --json` and the
HTTP API alike.

Owns how a message, a node's status, the members of a shard, a consumer group
and the shards x nodes table are written as JSON documents (plain dicts of str,
int, bool, lists). The CLI prints them; the console serves them. Invariants: a
view is a pure function of client values and the time it is given (no I/O here;
an age is computed at `now_ms`, the clock's now when none is given); a message body that is
not UTF-8 is base64 with `"body_encoding": "base64"`, never lossy text.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dledger_commitlog.client import MemberInfo, NodeStatus, StatusError, StoredMessage
from dledger_commitlog.client.groups import (
    DeadLetters,
    GroupDescription,
    GroupSummary,
    MessageTrace,
)


def message_json(m: StoredMessage) -> dict[str, Any]:
    """A stored message: its fields, keys and properties, its body as text when it is
    UTF-8, else base64 (`body_encoding`)."""
    doc = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    doc["keys"], doc["properties"] = list(m.keys), dict(m.properties)
    try:
        doc["body"] = m.body.decode("utf-8")
    except UnicodeDecodeError:
        doc["body"] = base64.b64encode(m.body).decode("ascii")
        doc["body_encoding"] = "base64"
    return doc


def member_json(m: MemberInfo) -> dict[str, Any]:
    return dataclasses.asdict(m)


def status_json(s: NodeStatus | StatusError) -> dict[str, Any]:
    """One node's Status, or the error it answered with."""
    if isinstance(s, StatusError):
        return {"address": s.address, "error": s.error.message, "code": s.error.code}
    doc = {"node_id": s.node_id, "role": s.role, "term": s.term, "leader": s.leader_id}
    doc.update({f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
    doc["peers"] = [dataclasses.asdict(p) for p in s.peers]
    doc["members"] = [member_json(m) for m in s.members]
    return doc


def leader_members(statuses: Sequence[NodeStatus | StatusError]) -> tuple[MemberInfo, ...]:
    """The members as the leader with the highest term reports them (each one's lag),
    else as any node does (lag unknown), else none."""
    answers = [s for s in statuses if isinstance(s, NodeStatus) and s.members]
    leaders = [s for s in answers if s.role == "leader"]
    best = max(leaders, key=lambda s: s.term) if leaders else answers[0] if answers else None
    return best.members if best is not None else ()


def leader_of(statuses: Mapping[int, NodeStatus | StatusError]) -> int | None:
    """The node that says it leads (the highest term's, should two say so), else None."""
    leaders = [s for s in statuses.values() if isinstance(s, NodeStatus) and s.role == "leader"]
    return max(leaders, key=lambda s: s.term).node_id if leaders else None


def shard_cells(
    statuses: Mapping[int, NodeStatus | StatusError], nodes: Sequence[int]
) -> dict[str, dict[str, Any] | None]:
    """One shard's row of `shard status`: per node its role, term, last index and lag
    behind the most advanced replica (None: the node did not answer)."""
    top = max((s.last_index for s in statuses.values() if isinstance(s, NodeStatus)), default=0)
    out: dict[str, dict[str, Any] | None] = {}
    for n in nodes:
        st = statuses.get(n)
        if not isinstance(st, NodeStatus):
            out[str(n)] = None
            continue
        out[str(n)] = {
            "role": st.role,
            "term": st.term,
            "lag": top - st.last_index,
            "last_index": st.last_index,
        }
    return out


def summary_json(s: GroupSummary, now_ms: int | None = None) -> dict[str, Any]:
    """A group's figures, with the age of its oldest unconsumed message at `now_ms`
    (default: now)."""
    doc = dataclasses.asdict(s)
    doc["mode"] = group_mode(s)
    doc["oldest_unconsumed_age_ms"] = age_ms(s.oldest_unconsumed_ms, now_ms)
    return doc


def age_ms(stored_ms: int, now_ms: int | None = None) -> int:
    """How long ago `stored_ms` was at `now_ms` (default: now); 0 for no time (0)."""
    if not stored_ms:
        return 0
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return max(0, now - stored_ms)


def group_mode(s: GroupSummary) -> str:
    """The group's mode ("": not known, nothing on this leader has its settings)."""
    if not s.strategy:
        return ""
    return "orderly" if s.orderly else "concurrent"


def describe_json(d: GroupDescription, now_ms: int | None = None) -> dict[str, Any]:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return {
        "summary": summary_json(d.summary, now),
        "subscriptions": [dataclasses.asdict(s) for s in d.subscriptions],
        "members": [dataclasses.asdict(m) for m in d.members],
        "queues": [
            {
                **dataclasses.asdict(q),
                "oldest_unconsumed_age_ms": age_ms(q.oldest_unconsumed_ms, now),
            }
            for q in d.queues
        ],
    }


def dlq_json(dead: DeadLetters) -> dict[str, Any]:
    """A read of a group's dead-letter queue (and how many of them were resent)."""
    return {
        "messages": [message_json(m) for m in dead.messages],
        "resent": dead.resent,
        "next_offset": dead.next_offset,
        "max_offset": dead.max_offset,
    }


def utc(ms: int) -> str:
    """A time in ms since the epoch as ISO 8601 UTC, to the millisecond ("...Z")."""
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def trace_json(msg_id: str, shard: int, trace: MessageTrace) -> dict[str, Any]:
    """A message's trace: its events in time order, each with its UTC `time`; per group
    whether it consumed the message and from when its delivery history is known
    (`history_complete`: since before the message was stored)."""
    stored = trace.events[0].time_ms if trace.events else 0
    return {
        "msg_id": msg_id,
        "shard": shard,
        "events": [{"time": utc(e.time_ms), **dataclasses.asdict(e)} for e in trace.events],
        "groups": [
            {
                **dataclasses.asdict(g),
                "history_since": utc(g.history_since_ms),
                "history_complete": g.history_since_ms <= stored,
            }
            for g in trace.groups
        ],
    }
