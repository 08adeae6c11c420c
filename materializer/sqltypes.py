"""Casts that leave plain types in the tables we write, on every client (DESIGN invariant 12).

A Spark Connect client sends a ``DataType`` object with its collation spelled out: a column cast
to ``StringType()`` over Connect (pyspark 4.2) has the type ``string collate UTF8_BINARY``, and a
table created or evolved from it records that type in its schema, with no collation feature in
its protocol. Spark reads such a table; delta-rs and every other kernel-based reader refuse it
("Unsupported Delta table type"). The same type as DDL text (``STRING``) is parsed by the server
into its plain type, which the classic path writes too. So every cast whose type holds a string
is given to ``Column.cast`` through :func:`plain`; and a column of ``mapInArrow``'s rows, whose
types the client declares as objects (even from DDL text, which the Connect client parses first),
is cast through :func:`plain` before it reaches a table.

It is also the floor of every SQL text we write: :func:`quote` and :func:`literal` (re-exported
by :mod:`materializer.delta`) are the only two ways a name or a text from config or from data
becomes part of one (issue #66).
"""

from __future__ import annotations

from typing import Any


def quote(name: str) -> str:
    """``name`` as a SQL identifier: in backticks, a backtick inside doubled (```a``b```)."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """``text`` as a Spark SQL string literal: in single quotes, a backslash and a quote escaped.

    Spark reads backslash escapes in string literals (``spark.sql.parser.escapedStringLiterals`` is
    off by default), so the backslash is escaped first and the quote after it; adjacent literals
    concatenate in Spark SQL, so a doubled quote (``''``) would not be one quote but two literals.
    """
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def ddl(dtype: Any) -> str:
    """``dtype`` as Spark SQL DDL text, struct field names quoted."""
    from pyspark.sql.types import ArrayType, DecimalType, MapType, StringType, StructType

    if isinstance(dtype, StructType):
        fields = ", ".join(quote(f.name) + ": " + ddl(f.dataType) for f in dtype.fields)
        return f"STRUCT<{fields}>"
    if isinstance(dtype, ArrayType):
        return f"ARRAY<{ddl(dtype.elementType)}>"
    if isinstance(dtype, MapType):
        return f"MAP<{ddl(dtype.keyType)}, {ddl(dtype.valueType)}>"
    if isinstance(dtype, StringType):
        collation = getattr(dtype, "collation", "UTF8_BINARY")
        return "STRING" if collation in (None, "UTF8_BINARY") else f"STRING COLLATE {collation}"
    if isinstance(dtype, DecimalType):
        return f"DECIMAL({dtype.precision},{dtype.scale})"
    return dtype.simpleString()


def holds_string(dtype: Any) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StringType, StructType

    if isinstance(dtype, StringType):
        return True
    if isinstance(dtype, StructType):
        return any(holds_string(f.dataType) for f in dtype.fields)
    if isinstance(dtype, ArrayType):
        return holds_string(dtype.elementType)
    if isinstance(dtype, MapType):
        return holds_string(dtype.keyType) or holds_string(dtype.valueType)
    return False


def plain(dtype: Any) -> Any:
    """What to pass to ``Column.cast``: a type that holds a string as DDL text (plain on Spark
    Connect), any other as it is."""
    if isinstance(dtype, str) or not holds_string(dtype):
        return dtype
    return ddl(dtype)
