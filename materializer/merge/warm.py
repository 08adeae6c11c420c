"""A table's new snapshot read ahead, while a following run waits for its next epoch.

Every MERGE first needs the table's latest snapshot: the files of the version our last apply
committed, which Delta reconstructs from the log in a Spark job of its own (three stages) the first
time that version is read, and then keeps cached. A following run (``materializer run --follow``)
spends most of its time waiting for input, so when its poll finds nothing new, each table applied
since the last wait (at the first wait after a start, each table with rows) gets from
:class:`SnapshotWarmer` a planned read (``EXPLAIN SELECT *``: Delta lists the files, nothing is
read or returned) on a thread of its own: the snapshot is reconstructed in the wait, and the next
epoch's MERGE starts from it. Measured in docs/performance.md ("Freshness"): the apply of a
one-document epoch 0.92-1.01 → 0.67-0.70 s (p50).

Only what the next MERGE would do anyway, moved earlier: nothing is written, and a failure (the
table dropped meanwhile, the session stopped) is ignored, since the MERGE reads the table again.
Not in runs that drain their sources: there the next epoch follows at once and two cores are
already busy (the same one-row epochs took as long with it), and the last epoch's would be waste.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from materializer.delta import TableRef, sql_name
from materializer.progress import Collector

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class SnapshotWarmer:
    """Reads ahead the snapshots of tables just applied, one table at a time on a thread of its
    own; :meth:`close` drops what has not started and waits for what has."""

    def __init__(self, collector: Collector | None = None) -> None:
        self.collector = collector or Collector()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="materializer-warm")
        self._lock = threading.Lock()
        self._queued: dict[str, Future[None]] = {}
        self._closed = False
        self._spark: "SparkSession | None" = None

    def warm(self, spark: "SparkSession", table: TableRef, epoch: int, binding: str) -> None:
        """Plan a read of ``table`` in ``spark``, soon; a table already waiting is not queued twice."""
        with self._lock:
            if self._closed or table.location in self._queued:
                return
            self._queued[table.location] = self._executor.submit(self._warm, spark, table, epoch, binding)

    def drop_queued(self) -> None:
        """An epoch's applies begin: the warms not started are dropped (the one running ends),
        so reading ahead never competes with the applies beyond one table."""
        with self._lock:
            for future in self._queued.values():
                future.cancel()
            self._queued.clear()

    def _warm(self, spark: "SparkSession", table: TableRef, epoch: int, binding: str) -> None:
        with self._lock:
            self._queued.pop(table.location, None)
        try:
            with self.collector.span("warm_snapshot", epoch, binding):
                plan = self._session(spark).sql(f"EXPLAIN SELECT * FROM {sql_name(table)}").collect()
                if plan and str(plan[0][0]).startswith("Error occurred during query planning"):
                    raise RuntimeError(str(plan[0][0]).splitlines()[-1])  # EXPLAIN says a failure in its text
        except Exception as exc:  # noqa: BLE001 - a head start only; the MERGE reads the table itself
            log.debug("reading ahead the snapshot of %s failed: %s", table.location, exc)

    def _session(self, spark: "SparkSession") -> "SparkSession":
        """A session of the warmer's own beside the first ``spark`` (its cluster, Delta's cache of logs),
        running its queries interpreted (:data:`~materializer.spark.settings.INTERPRETED`): the
        reconstruction of a snapshot is a few small jobs, whose generated code would cost more to
        compile than it saves; the session's own settings stay as they are."""
        if self._spark is None:  # one for the run: Delta's cache of logs is the JVM's, whichever session reads
            from materializer.spark import isolated_session
            from materializer.spark.settings import INTERPRETED

            session = isolated_session(spark)
            if session is not spark:  # not where the session is shared (pyspark 4.0's Connect client)
                for key, value in INTERPRETED.items():
                    try:
                        session.conf.set(key, value)
                    except Exception:  # noqa: BLE001 - a compute that refuses a conf keeps its own
                        pass
            self._spark = session
        return self._spark

    def close(self) -> None:
        """Drop the warms not started, wait for the one running (a planning job, under a second
        for a small table), so nothing of this run reads a table after it returns."""
        with self._lock:
            self._closed = True
        self.drop_queued()
        self._executor.shutdown(wait=True)
