"""The epoch's rows against their table before StartCommit (DESIGN invariant 9: an epoch in the log
must always be appliable): the table's facts, kept while its metadata stands; names and types the
MERGE would refuse; NOT NULL, CHECK constraints and narrower types evaluated on the staged rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from materializer.columns import OP
from materializer.config import BindingConfig
from materializer.delta import TableRef, metadata_fingerprint, quote, schema_and_properties
from materializer.errors import SourceError
from materializer.layout import layout_problems
from materializer.merge import align
from materializer.protocol import StagedFile
from materializer.storage import Store as FileStore
from materializer.widening import widened_schema, widening_enabled

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REFUSED_NAME_CHARACTERS = " ,;{}()\n\t="
"""Characters Delta refuses in column names unless the table uses column mapping."""


class TableFit:
    """Whether an epoch's rows can be written to their tables, checked on the runtime's session."""

    def __init__(self, spark: "SparkSession", staging: FileStore) -> None:
        self.spark = spark
        self.staging = staging
        """The staging store, where :meth:`check_rows` reads the staged rows."""
        self._facts: dict[str, tuple[str, TableFacts]] = {}
        """binding -> its table's facts and the metadata fingerprint they were read at (:meth:`facts`)."""

    def facts(self, binding: BindingConfig) -> "TableFacts | None":
        """The target's schema, constraints and column mapping as they stand now (None: no table).

        Kept from one epoch to the next while the table's Delta metadata and protocol are the ones
        they were read from (:func:`materializer.delta.metadata_fingerprint`): an epoch's MERGE
        that adds no column leaves them, while any commit that changes them (another writer's
        ALTER or constraint, a schema evolution, a replaced table) makes the check read them
        again, so each epoch is still checked against the table as it is. The fingerprint comes
        from delta-rs (milliseconds) where its answer is trusted; elsewhere (a catalog table,
        Spark Connect) the facts are read again each epoch."""
        table = TableRef(binding.table)
        fingerprint = metadata_fingerprint(self.spark, table)  # before the facts: a change in between only re-reads
        cached = self._facts.get(binding.name)
        if fingerprint is not None and cached is not None and cached[0] == fingerprint:
            return cached[1]
        # Not DESCRIBE DETAIL: its file statistics cost 3 Spark jobs per epoch after each MERGE;
        # the schema and properties come from the snapshot's metadata without a job.
        found = schema_and_properties(self.spark, table)
        if found is None:
            self._facts.pop(binding.name, None)
            return None
        schema, properties = found
        facts = TableFacts(
            schema=schema,
            constraints={k[len(CONSTRAINT_PREFIX) :]: v for k, v in properties.items() if k.startswith(CONSTRAINT_PREFIX)},
            column_mapping=properties.get("delta.columnMapping.mode", "none") not in ("none", ""),
            type_widening=widening_enabled(properties),
        )
        if fingerprint is not None:
            self._facts[binding.name] = (fingerprint, facts)
        return facts

    def check_schema(self, binding: BindingConfig, df: "DataFrame", facts: "TableFacts | None") -> None:
        """Refuse, before the epoch is committed, what the MERGE would refuse by the schema alone.

        Invariant 9: an epoch in the log must always be appliable. Names Delta refuses, two names
        that differ only in case (Delta's columns are case-insensitive), and any type the table
        cannot hold losslessly, at any depth (a struct sub-field, an array element, a map value).
        """
        from pyspark.sql.types import StructType

        schema = df.schema
        column_mapping = facts.column_mapping if facts is not None else _default_column_mapping(self.spark)
        problems = _name_problems(schema, "", refuse_characters=not column_mapping)
        if facts is not None:
            data = [f for f in schema.fields if f.name != OP or binding.mode == "delta_updates"]
            if facts.type_widening:
                # Columns the table widens (docs: 'Type widening') are no problem.
                _wider, widening = widened_schema(StructType(data), facts.schema)
                data = [f for f in data if f.name not in widening]
            problems += _type_problems(data, facts.schema.fields, "")
        else:
            problems += layout_problems(binding, schema)  # the first epoch creates the table
        if problems:
            raise SourceError(
                f"binding {binding.name}: the epoch's rows cannot be written to table {binding.table}: "
                + "; ".join(problems[:5])
                + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
                + ". Delta would refuse them, so nothing of this transaction was committed or applied. Fix the "
                "documents (or the table, after the pipeline is drained), then run again."
            )

    def check_rows(self, binding: BindingConfig, staged: StagedFile, schema: Any, facts: "TableFacts") -> None:
        """Evaluate on the staged rows what Delta checks row by row: NOT NULL, CHECK constraints,
        and values a narrower column type cannot hold. Runs only for tables that have any."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import DecimalType, IntegralType

        present = {f.name: f.dataType for f in schema.fields}
        if facts.type_widening:
            # A column the table widens holds every value: nothing to narrow there.
            for name in widened_schema(schema, facts.schema)[1]:
                present.pop(name)
        narrowable = [
            f.name for f in facts.schema.fields
            if f.name in present and present[f.name] != f.dataType
            and isinstance(f.dataType, (IntegralType, DecimalType)) and isinstance(present[f.name], (IntegralType, DecimalType))
        ]
        if not narrowable and not facts.constraints and all(f.nullable for f in facts.schema.fields):
            return  # nothing Delta checks row by row: no Spark job
        rows = self.spark.read.parquet(self.staging.spark_path(staged.uri))
        if binding.mode == "standard":
            rows = rows.filter(F.col(OP) != "d")  # deletes write no row
        narrowing = []
        for field in facts.schema.fields:
            source = present.get(field.name)
            if source is None or source == field.dataType:
                continue
            if isinstance(field.dataType, (IntegralType, DecimalType)) and isinstance(source, (IntegralType, DecimalType)):
                column = F.col(quote(field.name))
                narrowing.append((f"field {field.name!r} ({source.simpleString()}) holds a value that does not fit "
                                  f"the column's {field.dataType.simpleString()}",
                                  column.isNotNull() & column.try_cast(field.dataType).isNull()))
        checks = narrowing
        if not narrowing or not self._violation(binding, rows, narrowing):
            aligned = align(rows, facts.schema, keep_extra=True)
            checks = [
                (f"NOT NULL column {f.name!r} would be NULL", F.col(quote(f.name)).isNull())
                for f in facts.schema.fields
                if not f.nullable
            ]
            checks += [
                (f"CHECK constraint {name} ({expr}) is not met", ~F.coalesce(F.expr(expr), F.lit(False)))
                for name, expr in facts.constraints.items()
            ]
            if checks:
                self._violation(binding, aligned, checks)

    def _violation(self, binding: BindingConfig, rows: "DataFrame", checks: list[tuple[str, "Any"]]) -> bool:
        from functools import reduce as fold

        from pyspark.sql import functions as F

        if not checks:
            return False
        flags = [F.when(check, F.lit(i)) for i, (_what, check) in enumerate(checks)]
        first = F.coalesce(*flags) if len(flags) > 1 else flags[0]
        # One row at most, only to name a key in the message: nothing else comes to the driver.
        found = (
            rows.select(*[F.col(quote(k)) for k in binding.key], first.alias("__check"))
            .where(fold(lambda a, b: a | b, [c for _w, c in checks]))
            .limit(1)
            .collect()
        )
        if not found:
            return False
        row = found[0]
        key = ", ".join(f"{k}={row[k]!r}" for k in binding.key)
        raise SourceError(
            f"binding {binding.name}: a row of this epoch (key {key}) cannot be written to table {binding.table}: "
            f"{checks[row['__check']][0]}. Delta would refuse the epoch, so nothing of this transaction was committed "
            "or applied. Fix the documents, or the table's constraint or column type, then run again."
        )


CONSTRAINT_PREFIX = "delta.constraints."


@dataclass(frozen=True)
class TableFacts:
    schema: Any
    """The table's schema (a StructType)."""
    constraints: dict[str, str]
    """CHECK constraints by name: their SQL expressions (``delta.constraints.*`` properties)."""
    column_mapping: bool
    """Column mapping is on: any character is allowed in names."""
    type_widening: bool = False
    """``delta.enableTypeWidening``: a wider type of the same family widens the column."""


def _default_column_mapping(spark: "SparkSession") -> bool:
    """Would a table created now use column mapping (the session's default table properties)?"""
    mode = spark.conf.get("spark.databricks.delta.properties.defaults.columnMapping.mode", "none")
    return (mode or "none").lower() not in ("none", "")


def _name_problems(data_type: Any, path: str, *, refuse_characters: bool) -> list[str]:
    """Field names Delta refuses, at any depth: refused characters, empty, and case-only twins."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, ArrayType):
        return _name_problems(data_type.elementType, path + "[]", refuse_characters=refuse_characters)
    if isinstance(data_type, MapType):
        return _name_problems(data_type.valueType, path + "{}", refuse_characters=refuse_characters)
    if not isinstance(data_type, StructType):
        return []
    problems = []
    seen: dict[str, str] = {}
    for field in data_type.fields:
        where = f"{path}.{field.name}" if path else field.name
        if field.name == "":
            problems.append(f"a field {'in ' + repr(path) + ' ' if path else ''}has an empty name, which Delta refuses")
        elif refuse_characters and any(c in REFUSED_NAME_CHARACTERS for c in field.name):
            problems.append(
                f"field {where!r} has a character Delta refuses in column names (one of ' ,;{{}}()\\n\\t='; "
                "allowed only on a table with column mapping, delta.columnMapping.mode = name)"
            )
        twin = seen.get(field.name.lower())
        if twin is not None:
            problems.append(f"fields {twin!r} and {where!r} differ only in case, which Delta does not tell apart")
        seen[field.name.lower()] = where
        problems += _name_problems(field.dataType, where, refuse_characters=refuse_characters)
    return problems


def _type_problems(source: list[Any], target: list[Any], path: str, nested: bool = False) -> list[str]:
    """Why fields ``source`` cannot be written into the table's fields ``target`` losslessly."""
    problems = []
    by_name = {f.name: f for f in target}
    by_lower = {f.name.lower(): f for f in target}
    for field in source:
        where = f"{path}.{field.name}" if path else field.name
        wanted = by_name.get(field.name)
        if wanted is None:
            twin = by_lower.get(field.name.lower())
            if twin is not None:
                problems.append(
                    f"field {where!r} differs from the table's {twin.name!r} only in case; Delta's column names are "
                    "case-insensitive, so it would be neither a new column nor the same one"
                )
            continue  # a new column or sub-field: schema evolution adds it
        problem = _type_problem(field.dataType, wanted.dataType, where, nested)
        if problem:
            problems.append(problem)
    return problems


_WIDER = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}


def _type_problem(source: Any, target: Any, where: str, nested: bool = False) -> str | None:
    """None if a value of type ``source`` fits a column of type ``target`` (nullability aside).

    ``nested``: inside a struct, array or map, where neither the staged rows' value checks
    (:meth:`TableFit.check_rows`, top-level columns) nor type widening reach: a number type
    wider than the table's there is refused by its type."""
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegralType,
        MapType,
        NullType,
        StructType,
    )

    if isinstance(source, NullType) or source == target:
        return None
    if isinstance(source, StructType) and isinstance(target, StructType):
        problems = _type_problems(list(source.fields), list(target.fields), where, nested=True)
        return "; ".join(problems) or None
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        element = source.elementType
        if isinstance(element, IntegralType) and isinstance(target.elementType, (IntegralType, DecimalType)) and element != target.elementType:
            if not (isinstance(target.elementType, IntegralType) and _WIDER[element.simpleString()] <= _WIDER[target.elementType.simpleString()]):
                return (
                    f"field {where!r} holds array<{element.simpleString()}> but the table's column is "
                    f"{target.simpleString()}, which may not hold every value"
                )
        return _type_problem(element, target.elementType, where + "[]", nested=True)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return _type_problem(source.keyType, target.keyType, where + "{key}", nested=True) or _type_problem(
            source.valueType, target.valueType, where + "{}", nested=True
        )
    if nested and _wider_number(source, target):
        return (
            f"field {where!r} arrives as {source.simpleString()} but the table holds {target.simpleString()} there: "
            "a wider number type inside a struct, array or map is neither widened (type widening here covers "
            "top-level columns) nor checked value by value. Declare the field as "
            f"{target.simpleString()} in source.schema, or widen the table's field yourself after the pipeline is "
            f"drained (ALTER TABLE … ALTER COLUMN {where.replace('[]', '.element').replace('{}', '.value')} TYPE "
            f"{source.simpleString()}, on a table with delta.enableTypeWidening)"
        )
    if isinstance(source, IntegralType) and isinstance(target, (IntegralType, DecimalType, FloatType, DoubleType)):
        return None  # narrowing is checked on the staged rows (check_rows)
    if isinstance(source, DecimalType) and isinstance(target, DecimalType) and target.scale >= source.scale:
        return None  # likewise: each value must fit (fewer decimal places would round silently)
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return None
    return (
        f"field {where!r} arrives as {source.simpleString()} but the table holds {target.simpleString()} there "
        "(no silent conversion: it would lose or change data)"
    )


def _wider_number(source: Any, target: Any) -> bool:
    """``source`` is a number type some of whose values a ``target`` column cannot hold."""
    from pyspark.sql.types import DecimalType, IntegralType

    if isinstance(source, IntegralType) and isinstance(target, IntegralType):
        return _WIDER[source.simpleString()] > _WIDER[target.simpleString()]
    if isinstance(source, IntegralType) and isinstance(target, DecimalType):
        return target.precision - target.scale < {1: 3, 2: 5, 3: 10, 4: 19}[_WIDER[source.simpleString()]]
    if isinstance(source, DecimalType) and isinstance(target, DecimalType):
        return target.scale < source.scale or target.precision - target.scale < source.precision - source.scale
    return False

