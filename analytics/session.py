"""A local Spark session with the `dledger` format registered (CLI jobs, demo, tests, bench).

PySpark's Python workers must run this project's interpreter (they import
`analytics` to decode messages), so `PYSPARK_PYTHON` is set to it when unset.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

QUIET_LOG_LEVEL = "ERROR"
# Spark's own logging before `setLogLevel` can act: errors only, on stderr.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _log4j2_file() -> Path:
    path = Path(tempfile.gettempdir()) / f"dledger-analytics-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        os.replace(tmp, path)
    return path


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> SparkSession:
    """Register the `dledger` format with `spark` and let Python sources take filters
    (topic, queue_id, queue_offset, store_timestamp narrow a read); returns it."""
    from analytics.datasource import DLedgerDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(DLedgerDataSource)
    return spark


def local_session(
    master: str = "local[*]",
    app_name: str = "dledger-analytics",
    shuffle_partitions: int = 4,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """A quiet local session (no UI, no progress bars) with the `dledger` format registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_log4j2_file()}")
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(QUIET_LOG_LEVEL)
    return register(spark)
