"""Prometheus metrics from the per-epoch progress records (``prometheus_client``).

:class:`PrometheusCollector` turns each :class:`~materializer.events.EpochProgress` into counters
and gauges in a registry of its own (so two pipelines in one process never share series), which
is then exposed one of three ways:

* an HTTP endpoint while following (:meth:`PrometheusCollector.serve`, loopback unless told);
* a node-exporter textfile rewritten after each epoch (:meth:`write_textfile`), for one-shot runs;
* a push to a Pushgateway at the end of a one-shot run (:meth:`push`).
"""

from __future__ import annotations

import os
from typing import Any

from materializer import redact
from materializer.events import Collector, Event, Progress

NAMESPACE = "materializer"


class PrometheusCollector(Collector):
    def __init__(self, pipeline_id: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.pipeline_id = pipeline_id
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["pipeline", "binding"]
        r = self.registry
        self.epochs = Counter(f"{NAMESPACE}_epochs", "Epochs applied (the re-apply after open included).", ["pipeline"], registry=r)
        self.last_epoch = Gauge(f"{NAMESPACE}_last_applied_epoch", "The last epoch applied.", ["pipeline"], registry=r)
        self.last_applied = Gauge(
            f"{NAMESPACE}_last_applied_timestamp_seconds", "When the last epoch's apply ended (Unix time).", ["pipeline"], registry=r
        )
        self.documents = Counter(f"{NAMESPACE}_documents_read", "Documents read from the source.", labels, registry=r)
        self.bytes_read = Counter(f"{NAMESPACE}_source_read_bytes", "Source bytes read (sources that report them).", labels, registry=r)
        self.rows_staged = Counter(f"{NAMESPACE}_rows_staged", "Rows written to staged Parquet files.", labels, registry=r)
        self.merge_rows = Counter(
            f"{NAMESPACE}_merge_rows", "Rows the Delta commits changed, by action (inserted, updated, deleted).", labels + ["action"], registry=r
        )
        self.applies = Counter(
            f"{NAMESPACE}_applies", "Per-binding applies by status (applied, skipped, empty).", labels + ["status"], registry=r
        )
        self.phase = Histogram(
            f"{NAMESPACE}_phase_seconds",
            "Seconds per epoch spent in each phase (read, stage, log_commit, apply).",
            ["pipeline", "phase"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.lag_files = Gauge(f"{NAMESPACE}_source_lag_files", "Source files not read yet.", labels, registry=r)
        self.lag_bytes = Gauge(f"{NAMESPACE}_source_lag_bytes", "Source bytes not read yet.", labels, registry=r)
        self.lag_records = Gauge(f"{NAMESPACE}_source_lag_records", "Source records not read yet (kafka).", labels, registry=r)
        self.lag_seconds = Gauge(
            f"{NAMESPACE}_source_lag_seconds",
            "How old the oldest input not read yet was when the epoch was planned (documents: the oldest file left).",
            labels, registry=r,
        )
        self.conflicts_retried = Counter(
            f"{NAMESPACE}_commit_conflicts_retried",
            "Apply attempts whose Delta commit lost to a concurrent one (a compaction, a person's write) and were retried.",
            labels, registry=r,
        )
        self._textfile: str | None = None

    def emit(self, event: Event) -> None:
        if not isinstance(event, Progress):
            return
        record = event.record
        p = redact.text(self.pipeline_id)
        self.epochs.labels(p).inc()
        self.last_epoch.labels(p).set(record.epoch)
        self.last_applied.labels(p).set_to_current_time()  # the record arrives as the apply ends
        for phase, seconds in record.phase_seconds.items():
            self.phase.labels(p, phase).observe(seconds)
        for b in record.bindings:
            name = redact.text(b.binding)  # labels, as every output, show no secret
            self.documents.labels(p, name).inc(b.documents)
            if b.bytes_read is not None:
                self.bytes_read.labels(p, name).inc(b.bytes_read)
            self.rows_staged.labels(p, name).inc(b.rows_staged)
            for action, value in (("inserted", b.inserted), ("updated", b.updated), ("deleted", b.deleted)):
                self.merge_rows.labels(p, name, action).inc(value or 0)
            if b.status:
                self.applies.labels(p, name, b.status).inc()
                # 0 too: the series is there from a binding's first apply, so a rate is defined.
                self.conflicts_retried.labels(p, name).inc(b.conflicts_retried)
            if b.lag_files is not None:
                self.lag_files.labels(p, name).set(b.lag_files)
            if b.lag_bytes is not None:
                self.lag_bytes.labels(p, name).set(b.lag_bytes)
            if b.lag_records is not None:
                self.lag_records.labels(p, name).set(b.lag_records)
            if b.lag_seconds is not None:
                self.lag_seconds.labels(p, name).set(b.lag_seconds)
        if self._textfile:
            self.write_textfile(self._textfile)

    def serve(self, port: int, host: str = "127.0.0.1") -> tuple[str, int, Any]:
        """Serve ``/metrics`` on ``host:port`` (port 0: any free one); returns (host, port, server)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return host, int(server.server_port), server

    def textfile(self, path: str) -> None:
        """Rewrite ``path`` (node-exporter textfile format) after each epoch, and now."""
        self._textfile = path
        self.write_textfile(path)

    def write_textfile(self, path: str) -> None:
        from prometheus_client import write_to_textfile

        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        write_to_textfile(path, self.registry)  # written to a temporary file and renamed: atomic

    def push(self, gateway: str) -> None:
        """Push the run's metrics to a Pushgateway (job ``materializer``, grouped by pipeline)."""
        from prometheus_client import push_to_gateway

        push_to_gateway(gateway, job=NAMESPACE, grouping_key={"pipeline": self.pipeline_id}, registry=self.registry)
