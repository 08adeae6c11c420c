"""Typed events: what the core tells the outside world while it runs, as small frozen dataclasses.

The runtime and the driver emit one event per thing that happened (``Opened``, ``Read``,
``Committed``, ``Applied``…) to a :class:`Collector`; they never print or log. Consumers format the
events (``materializer.progress``: text lines, JSON lines, the per-epoch :class:`EpochProgress` record
(defined here, with the ``Progress`` event that carries it), Prometheus) or act on them (the drill times its kills from them, the bench times its steps from the
``SpanStarted``/``Span`` pairs). Each class has a stable ``kind``, the ``event`` field of its JSON
record, and its fields are the record's other fields (docs: "Progress and metrics"): a tool reads
``{"event": "committed", "epoch": 3, …}``, never a sentence meant for people.

Like dlt's ``common/runtime/collector.py``: a null collector by default, others plugged in by the
program that embeds the runtime.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping


@dataclass(frozen=True)
class Event:
    """The base of every event; ``kind`` names it in JSON records (stable)."""

    kind: ClassVar[str] = "event"

    def fields(self) -> dict[str, Any]:
        """The event's fields by name, shallow (nested values as they are)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_record(self) -> dict[str, Any]:
        """The JSON record's fields, after ``event``: plain values only."""
        return {name: _plain(value) for name, value in self.fields().items()}


# --- the core's events -------------------------------------------------------------------------


@dataclass(frozen=True)
class Opened(Event):
    """The recovery log was opened (this writer now holds the pipeline) at its last committed epoch."""

    kind: ClassVar[str] = "opened"
    pipeline: str
    epoch: int
    """The last committed epoch (0: none yet); the first Acknowledge re-applies it."""
    writer: str
    """This run's writer id in the recovery log (its fence)."""


@dataclass(frozen=True)
class OrphansDeleted(Event):
    """Open deleted staged files that no committed entry references."""

    kind: ClassVar[str] = "orphans_deleted"
    files: int
    datasets: int


@dataclass(frozen=True)
class Read(Event):
    """One binding's batch of the next epoch was read (sent once its deferred checks passed)."""

    kind: ClassVar[str] = "read"
    epoch: int
    binding: str
    documents: int
    extent: str
    """The source's own description of the batch (files, offsets)."""
    seconds: float
    at: str
    """When the read began (UTC, ISO-8601)."""
    bytes: int | None = None
    """Source bytes the batch covers (None: the source does not say)."""
    lag: Mapping[str, int | float | None] | None = None
    """What is not read yet after this batch: ``{"files": …, "bytes": …, "seconds": …}`` (documents),
    ``{"records": …}`` (kafka); None: the source does not say."""
    dead_letters: int = 0


@dataclass(frozen=True)
class LoadQueued(Event):
    """A Load (keys to look up in the table) was queued for the epoch's Flush."""

    kind: ClassVar[str] = "load"
    epoch: int
    binding: str


@dataclass(frozen=True)
class Committed(Event):
    """The epoch's entry (source positions and staged files) is committed to the recovery log."""

    kind: ClassVar[str] = "committed"
    epoch: int
    documents: int
    at: str
    staged: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Per binding with rows: (rows, bytes) of its staged Parquet dataset."""
    stage_seconds: float | None = None
    log_commit_seconds: float | None = None


@dataclass(frozen=True)
class Applied(Event):
    """One binding's table after the epoch's apply: ``status`` says what Delta did."""

    kind: ClassVar[str] = "applied"
    epoch: int
    binding: str
    table: str
    status: str
    """applied (a Delta commit was made), skipped (Delta already recorded the epoch), empty, missing."""
    rows: int = 0
    delta_version: int | None = None
    metrics: Mapping[str, int] = field(default_factory=dict)
    """The MERGE's (or append's) own operation metrics."""
    seconds: float | None = None
    conflicts_retried: int = 0
    """Attempts whose commit lost to a concurrent one and were retried (0 in a quiet run)."""

    @classmethod
    def of(cls, result: Any, *, epoch: int, seconds: float | None) -> "Applied":
        """From the driver's ``ApplyResult`` (duck-typed: this module imports no pydantic model)."""
        return cls(
            epoch=epoch, binding=result.binding, table=result.table, status=result.status, rows=result.rows,
            delta_version=result.delta_version, metrics=dict(result.metrics), seconds=seconds,
            conflicts_retried=int(getattr(result, "conflicts_retried", 0) or 0),
        )


@dataclass(frozen=True)
class DeadLettersApplied(Applied):
    """A binding's dead letters of the epoch were appended to its dead-letter table."""

    kind: ClassVar[str] = "dead_letters_applied"


@dataclass(frozen=True)
class Acknowledged(Event):
    """Every binding's apply of the epoch ended (sent from the applying thread)."""

    kind: ClassVar[str] = "acknowledged"
    epoch: int
    first: bool
    """The first Acknowledge after Open: the last run's epoch, applied or found applied."""
    seconds: float
    at: str


# --- the per-epoch record (materializer.progress.ProgressTracker folds the events into it) ---


@dataclass(frozen=True)
class BindingProgress:
    """One binding's share of an epoch."""

    binding: str
    table: str | None = None
    documents: int = 0
    """Documents (or CDC updates) read from the source."""
    bytes_read: int | None = None
    """Source bytes the batch covers (None: the source does not say)."""
    rows_staged: int = 0
    """Rows written to the staged Parquet file (after combining per key)."""
    bytes_staged: int = 0
    status: str | None = None
    """applied, skipped (Delta already recorded the epoch), empty, or None (not applied yet)."""
    inserted: int | None = None
    """The MERGE's (or append's) own metrics; None when it was skipped or did not report them."""
    updated: int | None = None
    deleted: int | None = None
    delta_version: int | None = None
    apply_seconds: float | None = None
    lag_files: int | None = None
    """Source files not read yet after this epoch (None: the source does not say)."""
    lag_bytes: int | None = None
    dead_letters: int = 0
    """Documents set aside in the dead-letter table (``on_invalid: dead_letter``)."""
    lag_records: int | None = None
    """Kafka: records not read yet after this epoch."""
    oldest_unread_ms: int | None = None
    """Kafka, compacted topic: the age of the first unread record of the partition nearest to its
    ``delete.retention.ms`` (beyond it, deletes not read yet may be gone; None: none compacted or
    caught up)."""
    delete_retention_ms: int | None = None
    """That partition's topic's ``delete.retention.ms``."""
    conflicts_retried: int = 0
    """Attempts of the apply whose commit lost to a concurrent one (a compaction, a person's
    UPDATE) and were retried under Delta's conflict rules."""
    lag_seconds: float | None = None
    """How old the oldest input not read yet was when the epoch was planned (documents: the oldest
    file not taken, by its modification time; 0: nothing left; None: the source does not say, as kafka)."""


@dataclass(frozen=True)
class EpochProgress:
    """What one epoch did, from its read to its apply: the record every consumer formats."""

    pipeline_id: str
    epoch: int
    started_at: str | None
    """When the epoch's read began (UTC); None for the re-apply after Open."""
    committed_at: str | None
    """When its entry was committed to the recovery log."""
    applied_at: str
    """When its apply (Acknowledge) ended."""
    reapplied: bool
    """True for the first Acknowledge after Open (the last run's epoch, applied or found applied)."""
    documents: int
    bytes_read: int | None
    rows_staged: int
    bytes_staged: int
    inserted: int
    updated: int
    deleted: int
    applied: int
    """Bindings whose commit Delta made."""
    skipped: int
    """Bindings Delta (or our check) found already applied."""
    phase_seconds: Mapping[str, float]
    """read, stage, log_commit, apply (missing: the phase did not run in this process)."""
    lag_files: int | None
    lag_bytes: int | None
    bindings: tuple[BindingProgress, ...] = field(default_factory=tuple)
    dead_letters: int = 0
    """Documents of the epoch set aside in dead-letter tables."""
    lag_records: int | None = None
    """Kafka records not read yet after this epoch, over the bindings."""
    oldest_unread_ms: int | None = None
    """The compacted partition nearest to its window, over the bindings: its first unread record's age."""
    delete_retention_ms: int | None = None
    """That partition's ``delete.retention.ms``."""
    conflicts_retried: int = 0
    """Apply attempts that lost to a concurrent commit and were retried, over the bindings."""
    lag_seconds: float | None = None
    """The oldest input not read yet, over the bindings (the largest binding's ``lag_seconds``)."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["phase_seconds"] = dict(self.phase_seconds)
        return data

    def summary(self) -> str:
        """One line for humans and logs."""
        phases = " ".join(f"{k}={v:.2f}s" for k, v in self.phase_seconds.items())
        lag = f" lag={self.lag_files} files/{self.lag_bytes} B" if self.lag_files is not None else ""
        if self.lag_records is not None:
            lag += f" lag={self.lag_records} records"
        if self.lag_seconds is not None:
            lag += f" lag={self.lag_seconds:.0f}s"
        if self.oldest_unread_ms is not None and self.delete_retention_ms is not None:
            lag += f" oldest unread {self.oldest_unread_ms} ms of delete.retention.ms {self.delete_retention_ms} ms"
        return (
            f"epoch {self.epoch}: {self.documents} documents, {self.rows_staged} rows staged, "
            f"+{self.inserted} ~{self.updated} -{self.deleted}, {self.applied} applied {self.skipped} skipped; "
            f"{phases}{lag}"
        )



@dataclass(frozen=True)
class Progress(Event):
    """One epoch's :class:`EpochProgress`, folded by :class:`materializer.progress.ProgressTracker`."""

    kind: ClassVar[str] = "progress"
    record: EpochProgress

    @property
    def epoch(self) -> int:
        return self.record.epoch

    def fields(self) -> dict[str, Any]:
        return {"epoch": self.record.epoch, "record": self.record}

    def to_record(self) -> dict[str, Any]:
        # The record's own fields, flat: {"event": "progress", "epoch": …, "inserted": …}.
        return self.record.to_dict()


@dataclass(frozen=True)
class BackfillStarted(Event):
    """The epoch that sets a binding's source back (and truncates its table) is committed."""

    kind: ClassVar[str] = "backfill_started"
    epoch: int
    binding: str
    position: Any
    truncate: bool


@dataclass(frozen=True)
class Finished(Event):
    """A run ended: the CLI's summary (``materializer run --json``)."""

    kind: ClassVar[str] = "finished"
    pipeline_id: str
    opened_at_epoch: int
    last_epoch: int
    epochs: int
    documents: int | None = None
    reapplied: Any = None
    seconds: float | None = None


@dataclass(frozen=True)
class SpanStarted(Event):
    """A timed step of the core began (see :class:`Span`)."""

    kind: ClassVar[str] = "span_started"
    name: str
    epoch: int | None = None
    binding: str | None = None


@dataclass(frozen=True)
class Span(Event):
    """A timed step of the core ended: ``seconds`` of wall time, ``ok`` False if it raised.

    Names (stable): ``check_tables`` (Open's log/table check), ``read`` (a source's batch, per
    binding), ``prestage``, ``start_commit``, ``verify``, ``log_commit`` (per epoch), and on the
    applying thread ``table_state``, ``read_staged``, ``merge`` (per binding and attempt), ``view``
    (a live-row view created or replaced).
    """

    kind: ClassVar[str] = "span"
    name: str
    epoch: int | None = None
    binding: str | None = None
    seconds: float = 0.0
    ok: bool = True


CORE_EVENTS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        Opened, OrphansDeleted, Read, LoadQueued, Committed, Applied, DeadLettersApplied, Acknowledged, Progress,
        BackfillStarted, Finished, SpanStarted, Span,
    )
}
"""Every event the core (and ``materializer run``) sends, by kind: what :func:`from_record` reads."""


def from_record(record: Mapping[str, Any]) -> Event | None:
    """The typed event of a JSON record (``{"event": kind, …}``); None for a kind this version does
    not know (a newer writer's), so readers skip what they cannot use instead of failing.

    Raises ``ValueError`` for a record of a known kind that lacks a required field.
    """
    cls = CORE_EVENTS.get(str(record.get("event")))
    if cls is None:
        return None
    if cls is Progress:
        names = {f.name for f in dataclasses.fields(EpochProgress)}
        data = {k: v for k, v in record.items() if k in names}
        data["bindings"] = tuple(BindingProgress(**b) for b in data.get("bindings", ()))
        try:
            return Progress(EpochProgress(**data))
        except TypeError as exc:
            raise ValueError(f"a progress record without its fields: {exc}") from None
    names = {f.name for f in dataclasses.fields(cls)}
    data = {k: v for k, v in record.items() if k in names}
    if cls is Committed and isinstance(data.get("staged"), Mapping):
        data["staged"] = {k: tuple(v) for k, v in data["staged"].items()}
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"a {cls.kind!r} record without its fields: {exc}") from None


# --- collectors ----------------------------------------------------------------------------------


class Collector:
    """Receives events; this base is the null collector (it ignores them)."""

    def emit(self, event: Event) -> None:
        pass

    @contextmanager
    def span(self, name: str, epoch: int | None = None, binding: str | None = None) -> Iterator[None]:
        """Time the ``with`` block: a :class:`SpanStarted`, then a :class:`Span` (also when it raises)."""
        self.emit(SpanStarted(name=name, epoch=epoch, binding=binding))
        began = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.emit(Span(name=name, epoch=epoch, binding=binding, seconds=time.monotonic() - began, ok=ok))


NullCollector = Collector
"""The collector that ignores every event (the default of every core entry point)."""


def _plain(value: Any) -> Any:
    """A JSON-able copy of an event's field: dataclasses and pydantic models as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
