"""Issue #18, part 2: an epoch's cost set by the epoch, not the table.

New tables get deletion vectors (a MERGE marks replaced rows instead of copying whole files), and
the MERGE condition carries the epoch's key bounds, observed while staging, so Delta skips the
table's files that hold none of the epoch's keys.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from materializer.bounds import bounds_condition
from materializer.merge import merge_sql
from materializer.runtime import Runtime
from materializer.merge.writer import MERGE_DELETION_VECTORS
from tests.helpers import FakeConf, binding, delta_rs_rows, table_rows, write_jsonl
from tests.test_holes import config_with

pytestmark = pytest.mark.spark


def test_bounds_compose_into_the_merge_condition_without_touching_the_rest() -> None:
    bounds = {"id": ["integer", "3", "9"], "na`me": ["string", "61", "7A"]}
    condition = bounds_condition(bounds)
    assert condition == " AND t.`id` >= 3 AND t.`id` <= 9 AND t.`na``me` >= CAST(X'61' AS STRING) AND t.`na``me` <= CAST(X'7A' AS STRING)"
    sql = merge_sql("delta.`/x`", "v", ["id"], ["id", "v"], "", condition)
    assert f"ON t.`id` = s.`id`{condition} WHEN MATCHED" in sql
    assert bounds_condition(None) == "" and merge_sql("x", "v", ["id"], ["id"]) == merge_sql("x", "v", ["id"], ["id"], "", "")


@pytest.mark.slow
def test_observed_bounds_round_trip_exactly_for_every_bounded_key_type(spark: Any) -> None:
    """Each key type's bounds, turned back into SQL literals, take in exactly the epoch's keys."""
    from pyspark.sql import Observation

    from materializer.bounds import bound_aggregates, bounds_from

    utc = dt.timezone.utc
    rows = [
        (1, "it's \\ é", dt.date(2020, 1, 1), dt.datetime(2020, 1, 1, 0, 0, 0, 1, tzinfo=utc), Decimal("1.10"), 0.5),
        (-7, "zz\u00ff", dt.date(1969, 12, 31), dt.datetime(2031, 5, 6, 7, 8, 9, 999999, tzinfo=utc), Decimal("-3.25"), 1.5),
        (None, None, None, None, None, None),
    ]
    schema = "i bigint, s string, d date, ts timestamp, n decimal(10,2), f double"
    key = ["i", "s", "d", "ts", "n", "f"]
    df = spark.createDataFrame(rows, schema)
    aggregates, kinds = bound_aggregates(df.schema, key)
    assert "f" not in kinds  # no bounds for floating-point keys
    observation = Observation("bounds_test")
    df.observe(observation, *aggregates).write.format("noop").mode("overwrite").save()
    bounds = bounds_from(observation.get, key, kinds)
    assert set(bounds) == {"i", "s", "d", "ts", "n"}
    df.createOrReplaceTempView("bounded")
    inside = spark.sql(f"SELECT count(*) AS c FROM bounded t WHERE true{bounds_condition(bounds)}").collect()[0]["c"]
    assert inside == 2  # both non-NULL rows: the bounds are exact, nothing of the epoch is left out
    for name, (kind, low, high) in bounds.items():
        # Just outside each bound is outside: the bounds are tight, so files can be skipped.
        one = {name: [kind, low, low]}
        assert spark.sql(f"SELECT count(*) AS c FROM bounded t WHERE true{bounds_condition(one)}").collect()[0]["c"] == 1


def test_a_merge_skips_the_files_outside_the_epochs_keys(spark: Any, tmp_path: Path) -> None:
    """A data file of keys the epoch does not touch is never read: removed from disk, the MERGE
    still succeeds (without the bounds it reads every file and fails on the missing one)."""
    table = tmp_path / "tables" / "items"
    (
        spark.range(0, 400, numPartitions=4).selectExpr("id", "id * 2 AS v").repartitionByRange(4, "id").sortWithinPartitions("id")
        .write.format("delta").option("delta.enableDeletionVectors", "true").save(str(table))
    )
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 5, "v": -1}, {"id": 7, "v": -1}, {"_meta": {"op": "d"}, "id": 9}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, adopt_table=True)])
    highest = max((f for f in table.glob("*.parquet")), key=lambda f: int(spark.read.parquet(str(f)).agg({"id": "max"}).collect()[0][0]))
    highest.unlink()  # keys 300-399: none of them in the epoch
    summary = Runtime(config, spark).run()
    assert summary.last_epoch == 1
    low = spark.read.format("delta").load(str(table)).where("id < 10").collect()
    assert {r["id"]: r["v"] for r in low} == {0: 0, 1: 2, 2: 4, 3: 6, 4: 8, 5: -1, 6: 12, 7: -1, 8: 16}


@pytest.mark.slow
def test_a_merge_into_a_created_table_marks_rows_with_deletion_vectors_instead_of_copying_files(spark: Any, tmp_path: Path) -> None:
    """A table of at least ``transaction.copy_on_write_below_bytes`` (0 here: every table)."""
    table = tmp_path / "tables" / "items"
    _two_epochs(tmp_path)
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table)], transaction={"copy_on_write_below_bytes": 0})
    Runtime(config, spark).run()
    metrics = _last_merge(spark, table)
    assert metrics["numTargetRowsCopied"] == "0" and int(metrics["numTargetDeletionVectorsAdded"]) >= 1
    _assert_second_epoch(spark, table)


def test_a_merge_into_a_small_table_rewrites_the_files_it_touches_and_leaves_the_session_as_it_was(spark: Any, tmp_path: Path) -> None:
    """Below ``transaction.copy_on_write_below_bytes`` (16 MiB by default) a MERGE rewrites the
    touched files: no deletion vector is written, the rows are the same, and the apply session's
    conf is back to what it was (set, it is restored; unset, it stays unset)."""
    table = tmp_path / "tables" / "items"
    _two_epochs(tmp_path)
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table)])
    assert config.transaction.copy_on_write_below_bytes == 16 * 1024 * 1024
    runtime = Runtime(config, spark)
    runtime.run()
    metrics = _last_merge(spark, table)
    assert metrics["numTargetDeletionVectorsAdded"] == "0" and int(metrics["numTargetRowsCopied"]) == 48  # the file's other rows
    assert int(metrics["numTargetFilesRemoved"]) >= 1
    _assert_second_epoch(spark, table)
    assert not list(table.glob("deletion_vector_*.bin"))
    assert spark.conf.get(MERGE_DELETION_VECTORS, None) is None


def _two_epochs(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in range(50)])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 3, "v": -3}, {"_meta": {"op": "d"}, "id": 4}, {"id": 99, "v": 99}])


def _last_merge(spark: Any, table: Path) -> dict[str, str]:
    merge = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]
    assert merge["operation"] == "MERGE"
    return dict(merge["operationMetrics"])


def _assert_second_epoch(spark: Any, table: Path) -> None:
    expected = {i: i for i in range(50) if i not in (3, 4)} | {3: -3, 99: 99}
    rows = table_rows(spark, table, ["id"])
    assert {k[0]: r["v"] for k, r in rows.items()} == expected
    assert {k[0]: r["v"] for k, r in delta_rs_rows(table, ["id"]).items()} == expected  # delta-rs applies deletion vectors too


@pytest.mark.slow
def test_merge_profile_measures_both_ways_on_tables_that_end_equal(spark: Any, capsys: Any) -> None:
    from materializer.tools import merge_profile

    merge_profile.main(["--rows", "40", "--merges", "2", "--warmup", "0"])
    lines = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(line[0], " ".join(line[2:-2])) for line in lines] == [("40", "deletion vectors"), ("40", "files rewritten"), ("40", "rewritten, interpreted")]
    assert all(float(line[-2]) > 0 and float(line[-1]) > 0 for line in lines)
    assert spark.conf.get(MERGE_DELETION_VECTORS, None) is None


def test_a_small_apply_runs_interpreted_and_leaves_the_session_as_it_was(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """Below ``transaction.interpreted_below_bytes`` (the table's data files and the staged rows)
    the MERGE runs without adaptive re-planning and generated code; at ``0``, as the apply session
    is set; after the apply the session's conf is what it was. The rows are the same."""
    from materializer.merge.writer import DeltaWriter
    from materializer.spark.settings import INTERPRETED

    session_ways = {"spark.sql.adaptive.enabled": "true", "spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}
    assert set(session_ways) == set(INTERPRETED) and all(session_ways[k] != v for k, v in INTERPRETED.items())
    seen: list[dict[str, Any]] = []
    writers: list[DeltaWriter] = []
    init, write = DeltaWriter.__init__, DeltaWriter.write

    def set_up(self: DeltaWriter, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for key, value in session_ways.items():  # (the tests' sessions run interpreted by default)
            self.apply_spark.conf.set(key, value)
        writers.append(self)

    def watched(self: DeltaWriter, *args: Any, **kwargs: Any) -> Any:
        seen.append({key: self.apply_spark.conf.get(key, None) for key in INTERPRETED})
        return write(self, *args, **kwargs)

    monkeypatch.setattr(DeltaWriter, "__init__", set_up)
    monkeypatch.setattr(DeltaWriter, "write", watched)
    _two_epochs(tmp_path)
    small = tmp_path / "tables" / "small"
    Runtime(config_with(tmp_path, [binding("items", tmp_path / "src", small)]), spark).run()
    assert seen == [INTERPRETED, INTERPRETED]  # the table's creation, then the second epoch's MERGE
    assert {key: writers[0].apply_spark.conf.get(key) for key in INTERPRETED} == session_ways
    _assert_second_epoch(spark, small)

    seen.clear()
    never = tmp_path / "tables" / "never"
    config = config_with(tmp_path / "never", [binding("items", tmp_path / "src", never)], transaction={"interpreted_below_bytes": 0})
    Runtime(config, spark).run()
    assert seen == [session_ways, session_ways]
    _assert_second_epoch(spark, never)


def test_a_small_epochs_staging_runs_interpreted_and_a_bigger_ones_as_the_session_says(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """When every batch of an epoch is small (here: under 100 bytes of documents), its staging
    jobs run interpreted on the runtime's session; a bigger epoch's as the session is set; after
    each, the session's conf is what it was."""
    from materializer.sources.documents import route as document_route
    from materializer.spark.settings import INTERPRETED
    from materializer.staging import StagingArea

    session_ways = {"spark.sql.adaptive.enabled": "true", "spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}
    seen: list[tuple[int, dict[str, Any]]] = []
    stage = StagingArea.stage

    def watched(self: StagingArea, name: str, epoch: int, df: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((epoch, {key: df.sparkSession.conf.get(key, None) for key in INTERPRETED}))
        return stage(self, name, epoch, df, *args, **kwargs)

    monkeypatch.setattr(StagingArea, "stage", watched)
    monkeypatch.setattr(document_route, "SMALL_EPOCH_BYTES", 100)
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}])  # 18 bytes
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": i, "v": i} for i in range(2, 12)])  # 190-odd
    table = tmp_path / "tables" / "items"
    session = spark.newSession()  # the runtime's session here: the shared one's settings stay the tests'
    for key, value in session_ways.items():
        session.conf.set(key, value)
    Runtime(config_with(tmp_path, [binding("items", tmp_path / "src", table)]), session).run()
    assert seen == [(1, INTERPRETED), (2, session_ways)]
    assert {key: session.conf.get(key, None) for key in INTERPRETED} == session_ways
    assert sorted(k[0] for k in delta_rs_rows(table, ["id"])) == list(range(1, 12))


def test_a_files_epoch_on_the_arrow_route_stages_with_arrow_batches_bounded_by_records(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """The documents' arrow validator sends a files epoch's lines to Python in batches bounded by
    records and the task's split, not measured after every row (ARROW_BATCHES_BY_RECORDS), for
    its staging job only: the VARIANT route's epoch stages as the session says, and the session's
    conf is what it was after each."""
    from materializer.sources.documents import route as document_route
    from materializer.spark.settings import ARROW_BATCHES_BY_RECORDS
    from materializer.staging import StagingArea

    (key,) = ARROW_BATCHES_BY_RECORDS
    seen: list[tuple[int, Any]] = []
    stage = StagingArea.stage

    def watched(self: StagingArea, name: str, epoch: int, df: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((epoch, df.sparkSession.conf.get(key, None)))
        return stage(self, name, epoch, df, *args, **kwargs)

    monkeypatch.setattr(StagingArea, "stage", watched)
    monkeypatch.setattr(document_route, "SMALL_EPOCH_BYTES", 100)
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}])  # small: the VARIANT route
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": i, "v": i} for i in range(2, 12)])  # the arrow route
    table = tmp_path / "tables" / "items"
    session = spark.newSession()
    session.conf.set(key, "32m")
    Runtime(config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, v BIGINT", max_files=1)]), session).run()
    assert seen == [(1, "32m"), (2, ARROW_BATCHES_BY_RECORDS[key])]
    assert session.conf.get(key) == "32m"
    assert sorted(delta_rs_rows(table, ["id", "v"])) == [(i, i) for i in range(1, 12)]


def test_interpreted_blocks_on_one_session_leave_it_as_it_was_however_they_interleave() -> None:
    """Two pipelines' staging on one session in two threads: each block puts back only what it
    finds still as it set it, so the session ends as it began in either order of exits."""
    from materializer.spark.settings import INTERPRETED, interpreted

    class Session:
        conf = FakeConf()

    for first_out in (True, False):
        session = Session()
        session.conf = FakeConf({"spark.sql.adaptive.enabled": "true"})
        before = dict(session.conf.values)
        a, b = interpreted(session), interpreted(session)  # type: ignore[arg-type]
        a.__enter__()
        b.__enter__()
        assert all(session.conf.get(key) == value for key, value in INTERPRETED.items())
        (a if first_out else b).__exit__(None, None, None)
        (b if first_out else a).__exit__(None, None, None)
        assert session.conf.values == before, first_out


def _cached_versions(spark: Any, table: Path) -> set[int]:
    """The versions of ``table`` whose snapshot Delta holds reconstructed (its cached 'Delta Table
    State #N - <table>/_delta_log' datasets): what a MERGE of the next epoch starts from."""
    suffix = f" - {table.resolve().as_uri()}/_delta_log"
    names = [str(rdd.name()) for rdd in spark.sparkContext._jsc.getPersistentRDDs().values()]
    return {int(n[len("Delta Table State #"):-len(suffix)]) for n in names if n.startswith("Delta Table State #") and n.endswith(suffix)}


def test_a_following_run_reads_the_applied_tables_new_snapshot_ahead_while_it_waits(spark: Any, tmp_path: Path) -> None:
    """In a following run's wait for input, each table applied since the last wait has its new
    version's snapshot reconstructed (docs: Performance, 'Freshness'), so the next MERGE starts
    from it; a run that drains its sources reads nothing ahead; a failed read ahead is ignored."""
    from deltalake import DeltaTable

    from materializer.delta import TableRef
    from materializer.events import Span
    from materializer.merge import SnapshotWarmer
    from materializer.progress import ListCollector

    def warmed(collector: ListCollector) -> dict[int, bool]:
        return {s.epoch: s.ok for s in collector.of(Span) if s.name == "warm_snapshot" and s.epoch is not None}

    # Drained: no read ahead, and the last version's snapshot is not reconstructed by anyone.
    write_jsonl(tmp_path / "d" / "src" / "a.jsonl", [{"id": 1, "v": 1}])
    write_jsonl(tmp_path / "d" / "src" / "b.jsonl", [{"id": 1, "v": 2}])
    drained = ListCollector()
    Runtime(config_with(tmp_path / "d", [binding("t", tmp_path / "d" / "src", tmp_path / "d" / "t")]), spark, drained).run()
    assert warmed(drained) == {}
    assert DeltaTable(str(tmp_path / "d" / "t")).version() not in _cached_versions(spark, tmp_path / "d" / "t")

    # Following: after epoch 1 is applied and the poll finds nothing, its snapshot is read ahead;
    # then a file arrives, epoch 2 is applied, and read ahead in the next wait.
    src, table = tmp_path / "f" / "src", tmp_path / "f" / "t"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": 1}, {"id": 2, "v": 1}])
    config = config_with(tmp_path / "f", [binding("t", src, table)], transaction={"poll_interval_seconds": 0.05})
    collector = ListCollector()
    calls = {"n": 0}

    def arrive_then_stop() -> bool:
        calls["n"] += 1
        done = warmed(collector)
        if 1 in done and not (src / "b.jsonl").exists():
            write_jsonl(src / "b.jsonl", [{"id": 2, "v": 2}, {"id": 3, "v": 2}])
        return 2 in done or calls["n"] > 600

    summary = Runtime(config, spark, collector).run(follow=True, should_stop=arrive_then_stop)
    assert summary.last_epoch == 2
    assert warmed(collector) == {1: True, 2: True}
    version = DeltaTable(str(table)).version()
    assert version in _cached_versions(spark, table)
    assert delta_rs_rows(table, ["id"]) == {(1,): {"id": 1, "v": 1}, (2,): {"id": 2, "v": 2}, (3,): {"id": 3, "v": 2}}

    # Started again, a following run reads its tables ahead at its first wait, before any apply.
    again, polls = ListCollector(), iter(range(600))
    Runtime(config, spark, again).run(follow=True, should_stop=lambda: bool(warmed(again)) or next(polls, None) is None)
    assert warmed(again) == {2: True}

    # A read ahead that fails (no such table) is a head start lost, not an error; a closed warmer takes no more.
    missing = ListCollector()
    warmer = SnapshotWarmer(missing)
    warmer.warm(spark, TableRef(str(tmp_path / "nowhere")), 3, "t")
    warmer.close()
    warmer.warm(spark, TableRef(str(table)), 4, "t")
    assert warmed(missing) == {3: False}
