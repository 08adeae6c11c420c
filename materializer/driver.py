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

import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from materializer import crash
from materializer.config import BindingConfig, PipelineConfig
from materializer.delta import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    TableRef,
    read_table,
    sql_name,
    table_state,
    table_version,
    user_metadata,
)
from materializer.errors import StagingError
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
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
"""Delta copies a MERGE's source to disk first unless it is a Delta table ('auto'), in case the
source changes between the MERGE's two passes. A staged file never changes (it is written once
under a unique name and deleted only after the apply), so the copy is pure cost: 'none'."""
SCRATCH = ("spool", "_tmp")
CONCURRENT_RETRIES = 3


def is_data_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return not name.startswith(("_", "."))


class DeltaDriver(Driver):
    def __init__(
        self, spark: "SparkSession", config: PipelineConfig, staging: FileStore, collector: Collector | None = None
    ) -> None:
        self.spark = spark
        self.config = config
        self.staging = staging
        self.collector = collector or Collector()
        self._stored: dict[str, DataFrame] = {}
        self._prestaged: dict[str, tuple[DataFrame, StagedFile | None]] = {}
        self._loads: list[Load] = []
        self._acknowledged: int | None = None
        from materializer.spark import isolated_session

        self.apply_spark = isolated_session(spark)

    # --- Open ---

    def open(self, message: Open) -> Opened:
        """Delete staged files that no committed entry references (Flink's abort of the in-doubt)."""
        keep = set()
        if message.driver_checkpoint is not None:
            keep = {f.uri for f in message.driver_checkpoint.staged.values() if f is not None}
        datasets = {"/".join(info.path.split("/")[:3]) for info in self.staging.list(STAGED)}
        deleted = 0
        for dataset in sorted(datasets - keep):
            deleted += self.staging.delete_prefix(dataset)
        for scratch in SCRATCH:
            deleted += self.staging.delete_prefix(scratch)
        if deleted:
            self.collector.event("orphans_deleted", files=deleted, datasets=len(datasets - keep))
        return Opened(orphans_deleted=deleted)

    # --- Acknowledge ---

    def acknowledge(self, message: Acknowledge) -> Acknowledged:
        epoch = message.epoch
        results = []
        for index, binding in enumerate(self.config.bindings):
            if binding.name not in message.driver_checkpoint.staged:
                continue
            staged = message.driver_checkpoint.staged[binding.name]
            result = self._apply(binding, epoch, staged)
            results.append(result)
            self.collector.event("applied", epoch=epoch, **result.model_dump(exclude={"metrics"}))
            if index < len(self.config.bindings) - 1:
                # crash here leaves some tables applied and others not: the re-apply skips the former
                crash.crash_point("after-apply", epoch)
        # crash here leaves every table applied and the staged files in place: the next Open keeps
        # them (the entry references them), the first Acknowledge finds them applied and deletes them
        crash.crash_point("after-ack-before-gc", epoch)
        for staged in message.driver_checkpoint.staged.values():
            if staged is not None:
                self.staging.delete_prefix(staged.uri)
        self._acknowledged = epoch
        return Acknowledged(epoch=epoch, results=results)

    def _apply(self, binding: BindingConfig, epoch: int, staged: StagedFile | None) -> ApplyResult:
        table = TableRef(binding.table)
        app_id = self.config.pipeline_id
        for _attempt in range(CONCURRENT_RETRIES):
            state = table_state(self.apply_spark, table, app_id)
            if state.txn_version is not None and state.txn_version >= epoch:
                # A replay: Delta already records this epoch (or a later one) for the pipeline.
                return ApplyResult(binding=binding.name, table=str(table), status="skipped", rows=0, delta_version=state.version)
            if staged is None and not state.exists:
                # Nothing to write and no schema to create the table with: nothing to record.
                return ApplyResult(binding=binding.name, table=str(table), status="empty")
            source = self._read_staged(binding, epoch, staged)
            try:
                with self._txn(binding, epoch), crash.crash_during_spark_job(
                    "mid-apply", epoch, self.apply_spark, self._apply_group, watch=table.location if table.is_path else None
                ):
                    metrics = self._commit(binding, table, epoch, source, state.exists)
            except Exception as exc:  # noqa: BLE001
                # Delta's conflicts: Concurrent*Exception, and Metadata/ProtocolChangedException
                # ("changed by a concurrent update"), which a zombie's MERGE meets after the new
                # writer evolved the schema or created the table.
                if "concurrent" not in (type(exc).__name__ + str(exc)).lower():
                    raise
                # Another writer (a zombie about to be fenced) committed meanwhile: look again.
                continue
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

    def _read_staged(self, binding: BindingConfig, epoch: int, staged: StagedFile | None) -> "DataFrame | None":
        if staged is None:
            return None
        files, size = 0, 0
        for info in self.staging.list(staged.uri):
            if is_data_file(info.path):
                files += 1
                size += info.size
        if (files, size) != (staged.files, staged.bytes):
            found = "nothing" if files == 0 else f"{files} files, {size} bytes"
            raise StagingError(
                f"epoch {epoch}, binding {binding.name}: staged file {self.staging.uri}/{staged.uri} is damaged or "
                f"missing (expected {staged.files} files, {staged.bytes} bytes; found {found}) and the table "
                f"does not record the epoch yet. Nothing of epoch {epoch} was applied to {binding.table}. "
                "Restore the staged file, or run `materializer recover --config F` to re-stage the epoch "
                "from the source (README: 'Recovering from damage')."
            )
        return self.apply_spark.read.parquet(self.staging.spark_path(staged.uri))

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
        self, binding: BindingConfig, table: TableRef, epoch: int, source: "DataFrame | None", table_exists: bool
    ) -> dict[str, int] | None:
        """Make the epoch's one Delta commit; None if Delta skipped it as already applied."""
        from pyspark.sql import functions as F

        meta = user_metadata(self.config.pipeline_id, binding.name, epoch)
        if source is None or binding.mode == "delta_updates" or not table_exists:
            # Appends: delta-updates rows; the first rows of a new table; or no rows at all, which
            # still records the epoch on the table (an empty commit carrying the txn id).
            if source is None:
                rows = self.apply_spark.createDataFrame([], read_table(self.apply_spark, table).schema)
            elif binding.mode == "delta_updates":
                rows = source
            else:
                rows = source.filter(F.col(OP) != "d").drop(OP)
            if table_exists:
                rows = _align(rows, read_table(self.apply_spark, table).schema, keep_extra=True)
            writer = (
                rows.write.format("delta")
                .mode("append")
                .option("txnAppId", self.config.pipeline_id)
                .option("txnVersion", str(epoch))
                .option("userMetadata", meta)
                .option("mergeSchema", "true")
            )
            before = table_version(self.apply_spark, table) if table_exists else None
            writer.save(table.location) if table.is_path else writer.saveAsTable(table.location)
            after = table_version(self.apply_spark, table)
            return {"appended": 1} if after != before else None

        target_schema = read_table(self.apply_spark, table).schema
        aligned = _align(source, target_schema, keep_extra=True)
        # Delta's SQL, not the Python DeltaTable API: on Spark Connect that API needs a server
        # plugin (delta-connect) that servers, Databricks' included, need not have.
        view = f"materializer_staged_{uuid.uuid4().hex}"
        aligned.createOrReplaceTempView(view)
        evolve = ""
        if _shape(aligned.drop(OP).schema) != _shape(target_schema):
            # New columns or sub-fields: only then, since an evolving MERGE is slower (about 10%
            # on a 10M-row table here) even when there is nothing to evolve.
            evolve = " WITH SCHEMA EVOLUTION"
        merge = merge_sql(sql_name(table), view, binding.key, [c for c in aligned.columns if c != OP], evolve)
        try:
            rows = self.apply_spark.sql(merge).collect()
        finally:
            self.apply_spark.catalog.dropTempView(view)
        if not rows:
            return None  # Delta skipped it: the table already records this epoch
        return {k: int(v) for k, v in rows[0].asDict().items() if v is not None}

    def _check_types(self, binding: BindingConfig, df: "DataFrame") -> None:
        """Refuse, before the epoch is committed, rows whose types the table cannot hold losslessly."""
        table = TableRef(binding.table)
        from materializer.delta import exists
        from materializer.errors import SourceError

        if not exists(self.spark, table):
            return
        target = {f.name: f.dataType.simpleString() for f in read_table(self.spark, table).schema.fields}
        for field in df.schema.fields:
            wanted = target.get(field.name)
            if wanted is not None and not _compatible(field.dataType.simpleString(), wanted):
                raise SourceError(
                    f"binding {binding.name}: field {field.name!r} arrives as {field.dataType.simpleString()} "
                    f"but table {binding.table} holds {wanted}; writing it would lose data. Nothing from this "
                    "transaction was applied. Fix the documents' type, or alter the table's column type "
                    "(after the pipeline is drained), then run again."
                )

    # --- Load / Flush ---

    def load(self, message: Load) -> None:
        # Queued only: evaluated at Flush, after Acknowledged (read-committed). The event lets
        # tests see that lastWriteWins-only bindings issue no loads.
        self._loads.append(message)
        self.collector.event("load", epoch=(self._acknowledged or 0) + 1, binding=message.binding)

    def flush(self, message: Flush) -> Flushed:
        """Evaluate the queued loads: a join of the keys with the table, after Acknowledged."""
        loaded = []
        for request in self._loads:
            binding = self.config.binding(request.binding)
            table = TableRef(binding.table)
            from materializer.delta import exists

            if not exists(self.spark, table):
                continue
            keys = dataframe(request.keys)
            current = read_table(self.spark, table)
            rows = current.join(keys.select(*binding.key).distinct(), on=binding.key, how="left_semi")
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
        try:
            for binding in self.config.bindings:
                df = self._stored.pop(binding.name, None)
                early = self._prestaged.pop(binding.name, None)
                if early is not None and early[0] is not df:
                    # Stored rows other than the prestaged ones: the early file is not this epoch's.
                    if early[1] is not None:
                        self.staging.delete_prefix(early[1].uri)
                    early = None
                if df is None:
                    staged[binding.name] = None
                    continue
                # After Acknowledged: the table's schema includes the previous epoch's changes.
                self._check_types(binding, df)
                staged[binding.name] = early[1] if early is not None else self._stage(binding.name, epoch, df)
        except BaseException:
            self.discard_prestaged()
            for file in staged.values():
                if file is not None:
                    self.staging.delete_prefix(file.uri)
            raise
        # crash here leaves staged files that no committed entry references: the next Open deletes them
        crash.crash_point("after-stage", epoch)
        return StartedCommit(driver_checkpoint=DriverCheckpoint(epoch=epoch, staged=staged, rewind=message.rewind))

    def _stage(self, binding: str, epoch: int, df: "DataFrame") -> StagedFile | None:
        """Write one binding's rows as a uniquely named Parquet dataset; None if there are none."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        path = f"{STAGED}/epoch-{epoch:012d}/{binding}-{uuid.uuid4().hex[:12]}"
        observation = Observation(f"staged_{binding}_{epoch}_{uuid.uuid4().hex[:6]}")
        df.observe(observation, F.count(F.lit(1)).alias("rows")).write.mode("error").parquet(
            self.staging.spark_path(path)
        )
        rows = int(observation.get["rows"])
        data = [f for f in self.staging.list(path) if is_data_file(f.path)]
        if rows == 0:
            self.staging.delete_prefix(path)
            return None
        return StagedFile(uri=path, rows=rows, bytes=sum(f.size for f in data), files=len(data))


def merge_sql(target: str, source_view: str, key: list[str], columns: list[str], evolve: str = "") -> str:
    """The standard-mode MERGE: delete on a delete flag, else update the whole row or insert it."""

    def q(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    condition = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key)
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


_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
_NUMERIC = _INTEGRAL + ("float", "double")


def _compatible(source: str, target: str) -> bool:
    """Can a staged column of type ``source`` be written to ``target`` without losing anything?"""
    if source == target or source == "void":
        return True
    if source.startswith(("struct", "array", "map")):
        return True  # nested: Delta's schema evolution merges them or says why not
    if source in _INTEGRAL and (target in _NUMERIC or target.startswith("decimal")):
        return True
    return source == "float" and target == "double"


def _align(df: "DataFrame", schema: Any, *, keep_extra: bool) -> "DataFrame":
    """Give ``df`` the table's columns and types: missing ones as NULL, new ones kept at the end."""
    from pyspark.sql import functions as F

    from pyspark.sql.types import ArrayType, StructType

    from materializer.reductions import conform, unify_types

    present = {f.name: f.dataType for f in df.schema.fields}
    columns = []
    for field in schema.fields:
        if field.name in present:
            column = F.col(f"`{field.name}`")
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
        columns += [F.col(f"`{c}`") for c in df.columns if c not in known]
    return df.select(*columns)
