"""The epoch's one Delta commit (``TableWrites``): CREATE, append or MERGE, its rows aligned to the table."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from materializer import changes, sqltypes
from materializer.bounds import bounds_condition
from materializer.columns import OP
from materializer.config import BindingConfig
from materializer.delta import TableRef, detail, latest_version, quote, read_table, sql_name
from materializer.layout import create_table_sql
from materializer.merge.commit import CommitProperties
from materializer.widening import widened_schema, widening_enabled

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class TableWrites:
    """The write paths of :class:`materializer.merge.DeltaWriter`: each makes the epoch's one commit,
    run inside :meth:`~materializer.merge.DeltaWriter.transaction` on the apply session."""

    apply_spark: "SparkSession"

    def write(
        self,
        binding: BindingConfig,
        table: TableRef,
        props: CommitProperties,
        source: "DataFrame | None",
        table_exists: bool,
        key_bounds: "dict[str, list[str]] | None" = None,
        replace: bool = False,
    ) -> dict[str, int] | None:
        """Make the epoch's one Delta commit (inside :meth:`transaction`): CREATE the table, append,
        or MERGE; its metrics, or None if Delta skipped it as already applied."""
        if source is not None and not table_exists:
            return self.create(binding, table, props, source, replace=replace)
        if source is None or binding.mode == "delta_updates":
            return self.append(binding, table, props, source)
        return self.merge(binding, table, props, source, key_bounds)

    def append(self, binding: BindingConfig, table: TableRef, props: CommitProperties, source: "DataFrame | None") -> dict[str, int] | None:
        """Append onto a table that exists: delta-updates rows, or no rows at all, which still
        records the epoch on the table (an empty commit carrying the txn id)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if source is None:
            # No rows, the table's own schema (no schema object sent from this client: over Connect
            # its strings would come back collated, sqltypes.py).
            rows = read_table(self.apply_spark, table).limit(0)
        else:
            rows = source
        current = read_table(self.apply_spark, table).schema
        rows = align(rows, self._widened(table, rows, current), keep_extra=True)
        # Counted as the rows are written (no second pass), for the epoch's progress record.
        counted = Observation(f"appended_{binding.name}_{props.txn_version}_{uuid.uuid4().hex[:6]}")
        rows = rows.observe(counted, F.count(F.lit(1)).alias("rows"))
        writer = rows.write.format("delta").mode("append").options(**props.writer_options()).option("mergeSchema", "true")
        before = latest_version(self.apply_spark, table)
        writer.save(table.location) if table.is_path else writer.saveAsTable(table.location)
        after = latest_version(self.apply_spark, table)
        if after == before:
            return None  # Delta skipped it (the query never ran: do not wait for its count)
        try:
            return {"appended": 1, "num_inserted_rows": int(counted.get["rows"])}
        except Exception:  # noqa: BLE001 - saveAsTable's first write reports no observed row: count unknown
            return {"appended": 1}

    def merge(
        self, binding: BindingConfig, table: TableRef, props: CommitProperties, source: "DataFrame",
        key_bounds: "dict[str, list[str]] | None" = None,
    ) -> dict[str, int] | None:
        """MERGE the staged rows by key (standard, change-controlled or scd2 mode)."""
        epoch = props.txn_version
        target_schema = read_table(self.apply_spark, table).schema
        aligned = align(source, self._widened(table, source, target_schema), keep_extra=True)
        if binding.mode == "scd2":
            # Every version of the touched keys, from the staged changes and the table's versions
            # (read by this MERGE's own source, so from the snapshot it commits on).
            aligned = changes.scd2_versions(aligned, read_table(self.apply_spark, table), binding, epoch)
        elif binding.change_controlled:
            aligned = changes.merge_source(aligned, binding)  # the hidden columns, as they are set
        # Delta's SQL, not the Python DeltaTable API: on Spark Connect that API needs a server
        # plugin (delta-connect) that servers, Databricks' included, need not have.
        view = f"materializer_staged_{uuid.uuid4().hex}"
        aligned.createOrReplaceTempView(view)
        evolve = ""
        if _shape(aligned.drop(OP, *changes.staged_only(aligned.columns, binding)).schema) != _shape(target_schema):
            # New columns or sub-fields: only then, since an evolving MERGE is slower (about 10%
            # on a 10M-row table here) even when there is nothing to evolve.
            evolve = " WITH SCHEMA EVOLUTION"
        # The epoch's key bounds narrow the target side only: the MERGE has no clause for target
        # rows the source does not match, so rows outside them were never to be touched.
        bounds = bounds_condition(key_bounds)
        if binding.mode == "scd2":
            merge = changes.scd2_merge_sql(binding, sql_name(table), view, aligned.columns, evolve, bounds)
        elif binding.change_controlled:
            merge = changes.merge_sql(
                binding, sql_name(table), view, aligned.columns, evolve, bounds, target_columns=target_schema.fieldNames()
            )
        else:
            merge = merge_sql(sql_name(table), view, binding.key, [c for c in aligned.columns if c != OP], evolve, bounds)
        try:
            rows = self.apply_spark.sql(merge).collect()
        finally:
            self.apply_spark.catalog.dropTempView(view)
        if not rows:
            return None  # Delta skipped it: the table already records this epoch
        return {k: int(v) for k, v in rows[0].asDict().items() if v is not None}

    def _widened(self, table: TableRef, source: "DataFrame", target_schema: Any) -> Any:
        """The schema to align the epoch's rows to: the table's, with the columns its type widening
        widens for these rows (so the MERGE's schema evolution widens them instead of a cast)."""
        wider, changed = widened_schema(source.schema, target_schema)
        if not changed:
            return target_schema  # the usual case: no look at the table's properties
        found = detail(self.apply_spark, table)
        return wider if found is not None and widening_enabled(dict(found.get("properties") or {})) else target_schema

    def create(
        self, binding: BindingConfig, table: TableRef, props: CommitProperties, source: "DataFrame", replace: bool = False
    ) -> dict[str, int]:
        """Create the table with the epoch's rows and the binding's layout, in the epoch's tagged
        commit (inside :meth:`transaction`). Raises Spark's "already exists" if the table is there
        by now: the caller reads it again and merges (never a blind append)."""
        from pyspark.sql import functions as F

        epoch = props.txn_version
        if binding.mode == "delta_updates":
            rows = source
        elif binding.change_controlled:
            rows = changes.first_rows(source, binding, epoch)  # tombstones, soft deletes, scd2 versions
        else:
            rows = source.filter(F.col(OP) != "d").drop(OP)
        view = f"materializer_new_{uuid.uuid4().hex}"
        rows.createOrReplaceTempView(view)
        try:
            self.apply_spark.sql(create_table_sql(sql_name(table), view, binding, rows.columns, replace=replace))
        finally:
            self.apply_spark.catalog.dropTempView(view)
        # The CTAS returns no metrics; its history entry has them (one command, no Spark job).
        found = self.apply_spark.sql(f"DESCRIBE HISTORY {sql_name(table)} LIMIT 1").select("operationMetrics").collect()
        written = (found[0]["operationMetrics"] or {}).get("numOutputRows") if found else None
        return {"appended": 1, "created": 1, **({"num_inserted_rows": int(written)} if written is not None else {})}


def merge_sql(
    target: str, source_view: str, key: list[str], columns: list[str], evolve: str = "", target_filter: str = ""
) -> str:
    """The standard-mode MERGE: delete on a delete flag, else update the whole row or insert it.

    ``target_filter``: `` AND …`` predicates on the target alone (the epoch's key bounds,
    :func:`materializer.bounds.bounds_condition`) that Delta uses to skip files."""

    q = quote

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


def align(df: "DataFrame", schema: Any, *, keep_extra: bool) -> "DataFrame":
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
                columns.append(column.cast(sqltypes.plain(field.dataType)).alias(field.name))
        else:
            columns.append(F.lit(None).cast(sqltypes.plain(field.dataType)).alias(field.name))
    known = {f.name for f in schema.fields}
    if keep_extra:
        columns += [F.col(quote(c)) for c in df.columns if c not in known]
    return df.select(*columns)
