"""Dead letters: documents that fail the checks, set aside with where they came from and why.

With ``on_invalid: dead_letter`` a binding's epoch is committed without its invalid documents;
they are staged with the epoch (in the driver checkpoint, beside the binding's rows) and
appended to the binding's dead-letter Delta table by the epoch's apply, under the same txn id
(pipeline) and txn version (epoch) as its table: a replay after a crash skips what is already
there, so each rejected document lands exactly once. Columns:

``binding``, ``epoch``, ``source`` (the file's URI), ``line`` (1-based), ``reason`` (what the check
found, as the error of ``on_invalid: fail`` words it), ``document`` (the line as read). The kafka
source's records keep ``binding``, ``epoch``, ``source`` (the source's ``kafka://`` URI), ``topic``,
``partition``, ``offset``, ``timestamp``, ``key``, ``reason`` and ``value`` (key and value as read).
CDC v2 statements (the ``cdcv2`` source, kafka's ``cdcv2`` payload) keep the same columns as
their source's documents; only a malformed statement is a dead letter (statements that
contradict each other stop the run), and since the files, and overlapping ranges of a topic, are
read again by later epochs, the source sets a statement aside in the first epoch that reads it.

Only what a document shows alone is dead-lettered (not JSON, no key, a reserved field, a value
that does not fit ``source.schema``); documents that cannot make one table *together* (a field
that is a number in one and an object in another, without ``source.schema``) still stop the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

REASON = "__problem"
"""The checked DataFrame's column holding each document's problem (NULL: valid)."""
COLUMNS = ("binding", "epoch", "source", "line", "reason", "document")


def split(checked: "DataFrame", reason: str = REASON) -> tuple["DataFrame", "DataFrame"]:
    """The valid documents (the reason column dropped) and the invalid ones (with it)."""
    from pyspark.sql import functions as F

    good = checked.where(F.col(reason).isNull()).drop(reason)
    bad = checked.where(F.col(reason).isNotNull())
    return good, bad


def rejected_rows(bad: "DataFrame", source: "Column", line: "Column", reason: str = REASON) -> "DataFrame":
    # (the documents source's columns; the kafka source's are its reader's rejected_records)
    """The dead-letter rows of one epoch's invalid documents, before the epoch is known."""
    from pyspark.sql import functions as F

    return bad.select(
        source.alias("source"), line.cast("long").alias("line"), F.col(reason).alias("reason"), F.col("value").alias("document")
    )


def for_epoch(rejected: "DataFrame", binding: str, epoch: int) -> "DataFrame":
    """``rejected`` with the binding and the epoch it was read in, in the table's column order."""
    from pyspark.sql import functions as F

    return rejected.select(F.lit(binding).alias("binding"), F.lit(epoch).cast("long").alias("epoch"), *rejected.columns)
