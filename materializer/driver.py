"""The Delta driver: stage each epoch to Parquet, then idempotently apply it with Delta's txn ids.

The driver answers the protocol's messages (validate before Open, open, load, flush, store,
prestage, start_commit, acknowledge) and delegates: the staged datasets to
:class:`materializer.staging.StagingArea` (``staged/epoch-<epoch>/<binding>-<random>/``, a Parquet
dataset written by Spark, named in the driver checkpoint with its row count, file count and byte
size), the Delta writes to :class:`materializer.merge.DeltaWriter`. What it keeps is the checks:
the tables against the log at Open, the epoch's rows against the table before StartCommit
(invariant 9). StartCommit stages and checks the bindings side by side, and Acknowledge applies
them side by side, ``transaction.parallel_bindings`` at a time (:func:`materializer.side_by_side.run_each`;
``1``: in binding order, one after another), each apply thread in an apply session of its own:

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

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from materializer import crash, events
from materializer.config import BindingConfig, PipelineConfig
from materializer.delta import (
    TableRef,
    detail,
    exists,
    metadata_fingerprint,
    quote,
    read_table,
    schema_and_properties,
    table_identity,
    table_state,
    table_writers,
)
from materializer.dead_letters import for_epoch
from materializer.errors import ConfigError, SourceError, TableStateError
from materializer.layout import existing_layout_problems, layout_problems
from materializer.tables import RETENTION_DEFAULT_CONF, RETENTION_WHY
from materializer.widening import widened_schema, widening_enabled
from materializer import option_changes
from materializer.option_changes import table_options
from materializer.merge import DEAD_LETTER_SUFFIX, DeltaWriter, align
from materializer.staging import StagingArea
from materializer.side_by_side import run_each
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
from materializer.columns import OP
from materializer.storage import Store as FileStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REFUSED_NAME_CHARACTERS = " ,;{}()\n\t="
"""Characters Delta refuses in column names unless the table uses column mapping."""


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
        self.staging_area = StagingArea.of(config, staging)
        """Staging, checking and deleting the epochs' datasets (``staging``'s layout)."""
        self.collector = collector or Collector()
        self.fence_check = fence_check or (lambda: None)
        """Raises FencedError if a newer writer holds the log: called after listing what to
        delete and before deleting it (DESIGN invariant 10)."""
        self._written: set[str] = set()
        self._txn_proven: set[str] = set()
        """Bindings whose table was seen recording this run's txn id after an apply."""
        """Bindings whose tables hold rows of an applied epoch (so the table must exist)."""
        self._stored: dict[str, DataFrame] = {}
        self._rejected: dict[str, DataFrame] = {}
        self._prestaged: dict[str, tuple[DataFrame, StagedFile | None]] = {}
        self._loads: list[Load] = []
        self._acknowledged: int | None = None
        from materializer.spark import isolated_session

        self.parallel = config.transaction.parallel_bindings
        """How many bindings are staged and applied at once (``transaction.parallel_bindings``)."""
        self.apply_spark = isolated_session(spark)
        self.writer = DeltaWriter(self.apply_spark, config, self.staging_area, self.collector)
        """The MERGEs and appends of each epoch, in the apply session (:mod:`materializer.merge`)."""
        self._writers: list[DeltaWriter] = [self.writer]
        """One writer per apply thread, each in a session of its own (the txn confs are
        session-wide); made as an epoch first needs them (:meth:`_writer`)."""
        self._facts: dict[str, tuple[str, _TableFacts]] = {}
        """binding -> its table's facts and the metadata fingerprint they were read at (:meth:`_table_facts`)."""
        self._lock = threading.Lock()
        self._shared_session = self.apply_spark is spark
        """No isolated session here (pyspark 4.0's Connect client): applies stay one at a time."""
        if self.parallel > 1:
            _set_pool(self.apply_spark, 0)

    # --- Open ---

    def open(self, message: Open) -> Opened:
        """Check that what each table records is ours and agrees with the log, then delete staged
        files that no committed entry references (Flink's abort of the in-doubt), only while this
        writer holds the log (:meth:`StagingArea.delete_unreferenced`)."""
        self.writer.probe_txn_confs()
        with self.collector.span("check_tables", message.last_epoch):
            self._check_tables(message.last_epoch, message.driver_checkpoint)
        if message.driver_checkpoint is not None:
            self._written = set(message.driver_checkpoint.written) | {
                name for name, f in message.driver_checkpoint.staged.items() if f is not None
            }
        files, datasets = self.staging_area.delete_unreferenced(message.driver_checkpoint, self.fence_check)
        if files:
            self.collector.emit(events.OrphansDeleted(files=files, datasets=datasets))
        return Opened(orphans_deleted=files)

    # --- before Open, and at Open: the tables against the configuration and the log ---

    def validate(self) -> None:
        """Before Open (so a wrong configuration fences no running writer): two bindings on one
        table, and a session default that every table we create would inherit."""
        self._check_distinct_tables()
        self._check_retention_default()

    def _check_distinct_tables(self) -> None:
        """Two bindings on one table, however spelled (DESIGN invariant 10): their MERGEs would carry
        the same txn id and version, and Delta would skip the second binding's rows."""
        seen: dict[str, str] = {}
        for binding in self.config.bindings:
            identity = table_identity(self.spark, TableRef(binding.table))
            if identity in seen:
                raise ConfigError(
                    f"bindings {seen[identity]!r} and {binding.name!r} write to the same table ({identity}, "
                    f"spelled {self.config.binding(seen[identity]).table!r} and {binding.table!r}): a table takes one "
                    "binding, or the second one's rows would be skipped as already applied. Give each binding its "
                    "own table. Nothing was started."
                )
            seen[identity] = binding.name

    def _check_tables(self, last_epoch: int, checkpoint: DriverCheckpoint | None) -> None:
        """Once per run, before anything is written: what each table records must be ours.

        * a later epoch than the log: the log was lost or swapped;
        * a table this pipeline wrote rows to that is gone: deleted or moved by someone;
        * commits of another pipeline or binding, or another writer's txn ids: a rename or a new
          pipeline_id over existing tables would read the source again and write it twice.
        """
        written = set(checkpoint.written) if checkpoint else set()
        if checkpoint is not None:
            self._check_removed(checkpoint)
        for binding in self.config.bindings:
            table = TableRef(binding.table)
            state = table_state(self.spark, table, self.config.pipeline_id)
            if state.txn_version is not None and state.txn_version > last_epoch:
                raise TableStateError(
                    f"table {binding.table} records epoch {state.txn_version} for pipeline "
                    f"{self.config.pipeline_id!r} but the recovery log {self.config.recovery_log} ends at epoch "
                    f"{last_epoch}: the log was deleted or replaced. Restore the log, or give the pipeline a "
                    "new pipeline_id and new tables to start over; nothing was changed."
                )
            if not state.exists:
                if binding.name in written:
                    raise TableStateError(_table_gone(self.config.pipeline_id, binding.name, binding.table, last_epoch))
                continue
            self._check_layout(binding, table)
            self._check_writers(binding, table)
            self._check_options(binding, table, state.txn_version, checkpoint, last_epoch)

    def _check_removed(self, checkpoint: DriverCheckpoint) -> None:
        """A binding the last committed epoch staged rows (or dead letters) for, no longer in the
        configuration: its tables must record that epoch, or the rows would be dropped without a
        word (Acknowledge applies the configured bindings only). Open re-acknowledges the last epoch
        whether or not it was applied, so each table says which: applied, the binding may go; not,
        the run stops here, before anything is read or committed."""
        configured = {b.name for b in self.config.bindings}
        owed = [
            (name, key, staged)
            for kind, suffix in ((checkpoint.staged, ""), (checkpoint.dead_letters, DEAD_LETTER_SUFFIX))
            for name, staged in kind.items()
            if staged is not None and name not in configured and name not in checkpoint.skipped
            for key in [name + suffix]
        ]
        for name, key, staged in sorted(owed, key=lambda item: item[1]):
            table = checkpoint.tables.get(key)
            if table is not None:
                state = table_state(self.spark, TableRef(table), self.config.pipeline_id)
                if state.txn_version is not None and state.txn_version >= checkpoint.epoch:
                    continue
                where = f"table {table} records epoch {state.txn_version}" if state.exists else f"table {table} does not exist yet"
            else:
                # An entry written before the checkpoint named its tables: the staged files tell
                # (Acknowledge deletes them once every table of the epoch is applied).
                if not self.staging_area.store_of(staged).list(staged.uri):
                    continue
                where = f"its staged files {staged.uri} are still there"
            raise ConfigError(
                f"binding {name!r} is not in the configuration, but the last committed epoch ({checkpoint.epoch}) "
                f"staged rows for it that are not applied yet ({where}). Removing the binding now would drop "
                f"those rows. Put it back for one run, so epoch {checkpoint.epoch} is applied, then remove it (or, "
                "if it was renamed, name its old name in the new binding's `previous_names`). Nothing was changed."
            )

    def _check_options(
        self, binding: BindingConfig, table: TableRef, applied: int | None, checkpoint: DriverCheckpoint | None, last_epoch: int
    ) -> None:
        """Options changed since the last committed epoch (or against what the table holds) apply
        by their rule or stop the run here, before anything is read or committed
        (:mod:`materializer.option_changes`); what a rule adds to the table is added now."""
        facts = schema_and_properties(self.spark, table)
        if facts is None:
            return
        recorded = None
        if checkpoint is not None:
            for name in (binding.name, *binding.previous_names):
                if name in checkpoint.options:
                    recorded = checkpoint.options[name]
                    break
        pending = (
            checkpoint is not None
            and checkpoint.staged.get(binding.name) is not None
            and binding.name not in checkpoint.skipped
            and (applied is None or applied < checkpoint.epoch)
        )
        option_changes.check(binding, recorded, facts[0], facts[1], pending)
        self._add_deleted_columns(binding, table, facts[0], last_epoch)

    def _add_deleted_columns(self, binding: BindingConfig, table: TableRef, schema: Any, epoch: int) -> None:
        """``sequence_by`` or ``soft_delete`` set on a table made without them: add ``__deleted``
        (false on every stored row, so ``WHERE NOT __deleted`` still finds them) and, for soft deletes,
        ``__deleted_at``, before the first epoch that needs them is applied.

        One MERGE of the table with its own keys, with schema evolution: the columns and their values
        arrive in one commit (tagged, with no txn id: the epoch's own MERGE still records the epoch),
        so a crash leaves either nothing or both, and the next Open finds them there. The last epoch
        is applied by then (option_changes refuses a change while it is not): staged work is drained
        before the schema changes (DESIGN: Delta apply)."""
        from materializer.changes import DELETED, DELETED_AT, tombstones
        from materializer.delta import USER_METADATA, sql_name, user_metadata

        if binding.mode != "standard" or not tombstones(binding):
            return
        names = {f.name for f in schema.fields}
        missing = {}
        if DELETED not in names:
            missing[DELETED] = "false"
        if binding.soft_delete and DELETED_AT not in names:
            missing[DELETED_AT] = "CAST(NULL AS TIMESTAMP)"
        if not missing:
            return
        target = sql_name(table)
        keys = ", ".join(quote(k) for k in binding.key)
        values = ", ".join(f"{v} AS {quote(c)}" for c, v in missing.items())
        on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in binding.key)
        sets = ", ".join(f"{quote(c)} = s.{quote(c)}" for c in missing)
        conf = self.apply_spark.conf
        conf.set(USER_METADATA, user_metadata(self.config.pipeline_id, binding.name, epoch))
        try:
            self.apply_spark.sql(
                f"MERGE WITH SCHEMA EVOLUTION INTO {target} t USING (SELECT {keys}, {values} FROM {target}) s ON {on} "
                f"WHEN MATCHED THEN UPDATE SET {sets}"
            ).collect()
        finally:
            conf.unset(USER_METADATA)

    def _check_retention_default(self) -> None:
        """A session default for the txn retention would reach every table we create."""
        value = self.spark.conf.get(RETENTION_DEFAULT_CONF, None)
        if value:
            raise ConfigError(
                f"the Spark session sets {RETENTION_DEFAULT_CONF} = {value}, which new tables inherit: {RETENTION_WHY}. "
                "Remove the setting (spark.conf in the configuration, or the cluster's). Nothing was started."
            )

    def _check_layout(self, binding: BindingConfig, table: TableRef) -> None:
        """An existing table must keep every txn id, and not contradict the binding's layout."""
        if binding.partition_by or binding.cluster_by:
            found = detail(self.spark, table)  # its partition and clustering columns
        else:
            # Only the properties (the txn retention): no DESCRIBE DETAIL, whose file statistics
            # cost 3 Spark jobs at every Open (a replay in a running process is little else).
            facts = schema_and_properties(self.spark, table)
            found = {"properties": facts[1]} if facts is not None else None
        problems = existing_layout_problems(binding, found) if found is not None else []
        if problems:
            raise TableStateError(
                f"binding {binding.name!r}: table {binding.table} cannot be written as configured: "
                + "; ".join(problems)
                + ". Change the table (ALTER TABLE … UNSET TBLPROPERTIES for the retention) or the binding, then run "
                "again (docs: 'Table layout'). Nothing was written."
            )

    def _check_writers(self, binding: BindingConfig, table: TableRef) -> None:
        pipeline = self.config.pipeline_id
        ours = {binding.name, *binding.previous_names}
        writers = table_writers(self.spark, table)
        first_own = min((first for (p, b), (first, _last) in writers.tags.items() if p == pipeline and b in ours), default=None)
        foreign: dict[str, int] = {}
        for (p, b), (_first, last_version) in writers.tags.items():
            if not (p == pipeline and b in ours):
                foreign[f"binding {b!r} of pipeline {p!r}" if p != pipeline else f"binding {b!r} of this pipeline"] = last_version
        for app, last_version in writers.app_ids.items():
            if app != pipeline and not any(p == app for p, _b in writers.tags):
                foreign[f"a writer with Delta transaction id {app!r}"] = last_version
        # Commits before this binding's first one were taken over then (adopt_table, once).
        foreign = {who: v for who, v in foreign.items() if first_own is None or v > first_own}
        if not foreign or binding.adopt_table:
            return
        who = ", ".join(f"{w} (up to Delta version {v})" for w, v in sorted(foreign.items(), key=lambda i: i[1])[:3])
        renamed = [b for (p, b) in writers.tags if p == pipeline and b not in ours]
        hint = (
            f"If binding {binding.name!r} is binding {renamed[0]!r} renamed, add `previous_names: [{renamed[0]}]` to it: "
            "its place in the source is taken over and nothing is read twice. "
            if renamed
            else ""
        )
        raise TableStateError(
            f"binding {binding.name!r}: table {binding.table} holds commits of {who}"
            + (", made after this binding's own" if first_own is not None else "")
            + ". Writing it would re-apply rows that are already there (a new pipeline_id or a renamed binding "
            "reads its source again from the start) or mix two writers in one table. "
            + hint
            + "To write to the table anyway, set `adopt_table: true` on the binding (docs: 'Sharing or taking "
            "over a table'). Nothing was written."
        )

    # --- Acknowledge ---

    def acknowledge(self, message: Acknowledge) -> Acknowledged:
        """Apply the epoch's staged datasets, ``transaction.parallel_bindings`` tables at once, each
        thread in an apply session of its own; Acknowledged only once every table is applied.

        A failure in one binding starts no further binding; the applies in flight end (each is one
        Delta commit, whole or absent), then the failure is raised naming its binding. The tables
        applied by then record the epoch, so the re-apply skips them."""
        epoch = message.epoch
        checkpoint = message.driver_checkpoint
        todo = [binding for binding in self.config.bindings if binding.name in checkpoint.staged]

        def apply(binding: BindingConfig, slot: int) -> ApplyResult:
            writer = self._writer(slot)
            staged = checkpoint.staged[binding.name]
            began = time.monotonic()
            if binding.name in checkpoint.truncate:
                writer.truncate(binding, epoch)
            result = writer.apply(binding, epoch, staged)
            if result.status == "applied" and binding.name not in self._txn_proven:
                # Once per table and run (invariant 13): Delta recorded the txn id of that commit.
                writer.prove_txn_recorded(binding, epoch)
                with self._lock:
                    self._txn_proven.add(binding.name)
            self.collector.emit(events.Applied.of(result, epoch=epoch, seconds=time.monotonic() - began))
            rejected = checkpoint.dead_letters.get(binding.name)
            if rejected is not None:
                # crash here leaves the table applied and its dead letters not: the re-apply skips
                # the table and appends them (their own txn record on the dead-letter table)
                crash.crash_point("after-apply", epoch)
                writer.append_dead_letters(binding, epoch, rejected)
            return result

        def between_tables(_binding: BindingConfig, _result: ApplyResult, unfinished: int) -> None:
            if unfinished:
                # crash here leaves some tables applied and others not: the re-apply skips the former.
                # Fired when the first table's apply has ended; with parallel_bindings > 1 the others
                # may be mid-MERGE by then (uncommitted, as at mid-apply) or already committed.
                crash.crash_point("after-apply", epoch)

        results = run_each(
            todo, apply, workers=self._apply_workers(len(todo)), name="materializer-apply",
            after_each=between_tables, label=lambda b: f"binding {b.name} (epoch {epoch}'s apply)",
        )
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
            self.staging_area.delete_applied(staged)
        self._written |= {name for name, staged in message.driver_checkpoint.staged.items() if staged is not None}
        self._acknowledged = epoch
        return Acknowledged(epoch=epoch, results=results)

    def keep_alive(self) -> None:
        """Touch every Spark Connect session this driver holds (one config read each): the server
        closes a session that has made no call for ``spark.connect.session.manager.defaultSessionTimeout``
        (an hour by default), and a following run with nothing to read makes none. Classic
        sessions are not touched."""
        from materializer.spark import is_connect

        if not is_connect(self.spark):
            return
        sessions = {id(s): s for s in [self.spark, self.apply_spark, *[w.apply_spark for w in self._writers]]}
        for session in sessions.values():
            session.conf.get("spark.sql.session.timeZone")

    def _apply_workers(self, bindings: int) -> int:
        return 1 if self._shared_session else max(1, min(self.parallel, bindings))

    def _writer(self, slot: int) -> DeltaWriter:
        """The apply writer of thread ``slot``: the first is :attr:`writer`, the others are made in
        sessions of their own on first use, each in a FAIR pool of its own."""
        with self._lock:
            while len(self._writers) <= slot:
                from materializer.spark import isolated_session

                session = isolated_session(self.spark)
                _set_pool(session, len(self._writers))
                self._writers.append(DeltaWriter(session, self.config, self.staging_area, self.collector))
            return self._writers[slot]

    @property
    def _load_group(self) -> str:
        return f"materializer-{self.config.pipeline_id}-load"

    def _table_facts(self, binding: BindingConfig) -> "_TableFacts | None":
        """The target's schema, constraints and column mapping as they stand now (None: no table).

        Kept from one epoch to the next while the table's Delta metadata and protocol are the ones
        they were read from (:func:`materializer.delta.metadata_fingerprint`): an epoch's MERGE
        that adds no column leaves them, while any commit that changes them (another writer's
        ALTER or constraint, a schema evolution, a replaced table) makes the check read them
        again, so each epoch is still checked against the table as it is. The fingerprint comes
        from delta-rs (milliseconds) where its answer is trusted; elsewhere (a catalog table,
        Spark Connect) the facts are read again each epoch."""
        table = TableRef(binding.table)
        fingerprint = metadata_fingerprint(self.spark, table)  # before the facts: a change in between only re-reads
        cached = self._facts.get(binding.name)
        if fingerprint is not None and cached is not None and cached[0] == fingerprint:
            return cached[1]
        # Not DESCRIBE DETAIL: its file statistics cost 3 Spark jobs per epoch after each MERGE;
        # the schema and properties come from the snapshot's metadata without a job.
        found = schema_and_properties(self.spark, table)
        if found is None:
            self._facts.pop(binding.name, None)
            return None
        schema, properties = found
        facts = _TableFacts(
            schema=schema,
            constraints={k[len(CONSTRAINT_PREFIX) :]: v for k, v in properties.items() if k.startswith(CONSTRAINT_PREFIX)},
            column_mapping=properties.get("delta.columnMapping.mode", "none") not in ("none", ""),
            type_widening=widening_enabled(properties),
        )
        if fingerprint is not None:
            self._facts[binding.name] = (fingerprint, facts)
        return facts

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
                # Columns the table widens (docs: 'Type widening') are no problem.
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
            aligned = align(rows, facts.schema, keep_extra=True)
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
        self.collector.emit(events.LoadQueued(epoch=(self._acknowledged or 0) + 1, binding=message.binding))

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
        self.staging_area.discard(staged for _rows, staged in prestaged.values())

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
            todo: list[tuple[BindingConfig, DataFrame, tuple[DataFrame, StagedFile | None] | None]] = []
            for binding in self.config.bindings:
                df = self._stored.pop(binding.name, None)
                # Left in _prestaged until adopted, so a refusal below discards it too.
                early = self._prestaged.get(binding.name)
                if early is not None and early[0] is not df:
                    # Stored rows other than the prestaged ones: the early file is not this epoch's.
                    self._prestaged.pop(binding.name)
                    self.staging_area.discard([early[1]])
                    early = None
                if df is None:
                    staged[binding.name] = None
                    continue
                todo.append((binding, df, early))

            def stage(item: tuple[BindingConfig, "DataFrame", Any], _slot: int) -> None:
                binding, df, early = item
                # After Acknowledged: the table's schema includes the previous epoch's changes.
                facts = self._table_facts(binding)
                self._check_schema(binding, df, facts)
                # Named in `staged` as soon as it is written (each thread its own key), so a failure
                # of any binding discards it below.
                staged[binding.name] = early[1] if early is not None else self._stage(binding.name, epoch, df)
                self._prestaged.pop(binding.name, None)
                file = staged[binding.name]
                if facts is not None and file is not None:
                    self._check_rows(binding, file, df.schema, facts)

            # Side by side on the runtime's session (staging commits nothing to Delta); a failure
            # raises once every binding in flight has ended, so nothing is still being written.
            run_each(
                todo, stage, workers=self.parallel, name="materializer-stage",
                label=lambda item: f"binding {item[0].name} (epoch {epoch}'s staging)",
            )
            staged = {b.name: staged[b.name] for b in self.config.bindings if b.name in staged}  # binding order
        except BaseException:
            self.discard_prestaged()
            self._rejected = {}
            self.staging_area.discard([*staged.values(), *dead.values()])
            raise
        # crash here leaves staged files that no committed entry references: the next Open deletes them
        crash.crash_point("after-stage", epoch)
        return StartedCommit(
            driver_checkpoint=DriverCheckpoint(
                epoch=epoch, staged=staged, rewind=message.rewind, written=sorted(self._written), dead_letters=dead,
                options={b.name: table_options(b) for b in self.config.bindings},
                tables={
                    **{b.name: b.table for b in self.config.bindings if staged.get(b.name) is not None},
                    **{b.name + DEAD_LETTER_SUFFIX: str(b.dead_letters) for b in self.config.bindings if b.name in dead},
                },
            )
        )

    def _stage(self, name: str, epoch: int, df: "DataFrame", key: list[str] | None = None) -> StagedFile | None:
        return self.staging_area.stage(name, epoch, df, self.config.binding(name).key if key is None else key)


CONSTRAINT_PREFIX = "delta.constraints."

SCHEDULER_POOL = "spark.scheduler.pool"
"""A session conf Spark copies into the local properties of each SQL execution's jobs: the FAIR
scheduler pool they run in (``spark.scheduler.mode=FAIR``, set where the session is built)."""


def _set_pool(session: "SparkSession", slot: int) -> None:
    """Put apply thread ``slot``'s session in a FAIR pool of its own, so one big MERGE does not take
    every core from the small ones. Under FIFO scheduling, or where the conf is refused, it is only
    a name: the applies still run side by side."""
    try:
        session.conf.set(SCHEDULER_POOL, f"materializer-{slot}")
    except Exception:  # noqa: BLE001 - a compute that refuses the conf: one pool for all
        pass


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


def _type_problems(source: list[Any], target: list[Any], path: str, nested: bool = False) -> list[str]:
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
        problem = _type_problem(field.dataType, wanted.dataType, where, nested)
        if problem:
            problems.append(problem)
    return problems


_WIDER = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}


def _type_problem(source: Any, target: Any, where: str, nested: bool = False) -> str | None:
    """None if a value of type ``source`` fits a column of type ``target`` (nullability aside).

    ``nested``: inside a struct, array or map, where neither the staged rows' value checks
    (:meth:`DeltaDriver._check_rows`, top-level columns) nor type widening reach: a number type
    wider than the table's there is refused by its type."""
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
        problems = _type_problems(list(source.fields), list(target.fields), where, nested=True)
        return "; ".join(problems) or None
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        element = source.elementType
        if isinstance(element, IntegralType) and isinstance(target.elementType, (IntegralType, DecimalType)) and element != target.elementType:
            if not (isinstance(target.elementType, IntegralType) and _WIDER[element.simpleString()] <= _WIDER[target.elementType.simpleString()]):
                return (
                    f"field {where!r} holds array<{element.simpleString()}> but the table's column is "
                    f"{target.simpleString()}, which may not hold every value"
                )
        return _type_problem(element, target.elementType, where + "[]", nested=True)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return _type_problem(source.keyType, target.keyType, where + "{key}", nested=True) or _type_problem(
            source.valueType, target.valueType, where + "{}", nested=True
        )
    if nested and _wider_number(source, target):
        return (
            f"field {where!r} arrives as {source.simpleString()} but the table holds {target.simpleString()} there: "
            "a wider number type inside a struct, array or map is neither widened (type widening here covers "
            "top-level columns) nor checked value by value. Declare the field as "
            f"{target.simpleString()} in source.schema, or widen the table's field yourself after the pipeline is "
            f"drained (ALTER TABLE … ALTER COLUMN {where.replace('[]', '.element').replace('{}', '.value')} TYPE "
            f"{source.simpleString()}, on a table with delta.enableTypeWidening)"
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


def _wider_number(source: Any, target: Any) -> bool:
    """``source`` is a number type some of whose values a ``target`` column cannot hold."""
    from pyspark.sql.types import DecimalType, IntegralType

    if isinstance(source, IntegralType) and isinstance(target, IntegralType):
        return _WIDER[source.simpleString()] > _WIDER[target.simpleString()]
    if isinstance(source, IntegralType) and isinstance(target, DecimalType):
        return target.precision - target.scale < {1: 3, 2: 5, 3: 10, 4: 19}[_WIDER[source.simpleString()]]
    if isinstance(source, DecimalType) and isinstance(target, DecimalType):
        return target.scale < source.scale or target.precision - target.scale < source.precision - source.scale
    return False


def _table_gone(pipeline: str, binding: str, table: str, last_epoch: int) -> str:
    return (
        f"binding {binding!r}: table {table} does not exist, but pipeline {pipeline!r} has applied rows to it "
        f"(the recovery log is at epoch {last_epoch}): the table was deleted or moved. Restore it at {table} (from "
        "a backup or the moved folder) and run again; or, to rebuild it from the source, start the pipeline over "
        "with a new pipeline_id, recovery_log and staging (the other tables then need `adopt_table: true`). "
        "Nothing was written."
    )
