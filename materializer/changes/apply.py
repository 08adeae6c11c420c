"""The standard-mode apply of change-controlled rows: the MERGE's source, a new table's first rows, the MERGE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer import sqltypes
from materializer.changes.hidden import (
    DELETED,
    DELETED_AT,
    FROM,
    HIDDEN,
    RESET,
    SEQUENCE,
    UNAVAILABLE,
    keeps_field_sequences,
    staged_only,
    tombstones,
)
from materializer.changes.scd2 import REMOVE, scd2_versions
from materializer.columns import OP
from materializer.config import BindingConfig
from materializer.delta import literal, quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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


def merge_sql(
    binding: BindingConfig, target: str, source_view: str, columns: list[str], evolve: str = "", target_filter: str = "",
    target_columns: list[str] | None = None,
) -> str:
    """The standard-mode MERGE of a change-controlled binding. ``columns``: the source's columns
    (the table's, aligned, plus new ones, ``_op`` and the hidden ones of :func:`merge_source`);
    ``target_columns``: the table's (a column it lacks yet, say ``__sequence`` of a ``sequence_by``
    added later, reads as NULL: "a row stored before `sequence_by` was configured has no sequence")."""

    q = quote

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
            kept = f"array_contains(s.{q(UNAVAILABLE)}, {literal(c)}) AND NOT ({was_deleted} OR {reset})"
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
    from_struct = "named_struct(" + ", ".join(f"{literal(c)}, {picked[c][1]}" for c in fields) + ")" if fields else None
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
