"""The Delta apply: the epoch's MERGE (standard mode) or append (delta-updates), tagged with its txn id.

The package, one job a module (each imports only those listed after it):

* :mod:`~materializer.merge.writer`: :class:`DeltaWriter`, the apply of an epoch to its table: the
  table's txn version looked at, one tagged commit under :meth:`DeltaWriter.transaction`, retried on
  a conflict, skipped on a replay; truncate, dead letters, the txn confs probed and proven;
* :mod:`~materializer.merge.writes`: that one commit: CREATE, append or MERGE (:func:`merge_sql`),
  the rows aligned to the table (:func:`align`);
* :mod:`~materializer.merge.warm`: :class:`SnapshotWarmer`, a following run's tables' new snapshots
  read ahead, in the wait for the next epoch;
* :mod:`~materializer.merge.failures`: a Spark failure said in a line, the refused epoch's way out;
* :mod:`~materializer.merge.commit`: :class:`CommitProperties`, Delta's conflicts registered as types.
"""

from __future__ import annotations

from materializer.merge.commit import CONCURRENT_RETRIES, CommitProperties, register_conflict_types
from materializer.merge.writer import (
    CREATION_WAIT_ENV,
    CREATION_WAIT_SECONDS,
    DEAD_LETTER_SUFFIX,
    MATERIALIZE_SOURCE,
    DeltaWriter,
    creation_wait_seconds,
)
from materializer.merge.warm import SnapshotWarmer
from materializer.merge.writes import TableWrites, align, merge_sql

__all__ = [
    "CONCURRENT_RETRIES", "CREATION_WAIT_ENV", "CREATION_WAIT_SECONDS", "DEAD_LETTER_SUFFIX", "MATERIALIZE_SOURCE",
    "CommitProperties", "DeltaWriter", "SnapshotWarmer", "TableWrites", "align", "creation_wait_seconds", "merge_sql",
    "register_conflict_types",
]
