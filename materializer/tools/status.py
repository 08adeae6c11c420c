"""``materializer status``: the recovery log against the tables, read without changing anything."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

from materializer.config import PipelineConfig
from materializer.delta import TableState, read_txn_without_spark, table_state
from materializer.tables import TableRef
from materializer.staging import StagingArea
from materializer.recovery_log import RecoveryLog
from materializer.runtime import as_recorded
from materializer.storage import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class TableStatus:
    binding: str
    table: str
    exists: bool
    delta_version: int | None
    recorded_epoch: int | None
    """The txnVersion Delta records for the pipeline."""
    staged_pending: list[str]
    agrees: bool
    note: str = ""
    compaction: list[dict[str, Any]] = field(default_factory=list)
    """Kafka, compacted topics: per partition with records left, how old the first unread record
    is beside ``delete.retention.ms`` (``CompactionLag``), the nearest to its window first."""
    compaction_note: str = ""
    """The same in words, or why it is unknown (the brokers did not answer)."""


@dataclass
class PipelineStatus:
    pipeline_id: str
    last_epoch: int
    last_seq: int
    log_entries: int
    tables: list[TableStatus] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)
    """Staged datasets that the last committed entry does not reference."""
    stuck: list[str] = field(default_factory=list)
    """Committed epochs Delta refused to apply: epoch, binding, the error and the way out."""
    lag: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per documents binding, what its folder holds after the last committed epoch (:func:`_lags`)."""

    @property
    def agrees(self) -> bool:
        return all(t.agrees for t in self.tables)


SessionSource = Union["SparkSession", Callable[[], "SparkSession"], None]


class _Tables:
    """Table states read by delta-rs where it can (no JVM), by Spark only where it must (a catalog
    name, a table feature delta-rs does not read): the session is started on first need."""

    def __init__(self, spark: SessionSource) -> None:
        self._spark = spark
        self.used_spark = False

    def state(self, table: TableRef, app_id: str) -> TableState:
        fast = read_txn_without_spark(table, app_id)
        if fast is not None:
            return fast
        if self._spark is None:
            raise RuntimeError(f"table {table} needs Spark to read and no session was given")
        if callable(self._spark):
            self._spark = self._spark()
        self.used_spark = True
        return table_state(self._spark, table, app_id)


def pipeline_status(config: PipelineConfig, spark: SessionSource = None) -> PipelineStatus:
    """``spark``: a session, a function that starts one (called only if a table needs it), or None."""
    config = as_recorded(config)  # bindings made from templates: those the last committed epoch covers
    log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
    state = log.read()
    datasets = StagingArea.of(config).datasets()
    failures = log.failures()
    checkpoint = state.last_commit.driver_checkpoint if state.last_commit else None
    written = set(checkpoint.written) if checkpoint else set()
    referenced: dict[str, str] = {}
    if state.last_commit and state.last_commit.driver_checkpoint:
        for name, staged in state.last_commit.driver_checkpoint.staged.items():
            if staged is not None:
                referenced[staged.uri] = name
    status = PipelineStatus(config.pipeline_id, state.last_epoch, state.last_seq, len(state.sequences))
    status.orphaned = [d for d in datasets if d not in referenced]
    tables = _Tables(spark)
    for binding in config.bindings:
        table = TableRef(binding.table)
        ts = tables.state(table, config.pipeline_id)
        pending = [uri for uri, name in referenced.items() if name == binding.name and uri in datasets]
        recorded = ts.txn_version or 0
        failure = failures.get((state.last_epoch, binding.name))
        # The epoch the table should record: its last with rows (an epoch without any makes no
        # commit on it), or the log's last for an older entry (whose apply committed to every table).
        want = checkpoint.table_records(binding.name) if checkpoint is not None else state.last_epoch
        owed = checkpoint is not None and binding.name in checkpoint.staged and checkpoint.commits_to(binding.name)
        older = checkpoint is None or checkpoint.recorded is None
        if recorded == want and (ts.exists or want == state.last_epoch):
            agrees, note = True, "up to date" if want == state.last_epoch else f"up to date (its last rows: epoch {want})"
        elif not ts.exists and binding.name in written:
            agrees, note = False, (
                f"TABLE GONE: the pipeline applied rows to {table} (the log is at epoch {state.last_epoch}) but the "
                "table does not exist: it was deleted or moved. Restore it at that location and run again "
                "(docs: 'A deleted table'); runs stop until then"
            )
        elif failure is not None and owed and recorded < state.last_epoch:
            # The recorded message says what Delta refused and both ways out.
            agrees, note = False, f"STUCK: {failure}"
            status.stuck.append(f"epoch {state.last_epoch}, binding {binding.name}: {failure}")
        elif owed and recorded < state.last_epoch and (not older or recorded == state.last_epoch - 1):
            # Committed but not applied yet (a run stopped between the log commit and the apply;
            # an older entry's table recorded the epoch before).
            agrees, note = True, f"epoch {state.last_epoch} is committed, not yet applied: the next run applies it"
        elif not ts.exists:
            agrees, note = True, "no table yet (the binding has had no rows)"
        else:
            agrees, note = False, (
                f"table records epoch {recorded} for the pipeline but the log says {want}"
                + ("" if want == state.last_epoch else f" (its last epoch with rows; the log ends at {state.last_epoch})")
            )
        runtime = (state.last_commit.runtime_checkpoint or {}).get(binding.name) if state.last_commit else None
        lags, words = _compaction(binding, runtime)
        status.tables.append(
            TableStatus(binding.name, str(table), ts.exists, ts.version, ts.txn_version, pending, agrees, note, lags, words)
        )
    status.lag = _lags(config, state.last_commit.runtime_checkpoint if state.last_commit else None)
    return status


def _lags(config: PipelineConfig, positions: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per documents binding, what its folder holds after the last committed epoch: ``files``,
    ``bytes``, ``seconds`` (the oldest file's age), as the next epoch's plan counts them
    (docs: 'Progress and metrics'); ``error`` where the folder could not be listed. A listing, no
    Spark; kafka's record lag is in the progress records only (it needs the brokers' offsets)."""
    from materializer.errors import MaterializerError
    from materializer.sources.documents.source import DocumentsSource

    lags: dict[str, dict[str, Any]] = {}
    for binding in config.bindings:
        if binding.source.format != "documents":
            continue
        try:
            lags[binding.name] = DocumentsSource(binding, None).lag((positions or {}).get(binding.name))  # type: ignore[arg-type]  # no spool: nothing is read
        except MaterializerError as exc:  # a folder gone, a link refused: said, the rest of status stands
            lags[binding.name] = {"error": str(exc)}
    return lags


def _compaction(binding: Any, checkpoint: Any) -> tuple[list[dict[str, Any]], str]:
    """A kafka binding's lag beside its compacted topics' ``delete.retention.ms``, from where the
    last committed epoch left it (docs: 'Compacted topics')."""
    if binding.source.format != "kafka" or not checkpoint:
        return [], ""
    from materializer.errors import MaterializerError
    from materializer.sources.kafka.source import KafkaSource, positions_of

    try:
        lags = KafkaSource(binding, None).compaction_lag(positions_of(checkpoint))  # type: ignore[arg-type]
    except MaterializerError as exc:
        return [], f"compaction lag unknown: {exc}"
    return [asdict(lag) | {"margin_ms": lag.margin_ms} for lag in lags], "; ".join(lag.describe() for lag in lags)
