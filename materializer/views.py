"""Live-row views: what a reader of a binding's table usually wants, as a catalog view.

The table holds more than the live rows: tombstones (``sequence_by`` and ``soft_delete`` keep a
deleted key's row with ``__deleted = true``), every version of a key (``mode: scd2``), and the
columns the materializer keeps for itself (``__sequence``, ``__from``, ``__reset_at``, ...). A
binding's ``view`` names a view, created or replaced with the table, that shows:

* the live rows: no row with ``__deleted = true``; for ``mode: scd2``, the ``__current`` versions;
* the data columns only: every column whose name starts with ``__`` is left out, unless
  ``view_internal_columns: true``.

The view names its columns, so a column the table gains later (schema evolution) reaches the view
when the materializer replaces it, after the apply that added it. :func:`live_rows_sql` is also
the query the docs give for path tables, where no catalog holds a view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from materializer.delta import TableRef, quote, read_table, sql_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from materializer.config import BindingConfig

INTERNAL_PREFIX = "__"
DELETED = "__deleted"
CURRENT = "__current"


def live_rows_sql(binding: "BindingConfig", columns: Iterable[str]) -> str:
    """The SELECT of ``binding``'s live rows from its table, whose columns are ``columns``."""
    columns = list(columns)
    shown = columns if binding.view_internal_columns else [c for c in columns if not c.startswith(INTERNAL_PREFIX)]
    where = []
    if binding.mode == "scd2" and CURRENT in columns:
        where.append(f"{quote(CURRENT)}")
    if DELETED in columns:
        where.append(f"NOT coalesce({quote(DELETED)}, false)")
    sql = f"SELECT {', '.join(quote(c) for c in shown)} FROM {sql_name(TableRef(binding.table))}"
    return sql + (f" WHERE {' AND '.join(where)}" if where else "")


def replace_view(spark: "SparkSession", binding: "BindingConfig") -> tuple[str, ...]:
    """CREATE OR REPLACE the binding's view over its table as the table is now; the columns it
    was made from (the caller replaces it again when they change)."""
    assert binding.view is not None
    columns = tuple(read_table(spark, TableRef(binding.table)).columns)
    spark.sql(f"CREATE OR REPLACE VIEW {binding.view} AS {live_rows_sql(binding, columns)}")
    return columns
