"""Reductions: combine an epoch's documents per key, and reduce them into the loaded current row.

Each field of a binding has a strategy (``reductions: {n: sum, tags: append}``; fields not listed
are lastWriteWins). Per key, the documents of an epoch are folded in ``_seq`` order, starting from
the loaded current row (standard mode with reductions) or from nothing (a new key; delta-updates
mode, which combines within the epoch only). One step of the fold, for a field with current value
``a`` and the next document's value ``b``:

==============  ==========================================================================
lastWriteWins   ``b``: the row is the latest document, so a field it lacks becomes NULL
firstWriteWins  ``a`` if it is not NULL, else ``b``: the earliest non-NULL value is kept
sum             ``a + b``; NULL on either side leaves the other
min / max       the smaller / larger; NULL on either side leaves the other
merge           objects (Spark structs) merged field by field, recursively; a non-NULL
                leaf of ``b`` replaces ``a``'s, a NULL leaf keeps it
append          arrays concatenated, ``a`` then ``b``; NULL leaves the other
==============  ==========================================================================

So a document that lacks a field (or holds NULL in it) changes nothing for every strategy but
lastWriteWins. A delete resets the key: the documents after it start from nothing, and if the
epoch ends on a delete the row is deleted (standard) or a delete row is appended (delta-updates;
its lastWriteWins fields are the delete document's, its reduced fields NULL).

Because every step is associative, folding the loaded row with the epoch's documents gives the
same row as folding every document ever read, whatever the epoch boundaries: the oracle of the
tests is that plain sequential fold.

Everything runs in Spark: ``groupBy`` key, ``collect_list`` of the documents (plus the loaded row,
which sorts first), ``array_sort`` by ``_seq``, then ``aggregate`` with the per-field steps above.
Nothing is collected to the driver; only the schemas are looked at there.

Types come from Spark's JSON inference, epoch by epoch. Two of its habits matter here: a field that
holds only NULLs in an epoch is inferred as a string, and an object is a struct with exactly the
sub-fields the epoch's documents have. So each field is folded in the table's type unified with
the documents' (the table's schema comes with the loaded rows, or from the Delta log in
delta-updates mode): structs by sub-field name, the table's sub-fields first in the table's order
and new ones after (a struct ``cast`` would go by position); integers widen. A string where the
field cannot be one (a ``sum``/``merge``/``append`` field, or a table column of another type) is
taken as that all-NULL field: it folds as NULL, and a check stops the epoch with an error naming
the field if it holds a string after all.

A binding whose fields are all lastWriteWins takes the cheaper :func:`combine` path (one window
function, the last document per key) and needs no loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from materializer import sqltypes
from materializer.config import BindingConfig
from materializer.delta import quote
from materializer.errors import ConfigError, SourceError
from materializer.columns import OP, RESERVED, SEQ

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

LAST_WRITE_WINS = "lastWriteWins"
# Reductions whose JSON type cannot be a string: a string-typed column is JSON's all-NULL field.
_NOT_STRINGS = ("sum", "merge", "append")

_CONFORM_MESSAGE = "a string where an object or array was expected"
_ORIGIN = "__origin"  # 0: the loaded current row, 1: a document; the loaded row folds first
_ROW = "__row"
_DOCS = "__docs"
_STATE = "__state"


def strategy(binding: BindingConfig, field: str) -> str:
    return binding.reductions.get(field, LAST_WRITE_WINS)


def reduced_fields(binding: BindingConfig) -> dict[str, str]:
    """The fields whose strategy is not lastWriteWins; empty means no loads are needed."""
    return {f: s for f, s in binding.reductions.items() if s != LAST_WRITE_WINS}


def independent_of_table(binding: BindingConfig) -> bool:
    """The epoch's rows come from its documents alone (all lastWriteWins): no load, no table schema."""
    return not reduced_fields(binding)


def check_supported(binding: BindingConfig) -> None:
    """Every strategy of the configuration is built; reject only fields we cannot reduce."""
    for field in binding.reductions:
        if field in RESERVED or field == "_meta":
            raise ConfigError(
                f"binding {binding.name!r}: reductions: {field!r} is reserved by the materializer and cannot be reduced"
            )


def combine(documents: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """lastWriteWins only: one row per key, the epoch's last document for it (with its ``_op``)."""
    # Each key's greatest _seq over a window partitioned by the key (no ORDER BY), and the rows
    # that hold it: one shuffle and one sort by key. max_by(struct(...), _seq), a sort-based
    # aggregate here (its buffer holds a struct), sorted the epoch twice (its partial aggregate
    # before the shuffle, then the final one after): 2.36 against 2.74 JVM CPU s per 1M rows
    # (docs, Performance). _seq is unique per document, so exactly one row per key is kept.
    # Written as SQL text: a few calls to the JVM (the plan is built every epoch, and those calls
    # were most of the driver's fixed cost per epoch).
    columns = [c for c in documents.columns if c != SEQ]
    last = f"max({quote(SEQ)}) OVER (PARTITION BY {', '.join(quote(k) for k in binding.key)}) AS __last"
    latest = documents.selectExpr("*", last).where(f"{quote(SEQ)} = __last")
    return latest.selectExpr(*[quote(c) for c in columns])


def reduce(documents: "DataFrame", loaded: "DataFrame | None", binding: BindingConfig) -> "DataFrame":
    """The rows to store for the epoch: one per key, with ``_op``.

    ``loaded`` holds the current rows of the epoch's keys (standard mode with reductions, once
    the table exists); None folds from nothing, as delta-updates mode and a new table do.
    """
    check_supported(binding)
    if binding.change_controlled:
        from materializer import changes  # sequences, tombstones, column control, history

        return changes.combine(documents, binding)
    if not reduced_fields(binding):
        return combine(documents, binding)
    return _fold(documents, loaded, binding)


# --- the fold ----------------------------------------------------------------------------------


def _fold(documents: "DataFrame", loaded: "DataFrame | None", binding: BindingConfig) -> "DataFrame":
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    keys = binding.key
    reduced = reduced_fields(binding)
    seq_type = documents.schema[SEQ].dataType
    doc_types = {f.name: f.dataType for f in documents.schema.fields if f.name not in keys and f.name not in RESERVED}
    # The table's types type the fold (the loaded rows have the table's schema; delta-updates
    # mode loads nothing, so the schema is read from the Delta log).
    table = loaded.schema if loaded is not None else _table_schema(documents, binding)
    table_types = {} if table is None else {f.name: f.dataType for f in table.fields}
    # Only reduced fields are taken from the current row: a lastWriteWins field is always the
    # latest document's, so its loaded value could never survive the fold.
    loaded_types = {} if loaded is None else {n: t for n, t in table_types.items() if n in reduced}

    # A string where the field cannot be one (sum/merge/append, or a table column of another
    # type) is JSON's type for a field that was NULL throughout the epoch: it is folded as NULL,
    # typed as the table has it, and a check stops the epoch if it holds a string after all.
    doc_nulls = [n for n, t in doc_types.items() if _placeholder(strategy(binding, n), t, table_types.get(n))]
    loaded_nulls = [n for n, t in loaded_types.items() if _placeholder(strategy(binding, n), t, None)]
    targets: dict[str, DataType] = {}
    for name in list(doc_types) + [n for n in loaded_types if n not in doc_types]:
        doc_type = None if name in doc_nulls else doc_types.get(name)
        table_type = None if name in loaded_nulls else table_types.get(name)
        if strategy(binding, name) == LAST_WRITE_WINS:
            # The document's type, with structs aligned to the table's by name where they can be.
            both = None if doc_type is None or table_type is None else unify_types(table_type, doc_type)
            target = both or (doc_type if doc_type is not None else table_type)
        else:
            target = _target_type(binding, name, doc_type, table_type)
        if target is not None:  # None: no values anywhere, and no type to give the column
            targets[name] = target

    def value(name: str, types: dict[str, DataType], nulls: list[str], target: DataType) -> Column:
        if name not in types or name in nulls:
            return F.lit(None).cast(sqltypes.plain(target))
        return conform(F.col(quote(name)), types[name], target, _type_message(binding, name))

    def origin(rank: int, nulls: list[str]) -> Column:
        # The checks ride on the origin column: the sort compares it, so Spark cannot prune them.
        column: Column = F.lit(rank)
        for name in nulls:
            column = F.when(F.col(quote(name)).isNotNull(), F.raise_error(F.lit(_type_message(binding, name)))).otherwise(column)
        return column.cast("int")

    doc_row = F.struct(
        origin(1, doc_nulls).alias(_ORIGIN),
        F.col(SEQ).alias(SEQ),  # any orderable type (a long, or documents' (file, block, row))
        F.col(OP).alias(OP),
        *[value(name, doc_types, doc_nulls, target).alias(name) for name, target in targets.items()],
    )
    rows = documents.select(*[F.col(quote(k)) for k in keys], doc_row.alias(_ROW))
    if loaded is not None:
        key_types = {f.name: f.dataType for f in documents.schema.fields if f.name in keys}
        loaded_row = F.struct(
            origin(0, loaded_nulls).alias(_ORIGIN),
            F.lit(None).cast(sqltypes.plain(seq_type)).alias(SEQ),  # never compared: the loaded row's origin sorts first
            F.lit("u").alias(OP),
            *[value(name, loaded_types, loaded_nulls, target).alias(name) for name, target in targets.items()],
        )
        current = loaded.select(*[F.col(quote(k)).cast(sqltypes.plain(key_types[k])).alias(k) for k in keys], loaded_row.alias(_ROW))
        rows = rows.unionByName(current)

    state_type = StructType(
        [StructField(OP, StringType(), True)] + [StructField(name, target, True) for name, target in targets.items()]
    )
    steps = {name: _step(strategy(binding, name), target) for name, target in targets.items()}
    lww = {name for name in targets if strategy(binding, name) == LAST_WRITE_WINS}

    def fold(acc: "Column", doc: "Column") -> "Column":
        # A delete resets the key: its lastWriteWins fields are the delete document's, the rest NULL.
        reset = F.struct(
            F.lit("d").alias(OP),
            *[(doc[name] if name in lww else F.lit(None).cast(sqltypes.plain(t))).alias(name) for name, t in targets.items()],
        ).cast(sqltypes.plain(state_type))
        update = F.struct(
            F.lit("u").alias(OP), *[steps[name](acc[name], doc[name]).alias(name) for name in targets]
        ).cast(sqltypes.plain(state_type))
        return F.when(doc[OP] == F.lit("d"), reset).otherwise(update)

    def in_order(x: "Column", y: "Column") -> "Column":
        # The loaded row first, then the documents by _seq (unique within the epoch).
        return (
            F.when(x[_ORIGIN] < y[_ORIGIN], -1)
            .when(x[_ORIGIN] > y[_ORIGIN], 1)
            .when(x[SEQ] < y[SEQ], -1)
            .when(x[SEQ] > y[SEQ], 1)
            .otherwise(0)
        )

    zero = F.struct(
        F.lit(None).cast(sqltypes.plain(StringType())).alias(OP), *[F.lit(None).cast(sqltypes.plain(t)).alias(name) for name, t in targets.items()]
    ).cast(sqltypes.plain(state_type))
    folded = rows.groupBy(*[F.col(quote(k)) for k in keys]).agg(F.collect_list(_ROW).alias(_DOCS))
    folded = folded.select(
        *[F.col(quote(k)) for k in keys],
        F.aggregate(F.array_sort(F.col(_DOCS), in_order), zero, fold).alias(_STATE),
    )
    return folded.select(
        *[F.col(quote(k)) for k in keys],
        *[F.col(_STATE)[name].alias(name) for name in targets],
        F.col(_STATE)[OP].alias(OP),
    )


def _placeholder(how: str, doc: "DataType", table: "DataType | None") -> bool:
    from pyspark.sql.types import StringType

    if not isinstance(doc, StringType):
        return False
    return how in _NOT_STRINGS or (table is not None and not isinstance(table, StringType))


def _table_schema(documents: "DataFrame", binding: BindingConfig) -> "StructType | None":
    from materializer.delta import schema_and_properties
    from materializer.tables import TableRef

    found = schema_and_properties(documents.sparkSession, TableRef(binding.table))
    return found[0] if found is not None else None


def _type_message(binding: BindingConfig, name: str) -> str:
    return (
        f"binding {binding.name}: field {name} has reduction {strategy(binding, name)} but holds a value of "
        "another type (a string, or a type the table does not have). Fix the documents or the binding's "
        "reductions; nothing of this epoch was applied"
    )


def _target_type(binding: BindingConfig, name: str, doc: "DataType | None", current: "DataType | None") -> "DataType | None":
    """The type a field is folded in: the documents' and the table's unified; None if neither has one."""
    from pyspark.sql.types import ArrayType, NumericType, StructType

    how = strategy(binding, name)
    if doc is None:
        return current
    if how == LAST_WRITE_WINS:
        return doc
    expected = {"sum": NumericType, "merge": StructType, "append": ArrayType}.get(how)
    if expected is not None and not isinstance(doc, expected):
        what = {"sum": "numbers", "merge": "objects", "append": "arrays"}[how]
        raise SourceError(
            f"binding {binding.name}: field {name!r} has reduction {how!r}, which needs {what}, but the "
            f"documents of this epoch hold {doc.simpleString()}. Fix the documents or the binding's "
            "reductions; nothing of this epoch was applied."
        )
    if current is None:
        return doc
    unified = unify_types(current, doc)
    if unified is None:
        raise SourceError(
            f"binding {binding.name}: field {name!r} is {current.simpleString()} in table {binding.table} but "
            f"{doc.simpleString()} in the documents of this epoch; the {how} reduction cannot combine them. "
            "Nothing of this epoch was applied."
        )
    return unified


_INTEGER_RANK = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}


def unify_types(current: "DataType", doc: "DataType") -> "DataType | None":
    """A type both can be converted to by :func:`conform`; None if there is none."""
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        IntegralType,
        NullType,
        NumericType,
        StringType,
        StructField,
        StructType,
    )

    if current == doc:
        return current
    if isinstance(current, StructType) and isinstance(doc, StructType):
        # By name, the table's fields in the table's order first: a struct cast is positional.
        fields = []
        doc_fields = {f.name: f.dataType for f in doc.fields}
        for field in current.fields:
            inner = field.dataType if field.name not in doc_fields else unify_types(field.dataType, doc_fields[field.name])
            if inner is None:
                return None
            fields.append(StructField(field.name, inner, True))
        known = {f.name for f in current.fields}
        fields += [StructField(f.name, f.dataType, True) for f in doc.fields if f.name not in known]
        return StructType(fields)
    if isinstance(current, ArrayType) and isinstance(doc, ArrayType):
        element = unify_types(current.elementType, doc.elementType)
        return None if element is None else ArrayType(element, True)
    if isinstance(current, NumericType) and isinstance(doc, NumericType):
        if isinstance(current, IntegralType) and isinstance(doc, IntegralType):
            # The wider of the two (PySpark's types have no defaultSize, unlike Scala's).
            return current if _INTEGER_RANK[current.simpleString()] >= _INTEGER_RANK[doc.simpleString()] else doc
        return DoubleType()
    # JSON infers a string for values that were all NULL (and NullType inside empty arrays).
    if isinstance(doc, (StringType, NullType)):
        return current
    if isinstance(current, (StringType, NullType)):
        return doc
    return None


def conform(column: "Column", source: "DataType", target: "DataType", message: str = _CONFORM_MESSAGE) -> "Column":
    """``column`` (of type ``source``) as ``target``: structs by field name, missing fields NULL.

    A plain ``cast`` converts structs by position, which puts values in the wrong sub-field when
    the sub-fields differ; this goes by name. With :func:`unify_types` it can also align staged
    rows with a table whose structs have other sub-fields (the driver's ``_align``).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StringType, StructType

    if source == target:
        return column
    if isinstance(source, StructType) and isinstance(target, StructType):
        have = {f.name: f.dataType for f in source.fields}
        parts = [
            (
                conform(column[f.name], have[f.name], f.dataType, message)
                if f.name in have
                else F.lit(None).cast(sqltypes.plain(f.dataType))
            ).alias(f.name)
            for f in target.fields
        ]
        return F.when(column.isNull(), F.lit(None).cast(sqltypes.plain(target))).otherwise(F.struct(*parts).cast(sqltypes.plain(target)))
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        return F.transform(column, lambda e: conform(e, source.elementType, target.elementType, message)).cast(sqltypes.plain(target))
    if isinstance(source, StringType) and isinstance(target, (StructType, ArrayType, MapType)):
        # A string cannot become an object or array: it must be JSON's all-NULL placeholder.
        return F.when(column.isNull(), F.lit(None).cast(sqltypes.plain(target))).otherwise(F.raise_error(F.lit(message)).cast(sqltypes.plain(target)))
    return column.cast(sqltypes.plain(target))


Step = Callable[["Column", "Column"], "Column"]


def _step(how: str, data_type: "DataType") -> Step:
    """One fold step for a field: (current value, next document's value) -> new value."""
    from pyspark.sql import functions as F

    def either(combine_both: Step) -> Step:
        # NULL on either side leaves the other unchanged.
        return lambda a, b: F.when(a.isNull(), b).when(b.isNull(), a).otherwise(combine_both(a, b))

    if how == LAST_WRITE_WINS:
        return lambda a, b: b
    if how == "firstWriteWins":
        return lambda a, b: F.coalesce(a, b)
    if how == "sum":
        return either(lambda a, b: a + b)
    if how == "min":
        return lambda a, b: F.least(a, b)  # least/greatest skip NULLs
    if how == "max":
        return lambda a, b: F.greatest(a, b)
    if how == "append":
        return either(lambda a, b: F.concat(a, b))
    if how == "merge":
        return lambda a, b: _deep_merge(a, b, data_type)
    raise ConfigError(f"unknown reduction strategy {how!r}")


def _deep_merge(a: "Column", b: "Column", data_type: "DataType") -> "Column":
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    if not isinstance(data_type, StructType):
        return F.coalesce(b, a)  # a leaf: the later non-NULL value wins
    fields = [_deep_merge(a[f.name], b[f.name], f.dataType).alias(f.name) for f in data_type.fields]
    merged: Column = F.struct(*fields).cast(sqltypes.plain(data_type))
    return F.when(b.isNull(), a).when(a.isNull(), b).otherwise(merged)
