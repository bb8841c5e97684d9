"""The `dledger` Spark data source (PySpark's Python Data Source API), batch and streaming.

    spark.dataSource.register(DLedgerDataSource)   # or analytics.session.register(spark)
    df = (spark.read.format("dledger")
          .option("servers", "127.0.0.1:7001,127.0.0.1:7002")   # or .option("path", data_dir)
          .option("topics", "orders,payments")
          .option("startingOffsets", "earliest").option("endingOffsets", "latest")
          .load())

Options and offsets: see `analytics.plan`. Schema: `analytics.codec.FIELDS`; a
user schema (`.schema("topic string, body_size int")`) that is a subset of it
makes the reader decode only those columns, which is how a query reads less.

Batch: the planner (driver side) asks the store for each queue's committed
range, resolves the offsets and cuts partitions (topic, queue, offset range);
each partition is read on an executor with `Pull(raw=True)` from a replica
(spread over the servers) and decoded to Arrow record batches. Streaming: the
offsets are per-queue committed offsets `{"topic": {"queue": next offset}}`;
each micro-batch reads [previous end, latest committed) of every queue, capped
by `maxOffsetsPerTrigger`; Spark checkpoints the offsets, so a restarted query
resumes exactly where it stopped. Only committed messages are ever read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from . import plan
from .codec import COLUMNS, SPARK_DDL, SPARK_TYPES
from .errors import OptionError
from .plan import Offsets, ReadOptions, Slice
from .sources import SYSTEM_TOPIC_PREFIX, QueueInfo, open_store

FORMAT = "dledger"


class DLedgerPartition(InputPartition):
    """One queue's offset range; `prefer` picks the server tried first (spreads the load)."""

    def __init__(self, piece: Slice, prefer: int) -> None:
        super().__init__((piece.topic, piece.queue_id, piece.start, piece.end, prefer))
        self.piece = piece
        self.prefer = prefer


class DLedgerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return DLedgerBatchReader(plan.parse_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DLedgerStreamReader(plan.parse_options(self.options, streaming=True), schema)


def columns_of(schema: StructType) -> list[str]:
    """The source columns a (user) schema asks for, checked against the source schema."""
    out = []
    for field in schema.fields:
        want = SPARK_TYPES.get(field.name)
        if want is None:
            raise OptionError(
                f"schema: {field.name!r} is not a column of the dledger source "
                f"(columns: {', '.join(COLUMNS)})"
            )
        got = field.dataType.simpleString()
        if got != want:
            raise OptionError(f"schema: column {field.name} is {want}, not {got}")
        out.append(field.name)
    if not out:
        raise OptionError("schema: no columns")
    return out


class _Base:
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.columns = columns_of(schema)

    def _queues(self) -> list[QueueInfo]:
        opts = self.options
        store = open_store(opts.servers, opts.path, opts.timeout_s, access=_access(opts))
        try:
            found = store.queues()  # user topics
            for topic in opts.topics or ():
                if topic.startswith(SYSTEM_TOPIC_PREFIX):  # only when asked for by name
                    found += store.queues(topic)
        finally:
            store.close()
        return plan.select(found, opts.topics)

    def _partitions(self, slices: list[Slice]) -> list[DLedgerPartition]:
        pieces = plan.split(
            slices, self.options.messages_per_partition, self.options.min_partitions
        )
        return [DLedgerPartition(p, k) for k, p in enumerate(pieces)]

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition is None or partition.value is None:  # Spark's stand-in when there are none
            return
        topic, queue_id, start, end, prefer = partition.value
        opts = self.options
        store = open_store(opts.servers, opts.path, opts.timeout_s, prefer, _access(opts))
        try:
            for batch in store.read(topic, queue_id, start, end, self.columns):
                if batch.num_rows:
                    yield batch
        finally:
            store.close()


class DLedgerBatchReader(_Base, DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        opts = self.options
        queues = self._queues()
        start = plan.resolve(opts.starting, queues, "startingOffsets", opts.fail_on_data_loss)
        end = plan.resolve(opts.ending, queues, "endingOffsets")
        parts: list[InputPartition] = list(self._partitions(plan.ranges(start, end)))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)


class DLedgerStreamReader(_Base, DataSourceStreamReader, SupportsTriggerAvailableNow):
    _target: Offsets | None = None  # trigger(availableNow=True): read up to here, then stop

    def initialOffset(self) -> dict[str, Any]:
        opts = self.options
        queues = self._queues()
        start = plan.resolve(opts.starting, queues, "startingOffsets", opts.fail_on_data_loss)
        return plan.to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the committed ends now: this query reads up to them (rate-limited), no further."""
        self._target = {(q.topic, q.queue_id): q.max_offset for q in self._queues()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = plan.from_json(start)
        latest: Offsets = dict(begin)  # a queue the store no longer lists stays where it was
        floor: Offsets = {}
        for q in self._queues():
            key = (q.topic, q.queue_id)
            end = q.max_offset
            if self._target is not None:
                if key not in self._target:
                    continue  # appeared after the availableNow query started
                end = min(end, self._target[key])
            latest[key] = max(end, begin.get(key, 0))
            floor[key] = begin.get(key, q.min_offset)
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan.to_json(plan.cap({**floor, **begin}, latest, cap))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = plan.from_json(start), plan.from_json(end)
        if begin == finish:
            return []
        slices = plan.stream_ranges(begin, finish, self._queues(), self.options.fail_on_data_loss)
        parts: list[InputPartition] = list(self._partitions(slices))
        return parts

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
