"""Change semantics beyond last-write-wins by file order: sequences, tombstones, column control.

A binding is *change controlled* (``BindingConfig.change_controlled``) when it sets any of
``sequence_by``, ``columns`` / ``except_columns``, ``ignore_null_updates``, ``delete_when``,
``soft_delete`` or ``mode: scd2``. Its rows take this module's path instead of
:func:`materializer.reductions.combine` and the driver's plain MERGE; everything else (staging,
the recovery log, the tagged apply) is the same, so exactly-once holds unchanged: the epoch's
staged rows are still applied by one Delta commit carrying ``txnAppId``/``txnVersion``.

Columns the materializer keeps in such a table (beside the documents' fields):

==================  ============================================================================
``__sequence``      ``sequence_by``: the sequence of the change the row holds, a struct with one
                    field per path (``_meta.source.lsn`` → ``_meta__source__lsn``); numbers as
                    DECIMAL(38,9), strings as strings.
``__deleted``       ``sequence_by`` or ``soft_delete``: the key is deleted. With ``sequence_by``
                    and no ``soft_delete`` the row is a *tombstone*: its fields are NULL, only
                    the key and the sequence remain, so a late, older upsert cannot bring the key
                    back. Readers filter ``WHERE NOT __deleted``.
``__deleted_at``    ``soft_delete``: when the apply marked the row deleted.
==================  ============================================================================

Why tombstones live in the table itself rather than in a side table: a Delta commit covers one
table, and the apply must be one commit tagged with the epoch's txn id (DESIGN invariant 2). A
side table would need a second commit whose replay is skipped independently: a crash between the
two would leave the MERGE of the main table deciding against tombstones of another epoch's state.
In the table, the row and its tombstone change in the same commit, exactly once.

Within an epoch, the change with the highest ``(sequence, _seq)`` wins per key (``_seq`` is the
file order, so ties go to the later file, and the later line). Across epochs the MERGE applies a
staged row only when its sequence is ``>=`` the stored one (equal: the later epoch read the later
files, so file order again); a row stored without a sequence (before ``sequence_by`` was set) is
older than any change.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from materializer import sqltypes
from materializer.config import BindingConfig
from materializer.delta import quote
from materializer.errors import SourceError
from materializer.columns import OP, SEQ

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

SEQUENCE = "__sequence"
DELETED = "__deleted"
DELETED_AT = "__deleted_at"
START_AT = "__start_at"
END_AT = "__end_at"
CURRENT = "__current"
RESET = "__reset_at"
"""Staged only (``ignore_null_updates``): the sequence of the epoch's last delete of the key
before its final upsert, so the MERGE knows which stored values that delete wiped."""
FROM = "__from"
"""Staged only (``ignore_null_updates`` with ``sequence_by``): per field, the sequence of the change
its value comes from, so the MERGE keeps a stored value newer than it."""
UNAVAILABLE = "__unavailable"
"""Staged only (a source's placeholders, Debezium's ``__debezium_unavailable_value``): per row, the
fields whose value the change does not carry, so the MERGE keeps the stored value."""
HIDDEN = (SEQUENCE, DELETED, DELETED_AT, START_AT, END_AT, CURRENT, RESET, FROM, UNAVAILABLE)
"""Names a document may not use in a change-controlled binding."""
SEQUENCE_NUMBER = "decimal(38,9)"
"""The type of a numeric sequence field: exact for integers up to 29 digits (LSNs, offsets,
epoch nanoseconds) and for fractions to 9 places, and one type whatever JSON inference says."""
_NUMBER_KINDS = r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL.*)$"


# --- the sequence of a document (in the documents reader) ----------------------------------------


def sequence_name(path: str) -> str:
    """The ``__sequence`` struct field of a ``sequence_by`` path."""
    return path.replace(".", "__")


def json_path(path: str) -> str:
    return "$" + "".join(f"['{part}']" for part in path.split("."))


def hidden_columns(binding: BindingConfig) -> tuple[str, ...]:
    """Top-level names the binding's documents may not hold (the table's own columns)."""
    return HIDDEN if binding.change_controlled else ()


def sequence_rules(v: "Column", paths: list[str]) -> list[tuple["Column", str]]:
    """Per document: its ``sequence_by`` fields are present, and a number or a string."""
    from pyspark.sql import functions as F

    rules: list[tuple[Column, str]] = []
    for path in paths:
        got = F.try_variant_get(v, json_path(path), "variant")
        kind = F.schema_of_variant(got)
        rules.append((
            got.isNull() | F.is_variant_null(got),
            f"sequence field {path!r} (sequence_by) is missing or null: every change, deletes too, needs its sequence",
        ))
        rules.append((
            ~(kind.rlike(_NUMBER_KINDS) | (kind == F.lit("STRING"))),
            f"sequence field {path!r} (sequence_by) must be a number or a string (an ISO-8601 time sorts as text)",
        ))
        rules.append((
            kind.rlike(_NUMBER_KINDS) & F.try_variant_get(got, "$", SEQUENCE_NUMBER).isNull(),
            f"sequence field {path!r} (sequence_by) is a number beyond {SEQUENCE_NUMBER} (29 digits before the point); "
            "write it as a string of fixed width",
        ))
    return rules


def _shape_at(shape: Any, path: str) -> Any:
    for part in path.split("."):
        if not (isinstance(shape, tuple) and shape[0] == "object"):
            return None
        shape = dict(shape[1]).get(part)
    return shape


def sequence_column(v: "Column", paths: list[str], shape: Any, where: str) -> "Column":
    """The document's ``__sequence`` struct, each field typed by its kind in the epoch (``shape``,
    the epoch's merged ``schema_of_variant``): STRING stays a string, numbers are DECIMAL(38,9)."""
    from pyspark.sql import functions as F

    fields = []
    for path in paths:
        found = _shape_at(shape, path) if shape is not None else None
        if found == "VARIANT":
            raise SourceError(
                f"{where}: sequence field {path!r} (sequence_by) holds numbers in some documents of this transaction "
                "and strings in others; a sequence must be one kind to be compared. Fix the documents (nothing of "
                "this transaction was applied)."
            )
        kind = "string" if found == "STRING" else SEQUENCE_NUMBER
        fields.append(F.try_variant_get(v, json_path(path), kind).alias(sequence_name(path)))
    return F.struct(*fields)


# --- the combine (standard mode) -----------------------------------------------------------------


def prepare(documents: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """``delete_when`` turned into ``_op``, and only the columns that land (plus the hidden ones)."""
    from pyspark.sql import functions as F

    docs = documents
    if binding.delete_when:
        docs = with_deletes(docs, binding)
    keep = [c for c in docs.columns if _lands(c, binding)]
    return docs.select(*[F.col(quote(c)) for c in keep])


_MISSING_TRIES = 16
"""How many absent fields :func:`delete_condition` fills in before it gives up."""


def with_deletes(docs: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """``docs`` with ``_op`` set to a delete where ``delete_when`` is true; NULL (say, a field the
    document lacks) is not a delete (docs: 'Change semantics').

    The epoch's schema is whatever its documents hold, so a field the condition names may be absent
    (no document of the epoch carries it), or absent inside a struct that is there: Spark would
    refuse the condition. It is evaluated instead over the documents with each absent field added as
    NULL, found from what Spark's analysis reports missing (a top-level field or path, a sub-field
    of a struct that is present); those additions are dropped again, so nothing of them lands.
    Anything else that keeps the condition from being evaluated (a field of another type, a result
    that is not true/false) stops the epoch here, before it is staged or committed, naming the
    binding and the condition."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, NullType

    from materializer.delta import error_condition

    condition = binding.delete_when
    assert condition is not None
    where = f"binding {binding.name}: delete_when {condition!r}"
    top: dict[str, Any] = {}  # absent top-level fields: NULL, or a struct of NULLs for a path
    sub: set[str] = set()  # absent sub-fields, added as NULL to every struct that lacks them
    for _attempt in range(_MISSING_TRIES):
        frame, originals = _with_absent(docs, top, sub)
        try:
            with _quiet_analysis():
                dtype = frame.select(F.expr(condition).alias("__delete")).schema["__delete"].dataType
        except AnalysisException as exc:
            found = error_condition(exc) or ""
            parameters = exc.getMessageParameters() or {}
            if found.startswith("UNRESOLVED_COLUMN") and "objectName" in parameters:
                path = [p.strip("`") for p in parameters["objectName"].split("`.`")]
                if path[0] not in top and path[0] not in docs.columns:
                    top[path[0]] = path[1:]
                    continue
            if found == "FIELD_NOT_FOUND" and "fieldName" in parameters:
                name = parameters["fieldName"].strip("`")
                if name not in sub:
                    sub.add(name)
                    continue
            raise SourceError(
                f"{where} cannot be evaluated on this transaction's documents: {_first_line(exc)}. A field it names "
                "holds another type here than the condition expects, or the condition is not valid Spark SQL. Fix "
                "delete_when (or the documents); nothing of this transaction was committed or applied."
            ) from None
        if not isinstance(dtype, (BooleanType, NullType)):
            raise SourceError(
                f"{where} is {dtype.simpleString()} on this transaction's documents, not a condition (true or false): "
                "write it as a comparison, e.g. \"op = 'DELETE'\" or \"is_deleted = true\". Nothing of this "
                "transaction was committed or applied."
            )
        is_delete = F.coalesce(F.expr(condition).cast("boolean"), F.lit(False))
        marked = frame.withColumn(OP, F.when(is_delete, F.lit("d")).otherwise(F.col(OP)))
        return marked.select(*[
            (F.col(quote(originals[c])) if c in originals else F.col(quote(c))).alias(c) for c in docs.columns
        ])
    raise SourceError(f"{where} names more than {_MISSING_TRIES} fields this transaction's documents lack; nothing was committed.")


@contextmanager
def _quiet_analysis() -> Iterator[None]:
    """PySpark logs every analysis error with a query context at ERROR, JVM stack and all, as the
    exception is made; here an absent field is expected (and answered), not an error to log."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # pragma: no cover - PySpark before 4
        yield
        return
    loggers = [PySparkLogger.getLogger(name) for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before):
            logger.disabled = disabled


def _with_absent(docs: "DataFrame", top: dict[str, list[str]], sub: set[str]) -> "tuple[DataFrame, dict[str, str]]":
    """``docs`` with the absent fields added (top-level paths as structs of NULLs; ``sub`` as a NULL
    field of every struct that lacks it), and where each changed column's original is kept."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    originals: dict[str, str] = {}
    changed: dict[str, Column] = {}
    for i, field in enumerate(docs.schema.fields):
        if isinstance(field.dataType, StructType) and sub:
            patched = _add_fields(F.col(quote(field.name)), field.dataType, sub)
            if patched is not None:
                originals[field.name] = f"__original_{i}"
                changed[field.name] = patched
    frame = docs.select("*", *[F.col(quote(name)).alias(copy) for name, copy in originals.items()])
    for name, path in top.items():
        value = F.lit(None)
        for part in reversed(path):
            value = F.struct(value.alias(part))
        changed[name] = value
    return (frame.withColumns(changed) if changed else frame), originals


def _add_fields(column: "Column", dtype: Any, names: set[str]) -> "Column | None":
    """``column`` (a struct) with each of ``names`` it lacks added as NULL, at every depth; None: unchanged."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    out, changed = column, False
    present = {f.name for f in dtype.fields}
    for field in dtype.fields:
        if isinstance(field.dataType, StructType):
            inner = _add_fields(column.getField(field.name), field.dataType, names)
            if inner is not None:
                out, changed = out.withField(quote(field.name), inner), True
    for name in sorted(names - present):
        out, changed = out.withField(quote(name), F.lit(None)), True
    return out if changed else None


def _first_line(exc: BaseException) -> str:
    """Spark's message without its plan and JVM stack."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(" SQLSTATE")[0].strip()


def _lands(column: str, binding: BindingConfig) -> bool:
    if column in binding.key or column in (OP, SEQ, SEQUENCE, UNAVAILABLE):
        return True
    if binding.columns is not None:
        return column in binding.columns
    return column not in binding.except_columns


def order_of(docs: "DataFrame") -> "Column":
    """What orders a key's changes: the sequence, then the file order."""
    from pyspark.sql import functions as F

    if SEQUENCE in docs.columns:
        return F.struct(F.col(SEQUENCE).alias("s"), F.col(SEQ).alias("f"))
    return F.col(SEQ)


def combine(documents: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """One row per key: the change with the highest order (with its ``_op`` and ``__sequence``).

    With ``ignore_null_updates`` each field is the latest non-NULL value after the key's last
    delete in the epoch, and ``__reset_at`` carries that delete's order for the MERGE."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if binding.mode == "scd2":
        return scd2_combine(documents, binding)
    docs = prepare(documents, binding)
    keys = [F.col(quote(k)) for k in binding.key]
    order = order_of(docs)
    carried = [c for c in docs.columns if c not in binding.key and c != SEQ]
    unavailable = UNAVAILABLE in docs.columns
    if not binding.ignore_null_updates and not unavailable:
        latest = docs.groupBy(*keys).agg(F.max_by(F.struct(*[F.col(quote(c)) for c in carried]), order).alias("__last"))
        return latest.select(*keys, *[F.col("__last")[c].alias(c) for c in carried])
    docs = docs.withColumn("__order", order)
    # The last delete per key (a window: every field below needs it before its own max_by).
    docs = docs.withColumn("__reset", F.max(F.when(F.col(OP) == "d", F.col("__order"))).over(Window.partitionBy(*keys)))
    after_reset = F.col("__reset").isNull() | (F.col("__order") > F.col("__reset"))
    values = [c for c in carried if c not in (OP, SEQUENCE, UNAVAILABLE)]

    def carries(c: str) -> "Column":
        """Whether a change brings a value for ``c``: not NULL (ignore_null_updates), not a placeholder."""
        held = after_reset
        if binding.ignore_null_updates:
            held = held & F.col(quote(c)).isNotNull()
        if unavailable:
            held = held & ~F.coalesce(F.array_contains(F.col(UNAVAILABLE), F.lit(c)), F.lit(False))
        return held

    aggregates = [F.max_by(F.struct(F.col(OP), *([F.col(SEQUENCE)] if SEQUENCE in docs.columns else [])), F.col("__order")).alias("__last")]
    aggregates += [F.max_by(F.col(quote(c)), F.when(carries(c), F.col("__order"))).alias(c) for c in values]
    if unavailable:
        # The fields no change of the key's (after its last delete) brought: the stored value stays.
        aggregates.append(F.array_compact(F.array(*[F.when(F.max(F.when(carries(c), F.lit(1))).isNull(), F.lit(c)) for c in values]) if values else F.array().cast("array<string>")).alias(UNAVAILABLE))
    aggregates.append(F.max(F.col("__reset")).alias("__reset"))
    sequenced = SEQUENCE in docs.columns
    if sequenced:
        aggregates.append(F.struct(*[
            F.max(F.when(carries(c), F.col("__order"))).alias(c) for c in values
        ]).alias("__from"))
    latest = docs.groupBy(*keys).agg(*aggregates)
    reset = F.col("__reset")["s"] if sequenced else F.col("__reset").isNotNull()
    return latest.select(
        *keys,
        *[F.col(quote(c)) for c in values],
        F.col("__last")[OP].alias(OP),
        *([F.col("__last")[SEQUENCE].alias(SEQUENCE)] if sequenced else []),
        F.when(F.col("__reset").isNotNull(), reset).alias(RESET),
        *([F.struct(*[F.col("__from")[c]["s"].alias(c) for c in values]).alias(FROM)] if sequenced and values else []),
        *([F.col(UNAVAILABLE)] if unavailable else []),
    )


# --- the apply ------------------------------------------------------------------------------------


def tombstones(binding: BindingConfig) -> bool:
    """Deletes leave a row (a tombstone, or a soft-deleted row) instead of removing it."""
    return bool(binding.sequence_by) or binding.soft_delete


def merge_source(rows: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """The staged rows with the table's hidden columns as the MERGE writes them (named in the
    source, so schema evolution can add them to a table made before they were configured)."""
    from pyspark.sql import functions as F

    if FROM in rows.columns:
        # One sequence per table field (NULL: the epoch brought no value for it), so the MERGE
        # may name any field's.
        have = {f.name for f in rows.schema[FROM].dataType.fields}
        fields = [c for c in rows.columns if c not in HIDDEN and c != OP and c not in binding.key]
        sequence = rows.schema[SEQUENCE].dataType
        rows = rows.withColumn(FROM, F.struct(*[
            (F.col(FROM)[c] if c in have else F.lit(None).cast(sqltypes.plain(sequence))).alias(c) for c in fields
        ]))
    if not tombstones(binding):
        return rows
    deleted = F.col(OP) == F.lit("d")
    rows = rows.withColumn(DELETED, deleted)
    if binding.soft_delete:
        rows = rows.withColumn(DELETED_AT, F.when(deleted, F.current_timestamp()))
    return rows


def first_rows(rows: "DataFrame", binding: BindingConfig, epoch: int) -> "DataFrame":
    """The rows of a new table: upserts, and (with tombstones) deletes as deleted rows; in mode
    scd2 the versions of the epoch's changes."""
    from pyspark.sql import functions as F

    if binding.mode == "scd2":
        return scd2_versions(rows, None, binding, epoch).drop(REMOVE)

    staged = staged_only(rows.columns, binding)
    if not tombstones(binding):
        return rows.filter(F.col(OP) != "d").drop(*staged)
    if not binding.sequence_by:
        rows = rows.filter(F.col(OP) != "d")  # soft deletes of keys no table holds: nothing to mark
    out = merge_source(rows, binding)
    # A delete of a key no table holds is its key alone (a tombstone, or a soft-deleted row that
    # held nothing): what the MERGE inserts for it too.
    deleted = F.col(OP) == F.lit("d")
    kept = set(binding.key) | {OP, SEQUENCE, DELETED, DELETED_AT, RESET}
    out = out.select(*[F.col(quote(c)) if c in kept else F.when(~deleted, F.col(quote(c))).alias(c) for c in out.columns])
    return out.drop(*staged)


def keeps_field_sequences(binding: BindingConfig) -> bool:
    """``ignore_null_updates`` with ``sequence_by``: the table keeps, per row, the sequence each
    field's value comes from (``__from``) and that of the key's latest delete (``__reset_at``), so
    a late change's fields land where its sequence puts them, whatever the arrival order."""
    return bool(binding.sequence_by) and binding.ignore_null_updates and binding.mode == "standard"


def staged_only(columns: list[str], binding: BindingConfig | None = None) -> list[str]:
    """Columns of the MERGE's source that are not table columns."""
    kept = (RESET, FROM) if binding is not None and keeps_field_sequences(binding) else ()
    return [c for c in columns if c in (OP, RESET, FROM, UNAVAILABLE, "__remove") and c not in kept]


def merge_sql(
    binding: BindingConfig, target: str, source_view: str, columns: list[str], evolve: str = "", target_filter: str = "",
    target_columns: list[str] | None = None,
) -> str:
    """The standard-mode MERGE of a change-controlled binding. ``columns``: the source's columns
    (the table's, aligned, plus new ones, ``_op`` and the hidden ones of :func:`merge_source`);
    ``target_columns``: the table's (a column it lacks yet, say ``__sequence`` of a ``sequence_by``
    added later, reads as NULL: "a row stored before `sequence_by` was configured has no sequence")."""

    def q(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    held = set(target_columns) if target_columns is not None else None

    def t(name: str) -> str:
        """A stored column, NULL where the table does not have it yet (schema evolution adds it)."""
        return f"t.{q(name)}" if held is None or name in held else "NULL"

    keys = binding.key
    data = [c for c in columns if c not in HIDDEN and c != OP]
    fields = [c for c in data if c not in keys]
    condition = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys) + target_filter  # the epoch's key bounds
    sequenced = SEQUENCE in columns
    # A stored row without a sequence was written before sequence_by was set: older than any change.
    newer_test = f"({t(SEQUENCE)} IS NULL OR s.{q(SEQUENCE)} >= {t(SEQUENCE)})" if sequenced else "true"
    newer = f" AND {newer_test}" if sequenced else ""
    is_delete = f"s.{q(OP)} = 'd'"
    was_deleted = f"coalesce({t(DELETED)}, false)" if tombstones(binding) else "false"
    if keeps_field_sequences(binding) and sequenced:
        return _merge_field_sequences(binding, target, source_view, columns, evolve, condition, t, q, data, fields)

    def value(c: str) -> str:
        if UNAVAILABLE in columns and c not in keys:
            # A placeholder (no value in the change) keeps the stored value, unless a delete since
            # wiped it (as ignore_null_updates does for NULL, for this one field).
            reset = f"coalesce(s.{q(RESET)}, false)" if not sequenced else (
                f"(s.{q(RESET)} IS NOT NULL AND ({t(SEQUENCE)} IS NULL OR s.{q(RESET)} >= {t(SEQUENCE)}))"
            )
            kept = f"array_contains(s.{q(UNAVAILABLE)}, {_sql_text(c)}) AND NOT ({was_deleted} OR {reset})"
            return f"CASE WHEN {kept} THEN {t(c)} ELSE {stored_or_new(c)} END"
        return stored_or_new(c)

    def stored_or_new(c: str) -> str:
        if not binding.ignore_null_updates or c in keys:
            return f"s.{q(c)}"
        # Without sequence_by every change of the epoch is newer than the stored row: the stored
        # value survives a NULL unless a delete came in between (stored, or one of the epoch's).
        stored = t(c)
        return f"CASE WHEN {was_deleted} OR coalesce(s.{q(RESET)}, false) THEN s.{q(c)} WHEN s.{q(c)} IS NULL THEN {stored} ELSE s.{q(c)} END"

    hidden_sets = []
    if sequenced:
        hidden_sets.append(f"{q(SEQUENCE)} = s.{q(SEQUENCE)}")
    clauses = []
    if tombstones(binding):
        on_delete = hidden_sets + [f"{q(DELETED)} = true"]
        if binding.soft_delete:
            # Deleted again: the first time stays.
            on_delete.append(f"{q(DELETED_AT)} = CASE WHEN {was_deleted} THEN {t(DELETED_AT)} ELSE s.{q(DELETED_AT)} END")
        else:
            on_delete += [f"{q(c)} = NULL" for c in fields]
        clauses.append(f"WHEN MATCHED AND {is_delete}{newer} THEN UPDATE SET {', '.join(on_delete)}")
    else:
        clauses.append(f"WHEN MATCHED AND {is_delete} THEN DELETE")
    on_update = [f"{q(c)} = {value(c)}" for c in data] + hidden_sets
    if tombstones(binding):
        on_update.append(f"{q(DELETED)} = false")
    if binding.soft_delete:
        on_update.append(f"{q(DELETED_AT)} = NULL")
    clauses.append(f"WHEN MATCHED AND NOT {is_delete}{newer} THEN UPDATE SET {', '.join(on_update)}")
    clauses.append(_insert(binding, columns, data, fields, is_delete, q))
    return f"MERGE{evolve} INTO {target} t USING {q(source_view)} s ON {condition} " + " ".join(clauses)


def _insert(binding: BindingConfig, columns: list[str], data: list[str], fields: list[str], is_delete: str, q: Any) -> str:
    inserted = data + [c for c in (SEQUENCE, DELETED, DELETED_AT, RESET, FROM) if c in columns and (c not in (RESET, FROM) or keeps_field_sequences(binding))]
    if tombstones(binding) and binding.sequence_by:
        # A delete of an unknown key is remembered too (its key alone): a late, older upsert must
        # not create it.
        values = [f"CASE WHEN {is_delete} THEN NULL ELSE s.{q(c)} END" if c in fields or c == FROM else f"s.{q(c)}" for c in inserted]
        return f"WHEN NOT MATCHED THEN INSERT ({', '.join(q(c) for c in inserted)}) VALUES ({', '.join(values)})"
    values = [f"s.{q(c)}" for c in inserted]
    return f"WHEN NOT MATCHED AND NOT {is_delete} THEN INSERT ({', '.join(q(c) for c in inserted)}) VALUES ({', '.join(values)})"


def _merge_field_sequences(
    binding: BindingConfig, target: str, source_view: str, columns: list[str], evolve: str, condition: str,
    t: Any, q: Any, data: list[str], fields: list[str],
) -> str:
    """``ignore_null_updates`` with ``sequence_by``: each field is the latest non-NULL value, by
    sequence, since the key's latest delete (semantics.py's fold), whatever the arrival order.

    The stored row keeps, per field, the sequence its value comes from (``__from``; a row stored
    before the column existed: the row's ``__sequence``) and the sequence of the key's latest
    delete (``__reset_at``); the staged row brings the same for the epoch. At equal sequences the
    staged side arrived later, so it wins: a staged value over a stored value or delete, a staged
    delete over a stored value."""
    is_delete = f"s.{q(OP)} = 'd'"
    was_deleted = f"coalesce({t(DELETED)}, false)"
    stored_seq, staged_seq = t(SEQUENCE), f"s.{q(SEQUENCE)}"
    newer = f"({stored_seq} IS NULL OR {staged_seq} >= {stored_seq})"
    stored_reset = f"coalesce({t(RESET)}, CASE WHEN {was_deleted} THEN {stored_seq} END)"
    staged_reset = f"s.{q(RESET)}"
    stored_from = t(FROM)

    def pick(c: str) -> tuple[str, str]:
        staged_from = f"s.{q(FROM)}.{q(c)}"
        held_from = f"coalesce({stored_from}.{q(c)}, {stored_seq})" if stored_from != "NULL" else stored_seq
        if t(c) == "NULL":
            held_from = "NULL"
        staged_ok = f"({staged_from} IS NOT NULL AND ({stored_reset} IS NULL OR {staged_from} >= {stored_reset}))"
        # A stored value is live unless the row is deleted, and survives unless a staged delete is
        # not older than it (a value stored before sequence_by, with no sequence, is older than any).
        held_ok = (
            f"({t(c)} IS NOT NULL AND NOT {was_deleted} AND ({staged_reset} IS NULL OR "
            f"({held_from} IS NOT NULL AND {held_from} > {staged_reset})))"
        )
        staged_wins = f"{staged_ok} AND (NOT {held_ok} OR {held_from} IS NULL OR {staged_from} >= {held_from})"
        value = f"CASE WHEN {staged_wins} THEN s.{q(c)} WHEN {held_ok} THEN {t(c)} END"
        origin = f"CASE WHEN {staged_wins} THEN {staged_from} WHEN {held_ok} THEN {held_from} END"
        return value, origin

    picked = {c: pick(c) for c in fields}
    sets = [f"{q(c)} = {picked[c][0]}" for c in fields]
    from_struct = "named_struct(" + ", ".join(f"'{c}', {picked[c][1]}" for c in fields) + ")" if fields else None
    if from_struct is not None:
        sets.append(f"{q(FROM)} = {from_struct}")
    sets += [
        f"{q(SEQUENCE)} = CASE WHEN {newer} THEN {staged_seq} ELSE {stored_seq} END",
        f"{q(DELETED)} = CASE WHEN {newer} THEN {is_delete} ELSE {was_deleted} END",
        f"{q(RESET)} = greatest({stored_reset}, {staged_reset})",
    ]
    clauses = []
    if binding.soft_delete:
        # docs: a soft delete "keeps the row's values as the table held them"; they are no longer
        # live (__reset_at is the delete), so an upsert after it starts afresh.
        on_delete = [
            f"{q(SEQUENCE)} = {staged_seq}", f"{q(DELETED)} = true", f"{q(RESET)} = {staged_seq}",
            f"{q(DELETED_AT)} = CASE WHEN {was_deleted} THEN {t(DELETED_AT)} ELSE s.{q(DELETED_AT)} END",
        ]
        clauses.append(f"WHEN MATCHED AND {is_delete} AND {newer} THEN UPDATE SET {', '.join(on_delete)}")
        # A soft-deleted row shows what it held: changes older than its delete leave it as it is.
        sets.append(f"{q(DELETED_AT)} = CASE WHEN {newer} THEN NULL ELSE {t(DELETED_AT)} END")
        clauses.append(f"WHEN MATCHED AND NOT ({was_deleted} AND NOT {newer}) THEN UPDATE SET {', '.join(sets)}")
    else:
        clauses.append(f"WHEN MATCHED THEN UPDATE SET {', '.join(sets)}")
    clauses.append(_insert(binding, columns, data, fields, is_delete, q))
    return f"MERGE{evolve} INTO {target} t USING {q(source_view)} s ON {condition} " + " ".join(clauses)


def _sql_text(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- mode scd2: every version -------------------------------------------------------------------

REMOVE = "__remove"
"""MERGE source only (scd2): a stored version that the epoch's changes replace."""
_RANK = "__rank"


def scd2_start(docs: "DataFrame", binding: BindingConfig) -> "Column":
    """Where a change's version starts: its sequence (the one field itself when there is one), or
    NULL, which the apply fills with the epoch (the epoch orders changes without sequence_by)."""
    from pyspark.sql import functions as F

    if SEQUENCE not in docs.columns:
        return F.lit(None).cast("bigint")
    if len(binding.sequence_by) == 1:
        return F.col(SEQUENCE)[sequence_name(binding.sequence_by[0])]
    return F.col(SEQUENCE)


def scd2_combine(documents: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """The epoch's changes as events: one per (key, start), the last by file order; without
    ``sequence_by`` one per key (the epoch is its start)."""
    from pyspark.sql import functions as F

    docs = prepare(documents, binding)
    docs = docs.withColumn(START_AT, scd2_start(docs, binding))
    keys = [F.col(quote(k)) for k in binding.key]
    carried = [c for c in docs.columns if c not in binding.key and c not in (SEQ, START_AT)]
    latest = docs.groupBy(*keys, F.col(START_AT)).agg(
        F.max_by(F.struct(*[F.col(quote(c)) for c in carried]), F.col(SEQ)).alias("__last")
    )
    return latest.select(*keys, *[F.col("__last")[c].alias(c) for c in carried], F.col(START_AT))


def tracked_fields(binding: BindingConfig, fields: list[str]) -> list[str]:
    """The fields whose change opens a new version (``track_history``); None of the options: all."""
    if binding.track_history is not None:
        return [f for f in fields if f in binding.track_history]
    if binding.track_history_except:
        return [f for f in fields if f not in binding.track_history_except]
    return fields


def scd2_versions(staged: "DataFrame", existing: "DataFrame | None", binding: BindingConfig, epoch: int) -> "DataFrame":
    """Every version of the keys the epoch touches, stored and new, as the table must hold them,
    plus (``__remove``) the stored versions that are no longer versions.

    Events, per key in start order: the stored versions (upserts, or delete markers: rows with
    ``__deleted``) and the epoch's changes; at one start the epoch's change replaces the stored one
    (file order). A run of upserts whose tracked fields do not change is one version: it starts at
    the run's first change and holds the values of its last (``__sequence`` says which that is). A
    version ends where the next run starts; each delete is a run of its own (a row with
    ``__deleted``, kept so a late change before it still ends there; two deletes in a row stay two
    rows, since a late upsert may fall between them). Without ``track_history`` every change is a
    version of its own, so a late change lands exactly in its place."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = [F.col(quote(k)) for k in binding.key]
    sequenced = SEQUENCE in staged.columns
    events = staged.withColumn(START_AT, F.coalesce(F.col(START_AT), F.lit(epoch).cast(sqltypes.plain(staged.schema[START_AT].dataType))))
    if not sequenced:
        events = events.withColumn(SEQUENCE, F.col(START_AT))  # the change's own order
    events = events.withColumn(_RANK, F.lit(1))
    fields = [c for c in staged.columns if c not in binding.key and c not in HIDDEN and c != OP]
    if existing is not None:
        stored = existing.join(staged.select(*keys).distinct(), on=binding.key, how="left_semi")
        fields += [c for c in stored.columns if c not in binding.key and c not in HIDDEN and c not in fields]
        stored = stored.select(
            *keys,
            *[F.col(quote(c)) for c in fields if c in stored.columns],
            F.when(F.coalesce(F.col(DELETED), F.lit(False)), F.lit("d")).otherwise(F.lit("u")).alias(OP),
            F.col(START_AT),
            (F.col(SEQUENCE) if SEQUENCE in stored.columns and sequenced else F.col(START_AT)).alias(SEQUENCE),
            F.lit(0).alias(_RANK),
        )
        events = events.unionByName(stored, allowMissingColumns=True)
        if sequenced:
            # A stored version that merged later in-place changes stands for its first change and
            # for the one its values come from (at its __sequence): a change redelivered at its
            # start replaces the first, never the later one.
            point = F.col(SEQUENCE)[sequence_name(binding.sequence_by[0])] if len(binding.sequence_by) == 1 else F.col(SEQUENCE)
            later = stored.where((F.col(OP) == "u") & point.isNotNull() & (point != F.col(START_AT)))
            events = events.unionByName(later.withColumn(START_AT, point).withColumn(_RANK, F.lit(-1)), allowMissingColumns=True)
    # One event per (key, start): the epoch's over the stored.
    at = Window.partitionBy(*keys, F.col(START_AT)).orderBy(F.col(_RANK).desc())
    events = events.withColumn("__n", F.row_number().over(at)).where(F.col("__n") == 1).drop("__n")
    tracked = tracked_fields(binding, fields)
    order = Window.partitionBy(*keys).orderBy(F.col(START_AT))
    prev_op = F.lag(F.col(OP)).over(order)
    if tracked:
        same = F.lag(F.struct(*[F.col(quote(c)) for c in tracked])).over(order).eqNullSafe(
            F.struct(*[F.col(quote(c)) for c in tracked])
        )
    else:
        same = F.lit(True)
    if binding.track_history is None and not binding.track_history_except:
        same = F.lit(False)  # every change is a version
    opens = prev_op.isNull() | (prev_op == "d") | (F.col(OP) == "d") | ~same
    # Every delete is a row of its own, even right after another: a late upsert may land between.
    events = events.withColumn("__run", F.sum(opens.cast("int")).over(order.rowsBetween(Window.unboundedPreceding, 0)))
    runs = events.groupBy(*keys, F.col("__run")).agg(
        F.min(F.col(START_AT)).alias(START_AT),
        F.min_by(F.col(OP), F.col(START_AT)).alias(OP),
        F.max_by(F.struct(*[F.col(quote(c)) for c in fields], F.col(SEQUENCE)), F.col(SEQUENCE)).alias("__last"),
    )
    by_start = Window.partitionBy(*keys).orderBy(F.col(START_AT))
    end = F.lead(F.col(START_AT)).over(by_start)
    deleted = F.col(OP) == "d"
    versions = runs.select(
        *keys,
        *[F.when(~deleted, F.col("__last")[c]).alias(c) for c in fields],
        F.col(START_AT),
        end.alias(END_AT),
        (end.isNull() & ~deleted).alias(CURRENT),
        deleted.alias(DELETED),
        *([F.col("__last")[SEQUENCE].alias(SEQUENCE)] if sequenced else []),
        F.lit(False).alias(REMOVE),
    )
    if existing is None:
        return versions
    gone = stored.join(versions.select(*keys, F.col(START_AT)), on=[*binding.key, START_AT], how="left_anti")
    return versions.unionByName(
        gone.select(*keys, F.col(START_AT), F.lit(True).alias(REMOVE)), allowMissingColumns=True
    )


def scd2_merge_sql(
    binding: BindingConfig, target: str, source_view: str, columns: list[str], evolve: str = "", target_filter: str = ""
) -> str:
    """One MERGE per epoch: versions by (key, start) updated (closed, or changed in place),
    inserted, or removed (a stored version a same-start change replaced into a run)."""

    def q(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    on = " AND ".join([f"t.{q(k)} = s.{q(k)}" for k in binding.key] + [f"t.{q(START_AT)} = s.{q(START_AT)}"]) + target_filter
    written = [c for c in columns if c != REMOVE and c not in binding.key and c != START_AT]
    sets = ", ".join(f"{q(c)} = s.{q(c)}" for c in written)
    inserted = [c for c in columns if c != REMOVE]
    # Only what changed is rewritten: a stored version whose end, values and flags are the same stays.
    changed = " OR ".join(f"NOT (t.{q(c)} <=> s.{q(c)})" for c in written)
    return (
        f"MERGE{evolve} INTO {target} t USING {q(source_view)} s ON {on} "
        f"WHEN MATCHED AND s.{q(REMOVE)} THEN DELETE "
        f"WHEN MATCHED AND ({changed}) THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND NOT s.{q(REMOVE)} THEN INSERT ({', '.join(q(c) for c in inserted)}) "
        f"VALUES ({', '.join('s.' + q(c) for c in inserted)})"
    )
