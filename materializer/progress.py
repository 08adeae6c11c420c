"""Progress reporting: core code emits typed events (:mod:`materializer.events`) to a collector;
only the CLI prints.

The runtime and the driver send small events (``Read``, ``Committed``, ``Applied``,
``Acknowledged``…) as they happen. :class:`ProgressTracker` folds them into one
:class:`EpochProgress` per epoch, like Structured Streaming's query progress, and sends it on as a
``Progress`` event once the epoch is applied. Consumers format the events: :class:`TextCollector`
(people's lines, to a logger), :class:`JsonLinesCollector` (one JSON record per event, what tools
read), Prometheus metrics (``materializer.metrics``); none of them parses text.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, TypeVar

from materializer import events, redact
from materializer.events import BindingProgress, Collector, EpochProgress, Event, NullCollector

__all__ = [
    "BindingProgress", "Collector", "EpochProgress", "Event", "JsonLinesCollector", "ListCollector",
    "NullCollector", "ProgressTracker", "Tee", "TextCollector", "utc_now",
]

E = TypeVar("E", bound=Event)

log = logging.getLogger("materializer")

PHASES = ("read", "stage", "log_commit", "apply")


class TextCollector(Collector):
    """The human lines of a run (``materializer run`` on stderr), written to a logger.

    One line per event people follow (opened, read, committed, applied, orphans deleted) at INFO,
    the bindings with nothing to apply counted in one line per epoch,
    each epoch's progress summary at DEBUG; other events are not shown. Tools never read these
    lines (the drill reads the JSON records): the wording may change freely.
    """

    def __init__(self, logger: logging.Logger | None = None, quiet: bool = False) -> None:
        self.logger = logger or log
        self.quiet = quiet
        # Per epoch, the bindings that had nothing to apply: one line at its acknowledgement, not
        # one per binding (a fleet of hundreds of tables with a few busy ones).
        self._idle: dict[int, int] = {}
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        if self.quiet:
            return
        if isinstance(event, events.Progress):
            self.logger.debug("%s", event.record.summary())
            return
        line = self.line(event)
        if line is not None:
            self.logger.info("%s", line)

    def line(self, event: Event) -> str | None:
        """The line for ``event``, or None if people are not shown it."""
        if isinstance(event, events.Opened):
            return f"opened pipeline {event.pipeline} at epoch {event.epoch} (writer {event.writer})"
        if isinstance(event, events.Read):
            return f"epoch {event.epoch}: read {event.documents} documents of {event.binding} ({event.extent})"
        if isinstance(event, events.Committed):
            return f"epoch {event.epoch}: committed to the recovery log"
        if type(event) is events.Applied and event.status == "empty":
            with self._lock:
                self._idle[event.epoch] = self._idle.get(event.epoch, 0) + 1
            return None
        if isinstance(event, events.Acknowledged):
            with self._lock:
                idle = self._idle.pop(event.epoch, 0)
            if not idle:
                return None
            return f"epoch {event.epoch}: {idle} binding{'s' if idle > 1 else ''} had nothing to apply"
        if type(event) is events.Applied:
            extra = f", {event.rows} rows" if event.rows else ""
            if event.conflicts_retried:
                # Said, not only counted: a person reading the log sees who else writes the table.
                n = event.conflicts_retried
                extra += f", after {n} commit{'s' if n > 1 else ''} lost to a concurrent one and retried"
            return f"epoch {event.epoch}: {event.binding} -> {event.table}: {event.status}{extra}"
        if isinstance(event, events.DeadLettersApplied) and event.status == "applied" and event.rows:
            # Documents set aside: said where they went, or a run with refused lines reads as clean.
            letters = f"{event.rows} dead letter{'s' if event.rows != 1 else ''}"
            return f"epoch {event.epoch}: {event.binding} -> {event.table}: {letters} appended (file:line or offset, reason, text)"
        if isinstance(event, events.OrphansDeleted):
            return f"deleted {event.files} orphaned staged files"
        return None


class ListCollector(Collector):
    """Keeps events in memory (tests)."""

    def __init__(self) -> None:
        self.received: list[Event] = []

    def emit(self, event: Event) -> None:
        self.received.append(event)

    @property
    def events(self) -> list[tuple[str, dict[str, Any]]]:
        """(kind, fields) of each event, in order."""
        return [(e.kind, e.fields()) for e in self.received]

    def named(self, kind: str) -> list[dict[str, Any]]:
        """The fields of each event of ``kind``, in order."""
        return [e.fields() for e in self.received if e.kind == kind]

    def of(self, cls: type[E]) -> list[E]:
        """The events of type ``cls`` (and its subclasses), in order."""
        return [e for e in self.received if isinstance(e, cls)]


class Tee(Collector):
    """Sends each event to several collectors, in order.

    A consumer that fails (a full disk under a metrics file, a closed pipe) is logged and
    skipped: reporting must never fail the epoch it reports on.
    """

    def __init__(self, *collectors: Collector | None) -> None:
        self.collectors = [c for c in collectors if c is not None]

    def emit(self, event: Event) -> None:
        for collector in self.collectors:
            try:
                collector.emit(event)
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                log.warning("progress: %s could not take the %r event: %s", type(collector).__name__, event.kind, exc)


def utc_now() -> str:
    """An ISO-8601 UTC timestamp with milliseconds, as Structured Streaming's progress uses."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ProgressTracker(Collector):
    """Forwards every event to ``downstream`` and adds one ``progress`` event per applied epoch.

    Events arrive from the runtime's thread (read, committed) and from the apply thread (applied,
    acknowledged), so the per-epoch state is kept under a lock. The record of an epoch is complete
    when its ``acknowledged`` event arrives: the driver sends it after every binding's ``applied``.
    """

    def __init__(self, downstream: Collector, pipeline_id: str) -> None:
        self.downstream = downstream
        self.pipeline_id = pipeline_id
        self._lock = threading.Lock()
        self._epochs: dict[int, dict[str, Any]] = {}

    def _state(self, epoch: int) -> dict[str, Any]:
        return self._epochs.setdefault(epoch, {"bindings": {}, "phases": {}})

    def _binding(self, state: dict[str, Any], name: str) -> dict[str, Any]:
        return state["bindings"].setdefault(name, {"binding": name})

    def emit(self, event: Event) -> None:
        self.downstream.emit(event)
        epoch = getattr(event, "epoch", None)
        if not isinstance(epoch, int) or isinstance(event, events.Progress):
            return
        record = None
        with self._lock:
            state = self._state(epoch)
            if isinstance(event, events.Read):
                state.setdefault("started_at", event.at)
                b = self._binding(state, event.binding)
                b["documents"] = event.documents
                b["bytes_read"] = event.bytes
                b["dead_letters"] = int(event.dead_letters or 0)
                if isinstance(event.lag, Mapping):
                    b["lag_files"], b["lag_bytes"] = event.lag.get("files"), event.lag.get("bytes")
                    b["lag_records"] = event.lag.get("records")
                    b["lag_seconds"] = event.lag.get("seconds")
                    b["oldest_unread_ms"] = event.lag.get("oldest_unread_ms")
                    b["delete_retention_ms"] = event.lag.get("delete_retention_ms")
                self._add(state, "read", event.seconds)
            elif isinstance(event, events.Committed):
                state["committed_at"] = event.at
                for binding, staged in (event.staged or {}).items():
                    b = self._binding(state, binding)
                    b["rows_staged"], b["bytes_staged"] = staged
                self._add(state, "stage", event.stage_seconds)
                self._add(state, "log_commit", event.log_commit_seconds)
            elif type(event) is events.Applied:  # not DeadLettersApplied: its rows are not the table's
                b = self._binding(state, event.binding)
                metrics = event.metrics or {}
                b.update(
                    table=event.table,
                    status=event.status,
                    delta_version=event.delta_version,
                    apply_seconds=event.seconds,
                    conflicts_retried=int(event.conflicts_retried or 0),
                    inserted=_metric(metrics, "num_inserted_rows", "numTargetRowsInserted", "appended_rows"),
                    updated=_metric(metrics, "num_updated_rows", "numTargetRowsUpdated"),
                    deleted=_metric(metrics, "num_deleted_rows", "numTargetRowsDeleted"),
                )
            elif isinstance(event, events.Acknowledged):
                self._add(state, "apply", event.seconds)
                state["applied_at"] = event.at or utc_now()
                state["reapplied"] = bool(event.first) and "committed_at" not in state
                record = self._record(epoch, self._epochs.pop(epoch))
            elif not state["bindings"] and not state["phases"] and len(state) == 2:
                # An event the record does not use (a span, a load): leave no state behind for it.
                self._epochs.pop(epoch, None)
        if record is not None:
            self.downstream.emit(events.Progress(record))

    @staticmethod
    def _add(state: dict[str, Any], phase: str, seconds: Any) -> None:
        if isinstance(seconds, (int, float)):
            state["phases"][phase] = round(state["phases"].get(phase, 0.0) + float(seconds), 6)

    def _record(self, epoch: int, state: Mapping[str, Any]) -> EpochProgress:
        bindings = tuple(BindingProgress(**b) for b in state["bindings"].values())

        def total(values: Iterable[int | None]) -> int | None:
            known = [v for v in values if v is not None]
            return sum(known) if known else None

        windowed = [b for b in bindings if b.oldest_unread_ms is not None and b.delete_retention_ms is not None]
        nearest = min(windowed, key=lambda b: (b.delete_retention_ms or 0) - (b.oldest_unread_ms or 0)) if windowed else None
        return EpochProgress(
            pipeline_id=self.pipeline_id,
            epoch=epoch,
            started_at=state.get("started_at"),
            committed_at=state.get("committed_at"),
            applied_at=state["applied_at"],
            reapplied=state["reapplied"],
            documents=sum(b.documents for b in bindings),
            bytes_read=total(b.bytes_read for b in bindings),
            rows_staged=sum(b.rows_staged for b in bindings),
            bytes_staged=sum(b.bytes_staged for b in bindings),
            inserted=sum(b.inserted or 0 for b in bindings),
            updated=sum(b.updated or 0 for b in bindings),
            deleted=sum(b.deleted or 0 for b in bindings),
            applied=sum(1 for b in bindings if b.status == "applied"),
            skipped=sum(1 for b in bindings if b.status == "skipped"),
            phase_seconds={p: state["phases"][p] for p in PHASES if p in state["phases"]},
            lag_files=total(b.lag_files for b in bindings),
            lag_bytes=total(b.lag_bytes for b in bindings),
            bindings=bindings,
            dead_letters=sum(b.dead_letters for b in bindings),
            lag_records=total(b.lag_records for b in bindings),
            oldest_unread_ms=nearest.oldest_unread_ms if nearest else None,
            delete_retention_ms=nearest.delete_retention_ms if nearest else None,
            conflicts_retried=sum(b.conflicts_retried for b in bindings),
            lag_seconds=max((b.lag_seconds for b in bindings if b.lag_seconds is not None), default=None),
        )


def _metric(metrics: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = metrics.get(name)
        if value is not None:
            return int(value)
    return None


class JsonLinesCollector(Collector):
    """One JSON object per line: ``{"event": kind, "at": UTC time, …the event's fields}``.

    ``kinds``: the kinds written (default: the records tools have always read from
    ``materializer run --events jsonl``: opened, progress, orphans_deleted, finished); None writes
    every event, spans included (``--all-events``; what the drill reads). Field names are the
    event classes' (docs: "Progress and metrics"); ``at`` is the event's own time if it has one,
    else when it was written.
    """

    RECORDS = ("opened", "progress", "orphans_deleted", "finished")

    def __init__(self, stream: Any, kinds: Iterable[str] | None = RECORDS) -> None:
        self.stream = stream
        self.kinds = None if kinds is None else frozenset(kinds)
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        if self.kinds is not None and event.kind not in self.kinds:
            return
        # Secrets never reach an event file (docs: 'Secrets'): a source's error can quote a URL.
        line = redact.text(json.dumps(redact.data({"event": event.kind, "at": utc_now(), **event.to_record()}), default=str))
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()
