"""The tables against the configuration and the log: before Open (two bindings on one table, a
session default txn retention) and at Open (what each table records, a removed binding's epoch
still owed, layout, other writers, options changed since the last epoch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer import option_changes
from materializer.config import BindingConfig, PipelineConfig
from materializer.driver import rollbacks, table_changes
from materializer.delta import (
    TableRef,
    TableWriters,
    detail,
    quote,
    schema_and_properties,
    table_identity,
    table_state,
    table_writers,
)
from materializer.errors import ConfigError, TableStateError
from materializer.layout import existing_layout_problems
from materializer.merge import DEAD_LETTER_SUFFIX
from materializer.protocol import DriverCheckpoint
from materializer.staging import StagingArea
from materializer.tables import RETENTION_DEFAULT_CONF, RETENTION_WHY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class OpenChecks:
    """What the driver checks of the tables before anything of a run is read or written: raises
    :class:`ConfigError` or :class:`TableStateError` naming the binding and what to do."""

    def __init__(
        self, spark: "SparkSession", apply_spark: "SparkSession", config: PipelineConfig, staging_area: StagingArea
    ) -> None:
        self.spark = spark
        self.apply_spark = apply_spark
        """The apply session: the columns a changed option adds are added there (tagged, like an apply)."""
        self.config = config
        self.staging_area = staging_area

    def check_distinct_tables(self) -> dict[str, str]:
        """Two bindings on one table, however spelled (DESIGN invariant 10): their MERGEs would carry
        the same txn id and version, and Delta would skip the second binding's rows. A dead-letter
        table is no binding's table either; several bindings may share one (its ``binding`` column
        tells their rows apart; the driver appends an epoch's rejects of all of them in one commit).
        Returns each dead-lettering binding's dead-letter table, as :func:`table_identity`."""
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
        dead: dict[str, str] = {}
        for binding in self.config.bindings:
            if binding.dead_letters is None:
                continue
            identity = table_identity(self.spark, TableRef(binding.dead_letters))
            if identity in seen:
                raise ConfigError(
                    f"binding {binding.name!r}'s dead_letter_table {binding.dead_letters!r} is the table of binding "
                    f"{seen[identity]!r} ({identity}): its rejects and that binding's rows would be written under one "
                    "txn id and epoch, and Delta would skip the second. Give the dead letters a table of their own "
                    "(several bindings may share one). Nothing was started."
                )
            dead[binding.name] = identity
        return dead

    def check_tables(self, last_epoch: int, checkpoint: DriverCheckpoint | None) -> None:
        """Once per run, before anything is written: what each table records must be ours.

        * a later epoch than the log: the log was lost or swapped;
        * a table this pipeline wrote rows to that is gone: deleted or moved by someone;
        * a table rolled back below the epochs the log says it holds (RESTORE, REPLACE, a CLONE or an
          older copy in its place): :mod:`materializer.driver.rollbacks`;
        * commits of another pipeline or binding, or another writer's txn ids: a rename or a new
          pipeline_id over existing tables would read the source again and write it twice.
        """
        written = set(checkpoint.written) if checkpoint else set()
        if checkpoint is not None:
            self._check_removed(checkpoint)
        for binding in self.config.bindings:
            table = TableRef(binding.table)
            try:
                state = table_state(self.spark, table, self.config.pipeline_id)
            except Exception as exc:  # noqa: BLE001 - said plainly where Delta blocks a catalog-managed table's path
                table_changes.raise_refused_access(binding, exc)
                raise
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
            writers = self._check_writers(binding, table)
            rollbacks.check(
                self.spark, binding, table, state.version, state.txn_version, writers, self.config.pipeline_id, checkpoint
            )
            self._check_changes(binding, table, writers)
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

    def check_retention_default(self) -> None:
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

    def _check_changes(self, binding: BindingConfig, table: TableRef, writers: TableWriters) -> None:
        """What others did since our last commit: features, renamed columns, rows changed
        (:mod:`materializer.driver.table_changes`)."""
        facts = schema_and_properties(self.spark, table)
        if facts is not None:
            table_changes.check(self.spark, binding, table, facts[1], facts[0], writers, self.config.pipeline_id)

    def _check_writers(self, binding: BindingConfig, table: TableRef) -> TableWriters:
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
            return writers
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


def _table_gone(pipeline: str, binding: str, table: str, last_epoch: int) -> str:
    return (
        f"binding {binding!r}: table {table} does not exist, but pipeline {pipeline!r} has applied rows to it "
        f"(the recovery log is at epoch {last_epoch}): the table was deleted or moved. Restore it at {table} (from "
        "a backup or the moved folder) and run again; or, to rebuild it from the source, start the pipeline over "
        "with a new pipeline_id, recovery_log and staging (the other tables then need `adopt_table: true`). "
        "Nothing was written."
    )
