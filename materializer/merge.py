"""The Delta apply: the epoch's MERGE (standard mode) or append (delta-updates), tagged with its txn id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.config import BindingConfig
from materializer.delta import quote
from materializer.sources import OP


if TYPE_CHECKING:
    from pyspark.sql import DataFrame

MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
"""Delta copies a MERGE's source to disk first unless it is a Delta table ('auto'), in case the
source changes between the MERGE's two passes. A staged file never changes (it is written once
under a unique name and deleted only after the apply), so the copy is pure cost: 'none'."""
CONCURRENT_RETRIES = 3
CREATION_WAIT_SECONDS = 120
"""How long an apply whose CREATE TABLE found the table waits for the other creator's commit."""


def merge_sql(
    target: str, source_view: str, key: list[str], columns: list[str], evolve: str = "", target_filter: str = ""
) -> str:
    """The standard-mode MERGE: delete on a delete flag, else update the whole row or insert it.

    ``target_filter``: `` AND …`` predicates on the target alone (the epoch's key bounds,
    :func:`materializer.bounds.bounds_condition`) that Delta uses to skip files."""

    def q(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    condition = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key) + target_filter
    # Target columns unqualified: Delta resolves a column the MERGE adds (schema evolution) only so.
    updates = ", ".join(f"{q(c)} = s.{q(c)}" for c in columns)
    names = ", ".join(q(c) for c in columns)
    values = ", ".join(f"s.{q(c)}" for c in columns)
    return (
        f"MERGE{evolve} INTO {target} t USING {q(source_view)} s ON {condition} "
        f"WHEN MATCHED AND s.{q(OP)} = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {updates} "
        f"WHEN NOT MATCHED AND s.{q(OP)} <> 'd' THEN INSERT ({names}) VALUES ({values})"
    )


def _shape(schema: Any) -> list[tuple[str, str]]:
    """Column names and types, nullability aside: equal shapes need no schema evolution."""
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _cause(exc: BaseException) -> str:
    """The line of a Spark failure that says what went wrong, without the JVM stack."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    caused = [line for line in lines if line.startswith("Caused by:")]
    if caused:
        line = caused[-1][len("Caused by:") :].strip()
    else:
        line = next((l for l in lines if "[" in l and not l.startswith("at ")), lines[0] if lines else type(exc).__name__)
    line = line.lstrip(": ")
    if ": [" in line and line.split(": [", 1)[0].count(".") > 1:
        line = "[" + line.split(": [", 1)[1]  # drop the Java class name before Spark's error class
    return line[:500]


def _refused(pipeline_id: str, binding: BindingConfig, epoch: int, exc: BaseException) -> str:
    return (
        f"epoch {epoch}, binding {binding.name}: Delta refused to apply the epoch to table {binding.table}: "
        f"{_cause(exc)}. Nothing of epoch {epoch} was applied to {binding.table}; the epoch stays committed, so "
        "every run stops here until it is applied. Fix the table (for example drop or relax the constraint the "
        "rows break), then run again; or set the epoch's rows for this table aside, kept in a file, with "
        f"`materializer recover --config F --skip-epoch {epoch} --binding {binding.name}` (README: 'Stuck epochs')."
    )


def _align(df: "DataFrame", schema: Any, *, keep_extra: bool) -> "DataFrame":
    """Give ``df`` the table's columns and types: missing ones as NULL, new ones kept at the end."""
    from pyspark.sql import functions as F

    from pyspark.sql.types import ArrayType, StructType

    from materializer.reductions import conform, unify_types

    present = {f.name: f.dataType for f in df.schema.fields}
    columns = []
    for field in schema.fields:
        if field.name in present:
            column = F.col(quote(field.name))
            source = present[field.name]
            if isinstance(field.dataType, (StructType, ArrayType)):
                # A plain cast maps struct sub-fields by position and would put values in the
                # wrong sub-field: conform by name, keeping sub-fields the documents add.
                target = (unify_types(field.dataType, source) if keep_extra else None) or field.dataType
                columns.append(conform(column, source, target).alias(field.name))
            else:
                columns.append(column.cast(field.dataType).alias(field.name))
        else:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
    known = {f.name for f in schema.fields}
    if keep_extra:
        columns += [F.col(quote(c)) for c in df.columns if c not in known]
    return df.select(*columns)
