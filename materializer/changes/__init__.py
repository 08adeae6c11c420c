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

The package, one job a module (each imports only those listed after it):

* :mod:`~materializer.changes.combine`: the epoch's changes, one row per key (``combine``);
* :mod:`~materializer.changes.apply`: the MERGE's source, a new table's first rows, the MERGE;
* :mod:`~materializer.changes.scd2`: mode scd2's versions and their MERGE;
* :mod:`~materializer.changes.prepare`: ``delete_when`` made ``_op``, the columns that land;
* :mod:`~materializer.changes.sequence`: a document's sequence, as the documents reader reads it;
* :mod:`~materializer.changes.hidden`: the hidden columns and which of them a binding's table has.

Every name the driver, merge, reductions, the sources and tests import is re-exported here.
"""

from __future__ import annotations

from materializer.changes.apply import first_rows, merge_source, merge_sql
from materializer.changes.combine import combine, order_of
from materializer.changes.hidden import (
    CURRENT,
    DELETED,
    DELETED_AT,
    END_AT,
    FROM,
    HIDDEN,
    RESET,
    SEQUENCE,
    SEQUENCE_NUMBER,
    START_AT,
    UNAVAILABLE,
    hidden_columns,
    keeps_field_sequences,
    staged_only,
    tombstones,
)
from materializer.changes.prepare import prepare, with_deletes
from materializer.changes.scd2 import REMOVE, scd2_combine, scd2_merge_sql, scd2_start, scd2_versions, tracked_fields
from materializer.changes.sequence import json_path, sequence_column, sequence_name, sequence_rules

__all__ = [
    "CURRENT",
    "DELETED",
    "DELETED_AT",
    "END_AT",
    "FROM",
    "HIDDEN",
    "REMOVE",
    "RESET",
    "SEQUENCE",
    "SEQUENCE_NUMBER",
    "START_AT",
    "UNAVAILABLE",
    "combine",
    "first_rows",
    "hidden_columns",
    "json_path",
    "keeps_field_sequences",
    "merge_source",
    "merge_sql",
    "order_of",
    "prepare",
    "scd2_combine",
    "scd2_merge_sql",
    "scd2_start",
    "scd2_versions",
    "sequence_column",
    "sequence_name",
    "sequence_rules",
    "staged_only",
    "tombstones",
    "tracked_fields",
    "with_deletes",
]
