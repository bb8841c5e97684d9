"""analytics package: Spark reads of the committed log, export to Parquet, the analytics
jobs and their charts. It needs the [analytics] extra (PySpark, pyarrow, matplotlib):
imported without it, it raises `MissingExtra`, one line naming the extra."""

from dledger_commitlog.common.extras import require

require("analytics", ("pyspark", "pyarrow", "matplotlib"), commands=("analytics", "export"))
