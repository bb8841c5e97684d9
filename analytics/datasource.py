"""The `dledger` Spark data source (PySpark's Python Data Source API), batch and streaming.

    spark.dataSource.register(DLedgerDataSource)   # or analytics.session.register(spark)
    df = (spark.read.format("dledger")
          .option("servers", "127.0.0.1:7001,127.0.0.1:7002")   # or .option("path", data_dir)
          .option("topics", "orders,payments")
          .option("startingOffsets", "earliest").option("endingOffsets", "latest")
          .load())

Options: see `analytics.options`; offsets: `analytics.offsets`; partitions:
`analytics.partitions`. Schema: `analytics.codec.FIELDS`. The Python Data Source
API prunes no columns by itself, so a query that needs few columns names them: a
user schema that is a subset of the source's
(`.schema("topic string, body_size int")`) or the `columns` option
(`.option("columns", "topic,body_size")`); only those columns are decoded, and
the rows carry the schema's names (`raft_group`, the old name of `shard`, too).

Batch: the planner (driver side) asks the store for each queue's committed
range, resolves offsets (and timestamps), applies the filters Spark pushed down
(`pushFilters`: topic, queue_id, queue_offset, shard = / IN exactly; store_timestamp bounds as
offsets, rechecked by Spark) and cuts partitions: commit-log ranges read in one
pass each (`LogPiece`: most of the log) or queue-offset ranges of one queue
(`Slice`: a few topics of many). Each partition is read on an executor (a local
replica's files, or the servers' ReadUnits/ReadLog, or Pull) and decoded to
Arrow record batches of about 256k rows. Streaming: the offsets are per-queue
committed offsets `{"topic": {"queue": next offset}}`; each micro-batch reads
[previous end, latest committed) of every queue, capped by
`maxOffsetsPerTrigger`, held back by `minOffsetsPerTrigger` until
`maxTriggerDelay` has passed; Spark checkpoints the offsets, so a restarted
query resumes exactly where it stopped. Only committed messages are ever read.

Multi-Raft clusters (docs/analytics.md): the store is every data shard
(`analytics.shard_stores`, shards asked once, by the first planning), a queue
is keyed by its shard too (`"G:Q"` in offsets JSON and checkpoints; shard 1's
stay `"Q"`), partitions are cut per shard, never across
shards, and `shard` is a metadata column: not in the default schema,
decoded when the schema or `columns` names it.

Filter pushdown needs `spark.sql.python.filterPushdown.enabled=true` (what
`analytics.session.register` sets). Spark refuses a reader that implements
`pushFilters` when it is off, so the reader made for Spark's pushdown planner
is the only one that does; with pushdown off, reads work unfiltered.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from analytics import offsets, partitions
from analytics.codec import SPARK_DDL
from analytics.errors import OptionError
from analytics.file_store import LocalFiles
from analytics.offsets import Narrowing, Offsets
from analytics.options import (
    SOURCE_TYPES,
    ReadOptions,
    columns_option,
    parse_options,
    schema_columns,
)
from analytics.shard_stores import ShardedStore
from analytics.sources import SYSTEM_TOPIC_PREFIX, LogPiece, QueueInfo, Slice
from analytics.stores import open_shards

FORMAT = "dledger"
_TYPES = SOURCE_TYPES  # every column a schema may name
_PUSHDOWN_PLANNER = "pyspark.sql.worker.data_source_pushdown_filters"


class DLedgerPartition(InputPartition):
    """One queue's offset range; `prefer` picks the server tried first (spreads the load);
    `local`: a replica's files the planner was offered (read if on the executor's host)."""

    def __init__(self, piece: Slice, prefer: int, local: LocalFiles | None = None) -> None:
        super().__init__(("queue", piece, prefer, local))
        self.piece = piece
        self.prefer = prefer


class DLedgerLogPartition(InputPartition):
    """A commit-log range of several queues, read in one pass."""

    def __init__(self, piece: LogPiece, prefer: int, local: LocalFiles | None = None) -> None:
        super().__init__(("log", piece, prefer, local))
        self.piece = piece
        self.prefer = prefer


class DLedgerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        columns = columns_option(self.options)
        if columns is None:
            return SPARK_DDL
        return ", ".join(f"{c} {_TYPES[c]}" for c in columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_options(self.options, streaming=False)
        if _called_by(_PUSHDOWN_PLANNER):
            return DLedgerFilteringBatchReader(options, schema)
        return DLedgerBatchReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DLedgerStreamReader(parse_options(self.options, streaming=True), schema)


def _called_by(module: str) -> bool:
    """Whether the caller of our caller is in `module` (which Spark planner asks)."""
    frame = sys._getframe(2)
    return frame.f_globals.get("__name__") == module


def columns_of(schema: StructType, wanted: tuple[str, ...] | None = None) -> list[str]:
    """The source columns a (user) schema asks for (`options.schema_columns`)."""
    return schema_columns([(f.name, f.dataType.simpleString()) for f in schema.fields], wanted)


class _Base:
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.columns = columns_of(schema, options.columns)
        # The rows' names: the schema's, which may name a column by its old name.
        self.names = schema.fieldNames()
        self._column_of = dict(zip(self.names, self.columns, strict=True))
        self.narrowing = Narrowing()
        self._shards: list[int] | None = None  # the data shards, once a planner asked

    def _store(self, prefer: int = 0, shards: list[int] | None = None) -> ShardedStore:
        """Every data shard (`shards`: known ones; else the planner's, or asked once)."""
        opts = self.options
        return open_shards(
            opts.servers,
            opts.path,
            opts.timeout_s,
            prefer,
            _access(opts),
            opts.local_reads,
            shards or self._shards,
        )

    def _queues(self, store: ShardedStore) -> list[QueueInfo]:
        opts = self.options
        found = store.queues()  # user topics
        for topic in offsets.named_topics(opts):
            if topic.startswith(SYSTEM_TOPIC_PREFIX):  # only when asked for by name
                found += store.queues(topic)
        self._shards = store.shards()
        return self.narrowing.queues(offsets.choose(found, opts))

    def _partitions(self, store: ShardedStore, slices: list[Slice]) -> list[InputPartition]:
        """Each shard's slices cut as one read's (`analytics.partitions`), never across
        shards; log pieces shared among the shards by their bytes."""
        opts = self.options
        per_shard = partitions.by_shard(slices)
        spans = {
            g: store.unit_span(ss) if opts.partitioning != "queue" else None
            for g, ss in per_shard.items()
        }
        files = store.offline
        logged = {
            g: span
            for g, span in spans.items()
            if span is not None and partitions.use_log_ranges(opts.partitioning, files, span)
        }
        counts = partitions.shares(
            partitions.default_partitions(opts), [span[2] for span in logged.values()]
        )
        share = dict(zip(logged, counts, strict=True))
        out: list[InputPartition] = []
        for g, ss in per_shard.items():
            local = store.offered(g) if opts.local_reads else None
            span = logged.get(g)
            if span is not None:
                pieces = partitions.log_pieces(
                    ss, span, share[g], store.segment_bytes(g), exact=opts.min_partitions_given
                )
                out += [DLedgerLogPartition(p, len(out) + k, local) for k, p in enumerate(pieces)]
            else:
                cut = partitions.split(ss, opts.messages_per_partition, opts.min_partitions)
                out += [DLedgerPartition(p, len(out) + k, local) for k, p in enumerate(cut)]
        return out

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition is None or partition.value is None:  # Spark's stand-in when there are none
            return
        kind, piece, prefer, local = partition.value
        store = self._store(prefer, [piece.shard])
        renamed = self.names != self.columns
        try:
            if kind == "log":
                batches = store.read_piece(piece, self.columns, local)
            else:
                batches = store.read(piece, self.columns, local)
            for batch in batches:
                if batch.num_rows:
                    yield batch.rename_columns(self.names) if renamed else batch
        finally:
            store.close()


class DLedgerBatchReader(_Base, DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        opts = self.options
        store = self._store()
        try:
            queues = self._queues(store)
            lookup = store.offsets_for_times
            start = offsets.resolve_start(opts, queues, lookup)
            end = offsets.resolve_end(opts, queues, lookup)
            start, end = self.narrowing.offsets(start, end)
            start, end = self.narrowing.times(start, end, lookup, opts.timestamp_slack_ms)
            return self._partitions(store, offsets.ranges(start, end))
        finally:
            store.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)


class DLedgerFilteringBatchReader(DLedgerBatchReader):
    """The batch reader with filter pushdown (what Spark's pushdown planner gets)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what narrows the read (see the module doc); return what Spark must still
        check: filters not understood, and store_timestamp bounds (applied widened)."""
        left = []
        for f in filters:
            exact = self._push(f)
            if not exact:
                left.append(f)
        return left

    def _push(self, f: Filter) -> bool:
        """Narrow the read by `f`; True when the read then holds exactly its rows."""
        n = self.narrowing
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        if len(attribute) != 1:
            return False
        column = self._column_of.get(attribute[0], attribute[0])
        if isinstance(f, IsNotNull):
            return column in _TYPES and column != "tags"  # only tags is ever null
        value: Any = getattr(f, "value", None)
        what = f"{type(f).__name__}({column}, {value!r})"
        equal = isinstance(f, EqualTo | EqualNullSafe)
        if column == "topic":
            if equal and isinstance(value, str):
                self.narrowing = n.with_topics([value], what)
                return True
            if isinstance(f, In) and all(isinstance(v, str) for v in value):
                self.narrowing = n.with_topics(value, what)
                return True
            return False
        if column == "shard":  # a metadata column: only = and IN select shards
            if equal and _is_int(value):
                self.narrowing = n.with_shards([value], what)
                return True
            if isinstance(f, In) and all(_is_int(v) for v in value):
                self.narrowing = n.with_shards(value, what)
                return True
            return False
        if column in ("queue_id", "queue_offset"):
            which = "queue_id_range" if column == "queue_id" else "offset_range"
            if isinstance(f, In) and all(_is_int(v) for v in value):
                if column == "queue_id":
                    self.narrowing = n.with_queue_ids(value, what)
                    return True
                self.narrowing = n.bounded(which, min(value), max(value) + 1, what)
                return bool(len(set(value)) == max(value) - min(value) + 1)
            if not _is_int(value):
                return False
            bounds = _int_bounds(f, int(value))
            if bounds is None:
                return False
            self.narrowing = n.bounded(which, *bounds, what)
            return True
        if column == "store_timestamp":
            lo = hi = None
            if isinstance(f, GreaterThan | GreaterThanOrEqual) or equal:
                lo = offsets.to_ms(value, up=False)
            if isinstance(f, LessThan | LessThanOrEqual) or equal:
                up = offsets.to_ms(value, up=True)
                hi = None if up is None else up + 1
            if lo is not None or hi is not None:
                self.narrowing = n.bounded("time_range", lo, hi, what)
            return False  # widened by the slack: Spark checks the rows again
        return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_bounds(f: Filter, v: int) -> tuple[int | None, int | None] | None:
    """[lo, hi) of an integer comparison."""
    if isinstance(f, EqualTo | EqualNullSafe):
        return v, v + 1
    if isinstance(f, GreaterThan):
        return v + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return v, None
    if isinstance(f, LessThan):
        return None, v
    if isinstance(f, LessThanOrEqual):
        return None, v + 1
    return None


class DLedgerStreamReader(_Base, DataSourceStreamReader, SupportsTriggerAvailableNow):
    _target: Offsets | None = None  # trigger(availableNow=True): read up to here, then stop
    _last_trigger: float | None = None  # when the last micro-batch was planned (monotonic s)

    def initialOffset(self) -> dict[str, Any]:
        opts = self.options
        store = self._store()
        try:
            queues = self._queues(store)
            start = offsets.resolve_start(opts, queues, store.offsets_for_times)
        finally:
            store.close()
        return offsets.to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the committed ends now: this query reads up to them (rate-limited), no further."""
        store = self._store()
        try:
            self._target = {q.key: q.max_offset for q in self._queues(store)}
        finally:
            store.close()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets.from_json(start)
        latest: Offsets = dict(begin)  # a queue the store no longer lists stays where it was
        floor: Offsets = {}
        store = self._store()
        try:
            queues = self._queues(store)
        finally:
            store.close()
        for q in queues:
            key = q.key
            end = q.max_offset
            if self._target is not None:
                if key not in self._target:
                    continue  # appeared after the availableNow query started
                end = min(end, self._target[key])
            latest[key] = max(end, begin.get(key, 0))
            floor[key] = begin.get(key, q.min_offset)
        origin = {**floor, **begin}
        if not self._enough(origin, latest):
            return start
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return offsets.to_json(offsets.cap(origin, latest, cap))

    def _enough(self, origin: Offsets, latest: Offsets) -> bool:
        """minOffsetsPerTrigger: hold the batch back until that many messages wait, or
        maxTriggerDelay has passed since the last one (not under availableNow)."""
        least = self.options.min_offsets_per_trigger
        now = time.monotonic()
        if self._last_trigger is None:
            self._last_trigger = now  # the delay counts from the query's start
        if least is None or self._target is not None:
            return True
        waiting = sum(max(0, hi - origin.get(k, hi)) for k, hi in latest.items())
        if (
            waiting >= least
            or (now - self._last_trigger) * 1000 >= self.options.max_trigger_delay_ms
        ):
            self._last_trigger = now
            return True
        return False

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = offsets.from_json(start), offsets.from_json(end)
        if begin == finish:
            return []
        store = self._store()
        try:
            slices = offsets.stream_ranges(
                begin, finish, self._queues(store), self.options.fail_on_data_loss
            )
            return self._partitions(store, slices)
        finally:
            store.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: retention, not the reader, decides what the servers keep."""


def _access(opts: ReadOptions) -> Any:
    """TLS and credentials from the options' files (read where the store opens)."""
    if opts.tls_ca is None and opts.credentials is None:
        return None
    from dledger_commitlog.client import Access

    try:
        return Access.load(opts.tls_ca, opts.credentials)
    except (OSError, ValueError) as exc:
        raise OptionError(f"tlsCa/credentials: {exc}") from None
