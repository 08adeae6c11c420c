"""Where a read in this process (delta-rs, the log in Python) is trusted to see what Spark sees."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.tables import TableRef

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


DELTA_RS_CANNOT: set[str] = set()
"""Path tables delta-rs could not read in this process (see :func:`materializer.delta.table_state`)."""


def delta_rs_sees(spark: "SparkSession", table: TableRef) -> bool:
    """Does this process see the table's files as the session's Spark does?

    S3: one store for both. A local path: only when the JVM runs here (classic); a Spark Connect
    server may be another machine, whose disk this process does not see.
    """
    from materializer.spark import is_connect
    from materializer.storage import is_s3

    return is_s3(table.location) or not is_connect(spark)
