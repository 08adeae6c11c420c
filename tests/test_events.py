"""Typed events (#14 item 4): the core emits frozen dataclasses; people read text, tools read JSON.

The drill times its kills from the JSON records of ``materializer run --all-events`` and the bench
times its steps from the spans the core emits: neither parses human text or patches the core.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from materializer import events
from materializer.events import Collector, Event, from_record
from materializer.progress import JsonLinesCollector, ListCollector, ProgressTracker, Tee, TextCollector

# One of every core event, with the fields a run fills in.
SAMPLES: list[Event] = [
    events.Opened(pipeline="p", epoch=2, writer="w-1"),
    events.OrphansDeleted(files=3, datasets=1),
    events.Read(epoch=3, binding="a", documents=5, extent="f-003.jsonl", seconds=0.5, at="t0", bytes=400,
                lag={"files": 1, "bytes": 90}, dead_letters=1),
    events.LoadQueued(epoch=3, binding="a"),
    events.Committed(epoch=3, documents=5, at="t1", staged={"a": (4, 1000)}, stage_seconds=1.5, log_commit_seconds=0.01),
    events.Applied(epoch=3, binding="a", table="/t/a", status="applied", rows=4, delta_version=7,
                   metrics={"num_inserted_rows": 4}, seconds=2.0),
    events.DeadLettersApplied(epoch=3, binding="a", table="/t/a__dead_letters", status="applied", rows=1, seconds=0.2),
    events.Acknowledged(epoch=3, first=False, seconds=2.2, at="t2"),
    events.BackfillStarted(epoch=4, binding="a", position="f-001.jsonl", truncate=True),
    events.Finished(pipeline_id="p", opened_at_epoch=2, last_epoch=3, epochs=1, documents=5, seconds=9.5),
    events.SpanStarted(name="merge", epoch=3, binding="a"),
    events.Span(name="merge", epoch=3, binding="a", seconds=1.25, ok=True),
]


def _progress() -> events.Progress:
    sink = ListCollector()
    tracker = ProgressTracker(sink, "p")
    for event in SAMPLES[2:8]:
        tracker.emit(event)
    (progress,) = sink.of(events.Progress)
    return progress


def test_every_core_event_has_a_stable_kind_and_round_trips_through_its_json_record() -> None:
    samples = [*SAMPLES, _progress()]
    assert {type(e) for e in samples} == set(events.CORE_EVENTS.values())
    out = io.StringIO()
    lines = JsonLinesCollector(out, kinds=None)
    for event in samples:
        lines.emit(event)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in records] == [
        "opened", "orphans_deleted", "read", "load", "committed", "applied", "dead_letters_applied", "acknowledged",
        "backfill_started", "finished", "span_started", "span", "progress",
    ]
    assert all(r["at"] for r in records)
    assert records[2]["at"] == "t0"  # an event's own time wins over the time it was written
    assert records[4]["staged"] == {"a": [4, 1000]}
    assert records[-1]["epoch"] == 3 and records[-1]["inserted"] == 4 and records[-1]["bindings"][0]["binding"] == "a"
    # Read back, every record is the event that was sent (what the drill relies on).
    assert [from_record(r) for r in records] == samples


def test_records_of_unknown_kinds_are_skipped_and_known_ones_must_be_whole() -> None:
    assert from_record({"event": "a_newer_kind", "epoch": 1}) is None
    assert from_record({"no": "event"}) is None
    with pytest.raises(ValueError, match="'committed'"):
        from_record({"event": "committed", "documents": 1})  # no epoch
    # Fields a newer writer adds are ignored, not errors.
    assert from_record({"event": "load", "epoch": 1, "binding": "a", "new_field": 1}) == events.LoadQueued(epoch=1, binding="a")


def test_the_default_json_lines_stay_the_records_tools_have_always_read() -> None:
    out = io.StringIO()
    lines = JsonLinesCollector(out)
    for event in [*SAMPLES, _progress()]:
        lines.emit(event)
    kinds = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert kinds == ["opened", "orphans_deleted", "finished", "progress"]


def test_the_text_collector_writes_the_run_lines_people_have_seen(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test-events-text")
    text = TextCollector(logger)
    with caplog.at_level(logging.DEBUG, logger="test-events-text"):
        for event in [*SAMPLES, _progress()]:
            text.emit(event)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "opened pipeline p at epoch 2 (writer w-1)"),
        (logging.INFO, "deleted 3 orphaned staged files"),
        (logging.INFO, "epoch 3: read 5 documents of a (f-003.jsonl)"),
        (logging.INFO, "epoch 3: committed to the recovery log"),
        (logging.INFO, "epoch 3: a -> /t/a: applied, 4 rows"),
        (logging.INFO, "epoch 3: a -> /t/a__dead_letters: 1 dead letter appended (file:line or offset, reason, text)"),
        (logging.DEBUG, _progress().record.summary()),
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="test-events-text"):
        for event in SAMPLES:
            TextCollector(logger, quiet=True).emit(event)
    assert caplog.records == []


def test_bindings_with_nothing_to_apply_are_one_line_per_epoch(caplog: pytest.LogCaptureFixture) -> None:
    """A fleet of 200 tables with one busy: 199 "empty" lines an epoch drowned the one that mattered."""
    logger = logging.getLogger("test-events-idle")
    text = TextCollector(logger)
    with caplog.at_level(logging.INFO, logger="test-events-idle"):
        for epoch, idle in ((3, 199), (4, 1), (5, 0)):
            text.emit(events.Applied(epoch=epoch, binding="busy", table="/t/busy", status="applied", rows=2))
            for i in range(idle):
                text.emit(events.Applied(epoch=epoch, binding=f"b{i}", table=f"/t/b{i}", status="empty"))
            text.emit(events.Acknowledged(epoch=epoch, first=False, seconds=1.0, at="t"))
    assert [r.getMessage() for r in caplog.records] == [
        "epoch 3: busy -> /t/busy: applied, 2 rows",
        "epoch 3: 199 bindings had nothing to apply",
        "epoch 4: busy -> /t/busy: applied, 2 rows",
        "epoch 4: 1 binding had nothing to apply",
        "epoch 5: busy -> /t/busy: applied, 2 rows",
    ]


def test_dead_letters_appended_are_a_line_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    """A run that set documents aside says how many and where: its table's line alone reads as clean."""
    logger = logging.getLogger("test-events-dead")
    text = TextCollector(logger)
    with caplog.at_level(logging.INFO, logger="test-events-dead"):
        text.emit(events.Applied(epoch=1, binding="t", table="/t/t", status="applied", rows=1799998))
        text.emit(events.DeadLettersApplied(epoch=1, binding="t", table="/t/t_dead_letters", status="applied", rows=2))
        text.emit(events.DeadLettersApplied(epoch=2, binding="t", table="/t/t_dead_letters", status="applied", rows=1))
        text.emit(events.DeadLettersApplied(epoch=3, binding="t", table="/t/t_dead_letters", status="skipped", rows=1))
    assert [r.getMessage() for r in caplog.records] == [
        "epoch 1: t -> /t/t: applied, 1799998 rows",
        "epoch 1: t -> /t/t_dead_letters: 2 dead letters appended (file:line or offset, reason, text)",
        "epoch 2: t -> /t/t_dead_letters: 1 dead letter appended (file:line or offset, reason, text)",
    ]


def test_a_span_times_its_block_and_says_when_it_raised() -> None:
    sink = ListCollector()
    with sink.span("start_commit", 4):
        pass
    with pytest.raises(RuntimeError):
        with sink.span("merge", 4, "a"):
            raise RuntimeError("conflict")
    started, ended, started2, failed = sink.received
    assert started == events.SpanStarted(name="start_commit", epoch=4, binding=None)
    assert isinstance(ended, events.Span) and ended.name == "start_commit" and ended.ok and ended.seconds >= 0
    assert started2.binding == "a" and isinstance(failed, events.Span) and not failed.ok
    # The null collector times nothing and sends nothing, and never fails the block.
    with Collector().span("x"):
        pass


def test_the_tracker_passes_spans_on_and_keeps_no_state_for_them() -> None:
    sink = ListCollector()
    tracker = ProgressTracker(sink, "p")
    with tracker.span("read", 9, "a"):
        pass
    tracker.emit(events.LoadQueued(epoch=9, binding="a"))
    assert [e.kind for e in sink.received] == ["span_started", "span", "load"]
    assert tracker._epochs == {}


def test_tee_skips_a_failing_consumer_and_goes_on() -> None:
    class Broken(Collector):
        def emit(self, event: Event) -> None:
            raise OSError("disk full")

    sink = ListCollector()
    Tee(Broken(), None, sink).emit(SAMPLES[0])
    assert sink.received == [SAMPLES[0]]


# --- the drill reads events, not text ------------------------------------------------------------

# `materializer run --config … --all-events` of a two-binding pipeline (standard + delta_updates),
# two files of two documents each (max_files 1: two epochs), recorded from a real run's stdout (the
# human lines went to stderr). Epoch 1 is applied while epoch 2 is read (pipelining).
RECORDED = Path(__file__).with_name("data") / "run_all_events.jsonl"


def _drill_sees(lines: list[str], bindings: int = 2) -> dict[str, Any]:
    from materializer.tools.drill import RunPhase, read_event

    phase = RunPhase(bindings)
    seen = []
    for at, line in enumerate(lines):
        kind = phase.feed(float(at), read_event(line))
        if kind is not None:
            phase.saw(kind, float(at))
            seen.append((kind, phase.phase))
    return {"seen": seen, "committed": phase.committed, "counts": dict(phase.counts), "windows": phase.apply_windows}


def test_the_drill_finds_its_moments_in_a_recorded_event_stream() -> None:
    lines = RECORDED.read_text().splitlines()
    noise = ["opened pipeline x at epoch 0 (writer y)", "26/11/21 WARN NativeCodeLoader: …", '{"event": "committed", "epo']
    sees = _drill_sees([*lines, *noise])
    assert sees["seen"] == [
        ("opened", "re-apply"),
        ("read", "read/stage/commit"), ("read", "read/stage/commit"), ("committed", "apply"),
        ("read", "read/stage/commit"), ("read", "read/stage/commit"),
        ("applied", "read/stage/commit"), ("applied", "read/stage/commit"),  # epoch 1 applied while epoch 2 is read
        ("committed", "apply"), ("applied", "apply"), ("applied", "after-apply"),
    ]
    assert sees["committed"] == [1, 2]
    assert sees["counts"]["opened"] == 1 and sees["counts"]["committed"] == 2 and sees["counts"]["applied"] == 4
    assert sees["counts"]["read"] == 4
    # Human text, a JVM line, a torn record: none of them is an event.
    assert _drill_sees(noise)["seen"] == []


def test_rewording_the_text_does_not_change_what_the_drill_sees(caplog: pytest.LogCaptureFixture) -> None:
    """The same events through the default text and a reworded one: the people's lines differ,
    the JSON the drill reads (and what it finds in it) does not."""
    from materializer.tools.drill import read_event

    stream = [from_record(json.loads(line)) for line in RECORDED.read_text().splitlines()]

    class Reworded(TextCollector):
        def line(self, event: Event) -> str | None:
            plain = super().line(event)
            return None if plain is None else "» " + plain.upper().replace("EPOCH", "transaction")

    def run(text: TextCollector) -> tuple[list[str], list[str]]:
        out = io.StringIO()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="test-events-reworded"):
            both = Tee(text, JsonLinesCollector(out, kinds=None))
            for event in stream:
                assert event is not None
                both.emit(event)
        return [r.getMessage() for r in caplog.records], out.getvalue().splitlines()

    logger = logging.getLogger("test-events-reworded")
    plain_text, plain_json = run(TextCollector(logger))
    new_text, new_json = run(Reworded(logger))
    assert plain_text and new_text and set(plain_text).isdisjoint(new_text)
    drop_at = lambda lines: [{k: v for k, v in json.loads(l).items() if k != "at"} for l in lines]  # noqa: E731
    assert drop_at(plain_json) == drop_at(new_json)
    assert _drill_sees(plain_json) == _drill_sees(new_json) == _drill_sees(RECORDED.read_text().splitlines())
    # The text itself, default or reworded, tells the drill nothing.
    assert [read_event(line) for line in plain_text + new_text] == [None] * (len(plain_text) + len(new_text))


# --- the bench times the core's spans -------------------------------------------------------------


def test_bench_steps_come_from_the_spans_the_core_emits() -> None:
    from materializer.tools.bench import SPAN_STEPS, SpanSteps

    steps = SpanSteps(spark=None)  # type: ignore[arg-type]  # no status tracker: jobs count 0
    for epoch in (1, 2):
        with steps.span("merge", epoch, "a"):
            pass
        with steps.span("unknown_step", epoch):
            pass
    merge = steps.steps[SPAN_STEPS["merge"]]
    assert merge["calls"] == 2 and merge["spark_jobs"] == 0 and len(merge["per_call"]) == 2
    assert steps.steps["unknown_step"]["calls"] == 2
    assert SPAN_STEPS["merge"].startswith("apply: MERGE")


def test_no_tool_patches_the_core_any_more() -> None:
    from materializer.tools import bench, drill

    # Each tool is a package: every module of it is read, not only its __init__.
    def source(package: Any) -> str:
        return "".join(p.read_text() for p in sorted(Path(package.__file__).parent.glob("*.py")))

    assert "setattr(" not in source(bench) and "StepProfiler" not in source(bench)
    assert "re.compile" not in source(drill)


@pytest.mark.spark
def test_a_run_emits_each_span_around_its_step(spark: Any, tmp_path: Path) -> None:
    from materializer.config import load_config
    from materializer.runtime import Runtime
    from tests.helpers import binding, write_config, write_jsonl

    src = tmp_path / "src"
    write_jsonl(src / "f-001.jsonl", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    write_jsonl(src / "f-002.jsonl", [{"id": 1, "v": "A"}])
    config = load_config(write_config(tmp_path, [binding("items", src, tmp_path / "tables" / "items", max_files=1)]))
    sink = ListCollector()
    Runtime(config, spark, sink).run()
    spans = sink.of(events.Span)
    assert all(s.ok for s in spans)
    names = {(s.name, s.epoch) for s in spans}
    for epoch in (1, 2):
        for name in ("read", "start_commit", "verify", "log_commit", "table_state", "read_staged", "merge"):
            assert (name, epoch) in names, (name, epoch, sorted(names, key=str))
    assert ("check_tables", 0) in names
    # Each Span follows its SpanStarted, and the apply's spans of an epoch end before its Acknowledged.
    kinds = [(e.kind, getattr(e, "name", None), getattr(e, "epoch", None)) for e in sink.received]
    for epoch in (1, 2):
        merge_end = kinds.index(("span", "merge", epoch))
        assert kinds.index(("span_started", "merge", epoch)) < merge_end < kinds.index(("acknowledged", None, epoch))
