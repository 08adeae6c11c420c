"""One epoch's staging, the runtime's and ``recover``'s: read, Load* / Flush, Store*, StartCommit, verify."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from materializer import events, reductions
from materializer.config import PipelineConfig
from materializer.delta import quote
from materializer.progress import Collector, utc_now
from materializer.protocol import Driver, Flush, Load, StartCommit, StartedCommit, Store
from materializer.sources import Source, SourceBatch
from materializer.spark.settings import INTERPRETED, session_confs
from materializer.staging import StagingArea

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
        with _explained(batches), self.collector.span("prestage", epoch), session_confs(self.spark, job_conf(batches)):
            for name, batch in batches.items():
                binding = self.config.binding(name)
                if batch.documents is not None and reductions.independent_of_table(binding):
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
        with _explained(batches), session_confs(self.spark, job_conf(batches)):
            # --- Load / Flush / Loaded / Flushed ---
            for name in names:
                binding = self.config.binding(name)
                if binding.needs_loads and batches[name].documents is not None:
                    keys = batches[name].documents.select(*[F.col(quote(k)) for k in binding.key])
                    self.driver.load(Load(binding=name, keys=keys))
            flushed = self.driver.flush(Flush())
            loaded = {item.binding: item.rows for item in flushed.loaded}

            # --- Store ---
            for name in names:
                batch = batches[name]
                rows = prestaged.get(name)
                if rows is None and batch.documents is not None:
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


def job_conf(batches: dict[str, SourceBatch]) -> dict[str, str]:
    """The Spark settings an epoch's staging jobs run with: those of :data:`INTERPRETED` when every
    batch is :func:`small`, and what each batch asks for (:attr:`SourceBatch.job_conf`)."""
    asked = {key: value for batch in batches.values() for key, value in batch.job_conf.items()}
    return {**(INTERPRETED if small(batches) else {}), **asked}


def small(batches: dict[str, SourceBatch]) -> bool:
    """Whether an epoch's staging jobs run interpreted: every batch of it is small
    (:attr:`SourceBatch.small`). Decided for the whole epoch, on the runtime's session, which its
    bindings' staging shares (the applies run in sessions of their own)."""
    return bool(batches) and all(batch.small for batch in batches.values())


def advanced(checkpoint: dict[str, Any], batches: dict[str, SourceBatch]) -> dict[str, Any]:
    """The runtime checkpoint after ``batches``: each read binding's new position, the others' as they were."""
    return {**checkpoint, **{name: batch.checkpoint for name, batch in batches.items()}}
