"""Mode scd2: every version of a key, its events folded into versions, and the MERGE that writes them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import sqltypes
from materializer.changes.hidden import CURRENT, DELETED, END_AT, HIDDEN, SEQUENCE, START_AT
from materializer.changes.prepare import prepare
from materializer.changes.sequence import sequence_name
from materializer.columns import OP, SEQ
from materializer.config import BindingConfig
from materializer.delta import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

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

    q = quote

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
