"""``materializer recover``: repair a damaged recovery log or staged file without losing an epoch.

What can be damaged, and why it can be repaired exactly:

* **A staged file** of the last committed epoch N (deleted, truncated) whose table does not record
  N yet. The entry's driver checkpoint keeps ``rewind``, where the sources stood before N. Source
  files are immutable and a batch is the next ``max_documents`` documents after a checkpoint, so
  re-reading from ``rewind`` gives epoch N's batch again; we check that it ends exactly at the
  entry's runtime checkpoint (else the source or ``max_documents`` changed and we stop). Every
  table is at N-1 or later (N was committed only after N-1 was applied everywhere), so loads are
  read-committed as in the original run. The re-staged files are committed in a new log entry for
  the **same epoch N**; the next ``run`` applies it with txnVersion N, so a table that did record
  N meanwhile skips it.
* **A recovery-log entry** (torn, failing its checksum). Its bytes are kept under ``damaged/`` in
  the log store and the entry is replaced, at the same sequence number, by a fence: the sequence
  stays taken, so a zombie writer stays fenced. If it was the last commit (epoch N = the previous
  commit's epoch + 1), what the tables record tells what happened: no table records N, so N was
  never applied and the next run simply reads it again from the previous commit's checkpoint;
  some table records N, so recover re-reads N from there, stages it for the tables that lack it,
  and commits it as epoch N.

Anything else (two epochs lost, the previous commit compacted away, a source that changed) stops
with an error saying what is missing; nothing is guessed. Stop the pipeline before recovering:
recover opens the log, which fences any run still active.

A **stuck epoch** (Delta refuses to apply committed epoch N to a table, e.g. a CHECK constraint
added after N was committed) is not damage: either fix the table and run again, or
:func:`skip_epoch` sets the binding's rows of N aside. They are copied, whole, to a Parquet
dataset the user keeps (``<staging>/<pipeline>/skipped/…`` or ``--keep-to``), then epoch N is
committed again without them, naming where they went; the next run records N on the table with
an empty commit and goes on. Nothing is dropped silently: the rows are in the kept dataset, and
the log says so.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from materializer.config import PipelineConfig
from materializer.delta import table_state
from materializer.tables import TableRef
from materializer.driver import DeltaDriver
from materializer.runtime import EpochStager, advanced
from materializer.errors import ConfigError, RecoveryLogError, StagingError, TableStateError
from materializer.progress import Collector
from materializer.protocol import Acknowledge, DriverCheckpoint, StagedFile
from materializer.runtime import as_recorded
from materializer.recovery_log import LogEntry, RecoveryLog, binding_keys, decode, encode, entry_path
from materializer.sources.formats import open_source
from materializer.staging import StagingArea
from materializer.storage import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DAMAGED = "damaged"


@dataclass
class RecoverySummary:
    pipeline_id: str
    actions: list[str] = field(default_factory=list)
    """What recover did, in order, for people."""
    recommitted_epoch: int | None = None
    """The epoch committed again with re-staged files (None: nothing needed)."""
    restaged: dict[str, int] = field(default_factory=dict)
    """Rows re-staged per binding."""


def _repair_entries(log: RecoveryLog, summary: RecoverySummary) -> None:
    """Keep each damaged entry's bytes under ``damaged/`` and put a fence at its sequence number."""
    last_epoch = 0
    for seq in log.sequences():
        path = entry_path(seq)
        where = f"{log.store.uri}/{path}"
        try:
            data = log.store.get(path)
        except FileNotFoundError:
            continue
        try:
            entry = decode(data, where, log.keys)
            if entry.seq != seq:
                raise RecoveryLogError(f"recovery log entry {where} claims sequence {entry.seq}")
        except RecoveryLogError as exc:
            keep = f"{DAMAGED}/{seq:020d}-{uuid.uuid4().hex[:8]}.json"
            log.store.put_if_absent(keep, data)
            fence = LogEntry(seq=seq, kind="fence", pipeline_id=log.pipeline_id, writer=log.writer, epoch=last_epoch)
            fd, tmp = tempfile.mkstemp(prefix="recover-", dir=log.store.local_temp_dir())
            with os.fdopen(fd, "wb") as handle:
                handle.write(encode(fence))
                handle.flush()
                os.fsync(handle.fileno())
            # Replaced, not deleted: a free sequence number would let a zombie commit there.
            log.store.put_file(path, tmp)
            summary.actions.append(f"log entry {seq} was damaged ({exc}); kept it as {log.store.uri}/{keep} and put a fence in its place")
            continue
        if entry.pipeline_id != log.pipeline_id:
            raise RecoveryLogError(
                f"recovery log {log.store.uri} belongs to pipeline {entry.pipeline_id!r}, not {log.pipeline_id!r}"
            )
        if entry.kind == "commit":
            last_epoch = entry.epoch


def recover(config: PipelineConfig, spark: "SparkSession", collector: Collector | None = None) -> RecoverySummary:
    collector = collector or Collector()
    summary = RecoverySummary(pipeline_id=config.pipeline_id)
    staging = open_store(config.staging_root)
    log = RecoveryLog(
        open_store(config.recovery_log), config.pipeline_id, retention=config.log_retention, writer=f"recover-{uuid.uuid4().hex[:8]}"
    )
    log.keys = binding_keys(config.bindings)
    _repair_entries(log, summary)
    # Bindings made from templates: those the last committed epoch covers (no broker or folder asked).
    config = as_recorded(config)
    if config.bindings and binding_keys(config.bindings) != log.keys:
        # Their keys are known only now: an entry whose key bounds name other columns is damage too.
        log.keys = binding_keys(config.bindings)
        _repair_entries(log, summary)
    # Open first: its fence stops any run still active before anything is re-staged.
    state = log.open()
    last = state.last_commit
    last_epoch = state.last_epoch
    recorded = {
        b.name: table_state(spark, TableRef(b.table), config.pipeline_id).txn_version or 0 for b in config.bindings
    }
    ahead = {name: epoch for name, epoch in recorded.items() if epoch > last_epoch}
    if any(epoch > last_epoch + 1 for epoch in ahead.values()):
        raise RecoveryLogError(
            f"tables record epochs {ahead} but the recovery log ends at epoch {last_epoch}: more than one "
            "committed epoch is missing from the log. Restore the log from a backup; recover cannot rebuild it."
        )
    driver = DeltaDriver(spark, config, staging, collector, fence_check=lambda: log.check_holding("deleting staged files"))

    if ahead:
        # The lost entry was epoch last+1, applied to some tables: re-commit it from last's checkpoint.
        target = last_epoch + 1
        rewind: dict[str, Any] = dict(last.runtime_checkpoint or {}) if last else {}
        if last is not None and last.driver_checkpoint is not None:
            # Every table must hold epoch `last` before epoch `target` is staged (read-committed).
            driver.acknowledge(Acknowledge(epoch=last_epoch, driver_checkpoint=last.driver_checkpoint))
        restage = {b.name for b in config.bindings if recorded[b.name] < target}
        keep: dict[str, StagedFile | None] = {}
        expected_end: dict[str, Any] | None = None
        summary.actions.append(
            f"tables {sorted(ahead)} record epoch {target}, whose log entry is lost: re-reading it from epoch {last_epoch}'s checkpoint"
        )
    else:
        if last is None or last.driver_checkpoint is None:
            summary.actions.append("nothing committed yet: nothing to recover")
            return summary
        target = last_epoch
        checkpoint = last.driver_checkpoint
        keep = {}
        restage = set()
        for name, staged in checkpoint.staged.items():
            if staged is None or recorded.get(name, 0) >= target:
                keep[name] = None if recorded.get(name, 0) >= target else staged
            elif driver.staging_area.intact(staged):
                keep[name] = staged
            else:
                restage.add(name)
                summary.actions.append(f"epoch {target}, binding {name}: staged file {staged.uri} is missing or damaged")
        if not restage:
            summary.actions.append(f"epoch {target}: the log reads back and its staged files are intact; nothing to re-stage")
            return summary
        if checkpoint.rewind is None:
            raise StagingError(
                f"epoch {target}: the log entry has no rewind checkpoint (written by an older version), so the "
                "epoch cannot be re-read from the source. Restore the staged files from a backup."
            )
        rewind = dict(checkpoint.rewind)
        expected_end = dict(last.runtime_checkpoint or {})

    # --- re-read the epoch's batches (every binding: the new checkpoint needs them all) ---
    # The runtime's own steps (read, Load*/Flush, Store*, StartCommit, verify), for the bindings to re-stage.
    sources = {b.name: open_source(b, staging) for b in config.bindings}
    stager = EpochStager(config, spark, driver, sources, driver.staging_area, log.writer, collector)
    # until: exactly what the committed entry took (documents: its files; kafka: its offset range)
    batches = stager.read(target, rewind, until=expected_end or {})
    for binding in config.bindings:
        batch = batches.get(binding.name)
        if batch is None:
            if binding.name in restage:
                raise StagingError(
                    f"epoch {target}, binding {binding.name}: re-reading the source from {rewind.get(binding.name)} finds "
                    "nothing, but the epoch had input: the source changed. Restore the staged file from a backup."
                )
            continue
        if expected_end is not None and binding.name in restage and batch.checkpoint != expected_end.get(binding.name):
            raise StagingError(
                f"epoch {target}, binding {binding.name}: re-reading the source from {rewind.get(binding.name)} ends at "
                f"{batch.checkpoint}, but the epoch ended at {expected_end.get(binding.name)}: the source files or "
                "transaction.max_documents changed since, so the epoch cannot be re-staged exactly. Restore the "
                "staged file from a backup, or restore the configuration's max_documents."
            )
        if binding.name not in restage and ahead:
            keep[binding.name] = None  # that table already records the epoch
    new_checkpoint = expected_end if expected_end is not None else advanced(rewind, batches)
    started = stager.stage(target, batches, new_checkpoint, rewind, only=restage)
    staged: dict[str, StagedFile | None] = {}
    for binding in config.bindings:
        if binding.name in restage and binding.name in batches:
            staged[binding.name] = started.driver_checkpoint.staged.get(binding.name)
            new = staged[binding.name]
            summary.restaged[binding.name] = new.rows if new else 0
        elif binding.name in keep:
            staged[binding.name] = keep[binding.name]

    # --- commit epoch `target` again; the next run applies it ---
    written = list(last.driver_checkpoint.written) if last is not None and last.driver_checkpoint is not None else []
    # Dead letters: re-staged with their binding's rows; the others' as the entry had them (their
    # apply is skipped where the dead-letter table already records the epoch).
    before = last.driver_checkpoint.dead_letters if last is not None and last.driver_checkpoint is not None and last_epoch == target else {}
    dead = {n: f for n, f in before.items() if n not in restage}
    dead.update({n: f for n, f in started.driver_checkpoint.dead_letters.items() if n in restage})
    truncate = list(last.driver_checkpoint.truncate) if last is not None and last.driver_checkpoint is not None and last_epoch == target else []
    # What each table records once `target` is applied: as the entry said (the same epoch again), or
    # carried on from the last entry's (the lost epoch: its rows, and the tables that record it already).
    if last is not None and last.driver_checkpoint is not None and last_epoch == target:
        recorded = last.driver_checkpoint.recorded
    else:
        before_cp = last.driver_checkpoint if last is not None else None
        recorded = DriverCheckpoint.carried(before_cp, target, [*(n for n, f in staged.items() if f is not None), *dead, *keep])
    driver_checkpoint = DriverCheckpoint(
        epoch=target, staged=staged, rewind=rewind, written=written, dead_letters=dead, truncate=truncate,
        recorded=recorded, options=started.driver_checkpoint.options,
        templated=dict(last.driver_checkpoint.templated) if last is not None and last.driver_checkpoint is not None else {},
    )
    entry = log.commit(target, new_checkpoint, driver_checkpoint)
    summary.recommitted_epoch = target
    summary.actions.append(
        f"committed epoch {target} again (log sequence {entry.seq}) with re-staged files for {sorted(summary.restaged)}; "
        "`materializer run` applies it"
    )
    return summary


def skip_epoch(
    config: PipelineConfig, spark: "SparkSession", epoch: int, binding_name: str, keep_to: str | None = None
) -> RecoverySummary:
    """Set a stuck epoch's rows for one binding aside (kept whole), and commit the epoch without them."""
    summary = RecoverySummary(pipeline_id=config.pipeline_id)
    config = as_recorded(config)
    try:
        binding = config.binding(binding_name)
    except KeyError:
        raise ConfigError(f"--binding {binding_name}: the configuration has no such binding") from None
    staging = open_store(config.staging_root)
    log = RecoveryLog(
        open_store(config.recovery_log), config.pipeline_id, retention=config.log_retention, writer=f"recover-{uuid.uuid4().hex[:8]}"
    )
    # Open first: its fence stops any run still active before anything changes.
    state = log.open()
    last = state.last_commit
    if last is None or last.driver_checkpoint is None or last.epoch != epoch:
        raise TableStateError(
            f"--skip-epoch {epoch}: the recovery log's last committed epoch is {state.last_epoch}; only that epoch can be "
            "stuck (every earlier one is applied). Nothing was changed."
        )
    recorded = table_state(spark, TableRef(binding.table), config.pipeline_id).txn_version or 0
    staged = last.driver_checkpoint.staged.get(binding.name)
    if recorded >= epoch or staged is None:
        raise TableStateError(
            f"--skip-epoch {epoch} --binding {binding.name}: "
            + (f"table {binding.table} already records epoch {epoch}" if recorded >= epoch else f"epoch {epoch} has no rows for it")
            + ": nothing to set aside. Nothing was changed."
        )
    area = StagingArea.of(config, staging)
    if not area.intact(staged):
        raise StagingError(
            f"epoch {epoch}, binding {binding.name}: staged file {staging.uri}/{staged.uri} is missing or damaged, so its "
            "rows cannot be kept: run `materializer recover --config F` first to re-stage the epoch. Nothing was changed."
        )
    destination = keep_to or area.spark_path(area.skipped_path(epoch, binding.name))
    # Copied whole before the log forgets the staged file (the next Open deletes it as unreferenced).
    area.read(spark, binding, epoch, staged).write.mode("error").parquet(destination)
    copied = spark.read.parquet(destination).count()
    if copied != staged.rows:
        raise StagingError(
            f"epoch {epoch}, binding {binding.name}: copying the staged rows to {destination} gave {copied} rows, not "
            f"{staged.rows}; nothing was changed in the log. Remove {destination} and try again."
        )
    checkpoint = last.driver_checkpoint
    entry = log.commit(
        epoch,
        dict(last.runtime_checkpoint or {}),
        checkpoint.model_copy(
            update={
                "staged": {**checkpoint.staged, binding.name: None},
                "skipped": {**checkpoint.skipped, binding.name: destination},
            }
        ),
    )
    log.clear_failures(epoch)
    summary.recommitted_epoch = epoch
    summary.actions.append(
        f"epoch {epoch}, binding {binding.name}: its {staged.rows} rows were set aside, kept as Parquet at {destination} "
        f"(with column _op: 'd' rows are deletes); epoch {epoch} is committed again without them (log sequence "
        f"{entry.seq}). `materializer run` records the epoch on {binding.table} and goes on; write the kept rows to the "
        "table yourself once it can take them"
    )
    return summary
