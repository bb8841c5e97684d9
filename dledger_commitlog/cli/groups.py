"""Consumer-group commands for operators: `group list|describe|reset-offsets|dlq`.

Each asks the group coordinator (the leader; a follower redirects) through the
client (`client.groups`) and prints a table, or with --json one JSON document.
Consuming itself is `dledger consume` (`cli.messages`), a member of the group.

- `group list`: every group with committed offsets or live members, with its
  lag, retries, dead letters, strategy and mode.
- `group describe G`: that and its subscriptions, its members with their
  queues, and per queue the committed offset, the end, lag, owner, lease epoch
  and deliveries in flight. An unknown group is an error (exit 1).
- `group reset-offsets G --topic T --to-...`: move the group's offsets of T (one
  queue with --queue). Refused while the group has live members, unless --force
  (their deliveries then start over from the new offsets).
- `group dlq G`: read the group's dead letters from an offset; --resend puts the
  named ones (by their offset in the dead-letter queue), --resend-all those read,
  to the group's retry topic, where its members consume them again.
"""

from __future__ import annotations

import argparse

from dledger_commitlog.cli.commands import (
    cell,
    command,
    emit,
    make_client,
    non_negative,
    positive,
    preview,
    table,
)
from dledger_commitlog.cli.messages import epoch_ms
from dledger_commitlog.client.errors import GroupRefused
from dledger_commitlog.client.groups import (
    DeadLetters,
    GroupDescription,
    QueueLease,
)
from dledger_commitlog.common.protocol import (
    PROPERTY_DLQ_REASON,
    PROPERTY_RECONSUME_TIMES,
    PROPERTY_RETRY_TOPIC,
)
from dledger_commitlog.console.views import describe_json, dlq_json, group_mode, summary_json


def _leases_text(leases: tuple[QueueLease, ...]) -> str:
    return " ".join(f"{x.topic}/{x.queue_id}" for x in leases) or "-"


@command("group list", "consumer groups: members, lag, retries, dead letters")
def _group_list(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        groups = client.group_list()
    rows = [
        (s.group, s.members, s.lag, s.retries, s.dead_letters, s.strategy, group_mode(s))
        for s in groups
    ]
    text = table(("group", "members", "lag", "retries", "dead_letters", "strategy", "mode"), rows)
    emit(args, {"groups": [summary_json(s) for s in groups]}, text if groups else "no groups")
    return 0


def _group_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("group", metavar="G", help="consumer group")


@command(
    "group describe", "one group: members and their queues, offsets and lag per queue", _group_arg
)
def _group_describe(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        d = client.group_describe(args.group)
    emit(args, describe_json(d), describe_text(d))
    return 0


def describe_text(d: GroupDescription) -> str:
    s = d.summary
    subs = ", ".join(f"{x.topic} ({x.kind} {x.expression})" for x in d.subscriptions)
    summary = {
        "group": s.group,
        "members": s.members,
        "lag": s.lag,
        "retries": s.retries,
        "dead letters": s.dead_letters,
        "strategy": s.strategy,
        "mode": group_mode(s),
        "generation": s.generation,
        "subscriptions": subs,
    }
    parts = ["\n".join(f"{k:<14} {cell(v)}" for k, v in summary.items())]
    if d.members:
        members = [
            (m.member_id, m.client, m.last_seen_ms_ago, _leases_text(m.leases)) for m in d.members
        ]
        parts.append(table(("member", "client", "seen_ms_ago", "queues"), members))
    if d.queues:
        rows = [
            (
                q.topic,
                q.queue_id,
                None if q.committed < 0 else q.committed,
                q.max_offset,
                q.lag,
                q.owner,
                q.epoch or None,
                q.in_flight,
                "yes" if q.revoking else None,
            )
            for q in d.queues
        ]
        headers = (
            "topic",
            "queue",
            "committed",
            "max",
            "lag",
            "owner",
            "epoch",
            "in_flight",
            "revoking",
        )
        parts.append(table(headers, rows))
    return "\n\n".join(parts)


def _reset_args(p: argparse.ArgumentParser) -> None:
    _group_arg(p)
    p.add_argument("--topic", required=True)
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the oldest message kept")
    to.add_argument("--to-latest", action="store_true", help="past the newest: skip all")
    to.add_argument("--to-offset", type=non_negative, metavar="N", help="queue offset N")
    to.add_argument(
        "--to-time",
        type=epoch_ms,
        metavar="TIME",
        help="the first message stored at or after TIME: ISO 8601 with a zone "
        "or ms since the epoch",
    )
    p.add_argument("--queue", type=non_negative, metavar="Q", help="only queue Q (default all)")
    p.add_argument(
        "--force", action="store_true", help="even with live members (their deliveries start over)"
    )


@command(
    "group reset-offsets",
    "move a group's offsets of a topic (to consume again or skip)",
    _reset_args,
)
def _group_reset_offsets(args: argparse.Namespace) -> int:
    to, value = "earliest", 0
    if args.to_latest:
        to = "latest"
    elif args.to_offset is not None:
        to, value = "offset", args.to_offset
    elif args.to_time is not None:
        to, value = "time", args.to_time
    queue_id = -1 if args.queue is None else args.queue
    with make_client(args) as client:
        try:
            offsets = client.group_reset_offsets(
                args.group, args.topic, to, value, queue_id=queue_id, force=args.force
            )
        except GroupRefused as exc:
            if args.force:
                raise
            raise GroupRefused(
                f"{exc.message} (--force resets anyway)", code=exc.code, address=exc.address
            ) from exc
    moved = [{"queue_id": q, "offset": o} for q, o in sorted(offsets.items())]
    doc = {"group": args.group, "topic": args.topic, "to": to, "offsets": moved}
    rows = [(args.topic, q, o) for q, o in sorted(offsets.items())]
    emit(args, doc, table(("topic", "queue", "offset"), rows))
    return 0


def _dlq_args(p: argparse.ArgumentParser) -> None:
    _group_arg(p)
    p.add_argument(
        "--from",
        type=non_negative,
        default=0,
        metavar="N",
        dest="from_offset",
        help="the first dead-letter offset to read (default 0)",
    )
    p.add_argument("--max", type=positive, default=32, metavar="N", help="read at most N")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resend",
        type=non_negative,
        nargs="+",
        default=[],
        metavar="OFFSET",
        help="put these dead letters (by offset) to the group again",
    )
    again.add_argument(
        "--resend-all", action="store_true", help="put every dead letter read to the group again"
    )


@command("group dlq", "a group's dead letters; --resend/--resend-all consume them again", _dlq_args)
def _group_dlq(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        dead = client.group_dlq(
            args.group, args.from_offset, args.max, resend=args.resend, resend_all=args.resend_all
        )
    emit(args, dlq_json(dead), dlq_text(dead))
    return 0


def dlq_text(dead: DeadLetters) -> str:
    rows = [
        (
            m.queue_offset,
            m.msg_id,
            m.properties.get(PROPERTY_RETRY_TOPIC),
            m.properties.get(PROPERTY_RECONSUME_TIMES),
            m.properties.get(PROPERTY_DLQ_REASON),
            m.keys,
            preview(m.body),
        )
        for m in dead.messages
    ]
    headers = ("offset", "msg_id", "topic", "retries", "reason", "keys", "body")
    lines = [table(headers, rows) if rows else "no dead letters here"]
    lines.append(
        f"next_offset {dead.next_offset}  (the dead-letter queue ends at {dead.max_offset})"
    )
    if dead.resent:
        lines.append(f"resent {dead.resent} to the group")
    return "\n".join(lines)
