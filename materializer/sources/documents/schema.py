"""A binding's ``source.schema``: parsed from DDL and checked at startup, and (on the error path
only) one refused document worded against it in plain Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.columns import RESERVED
from materializer.errors import ConfigError
from materializer.sources.documents.shapes import shape_problems
from materializer.sources.documents.variant_shape import Shape
from materializer.sources.json_text import MAX_DEPTH

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

Kinds = Any
"""Per Spark type, what a JSON value must be: None (anything: a STRING column takes any JSON), a
tuple of Python types, or ("struct", {field: kinds}) / ("array", kinds) / ("map", kinds). Used on
the error path only, to word what is wrong with one refused line."""

ANY = None
_NUMBER = (int, float)  # bool is not among them: type(True) is bool, and exact types are compared


def parse_schema(spark: "SparkSession", ddl: str, binding: Any) -> "StructType":
    depth = ddl_depth(ddl)
    if depth > MAX_DEPTH:
        # Before Spark's parser (which recurses per level) and every walk of the type after it.
        raise ConfigError(
            f"binding {binding.name!r}: source.schema nests {depth} levels deep (the document, then each STRUCT, "
            f"ARRAY or MAP inside); at most {MAX_DEPTH} levels are supported, as documents deeper are refused. "
            "Declare the deep part as a STRING (it keeps any JSON as its text)."
        )
    try:
        schema = spark.createDataFrame([], ddl).schema
    except Exception as exc:  # noqa: BLE001 - Spark's parse error, shortened
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"binding {binding.name!r}: source.schema {ddl!r} is not Spark DDL ({first}). Write it as "
            "'id BIGINT, name STRING, tags ARRAY<STRING>, address STRUCT<city: STRING>'."
        ) from None
    names = [f.name for f in schema.fields]
    for key in binding.key:
        if key not in names:
            raise ConfigError(f"binding {binding.name!r}: key field {key!r} is not in source.schema; declare it")
    for name in names:
        if name in RESERVED or name == "_meta":
            raise ConfigError(f"binding {binding.name!r}: source.schema declares {name!r}, which the materializer reserves")
    for problem in shape_problems(_shape_of(schema)):
        raise ConfigError(f"binding {binding.name!r}: source.schema: {problem}")
    return schema


def ddl_depth(ddl: str) -> int:
    """How deep a document of the DDL's type nests (as :func:`materializer.sources.json_text.nesting_depth`
    counts a document's): 1, and one more per ``<`` open at once, outside quoted names and strings.
    No recursion: any text is measured."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for char in ddl:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\" and quote != "`":
                escaped = True
            elif char == quote:
                quote = ""  # a doubled backtick closes and opens again: the same
        elif char in "`'\"":
            quote = char
        elif char == "<":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ">":
            depth -= 1
    return 1 + deepest


def _shape_of(dtype: Any) -> Shape:
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return ("object", [(f.name, _shape_of(f.dataType)) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return ("array", _shape_of(dtype.elementType))
    return "STRING"


def kinds_of(dtype: Any) -> Kinds:
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return ("struct", {f.name: kinds_of(f.dataType) for f in dtype.fields})
    if isinstance(dtype, T.ArrayType):
        return ("array", kinds_of(dtype.elementType))
    if isinstance(dtype, T.MapType):
        return ("map", kinds_of(dtype.valueType))
    if isinstance(dtype, T.BooleanType):
        return (bool,)
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return (int,)
    if isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return _NUMBER
    if isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        return (str, int)
    if isinstance(dtype, T.BinaryType):
        return (str,)
    return ANY


_JSON_KIND = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def misfit(value: Any, kinds: Kinds, path: str) -> str | None:
    """Why ``value`` does not fit ``kinds`` (None: it fits). ``path`` names the field."""
    if kinds is ANY or value is None:
        return None
    if type(kinds) is tuple and type(kinds[0]) is str:  # noqa: E721 - a nested kind
        shape, inner = kinds
        if shape == "struct":
            if type(value) is not dict:  # noqa: E721
                return _wrong(value, "an object", path)
            for name, item in value.items():
                if name == "_meta" and not path:
                    continue
                if name not in inner:
                    where = f"{path}.{name}" if path else name
                    return (
                        f"field {where!r} is not in the binding's source.schema; declare it there (the table "
                        "gains the column) or remove it from the document"
                    )
                problem = misfit(item, inner[name], f"{path}.{name}" if path else name)
                if problem is not None:
                    return problem
            return None
        if type(value) is not (list if shape == "array" else dict):
            return _wrong(value, "an array" if shape == "array" else "an object", path)
        items = value if shape == "array" else value.values()
        for item in items:
            problem = misfit(item, inner, f"{path}[]")
            if problem is not None:
                return problem
        return None
    if type(value) not in kinds:
        if kinds == (int,) and type(value) is float:  # noqa: E721
            return _wrong(value, "a whole number", path, found="a number with a fraction")
        wanted = " or ".join(sorted({_JSON_KIND.get(t, t.__name__) for t in kinds}))
        return _wrong(value, wanted, path)
    return None


def _wrong(value: Any, wanted: str, path: str, found: str | None = None) -> str:
    found = found or _JSON_KIND.get(type(value), type(value).__name__)
    return (
        f"field {path!r} is {found} but source.schema declares {wanted}; fix the document, or change "
        "source.schema (and the table's column type)"
    )
