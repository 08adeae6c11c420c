"""The runtime: the transaction loop of DESIGN.md, driving a driver through the seed's phases.

::

    Open        read the log's last commit (epoch N); publish a fencing entry
    Opened      the driver deletes orphaned staged files
    loop:
      Acknowledge N -> Acknowledged   apply epoch N (on the first loop: the re-apply after Open)
      read the sources' next batch; if none: stop (or wait, with --follow)
      Load* / Flush -> Flushed        current rows of the batch's keys (standard mode, reductions)
      Store*                          the reduced rows of epoch N+1
      StartCommit -> StartedCommit    the driver stages them durably
      commit entry N+1 = {runtime checkpoint, driver checkpoint} to the recovery log
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from materializer import crash, reductions
from materializer.config import PipelineConfig
from materializer.delta import TableRef, table_state
from materializer.driver import DeltaDriver
from materializer.errors import FencedError, TableStateError
from materializer.progress import Collector
from materializer.protocol import (
    Acknowledge,
    Acknowledged,
    DriverCheckpoint,
    Flush,
    Load,
    Open,
    StartCommit,
    Store,
)
from materializer.recovery_log import RecoveryLog
from materializer.sources import SourceBatch, open_source
from materializer.storage import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class EpochSummary:
    epoch: int
    documents: dict[str, int]
    """Documents read per binding."""
    description: dict[str, str]
    acknowledged: Acknowledged | None = None


@dataclass
class RunSummary:
    pipeline_id: str
    opened_at_epoch: int
    last_epoch: int = 0
    reapplied: Acknowledged | None = None
    """What the first Acknowledge after Open did with the last run's epoch."""
    orphans_deleted: int = 0
    epochs: list[EpochSummary] = field(default_factory=list)
    seconds: float = 0.0


class Runtime:
    def __init__(self, config: PipelineConfig, spark: "SparkSession", collector: Collector | None = None) -> None:
        self.config = config
        self.spark = spark
        self.collector = collector or Collector()
        self.staging = open_store(config.staging)
        self.log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id, retention=config.log_retention)
        self.driver = DeltaDriver(spark, config, self.staging, self.collector)
        self.sources = {b.name: open_source(b, self.staging) for b in config.bindings}
        for binding in config.bindings:
            if binding.mode == "standard":
                reductions.check_supported(binding)

    def run(self, *, follow: bool = False, max_epochs: int | None = None, should_stop: Callable[[], bool] | None = None) -> RunSummary:
        started = time.monotonic()
        # --- Open ---
        state = self.log.open()
        epoch = state.last_epoch
        last = state.last_commit
        summary = RunSummary(pipeline_id=self.config.pipeline_id, opened_at_epoch=epoch)
        self.collector.event("opened", pipeline=self.config.pipeline_id, epoch=epoch, writer=self.log.writer)
        self._check_tables(epoch)
        driver_checkpoint = last.driver_checkpoint if last else None
        opened = self.driver.open(Open(pipeline_id=self.config.pipeline_id, last_epoch=epoch, driver_checkpoint=driver_checkpoint))
        summary.orphans_deleted = opened.orphans_deleted
        runtime_checkpoint: dict[str, Any] = dict(
            opened.runtime_checkpoint or (last.runtime_checkpoint if last and last.runtime_checkpoint else {})
        )

        first = True
        pending: DriverCheckpoint | None = driver_checkpoint
        current: EpochSummary | None = None
        try:
            while True:
                # --- Acknowledge / Acknowledged ---
                if pending is not None:
                    try:
                        acknowledged = self.driver.acknowledge(Acknowledge(epoch=epoch, driver_checkpoint=pending))
                    except Exception as exc:
                        # A zombie (paused, then resumed) finds its staged files deleted by the
                        # newer writer that applied them: say it is fenced, not what Spark saw.
                        self.log.check_not_fenced(epoch, cause=exc)
                        raise
                    if first:
                        summary.reapplied = acknowledged
                    elif current is not None:
                        current.acknowledged = acknowledged
                    self.collector.event("acknowledged", epoch=epoch, first=first)
                first = False
                pending = None
                if max_epochs is not None and len(summary.epochs) >= max_epochs:
                    break
                if should_stop is not None and should_stop():
                    break

                # --- read the next transaction ---
                next_epoch = epoch + 1
                batches = self._read(next_epoch, runtime_checkpoint)
                if not batches:
                    if not follow:
                        break
                    time.sleep(self.config.transaction.poll_interval_seconds)
                    continue

                # --- Load / Flush / Loaded / Flushed ---
                for name, batch in batches.items():
                    binding = self.config.binding(name)
                    if binding.needs_loads:
                        self.driver.load(Load(binding=name, keys=batch.documents.select(*binding.key)))
                flushed = self.driver.flush(Flush())
                loaded = {item.binding: item.rows for item in flushed.loaded}

                # --- Store ---
                for name, batch in batches.items():
                    binding = self.config.binding(name)
                    rows = reductions.reduce(batch.documents, loaded.get(name), binding)
                    self.driver.store(Store(binding=name, documents=rows))

                # --- StartCommit / StartedCommit ---
                new_checkpoint = dict(runtime_checkpoint)
                for name, batch in batches.items():
                    new_checkpoint[name] = batch.checkpoint
                started_commit = self.driver.start_commit(
                    StartCommit(epoch=next_epoch, runtime_checkpoint=new_checkpoint, rewind=runtime_checkpoint)
                )
                self.staging.delete_prefix(f"spool/epoch-{next_epoch:012d}")
                crash.crash_point("after-started-commit", next_epoch)

                # --- commit to the recovery log ---
                def mid_commit(e: int = next_epoch) -> None:
                    crash.crash_point("mid-log-commit", e)

                try:
                    self.log.commit(next_epoch, new_checkpoint, started_commit.driver_checkpoint, before_publish=mid_commit)
                except FencedError:
                    # Not committed, so our staged files are nobody's: remove them before stopping.
                    for staged in started_commit.driver_checkpoint.staged.values():
                        if staged is not None:
                            self.staging.delete_prefix(staged.uri)
                    raise
                # crash here leaves the entry committed but unapplied: the next Open re-applies it
                crash.crash_point("after-log-commit", next_epoch)
                epoch = next_epoch
                runtime_checkpoint = new_checkpoint
                pending = started_commit.driver_checkpoint
                current = EpochSummary(
                    epoch=epoch,
                    documents={n: b.count for n, b in batches.items()},
                    description={n: b.description for n, b in batches.items()},
                )
                summary.epochs.append(current)
                self.collector.event("committed", epoch=epoch, documents=sum(current.documents.values()))
        finally:
            self.driver.close()
        summary.last_epoch = epoch
        summary.seconds = time.monotonic() - started
        return summary

    def _read(self, epoch: int, checkpoint: dict[str, Any]) -> dict[str, SourceBatch]:
        batches = {}
        for binding in self.config.bindings:
            batch = self.sources[binding.name].next_batch(
                self.spark,
                checkpoint.get(binding.name),
                self.config.transaction.max_documents,
                f"spool/epoch-{epoch:012d}/{binding.name}.jsonl",
            )
            if batch is not None:
                batches[binding.name] = batch
                self.collector.event("read", epoch=epoch, binding=binding.name, documents=batch.count, extent=batch.description)
        return batches

    def _check_tables(self, last_epoch: int) -> None:
        """A table recording a later epoch than the log means the log was lost or swapped."""
        for binding in self.config.bindings:
            state = table_state(self.spark, TableRef(binding.table), self.config.pipeline_id)
            if state.txn_version is not None and state.txn_version > last_epoch:
                raise TableStateError(
                    f"table {binding.table} records epoch {state.txn_version} for pipeline "
                    f"{self.config.pipeline_id!r} but the recovery log {self.log.store.uri} ends at epoch "
                    f"{last_epoch}: the log was deleted or replaced. Restore the log, or give the pipeline a "
                    "new pipeline_id and new tables to start over; nothing was changed."
                )
