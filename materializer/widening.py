"""Delta type widening: column type changes a table with ``delta.enableTypeWidening`` takes.

When the table enables it, an epoch whose column holds a wider type of the same family than the
table's column is written with that type, and the MERGE (with schema evolution) widens the
column: integers to a wider integer (tinyint → smallint → int → bigint), float → double, a
decimal to one with more integer digits or decimal places, date → timestamp_ntz. These are the
changes Delta applies automatically (its ``allowAutomaticWidening`` default, same-family types);
every other type change is still refused before commit. Top-level columns only: a wider type
inside a struct, array or map is checked as before (values must fit the narrower type).
"""

from __future__ import annotations

from typing import Any

TYPE_WIDENING = "delta.enableTypeWidening"
_INTEGERS = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}


def widening_enabled(properties: dict[str, Any]) -> bool:
    return str(properties.get(TYPE_WIDENING, "false")).lower() == "true"


def widened(source: Any, target: Any) -> Any | None:
    """The type column ``target`` widens to so it holds values of ``source``; None: no widening
    (the types are equal, ``source`` fits already, or Delta does not widen so)."""
    from pyspark.sql.types import DateType, DecimalType, DoubleType, FloatType, IntegralType, TimestampNTZType

    if isinstance(source, IntegralType) and isinstance(target, IntegralType):
        return source if _INTEGERS[source.simpleString()] > _INTEGERS[target.simpleString()] else None
    if isinstance(source, DoubleType) and isinstance(target, FloatType):
        return DoubleType()
    if isinstance(source, DecimalType) and isinstance(target, DecimalType):
        scale = max(source.scale, target.scale)
        digits = max(source.precision - source.scale, target.precision - target.scale)
        if digits + scale > 38:
            return None
        wider = DecimalType(digits + scale, scale)
        return wider if wider != target else None
    if isinstance(source, TimestampNTZType) and isinstance(target, DateType):
        return TimestampNTZType()
    return None


def widened_schema(source: Any, target: Any) -> tuple[Any, list[str]]:
    """``target`` (a StructType) with each top-level column ``source`` widens; and their names."""
    from pyspark.sql.types import StructField, StructType

    present = {f.name: f.dataType for f in source.fields}
    fields, changed = [], []
    for field in target.fields:
        wider = widened(present[field.name], field.dataType) if field.name in present else None
        if wider is not None:
            changed.append(field.name)
        fields.append(StructField(field.name, wider or field.dataType, field.nullable, field.metadata))
    return StructType(fields), changed
