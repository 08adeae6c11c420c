"""Per-epoch progress records: folded from the run's events, with the MERGE's own counts."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from materializer import events
from materializer.config import load_config
from materializer.progress import EpochProgress, JsonLinesCollector, ListCollector, ProgressTracker
from materializer.runtime import Runtime
from tests.helpers import binding, write_config, write_jsonl


def _feed(tracker: ProgressTracker, epoch: int, *, first: bool = False, read: bool = True) -> None:
    if read:
        tracker.emit(events.Read(epoch=epoch, binding="a", documents=5, extent="f-1", bytes=400, lag={"files": 2, "bytes": 900}, seconds=0.5, at="t0"))
        tracker.emit(events.Read(epoch=epoch, binding="b", documents=3, extent="f-1", seconds=0.25, at="t0b"))
        tracker.emit(events.Committed(epoch=epoch, documents=8, at="t1", staged={"a": (4, 1000), "b": (3, 700)}, stage_seconds=1.5, log_commit_seconds=0.01))
    tracker.emit(events.Applied(epoch=epoch, binding="a", table="/t/a", status="applied", rows=4, delta_version=3,
                                metrics={"num_affected_rows": 4, "num_inserted_rows": 2, "num_updated_rows": 1, "num_deleted_rows": 1}, seconds=2.0))
    tracker.emit(events.Applied(epoch=epoch, binding="b", table="/t/b", status="skipped", rows=0, delta_version=7, metrics={}, seconds=0.1))
    tracker.emit(events.Acknowledged(epoch=epoch, first=first, seconds=2.2, at="t2"))


def test_the_tracker_folds_an_epochs_events_into_one_record() -> None:
    sink = ListCollector()
    tracker = ProgressTracker(sink, "p")
    _feed(tracker, 4)
    # Every event is passed on, then the record once the epoch is acknowledged.
    assert [n for n, _ in sink.events] == ["read", "read", "committed", "applied", "applied", "acknowledged", "progress"]
    record = sink.named("progress")[0]["record"]
    assert isinstance(record, EpochProgress)
    assert (record.pipeline_id, record.epoch, record.reapplied) == ("p", 4, False)
    assert (record.started_at, record.committed_at, record.applied_at) == ("t0", "t1", "t2")
    assert (record.documents, record.bytes_read, record.rows_staged, record.bytes_staged) == (8, 400, 7, 1700)
    assert (record.inserted, record.updated, record.deleted) == (2, 1, 1)
    assert (record.applied, record.skipped) == (1, 1)
    assert record.phase_seconds == {"read": 0.75, "stage": 1.5, "log_commit": 0.01, "apply": 2.2}
    assert (record.lag_files, record.lag_bytes) == (2, 900)
    by_name = {b.binding: b for b in record.bindings}
    assert by_name["b"].status == "skipped" and by_name["b"].inserted is None and by_name["b"].bytes_read is None


def test_the_reapply_after_open_is_a_record_of_its_own() -> None:
    sink = ListCollector()
    tracker = ProgressTracker(sink, "p")
    _feed(tracker, 9, first=True, read=False)
    record = sink.named("progress")[0]["record"]
    assert record.reapplied and record.started_at is None and record.documents == 0
    assert record.phase_seconds == {"apply": 2.2}


def test_records_are_json_lines_with_every_field() -> None:
    sink = ListCollector()
    tracker = ProgressTracker(sink, "p")
    _feed(tracker, 1)
    out = io.StringIO()
    lines = JsonLinesCollector(out)
    lines.emit(events.Opened(pipeline="p", epoch=0, writer="w"))
    lines.emit(events.Read(epoch=1, binding="a", documents=1, extent="f", seconds=0.1, at="t"))  # not a record kind: left out
    lines.emit(sink.of(events.Progress)[0])
    first, second = [json.loads(line) for line in out.getvalue().splitlines()]
    assert first["event"] == "opened" and first["at"].endswith("Z")
    assert second["event"] == "progress" and second["epoch"] == 1
    assert second["inserted"] == 2 and second["phase_seconds"]["apply"] == 2.2
    assert [b["binding"] for b in second["bindings"]] == ["a", "b"]


@pytest.mark.spark
def test_a_run_reports_the_merge_counts_of_each_epoch(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    # Epoch 1: three new keys. Epoch 2: one update, one delete, one new key.
    write_jsonl(src / "f-001.jsonl", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}])
    write_jsonl(src / "f-002.jsonl", [{"id": 1, "v": "A"}, {"id": 2, "_meta": {"op": "d"}}, {"id": 4, "v": "d"}])
    config = load_config(
        write_config(
            tmp_path,
            [
                binding("items", src, tmp_path / "tables" / "items", max_files=1),
                binding("log", src, tmp_path / "tables" / "log", mode="delta_updates", max_files=1),
            ],
        )
    )
    events = ListCollector()
    Runtime(config, spark, events).run()
    records = [f["record"] for f in events.named("progress")]
    assert [r.epoch for r in records] == [1, 2]
    one, two = records
    items1 = {b.binding: b for b in one.bindings}["items"]
    items2 = {b.binding: b for b in two.bindings}["items"]
    log2 = {b.binding: b for b in two.bindings}["log"]
    # Epoch 1 creates the table (an append of 3 rows); epoch 2 is a MERGE: +1 ~1 -1.
    assert (items1.status, items1.inserted) == ("applied", 3)
    assert (items2.inserted, items2.updated, items2.deleted) == (1, 1, 1)
    assert (log2.status, log2.inserted, log2.rows_staged) == ("applied", 3, 3)
    assert (two.inserted, two.updated, two.deleted, two.applied, two.skipped) == (4, 1, 1, 2, 0)
    assert two.documents == 6 and two.rows_staged == 6
    # The documents source's lag: after epoch 1 one file per binding is left, after epoch 2 none.
    assert (items1.lag_files, items2.lag_files, two.lag_files, two.lag_bytes) == (1, 0, 0, 0)
    assert items1.lag_bytes == (src / "f-002.jsonl").stat().st_size
    for record in records:
        assert set(record.phase_seconds) == {"read", "stage", "log_commit", "apply"}
        assert all(v >= 0 for v in record.phase_seconds.values())
        assert record.started_at is not None and record.committed_at is not None
        assert record.started_at <= record.committed_at <= record.applied_at

    # A second run finds epoch 2 applied: its record says skipped, with no counts.
    again = ListCollector()
    Runtime(config, spark, again).run()
    (replayed,) = [f["record"] for f in again.named("progress")]
    assert replayed.reapplied and replayed.epoch == 2
    assert (replayed.applied, replayed.skipped, replayed.inserted) == (0, 2, 0)


def test_the_databricks_job_prints_each_record_as_a_timed_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    from materializer.databricks import _job_output

    tracker = ProgressTracker(_job_output(), "p")
    _feed(tracker, 3)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["event"] for line in lines] == ["committed", "applied", "applied", "progress"]
    assert all("at" in line for line in lines[:-1]) and lines[-1]["applied_at"] == "t2"
    progress = lines[-1]
    assert progress["epoch"] == 3 and progress["inserted"] == 2 and progress["phase_seconds"]["stage"] == 1.5
