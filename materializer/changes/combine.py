"""The combine of change-controlled rows: per key, the change with the highest order (scd2: per version)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.changes.hidden import FROM, RESET, SEQUENCE, UNAVAILABLE
from materializer.changes.prepare import prepare
from materializer.changes.scd2 import scd2_combine
from materializer.columns import OP, SEQ
from materializer.config import BindingConfig
from materializer.delta import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


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
