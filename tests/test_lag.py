"""The lag (files, bytes, records, seconds) from a source's plan to the progress record, its JSON, its
line and the Prometheus gauges: plain Python, no JVM."""

from __future__ import annotations

import io
import json

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from materializer import events
from materializer.metrics import PrometheusCollector
from materializer.progress import JsonLinesCollector, ListCollector, ProgressTracker
from materializer.sources.documents.source import lag_seconds, plan_epoch
from materializer.storage import FileInfo

NOW = 1_700_000_000.0


def _listing() -> list[FileInfo]:
    # b is named before c but written after it: the oldest file left is c, not the first by name.
    return [
        FileInfo("a.jsonl", 10, NOW - 900), FileInfo("b.jsonl", 10, NOW - 60),
        FileInfo("c.jsonl", 10, NOW - 600), FileInfo("d.jsonl", 10, NOW - 5),
    ]


def test_the_documents_lag_in_seconds_is_the_age_of_the_oldest_file_not_taken() -> None:
    plan = plan_epoch(_listing(), None, 1, 1000, "src", clock=NOW)
    assert [f.path for f in plan.files] == ["a.jsonl"]
    assert (plan.lag_files, plan.lag_bytes, plan.lag_seconds) == (3, 30, 600.0)
    plan = plan_epoch(_listing(), plan.checkpoint(), 2, 1000, "src", clock=NOW)
    assert plan.lag_seconds == 5.0  # b and c taken: d is what is left
    # Nothing left: 0, not None (a caught-up pipeline has no lag).
    assert plan_epoch(_listing(), None, 10, 1000, "src", clock=NOW).lag_seconds == 0.0


def test_a_store_without_file_times_says_nothing_and_a_clock_behind_the_store_says_zero() -> None:
    assert lag_seconds([FileInfo("x.jsonl", 1)], NOW) is None
    assert lag_seconds([FileInfo("x.jsonl", 1), FileInfo("y.jsonl", 1, NOW - 7)], NOW) == 7.0
    assert lag_seconds([FileInfo("x.jsonl", 1, NOW + 3)], NOW) == 0.0


def _epoch(tracker: ProgressTracker, epoch: int) -> None:
    tracker.emit(events.Read(epoch=epoch, binding="files", documents=5, extent="f", seconds=0.5, at="t0",
                             lag={"files": 2, "bytes": 900, "seconds": 120.5}))
    tracker.emit(events.Read(epoch=epoch, binding="other", documents=1, extent="g", seconds=0.1, at="t0",
                             lag={"files": 0, "bytes": 0, "seconds": 0.0}))
    tracker.emit(events.Read(epoch=epoch, binding="topic", documents=3, extent="o", seconds=0.2, at="t0",
                             lag={"records": 40}))
    tracker.emit(events.Acknowledged(epoch=epoch, first=False, seconds=1.0, at="t2"))


def test_the_record_carries_each_bindings_lag_and_the_epochs_worst() -> None:
    sink = ListCollector()
    _epoch(ProgressTracker(sink, "p"), 1)
    (progress,) = sink.of(events.Progress)
    record = progress.record
    by_name = {b.binding: b for b in record.bindings}
    assert (by_name["files"].lag_seconds, by_name["other"].lag_seconds, by_name["topic"].lag_seconds) == (120.5, 0.0, None)
    assert by_name["topic"].lag_records == 40 and by_name["topic"].lag_files is None
    # Seconds: the oldest input over the bindings; counts: summed.
    assert (record.lag_seconds, record.lag_records, record.lag_files, record.lag_bytes) == (120.5, 40, 2, 900)
    assert "lag=40 records" in record.summary() and "lag=120s" in record.summary()
    out = io.StringIO()
    JsonLinesCollector(out).emit(progress)
    line = json.loads(out.getvalue())
    assert (line["lag_seconds"], line["lag_records"]) == (120.5, 40)
    assert [b["lag_seconds"] for b in line["bindings"]] == [120.5, 0.0, None]
    # A tool reads the record back, new fields included.
    again = events.from_record(line)
    assert isinstance(again, events.Progress) and again.record.lag_seconds == 120.5
    assert again.record.bindings[0].lag_seconds == 120.5


def test_the_gauges_show_each_bindings_lag_in_records_and_seconds() -> None:
    metrics = PrometheusCollector("p")
    _epoch(ProgressTracker(metrics, "p"), 1)
    samples = {
        (s.name, s.labels.get("binding")): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }
    assert samples[("materializer_source_lag_seconds", "files")] == 120.5
    assert samples[("materializer_source_lag_seconds", "other")] == 0.0
    assert ("materializer_source_lag_seconds", "topic") not in samples  # kafka does not say
    assert samples[("materializer_source_lag_records", "topic")] == 40
    assert samples[("materializer_source_lag_files", "files")] == 2
