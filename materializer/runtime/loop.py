"""The transaction loop of one pipeline (:class:`Runtime`): Open, then per epoch read, stage, log-commit, apply."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from materializer import crash, events, reductions
from materializer.config import PipelineConfig
from materializer.driver import DeltaDriver
from materializer.errors import ApplyError, ConfigError, FencedError
from materializer.progress import Collector, ProgressTracker, utc_now
from materializer.protocol import Acknowledge, Acknowledged, Driver, DriverCheckpoint, Open, StartedCommit
from materializer.recovery_log import LogEntry, RecoveryLog, binding_keys
from materializer.runtime.apply import BackgroundApply, KeepAlive
from materializer.runtime.stager import EpochStager, advanced
from materializer.runtime.summary import EpochSummary, RunSummary
from materializer.sources import Source
from materializer.sources.formats import open_source
from materializer.staging import StagingArea
from materializer.storage import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


KEEP_ALIVE_SECONDS = 300.0
"""How often a run touches its driver's Spark sessions, busy or not
(:meth:`~materializer.protocol.Driver.keep_alive`, on a thread of its own): well inside a Spark
Connect server's session timeout (an hour by default), at one config read per session."""


class Runtime:
    """The transaction loop of one pipeline: Open, then per epoch read, stage, log-commit and apply
    (the apply of epoch N in the background while N+1 is read), until the sources are drained.

    Embedding it is what ``materializer run`` does::

        config = load_config("conf/orders-to-delta.yaml")
        summary = Runtime(config, spark).run()

    Every failure it foresees is a :class:`materializer.errors.MaterializerError` whose
    ``exit_code`` the command line exits with.
    """

    def __init__(
        self,
        config: PipelineConfig,
        spark: "SparkSession",
        collector: Collector | None = None,
        *,
        driver: Driver | None = None,
        sources: "dict[str, Source] | None" = None,
        covered: dict[str, str] | None = None,
    ) -> None:
        """``driver``, ``sources``: others than the Delta driver and the configured sources (tests).
        ``covered``: the bindings made from templates (name -> topic or folder) each new epoch
        covers, recorded in its driver checkpoint (:class:`TemplatedRuntime`)."""
        if config.templates:
            raise ConfigError(
                "this pipeline has binding templates: they are expanded by materializer run (TemplatedRuntime, "
                "open_runtime), which this command does not do yet; give its bindings one by one to use it"
            )
        self.config = config
        self.covered = covered
        self.spark = spark
        # Every consumer also gets one `progress` record per applied epoch, folded from the events.
        self.collector = ProgressTracker(collector or Collector(), config.pipeline_id)
        self.staging = open_store(config.staging_root)
        self.staging_area = StagingArea.of(config, self.staging)
        # With each binding's key: an entry whose key bounds name other columns is refused as it is read.
        self.log = RecoveryLog(
            open_store(config.recovery_log), config.pipeline_id, retention=config.log_retention, keys=binding_keys(config.bindings)
        )
        self.driver: Driver = driver or DeltaDriver(spark, config, self.staging, self.collector, fence_check=self._fence_check)
        self.sources = sources if sources is not None else {b.name: open_source(b, self.staging) for b in config.bindings}
        for source in self.sources.values():
            source.defer_checks = True  # the stager's verify runs their deferred checks before each commit
        self.stager = EpochStager(config, spark, self.driver, self.sources, self.staging_area, self.log.writer, self.collector)
        for binding in config.bindings:
            if binding.mode == "standard":
                reductions.check_supported(binding)

    def run(self, *, follow: bool = False, max_epochs: int | None = None, should_stop: Callable[[], bool] | None = None) -> RunSummary:
        """Open the pipeline, re-apply what the last run left, then run epochs until the sources are
        drained (with ``follow``, keep polling every ``transaction.poll_interval_seconds`` instead).
        Stops after ``max_epochs`` new epochs (0: Open and the re-apply only), or once
        ``should_stop`` returns true, between transactions. Returns what was committed and applied."""
        started = time.monotonic()
        # Before the log is opened (so a wrong configuration fences no running writer).
        self.driver.validate()
        # --- Open / Opened: the fencing entry; the driver checks the tables, deletes orphans ---
        state = self.log.open()
        epoch = state.last_epoch
        last = _renamed(state.last_commit, self.config)
        summary = RunSummary(pipeline_id=self.config.pipeline_id, opened_at_epoch=epoch)
        self.collector.emit(events.Opened(pipeline=self.config.pipeline_id, epoch=epoch, writer=self.log.writer))
        driver_checkpoint = last.driver_checkpoint if last else None
        opened = self.driver.open(Open(pipeline_id=self.config.pipeline_id, last_epoch=epoch, driver_checkpoint=driver_checkpoint))
        summary.orphans_deleted = opened.orphans_deleted
        runtime_checkpoint: dict[str, Any] = dict(
            opened.runtime_checkpoint or (last.runtime_checkpoint if last and last.runtime_checkpoint else {})
        )

        pending: DriverCheckpoint | None = driver_checkpoint
        current: EpochSummary | None = None
        applier = BackgroundApply(self._acknowledge, pipelined=self.config.transaction.pipelined)
        keep_alive = KeepAlive(self.driver.keep_alive, KEEP_ALIVE_SECONDS).start()
        try:
            while True:
                # --- Acknowledge epoch N (on the first loop: the re-apply after Open) ---
                if pending is not None:
                    report = _into(summary, "reapplied") if current is None else _into(current, "acknowledged")
                    applier.start(epoch, pending, first=current is None, report=report)
                    pending = None
                if (max_epochs is not None and len(summary.epochs) >= max_epochs) or (should_stop is not None and should_stop()):
                    applier.wait()
                    break

                # --- read epoch N+1, while N is applied ---
                next_epoch = epoch + 1
                try:
                    batches = self.stager.read(next_epoch, runtime_checkpoint)
                    staging_began = time.monotonic()
                    prestaged = self.stager.prestage(next_epoch, batches)
                    stage_seconds = time.monotonic() - staging_began
                except BaseException:
                    # Epoch N is committed: finish applying it before reporting the read's error
                    # (an error of the apply, a fence say, is the one raised then).
                    applier.wait()
                    raise
                # --- Acknowledged ---
                applier.wait()
                if not batches:
                    if not follow:
                        break
                    self.driver.idle()
                    time.sleep(self.config.transaction.poll_interval_seconds)
                    continue

                # --- Load* / Flush, Store*, StartCommit -> StartedCommit ---
                staging_began = time.monotonic()
                new_checkpoint = advanced(runtime_checkpoint, batches)
                started_commit = self.stager.stage(
                    next_epoch, batches, new_checkpoint, rewind=runtime_checkpoint, prestaged=prestaged
                )
                stage_seconds += time.monotonic() - staging_began
                if self.covered is not None:
                    # Which bindings made from templates this epoch covers: a replay covers these.
                    started_commit = StartedCommit(
                        driver_checkpoint=started_commit.driver_checkpoint.model_copy(update={"templated": dict(self.covered)})
                    )
                crash.crash_point("after-started-commit", next_epoch)

                # --- commit entry N+1 = {runtime checkpoint, driver checkpoint} to the recovery log ---
                committing = time.monotonic()
                self._log_commit(next_epoch, new_checkpoint, started_commit)
                log_commit_seconds = time.monotonic() - committing
                epoch, runtime_checkpoint, pending = next_epoch, new_checkpoint, started_commit.driver_checkpoint
                current = EpochSummary(
                    epoch=epoch,
                    documents={n: b.count for n, b in batches.items()},
                    description={n: b.description for n, b in batches.items()},
                )
                summary.epochs.append(current)
                staged_files = started_commit.driver_checkpoint.staged
                self.collector.emit(
                    events.Committed(
                        epoch=epoch,
                        documents=sum(current.documents.values()),
                        at=utc_now(),
                        staged={n: (f.rows, f.bytes) for n, f in staged_files.items() if f is not None},
                        stage_seconds=stage_seconds,
                        log_commit_seconds=log_commit_seconds,
                    )
                )
        except FencedError:
            raise
        except Exception as exc:
            # A zombie (paused while reading epoch N+1, resumed after a newer run's Open deleted
            # its spool) fails on vanished files: say it is fenced, not what Spark saw.
            if not applier.running:
                self.log.check_not_fenced(epoch, cause=exc, doing=f"reading epoch {epoch + 1}")
            raise
        finally:
            applier.close()
            keep_alive.stop()
            # Prestaged files a StartCommit did not adopt belong to no entry: remove them now.
            self.driver.discard_prestaged()
            # This writer's own spool (a failed or fenced read leaves one): nobody else's files.
            self.staging_area.delete_spool(self.log.writer)
            self.driver.close()
        summary.last_epoch = epoch
        summary.seconds = time.monotonic() - started
        return summary

    def _acknowledge(self, epoch: int, checkpoint: DriverCheckpoint, first: bool) -> Acknowledged:
        """Acknowledge -> Acknowledged, on the apply thread; an apply's failure recorded for `status`."""
        began = time.monotonic()
        try:
            result = self.driver.acknowledge(Acknowledge(epoch=epoch, driver_checkpoint=checkpoint))
        except Exception as exc:
            # A zombie (paused, then resumed) finds its staged files deleted by the newer
            # writer that applied them: say it is fenced, not what Spark saw.
            self.log.check_not_fenced(epoch, cause=exc)
            if isinstance(exc, ApplyError):
                # Stuck: recorded so `status` can say which epoch, binding and error.
                self.log.record_failure(exc.epoch, exc.binding, str(exc))
            raise
        if first:
            self.log.clear_failures(epoch)
        # Sent from the applying thread, so its time is when the apply ended, not when the
        # runtime next looked.
        self.collector.emit(events.Acknowledged(epoch=epoch, first=first, seconds=time.monotonic() - began, at=utc_now()))
        return result

    def _log_commit(self, epoch: int, runtime_checkpoint: dict[str, Any], started: StartedCommit) -> None:
        def mid_commit(e: int = epoch) -> None:
            crash.crash_point("mid-log-commit", e)

        try:
            with self.collector.span("log_commit", epoch):
                self.log.commit(epoch, runtime_checkpoint, started.driver_checkpoint, before_publish=mid_commit)
        except FencedError:
            # Not committed, so our staged files are nobody's: remove them before stopping.
            self.staging_area.discard(started.driver_checkpoint.staged.values())
            raise
        # crash here leaves the entry committed but unapplied: the next Open re-applies it
        crash.crash_point("after-log-commit", epoch)

    def _fence_check(self) -> None:
        self.log.check_holding("deleting staged files")


def _into(target: Any, attribute: str) -> Callable[[Acknowledged], None]:
    """Where an Acknowledged is reported: the run's re-apply, or the epoch's summary."""
    return lambda result: setattr(target, attribute, result)


def _renamed(entry: LogEntry | None, config: PipelineConfig) -> LogEntry | None:
    """The last commit with renamed bindings' state under their new names (``previous_names``)."""
    if entry is None:
        return None
    runtime = dict(entry.runtime_checkpoint or {})
    driver = entry.driver_checkpoint
    staged = dict(driver.staged) if driver else {}
    dead = dict(driver.dead_letters) if driver else {}
    written = set(driver.written) if driver else set()
    changed = False
    for binding in config.bindings:
        for old in binding.previous_names:
            if old in runtime and binding.name not in runtime:
                runtime[binding.name] = runtime.pop(old)
                changed = True
            if old in staged and binding.name not in staged:
                staged[binding.name] = staged.pop(old)
                changed = True
            if old in dead and binding.name not in dead:
                dead[binding.name] = dead.pop(old)
                changed = True
            if old in written:
                written = (written - {old}) | {binding.name}
                changed = True
    if not changed:
        return entry
    update: dict[str, Any] = {"runtime_checkpoint": runtime}
    if driver is not None:
        update["driver_checkpoint"] = driver.model_copy(
            update={"staged": staged, "dead_letters": dead, "written": sorted(written)}
        )
    return entry.model_copy(update=update)
