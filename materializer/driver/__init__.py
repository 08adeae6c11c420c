"""The Delta driver: stage each epoch to Parquet, then idempotently apply it with Delta's txn ids.

The driver answers the protocol's messages (validate before Open, open, load, flush, store,
prestage, start_commit, acknowledge) and delegates: the staged datasets to
:class:`materializer.staging.StagingArea` (``staged/epoch-<epoch>/<binding>-<random>/``, a Parquet
dataset written by Spark, named in the driver checkpoint with its row count, file count and byte
size), the Delta writes to :class:`materializer.merge.DeltaWriter`. What it keeps is the checks:
the tables against the log at Open, the epoch's rows against the table before StartCommit
(invariant 9). StartCommit stages and checks the bindings side by side, and Acknowledge applies
them side by side, ``transaction.parallel_bindings`` at a time (:func:`materializer.side_by_side.run_each`;
``1``: in binding order, one after another), each apply thread in an apply session of its own:

* standard mode: ``MERGE`` by key, ``WHEN MATCHED AND s._op = 'd' THEN DELETE``, ``WHEN MATCHED
  THEN UPDATE`` (the whole row), ``WHEN NOT MATCHED AND s._op <> 'd' THEN INSERT``;
* delta-updates mode: append.

Every commit carries ``txnAppId`` = pipeline id and ``txnVersion`` = epoch, so Delta itself skips a
replay; we check the table's recorded txn version first, so a replay costs a Delta log read and
no data scan.

Acknowledge may run on a background thread while the runtime reads the next transaction (seed
000's pipelining). It therefore works in a SparkSession of its own (:func:`isolated_session`:
``newSession()`` on classic Spark, ``cloneSession()`` on Spark Connect), because Delta's
``txnAppId``/``txnVersion``/``userMetadata`` are session confs: no other Spark work can commit
under the epoch's txn id while the MERGE runs. Only DataFrame and SQL calls (``MERGE INTO``), so
the same code runs on classic Spark and Spark Connect.
Meanwhile the runtime may :meth:`DeltaDriver.prestage` the next epoch's rows of bindings that
need no loads; nothing is read from a table before Acknowledged.

The package, one job a module: :mod:`~materializer.driver.delta_driver` (the :class:`DeltaDriver`:
the protocol's messages, staging, the applies), :mod:`~materializer.driver.open_checks` (the
tables against the configuration and the log, before Open and at Open) and
:mod:`~materializer.driver.table_fit` (the epoch's rows against their tables before StartCommit).
"""

from __future__ import annotations

from materializer.driver.delta_driver import SCHEDULER_POOL, DeltaDriver
from materializer.driver.open_checks import OpenChecks
from materializer.driver.table_fit import CONSTRAINT_PREFIX, REFUSED_NAME_CHARACTERS, TableFacts, TableFit

__all__ = [
    "CONSTRAINT_PREFIX", "REFUSED_NAME_CHARACTERS", "SCHEDULER_POOL", "DeltaDriver", "OpenChecks", "TableFacts", "TableFit",
]
