"""The runtime: the transaction loop of DESIGN.md, driving a driver through the seed's phases.

::

    validate    the driver checks the configuration (before the log, so nothing is fenced)
    Open        read the log's last commit (epoch N); publish a fencing entry
    Opened      the driver checks the tables against the log, deletes orphaned staged files
    loop:
      Acknowledge N                   apply epoch N, on a background thread (on the first loop:
                                      the re-apply after Open)
      meanwhile: read the sources' next batch; combine and prestage the rows of bindings that
                 need no loads (they do not depend on the table)
      Acknowledged                    wait for the apply; if there was no batch: stop (or wait,
                                      with --follow)
      Load* / Flush -> Flushed        current rows of the batch's keys (standard mode, reductions)
      Store*                          the reduced rows of epoch N+1
      StartCommit -> StartedCommit    the driver stages them durably
      commit entry N+1 = {runtime checkpoint, driver checkpoint} to the recovery log

This is seed 000's pipelining: the driver applies epoch N in the background while the runtime
reads and combines N+1; Flush (so every load) and the log commit of N+1 wait for Acknowledged,
which keeps loads read-committed and the log one epoch ahead of the tables at most. With
``transaction.pipelined: false`` the apply runs in the foreground, before the next read.

:class:`BackgroundApply` is the apply thread; :class:`EpochStager` is one epoch's staging (read,
Load*/Flush, Store*, StartCommit, verify), which ``recover`` reuses to re-stage a lost epoch.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from materializer import crash, events, reductions
from materializer.config import PipelineConfig
from materializer.delta import quote
from materializer.driver import DeltaDriver
from materializer.errors import ApplyError, ConfigError, FencedError
from materializer.progress import Collector, ProgressTracker, utc_now
from materializer.protocol import (
    Acknowledge,
    Acknowledged,
    Driver,
    DriverCheckpoint,
    Flush,
    Load,
    Open,
    StartCommit,
    StartedCommit,
    Store,
)
from materializer.recovery_log import LogEntry, RecoveryLog
from materializer.sources import Source, SourceBatch
from materializer.sources.formats import open_source
from materializer.staging import StagingArea
from materializer.storage import open_store
from materializer import templates

if TYPE_CHECKING:
    from materializer.sources.kafka_routes import KafkaRouter
    from pyspark.sql import DataFrame, SparkSession


KEEP_ALIVE_SECONDS = 300.0
"""How often a following run with nothing to read touches its Spark sessions
(:meth:`~materializer.protocol.Driver.keep_alive`): well inside a Spark Connect server's session
timeout (an hour by default), at one config read per session."""


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

    @property
    def documents(self) -> int:
        """Documents read by the run, all bindings."""
        return sum(sum(e.documents.values()) for e in self.epochs)

    def to_dict(self) -> dict[str, Any]:
        """The run's summary as JSON fields, built here once: ``materializer run --json`` prints it,
        and it is the ``finished`` line of ``--events jsonl`` and of the Databricks job."""
        return {
            "pipeline_id": self.pipeline_id,
            "opened_at_epoch": self.opened_at_epoch,
            "last_epoch": self.last_epoch,
            "epochs": len(self.epochs),
            "documents": self.documents,
            "reapplied": self.reapplied.model_dump() if self.reapplied else None,
            "seconds": round(self.seconds, 3),
        }


@contextmanager
def _explained(batches: dict[str, SourceBatch]) -> Iterator[None]:
    """Let each batch's source name the file and line behind a Spark failure on its input."""
    try:
        yield
    except Exception as exc:
        for batch in batches.values():
            explained = batch.explain(exc) if batch.explain is not None else None
            if explained is not None:
                raise explained from exc
        raise


class BackgroundApply:
    """Acknowledge on a thread of its own (seed 000's pipelining): epoch N is applied while the
    runtime reads N+1. At most one apply is under way; :meth:`wait` is the Acknowledged.
    Not pipelined (``transaction.pipelined: false``), :meth:`start` waits for the apply itself."""

    def __init__(self, acknowledge: Callable[[int, DriverCheckpoint, bool], Acknowledged], *, pipelined: bool) -> None:
        self._acknowledge = acknowledge
        self._pipelined = pipelined
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="materializer-apply")
        self._running: tuple[Future[Acknowledged], Callable[[Acknowledged], None]] | None = None

    @property
    def running(self) -> bool:
        """An Acknowledge was started and not waited for."""
        return self._running is not None

    def start(self, epoch: int, checkpoint: DriverCheckpoint, *, first: bool, report: Callable[[Acknowledged], None]) -> None:
        """Acknowledge ``epoch``; ``report`` gets its Acknowledged when it is waited for."""
        assert self._running is None, "one apply at a time (DESIGN invariant 2)"
        self._running = (self._executor.submit(self._acknowledge, epoch, checkpoint, first), report)
        if not self._pipelined:
            self.wait()

    def wait(self) -> None:
        """Acknowledged: wait for the running Acknowledge, if any; its error, if any, is raised here."""
        if self._running is None:
            return
        (future, report), self._running = self._running, None
        report(future.result())

    def close(self) -> None:
        """Leaving (on an error too): let a running apply finish (a committed epoch), quietly."""
        if self._running is not None:
            future, self._running = self._running[0], None
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - the error already being raised wins
                pass
        self._executor.shutdown(wait=True)


class EpochStager:
    """Stage one epoch, the runtime's way and ``recover``'s: read the sources' batches, then
    Load* / Flush, Store*, StartCommit, and verify what the sources deferred to the staging job.
    What it returns is ready for the recovery log; committing it is the caller's."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: "SparkSession",
        driver: Driver,
        sources: "dict[str, Source]",
        staging_area: StagingArea,
        writer: str,
        collector: Collector,
    ) -> None:
        self.config = config
        self.spark = spark
        self.driver = driver
        self.sources = sources
        self.staging_area = staging_area
        self.writer = writer
        """The log writer's id: names this writer's spool."""
        self.collector = collector
        self._unread: dict[str, dict[str, Any]] = {}
        """Read events of batches whose checks run with their staging (sent once verified)."""

    def read(self, epoch: int, checkpoint: dict[str, Any], *, until: dict[str, Any] | None = None) -> dict[str, SourceBatch]:
        """Each binding's next batch after ``checkpoint`` (``until``: recover's re-read of a
        committed epoch takes exactly the extent it ended at); a binding with nothing new has none."""
        batches = {}
        self._unread = {}
        for binding in self.config.bindings:
            began, at = time.monotonic(), utc_now()
            with self.collector.span("read", epoch, binding.name):
                batch = self.sources[binding.name].next_batch(
                    self.spark,
                    checkpoint.get(binding.name),
                    self.config.transaction.max_documents,
                    f"{StagingArea.spool(self.writer, epoch)}/{binding.name}.jsonl",
                    **({"until": until.get(binding.name)} if until is not None else {}),
                )
            if batch is not None:
                batches[binding.name] = batch
                read = {"epoch": epoch, "binding": binding.name, "seconds": time.monotonic() - began, "at": at}
                if batch.verify is not None:
                    # Its count is known once staged: the event is sent by verify.
                    self._unread[binding.name] = read
                else:
                    self._read_event(batch, read)
        return batches

    def prestage(self, epoch: int, batches: dict[str, SourceBatch]) -> dict[str, "DataFrame"]:
        """Combine and stage, before Acknowledged, the rows of bindings whose rows need no table."""
        if not self.config.transaction.pipelined:
            return {}
        prestaged = {}
        with _explained(batches), self.collector.span("prestage", epoch):
            for name, batch in batches.items():
                binding = self.config.binding(name)
                if reductions.independent_of_table(binding):
                    rows = reductions.reduce(batch.documents, None, binding)
                    self.driver.prestage(Store(binding=name, documents=rows), epoch)
                    prestaged[name] = rows
        return prestaged

    def stage(
        self,
        epoch: int,
        batches: dict[str, SourceBatch],
        runtime_checkpoint: dict[str, Any],
        rewind: dict[str, Any],
        *,
        prestaged: "dict[str, DataFrame] | None" = None,
        only: "set[str] | None" = None,
    ) -> StartedCommit:
        """After Acknowledged: Load* / Flush, Store*, StartCommit, verify. ``only``: the bindings to
        stage (recover's re-staging; None: every binding with a batch)."""
        from pyspark.sql import functions as F

        names = [name for name in batches if only is None or name in only]
        prestaged = prestaged or {}
        with _explained(batches):
            # --- Load / Flush / Loaded / Flushed ---
            for name in names:
                binding = self.config.binding(name)
                if binding.needs_loads:
                    keys = batches[name].documents.select(*[F.col(quote(k)) for k in binding.key])
                    self.driver.load(Load(binding=name, keys=keys))
            flushed = self.driver.flush(Flush())
            loaded = {item.binding: item.rows for item in flushed.loaded}

            # --- Store ---
            for name in names:
                batch = batches[name]
                rows = prestaged.get(name)
                if rows is None:
                    rows = reductions.reduce(batch.documents, loaded.get(name), self.config.binding(name))
                self.driver.store(Store(binding=name, documents=rows, rejected=batch.rejected))

            # --- StartCommit / StartedCommit ---
            with self.collector.span("start_commit", epoch):
                started = self.driver.start_commit(StartCommit(epoch=epoch, runtime_checkpoint=runtime_checkpoint, rewind=rewind))
        with self.collector.span("verify", epoch):
            self.verify(batches, started)
        self.staging_area.delete_spool(self.writer, epoch)
        return started

    def verify(self, batches: dict[str, SourceBatch], started: StartedCommit) -> None:
        """The checks a source deferred to the staging job, now that it has run: a refusal deletes
        the epoch's staged files (no entry references them) and commits nothing."""
        try:
            for batch in batches.values():
                if batch.verify is not None:
                    batch.count = batch.verify()
        except BaseException:
            self.staging_area.discard(started.driver_checkpoint.staged.values())
            raise
        finally:
            unread, self._unread = self._unread, {}
        for name, read in unread.items():
            self._read_event(batches[name], read)

    def _read_event(self, batch: SourceBatch, read: dict[str, Any]) -> None:
        self.collector.emit(
            events.Read(
                **read,
                documents=batch.count,
                extent=batch.description,
                # Optional fields of SourceBatch (a source that does not know leaves them out).
                bytes=getattr(batch, "bytes", None),
                lag=getattr(batch, "lag", None),
                dead_letters=getattr(batch, "rejected_count", 0) or 0,
            )
        )


def advanced(checkpoint: dict[str, Any], batches: dict[str, SourceBatch]) -> dict[str, Any]:
    """The runtime checkpoint after ``batches``: each read binding's new position, the others' as they were."""
    return {**checkpoint, **{name: batch.checkpoint for name, batch in batches.items()}}


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
        self.log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id, retention=config.log_retention)
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
        touched = time.monotonic()  # when the driver's sessions last had work or a keep-alive
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
                    if time.monotonic() - touched >= KEEP_ALIVE_SECONDS:
                        self.driver.keep_alive()  # a Connect server closes sessions idle for an hour
                        touched = time.monotonic()
                    time.sleep(self.config.transaction.poll_interval_seconds)
                    continue
                touched = time.monotonic()

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



class TemplatedRuntime:
    """The transaction loop of a pipeline with binding templates (docs: 'Binding templates').

    Runs :class:`Runtime` in rounds over the bindings the templates make. A round's bindings are
    those found (topics, sub-folders) plus those the last committed epoch covered (its driver
    checkpoint's ``templated``), so the re-apply after Open covers the same set as the epoch. At
    every epoch boundary the topics and folders are looked for again; when they changed, the round
    ends there (its last epoch applied) and the next one opens with the new set: a new topic or
    folder is a new binding, read from its start (``starting``). One no longer found is made only
    for its re-apply (a round of no new epoch), then stops the run (``on_missing: fail``) or is
    left out from the next epoch on (``drop``)."""

    def __init__(self, config: PipelineConfig, spark: "SparkSession", collector: Collector | None = None) -> None:
        self.config = config
        self.spark = spark
        self.collector = collector
        self.log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
        """Read only, to learn what the last committed epoch covered: each round's Runtime opens its own."""
        self.routers: dict[int, KafkaRouter] = {}
        """Per ``route_by`` template (one topic, many tables): its topic's shared position and fixed plan."""
        if any(t.source.route_by is not None for t in config.templates):
            from materializer.sources.kafka_routes import KafkaRouter

            spool = open_store(config.staging_root)
            self.routers = {i: KafkaRouter(config, i, spool) for i, t in enumerate(config.templates) if t.source.route_by is not None}

    def _routed(self, state: Any) -> dict[int, list[str]]:
        """Per ``route_by`` template, the tables the next epoch's records name (its plan fixed
        from the topic's position after the last committed epoch)."""
        recorded = templates.recorded_set(state.last_commit)
        checkpoint = (state.last_commit.runtime_checkpoint if state.last_commit is not None else None) or {}
        out = {}
        for index, router in self.routers.items():
            template = self.config.templates[index]
            names = [
                name for name, source in recorded.items()
                if source.startswith("route:") and templates.values_for(template, source.removeprefix("route:")) is not None
            ]
            position = router.shared_position({name: checkpoint.get(name) for name in names})
            out[index] = router.fix(self.spark, state.last_epoch, position)
        return out

    def run(self, *, follow: bool = False, max_epochs: int | None = None, should_stop: Callable[[], bool] | None = None) -> RunSummary:
        """As :meth:`Runtime.run`, over the bindings the templates make, round after round."""
        total: RunSummary | None = None
        dropped: set[str] = set()
        began = time.monotonic()
        while True:
            state = self.log.read()
            found = templates.discover(self.config)
            listed = dict(found)
            found.update(self._routed(state))
            expansion = templates.expand(
                self.config, found, templates.recorded_set(state.last_commit), dropped=dropped, epoch=state.last_epoch
            )
            done = len(total.epochs) if total is not None else 0
            remaining = None if max_epochs is None else max(0, max_epochs - done)
            if expansion.missing:
                remaining = 0  # Open and the re-apply of the last epoch (which covers them) only
            changed = {"found": False}

            def stop_between(listed: dict[int, list[str]] = listed, made: dict[str, templates.Made] = expansion.made) -> bool:
                if should_stop is not None and should_stop():
                    return True
                if self.routers:
                    # A table the next epoch's records name first: a binding from that epoch on.
                    covered = {m.source for m in made.values()}
                    if any(f"route:{text}" not in covered for texts in self._routed(self.log.read()).values() for text in texts):
                        changed["found"] = True
                        return True
                if templates.discover(self.config) != listed:
                    changed["found"] = True  # ends this round at this epoch boundary
                    return True
                return False

            sources = None
            if expansion.missing or self.routers:
                # Gone topics or folders: a round of no new epoch reads no source. Routed tables:
                # their topic's plan, fixed by its router, shared.
                staging = open_store(expansion.config.staging_root)
                sources = {b.name: self._source(b, expansion, staging) for b in expansion.config.bindings}
            runtime = Runtime(expansion.config, self.spark, self.collector, sources=sources, covered=expansion.covered)
            summary = runtime.run(follow=follow, max_epochs=remaining, should_stop=stop_between)
            if total is None:
                total = summary
            else:
                total.epochs.extend(summary.epochs)
                total.last_epoch = summary.last_epoch
                total.orphans_deleted += summary.orphans_deleted
            if expansion.missing:
                failing = {n: m for n, m in expansion.missing.items() if self.config.templates[m.template].on_missing == "fail"}
                if failing:
                    raise templates.missing_error(
                        templates.Expansion(expansion.config, expansion.made, failing), summary.last_epoch, self.config
                    )
                dropped |= set(expansion.missing)
                continue
            if not changed["found"] or (should_stop is not None and should_stop()):
                break
            if max_epochs is not None and len(total.epochs) >= max_epochs:
                break
        total.seconds = time.monotonic() - began
        return total

    def _source(self, binding: Any, expansion: templates.Expansion, staging: Any) -> Source:
        made = expansion.made.get(binding.name)
        if binding.name in expansion.missing:
            return _Gone(binding, staging)
        if made is not None and made.template in self.routers:
            return self.routers[made.template].source_for(binding, staging, made.source.removeprefix("route:"))
        return open_source(binding, staging)


class _Gone(Source):
    """The source of a binding whose topic or folder is no longer found: never read (its round
    only re-applies the last committed epoch)."""

    def next_batch(self, *args: Any, **kwargs: Any) -> SourceBatch | None:
        raise AssertionError(f"binding {self.binding.name}: its source is gone and must not be read")


def open_runtime(config: PipelineConfig, spark: "SparkSession", collector: Collector | None = None) -> "Runtime | TemplatedRuntime":
    """The transaction loop for ``config``: a :class:`TemplatedRuntime` when it has templates."""
    if config.templates:
        return TemplatedRuntime(config, spark, collector)
    return Runtime(config, spark, collector)


def as_recorded(config: PipelineConfig) -> PipelineConfig:
    """The bindings of ``config`` with those its templates made for the recovery log's last
    committed epoch (``status``, ``recover``): no broker or folder is asked. A pipeline without
    templates is returned as it is."""
    if not config.templates:
        return config
    state = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read()
    recorded = templates.recorded_set(state.last_commit)
    if not recorded and not config.bindings:
        raise ConfigError(
            f"pipeline {config.pipeline_id!r} has only templates and no committed epoch that covers a binding yet: "
            "run it first"
        )
    return templates.expand(config, {}, recorded, epoch=state.last_epoch).config
