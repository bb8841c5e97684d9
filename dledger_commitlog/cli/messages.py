"""The message commands: put (now or later), tx (half, commit, rollback), get, pull,
query, consume.

Each opens a client from the connection options (`commands.make_client`), makes
one call or a loop of them, and prints the result as a table or, with --json,
one JSON document (consume: one JSON line per message). A put's body comes from
--body or --body-file ('-': standard input) and is sent as given. Times a
delayed put names are checked here only for form (an ISO 8601 time needs a
zone; a duration is one number and unit); whether one is too far ahead is the
cluster's to say (`schedule.max_timer_delay_s`), since only it knows its setting.
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dledger_commitlog.cli.commands import (
    UsageError,
    cell,
    command,
    emit,
    key_value,
    make_client,
    message_json,
    messages_table,
    non_negative,
    positive,
    preview,
    table,
)
from dledger_commitlog.client import Client, PullResult, PutResult, StoredMessage
from dledger_commitlog.node.config import parse_levels


def _message_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True)
    p.add_argument("--key", action="extend", nargs="+", default=[], metavar="K")
    p.add_argument("--tag", metavar="TAG")
    p.add_argument("--property", action="extend", nargs="+", type=key_value, default=[])
    p.add_argument("--uniq-key", metavar="U", help="idempotency key (default: a fresh one)")
    p.add_argument("--queue", type=non_negative, metavar="Q", help="default: the server picks")
    body = p.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", metavar="TEXT")
    body.add_argument("--body-file", metavar="F", help="'-': standard input")


def _put_args(p: argparse.ArgumentParser) -> None:
    _message_args(p)
    later = p.add_mutually_exclusive_group()
    later.add_argument(
        "--delay-level",
        type=positive,
        metavar="L",
        help="deliver after the cluster's delay level L (1: 1s by default)",
    )
    later.add_argument("--deliver-in", type=_duration_ms, metavar="DURATION", dest="deliver_in_ms",
                       help="deliver DURATION from now: 90s, 10m, 2h")  # fmt: skip
    later.add_argument("--deliver-at", type=_deliver_at, metavar="TIME",
                       help="deliver at TIME: ISO 8601 with a zone (YYYY-MM-DDTHH:MM:SSZ) or "
                       "ms since the epoch")  # fmt: skip


def _duration_ms(text: str) -> int:
    """One duration in the delay levels' units (`parse_levels`: 500ms, 90s, 10m, 2h, 1d) -> ms."""
    try:
        durations = parse_levels(text)
    except ValueError:
        durations = ()
    if len(durations) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 10m or 2h")
    return durations[0]


def _deliver_at(text: str) -> int:
    """ISO 8601 (a zone is required) or ms since the epoch -> ms since the epoch."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither ISO 8601 (YYYY-MM-DDTHH:MM:SSZ) nor ms since the epoch"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add Z or +HH:MM)")
    return int(when.timestamp() * 1000)


def _body_of(args: argparse.Namespace) -> bytes | str:
    if args.body is not None:
        return str(args.body)
    if args.body_file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(args.body_file).read_bytes()
    except OSError as exc:
        raise UsageError(f"--body-file: {exc}") from exc


def _result_doc(r: PutResult) -> dict[str, Any]:
    return {
        "msg_id": r.msg_id,
        "commitlog_offset": r.commitlog_offset,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
        "store_timestamp": r.store_timestamp_ms,
        "duplicate": r.duplicate,
    }


@command("put", "put one message (--delay-level/--deliver-in/--deliver-at: delivered later)",
         _put_args)  # fmt: skip
def _put(args: argparse.Namespace) -> int:
    body = _body_of(args)
    deliver_at_ms = args.deliver_at or 0
    if args.deliver_in_ms is not None:
        deliver_at_ms = time.time_ns() // 1_000_000 + args.deliver_in_ms
    with make_client(args) as client:
        r = client.put(
            args.topic,
            body,
            keys=args.key,
            tags=args.tag,
            properties=dict(args.property),
            uniq_key=args.uniq_key,
            queue_id=args.queue,
            delay_level=args.delay_level or 0,
            deliver_at_ms=deliver_at_ms,
        )
    doc = _result_doc(r)
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


def _put_half_args(p: argparse.ArgumentParser) -> None:
    _message_args(p)
    p.add_argument("--group", required=True, metavar="G", help="the producer group")


@command("tx put-half", "store a transactional message (invisible until committed)",
         _put_half_args)  # fmt: skip
def _tx_put_half(args: argparse.Namespace) -> int:
    body = _body_of(args)
    with make_client(args) as client:
        half = client.put_half(
            args.topic, body, producer_group=args.group, keys=args.key, tags=args.tag,
            properties=dict(args.property), uniq_key=args.uniq_key, queue_id=args.queue,
        )  # fmt: skip
    doc = {"transaction_id": half.transaction_id, "half_offset": half.half_offset,
           "duplicate": half.result.duplicate}  # fmt: skip
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


def _tx_end_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("transaction_id", metavar="ID")
    p.add_argument("half_offset", type=non_negative, metavar="HALF_OFFSET")


def _tx_end(args: argparse.Namespace, commit: bool) -> int:
    with make_client(args) as client:
        done = client.end_transaction(args.transaction_id, args.half_offset, commit=commit)
    doc: dict[str, Any] = {"transaction_id": args.transaction_id,
                           "outcome": "committed" if done.committed else "rolled back",
                           "duplicate": done.duplicate}  # fmt: skip
    if done.result is not None:
        doc |= {"msg_id": done.result.msg_id, "commitlog_offset": done.result.commitlog_offset}
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


@command("tx commit", "commit a transaction: its message becomes visible, once", _tx_end_args)
def _tx_commit(args: argparse.Namespace) -> int:
    return _tx_end(args, True)


@command("tx rollback", "roll a transaction back: its message is never visible", _tx_end_args)
def _tx_rollback(args: argparse.Namespace) -> int:
    return _tx_end(args, False)


def _get_args(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--msg-id", metavar="ID")
    which.add_argument("--offset", type=non_negative, metavar="N", help="commit-log offset")
    p.add_argument("--linearizable", action="store_true", help="confirm with the leader first")


@command("get", "one message by id or commit-log offset", _get_args)
def _get(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        m = client.get(msg_id=args.msg_id, offset=args.offset, linearizable=args.linearizable)
    doc = message_json(m)
    text = "\n".join(f"{k:<18} {cell(v)}" for k, v in doc.items())
    emit(args, doc, text)
    return 0


def _pull_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True)
    p.add_argument("--queue", type=non_negative, required=True, metavar="Q")
    p.add_argument("--offset", type=non_negative, required=True, metavar="N")
    p.add_argument("--max", type=int, default=32, metavar="M")
    p.add_argument("--tag-expr", default="*", metavar="E", help="'*' or 'TagA || TagB'")
    p.add_argument("--wait-ms", type=non_negative, default=0, metavar="W")


@command("pull", "messages of one consume queue from an offset", _pull_args)
def _pull(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        r: PullResult = client.pull(
            args.topic, args.queue, args.offset, args.max, args.tag_expr, args.wait_ms
        )
    doc = {
        "messages": [message_json(m) for m in r.messages],
        "next_offset": r.next_offset,
        "min_offset": r.min_offset,
        "max_offset": r.max_offset,
    }
    footer = f"next_offset {r.next_offset}  (queue holds {r.min_offset}..{r.max_offset})"
    emit(args, doc, messages_table(r.messages) + "\n" + footer)
    return 0


def _query_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--begin", type=non_negative, default=0, metavar="TS", help="ms since epoch")
    p.add_argument("--end", type=non_negative, default=0, metavar="TS", help="0: now")
    p.add_argument("--max", type=int, default=32, metavar="M")


@command("query", "messages by key", _query_args)
def _query(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        msgs = client.query(args.topic, args.key, args.begin, args.end, args.max)
    emit(args, {"messages": [message_json(m) for m in msgs]}, messages_table(msgs))
    return 0


def _consume_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", required=True, metavar="G", help="consumer group")
    p.add_argument("--topic", required=True)
    p.add_argument("--tag-expr", default="*", metavar="E", help="'*' or 'TagA || TagB'")
    p.add_argument("--max", type=non_negative, default=0, metavar="N",
                   help="stop after N messages (0: no limit)")  # fmt: skip
    p.add_argument("--idle-exit", type=float, default=0.0, metavar="S",
                   help="stop after S seconds without a new message (0: never)")  # fmt: skip
    p.add_argument("--batch", type=int, default=32, metavar="B", help="messages per pull")


@command("consume", "tail a topic from the group's committed offsets, committing as it goes",
         _consume_args)  # fmt: skip
def _consume(args: argparse.Namespace) -> int:
    """Pull every queue of the topic from the group's offset; commit after each batch.

    Ctrl-C (SIGINT) stops it between calls, never inside one: the handler only
    records it, and the loop ends after the call in flight (a long poll waits at
    most a second). A KeyboardInterrupt raised inside a blocking gRPC call could
    leave the call's cleanup waiting forever (seen: a consume still running 30 s
    after SIGINT)."""
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        with make_client(args) as client:
            consumed = _consume_until(args, client, interrupted)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        raise KeyboardInterrupt  # here, outside any call: `main` says "interrupted"
    if not args.json:
        print(f"consumed {consumed} messages", file=sys.stderr)
    return 0


def _consume_until(args: argparse.Namespace, client: Client, interrupted: threading.Event) -> int:
    """The consume loop, until `--max`, `--idle-exit` or `interrupted`; how many it consumed."""
    consumed = 0
    idle_since = time.monotonic()
    positions: dict[int, int] = {}
    wait_ms = 0
    while not (args.max and consumed >= args.max) and not interrupted.is_set():
        for q in client.queue_offsets(args.topic):
            if q.queue_id not in positions:
                committed = client.fetch_offset(args.group, args.topic, q.queue_id)
                start = committed.get(q.queue_id, -1)
                positions[q.queue_id] = start if start >= 0 else q.min_offset
        got = 0
        for queue_id, offset in sorted(positions.items()):
            limit = args.batch if not args.max else min(args.batch, args.max - consumed)
            if limit <= 0 or interrupted.is_set():
                break
            r = client.pull(args.topic, queue_id, offset, limit, args.tag_expr, wait_ms=wait_ms)
            for m in r.messages:
                _print_consumed(args, m)
            got += len(r.messages)
            consumed += len(r.messages)
            if r.next_offset != offset:
                client.commit_offset(args.group, args.topic, queue_id, r.next_offset)
                positions[queue_id] = r.next_offset
        if got:
            idle_since, wait_ms = time.monotonic(), 0
        else:
            if args.idle_exit and time.monotonic() - idle_since >= args.idle_exit:
                break
            wait_ms = max(50, 1000 // max(1, len(positions)))
    return consumed


def _print_consumed(args: argparse.Namespace, m: StoredMessage) -> None:
    if args.json:
        print(json.dumps(message_json(m)), flush=True)
    else:
        print(f"{m.topic}/{m.queue_id}@{m.queue_offset}  {m.msg_id}  tags={m.tags or '-'}  "
              f"keys={','.join(m.keys) or '-'}  {preview(m.body)}", flush=True)  # fmt: skip
