"""An apply that loses the race to a real concurrent commit (issue #67), on real Delta tables.

Each test holds the epoch's MERGE inside its Spark job (a Python UDF on the staged rows' key waits
for a file), after the MERGE has read the table, while another session commits to the same table:
an OPTIMIZE, or a person's UPDATE of a row the MERGE reads. Delta then refuses the MERGE's commit
(a real ``ConcurrentDeleteReadException``), and the writer retries it under Delta's conflict rules,
counting the retry in the apply's result, its progress record and the Prometheus counter; or it
stops, naming the commit that won. Tables are read by Spark and by delta-rs and compared with the
oracle of the sources. The last test, without a JVM, folds the count into the record, the text line
and the counter.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from materializer.errors import CommitConflictError, TableStateError
from tests.helpers import binding, delta_rs_list, write_config, write_jsonl

GATE_SECONDS = 60
"""How long a held MERGE waits for the other session's commit before it goes on anyway (the test
then fails on its assertions instead of hanging)."""

FIRST = [{"id": i, "v": i, "w": f"w{i}"} for i in range(1, 7)]
SECOND = [{"id": i, "v": 10 * i, "w": "b"} for i in (1, 2, 3)]
THIRD = [{"id": 2, "v": 200, "w": "c"}, {"id": 7, "v": 70, "w": "c"}]
"""The held epoch (epoch 3): key 2, which every file of the table may hold, and a new key."""


class Race:
    """Holds the MERGE of chosen apply attempts of the held epoch, and meanwhile runs ``statement``
    on the table in another session (no txn id, no tag of ours: a person or a maintenance job)."""

    def __init__(self, spark: Any, table: Path, folder: Path, statement: str, attempts: set[int]) -> None:
        self.spark = spark
        self.table = table
        self.folder = folder
        self.statement = statement
        self.attempts = attempts
        self.reads = 0
        """The held epoch's reads of its staged rows: one per apply attempt."""
        self.committed: list[int] = []
        """The table's version after each of the other session's commits."""
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def read(self, original: Any) -> Any:
        """A replacement for ``StagingArea.read`` that holds the chosen attempts of epoch 3."""
        race = self

        def read(area: Any, spark: Any, binding: Any, epoch: int, staged: Any, *args: Any, **kwargs: Any) -> Any:
            rows = original(area, spark, binding, epoch, staged, *args, **kwargs)
            if epoch != 3:
                return rows
            race.reads += 1
            if race.reads not in race.attempts:
                return rows
            return race._held(rows, race.folder / f"attempt-{race.reads}")

        return read

    def _held(self, rows: Any, gate: Path) -> Any:
        from pyspark.sql import functions as F

        gate.mkdir(parents=True)
        key_type = rows.schema["id"].dataType
        started, go = str(gate / "started"), str(gate / "go")

        def hold(value):  # type: ignore[no-untyped-def]  # no hints: PySpark reads them as a pandas UDF's
            # The first row the MERGE's job reads waits (in its executor's Python worker) until the
            # other session has committed; every other row, and the MERGE's second pass, go on.
            try:
                os.close(os.open(started, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return value
            deadline = time.time() + GATE_SECONDS
            while not os.path.exists(go) and time.time() < deadline:
                time.sleep(0.05)
            return value

        thread = threading.Thread(target=self._other_session, args=(gate,), daemon=True)
        thread.start()
        self._threads.append(thread)
        return rows.withColumn("id", F.udf(hold, key_type)(F.col("id")))

    def _other_session(self, gate: Path) -> None:
        from deltalake import DeltaTable

        try:
            deadline = time.monotonic() + GATE_SECONDS
            while not (gate / "started").exists():
                if time.monotonic() > deadline:
                    raise AssertionError(f"{gate}: the MERGE never read its staged rows")
                time.sleep(0.05)
            self.spark.newSession().sql(self.statement.format(t=f"delta.`{self.table}`")).collect()
            self.committed.append(DeltaTable(str(self.table)).version())
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.errors.append(exc)
        finally:
            (gate / "go").touch()

    def check(self) -> None:
        for thread in self._threads:
            thread.join(GATE_SECONDS)
        assert not self.errors, self.errors


@pytest.fixture
def race(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``race(spark, table, folder, statement, attempts)``: a :class:`Race` wired into the staging area."""
    from materializer.staging import StagingArea

    made: list[Race] = []

    def make(spark: Any, table: Path, folder: Path, statement: str, attempts: set[int]) -> Race:
        made.append(Race(spark, table, folder, statement, attempts))
        monkeypatch.setattr(StagingArea, "read", made[-1].read(StagingArea.read))
        return made[-1]

    yield make
    for r in made:
        for thread in r._threads:
            thread.join(GATE_SECONDS)


def _pipeline(tmp_path: Path, **options: Any) -> tuple[Any, Path]:
    from materializer.config import load_config

    table = tmp_path / "tables" / "items"
    src = tmp_path / "src"
    for name, docs in (("a", FIRST), ("b", SECOND), ("c", THIRD)):
        write_jsonl(src / f"{name}.jsonl", docs)
    config = load_config(write_config(tmp_path, [binding("items", src, table, max_files=1, **options)]))
    return config, table


def _assert_table(spark: Any, config: Any, table: Path) -> None:
    """The table equals the oracle of the three source files, read by Spark and by delta-rs."""
    from materializer.tools import oracle

    expected = oracle.expected(config.binding("items"), config.transaction.max_documents)
    for reader, rows in (
        ("spark", [r.asDict(recursive=True) for r in spark.read.format("delta").load(str(table)).collect()]),
        ("delta-rs", delta_rs_list(table)),
    ):
        result = oracle.compare(expected, rows, ["id"])
        assert result.ok, f"read by {reader}: lost {result.lost}, duplicated {result.duplicated}, wrong {result.wrong}"
    assert {r["id"]: r["v"] for r in delta_rs_list(table)} == {1: 10, 2: 200, 3: 30, 4: 4, 5: 5, 6: 6, 7: 70}


def _epoch_commits(spark: Any, table: Path, epoch: int) -> list[int]:
    """The versions of the table's commits tagged with ``epoch`` of this pipeline."""
    from materializer.delta import TableRef, history

    return [h["version"] for h in history(spark, TableRef(str(table))) if (h["tag"] or {}).get("epoch") == epoch]


def test_a_merge_that_loses_to_an_optimize_is_retried_once_and_counted(spark: Any, tmp_path: Path, race: Any) -> None:
    """An OPTIMIZE commits while epoch 3's MERGE runs, removing the files the MERGE read: Delta
    refuses the MERGE's commit; the writer reads the table again and commits on the second attempt.
    The retry is in the Applied event, the epoch's progress record (JSON too) and the Prometheus
    counter, and the table holds every epoch once."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from materializer import events
    from materializer.metrics import PrometheusCollector
    from materializer.progress import JsonLinesCollector, ListCollector, Tee
    from materializer.runtime import Runtime

    config, table = _pipeline(tmp_path)
    Runtime(config, spark).run(max_epochs=2)  # epochs 1 and 2: the table has files to compact
    held = race(spark, table, tmp_path / "gates", "OPTIMIZE {t}", attempts={1})
    seen, metrics, jsonl = ListCollector(), PrometheusCollector(config.pipeline_id), io.StringIO()

    summary = Runtime(config, spark, Tee(seen, metrics, JsonLinesCollector(jsonl))).run()
    held.check()

    assert summary.last_epoch == 3
    assert held.reads == 2, "epoch 3 was applied in two attempts: one lost to the OPTIMIZE, one committed"
    (applied,) = [e for e in seen.of(events.Applied) if e.epoch == 3]
    assert applied.status == "applied" and applied.conflicts_retried == 1
    (record,) = [e.record for e in seen.of(events.Progress) if e.epoch == 3]
    assert record.conflicts_retried == 1 and [b.conflicts_retried for b in record.bindings] == [1]
    records = [json.loads(x) for x in jsonl.getvalue().splitlines()]
    (line,) = [r for r in records if r["event"] == "progress" and r["epoch"] == 3]
    assert line["epoch"] == 3 and line["conflicts_retried"] == 1 and line["bindings"][0]["conflicts_retried"] == 1
    samples = {
        (s.name, s.labels.get("binding")): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }
    assert samples[("materializer_commit_conflicts_retried_total", "items")] == 1.0
    # The OPTIMIZE's commit came between the MERGE's read and its commit, and the MERGE after it.
    (optimized,) = held.committed
    assert _epoch_commits(spark, table, 3) == [optimized + 1]
    _assert_table(spark, config, table)


@pytest.mark.slow
def test_a_merge_that_loses_every_race_stops_naming_the_commit_and_the_next_run_applies_it_once(
    spark: Any, tmp_path: Path, race: Any
) -> None:
    """A person's UPDATE of a row the MERGE reads wins every attempt of epoch 3: after
    CommitProperties.max_retries attempts the run stops with CommitConflictError naming the last
    UPDATE's version and operation; the epoch stays committed in the log and the next run applies
    it once, over the person's change (others_may_write: true, the default)."""
    from materializer.runtime import Runtime

    config, table = _pipeline(tmp_path)
    Runtime(config, spark).run(max_epochs=2)
    held = race(spark, table, tmp_path / "gates", "UPDATE {t} SET w = 'person' WHERE id = 2", attempts={1, 2, 3})

    with pytest.raises(CommitConflictError) as stopped:
        Runtime(config, spark).run()
    held.check()

    assert held.reads == 3 and len(held.committed) == 3
    last = held.committed[-1]
    error = stopped.value
    assert (error.epoch, error.binding, error.version, error.operation) == (3, "items", last, "UPDATE")
    # Delta's name for it: ConcurrentAppendException (the UPDATE's files with deletion vectors) or
    # ConcurrentDeleteReadException (a rewritten file), as the table's layout has it.
    assert f"the last race was won by version {last} (UPDATE, engineInfo 'Apache-Spark/" in str(error)
    assert "(Delta's Concurrent" in str(error)
    assert "run again" in str(error) and error.exit_code == 12
    assert _epoch_commits(spark, table, 3) == []  # nothing of epoch 3 was applied

    Runtime(config, spark).run()  # the race is over: epoch 3 applies, once
    assert held.reads == 4
    assert len(_epoch_commits(spark, table, 3)) == 1
    _assert_table(spark, config, table)


@pytest.mark.slow
def test_with_others_may_write_false_a_persons_update_that_wins_stops_without_a_retry(
    spark: Any, tmp_path: Path, race: Any
) -> None:
    """``others_may_write: false``: a retry would write over the row the person changed, so the
    first lost race stops the run (exit 7), naming the person's UPDATE; nothing of epoch 3 is written."""
    from materializer.runtime import Runtime

    config, table = _pipeline(tmp_path, others_may_write=False)
    Runtime(config, spark).run(max_epochs=2)
    held = race(spark, table, tmp_path / "gates", "UPDATE {t} SET w = 'person' WHERE id = 2", attempts={1})

    with pytest.raises(TableStateError, match=r"others_may_write: false") as stopped:
        Runtime(config, spark).run()
    held.check()

    (version,) = held.committed
    assert held.reads == 1, "not retried"
    assert f"lost the race to version {version} (UPDATE" in str(stopped.value)
    assert _epoch_commits(spark, table, 3) == []
    assert {r["id"]: r["w"] for r in delta_rs_list(table)}[2] == "person"


def test_the_retries_are_folded_into_the_record_the_text_line_and_the_counter(caplog: pytest.LogCaptureFixture) -> None:
    """No JVM: two bindings' Applied events, one after two lost races, make one progress record
    whose count is their sum, a text line that says so, and the Prometheus counter per binding."""
    import logging

    from prometheus_client import generate_latest

    from materializer import events
    from materializer.metrics import PrometheusCollector
    from materializer.progress import ListCollector, ProgressTracker, Tee, TextCollector

    sink, metrics = ListCollector(), PrometheusCollector("p")
    tracker = ProgressTracker(Tee(sink, metrics, TextCollector(logging.getLogger("test-conflicts"))), "p")
    with caplog.at_level(logging.INFO, logger="test-conflicts"):
        tracker.emit(events.Applied(epoch=3, binding="a", table="/t/a", status="applied", rows=2, conflicts_retried=2))
        tracker.emit(events.Applied(epoch=3, binding="b", table="/t/b", status="applied", rows=1))
        tracker.emit(events.Acknowledged(epoch=3, first=False, seconds=1.0, at="t"))
    (record,) = [e.record for e in sink.of(events.Progress)]
    assert record.conflicts_retried == 2 and [b.conflicts_retried for b in record.bindings] == [2, 0]
    assert "epoch 3: a -> /t/a: applied, 2 rows, after 2 commits lost to a concurrent one and retried" in caplog.messages
    assert "epoch 3: b -> /t/b: applied, 1 rows" in caplog.messages
    text = generate_latest(metrics.registry).decode()
    assert 'materializer_commit_conflicts_retried_total{binding="a",pipeline="p"} 2.0' in text
    assert 'materializer_commit_conflicts_retried_total{binding="b",pipeline="p"} 0.0' in text
    # A record written before the field existed still reads (0).
    old = {k: v for k, v in events.Progress(record).to_record().items() if k != "conflicts_retried"}
    old["bindings"] = [{k: v for k, v in b.items() if k != "conflicts_retried"} for b in old["bindings"]]
    read = events.from_record({"event": "progress", **old})
    assert isinstance(read, events.Progress) and read.record.conflicts_retried == 0
