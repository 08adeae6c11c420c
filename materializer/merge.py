"""The Delta apply: the epoch's MERGE (standard mode) or append (delta-updates), tagged with its txn id."""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from materializer import sqltypes
from materializer import changes, crash, events, views
from materializer.bounds import bounds_condition
from materializer.config import BindingConfig, PipelineConfig
from materializer.delta import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    TableRef,
    detail,
    is_commit_conflict,
    latest_version,
    quote,
    read_table,
    sql_name,
    table_state,
    user_metadata,
)
from materializer.errors import ApplyError, ConfigError, StagingError, TableStateError, TxnNotRecordedError
from materializer.layout import create_table_sql, is_already_exists
from materializer.progress import Collector
from materializer.protocol import ApplyResult, StagedFile
from materializer.columns import OP
from materializer.staging import StagingArea
from materializer.widening import widened_schema, widening_enabled

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEAD_LETTER_SUFFIX = "__dead_letters"
"""A binding's dead-letter rows are staged (and tagged) under its name with this suffix."""

MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
"""Delta copies a MERGE's source to disk first unless it is a Delta table ('auto'), in case the
source changes between the MERGE's two passes. A staged file never changes (it is written once
under a unique name and deleted only after the apply), so the copy is pure cost: 'none'."""
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


@dataclass(frozen=True, kw_only=True)
class CommitProperties:
    """Everything about one Delta commit of ours, in one object used by every write path (the
    MERGE, the append, the CREATE, the truncate, the dead letters): deltalake's ``CommitProperties``."""

    txn_app_id: str
    """Delta's ``txnAppId``: the pipeline id. Delta skips a commit whose app id already records a
    version >= :attr:`txn_version` (DESIGN invariant 2)."""
    txn_version: int
    """Delta's ``txnVersion``: the epoch."""
    user_metadata: str
    """The commit's ``userMetadata``: pipeline, binding and epoch, for ``DESCRIBE HISTORY`` (invariant 7)."""
    max_retries: int = CONCURRENT_RETRIES
    """Attempts in all when the commit loses to a concurrent one (each after reading the table again)."""

    @classmethod
    def for_epoch(cls, pipeline_id: str, binding: str, epoch: int, *, max_retries: int = CONCURRENT_RETRIES) -> "CommitProperties":
        return cls(
            txn_app_id=pipeline_id, txn_version=epoch, user_metadata=user_metadata(pipeline_id, binding, epoch),
            max_retries=max_retries,
        )

    def writer_options(self) -> dict[str, str]:
        """The same properties as a DataFrameWriter's options (an append's, a dead-letter append's)."""
        return {"txnAppId": self.txn_app_id, "txnVersion": str(self.txn_version), "userMetadata": self.user_metadata}


def _register_conflict_types(spark: "SparkSession") -> None:
    """Have PySpark raise Delta's conflicts as ``delta.exceptions`` types, on either client: the
    classic client's conversion is installed by importing ``delta.exceptions``, Spark Connect's by
    ``delta.connect.exceptions`` (whose classes subclass the same base types). Done when the
    writer is made: imported only when the first conflict is examined, that one would stay a bare
    Py4JJavaError (a racing first CREATE meets it). :func:`materializer.delta.is_commit_conflict`
    also reads Delta's error class, for a server whose classes the client does not map."""
    try:
        import delta.exceptions  # noqa: F401

        from materializer.spark import is_connect

        if is_connect(spark):
            import delta.connect.exceptions  # noqa: F401
    except ImportError:  # pragma: no cover - delta-spark is a dependency
        pass


class DeltaWriter:
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
        _register_conflict_types(apply_spark)

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
        reading the table again (:attr:`CommitProperties.max_retries` attempts)."""
        table = TableRef(binding.table)
        props = self.properties(binding.name, epoch)
        replace = False  # True: a killed CREATE's leftovers are in the way (see _check_created_by_us)
        for _attempt in range(props.max_retries):
            with self.collector.span("table_state", epoch, binding.name):
                state = table_state(self.apply_spark, table, props.txn_app_id)
            if state.txn_version is not None and state.txn_version >= epoch:
                # A replay: Delta already records this epoch (or a later one) for the pipeline.
                self._keep_view(binding, epoch, changed=False)
                return ApplyResult(binding=binding.name, table=str(table), status="skipped", rows=0, delta_version=state.version)
            if staged is None and not state.exists:
                # Nothing to write and no schema to create the table with: nothing to record.
                return ApplyResult(binding=binding.name, table=str(table), status="empty")
            with self.collector.span("read_staged", epoch, binding.name):
                source = None if staged is None else self.staging_area.read(self.apply_spark, binding, epoch, staged, state.exists)
            try:
                with self.transaction(props), crash.crash_during_spark_job(
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
                    continue
                if is_already_exists(exc):
                    # The table appeared between our look and our CREATE: fine if it is another
                    # run of this pipeline (the loop finds the epoch applied, or merges into it);
                    # another writer's table is not written blindly (docs: 'Table layout').
                    replace = self._check_created_by_us(binding, table, epoch)
                    continue
                if isinstance(exc, (ApplyError, StagingError)) or not isinstance(exc, Exception):
                    raise
                raise ApplyError(_refused(self.config.pipeline_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc
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
            )
        raise StagingError(f"epoch {epoch}, binding {binding.name}: concurrent commits kept conflicting; run again")

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
                    f"created ({_cause(exc)}). The table is applied and the epoch recorded; fix the view's name (its "
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
                    f"this Spark session refuses the Spark conf {key} ({_cause(exc)}). The materializer's "
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
    def transaction(self, props: CommitProperties) -> Iterator[None]:
        """Within the block, the apply session's Delta commits carry ``props``."""
        # The txn confs are session-wide: set them on the apply session, around this one commit only.
        conf = self.apply_spark.conf
        conf.set(TXN_APP_ID, props.txn_app_id)
        conf.set(TXN_VERSION, str(props.txn_version))
        conf.set(USER_METADATA, props.user_metadata)
        materialize = conf.get(MATERIALIZE_SOURCE, None)
        conf.set(MATERIALIZE_SOURCE, "none")
        # A tag (this thread's, on the apply session) names the MERGE's Spark work: what job groups
        # did, on Spark Connect too (``interruptTag`` stops it).
        self.apply_spark.addTag(self.apply_tag)
        try:
            yield
        finally:
            for key in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
                conf.unset(key)
            if materialize is None:
                conf.unset(MATERIALIZE_SOURCE)
            else:
                conf.set(MATERIALIZE_SOURCE, materialize)
            self.apply_spark.removeTag(self.apply_tag)

    def write(
        self,
        binding: BindingConfig,
        table: TableRef,
        props: CommitProperties,
        source: "DataFrame | None",
        table_exists: bool,
        key_bounds: "dict[str, list[str]] | None" = None,
        replace: bool = False,
    ) -> dict[str, int] | None:
        """Make the epoch's one Delta commit (inside :meth:`transaction`): CREATE the table, append,
        or MERGE; its metrics, or None if Delta skipped it as already applied."""
        if source is not None and not table_exists:
            return self.create(binding, table, props, source, replace=replace)
        if source is None or binding.mode == "delta_updates":
            return self.append(binding, table, props, source)
        return self.merge(binding, table, props, source, key_bounds)

    def append(self, binding: BindingConfig, table: TableRef, props: CommitProperties, source: "DataFrame | None") -> dict[str, int] | None:
        """Append onto a table that exists: delta-updates rows, or no rows at all, which still
        records the epoch on the table (an empty commit carrying the txn id)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if source is None:
            # No rows, the table's own schema (no schema object sent from this client: over Connect
            # its strings would come back collated, sqltypes.py).
            rows = read_table(self.apply_spark, table).limit(0)
        else:
            rows = source
        current = read_table(self.apply_spark, table).schema
        rows = align(rows, self._widened(table, rows, current), keep_extra=True)
        # Counted as the rows are written (no second pass), for the epoch's progress record.
        counted = Observation(f"appended_{binding.name}_{props.txn_version}_{uuid.uuid4().hex[:6]}")
        rows = rows.observe(counted, F.count(F.lit(1)).alias("rows"))
        writer = rows.write.format("delta").mode("append").options(**props.writer_options()).option("mergeSchema", "true")
        before = latest_version(self.apply_spark, table)
        writer.save(table.location) if table.is_path else writer.saveAsTable(table.location)
        after = latest_version(self.apply_spark, table)
        if after == before:
            return None  # Delta skipped it (the query never ran: do not wait for its count)
        try:
            return {"appended": 1, "num_inserted_rows": int(counted.get["rows"])}
        except Exception:  # noqa: BLE001 - saveAsTable's first write reports no observed row: count unknown
            return {"appended": 1}

    def merge(
        self, binding: BindingConfig, table: TableRef, props: CommitProperties, source: "DataFrame",
        key_bounds: "dict[str, list[str]] | None" = None,
    ) -> dict[str, int] | None:
        """MERGE the staged rows by key (standard, change-controlled or scd2 mode)."""
        epoch = props.txn_version
        target_schema = read_table(self.apply_spark, table).schema
        aligned = align(source, self._widened(table, source, target_schema), keep_extra=True)
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
        if _shape(aligned.drop(OP, *changes.staged_only(aligned.columns, binding)).schema) != _shape(target_schema):
            # New columns or sub-fields: only then, since an evolving MERGE is slower (about 10%
            # on a 10M-row table here) even when there is nothing to evolve.
            evolve = " WITH SCHEMA EVOLUTION"
        # The epoch's key bounds narrow the target side only: the MERGE has no clause for target
        # rows the source does not match, so rows outside them were never to be touched.
        bounds = bounds_condition(key_bounds)
        if binding.mode == "scd2":
            merge = changes.scd2_merge_sql(binding, sql_name(table), view, aligned.columns, evolve, bounds)
        elif binding.change_controlled:
            merge = changes.merge_sql(
                binding, sql_name(table), view, aligned.columns, evolve, bounds, target_columns=target_schema.fieldNames()
            )
        else:
            merge = merge_sql(sql_name(table), view, binding.key, [c for c in aligned.columns if c != OP], evolve, bounds)
        try:
            rows = self.apply_spark.sql(merge).collect()
        finally:
            self.apply_spark.catalog.dropTempView(view)
        if not rows:
            return None  # Delta skipped it: the table already records this epoch
        return {k: int(v) for k, v in rows[0].asDict().items() if v is not None}

    def truncate(self, binding: BindingConfig, epoch: int) -> None:
        """Delete every row of the binding's table in the epoch's tagged commit (``backfill
        --truncate``); skipped, by us or by Delta, once the table records the epoch."""
        table = TableRef(binding.table)
        props = self.properties(binding.name, epoch)
        for _attempt in range(props.max_retries):
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
                    continue
                raise ApplyError(_refused(self.config.pipeline_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc
        raise StagingError(f"epoch {epoch}, binding {binding.name}: concurrent commits kept conflicting; run again")

    def append_dead_letters(self, binding: BindingConfig, epoch: int, staged: StagedFile) -> ApplyResult:
        """Append the epoch's rejected documents to the binding's dead-letter table, under the
        epoch's txn id: Delta skips a replay, so each lands once (docs: 'Dead letters')."""
        assert binding.dead_letters is not None
        table = TableRef(binding.dead_letters)
        app_id = self.config.pipeline_id
        props = self.properties(binding.name + DEAD_LETTER_SUFFIX, epoch)
        began = time.monotonic()
        for _attempt in range(props.max_retries):
            state = table_state(self.apply_spark, table, app_id)
            if state.txn_version is not None and state.txn_version >= epoch:
                result = ApplyResult(binding=binding.name, table=str(table), status="skipped", delta_version=state.version)
                break
            rows = self.staging_area.read(self.apply_spark, binding, epoch, staged)
            writer = rows.write.format("delta").mode("append").options(**props.writer_options())
            try:
                with self.transaction(props):
                    writer.save(table.location) if table.is_path else writer.saveAsTable(table.location)
            except Exception as exc:  # noqa: BLE001
                if is_commit_conflict(exc):
                    continue
                raise ApplyError(_refused(app_id, binding, epoch, exc), epoch=epoch, binding=binding.name) from exc
            result = ApplyResult(
                binding=binding.name, table=str(table), status="applied", rows=staged.rows,
                delta_version=latest_version(self.apply_spark, table), metrics={"dead_letters": staged.rows},
            )
            break
        else:
            raise StagingError(f"epoch {epoch}, binding {binding.name}: concurrent commits kept conflicting; run again")
        self.collector.emit(events.DeadLettersApplied.of(result, epoch=epoch, seconds=time.monotonic() - began))
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
            "and run again (docs: 'Sharing or taking over a table'); otherwise give the binding another table."
        )

    def create(
        self, binding: BindingConfig, table: TableRef, props: CommitProperties, source: "DataFrame", replace: bool = False
    ) -> dict[str, int]:
        """Create the table with the epoch's rows and the binding's layout, in the epoch's tagged
        commit (inside :meth:`transaction`). Raises Spark's "already exists" if the table is there
        by now: the caller reads it again and merges (never a blind append)."""
        from pyspark.sql import functions as F

        epoch = props.txn_version
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


def _shape(schema: Any) -> list[tuple[str, str]]:
    """Column names and types, nullability aside: equal shapes need no schema evolution."""
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


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
        f"`materializer recover --config F --skip-epoch {epoch} --binding {binding.name}` (docs: 'Stuck epochs')."
    )


def align(df: "DataFrame", schema: Any, *, keep_extra: bool) -> "DataFrame":
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
                columns.append(column.cast(sqltypes.plain(field.dataType)).alias(field.name))
        else:
            columns.append(F.lit(None).cast(sqltypes.plain(field.dataType)).alias(field.name))
    known = {f.name for f in schema.fields}
    if keep_extra:
        columns += [F.col(quote(c)) for c in df.columns if c not in known]
    return df.select(*columns)
