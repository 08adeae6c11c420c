"""The Delta driver: stage each epoch to Parquet, then idempotently apply it with Delta's txn ids.

Staged files live in the staging store at ``staged/epoch-<epoch>/<binding>-<random>/`` (a Parquet
dataset written by Spark). The driver checkpoint names each one with its row count, file count
and byte size. Acknowledge applies them in binding order:

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
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from materializer import changes, crash
from materializer.bounds import bound_aggregates, bounds_condition, bounds_from
from materializer.config import BindingConfig, PipelineConfig
from materializer.delta import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    TableRef,
    detail,
    exists,
    is_commit_conflict,
    quote,
    read_table,
    sql_name,
    table_state,
    table_version,
    user_metadata,
)
from materializer.dead_letters import for_epoch
from materializer.errors import ApplyError, ConfigError, SourceError, StagingError, TableStateError
from materializer.layout import create_table_sql, is_already_exists, layout_problems
from materializer.widening import widened_schema, widening_enabled
from materializer.progress import Collector
from materializer.protocol import (
    Acknowledge,
    Acknowledged,
    ApplyResult,
    Driver,
    DriverCheckpoint,
    Flush,
    Flushed,
    Load,
    Loaded,
    Open,
    Opened,
    StagedFile,
    StartCommit,
    StartedCommit,
    Store,
    dataframe,
)
from materializer.sources import OP
from materializer.storage import Store as FileStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

STAGED = "staged"
DEAD_LETTER_SUFFIX = "__dead_letters"
"""A binding's dead-letter rows are staged (and tagged) under its name with this suffix."""
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
"""Delta copies a MERGE's source to disk first unless it is a Delta table ('auto'), in case the
source changes between the MERGE's two passes. A staged file never changes (it is written once
under a unique name and deleted only after the apply), so the copy is pure cost: 'none'."""
SCRATCH = ("spool", "_tmp")
"""Scratch folders of the staging store: source spools and files on their way in, per writer."""
CONCURRENT_RETRIES = 3
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


REFUSED_NAME_CHARACTERS = " ,;{}()\n\t="
"""Characters Delta refuses in column names unless the table uses column mapping."""


def dataset_of(path: str) -> str:
    """The staged dataset a staged file belongs to: ``staged/epoch-<epoch>/<binding>-<random>``."""
    return "/".join(path.split("/")[:3])


def open_cleans(staging: FileStore, checkpoint: DriverCheckpoint | None) -> tuple[list[str], list[str]]:
    """What an Open deletes (files of staged datasets the last committed entry does not reference,
    every scratch file) and what it keeps (the rest), as listed now. The drill checks with this."""
    keep = set() if checkpoint is None else {f.uri for f in checkpoint.staged.values() if f is not None}
    keep |= set() if checkpoint is None else {f.uri for f in checkpoint.dead_letters.values()}
    deleted, kept = [], []
    for info in staging.list(STAGED):
        (kept if dataset_of(info.path) in keep else deleted).append(info.path)
    deleted += [f.path for prefix in SCRATCH for f in staging.list(prefix)]
    return deleted, kept


def is_data_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return not name.startswith(("_", "."))


class DeltaDriver(Driver):
    def __init__(
        self,
        spark: "SparkSession",
        config: PipelineConfig,
        staging: FileStore,
        collector: Collector | None = None,
        *,
        fence_check: Callable[[], None] | None = None,
    ) -> None:
        self.spark = spark
        self.config = config
        self.staging = staging
        self.collector = collector or Collector()
        self.fence_check = fence_check or (lambda: None)
        """Raises FencedError if a newer writer holds the log: called after listing what to
        delete and before deleting it (DESIGN invariant 10)."""
        self._written: set[str] = set()
        """Bindings whose tables hold rows of an applied epoch (so the table must exist)."""
        self._stored: dict[str, DataFrame] = {}
        self._rejected: dict[str, DataFrame] = {}
        self._prestaged: dict[str, tuple[DataFrame, StagedFile | None]] = {}
        self._loads: list[Load] = []
        self._acknowledged: int | None = None
        from materializer.spark import isolated_session

        self.apply_spark = isolated_session(spark)
        try:
            # Installs PySpark's conversion of Delta's conflicts to their Python types (classic
            # client): imported only when the first one is examined, that one would stay a bare
            # Py4JJavaError and not be recognised as a conflict (a racing first CREATE meets it).
            import delta.exceptions  # noqa: F401
        except ImportError:  # pragma: no cover - delta-spark is a dependency
            pass

    # --- Open ---

    def open(self, message: Open) -> Opened:
        """Delete staged files that no committed entry references (Flink's abort of the in-doubt).

        Safe on a stale view by construction: everything to delete is listed first, then the fence
        is checked, then only the listed files are deleted. A newer writer that opened before the
        check has published its fence (so this writer stops here); one that opens after it writes
        its files after the listing, so none of them is on the list.
        """
        if message.driver_checkpoint is not None:
            self._written = set(message.driver_checkpoint.written) | {
                name for name, f in message.driver_checkpoint.staged.items() if f is not None
            }
        orphans, _kept = open_cleans(self.staging, message.driver_checkpoint)
        if orphans:
            self.fence_check()
        for path in orphans:
            self.staging.delete(path)
        for folder in sorted({dataset_of(p) for p in orphans if p.startswith(STAGED + "/")}) + list(SCRATCH):
            self.staging.prune_empty(folder)  # not delete_prefix: files listed after the check stay
        if orphans:
            datasets = {dataset_of(p) for p in orphans if p.startswith(STAGED + "/")}
            self.collector.event("orphans_deleted", files=len(orphans), datasets=len(datasets))
        return Opened(orphans_deleted=len(orphans))

    # --- Acknowledge ---

    def acknowledge(self, message: Acknowledge) -> Acknowledged:
        epoch = message.epoch
        results = []
        for index, binding in enumerate(self.config.bindings):
            if binding.name not in message.driver_checkpoint.staged:
                continue
            staged = message.driver_checkpoint.staged[binding.name]
            began = time.monotonic()
            if binding.name in message.driver_checkpoint.truncate:
                self._truncate(binding, epoch)
            result = self._apply(binding, epoch, staged)
            results.append(result)
            self.collector.event("applied", epoch=epoch, seconds=time.monotonic() - began, **result.model_dump())
            rejected = message.driver_checkpoint.dead_letters.get(binding.name)
            if rejected is not None:
                # crash here leaves the table applied and its dead letters not: the re-apply skips
                # the table and appends them (their own txn record on the dead-letter table)
                crash.crash_point("after-apply", epoch)
                self._apply_dead_letters(binding, epoch, rejected)
            if index < len(self.config.bindings) - 1:
                # crash here leaves some tables applied and others not: the re-apply skips the former
                crash.crash_point("after-apply", epoch)
        # crash here leaves every table applied and the staged files in place: the next Open keeps
        # them (the entry references them), the first Acknowledge finds them applied and deletes them
        crash.crash_point("after-ack-before-gc", epoch)
        applied = [staged for staged in message.driver_checkpoint.staged.values() if staged is not None]
        applied += list(message.driver_checkpoint.dead_letters.values())
        if applied:
            # Only while this writer holds the log (a fenced one leaves them to the newer writer,
            # whose first Acknowledge finds the epoch applied and deletes them).
            self.fence_check()
        for staged in applied:
            self._staging_of(staged).delete_prefix(staged.uri)
        self._written |= {name for name, staged in message.driver_checkpoint.staged.items() if staged is not None}
        self._acknowledged = epoch
        return Acknowledged(epoch=epoch, results=results)

    def _apply(self, binding: BindingConfig, epoch: int, staged: StagedFile | None) -> ApplyResult:
        table = TableRef(binding.table)
        app_id = self.config.pipeline_id
        replace = False  # True: a killed CREATE's leftovers are in the way (see _check_created_by_us)
        for _attempt in range(CONCURRENT_RETRIES):
            state = table_state(self.apply_spark, table, app_id)
            if state.txn_version is not None and state.txn_version >= epoch:
                # A replay: Delta already records this epoch (or a later one) for the pipeline.
                return ApplyResult(binding=binding.name, table=str(table), status="skipped", rows=0, delta_version=state.version)
            if staged is None and not state.exists:
                # Nothing to write and no schema to create the table with: nothing to record.
                return ApplyResult(binding=binding.name, table=str(table), status="empty")
            source = self._read_staged(binding, epoch, staged, state.exists)
            try:
                with self._txn(binding, epoch), crash.crash_during_spark_job(
                    "mid-apply", epoch, self.apply_spark, self._apply_group, watch=table.location if table.is_path else None
                ):
                    metrics = self._commit(
                        binding, table, epoch, source, state.exists, staged.key_bounds if staged else None,
                        replace=replace and not state.exists,
                    )
            except Exception as exc:  # noqa: BLE001
                # Delta's conflicts: Concurrent*Exception, and Metadata/ProtocolChangedException,
                # which a zombie's MERGE meets after the new writer evolved the schema or created
                # the table: another writer committed meanwhile, so look again.
                if is_commit_conflict(exc):
                    continue
                if is_already_exists(exc):
                    # The table appeared between our look and our CREATE: fine if it is another
                    # run of this pipeline (the loop finds the epoch applied, or merges into it);
                    # another writer's table is not written blindly (README: 'Table layout').
                    replace = self._check_created_by_us(binding, table, epoch)
                    continue
                if isinstance(exc, (ApplyError, StagingError)) or not isinstance(exc, Exception):
                    raise
                raise ApplyError(_refused(self.config.pipeline_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc
            # Only the version, for the report: the txn map would rebuild the snapshot's state.
            after_version = table_version(self.apply_spark, table)
            status = "applied" if metrics is not None else "skipped"
            return ApplyResult(
                binding=binding.name,
                table=str(table),
                status=status if staged is not None or status == "skipped" else "empty",
                rows=staged.rows if staged else 0,
                delta_version=after_version,
                metrics=metrics or {},
            )
        raise StagingError(f"epoch {epoch}, binding {binding.name}: concurrent commits kept conflicting; run again")

    def _read_staged(
        self, binding: BindingConfig, epoch: int, staged: StagedFile | None, table_exists: bool = True
    ) -> "DataFrame | None":
        if staged is None:
            return None
        store = self._staging_of(staged)
        files, size = 0, 0
        for info in store.list(staged.uri):
            if is_data_file(info.path):
                files += 1
                size += info.size
        if (files, size) != (staged.files, staged.bytes):
            found = "nothing" if files == 0 else f"{files} files, {size} bytes"
            if files == 0 and not table_exists:
                # Staged files are deleted only after every table recorded the epoch: a missing
                # table with no staged file is most likely a table deleted after the apply.
                raise TableStateError(
                    f"epoch {epoch}, binding {binding.name}: table {binding.table} does not exist and epoch "
                    f"{epoch}'s staged file {self.staging.uri}/{staged.uri} is gone. Either the table was deleted "
                    f"or moved after epoch {epoch} was applied to it (restore it at {binding.table}, e.g. from a "
                    "backup, then run again), or the staged file was damaged (run `materializer recover --config F`, "
                    "README: 'Recovering from damage'). Nothing was changed."
                )
            raise StagingError(
                f"epoch {epoch}, binding {binding.name}: staged file {self.staging.uri}/{staged.uri} is damaged or "
                f"missing (expected {staged.files} files, {staged.bytes} bytes; found {found}) and the table "
                f"does not record the epoch yet. Nothing of epoch {epoch} was applied to {binding.table}. "
                "Restore the staged file, or run `materializer recover --config F` to re-stage the epoch "
                "from the source (README: 'Recovering from damage')."
            )
        return self.apply_spark.read.parquet(store.spark_path(staged.uri))

    def _staging_of(self, staged: StagedFile) -> FileStore:
        """The store holding ``staged``: this pipeline's area, or for an entry committed by a version
        before the per-pipeline areas (an upgrade between its log commit and its apply), the
        staging folder itself, where that version staged."""
        if self.staging.list(staged.uri) or self.config.staging_root == self.config.staging:
            return self.staging
        from materializer.storage import open_store

        legacy = open_store(self.config.staging)
        return legacy if legacy.list(staged.uri) else self.staging

    @property
    def _apply_group(self) -> str:
        return f"materializer-{self.config.pipeline_id}-apply"

    @property
    def _load_group(self) -> str:
        return f"materializer-{self.config.pipeline_id}-load"

    @contextmanager
    def _txn(self, binding: BindingConfig, epoch: int) -> Iterator[None]:
        # The txn confs are session-wide: set them on the apply session, around this one commit only.
        conf = self.apply_spark.conf
        conf.set(TXN_APP_ID, self.config.pipeline_id)
        conf.set(TXN_VERSION, str(epoch))
        conf.set(USER_METADATA, user_metadata(self.config.pipeline_id, binding.name, epoch))
        materialize = conf.get(MATERIALIZE_SOURCE, None)
        conf.set(MATERIALIZE_SOURCE, "none")
        # A tag (this thread's, on the apply session) names the MERGE's Spark work: what job groups
        # did, on Spark Connect too (``interruptTag`` stops it).
        self.apply_spark.addTag(self._apply_group)
        try:
            yield
        finally:
            for key in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
                conf.unset(key)
            if materialize is None:
                conf.unset(MATERIALIZE_SOURCE)
            else:
                conf.set(MATERIALIZE_SOURCE, materialize)
            self.apply_spark.removeTag(self._apply_group)

    def _commit(
        self,
        binding: BindingConfig,
        table: TableRef,
        epoch: int,
        source: "DataFrame | None",
        table_exists: bool,
        key_bounds: "dict[str, list[str]] | None" = None,
        replace: bool = False,
    ) -> dict[str, int] | None:
        """Make the epoch's one Delta commit; None if Delta skipped it as already applied."""
        from pyspark.sql import functions as F

        meta = user_metadata(self.config.pipeline_id, binding.name, epoch)
        if source is not None and not table_exists:
            return self._create(binding, table, source, epoch, replace=replace)
        if source is None or binding.mode == "delta_updates":
            # Appends onto a table that exists: delta-updates rows, or no rows at all, which still
            # records the epoch on the table (an empty commit carrying the txn id).
            if source is None:
                rows = self.apply_spark.createDataFrame([], read_table(self.apply_spark, table).schema)
            else:
                rows = source
            current = read_table(self.apply_spark, table).schema
            rows = _align(rows, self._widened(table, rows, current), keep_extra=True)
            from pyspark.sql import Observation

            # Counted as the rows are written (no second pass), for the epoch's progress record.
            counted = Observation(f"appended_{binding.name}_{epoch}_{uuid.uuid4().hex[:6]}")
            rows = rows.observe(counted, F.count(F.lit(1)).alias("rows"))
            writer = (
                rows.write.format("delta")
                .mode("append")
                .option("txnAppId", self.config.pipeline_id)
                .option("txnVersion", str(epoch))
                .option("userMetadata", meta)
                .option("mergeSchema", "true")
            )
            before = table_version(self.apply_spark, table)
            writer.save(table.location) if table.is_path else writer.saveAsTable(table.location)
            after = table_version(self.apply_spark, table)
            if after == before:
                return None  # Delta skipped it (the query never ran: do not wait for its count)
            try:
                return {"appended": 1, "num_inserted_rows": int(counted.get["rows"])}
            except Exception:  # noqa: BLE001 - saveAsTable's first write reports no observed row: count unknown
                return {"appended": 1}

        target_schema = read_table(self.apply_spark, table).schema
        aligned = _align(source, self._widened(table, source, target_schema), keep_extra=True)
        if binding.mode == "scd2":
            # Every version of the touched keys, from the staged changes and the table's versions
            # (read by this MERGE's own source, so from the snapshot it commits on).
            aligned = changes.scd2_versions(aligned, read_table(self.apply_spark, table), binding, epoch)
        elif binding.change_controlled:
            aligned = changes.merge_source(aligned, binding)  # the hidden columns, as they are set
        # Delta's SQL, not the Python DeltaTable API: on Spark Connect that API needs a server
        # plugin (delta-connect) that servers, Databricks' included, need not have.
        view = f"materializer_staged_{uuid.uuid4().hex}"
        aligned.createOrReplaceTempView(view)
        evolve = ""
        if _shape(aligned.drop(OP, *changes.staged_only(aligned.columns)).schema) != _shape(target_schema):
            # New columns or sub-fields: only then, since an evolving MERGE is slower (about 10%
            # on a 10M-row table here) even when there is nothing to evolve.
            evolve = " WITH SCHEMA EVOLUTION"
        # The epoch's key bounds narrow the target side only: the MERGE has no clause for target
        # rows the source does not match, so rows outside them were never to be touched.
        bounds = bounds_condition(key_bounds)
        if binding.mode == "scd2":
            merge = changes.scd2_merge_sql(binding, sql_name(table), view, aligned.columns, evolve, bounds)
        elif binding.change_controlled:
            merge = changes.merge_sql(binding, sql_name(table), view, aligned.columns, evolve, bounds)
        else:
            merge = merge_sql(sql_name(table), view, binding.key, [c for c in aligned.columns if c != OP], evolve, bounds)
        try:
            rows = self.apply_spark.sql(merge).collect()
        finally:
            self.apply_spark.catalog.dropTempView(view)
        if not rows:
            return None  # Delta skipped it: the table already records this epoch
        return {k: int(v) for k, v in rows[0].asDict().items() if v is not None}

    def _truncate(self, binding: BindingConfig, epoch: int) -> None:
        """Delete every row of the binding's table in the epoch's tagged commit (``backfill
        --truncate``); skipped, by us or by Delta, once the table records the epoch."""
        table = TableRef(binding.table)
        for _attempt in range(CONCURRENT_RETRIES):
            state = table_state(self.apply_spark, table, self.config.pipeline_id)
            if not state.exists or (state.txn_version is not None and state.txn_version >= epoch):
                return
            try:
                with self._txn(binding, epoch):
                    # An empty table makes no commit: the _apply after this records the epoch.
                    self.apply_spark.sql(f"DELETE FROM {sql_name(table)}").collect()
                return
            except Exception as exc:  # noqa: BLE001
                if is_commit_conflict(exc):
                    continue
                raise ApplyError(_refused(self.config.pipeline_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc
        raise StagingError(f"epoch {epoch}, binding {binding.name}: concurrent commits kept conflicting; run again")

    def _apply_dead_letters(self, binding: BindingConfig, epoch: int, staged: StagedFile) -> ApplyResult:
        """Append the epoch's rejected documents to the binding's dead-letter table, under the
        epoch's txn id: Delta skips a replay, so each lands once (README: 'Dead letters')."""
        assert binding.dead_letters is not None
        table = TableRef(binding.dead_letters)
        app_id = self.config.pipeline_id
        began = time.monotonic()
        for _attempt in range(CONCURRENT_RETRIES):
            state = table_state(self.apply_spark, table, app_id)
            if state.txn_version is not None and state.txn_version >= epoch:
                result = ApplyResult(binding=binding.name, table=str(table), status="skipped", delta_version=state.version)
                break
            rows = self._read_staged(binding, epoch, staged, table_exists=True)
            assert rows is not None
            writer = (
                rows.write.format("delta")
                .mode("append")
                .option("txnAppId", app_id)
                .option("txnVersion", str(epoch))
                .option("userMetadata", user_metadata(app_id, binding.name + DEAD_LETTER_SUFFIX, epoch))
            )
            try:
                with self._txn(binding, epoch):
                    writer.save(table.location) if table.is_path else writer.saveAsTable(table.location)
            except Exception as exc:  # noqa: BLE001
                if is_commit_conflict(exc):
                    continue
                raise ApplyError(_refused(app_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc
            result = ApplyResult(
                binding=binding.name, table=str(table), status="applied", rows=staged.rows,
                delta_version=table_version(self.apply_spark, table), metrics={"dead_letters": staged.rows},
            )
            break
        else:
            raise StagingError(f"epoch {epoch}, binding {binding.name}: concurrent commits kept conflicting; run again")
        self.collector.event("dead_letters_applied", epoch=epoch, seconds=time.monotonic() - began, **result.model_dump())
        return result

    def _widened(self, table: TableRef, source: "DataFrame", target_schema: Any) -> Any:
        """The schema to align the epoch's rows to: the table's, with the columns its type widening
        widens for these rows (so the MERGE's schema evolution widens them instead of a cast)."""
        wider, changed = widened_schema(source.schema, target_schema)
        if not changed:
            return target_schema  # the usual case: no look at the table's properties
        found = detail(self.apply_spark, table)
        return wider if found is not None and widening_enabled(dict(found.get("properties") or {})) else target_schema

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
            "and run again (README: 'Sharing or taking over a table'); otherwise give the binding another table."
        )

    def _create(
        self, binding: BindingConfig, table: TableRef, source: "DataFrame", epoch: int, replace: bool = False
    ) -> dict[str, int]:
        """Create the table with the epoch's rows and the binding's layout, in the epoch's tagged
        commit (the txn confs are set around this call). Raises Spark's "already exists" if the
        table is there by now: the caller reads it again and merges (never a blind append)."""
        from pyspark.sql import functions as F

        if binding.mode == "delta_updates":
            rows = source
        elif binding.change_controlled:
            rows = changes.first_rows(source, binding, epoch)  # tombstones, soft deletes, scd2 versions
        else:
            rows = source.filter(F.col(OP) != "d").drop(OP)
        view = f"materializer_new_{uuid.uuid4().hex}"
        rows.createOrReplaceTempView(view)
        try:
            self.apply_spark.sql(create_table_sql(sql_name(table), view, binding, rows.columns, replace=replace))
        finally:
            self.apply_spark.catalog.dropTempView(view)
        # The CTAS returns no metrics; its history entry has them (one command, no Spark job).
        found = self.apply_spark.sql(f"DESCRIBE HISTORY {sql_name(table)} LIMIT 1").select("operationMetrics").collect()
        written = (found[0]["operationMetrics"] or {}).get("numOutputRows") if found else None
        return {"appended": 1, "created": 1, **({"num_inserted_rows": int(written)} if written is not None else {})}

    def _table_facts(self, binding: BindingConfig) -> "_TableFacts | None":
        """The target's schema, constraints and column mapping as they stand now (None: no table)."""
        table = TableRef(binding.table)
        # DESCRIBE DETAIL is a command: its one row comes back without a Spark job (and it says
        # whether there is a table at all, so no separate existence check).
        found = detail(self.spark, table)
        if found is None:
            return None
        properties = dict(found.get("properties") or {})
        return _TableFacts(
            schema=read_table(self.spark, table).schema,
            constraints={k[len(CONSTRAINT_PREFIX) :]: v for k, v in properties.items() if k.startswith(CONSTRAINT_PREFIX)},
            column_mapping=properties.get("delta.columnMapping.mode", "none") not in ("none", ""),
            type_widening=widening_enabled(properties),
        )

    def _check_schema(self, binding: BindingConfig, df: "DataFrame", facts: "_TableFacts | None") -> None:
        """Refuse, before the epoch is committed, what the MERGE would refuse by the schema alone.

        Invariant 9: an epoch in the log must always be appliable. Names Delta refuses, two names
        that differ only in case (Delta's columns are case-insensitive), and any type the table
        cannot hold losslessly, at any depth (a struct sub-field, an array element, a map value).
        """
        from pyspark.sql.types import StructType

        schema = df.schema
        column_mapping = facts.column_mapping if facts is not None else _default_column_mapping(self.spark)
        problems = _name_problems(schema, "", refuse_characters=not column_mapping)
        if facts is not None:
            data = [f for f in schema.fields if f.name != OP or binding.mode == "delta_updates"]
            if facts.type_widening:
                # Columns the table widens (README: 'Type widening') are no problem.
                _wider, widening = widened_schema(StructType(data), facts.schema)
                data = [f for f in data if f.name not in widening]
            problems += _type_problems(data, facts.schema.fields, "")
        else:
            problems += layout_problems(binding, schema)  # the first epoch creates the table
        if problems:
            raise SourceError(
                f"binding {binding.name}: the epoch's rows cannot be written to table {binding.table}: "
                + "; ".join(problems[:5])
                + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
                + ". Delta would refuse them, so nothing of this transaction was committed or applied. Fix the "
                "documents (or the table, after the pipeline is drained), then run again."
            )

    def _check_rows(self, binding: BindingConfig, staged: StagedFile, schema: Any, facts: "_TableFacts") -> None:
        """Evaluate on the staged rows what Delta checks row by row: NOT NULL, CHECK constraints,
        and values a narrower column type cannot hold. Runs only for tables that have any."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import DecimalType, IntegralType

        present = {f.name: f.dataType for f in schema.fields}
        if facts.type_widening:
            # A column the table widens holds every value: nothing to narrow there.
            for name in widened_schema(schema, facts.schema)[1]:
                present.pop(name)
        narrowable = [
            f.name for f in facts.schema.fields
            if f.name in present and present[f.name] != f.dataType
            and isinstance(f.dataType, (IntegralType, DecimalType)) and isinstance(present[f.name], (IntegralType, DecimalType))
        ]
        if not narrowable and not facts.constraints and all(f.nullable for f in facts.schema.fields):
            return  # nothing Delta checks row by row: no Spark job
        rows = self.spark.read.parquet(self.staging.spark_path(staged.uri))
        if binding.mode == "standard":
            rows = rows.filter(F.col(OP) != "d")  # deletes write no row
        narrowing = []
        for field in facts.schema.fields:
            source = present.get(field.name)
            if source is None or source == field.dataType:
                continue
            if isinstance(field.dataType, (IntegralType, DecimalType)) and isinstance(source, (IntegralType, DecimalType)):
                column = F.col(quote(field.name))
                narrowing.append((f"field {field.name!r} ({source.simpleString()}) holds a value that does not fit "
                                  f"the column's {field.dataType.simpleString()}",
                                  column.isNotNull() & column.try_cast(field.dataType).isNull()))
        checks = narrowing
        if not narrowing or not self._violation(binding, rows, narrowing):
            aligned = _align(rows, facts.schema, keep_extra=True)
            checks = [
                (f"NOT NULL column {f.name!r} would be NULL", F.col(quote(f.name)).isNull())
                for f in facts.schema.fields
                if not f.nullable
            ]
            checks += [
                (f"CHECK constraint {name} ({expr}) is not met", ~F.coalesce(F.expr(expr), F.lit(False)))
                for name, expr in facts.constraints.items()
            ]
            if checks:
                self._violation(binding, aligned, checks)

    def _violation(self, binding: BindingConfig, rows: "DataFrame", checks: list[tuple[str, "Any"]]) -> bool:
        from functools import reduce as fold

        from pyspark.sql import functions as F

        if not checks:
            return False
        flags = [F.when(check, F.lit(i)) for i, (_what, check) in enumerate(checks)]
        first = F.coalesce(*flags) if len(flags) > 1 else flags[0]
        # One row at most, only to name a key in the message: nothing else comes to the driver.
        found = (
            rows.select(*[F.col(quote(k)) for k in binding.key], first.alias("__check"))
            .where(fold(lambda a, b: a | b, [c for _w, c in checks]))
            .limit(1)
            .collect()
        )
        if not found:
            return False
        row = found[0]
        key = ", ".join(f"{k}={row[k]!r}" for k in binding.key)
        raise SourceError(
            f"binding {binding.name}: a row of this epoch (key {key}) cannot be written to table {binding.table}: "
            f"{checks[row['__check']][0]}. Delta would refuse the epoch, so nothing of this transaction was committed "
            "or applied. Fix the documents, or the table's constraint or column type, then run again."
        )

    # --- Load / Flush ---

    def load(self, message: Load) -> None:
        # Queued only: evaluated at Flush, after Acknowledged (read-committed). The event lets
        # tests see that lastWriteWins-only bindings issue no loads.
        self._loads.append(message)
        self.collector.event("load", epoch=(self._acknowledged or 0) + 1, binding=message.binding)

    def flush(self, message: Flush) -> Flushed:
        """Evaluate the queued loads: a join of the keys with the table, after Acknowledged."""
        from pyspark.sql import functions as F

        loaded = []
        for request in self._loads:
            binding = self.config.binding(request.binding)
            table = TableRef(binding.table)
            if not exists(self.spark, table):
                continue
            keys = dataframe(request.keys)
            current = read_table(self.spark, table)
            rows = current.join(keys.select(*[F.col(quote(k)) for k in binding.key]).distinct(), on=binding.key, how="left_semi")
            epoch = (self._acknowledged or 0) + 1
            self.spark.addTag(self._load_group)
            try:
                with crash.crash_during_spark_job("mid-load", epoch, self.spark, self._load_group):
                    # Evaluated now, read-committed: the previous epoch is applied; kept on the executors.
                    rows = rows.localCheckpoint(eager=True)
            finally:
                self.spark.removeTag(self._load_group)
            loaded.append(Loaded(binding=binding.name, rows=rows))
        self._loads = []
        return Flushed(loaded=loaded)

    # --- Store / StartCommit ---

    def store(self, message: Store) -> None:
        self._stored[message.binding] = dataframe(message.documents)
        if message.rejected is not None:
            self._rejected[message.binding] = dataframe(message.rejected)

    def prestage(self, message: Store, epoch: int) -> None:
        """Stage a binding's rows before Acknowledged, while the previous epoch is applied.

        Only for rows that do not depend on the table (a binding with no loads: its rows are the
        epoch's documents combined per key), so this is the runtime's combiner spilling early, not
        a read: the Store of the same DataFrame after Flushed adopts the staged file instead of
        writing it again. A prestaged file no committed entry references is an orphan like any
        other (deleted at the next Open, or by :meth:`discard_prestaged`).
        """
        rows = dataframe(message.documents)
        self._prestaged[message.binding] = (rows, self._stage(message.binding, epoch, rows))

    def discard_prestaged(self) -> None:
        """Delete staged files of a transaction that will not be committed (best effort)."""
        prestaged, self._prestaged = self._prestaged, {}
        for _rows, staged in prestaged.values():
            if staged is not None:
                self.staging.delete_prefix(staged.uri)

    def start_commit(self, message: StartCommit) -> StartedCommit:
        epoch = message.epoch
        staged: dict[str, StagedFile | None] = {}
        dead: dict[str, StagedFile] = {}
        try:
            for name, rejected in sorted(self._rejected.items()):
                file = self._stage(f"{name}{DEAD_LETTER_SUFFIX}", epoch, for_epoch(rejected, name, epoch), key=[])
                if file is not None:
                    dead[name] = file
            self._rejected = {}
            for binding in self.config.bindings:
                df = self._stored.pop(binding.name, None)
                # Left in _prestaged until adopted, so a refusal below discards it too.
                early = self._prestaged.get(binding.name)
                if early is not None and early[0] is not df:
                    # Stored rows other than the prestaged ones: the early file is not this epoch's.
                    self._prestaged.pop(binding.name)
                    if early[1] is not None:
                        self.staging.delete_prefix(early[1].uri)
                    early = None
                if df is None:
                    staged[binding.name] = None
                    continue
                # After Acknowledged: the table's schema includes the previous epoch's changes.
                facts = self._table_facts(binding)
                self._check_schema(binding, df, facts)
                staged[binding.name] = early[1] if early is not None else self._stage(binding.name, epoch, df)
                self._prestaged.pop(binding.name, None)
                file = staged[binding.name]
                if facts is not None and file is not None:
                    self._check_rows(binding, file, df.schema, facts)
        except BaseException:
            self.discard_prestaged()
            self._rejected = {}
            for file in [*staged.values(), *dead.values()]:
                if file is not None:
                    self.staging.delete_prefix(file.uri)
            raise
        # crash here leaves staged files that no committed entry references: the next Open deletes them
        crash.crash_point("after-stage", epoch)
        return StartedCommit(
            driver_checkpoint=DriverCheckpoint(
                epoch=epoch, staged=staged, rewind=message.rewind, written=sorted(self._written), dead_letters=dead
            )
        )

    def _stage(self, binding: str, epoch: int, df: "DataFrame", key: list[str] | None = None) -> StagedFile | None:
        """Write one binding's rows as a uniquely named Parquet dataset; None if there are none."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        path = f"{STAGED}/epoch-{epoch:012d}/{binding}-{uuid.uuid4().hex[:12]}"
        observation = Observation(f"staged_{binding}_{epoch}_{uuid.uuid4().hex[:6]}")
        df = _without_void(df)
        # The key bounds are observed on the same write (no second pass): the MERGE skips by them.
        key = self.config.binding(binding).key if key is None else key
        bounds, kinds = bound_aggregates(df.schema, key)
        df.observe(observation, F.count(F.lit(1)).alias("rows"), *bounds).write.mode("error").parquet(
            self.staging.spark_path(path)
        )
        observed = observation.get
        rows = int(observed["rows"])
        data = [f for f in self.staging.list(path) if is_data_file(f.path)]
        if rows == 0:
            self.staging.delete_prefix(path)
            return None
        return StagedFile(
            uri=path, rows=rows, bytes=sum(f.size for f in data), files=len(data),
            key_bounds=bounds_from(observed, key, kinds) or None,
        )


def merge_sql(
    target: str, source_view: str, key: list[str], columns: list[str], evolve: str = "", target_filter: str = ""
) -> str:
    """The standard-mode MERGE: delete on a delete flag, else update the whole row or insert it.

    ``target_filter``: `` AND …`` predicates on the target alone (the epoch's key bounds,
    :func:`materializer.bounds.bounds_condition`) that Delta uses to skip files."""

    def q(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    condition = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key) + target_filter
    # Target columns unqualified: Delta resolves a column the MERGE adds (schema evolution) only so.
    updates = ", ".join(f"{q(c)} = s.{q(c)}" for c in columns)
    names = ", ".join(q(c) for c in columns)
    values = ", ".join(f"s.{q(c)}" for c in columns)
    return (
        f"MERGE{evolve} INTO {target} t USING {q(source_view)} s ON {condition} "
        f"WHEN MATCHED AND s.{q(OP)} = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {updates} "
        f"WHEN NOT MATCHED AND s.{q(OP)} <> 'd' THEN INSERT ({names}) VALUES ({values})"
    )


def _void_as_string(dtype: Any) -> Any:
    """``dtype`` with every VOID (NullType) inside it made STRING; None if it holds no VOID."""
    from pyspark.sql.types import ArrayType, MapType, NullType, StringType, StructField, StructType

    if isinstance(dtype, NullType):
        return StringType()
    if isinstance(dtype, StructType):
        fields = [_void_as_string(f.dataType) for f in dtype.fields]
        if all(f is None for f in fields):
            return None
        return StructType(
            [StructField(f.name, new or f.dataType, f.nullable) for f, new in zip(dtype.fields, fields)]
        )
    if isinstance(dtype, ArrayType):
        element = _void_as_string(dtype.elementType)
        return None if element is None else ArrayType(element, dtype.containsNull)
    if isinstance(dtype, MapType):
        value = _void_as_string(dtype.valueType)
        return None if value is None else MapType(dtype.keyType, value, dtype.valueContainsNull)
    return None


def _without_void(df: "DataFrame") -> "DataFrame":
    """Parquet cannot hold a VOID column (a field NULL in the whole epoch, inside a struct): stage
    it as a STRING column of NULLs, which the MERGE's alignment casts to the table's type."""
    from pyspark.sql import functions as F

    changed = {f.name: _void_as_string(f.dataType) for f in df.schema.fields}
    if all(t is None for t in changed.values()):
        return df
    return df.select(
        *[F.col(quote(name)).cast(t).alias(name) if t is not None else F.col(quote(name)) for name, t in changed.items()]
    )


def _shape(schema: Any) -> list[tuple[str, str]]:
    """Column names and types, nullability aside: equal shapes need no schema evolution."""
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


CONSTRAINT_PREFIX = "delta.constraints."


@dataclass(frozen=True)
class _TableFacts:
    schema: Any
    """The table's schema (a StructType)."""
    constraints: dict[str, str]
    """CHECK constraints by name: their SQL expressions (``delta.constraints.*`` properties)."""
    column_mapping: bool
    """Column mapping is on: any character is allowed in names."""
    type_widening: bool = False
    """``delta.enableTypeWidening``: a wider type of the same family widens the column."""


def _default_column_mapping(spark: "SparkSession") -> bool:
    """Would a table created now use column mapping (the session's default table properties)?"""
    mode = spark.conf.get("spark.databricks.delta.properties.defaults.columnMapping.mode", "none")
    return (mode or "none").lower() not in ("none", "")


def _name_problems(data_type: Any, path: str, *, refuse_characters: bool) -> list[str]:
    """Field names Delta refuses, at any depth: refused characters, empty, and case-only twins."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, ArrayType):
        return _name_problems(data_type.elementType, path + "[]", refuse_characters=refuse_characters)
    if isinstance(data_type, MapType):
        return _name_problems(data_type.valueType, path + "{}", refuse_characters=refuse_characters)
    if not isinstance(data_type, StructType):
        return []
    problems = []
    seen: dict[str, str] = {}
    for field in data_type.fields:
        where = f"{path}.{field.name}" if path else field.name
        if field.name == "":
            problems.append(f"a field {'in ' + repr(path) + ' ' if path else ''}has an empty name, which Delta refuses")
        elif refuse_characters and any(c in REFUSED_NAME_CHARACTERS for c in field.name):
            problems.append(
                f"field {where!r} has a character Delta refuses in column names (one of ' ,;{{}}()\\n\\t='; "
                "allowed only on a table with column mapping, delta.columnMapping.mode = name)"
            )
        twin = seen.get(field.name.lower())
        if twin is not None:
            problems.append(f"fields {twin!r} and {where!r} differ only in case, which Delta does not tell apart")
        seen[field.name.lower()] = where
        problems += _name_problems(field.dataType, where, refuse_characters=refuse_characters)
    return problems


def _type_problems(source: list[Any], target: list[Any], path: str) -> list[str]:
    """Why fields ``source`` cannot be written into the table's fields ``target`` losslessly."""
    problems = []
    by_name = {f.name: f for f in target}
    by_lower = {f.name.lower(): f for f in target}
    for field in source:
        where = f"{path}.{field.name}" if path else field.name
        wanted = by_name.get(field.name)
        if wanted is None:
            twin = by_lower.get(field.name.lower())
            if twin is not None:
                problems.append(
                    f"field {where!r} differs from the table's {twin.name!r} only in case; Delta's column names are "
                    "case-insensitive, so it would be neither a new column nor the same one"
                )
            continue  # a new column or sub-field: schema evolution adds it
        problem = _type_problem(field.dataType, wanted.dataType, where)
        if problem:
            problems.append(problem)
    return problems


_WIDER = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}


def _type_problem(source: Any, target: Any, where: str) -> str | None:
    """None if a value of type ``source`` fits a column of type ``target`` (nullability aside)."""
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegralType,
        MapType,
        NullType,
        StructType,
    )

    if isinstance(source, NullType) or source == target:
        return None
    if isinstance(source, StructType) and isinstance(target, StructType):
        problems = _type_problems(list(source.fields), list(target.fields), where)
        return "; ".join(problems) or None
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        element = source.elementType
        if isinstance(element, IntegralType) and isinstance(target.elementType, (IntegralType, DecimalType)) and element != target.elementType:
            if not (isinstance(target.elementType, IntegralType) and _WIDER[element.simpleString()] <= _WIDER[target.elementType.simpleString()]):
                return (
                    f"field {where!r} holds array<{element.simpleString()}> but the table's column is "
                    f"{target.simpleString()}, which may not hold every value"
                )
        return _type_problem(element, target.elementType, where + "[]")
    if isinstance(source, MapType) and isinstance(target, MapType):
        return _type_problem(source.keyType, target.keyType, where + "{key}") or _type_problem(
            source.valueType, target.valueType, where + "{}"
        )
    if isinstance(source, IntegralType) and isinstance(target, (IntegralType, DecimalType, FloatType, DoubleType)):
        return None  # narrowing is checked on the staged rows (_check_rows)
    if isinstance(source, DecimalType) and isinstance(target, DecimalType) and target.scale >= source.scale:
        return None  # likewise: each value must fit (fewer decimal places would round silently)
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return None
    return (
        f"field {where!r} arrives as {source.simpleString()} but the table holds {target.simpleString()} there "
        "(no silent conversion: it would lose or change data)"
    )


def _cause(exc: BaseException) -> str:
    """The line of a Spark failure that says what went wrong, without the JVM stack."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    caused = [line for line in lines if line.startswith("Caused by:")]
    if caused:
        line = caused[-1][len("Caused by:") :].strip()
    else:
        line = next((l for l in lines if "[" in l and not l.startswith("at ")), lines[0] if lines else type(exc).__name__)
    line = line.lstrip(": ")
    if ": [" in line and line.split(": [", 1)[0].count(".") > 1:
        line = "[" + line.split(": [", 1)[1]  # drop the Java class name before Spark's error class
    return line[:500]


def _refused(pipeline_id: str, binding: BindingConfig, epoch: int, exc: BaseException) -> str:
    return (
        f"epoch {epoch}, binding {binding.name}: Delta refused to apply the epoch to table {binding.table}: "
        f"{_cause(exc)}. Nothing of epoch {epoch} was applied to {binding.table}; the epoch stays committed, so "
        "every run stops here until it is applied. Fix the table (for example drop or relax the constraint the "
        "rows break), then run again; or set the epoch's rows for this table aside, kept in a file, with "
        f"`materializer recover --config F --skip-epoch {epoch} --binding {binding.name}` (README: 'Stuck epochs')."
    )


def _align(df: "DataFrame", schema: Any, *, keep_extra: bool) -> "DataFrame":
    """Give ``df`` the table's columns and types: missing ones as NULL, new ones kept at the end."""
    from pyspark.sql import functions as F

    from pyspark.sql.types import ArrayType, StructType

    from materializer.reductions import conform, unify_types

    present = {f.name: f.dataType for f in df.schema.fields}
    columns = []
    for field in schema.fields:
        if field.name in present:
            column = F.col(quote(field.name))
            source = present[field.name]
            if isinstance(field.dataType, (StructType, ArrayType)):
                # A plain cast maps struct sub-fields by position and would put values in the
                # wrong sub-field: conform by name, keeping sub-fields the documents add.
                target = (unify_types(field.dataType, source) if keep_extra else None) or field.dataType
                columns.append(conform(column, source, target).alias(field.name))
            else:
                columns.append(column.cast(field.dataType).alias(field.name))
        else:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
    known = {f.name for f in schema.fields}
    if keep_extra:
        columns += [F.col(quote(c)) for c in df.columns if c not in known]
    return df.select(*columns)
