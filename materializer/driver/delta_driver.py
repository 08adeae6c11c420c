"""The :class:`DeltaDriver`: the protocol's driver side (Open, Load / Flush, Store, prestage,
StartCommit, Acknowledge), its staging and its applies side by side; the checks it asks of
:mod:`open_checks` and :mod:`table_fit`."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from materializer import crash, events
from materializer.config import BindingConfig, PipelineConfig
from materializer.delta import TableRef, exists, quote, read_table, table_identity
from materializer.dead_letters import for_epoch
from materializer.errors import ConfigError
from materializer.driver.open_checks import OpenChecks
from materializer.driver.table_fit import TableFit
from materializer.option_changes import table_options
from materializer.merge import DEAD_LETTER_SUFFIX, DeltaWriter, SnapshotWarmer
from materializer.staging import StagingArea
from materializer.side_by_side import run_each, workers_for
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
from materializer.storage import Store as FileStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
        self._before: DriverCheckpoint | None = None
        """The driver checkpoint of the last epoch committed (at Open, the log's; then each one this
        run stages): what the tables record carries on from it (:attr:`DriverCheckpoint.recorded`)."""
        self._txn_proven: set[str] = set()
        """Bindings whose table was seen recording this run's txn id after an apply."""
        """Bindings whose tables hold rows of an applied epoch (so the table must exist)."""
        self._stored: dict[str, DataFrame] = {}
        self._rejected: dict[str, DataFrame] = {}
        self._prestaged: dict[str, tuple[DataFrame, StagedFile | None]] = {}
        self._loads: list[Load] = []
        self._acknowledged: int | None = None
        self._dead_letter_tables: dict[str, str] | None = None
        """Per dead-lettering binding, its dead-letter table's identity (several may share one)."""
        from materializer.spark import is_connect, isolated_session

        self.parallel = workers_for(config.transaction.parallel_bindings, connect=is_connect(spark))
        """How many bindings are staged and applied at once (``transaction.parallel_bindings``)."""
        self.apply_spark = isolated_session(spark)
        self.writer = DeltaWriter(self.apply_spark, config, self.staging_area, self.collector)
        """The MERGEs and appends of each epoch, in the apply session (:mod:`materializer.merge`)."""
        self._writers: list[DeltaWriter] = [self.writer]
        """One writer per apply thread, each in a session of its own (the txn confs are
        session-wide); made as an epoch first needs them (:meth:`_writer`)."""
        self.open_checks = OpenChecks(spark, self.apply_spark, config, self.staging_area)
        """The tables against the configuration and the log, before Open and at Open."""
        self.table_fit = TableFit(spark, staging)
        """The epoch's rows against their tables, before StartCommit (and the tables' facts, kept)."""
        self._lock = threading.Lock()
        self._warmer: SnapshotWarmer | None = None
        """Following runs only (:meth:`idle`): applied tables' snapshots read ahead."""
        self._applied: dict[str, tuple[int, str]] = {}
        """Tables applied since the last :meth:`idle` (at Open: those with rows): epoch, binding."""
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
            self.open_checks.check_tables(message.last_epoch, message.driver_checkpoint)
        self._before = message.driver_checkpoint
        if message.driver_checkpoint is not None:
            self._written = set(message.driver_checkpoint.written) | {
                name for name, f in message.driver_checkpoint.staged.items() if f is not None
            }
        with self._lock:  # tables with rows: read ahead at a following run's first wait too (idle)
            for binding in self.config.bindings:
                if binding.name in self._written:
                    self._applied.setdefault(binding.table, (message.last_epoch, binding.name))
        files, datasets = self.staging_area.delete_unreferenced(message.driver_checkpoint, self.fence_check)
        if files:
            self.collector.emit(events.OrphansDeleted(files=files, datasets=datasets))
        return Opened(orphans_deleted=files)

    # --- before Open, and at Open: the tables against the configuration and the log ---

    def validate(self) -> None:
        """Before Open (so a wrong configuration fences no running writer): two bindings on one
        table, and a session default that every table we create would inherit."""
        self._dead_letter_tables = self.open_checks.check_distinct_tables()
        self.open_checks.check_retention_default()

    # --- Acknowledge ---

    def acknowledge(self, message: Acknowledge) -> Acknowledged:
        """Apply the epoch's staged datasets, ``transaction.parallel_bindings`` tables at once, each
        thread in an apply session of its own; Acknowledged only once every table is applied.

        A failure in one binding starts no further binding; the applies in flight end (each is one
        Delta commit, whole or absent), then the failure is raised naming its binding. The tables
        applied by then record the epoch, so the re-apply skips them. Then the dead letters: one
        append per dead-letter table (:meth:`_dead_letter_groups`), under the same txn id."""
        epoch = message.epoch
        checkpoint = message.driver_checkpoint
        if self._warmer is not None:
            self._warmer.drop_queued()  # the wait is over: the applies, not read-aheads, have the cores
        covered = [binding for binding in self.config.bindings if binding.name in checkpoint.staged]
        # A binding with nothing this epoch gets no commit: its table records its last epoch with rows.
        todo = [binding for binding in covered if checkpoint.commits_to(binding.name)]

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
            if result.status == "applied":
                with self._lock:  # its new snapshot is read ahead if the run waits for input (idle)
                    self._applied[binding.table] = (epoch, binding.name)
            return result

        def between_tables(_binding: BindingConfig, _result: ApplyResult, unfinished: int) -> None:
            if unfinished:
                # crash here leaves some tables applied and others not: the re-apply skips the former.
                # Fired when the first table's apply has ended; with parallel_bindings > 1 the others
                # may be mid-MERGE by then (uncommitted, as at mid-apply) or already committed.
                crash.crash_point("after-apply", epoch)

        applied_results = run_each(
            todo, apply, workers=self._apply_workers(len(todo)), name="materializer-apply",
            after_each=between_tables, label=lambda b: f"binding {b.name} (epoch {epoch}'s apply)",
        )
        by_name = {r.binding: r for r in applied_results}
        results = []
        for binding in covered:
            result = by_name.get(binding.name)
            if result is None:  # nothing this epoch: named in the progress record, its table not touched
                result = ApplyResult(binding=binding.name, table=str(binding.table), status="empty")
                self.collector.emit(events.Applied.of(result, epoch=epoch, seconds=0.0))
            results.append(result)
        groups = self._dead_letter_groups([b for b in covered if checkpoint.dead_letters.get(b.name) is not None], checkpoint)
        if groups:
            # crash here leaves the tables applied and the dead letters not: the re-apply skips the
            # tables and appends them (their own txn record on each dead-letter table)
            crash.crash_point("after-apply", epoch)

            def append(group: tuple[str, list[BindingConfig]], slot: int) -> ApplyResult:
                table, bindings = group
                return self._writer(slot).append_dead_letters(table, bindings, epoch, [checkpoint.dead_letters[b.name] for b in bindings])

            run_each(
                groups, append, workers=self._apply_workers(len(groups)), name="materializer-apply",
                label=lambda g: f"the dead letters of {', '.join(b.name for b in g[1])} (epoch {epoch}'s apply)",
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

    def idle(self) -> None:
        """While a following run waits for input: the new snapshots of the tables applied since
        the last wait are read ahead (:class:`~materializer.merge.SnapshotWarmer`), so the next
        epoch's MERGEs start from them. Only in waits: while epochs come back to back, the
        applies keep the cores busy and a read ahead would only compete with them."""
        with self._lock:
            applied, self._applied = self._applied, {}
        if applied and self._warmer is None:
            self._warmer = SnapshotWarmer(self.collector)
        for table, (epoch, binding) in applied.items():
            assert self._warmer is not None
            self._warmer.warm(self.apply_spark, TableRef(table), epoch, binding)

    def close(self) -> None:
        """Stop reading snapshots ahead: none is read after the run returns."""
        warmer, self._warmer = self._warmer, None
        if warmer is not None:
            warmer.close()

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

    def _dead_letter_groups(
        self, bindings: list[BindingConfig], checkpoint: DriverCheckpoint
    ) -> list[tuple[str, list[BindingConfig]]]:
        """``bindings`` by dead-letter table (as spelled, and the bindings): one append per table and
        epoch, so bindings that share one land their rejects together under the epoch's txn id (two
        appends of one epoch would carry the same txn version, and Delta would skip the second).
        A binding no longer set to ``dead_letter`` (changed after the epoch was committed) has its
        rejects appended where the epoch's log entry says, or they would never land."""
        if not bindings:
            return []
        if self._dead_letter_tables is None:
            self._dead_letter_tables = self.open_checks.check_distinct_tables()
        groups: dict[str, tuple[str, list[BindingConfig]]] = {}
        for binding in bindings:
            identity, table = self._dead_letter_tables.get(binding.name), binding.dead_letters
            if identity is None or table is None:
                table = checkpoint.tables.get(binding.name + DEAD_LETTER_SUFFIX)
                if table is None:
                    raise ConfigError(
                        f"epoch {checkpoint.epoch} set aside dead letters of binding {binding.name!r}, and its log entry does "
                        "not name their table (written by an older version). Set on_invalid: dead_letter (and its "
                        "dead_letter_table) back for one run, so they land; then change it. Nothing was changed."
                    )
                identity = table_identity(self.spark, TableRef(table))
            groups.setdefault(identity, (table, []))[1].append(binding)
        return list(groups.values())

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
        if message.documents is not None:  # None: no row this epoch (its dead letters only)
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
                facts = self.table_fit.facts(binding)
                self.table_fit.check_schema(binding, df, facts)
                # Named in `staged` as soon as it is written (each thread its own key), so a failure
                # of any binding discards it below.
                staged[binding.name] = early[1] if early is not None else self._stage(binding.name, epoch, df)
                self._prestaged.pop(binding.name, None)
                file = staged[binding.name]
                if facts is not None and file is not None:
                    self.table_fit.check_rows(binding, file, df.schema, facts)

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
        checkpoint = DriverCheckpoint(
            epoch=epoch, staged=staged, rewind=message.rewind, written=sorted(self._written), dead_letters=dead,
            recorded=DriverCheckpoint.carried(self._before, epoch, [*(n for n, f in staged.items() if f is not None), *dead]),
            options={b.name: table_options(b) for b in self.config.bindings},
            tables={
                **{b.name: b.table for b in self.config.bindings if staged.get(b.name) is not None},
                **{b.name + DEAD_LETTER_SUFFIX: str(b.dead_letters) for b in self.config.bindings if b.name in dead},
            },
        )
        self._before = checkpoint
        return StartedCommit(driver_checkpoint=checkpoint)

    def _stage(self, name: str, epoch: int, df: "DataFrame", key: list[str] | None = None) -> StagedFile | None:
        return self.staging_area.stage(name, epoch, df, self.config.binding(name).key if key is None else key)


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
