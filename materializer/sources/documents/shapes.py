"""An epoch's merged shape judged in plain Python: names and kinds no table can take, the fit to a
declared ``source.schema``, the Spark type ``spark.read.json`` would infer, and the first conflict
between two documents' shapes (shapes as ``schema_of_variant`` writes them, parsed by
:mod:`materializer.sources.documents.variant_shape`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.columns import RESERVED
from materializer.sources.documents.variant_shape import Shape

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

DELTA_INVALID = set(" ,;{}()\n\t=`")
"""Characters Delta refuses in column names (without column mapping), and the backtick."""

_NUMBERS = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT")


def _kind(shape: Shape) -> str:
    if isinstance(shape, tuple):
        return {"object": "an object", "array": "an array", "decimal": "a number"}[shape[0]]
    if shape in _NUMBERS:
        return "a number"
    return {"STRING": "a string", "BOOLEAN": "a boolean", "VOID": "null"}.get(shape, shape.lower())


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def shape_problems(shape: Shape, path: str = "") -> list[str]:
    """What in one (merged or single-document) shape no table can take: names Delta refuses, two
    names differing only in case, values of several kinds (``VARIANT``)."""
    if shape == "VARIANT":
        return [f"field {path or '(document)'!r} holds values of different JSON kinds (say a number and a string)"]
    if not isinstance(shape, tuple) or shape[0] == "decimal":
        return []
    if shape[0] == "array":
        return shape_problems(shape[1], f"{path}[]")
    problems = []
    seen: dict[str, str] = {}
    for name, inner in shape[1]:
        where = join_path(path, name)
        if not path and name == "_meta":
            continue
        if name == "":
            problems.append(f"a field of {path or 'the document'!r} has an empty name, which no table column can have")
        elif set(name) & DELTA_INVALID:
            problems.append(
                f"field {where!r} has a name Delta refuses (it holds one of space , ; {{ }} ( ) = ` tab newline)"
            )
        if name.lower() in seen:
            problems.append(
                f"fields {join_path(path, seen[name.lower()])!r} and {where!r} differ only in case, and Spark and Delta "
                "match column names without case"
            )
        seen[name.lower()] = name
        problems += shape_problems(inner, where)
    return problems


def against_declared(shape: Shape, declared: Any) -> list[str]:
    """What does not fit the declared schema (``source.schema``) in a document's or an epoch's
    ``shape``, and what no table can take (a STRING column takes values of any kind, so mixed
    kinds are the declaration's to judge)."""
    return declared_problems(shape, declared) + [p for p in shape_problems(shape) if "different JSON kinds" not in p]


def declared_problems(shape: Shape, dtype: Any, path: str = "") -> list[str]:
    """How a shape does not fit a declared Spark type (``source.schema``)."""
    from pyspark.sql import types as T

    if shape == "VOID" or isinstance(dtype, T.StringType):
        return []  # NULL fits anything; a STRING column takes any JSON (as its text)
    if shape == "VARIANT":
        return shape_problems(shape, path)
    if isinstance(dtype, T.StructType):
        if not (isinstance(shape, tuple) and shape[0] == "object"):
            return [_wrong_kind(shape, "an object", path)]
        declared = {f.name: f.dataType for f in dtype.fields}
        problems = []
        for name, inner in shape[1]:
            if not path and name == "_meta":
                continue
            if name not in declared:
                problems.append(
                    f"field {join_path(path, name)!r} is not in the binding's source.schema; declare it there (the table "
                    "gains the column) or remove it from the document"
                )
            else:
                problems += declared_problems(inner, declared[name], join_path(path, name))
        return problems
    if isinstance(dtype, T.ArrayType):
        if not (isinstance(shape, tuple) and shape[0] == "array"):
            return [_wrong_kind(shape, "an array", path)]
        return declared_problems(shape[1], dtype.elementType, f"{path}[]")
    if isinstance(dtype, T.MapType):
        if not (isinstance(shape, tuple) and shape[0] == "object"):
            return [_wrong_kind(shape, "an object", path)]
        return [p for _name, inner in shape[1] for p in declared_problems(inner, dtype.valueType, f"{path}[]")]
    if isinstance(dtype, T.BooleanType):
        wanted, ok = "a boolean", shape == "BOOLEAN"
    elif isinstance(dtype, T.IntegralType):
        wanted, ok = "a whole number", shape in _NUMBERS[:4] or (isinstance(shape, tuple) and shape[0] == "decimal" and shape[2] == 0)
    elif isinstance(dtype, T.NumericType):
        wanted, ok = "a number", shape in _NUMBERS or (isinstance(shape, tuple) and shape[0] == "decimal")
    elif isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        wanted, ok = "a string or a number", shape in ("STRING",) + _NUMBERS[:4]
    elif isinstance(dtype, T.BinaryType):
        wanted, ok = "a string", shape == "STRING"
    else:
        return []
    return [] if ok else [_wrong_kind(shape, wanted, path)]


def _wrong_kind(shape: Shape, wanted: str, path: str) -> str:
    return (
        f"field {path!r} is {_kind(shape)} but source.schema declares {wanted}; fix the document, or change "
        "source.schema (and the table's column type)"
    )


def inferred_type(shape: Shape, top: bool = True) -> "DataType":
    """The Spark type of a merged shape, as ``spark.read.json`` inferred it."""
    from pyspark.sql import types as T

    if isinstance(shape, tuple):
        if shape[0] == "decimal":
            return T.DecimalType(shape[1], 0) if shape[2] == 0 else T.DoubleType()
        if shape[0] == "array":
            return T.ArrayType(inferred_type(shape[1], top=False), True)
        fields = []
        for name, inner in shape[1]:
            if top and (name == "_meta" or name in RESERVED):
                continue
            if top and inner == "VOID":
                # A NULL carries no type: a field NULL in every document of the epoch is left out,
                # so it lands as NULL (as a missing field does) whatever type the table gives it.
                continue
            fields.append(T.StructField(name, inferred_type(inner, top=False), True))  # type: ignore[arg-type]
        return T.StructType(fields)
    if shape == "VOID":
        # Deeper down a NULL-only sub-field stays in its struct (an object with a NULL field is not
        # a NULL object), typed VOID: a NULL carries no type, so it fits whatever the table holds
        # there (staging writes it as a string column of NULLs; the MERGE casts it to the table's).
        return T.NullType()
    return {
        "BIGINT": T.LongType(), "INT": T.LongType(), "SMALLINT": T.LongType(), "TINYINT": T.LongType(),
        "DOUBLE": T.DoubleType(), "FLOAT": T.DoubleType(), "BOOLEAN": T.BooleanType(), "STRING": T.StringType(),
        "DATE": T.StringType(), "TIMESTAMP": T.StringType(), "BINARY": T.StringType(),
    }.get(shape, T.StringType())


def conflict(before: Shape, shape: Shape, path: str) -> str | None:
    """Where ``shape`` holds another kind of value than the epoch's earlier documents did."""
    if before is None or before == "VOID" or shape == "VOID" or before == "VARIANT":
        return None
    if isinstance(before, tuple) and isinstance(shape, tuple) and before[0] == shape[0] and before[0] in ("object", "array"):
        if before[0] == "array":
            return conflict(before[1], shape[1], f"{path}[]")
        earlier = dict(before[1])
        for name, inner in shape[1]:
            found = conflict(earlier.get(name), inner, join_path(path, name))
            if found:
                return found
        return None
    if merge_shapes(before, shape) != "VARIANT":
        return None
    return (
        f"field {path!r} is {_kind(shape)} here but {_kind(before)} in earlier documents of this transaction; a field "
        "must hold one kind of JSON value (a table column has one type): fix the document, or declare the field "
        "STRING in source.schema to keep any JSON as text"
    )


def merge_shapes(a: Shape, b: Shape) -> Shape:
    """Two shapes as schema_of_variant_agg merges them (enough to find the first conflict)."""
    if a == b or b == "VOID":
        return a
    if a == "VOID":
        return b
    numeric = lambda s: s in _NUMBERS or (isinstance(s, tuple) and s[0] == "decimal")  # noqa: E731
    if numeric(a) and numeric(b):
        return "DOUBLE"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "array":
        return ("array", merge_shapes(a[1], b[1]))
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "object":
        fields = dict(a[1])
        for name, inner in b[1]:
            fields[name] = merge_shapes(fields[name], inner) if name in fields else inner
        return ("object", sorted(fields.items()))
    return "VARIANT"

