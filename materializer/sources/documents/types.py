"""A document's VARIANT typed to the epoch's schema: the cast, computed from the value's JSON text
where that is the same value for less, and fields NULL in the whole epoch kept VOID."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer import sqltypes
from materializer.sqltypes import quote

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import StructType


def by_text(dtype: Any) -> bool:
    """Whether a top-level field of ``dtype`` is typed from its value's JSON text (:func:`typed`)."""
    from pyspark.sql import types as T

    return isinstance(dtype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.DoubleType, T.BooleanType))


def cast_type(schema: "StructType") -> "StructType":
    """What the document's VARIANT is cast to: ``schema`` (VOID as STRING, :func:`_void_as`), with
    the fields :func:`typed` types from their text left VARIANT."""
    from pyspark.sql import types as T

    return T.StructType(
        [T.StructField(f.name, T.VariantType() if by_text(f.dataType) else _void_as(f.dataType), f.nullable) for f in schema.fields]
    )


def typed(field: "Column", dtype: Any) -> "Column":
    """A top-level field of the document cast to ``dtype``: the VARIANT cast's value, computed
    faster where it can be.

    Spark's VARIANT cast builds and evaluates a ``Cast`` expression per value (0.72-0.77 s of JVM
    CPU per 300k five-field documents, more than the parse). For a whole number, a DOUBLE or a
    BOOLEAN, the value's JSON text (``to_json``: the digits of a whole number, the exact decimal or
    the round-tripping double of any other number, ``true``/``false``) cast as a string is the same
    value for less (parse and cast alone: 2.13 -> 1.69 s per 300k; docs, Performance). Where that
    text does not cast (a string, a fraction for an integer, a value out of range, an infinite
    double, which ``to_json`` quotes) the VARIANT cast runs as before, failing or converting
    exactly as it would have: ``coalesce`` evaluates it only then.
    ``tests/test_documents.py::test_typed_from_text_equals_the_variant_cast`` compares both on
    edge values."""
    from pyspark.sql import functions as F

    if not by_text(dtype):
        return field
    return F.coalesce(F.to_json(field).try_cast(sqltypes.plain(dtype)), field.cast(sqltypes.plain(dtype)))


def _void_as(dtype: Any) -> Any:
    """``dtype`` with VOID made STRING: a VARIANT cannot be cast to VOID (see :func:`with_void`)."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.NullType):
        return T.StringType()
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, _void_as(f.dataType), f.nullable) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(_void_as(dtype.elementType), dtype.containsNull)
    return dtype


def _holds_void(dtype: Any) -> bool:
    from pyspark.sql import types as T

    if isinstance(dtype, T.NullType):
        return True
    if isinstance(dtype, T.StructType):
        return any(_holds_void(f.dataType) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return _holds_void(dtype.elementType)
    return False


def with_void(column: "Column", dtype: Any) -> "Column":
    """``column`` (cast to ``_void_as(dtype)``) with its NULL-only sub-fields typed VOID again."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.NullType):
        return F.lit(None)
    if isinstance(dtype, T.StructType):
        for field in dtype.fields:
            if _holds_void(field.dataType):
                # withField keeps a NULL struct NULL and replaces only this sub-field; it parses
                # its name as a path (``a.b`` is b inside a), so the name goes in backticks.
                column = column.withField(quote(field.name), with_void(column[field.name], field.dataType))
        return column
    if isinstance(dtype, T.ArrayType) and _holds_void(dtype.elementType):
        return F.transform(column, lambda element: with_void(element, dtype.elementType))
    return column

