"""`dledger export` and `dledger analytics <job>`: registered on import (by cli.build_parser).

Both read either the cluster (the usual `--servers` / `--cluster` options) or,
with `--path DATA_DIR`, a stopped node's data directory. Errors follow the CLI's
rules: a bad option (unknown topic, bad number) exits 2 with one line on stderr,
a source that cannot be read exits 1; no traceback either way.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
from typing import Any

from analytics.errors import AnalyticsError, OptionError, SourceError
from dledger_commitlog.cli.commands import (
    UsageError,
    command,
    emit,
    make_client,
    security_files,
    table,
)
from dledger_commitlog.client import Access
from store.errors import StoreError

Run = Callable[[argparse.Namespace], int]
_SPARK_ERROR = re.compile(r"analytics\.errors\.(OptionError|SourceError): (.*)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _topics(text: str) -> list[str]:
    topics = [t.strip() for t in text.split(",") if t.strip()]
    if not topics:
        raise argparse.ArgumentTypeError("give at least one topic")
    return topics


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", metavar="DATA_DIR", help="a stopped node's data directory")
    p.add_argument("--topics", type=_topics, metavar="T,...", help="default: every user topic")


def _spark_args(p: argparse.ArgumentParser) -> None:
    _source_args(p)
    p.add_argument("--chart", metavar="FILE.png", help="also draw the result as a PNG")
    p.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")


def _errors(run: Run) -> Run:
    """Analytics errors as the CLI reports them (Spark wraps ours in its own exceptions)."""

    @functools.wraps(run)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except OptionError as exc:
            raise UsageError(str(exc)) from exc
        except (SourceError, StoreError) as exc:
            return _fail(str(exc))
        except Exception as exc:
            if type(exc).__module__.startswith("pyspark"):
                found = _SPARK_ERROR.findall(str(exc))
                if found:
                    kind, message = found[-1]
                    if kind == "OptionError":
                        raise UsageError(message) from exc
                    return _fail(message)
                return _fail(f"spark: {str(exc).strip().splitlines()[0]}")
            raise

    return wrapped


def _fail(message: str) -> int:
    print(f"dledger: {message}", file=sys.stderr)
    return 1


def _servers(args: argparse.Namespace) -> tuple[list[str], Access]:
    """The servers the connection options name, and how to reach them (TLS, credentials)."""
    with make_client(args) as client:
        return client.servers, client.access


def _store(args: argparse.Namespace) -> Any:
    """What `dledger export` reads: one shard, --shard's or the only data
    shard there is. A multi-shard cluster's shards export one at a time, each to a
    directory of its own (their queue ids and offsets are their own)."""
    from analytics.stores import open_shards

    if args.path:
        sharded = open_shards(path=args.path)
    else:
        servers, access = _servers(args)
        sharded = open_shards(servers, timeout_s=args.timeout, access=access)
    try:
        return sharded.shard(_export_shard(args, sharded.shards()))  # closed by `export`
    except BaseException:
        sharded.close()
        raise


def _export_shard(args: argparse.Namespace, shards: list[int]) -> int:
    """--shard if it is one of `shards`, or the only one (UsageError otherwise)."""
    shard = args.shard if args.shard is not None or len(shards) > 1 else shards[0]
    if shard not in shards:
        named = "" if shard is None else f"--shard {shard}: not a data shard here; "
        raise UsageError(
            f"{named}the data shards are {', '.join(map(str, shards))}: export "
            "one at a time, each to a directory of its own "
            "(--shard G --to DIR-G)"
        )
    return int(shard)


# ---------------------------------------------------------------- export


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", required=True, metavar="DIR", help="export directory (Parquet)")
    _source_args(p)
    p.add_argument("--max-per-queue", type=_positive, metavar="N", help="cap this run")


@command("export", "export committed messages to Parquet (incremental)", _export_args)
@_errors
def _export(args: argparse.Namespace) -> int:
    from analytics.export import export

    store = _store(args)
    try:
        result = export(store, args.to, args.topics, args.max_per_queue)
    finally:
        store.close()
    rows = [(q.topic, q.queue_id, q.start, q.end, q.messages, q.skipped) for q in result.queues]
    doc = {
        "directory": str(result.directory),
        "messages": result.messages,
        "files": result.files,
        "removed_orphans": result.removed_orphans,
        "queues": [
            dict(zip(("topic", "queue", "from", "to", "messages", "skipped"), r, strict=True))
            for r in rows
        ],
    }
    text = table(("topic", "queue", "from", "to", "messages", "skipped"), rows)
    text += f"\nexported {result.messages} messages in {len(result.files)} files to {args.to}"
    if result.removed_orphans:
        text += f" (removed {len(result.removed_orphans)} files of an interrupted run)"
    emit(args, doc, text)
    return 0


# ---------------------------------------------------------------- analytics jobs


def _run_job(args: argparse.Namespace, job: Callable[[Any], Any]) -> int:
    from analytics import jobs
    from analytics.session import local_session

    if args.chart and not str(args.chart).lower().endswith(".png"):
        raise UsageError(f"--chart {args.chart}: the chart is a PNG file (name it *.png)")
    from pyspark.sql import SparkSession

    servers, options = [], {}
    if not args.path:
        servers = _servers(args)[0]
        tls_ca, credentials = security_files(args)
        options = {k: v for k, v in (("tlsCa", tls_ca), ("credentials", credentials)) if v}
    ours = SparkSession.getActiveSession() is None  # else: a caller's session (tests, notebooks)
    spark = local_session(args.master)
    try:
        df = jobs.read(spark, servers=servers, path=args.path, topics=args.topics, options=options)
        result = job(df)
    finally:
        if ours:
            spark.stop()
    return _print_table(args, result)


def _print_table(args: argparse.Namespace, result: Any) -> int:
    from analytics.charts import write_chart

    doc: dict[str, Any] = {"title": result.title, "rows": result.records()}
    text = f"{result.title}\n{table(result.headers, result.rows)}"
    if args.chart:
        doc["chart"] = str(write_chart(result, args.chart))
        text += f"\nchart: {args.chart}"
    emit(args, doc, text)
    return 0


@command("analytics rate", "messages and bytes per topic per minute (Spark)", _spark_args)
@_errors
def _rate(args: argparse.Namespace) -> int:
    from analytics.jobs import rate

    return _run_job(args, rate)


def _top_keys_args(p: argparse.ArgumentParser) -> None:
    _spark_args(p)
    p.add_argument("--limit", type=_positive, default=10, metavar="N", help="keys per topic")


@command("analytics top-keys", "most frequent keys per topic (Spark)", _top_keys_args)
@_errors
def _top_keys(args: argparse.Namespace) -> int:
    from analytics.jobs import top_keys

    return _run_job(args, lambda df: top_keys(df, args.limit))


@command("analytics sizes", "message body size percentiles per topic (Spark)", _spark_args)
@_errors
def _sizes(args: argparse.Namespace) -> int:
    from analytics.jobs import sizes

    return _run_job(args, sizes)


def _lag_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", required=True, metavar="G", help="consumer group")
    p.add_argument("--topics", type=_topics, metavar="T,...", help="default: every user topic")
    p.add_argument("--chart", metavar="FILE.png", help="also draw the result as a PNG")


@command("analytics lag", "consumer-group lag per queue (from the servers)", _lag_args)
@_errors
def _lag(args: argparse.Namespace) -> int:
    from analytics.jobs import lag
    from analytics.server_store import ServerStore

    if args.chart and not str(args.chart).lower().endswith(".png"):
        raise UsageError(f"--chart {args.chart}: the chart is a PNG file (name it *.png)")
    servers, access = _servers(args)
    store = ServerStore(servers, timeout_s=args.timeout, access=access)
    try:
        result = lag(store, args.group, args.topics)
    finally:
        store.close()
    return _print_table(args, result)


__all__ = ["AnalyticsError"]
