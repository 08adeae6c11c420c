"""The per-document checks of JSON documents as one Spark column: valid JSON and one value, an
object, key fields present and scalar, no reserved field, a well-formed ``_meta``, no number Spark
cannot hold as written (too long, or beyond its type), the binding's sequence fields, and values a
declared type's cast refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from materializer import sqltypes
from materializer.columns import OP, SEQ
from materializer.sources.documents.shapes import join_path
from materializer.sources.documents.types import cast_type
from materializer.sources.json_text import deep_column, depth_problem

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import StructType

EXACT_DIGITS = 38
"""Longest run of digits a number may have: Spark's decimals hold 38; longer ones became doubles."""


NUMBER_SUSPECT = r"[0-9](?:[0-9]{38}|[eE]\+?0*[1-9][0-9])"
"""A number Spark may not hold as written: 39 digits in a row, or an exponent of 10 or more (a
FLOAT holds up to about 3.4e38; 39 digits are needed to pass it without one). The cheap test
before the exact ones."""

BOM = "\ufeff"
"""The byte order mark, as a line's first character (after UTF-8 decoding)."""


def problem_column(
    keys: list[str], hidden: "tuple[str, ...]", sequence_by: list[str], declared: "StructType | None", lean: bool
) -> "Column":
    """Per document, what is wrong with it (NULL: nothing a row alone shows), as one column over
    ``__v``, ``value`` and ``__parts`` (:meth:`DocumentReader.problem` says what ``lean`` leaves out)."""
    from pyspark.sql import functions as F

    v = F.col("__v")
    value = F.col("value")
    parts = F.col("__parts")

    def kind(x: "Column") -> "Column":
        return F.schema_of_variant(x)

    rules: list[tuple[Column, Column | str]] = [
        (
            # Spark reads a line's bytes as they are and its parser turns bytes that are not
            # UTF-8 into U+FFFD: the document would land with its text changed, without a word.
            ~F.is_valid_utf8(value),
            "the line is not valid UTF-8 (JSON text must be UTF-8); Spark would read its bad bytes as U+FFFD and "
            "change the text: re-encode the file (or the record) as UTF-8",
        ),
        (
            # What some Windows editors write at the start of a UTF-8 file: no JSON parser reads a
            # line that starts with it, and "not valid JSON" would point at a line that looks fine.
            v.isNull() & value.startswith(BOM),
            "the line starts with a byte order mark (U+FEFF, which some editors write at the start of a file); "
            "JSON Lines does not allow one: save the file as UTF-8 without a BOM",
        ),
        (
            # Never parsed (json_text.MAX_DEPTH): named before the rules below parse the text.
            v.isNull() & deep_column(value),
            depth_problem(value),
        ),
        (
            # Valid JSON to Spark's parser, which stops after the first value (json_text).
            v.isNull() & F.try_parse_json(value).isNotNull(),
            "more than one JSON value, or text after the document's value: a document must be one JSON object "
            "(JSON Lines: one per line); the rest would be lost",
        ),
        (
            v.isNull(),
            # Spark's parser refuses an object holding one key twice (which value is meant?): named
            # here, since such a line looks like valid JSON to a reader.
            "not valid JSON, or beyond what Spark's JSON parser reads (a string over 20 MB or a document over "
            "16 MB, a number of about 1000 digits), or an object holds one key twice; "
            "Spark cannot read it, so it cannot land",
        ),
        # Valid JSON that no struct cast takes: an array or a scalar.
        (parts.isNull(), "a document must be a JSON object"),
    ]
    for key in keys:
        got = parts[key]
        rules.append((got.isNull() | F.is_variant_null(got), f"key field {key!r} is missing or null"))
        if not (lean and _key_kind_declared(declared, key)):
            rules.append((F.left(kind(got), F.lit(1)).isin("O", "A"), f"key field {key!r} must be a scalar"))  # OBJECT<…>, ARRAY<…>
    for name in (OP, SEQ, *hidden):
        rules.append((parts[name].isNotNull(), f"field {name!r} is reserved by the materializer"))
    if sequence_by:
        from materializer.changes import sequence_rules

        rules += sequence_rules(v, sequence_by)
    meta = parts["_meta"]
    rules.append((meta.isNotNull() & F.is_variant_null(meta), "'_meta' is null; it must be an object such as {\"_meta\": {\"op\": \"d\"}} or be left out"))
    rules.append((meta.isNotNull() & ~kind(meta).startswith("OBJECT"), "'_meta' must be an object such as {\"op\": \"d\"}"))
    op = F.try_variant_get(meta, "$.op", "variant")
    rules.append((op.isNotNull() & ~F.is_variant_null(op) & (kind(op) != F.lit("STRING")), "'_meta.op' must be a string (\"d\" deletes the key)"))
    if declared is not None and not lean:
        rules += _fits(parts, declared, "")
    # Numbers Spark cannot hold as written, after the declared fields' own checks (which name the
    # field). One cheap test for both (one regex: each costs about a microsecond per document),
    # then which it is:
    # - longer than 38 digits: parsed to a double, rounded, so two distinct keys could become one
    #   (whether the parsed value kept the run of digits);
    # - beyond a DOUBLE (1e309), or a declared FLOAT (1e39): no cast fails on it, it would land as
    #   Infinity (whether the typed document holds an Infinity its text does not: to_json writes it
    #   "Infinity", as it writes that string, escaped inside a STRING holding JSON).
    long_run = f"[0-9]{{{EXACT_DIGITS + 1},}}"
    typed = v if declared is None else v.try_cast(sqltypes.plain(cast_type(declared)))
    number = F.when(
        F.regexp_count(value, F.lit(long_run)) > F.regexp_count(F.to_json(v), F.lit(long_run)),
        F.lit(f"a number has more than {EXACT_DIGITS} digits, more than Spark can hold exactly; write it as a string"),
    ).when(
        F.regexp_count(F.to_json(typed), F.lit(r'\\?"-?Infinity\\?"')) > F.regexp_count(value, F.lit("Infinity")),
        F.lit(
            "a number is beyond what its type holds (a DOUBLE about 1.8e308, a FLOAT about 3.4e38) and would land as "
            "Infinity; write it as a string, or declare a wider type in source.schema"
        ),
    )
    rules.append((value.rlike(NUMBER_SUSPECT) & number.isNotNull(), number))
    expr = F.lit(None).cast("string")
    for condition, message in reversed(rules):
        expr = F.when(condition, F.lit(message) if isinstance(message, str) else message).otherwise(expr)
    return expr


def _fits(parts: "Column", dtype: "StructType", path: str, in_array: bool = False) -> list[tuple["Column", "Column | str"]]:
    """Values the declared type's cast would refuse (a timestamp's format, an INT's range, at any
    depth, in arrays too): checked per document here, so the staging cast cannot fail on them
    and each is refused (or dead-lettered) at its line. ``parts``: the object's fields as
    VARIANTs (at the top, ``__parts``)."""
    rules = []
    for f in dtype.fields:
        rules += _value_rules(parts[f.name], f.dataType, join_path(path, f.name), in_array)
    return rules


def _value_rules(got: "Column", dtype: Any, where: str, in_array: bool = False) -> list[tuple["Column", "Column | str"]]:
    """:func:`_fits`'s rules for one value (a VARIANT) of declared type ``dtype``; an array's are
    its elements' rules, true when some element breaks them, their message about the first.
    Inside an array only a value of a JSON kind its type takes is checked: another kind is the
    shape checks' to name ("field 'tags[]' is a string but source.schema declares a number")."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return _fits(got.try_cast(T.StructType([T.StructField(g.name, T.VariantType()) for g in dtype.fields])), dtype, where, in_array)
    if isinstance(dtype, T.ArrayType):
        elements = got.try_cast(T.ArrayType(T.VariantType()))
        inner = f"{where}[]"

        def rule(index: int, part: int) -> "Callable[[Column], Column]":
            # (One argument: Spark's higher-order functions read a second as the element's index.)
            def built(element: "Column") -> "Column":
                found = _value_rules(element, dtype.elementType, inner, True)[index][part]
                return F.lit(found) if isinstance(found, str) else found

            return built

        count = len(_value_rules(F.lit(None).cast(T.VariantType()), dtype.elementType, inner, True))
        return [
            (
                F.coalesce(F.exists(elements, rule(i, 0)), F.lit(False)),
                F.try_element_at(F.transform(F.filter(elements, rule(i, 0)), rule(i, 1)), F.lit(1)),
            )
            for i in range(count)
        ]
    if isinstance(dtype, (T.StringType, T.MapType, T.BooleanType)):
        return []
    message = F.concat(
        F.lit(f"a value does not fit source.schema: field {where!r} holds "),
        F.substring(F.to_json(got), 1, 200),
        F.lit(f", which is not a valid {dtype.simpleString().upper()} (its format or range); fix the document, or change source.schema"),
    )
    cast = got.try_cast(sqltypes.plain(dtype))

    def checked(broken: "Column") -> "Column":
        return broken & _kind_taken(got, dtype) if in_array else broken

    rules: list[tuple["Column", "Column | str"]] = []
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        # A finite number past the type's range: no cast fails on it, it becomes Infinity.
        name = dtype.simpleString().upper()
        rules.append(
            (
                checked(F.abs(cast) == F.lit(float("inf"))),
                f"a value does not fit source.schema: field {where!r} holds a number beyond the range of {name} "
                "(it would land as Infinity); write it as a string, or declare a wider type in source.schema",
            )
        )
    rules.append((checked(got.isNotNull() & ~F.is_variant_null(got) & cast.isNull()), message))
    return rules


def _kind_taken(got: "Column", dtype: Any) -> "Column":
    """Whether a VARIANT's JSON kind is one ``dtype`` takes (document_shapes.declared_problems)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    kind = F.schema_of_variant(got)
    whole = kind.isin("BIGINT", "INT", "SMALLINT", "TINYINT")
    if isinstance(dtype, T.IntegralType):
        return whole | kind.rlike(r"^DECIMAL\([0-9]+,0\)$")
    if isinstance(dtype, T.NumericType):
        return whole | kind.isin("DOUBLE", "FLOAT") | kind.startswith("DECIMAL")
    if isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        return whole | (kind == "STRING")
    if isinstance(dtype, T.BinaryType):
        return kind == "STRING"
    return F.lit(True)


def _key_kind_declared(declared: "StructType | None", key: str) -> bool:
    """Whether the declared schema gives ``key`` a type that refuses an object or an array
    (any but STRING, which takes any JSON as its text)."""
    from pyspark.sql import types as T

    if declared is None or key not in declared.names:
        return False
    return not isinstance(declared[key].dataType, (T.StringType, T.StructType, T.ArrayType, T.MapType, T.VariantType))
