"""An epoch applied to its tables (``DeltaWriter``): tagged, retried, skipped on replay, proven recorded."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from materializer import changes, crash, events, views
from materializer.config import BindingConfig, PipelineConfig
from materializer.delta import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    TableRef,
    blocking_commit,
    conflict_name,
    is_commit_conflict,
    latest_version,
    sql_name,
    table_state,
)
from materializer.errors import (
    ApplyError,
    CommitConflictError,
    ConfigError,
    StagingError,
    TableStateError,
    TxnNotRecordedError,
)
from materializer.layout import is_already_exists
from materializer.merge.commit import CommitProperties, register_conflict_types
from materializer.merge.failures import cause, commits_after, refused
from materializer.merge.writes import TableWrites
from materializer.progress import Collector
from materializer.protocol import ApplyResult, StagedFile
from materializer.spark import settings as spark_settings
from materializer.staging import StagingArea

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


DEAD_LETTER_SUFFIX = "__dead_letters"
"""A binding's dead-letter rows are staged (and tagged) under its name with this suffix."""

MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
"""Delta copies a MERGE's source to disk first unless it is a Delta table ('auto'), in case the
source changes between the MERGE's two passes. A staged file never changes (it is written once
under a unique name and deleted only after the apply), so the copy is pure cost: 'none'."""
MERGE_DELETION_VECTORS = "spark.databricks.delta.merge.deletionVectors.persistent"
"""Whether a MERGE into a table with deletion vectors on writes them (Delta's default, ``true``) or
rewrites the files it touches (``false``): set per apply by ``transaction.copy_on_write_below_bytes``."""
CREATION_WAIT_SECONDS = 120
"""How long an apply whose CREATE TABLE found the table waits for the other creator's commit."""
CREATION_WAIT_ENV = "MATERIALIZER_CREATION_WAIT_SECONDS"
"""Overrides CREATION_WAIT_SECONDS: the drills and tests that kill a first CREATE set it small
(nothing else creates their tables), so the next run does not sit out two minutes."""


def creation_wait_seconds() -> float:
    """CREATION_WAIT_SECONDS, or the number ``MATERIALIZER_CREATION_WAIT_SECONDS`` names."""
    value = os.environ.get(CREATION_WAIT_ENV, "").strip()
    if not value:
        return CREATION_WAIT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):  # also NaN, which would make the wait endless
        raise ConfigError(f"{CREATION_WAIT_ENV}={value!r}: give a number of seconds, 0 or more (the default is {CREATION_WAIT_SECONDS})")
    return seconds


class DeltaWriter(TableWrites):
    """Writes each committed epoch's staged rows into the bindings' Delta tables, in the apply
    session (a SparkSession of its own: the txn confs are session-wide), under the epoch's
    :class:`CommitProperties`, so Delta skips a replay."""

    def __init__(self, apply_spark: "SparkSession", config: PipelineConfig, staging_area: StagingArea, collector: Collector) -> None:
        self.apply_spark = apply_spark
        self.config = config
        self.staging_area = staging_area
        self.collector = collector
        self._view_columns: dict[str, tuple[str, ...]] = {}
        """binding -> the table columns its live-row view was last made from, in this run."""
        register_conflict_types(apply_spark)

    @property
    def apply_tag(self) -> str:
        """The Spark tag of the apply's work (what the ``mid-apply`` crash watcher waits for)."""
        return f"materializer-{self.config.pipeline_id}-apply"

    def properties(self, name: str, epoch: int) -> CommitProperties:
        """The commit properties of ``name``'s (a binding's, or its dead letters') commit of ``epoch``."""
        return CommitProperties.for_epoch(self.config.pipeline_id, name, epoch)

    # --- one epoch, one table ---

    def apply(self, binding: BindingConfig, epoch: int, staged: StagedFile | None) -> ApplyResult:
        """Apply ``epoch``'s staged rows to the binding's table in one tagged commit; skipped when the
        table already records the epoch. A commit that loses to a concurrent one is retried after
        reading the table again (:attr:`CommitProperties.max_retries` attempts, counted in the
        result's ``conflicts_retried``); see :meth:`_lost_race` for when it stops instead."""
        table = TableRef(binding.table)
        props = self.properties(binding.name, epoch)
        replace = False  # True: a killed CREATE's leftovers are in the way (see _check_created_by_us)
        retried = 0
        for attempt in range(props.max_retries):
            with self.collector.span("table_state", epoch, binding.name):
                state = table_state(self.apply_spark, table, props.txn_app_id, with_size=True)
            if state.txn_version is not None and state.txn_version >= epoch:
                # A replay: Delta already records this epoch (or a later one) for the pipeline.
                self._keep_view(binding, epoch, changed=False)
                return ApplyResult(
                    binding=binding.name, table=str(table), status="skipped", rows=0, delta_version=state.version,
                    conflicts_retried=retried,
                )
            if staged is None and not state.exists:
                # Nothing to write and no schema to create the table with: nothing to record.
                return ApplyResult(binding=binding.name, table=str(table), status="empty", conflicts_retried=retried)
            with self.collector.span("read_staged", epoch, binding.name):
                source = None if staged is None else self.staging_area.read(self.apply_spark, binding, epoch, staged, state.exists)
            try:
                # A small table's MERGE rewrites the files it touches: cheaper there than
                # deletion vectors' extra jobs (transaction.copy_on_write_below_bytes).
                rewrite = state.size_bytes is not None and state.size_bytes < self.config.transaction.copy_on_write_below_bytes
                # A small apply's MERGE runs planned once and interpreted (spark.settings.INTERPRETED), which
                # costs less there than generating and compiling its code
                # (transaction.interpreted_below_bytes).
                table_bytes = state.size_bytes if state.exists else 0
                interpreted = table_bytes is not None and table_bytes + (staged.bytes if staged else 0) < self.config.transaction.interpreted_below_bytes
                with self.transaction(props, rewrite_files=rewrite, interpreted=interpreted), crash.crash_during_spark_job(
                    "mid-apply", epoch, self.apply_spark, self.apply_tag, watch=table.location if table.is_path else None
                ), self.collector.span("merge", epoch, binding.name):
                    metrics = self.write(
                        binding, table, props, source, state.exists, staged.key_bounds if staged else None,
                        replace=replace and not state.exists,
                    )
            except Exception as exc:  # noqa: BLE001
                # Delta's conflicts: Concurrent*Exception, and Metadata/ProtocolChangedException,
                # which a zombie's MERGE meets after the new writer evolved the schema or created
                # the table: another writer committed meanwhile, so look again.
                if is_commit_conflict(exc):
                    self._lost_race(
                        exc, name=binding.name, table=table, epoch=epoch, read_version=state.version,
                        attempts=(attempt + 1, props.max_retries), others_may_write=binding.others_may_write,
                    )
                    retried += 1
                    continue
                if is_already_exists(exc):
                    # The table appeared between our look and our CREATE: fine if it is another
                    # run of this pipeline (the loop finds the epoch applied, or merges into it);
                    # another writer's table is not written blindly (docs: 'Table layout').
                    replace = self._check_created_by_us(binding, table, epoch)
                    continue
                if isinstance(exc, (ApplyError, StagingError)) or not isinstance(exc, Exception):
                    raise
                raise ApplyError(refused(self.config.pipeline_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc
            # Only the version, for the report: the txn map would rebuild the snapshot's state,
            # and DESCRIBE HISTORY costs 2 Spark jobs per epoch where delta-rs reads the log in ms.
            after_version = latest_version(self.apply_spark, table)
            self._keep_view(binding, epoch, changed=source is not None and self._new_columns(binding, source.columns))
            status = "applied" if metrics is not None else "skipped"
            return ApplyResult(
                binding=binding.name,
                table=str(table),
                status=status if staged is not None or status == "skipped" else "empty",
                rows=staged.rows if staged else 0,
                delta_version=after_version,
                metrics=metrics or {},
                conflicts_retried=retried,
            )
        raise AssertionError("unreachable: the last attempt's conflict raises in _lost_race")

    def _lost_race(
        self, exc: BaseException, *, name: str, table: TableRef, epoch: int, read_version: int | None,
        attempts: tuple[int, int], others_may_write: bool = True,
    ) -> None:
        """After ``name``'s commit of ``epoch`` lost to a concurrent one (``exc``; the attempt read
        ``read_version`` and was attempt ``attempts[0]`` of ``attempts[1]``): return to retry, as
        Delta's conflict rules allow (read the table again, commit again: see
        :func:`materializer.delta.blocking_commit` for why a retry is sound); raise
        :class:`TableStateError` when a retry would write over rows the binding says no one else
        changes, :class:`CommitConflictError` on the last attempt. Either names the commit that
        won. Nothing of the epoch is applied to the table then: it stays committed in the log."""
        kind = conflict_name(exc)
        last = attempts[0] >= attempts[1]
        if others_may_write and not last:
            return  # no need to read the history: nothing stops the retry
        # Commits after the version the lost attempt read: the race's winners (ours too: a zombie).
        others = commits_after(self.apply_spark, table, read_version)
        blocking = blocking_commit(others or [], pipeline=self.config.pipeline_id, others_may_write=others_may_write)
        if blocking is not None:
            raise TableStateError(
                f"epoch {epoch}, binding {name}: the commit of epoch {epoch} to table {table} lost the race to "
                f"{blocking.shown()}, a commit not of this pipeline that changed rows (Delta's {kind}). The binding "
                "sets `others_may_write: false`, so the run stops before it writes over them: nothing of epoch "
                f"{epoch} was applied to {table}, and the epoch stays committed in the recovery log. Check the "
                "change; to keep it, set `others_may_write: true` on the binding and run again (the epoch then lands "
                f"once, over it), or undo it (e.g. RESTORE TABLE … TO VERSION AS OF {blocking.version - 1}, then run once "
                "with `others_may_write: true`) (docs: 'Sharing the table with maintenance and people')."
            ) from None
        if not last:
            return
        # The winner of the last race: the newest commit not ours, else the newest of all.
        winners = [c for c in others or [] if c.pipeline != self.config.pipeline_id] or list(others or [])
        won = winners[-1] if winners else None
        said = (
            f"the last race was won by {won.shown()}" if won is not None
            else "the table's history could not be read to name the commit that won"
            if others is None else f"no commit after version {read_version} is in the table's history any more"
        )
        raise CommitConflictError(
            f"epoch {epoch}, binding {name}: each of {attempts[1]} attempts "
            f"to commit epoch {epoch} to table {table} lost the race to a concurrent commit (Delta's {kind}); {said}. "
            f"Nothing of epoch {epoch} was applied to {table}; the epoch stays committed in the recovery log, so "
            "run again: the next run applies it, once. If it keeps happening, find that commit's writer (DESCRIBE "
            f"HISTORY on {table}) and keep its commits apart from the pipeline's (docs: 'Sharing the table with "
            "maintenance and people').",
            epoch=epoch, binding=name, version=won.version if won else None, operation=won.operation if won else None,
        ) from None

    def _new_columns(self, binding: BindingConfig, columns: list[str]) -> bool:
        """Whether a staged file's ``columns`` hold a table column the binding's view was not made from."""
        if binding.view is None:
            return False
        landed = set(columns) - set(changes.staged_only(columns, binding))
        return not landed <= set(self._view_columns.get(binding.name, ()))

    def _keep_view(self, binding: BindingConfig, epoch: int, *, changed: bool) -> None:
        """Create or replace the binding's live-row view (docs: 'Live-row views'): once a run, when
        the table exists, and again after an apply that may have added columns."""
        if binding.view is None or (binding.name in self._view_columns and not changed):
            return
        with self.collector.span("view", epoch, binding.name):
            try:
                self._view_columns[binding.name] = views.replace_view(self.apply_spark, binding)
            except Exception as exc:  # noqa: BLE001 - the table is applied; the view is what failed
                raise ConfigError(
                    f"binding {binding.name!r}: the live-row view {binding.view} over {binding.table} could not be "
                    f"created ({cause(exc)}). The table is applied and the epoch recorded; fix the view's name (its "
                    "catalog and schema must exist and be writable) or remove `view`, and run again."
                ) from None

    def probe_txn_confs(self) -> None:
        """Set and unset the txn confs on the apply session, before anything is read: a compute
        that refuses them (some serverless computes let a job set only a short list of confs) stops
        the run here, not at the first apply of a committed epoch."""
        conf = self.apply_spark.conf
        for key, value in ((TXN_APP_ID, self.config.pipeline_id), (TXN_VERSION, "0"), (USER_METADATA, "{}")):
            try:
                conf.set(key, value)
                conf.unset(key)
            except Exception as exc:  # noqa: BLE001 - any refusal, whatever the compute calls it
                raise TxnNotRecordedError(
                    f"this Spark session refuses the Spark conf {key} ({cause(exc)}). The materializer's "
                    "exactly-once rests on Delta's transaction id (spark.databricks.delta.write.txnAppId and "
                    "txnVersion) on every commit it makes, so it cannot run here: nothing was read or written. "
                    "Run it on a compute that lets a job set Spark confs (a classic or job cluster, a Spark "
                    "Connect server you run, or a serverless environment that allows these confs)."
                ) from None

    def prove_txn_recorded(self, binding: BindingConfig, epoch: int) -> None:
        """After an apply that committed: the table records ``epoch`` for this pipeline. A compute
        that ignored the txn confs would commit without them, and a replay would apply twice."""
        table = TableRef(binding.table)
        state = table_state(self.apply_spark, table, self.config.pipeline_id)
        if state.txn_version != epoch:
            raise TxnNotRecordedError(
                f"epoch {epoch}, binding {binding.name}: the commit just made to {binding.table} does not record "
                f"Delta's transaction id (the table records {state.txn_version!r} for pipeline "
                f"{self.config.pipeline_id!r}, not {epoch}). This compute did not honour the txn confs "
                "(spark.databricks.delta.write.txnAppId/txnVersion), so a replay would apply twice: nothing more "
                "is applied. Run the pipeline on a compute that records them; the epoch is in the recovery log "
                "and the table holds its rows once."
            )

    @contextmanager
    def transaction(self, props: CommitProperties, *, rewrite_files: bool = False, interpreted: bool = False) -> Iterator[None]:
        """Within the block, the apply session's Delta commits carry ``props`` and write their
        files as :data:`materializer.spark.settings.TABLE_WRITES` says; with ``rewrite_files`` a
        MERGE rewrites the files it touches instead of writing deletion vectors; ``interpreted``,
        its queries run as :data:`materializer.spark.settings.INTERPRETED` says."""
        # The txn confs are session-wide: set them on the apply session, around this one commit only.
        conf = self.apply_spark.conf
        conf.set(TXN_APP_ID, props.txn_app_id)
        conf.set(TXN_VERSION, str(props.txn_version))
        conf.set(USER_METADATA, props.user_metadata)
        saved = {MATERIALIZE_SOURCE: conf.get(MATERIALIZE_SOURCE, None)}
        conf.set(MATERIALIZE_SOURCE, "none")
        # A tag (this thread's, on the apply session) names the MERGE's Spark work: what job groups
        # did, on Spark Connect too (``interruptTag`` stops it).
        self.apply_spark.addTag(self.apply_tag)
        try:
            # How the commit's queries run and encode its files, never which rows it writes (a
            # compute that refuses these confs keeps Delta's and Spark's defaults, same rows).
            ways = {MERGE_DELETION_VECTORS: "false"} if rewrite_files else {}
            with spark_settings.session_confs(
                self.apply_spark, {**spark_settings.TABLE_WRITES, **ways, **(spark_settings.INTERPRETED if interpreted else {})}
            ):
                yield
        finally:
            for key in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
                conf.unset(key)
            for key, value in saved.items():
                if value is None:
                    conf.unset(key)
                else:
                    conf.set(key, value)
            self.apply_spark.removeTag(self.apply_tag)

    def truncate(self, binding: BindingConfig, epoch: int) -> None:
        """Delete every row of the binding's table in the epoch's tagged commit (``backfill
        --truncate``); skipped, by us or by Delta, once the table records the epoch."""
        table = TableRef(binding.table)
        props = self.properties(binding.name, epoch)
        for attempt in range(props.max_retries):
            state = table_state(self.apply_spark, table, props.txn_app_id)
            if not state.exists or (state.txn_version is not None and state.txn_version >= epoch):
                return
            try:
                with self.transaction(props):
                    # An empty table makes no commit: the apply after this records the epoch.
                    self.apply_spark.sql(f"DELETE FROM {sql_name(table)}").collect()
                return
            except Exception as exc:  # noqa: BLE001
                if is_commit_conflict(exc):
                    # Every row goes whoever else wrote: a retry deletes theirs too, as asked.
                    self._lost_race(
                        exc, name=binding.name, table=table, epoch=epoch, read_version=state.version,
                        attempts=(attempt + 1, props.max_retries),
                    )
                    continue
                raise ApplyError(refused(self.config.pipeline_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc

    def append_dead_letters(self, table_name: str, bindings: list[BindingConfig], epoch: int, staged: list[StagedFile]) -> ApplyResult:
        """Append the epoch's rejected documents of ``bindings`` to their dead-letter table
        ``table_name`` (shared or not; ``staged`` in the order of ``bindings``) in one commit under
        the epoch's txn id: Delta skips a replay, so each lands once (docs: 'Dead letters'). One
        commit for all of them, because two appends of one epoch to one table would carry the same
        txn version and Delta would skip the second."""
        assert bindings and len(bindings) == len(staged)
        table = TableRef(table_name)
        name = "+".join(b.name for b in bindings)
        app_id = self.config.pipeline_id
        props = self.properties(name + DEAD_LETTER_SUFFIX, epoch)
        rows_staged = sum(f.rows for f in staged)
        began = time.monotonic()
        retried = 0
        for attempt in range(props.max_retries):
            state = table_state(self.apply_spark, table, app_id)
            if state.txn_version is not None and state.txn_version >= epoch:
                result = ApplyResult(
                    binding=name, table=str(table), status="skipped", delta_version=state.version, conflicts_retried=retried,
                )
                break
            parts = [self.staging_area.read(self.apply_spark, b, epoch, f) for b, f in zip(bindings, staged)]
            rows = parts[0]
            for part in parts[1:]:
                # documents' and kafka's dead letters differ in columns: one table holds both
                rows = rows.unionByName(part, allowMissingColumns=True)
            writer = rows.write.format("delta").mode("append").options(**props.writer_options())
            try:
                # An append reads only the staged rows: interpreted below the same size as an apply's.
                with self.transaction(props, interpreted=sum(f.bytes for f in staged) < self.config.transaction.interpreted_below_bytes):
                    writer.save(table.location) if table.is_path else writer.saveAsTable(table.location)
            except Exception as exc:  # noqa: BLE001
                if is_commit_conflict(exc):
                    # An append reads no row of the table: whoever else wrote, a retry is sound.
                    self._lost_race(
                        exc, name=name, table=table, epoch=epoch, read_version=state.version,
                        attempts=(attempt + 1, props.max_retries),
                    )
                    retried += 1
                    continue
                raise ApplyError(
                    f"epoch {epoch}: Delta refused to append the dead letters of {', '.join(b.name for b in bindings)} to "
                    f"{table}: {cause(exc)}. Nothing of them was appended; the epoch stays committed, so every run stops "
                    "here until they are. Fix the dead-letter table (its schema, its constraints), then run again.",
                    epoch=epoch, binding=name,
                ) from exc
            result = ApplyResult(
                binding=name, table=str(table), status="applied", rows=rows_staged,
                delta_version=latest_version(self.apply_spark, table), metrics={"dead_letters": rows_staged},
                conflicts_retried=retried,
            )
            break
        else:
            raise AssertionError("unreachable: the last attempt's conflict raises in _lost_race")
        self.collector.emit(events.DeadLettersApplied.of(result, epoch=epoch, seconds=time.monotonic() - began))
        return result

    def _check_created_by_us(self, binding: BindingConfig, table: TableRef, epoch: int) -> bool:
        """After a CREATE found the table there: True when the location holds only what a killed
        CREATE left (files, no commit, none for CREATION_WAIT_SECONDS), which the next CREATE may
        replace; False when the table is this pipeline's (or adopted) and the caller looks again."""
        # The other CREATE may still be writing its files (Spark calls the table existing once
        # its folder does): wait for its commit before judging whose table it is.
        wait = creation_wait_seconds()
        deadline = time.monotonic() + wait
        state = table_state(self.apply_spark, table, self.config.pipeline_id)
        while not state.exists:
            if time.monotonic() > deadline:
                if table.is_path:
                    # A CREATE killed before its commit (a drill's SIGKILL in the first epoch's
                    # apply found it) leaves data files and an empty _delta_log that make every
                    # later CREATE fail as "already exists": without a commit no reader sees them,
                    # so the retry creates with CREATE OR REPLACE, whose commit 0 is put-if-absent
                    # (a writer that commits first makes it a conflict, and the loop looks again).
                    return True
                raise StagingError(
                    f"epoch {epoch}, binding {binding.name}: table {binding.table} has been in creation by another writer "
                    f"for over {wait:g} s and still has no commit; nothing was written. Run again."
                )
            time.sleep(0.5)
            state = table_state(self.apply_spark, table, self.config.pipeline_id)
        if binding.adopt_table or state.txn_version is not None:
            return False
        raise TableStateError(
            f"epoch {epoch}, binding {binding.name}: table {binding.table} did not exist when the epoch's apply began "
            f"and was created meanwhile by another writer (it records no commit of pipeline {self.config.pipeline_id!r}). "
            "Nothing was written to it. If the table is meant for this binding, set `adopt_table: true` on the binding "
            "and run again (docs: 'Sharing or taking over a table'); otherwise give the binding another table."
        )
