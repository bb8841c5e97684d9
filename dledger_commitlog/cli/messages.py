"""The message commands: put (now or later), tx (half, commit, rollback), get, pull,
query, consume.

Each opens a client from the connection options (`commands.make_client`), makes
one call or a loop of them, and prints the result as a table or, with --json,
one JSON document. `consume` is a member of its consumer group (a blocking
`client.consumer.Consumer`): the group's members share its queues, each message
going to one of them, which prints it (one line; with --json one JSON object a
line) and acks it; it leaves the group when it stops. A put's body comes from
--body or --body-file ('-': standard input) and is sent as given. Times a
delayed put names are checked here only for form (an ISO 8601 time needs a
zone; a duration is one number and unit); whether one is too far ahead is the
cluster's to say (`schedule.max_timer_delay_s`), since only it knows its setting.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dledger_commitlog.cli.commands import (
    UsageError,
    cell,
    command,
    emit,
    key_value,
    make_client,
    messages_table,
    non_negative,
    positive,
    preview,
    table,
)
from dledger_commitlog.client import PullResult, PutResult
from dledger_commitlog.client.consumer import ConsumedMessage
from dledger_commitlog.client.groups import Subscription
from dledger_commitlog.client.routing import RoutedConsumer
from dledger_commitlog.common.routes import shard_of_msg_id
from dledger_commitlog.console.views import message_json
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
    later.add_argument(
        "--deliver-in",
        type=_duration_ms,
        metavar="DURATION",
        dest="deliver_in_ms",
        help="deliver DURATION from now: 90s, 10m, 2h",
    )
    later.add_argument(
        "--deliver-at",
        type=epoch_ms,
        metavar="TIME",
        help="deliver at TIME: ISO 8601 with a zone (YYYY-MM-DDTHH:MM:SSZ) or ms since the epoch",
    )


def _duration_ms(text: str) -> int:
    """One duration in the delay levels' units (`parse_levels`: 500ms, 90s, 10m, 2h, 1d) -> ms."""
    try:
        durations = parse_levels(text)
    except ValueError:
        durations = ()
    if len(durations) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 10m or 2h")
    return durations[0]


def epoch_ms(text: str) -> int:
    """An argument type: ISO 8601 (a zone is required) or ms since the epoch -> the latter."""
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


def _put_target(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """(shard, queue id there) of a put: on a multi-shard cluster without
    --shard, the topic's route decides (docs/scaling.md): --queue numbers the
    topic's queues across its shards, else one is drawn at random; (None, --queue)
    on a single-shard cluster or with --shard."""
    if args.shard is not None:
        return None, args.queue
    with make_client(args) as client:
        routes = client.route(args.topic)
    if routes.shard_count == 1:
        return None, args.queue
    route = routes.route(args.topic)
    queue = args.queue if args.queue is not None else random.randrange(route.total_queues)
    try:
        return route.locate(queue)
    except IndexError as exc:
        raise UsageError(f"--queue: {exc}") from None


@command(
    "put", "put one message (--delay-level/--deliver-in/--deliver-at: delivered later)", _put_args
)
def _put(args: argparse.Namespace) -> int:
    body = _body_of(args)
    deliver_at_ms = args.deliver_at or 0
    if args.deliver_in_ms is not None:
        deliver_at_ms = time.time_ns() // 1_000_000 + args.deliver_in_ms
    shard, queue = _put_target(args)
    with make_client(args, shard=shard) as client:
        r = client.put(
            args.topic,
            body,
            keys=args.key,
            tags=args.tag,
            properties=dict(args.property),
            uniq_key=args.uniq_key,
            queue_id=queue,
            delay_level=args.delay_level or 0,
            deliver_at_ms=deliver_at_ms,
        )
    doc = _result_doc(r)
    if shard is not None:
        doc["shard"] = shard
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


def _put_half_args(p: argparse.ArgumentParser) -> None:
    _message_args(p)
    p.add_argument("--group", required=True, metavar="G", help="the producer group")


@command("tx put-half", "store a transactional message (invisible until committed)", _put_half_args)
def _tx_put_half(args: argparse.Namespace) -> int:
    body = _body_of(args)
    with make_client(args) as client:
        half = client.put_half(
            args.topic,
            body,
            producer_group=args.group,
            keys=args.key,
            tags=args.tag,
            properties=dict(args.property),
            uniq_key=args.uniq_key,
            queue_id=args.queue,
        )
    doc = {
        "transaction_id": half.transaction_id,
        "half_offset": half.half_offset,
        "duplicate": half.result.duplicate,
    }
    emit(args, doc, table(tuple(doc), [tuple(doc.values())]))
    return 0


def _tx_end_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("transaction_id", metavar="ID")
    p.add_argument("half_offset", type=non_negative, metavar="HALF_OFFSET")


def _tx_end(args: argparse.Namespace, commit: bool) -> int:
    with make_client(args) as client:
        done = client.end_transaction(args.transaction_id, args.half_offset, commit=commit)
    doc: dict[str, Any] = {
        "transaction_id": args.transaction_id,
        "outcome": "committed" if done.committed else "rolled back",
        "duplicate": done.duplicate,
    }
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
    shard = None  # a message id names its shard (an offset is --shard's)
    if args.msg_id is not None and args.shard is None:
        with contextlib.suppress(ValueError):  # no id: the server says why, as ever
            shard = shard_of_msg_id(args.msg_id)
    with make_client(args, shard=shard) as client:
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
    which = p.add_mutually_exclusive_group()
    which.add_argument("--tag-expr", default="*", metavar="E", help="'*' or 'TagA || TagB'")
    which.add_argument(
        "--sql", metavar="EXPR", help="SQL92 filter on properties: \"region = 'eu' AND a > 5\""
    )
    p.add_argument(
        "--max",
        type=non_negative,
        default=0,
        metavar="N",
        help="stop after N messages (0: no limit)",
    )
    p.add_argument(
        "--idle-exit",
        type=float,
        default=0.0,
        metavar="S",
        help="stop after S seconds without a new message (0: never)",
    )
    p.add_argument("--batch", type=positive, default=32, metavar="B", help="messages per fetch")
    p.add_argument(
        "--orderly",
        action="store_true",
        help="one at a time per queue, in order; a retry waits in place",
    )
    p.add_argument(
        "--strategy",
        choices=("average", "consistent-hash"),
        default="average",
        help="how the group divides its queues among its members",
    )
    p.add_argument(
        "--max-reconsume",
        type=positive,
        default=16,
        metavar="N",
        help="retries before a message is a dead letter (default 16)",
    )
    p.add_argument(
        "--ack-wait-ms",
        type=positive,
        default=30_000,
        metavar="MS",
        help="a message not acked in MS is delivered again (default 30000)",
    )


@command(
    "consume",
    "consume a topic as a member of a group (its members share the queues)",
    _consume_args,
)
def _consume(args: argparse.Namespace) -> int:
    """Join the group, print what its coordinator hands this member, ack it; leave at the end.
    On a multi-shard cluster it joins the group in every data shard (one member per
    shard, `RoutedConsumer`; --max counts them all), or in --shard's alone.

    Ctrl-C (SIGINT) stops it between calls, never inside one: the handler only asks
    the consumer to stop, and it ends after the call in flight (a long poll waits at
    most a second), finishing what it printed, acking it and leaving the group, so
    its queues move to the other members at once. A KeyboardInterrupt raised inside
    a blocking gRPC call could leave the call's cleanup waiting forever (seen: a
    consume still running 30 s after SIGINT)."""
    subscription = (
        Subscription.sql(args.topic, args.sql)
        if args.sql is not None
        else Subscription(args.topic, args.tag_expr)
    )
    printer = _Printer(args.json)
    servers, connection = _connection(args)
    if args.shard is not None:
        connection["shards"] = [args.shard]
    consumer = RoutedConsumer(
        servers,
        args.group,
        [subscription],
        printer,
        orderly=args.orderly,
        strategy=args.strategy,
        max_reconsume=args.max_reconsume,
        ack_wait_ms=args.ack_wait_ms,
        batch=args.batch,
        concurrency=1,
        **connection,
    )
    printer.on_broken = consumer.stop
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.set()
        consumer.stop()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        consumer.run(max_messages=args.max, idle_exit_s=args.idle_exit)
    finally:
        signal.signal(signal.SIGINT, previous)
    if printer.broken:
        raise BrokenPipeError  # `main` leaves quietly
    if interrupted.is_set():
        raise KeyboardInterrupt  # here, outside any call: `main` says "interrupted"
    if not args.json:
        print(f"consumed {printer.printed} messages", file=sys.stderr)
    return 0


def _connection(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The servers and client settings the connection options name (as `make_client`)."""
    with make_client(args) as client:
        return client.servers, {
            "timeout_s": client.timeout_s,
            "cluster": client.cluster or None,
            "tls_ca": client.access.tls_ca,
            "credentials": client.access.credentials,
        }


class _Printer:
    """The consumer's handler: print each message (one line; JSON with --json). A
    reader that left (a closed pipe) stops the consumer; what it could not print is
    retried, not acked."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.printed = 0
        self.broken = False
        self.on_broken: Callable[[], None] = lambda: None

    def __call__(self, m: ConsumedMessage) -> bool:
        if self.broken:
            return False
        try:
            sys.stdout.write(consumed_line(m, self.as_json) + "\n")
            sys.stdout.flush()
        except OSError:  # BrokenPipeError: `dledger consume | head`
            self.broken = True
            self.on_broken()
            return False
        self.printed += 1
        return True


def consumed_json(m: ConsumedMessage) -> dict[str, Any]:
    """`message_json` of the stored copy, with `topic` the producer's (a retried message
    is stored in the group's retry topic: `stored_topic`) and its `reconsume_times`."""
    doc = message_json(m.message)
    doc["stored_topic"] = doc["topic"]
    doc["topic"] = m.topic
    doc["reconsume_times"] = m.reconsume_times
    return doc


def consumed_line(m: ConsumedMessage, as_json: bool) -> str:
    if as_json:
        return json.dumps(consumed_json(m))
    s = m.message
    retried = m.stored_topic != m.topic
    retry = f"  origin={m.topic} reconsumed={m.reconsume_times}" if retried else ""
    return (
        f"{m.stored_topic}/{m.queue_id}@{m.queue_offset}  {m.msg_id}  tags={s.tags or '-'}  "
        f"keys={','.join(s.keys) or '-'}{retry}  {preview(m.body)}"
    )
