"""Backfill: read one binding's source again, from the start or a given position, into its table.

A backfill is one committed epoch, like any other: ``materializer backfill --binding B`` opens the
recovery log (fencing any running writer), makes sure the last committed epoch is applied, and
commits epoch N+1 with B's source position set back (to the start, or ``--from``) and no rows;
with ``--truncate``, that epoch's apply first deletes every row of B's table. The epochs that
follow read B's source again, as ordinary epochs N+2, N+3, …, and ``backfill`` runs them until
the sources are drained (``materializer run`` does the same after an interruption).

Why that keeps exactly-once:

* **Epoch numbers are never reused.** The re-read rows are applied under new txn versions
  (N+2, …) of the same txn app id, above everything the table records, so Delta applies them;
  nothing needs a new app id (which would also lose the replay protection of epochs already
  applied). The position change is itself an epoch in the recovery log, so it is durable and
  ordered with everything else: before its commit nothing changed; after it, every run continues
  the backfill from where the log stands.
* **The truncate is epoch N+1's commit on B's table** (a ``DELETE`` carrying txn version N+1): a
  replay of epoch N+1 after a crash is skipped by Delta, so rows the backfill has already written
  again (epochs N+2 …) are never deleted a second time.
* **The other bindings are untouched:** their positions are carried over unchanged, and epoch N+1
  makes no commit on their tables (nor on B's without ``--truncate``).
* **A crash mid-backfill** is a crash in an ordinary epoch: ``materializer run`` re-applies the
  last committed epoch and goes on reading B from where the backfill got to. Running ``backfill``
  again instead starts it over (again correct: in standard mode the MERGE by key converges; with
  ``--truncate`` the table is emptied again first).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from materializer.option_changes import table_options
from materializer.config import PipelineConfig
from materializer.errors import ConfigError, SourceError
from materializer import events
from materializer.events import Collector
from materializer.protocol import Acknowledge, DriverCheckpoint
from materializer.recovery_log import RecoveryLog
from materializer.storage import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class BackfillSummary:
    binding: str
    reset_epoch: int
    """The epoch that set the binding's position back (and truncated its table)."""
    position: dict[str, Any] | None
    """Where the binding's source is read again from (None: the start)."""
    truncated: bool
    last_epoch: int = 0
    epochs: list[int] = field(default_factory=list)


def resolve_position(config: PipelineConfig, binding: str, position: str | None) -> dict[str, Any] | None:
    """``--from``: a runtime checkpoint as JSON (read after it, as the log records positions), or
    for a documents source a file name (that file and every later one are read again)."""
    if position is None:
        return None
    text = position.strip()
    if text.startswith("{"):
        try:
            found = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--from {position!r}: not a JSON object ({exc}); give a position as the recovery log shows it") from None
        return found
    source = config.binding(binding).source
    if source.format != "documents":
        raise ConfigError(
            f"--from {position!r}: binding {binding} reads a {source.format} source; give its position as JSON, "
            "as the recovery log records it (`materializer status --json`)"
        )
    from materializer.sources.documents.source import DocumentsSource

    _store, files, _legacy = DocumentsSource(config.binding(binding), open_store(config.staging_root)).listing()
    names = sorted(f.path for f in files)
    if text not in names:
        raise SourceError(f"--from {position!r}: binding {binding}'s source {source.path} has no such file (it has {len(names)} files)")
    earlier = [n for n in names if n < text]
    # The position after the file before it: ``text`` is the first file read again.
    return {"file": earlier[-1]} if earlier else None


def start_backfill(
    config: PipelineConfig,
    spark: "SparkSession",
    binding: str,
    *,
    position: str | None = None,
    truncate: bool = False,
    collector: Collector | None = None,
) -> BackfillSummary:
    """Commit the epoch that sets ``binding``'s source back (and truncates its table); it is
    applied by the next run's first Acknowledge."""
    from materializer.driver import DeltaDriver

    if config.templates:
        # Its epoch would not record the set the templates' bindings cover (the driver checkpoint's `templated`).
        raise ConfigError(
            "backfill is not built for pipelines with binding templates yet (its epoch would not record which bindings "
            "the templates made); nothing was changed"
        )
    try:
        config.binding(binding)
    except KeyError:
        raise ConfigError(
            f"--binding {binding!r}: the pipeline has no such binding (it has {', '.join(b.name for b in config.bindings)})"
        ) from None
    start = resolve_position(config, binding, position)
    collector = collector or Collector()
    staging = open_store(config.staging_root)
    log = RecoveryLog(
        open_store(config.recovery_log), config.pipeline_id, retention=config.log_retention, writer=f"backfill-{uuid.uuid4().hex[:8]}"
    )
    # Open first: its fence stops a run still active before anything changes.
    state = log.open()
    last = state.last_commit
    driver = DeltaDriver(spark, config, staging, collector, fence_check=lambda: log.check_holding("deleting staged files"))
    try:
        if last is not None and last.driver_checkpoint is not None:
            # The last committed epoch is applied before the position moves (apply in order).
            driver.acknowledge(Acknowledge(epoch=state.last_epoch, driver_checkpoint=last.driver_checkpoint))
        before = dict(last.runtime_checkpoint or {}) if last is not None else {}
        runtime_checkpoint = {k: v for k, v in before.items() if k != binding}
        if start is not None:
            runtime_checkpoint[binding] = start
        written = sorted(
            set(last.driver_checkpoint.written) | {n for n, f in last.driver_checkpoint.staged.items() if f is not None}
        ) if last is not None and last.driver_checkpoint is not None else []
        epoch = state.last_epoch + 1
        checkpoint = DriverCheckpoint(
            epoch=epoch,
            staged={b.name: None for b in config.bindings},
            rewind=before,
            written=written,
            truncate=[binding] if truncate else [],
            recorded=DriverCheckpoint.carried(last.driver_checkpoint if last is not None else None, epoch, [binding] if truncate else []),
            options={b.name: table_options(b) for b in config.bindings},
        )
        # crash before this commit leaves nothing changed; after it, every run continues the backfill
        log.commit(epoch, runtime_checkpoint, checkpoint)
    finally:
        driver.close()
    collector.emit(events.BackfillStarted(epoch=epoch, binding=binding, position=start, truncate=truncate))
    return BackfillSummary(binding=binding, reset_epoch=epoch, position=start, truncated=truncate, last_epoch=epoch)


def backfill(
    config: PipelineConfig,
    spark: "SparkSession",
    binding: str,
    *,
    position: str | None = None,
    truncate: bool = False,
    collector: Collector | None = None,
    max_epochs: int | None = None,
) -> BackfillSummary:
    """Set the binding back (:func:`start_backfill`), then run until the sources are drained."""
    from materializer.runtime import Runtime

    summary = start_backfill(config, spark, binding, position=position, truncate=truncate, collector=collector)
    ran = Runtime(config, spark, collector).run(max_epochs=max_epochs)
    summary.epochs = [e.epoch for e in ran.epochs]
    summary.last_epoch = ran.last_epoch
    return summary
