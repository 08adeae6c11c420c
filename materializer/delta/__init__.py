"""Delta table access: where a table is, what it records for a pipeline, how to commit to it.

A binding's ``table`` is a path (``/data/orders``, ``s3a://bucket/orders``, relative paths resolved
against the working directory) or a catalog name (``catalog.schema.table``).

The package, one job a module (each imports only those listed after it):

* :mod:`~materializer.delta.state`: :class:`TableState`, :func:`table_state` (delta-rs first where
  its answer is trusted, else Spark), the latest version and the metadata fingerprint by delta-rs;
* :mod:`~materializer.delta.txn_log`: :func:`txn_version`, read by Spark from the Delta log;
* :mod:`~materializer.delta.writers`: :func:`table_writers`, who has committed to a table (in Python
  where :mod:`~materializer.delta.trust` says this process sees the files as Spark does, else Spark);
* :mod:`~materializer.delta.reads`: DESCRIBE DETAIL and HISTORY, schema and properties, rows, identity;
* :mod:`~materializer.delta.names`, :mod:`~materializer.delta.conflicts`: the txn confs, the commit
  tag and SQL names; a lost commit race told by type or error class, the commit that won it, and
  whether a retry may write after it.
"""

from __future__ import annotations

from materializer.delta.conflicts import ROW_OPERATIONS, OtherCommit, blocking_commit, conflict_name, error_condition, is_commit_conflict
from materializer.delta.names import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    parse_user_metadata,
    literal,
    quote,
    sql_name,
    user_metadata,
)
from materializer.delta.reads import (
    detail,
    exists,
    history,
    read_table,
    schema_and_properties,
    table_identity,
    table_location,
    table_version,
)
from materializer.delta.state import (
    TableState,
    delta_rs_storage_options,
    latest_version,
    metadata_fingerprint,
    read_txn_without_spark,
    table_state,
)
from materializer.delta.txn_log import txn_version
from materializer.delta.writers import TableWriters, table_writers, writers_without_spark
from materializer.tables import TableRef

__all__ = [
    "OtherCommit", "ROW_OPERATIONS", "TXN_APP_ID", "TXN_VERSION", "USER_METADATA", "TableRef", "TableState", "TableWriters",
    "blocking_commit", "conflict_name", "delta_rs_storage_options", "detail", "error_condition", "exists", "history", "is_commit_conflict",
    "latest_version", "metadata_fingerprint", "literal", "parse_user_metadata", "quote", "read_table",
    "read_txn_without_spark", "schema_and_properties", "sql_name", "table_identity", "table_location",
    "table_state", "table_version", "table_writers", "txn_version", "user_metadata", "writers_without_spark",
]
