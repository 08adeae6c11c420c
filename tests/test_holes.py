"""Issue #11: the exactly-once holes, each shown in-process on the shared SparkSession.

Each test fails on the code before the fix: rows lost or doubled silently, a zombie deleting a newer
run's committed files, an epoch committed that the MERGE then refuses, a failure retried as a
conflict, a deleted table reported as a damaged staged file, temp files left in the log.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from materializer.config import load_config
from materializer.delta import TableRef, table_state
from materializer.errors import ApplyError, ConfigError, FencedError, SourceError, TableStateError
from materializer.recovery_log import RecoveryLog
from materializer.runtime import Runtime
from materializer.storage import open_store
from tests.helpers import binding, delta_rs_rows, table_rows, write_config, write_jsonl

pytestmark = pytest.mark.spark


class Killed(Exception):
    """Stands for a SIGKILL in an in-process choreography: the run stops where it is."""


def killed_before_applying(runtime: Runtime, epoch: int) -> Runtime:
    """Make ``runtime`` stop after committing ``epoch``, before applying it (as a kill there would)."""
    acknowledge = runtime.driver.acknowledge

    def stop_at(message: Any) -> Any:
        if message.epoch == epoch:
            raise Killed(f"killed before applying epoch {epoch}")
        return acknowledge(message)

    runtime.driver.acknowledge = stop_at  # type: ignore[method-assign]
    return runtime


def last_epoch(config: Any) -> int:
    return RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_epoch


def files_under(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file()) if folder.exists() else []


def config_with(tmp_path: Path, bindings: list[dict[str, Any]], **settings: Any) -> Any:
    """Documents bindings take one file per epoch here (as ``max_documents`` made them before
    epochs were whole files), so a check across epochs sees the table the earlier file wrote."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for b in bindings:
        if b["source"].get("format") == "documents":
            b["source"].setdefault("max_files", 1)
    return load_config(write_config(tmp_path, bindings, **settings))


# --- 6: a failure is not a conflict ------------------------------------------------------------


def test_commit_conflicts_are_recognised_by_type_or_error_class_never_by_words() -> None:
    from delta.exceptions.base import ConcurrentAppendException, MetadataChangedException

    from materializer.delta import is_commit_conflict

    class Connect(Exception):  # what Spark Connect raises: an error class, not Delta's Python type
        def __init__(self, condition: str) -> None:
            super().__init__(f"[{condition}] something")
            self.condition = condition

        def getCondition(self) -> str:  # noqa: N802 - PySpark's name
            return self.condition

    assert is_commit_conflict(ConcurrentAppendException(message="x"))
    assert is_commit_conflict(MetadataChangedException(message="x"))
    assert is_commit_conflict(Connect("DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT"))
    assert is_commit_conflict(Connect("DELTA_METADATA_CHANGED"))
    assert is_commit_conflict(Connect("DELTA_PROTOCOL_CHANGED"))
    assert not is_commit_conflict(Connect("CAST_INVALID_INPUT"))
    # the word alone, as a JVM stack frame quotes it, is not a conflict
    assert not is_commit_conflict(Exception("at java.util.concurrent.ThreadPoolExecutor.runWorker: CAST_INVALID_INPUT"))


@pytest.mark.slow
def test_a_failed_cast_in_the_merge_is_not_retried_and_is_reported_as_what_it_is(spark: Any, tmp_path: Path) -> None:
    from materializer.protocol import Acknowledge, DriverCheckpoint, StagedFile

    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "qty": 5}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")])
    runtime = Runtime(config, spark)
    runtime.run()
    # A staged file the pre-commit checks would have refused (a string for a bigint column),
    # handed to the apply directly: the MERGE's cast fails.
    uri = "staged/epoch-000000000002/items-handmade"
    spark.createDataFrame([(2, "x", "u")], "id long, qty string, _op string").write.parquet(runtime.staging.spark_path(uri))
    data = [f for f in runtime.staging.list(uri) if f.path.rsplit("/", 1)[-1].startswith("part-")]
    staged = StagedFile(uri=uri, rows=1, bytes=sum(f.size for f in data), files=len(data))
    commits = []
    commit = runtime.driver.writer.write

    def counted(*args: Any, **kwargs: Any) -> Any:
        commits.append(1)
        return commit(*args, **kwargs)

    runtime.driver.writer.write = counted  # type: ignore[method-assign]
    with pytest.raises(ApplyError) as info:
        runtime.driver.acknowledge(Acknowledge(epoch=2, driver_checkpoint=DriverCheckpoint(epoch=2, staged={"items": staged})))
    assert len(commits) == 1  # not retried as a "concurrent" commit
    assert "CAST_INVALID_INPUT" in str(info.value) and "epoch 2, binding items" in str(info.value)
    assert "--skip-epoch 2 --binding items" in str(info.value)
    assert info.value.exit_code == 9


# --- 2: two bindings, one table ----------------------------------------------------------------


@pytest.mark.slow
def test_a_path_and_the_catalog_name_of_one_table_are_refused_before_anything_is_applied(spark: Any, tmp_path: Path) -> None:
    spark.sql("DROP TABLE IF EXISTS holes_same")
    spark.createDataFrame([(0, "seed")], "id long, name string").write.format("delta").saveAsTable("holes_same")
    location = spark.sql("DESCRIBE DETAIL holes_same").collect()[0]["location"]
    write_jsonl(tmp_path / "a" / "a.jsonl", [{"id": 1, "name": "a"}])
    write_jsonl(tmp_path / "b" / "b.jsonl", [{"id": 2, "name": "b"}])
    config = config_with(tmp_path, [
        binding("by_name", tmp_path / "a", "holes_same", adopt_table=True),
        {**binding("by_path", tmp_path / "b", "x", adopt_table=True), "table": location + "/"},
    ])
    with pytest.raises(ConfigError, match="by_name.*by_path.*same table"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 0 and not (tmp_path / "log").exists()  # not even opened
    assert sorted(r["id"] for r in spark.table("holes_same").collect()) == [0]
    spark.sql("DROP TABLE holes_same")


# --- 3: a table written by another pipeline or binding ------------------------------------------


@pytest.mark.slow
def test_a_new_pipeline_id_over_an_existing_delta_updates_table_is_refused_not_doubled(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in range(5)])
    table = tmp_path / "tables" / "log"
    first = config_with(tmp_path / "one", [binding("updates", tmp_path / "src", table, mode="delta_updates")], pipeline_id="one")
    Runtime(first, spark).run()
    assert spark.read.format("delta").load(str(table)).count() == 5
    second = config_with(tmp_path / "two", [binding("updates", tmp_path / "src", table, mode="delta_updates")], pipeline_id="two")
    with pytest.raises(TableStateError) as info:
        Runtime(second, spark).run()
    assert "pipeline 'one'" in str(info.value) and "adopt_table: true" in str(info.value)
    assert spark.read.format("delta").load(str(table)).count() == 5
    # The documented decision: adopt the table (its earlier commits become this pipeline's past).
    adopted = config_with(
        tmp_path / "two", [binding("updates", tmp_path / "src", table, mode="delta_updates", adopt_table=True)], pipeline_id="two"
    )
    Runtime(adopted, spark).run()
    assert spark.read.format("delta").load(str(table)).count() == 10  # written on top, as documented
    # once adopted, later runs need no flag; the first pipeline is now the one refused
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 9, "v": 9}])
    assert Runtime(second, spark).run().last_epoch == 2
    with pytest.raises(TableStateError, match="pipeline 'two'"):
        Runtime(first, spark).run()


def test_a_renamed_binding_is_refused_then_takes_over_its_old_state_with_previous_names(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in range(4)])
    table = tmp_path / "tables" / "items"
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, mode="delta_updates")])
    Runtime(config, spark).run()
    renamed = config_with(tmp_path, [binding("items_v2", tmp_path / "src", table, mode="delta_updates")])
    with pytest.raises(TableStateError) as info:
        Runtime(renamed, spark).run()
    assert "binding 'items' of this pipeline" in str(info.value) and "previous_names: [items]" in str(info.value)
    assert spark.read.format("delta").load(str(table)).count() == 4
    taken_over = config_with(
        tmp_path, [binding("items_v2", tmp_path / "src", table, mode="delta_updates", previous_names=["items"])]
    )
    assert Runtime(taken_over, spark).run().epochs == []  # nothing read again
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 10, "v": 10}])
    summary = Runtime(taken_over, spark).run()
    assert [e.documents for e in summary.epochs] == [{"items_v2": 1}]
    assert spark.read.format("delta").load(str(table)).count() == 5
    entry = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit
    assert entry is not None and "items_v2" in (entry.runtime_checkpoint or {})


# --- 4: no clean-up on a stale view -------------------------------------------------------------


@pytest.mark.slow
def test_a_run_paused_after_its_open_does_not_delete_the_newer_runs_committed_staged_files(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in range(3)])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": i, "v": 10 + i} for i in range(2, 6)])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")], max_documents=3)
    Runtime(config, spark).run(max_epochs=1)

    zombie = Runtime(config, spark)
    driver_open = zombie.driver.open
    staged_of_epoch_2: list[Path] = []

    def paused_right_after_open(message: Any) -> Any:
        # Meanwhile a newer run opens, commits epoch 2 and is killed before applying it.
        with pytest.raises(Killed):
            killed_before_applying(Runtime(config, spark), 2).run()
        assert last_epoch(config) == 2
        staged_of_epoch_2.extend(files_under(tmp_path / "staging" / config.pipeline_id / "staged"))
        assert staged_of_epoch_2
        return driver_open(message)  # the zombie resumes, with its view of the log at epoch 1

    zombie.driver.open = paused_right_after_open  # type: ignore[method-assign]
    with pytest.raises(FencedError, match="fenced"):
        zombie.run()
    assert all(f.exists() for f in staged_of_epoch_2), "the zombie deleted epoch 2's committed staged files"
    Runtime(config, spark).run()
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == {
        (i,): {"id": i, "v": v} for i, v in [(0, 0), (1, 1), (2, 12), (3, 13), (4, 14), (5, 15)]
    }


@pytest.mark.slow
def test_two_pipelines_sharing_a_staging_folder_never_delete_each_others_files(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a" / "a.jsonl", [{"id": 1, "v": 1}])
    write_jsonl(tmp_path / "b" / "b.jsonl", [{"id": 2, "v": 2}])
    shared = str(tmp_path / "shared-staging")
    one = config_with(tmp_path / "one", [binding("items", tmp_path / "a", tmp_path / "tables" / "a")], pipeline_id="one", staging=shared)
    two = config_with(tmp_path / "two", [binding("items", tmp_path / "b", tmp_path / "tables" / "b")], pipeline_id="two", staging=shared)
    with pytest.raises(Killed):
        killed_before_applying(Runtime(one, spark), 1).run()
    Runtime(two, spark).run()  # its Open cleans its own area only
    Runtime(one, spark).run()
    assert table_rows(spark, tmp_path / "tables" / "a", ["id"]) == {(1,): {"id": 1, "v": 1}}
    assert files_under(Path(shared)) == []


# --- 5: poison epochs ---------------------------------------------------------------------------

POISON = [
    # a field name Delta refuses (the documents reader names it with its file and line)
    ([{"id": 1, "v": 1}], [{"id": 2, "a b": 1}], "b.jsonl:1: field 'a b' has a name Delta refuses"),
    ([{"id": 1, "v": 1}], [{"id": 2, "a=b": 1}], "b.jsonl:1: field 'a=b' has a name Delta refuses"),
    # an object, then an array in the same field
    ([{"id": 1, "o": {"x": 1}}], [{"id": 2, "o": [1, 2]}], "field 'o' arrives as array<bigint>"),
    # a struct sub-field that changes type; a string where the table has a number inside a struct
    ([{"id": 1, "s": {"x": 1}}], [{"id": 2, "s": {"x": "12"}}], "field 's.x' arrives as string"),
    # an array element that changes type
    ([{"id": 1, "l": [{"x": 1}]}], [{"id": 2, "l": [{"x": {"y": 1}}]}], "field 'l[].x'"),
    # name, then Name
    ([{"id": 1, "name": "a"}], [{"id": 2, "Name": "b"}], "only in case"),
]


@pytest.mark.parametrize(("before", "after", "says"), POISON)
def test_what_the_merge_would_refuse_is_refused_before_commit(spark: Any, tmp_path: Path, before: Any, after: Any, says: str) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", before)
    write_jsonl(tmp_path / "src" / "b.jsonl", after)
    config = config_with(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")], max_documents=1)
    with pytest.raises(SourceError) as info:
        Runtime(config, spark).run()
    message = str(info.value)
    # Named by the binding (the driver's check), or by file and line (the reader's, which sees a
    # name Delta refuses before the driver does).
    assert says in message and ("binding items" in message or ".jsonl:" in message)
    assert last_epoch(config) == 1  # epoch 2 was never committed, so nothing is stuck
    assert [f for f in files_under(tmp_path / "staging") if "staged" in f.parts] == []


@pytest.mark.slow
def test_rows_breaking_a_check_constraint_or_not_null_are_refused_before_commit(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "items"
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, qty BIGINT, name STRING NOT NULL) USING delta")
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT qty_positive CHECK (qty > 0)")
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "qty": 5, "name": "a"}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table)], max_documents=10)
    Runtime(config, spark).run()
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "qty": 3, "name": "b"}, {"id": 3, "qty": -1, "name": "c"}])
    with pytest.raises(SourceError, match=r"key id=3.*CHECK constraint qty_positive \(qty > 0\)"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 1
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "qty": 3, "name": "b"}, {"id": 3, "qty": 1}])
    with pytest.raises(SourceError, match=r"key id=3.*NOT NULL column 'name'"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 1
    # a delete needs no name: deletes write no row
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "qty": 3, "name": "b"}, {"id": 3, "qty": 1, "name": "c"}, {"_meta": {"op": "d"}, "id": 1}])
    Runtime(config, spark).run()
    assert sorted(table_rows(spark, table, ["id"])) == [(2,), (3,)]


@pytest.mark.slow
def test_a_value_too_big_for_a_narrower_column_is_refused_before_commit(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "items"
    spark.createDataFrame([(1, 1)], "id bigint, n int").write.format("delta").save(str(table))
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 2, "n": 7}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 3, "n": 2**40}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table)], max_documents=1)
    with pytest.raises(SourceError, match="does not fit the column's int"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 1 and sorted(table_rows(spark, table, ["id"])) == [(1,), (2,)]


@pytest.mark.slow
def test_a_constraint_added_after_commit_is_stuck_status_says_so_and_recover_skips_keeping_the_rows(spark: Any, tmp_path: Path) -> None:
    from materializer.tools.recover import skip_epoch
    from materializer.tools.status import pipeline_status

    table = tmp_path / "tables" / "items"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "qty": 5}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "qty": -3}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table)], max_documents=1)
    with pytest.raises(Killed):
        killed_before_applying(Runtime(config, spark), 2).run()
    # After epoch 2 is committed, someone adds a constraint its rows break.
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT qty_positive CHECK (qty > 0)")
    with pytest.raises(ApplyError, match="epoch 2, binding items: Delta refused"):
        Runtime(config, spark).run()
    status = pipeline_status(config, spark)
    assert not status.agrees and status.stuck
    note = status.tables[0].note
    assert note.startswith("STUCK") and "epoch 2" in note and "DELTA_VIOLATE_CONSTRAINT" in note and "--skip-epoch 2" in note
    with pytest.raises(ApplyError):  # every run stops there, and says so
        Runtime(config, spark).run()

    summary = skip_epoch(config, spark, 2, "items")
    kept = summary.actions[0].split("kept as Parquet at ")[1].split(" ")[0]
    assert [r.asDict() for r in spark.read.parquet(kept).collect()] == [{"id": 2, "qty": -3, "_op": "u"}]
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 3, "qty": 4}])
    assert Runtime(config, spark).run().last_epoch == 3
    assert sorted(table_rows(spark, table, ["id"])) == [(1,), (3,)]
    assert table_state(spark, TableRef(str(table)), config.pipeline_id).txn_version == 3
    assert pipeline_status(config, spark).agrees
    entries = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).entries()
    assert any(e.driver_checkpoint and e.driver_checkpoint.skipped == {"items": kept} for e in entries)


# --- 8: a deleted table -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_deleted_table_is_named_by_status_and_stops_the_run_clearly(spark: Any, tmp_path: Path) -> None:
    from materializer.tools.status import pipeline_status

    table = tmp_path / "tables" / "items"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "v": 2}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table)], max_documents=1)
    Runtime(config, spark).run()
    shutil.rmtree(table)
    status = pipeline_status(config, spark)
    assert not status.agrees and "TABLE GONE" in status.tables[0].note and "deleted or moved" in status.tables[0].note
    with pytest.raises(TableStateError, match="does not exist.*deleted or moved"):
        Runtime(config, spark).run()


@pytest.mark.slow
def test_a_table_deleted_after_its_first_epoch_was_applied_is_not_called_a_damaged_staged_file(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "items"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table)])
    Runtime(config, spark).run()
    shutil.rmtree(table)
    with pytest.raises(TableStateError, match="does not exist.*deleted\\s+or moved after epoch 1"):
        Runtime(config, spark).run()


# --- 9: leaks -----------------------------------------------------------------------------------


def test_temp_files_a_killed_log_commit_left_are_removed_at_the_next_open(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")])
    left = tmp_path / "log" / "entries" / ".tmp-killed"
    left.parent.mkdir(parents=True)
    left.write_bytes(b"half an entry")
    (tmp_path / "staging" / config.pipeline_id / "spool" / "deadwriter" / "epoch-000000000001").mkdir(parents=True)
    (tmp_path / "staging" / config.pipeline_id / "spool" / "deadwriter" / "epoch-000000000001" / "items.jsonl").write_text("{}\n")
    summary = Runtime(config, spark).run()
    assert not left.exists() and summary.orphans_deleted == 1
    assert files_under(tmp_path / "staging") == []


# --- 10: names are quoted everywhere ------------------------------------------------------------


@pytest.mark.slow
def test_backticks_and_dots_in_key_and_field_names_are_quoted_through_reduce_stage_and_merge(spark: Any, tmp_path: Path) -> None:
    """The driver and reductions side (the documents source is tested with its own rewrite)."""
    from materializer import reductions
    from materializer.protocol import Acknowledge, Flush, Load, StartCommit, Store

    table = tmp_path / "tables" / "items"
    (tmp_path / "src").mkdir()
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, key=["k`1"], reductions={"n`x": "sum"})])
    runtime = Runtime(config, spark)
    runtime.log.open()
    driver, bound = runtime.driver, config.bindings[0]
    schema = "`k``1` bigint, `n``x` bigint, `v.w` string, _op string, _seq bigint"
    epochs = [
        [(1, 2, "a", "u", 1), (1, 3, "b", "u", 2)],
        [(1, 4, None, "u", 1), (2, 1, "c", "u", 2)],
    ]
    for epoch, rows in enumerate(epochs, start=1):
        documents = spark.createDataFrame(rows, schema)
        driver.load(Load(binding="items", keys=documents.select("`k``1`")))
        loaded = {item.binding: item.rows for item in driver.flush(Flush()).loaded}
        driver.store(Store(binding="items", documents=reductions.reduce(documents, loaded.get("items"), bound)))
        started = driver.start_commit(StartCommit(epoch=epoch, runtime_checkpoint={}))
        driver.acknowledge(Acknowledge(epoch=epoch, driver_checkpoint=started.driver_checkpoint))
    rows = {r["k`1"]: r.asDict() for r in spark.read.format("delta").load(str(table)).collect()}
    assert rows == {1: {"k`1": 1, "n`x": 9, "v.w": None}, 2: {"k`1": 2, "n`x": 1, "v.w": "c"}}


@pytest.mark.slow
def test_a_key_field_delta_cannot_name_stops_with_a_clear_error(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"the id": 1, "v": 2}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items", key=["the id"])])
    with pytest.raises(SourceError, match="a.jsonl:1: field 'the id' has a name Delta refuses"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 0


@pytest.mark.slow
def test_yaml_helper_roundtrips_odd_names(tmp_path: Path) -> None:
    # the config itself carries such names unchanged
    path = write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "t", key=["k`1"])])
    assert yaml.safe_load(path.read_text())["bindings"][0]["key"] == ["k`1"]


def test_a_binding_removed_while_its_epoch_is_unapplied_stops_the_run_then_goes_once_applied(spark: Any, tmp_path: Path) -> None:
    """Acknowledge applies the configured bindings only: before the check, a binding removed from the
    configuration between its epoch's commit and its apply lost that epoch's rows without a word."""
    for name in ("a", "b"):
        write_jsonl(tmp_path / name / "1.jsonl", [{"id": 1, "v": 1}])
    both = [binding(name, tmp_path / name, tmp_path / "tables" / name) for name in ("a", "b")]
    config = config_with(tmp_path, both)
    Runtime(config, spark).run()
    for name in ("a", "b"):
        write_jsonl(tmp_path / name / "2.jsonl", [{"id": 2, "v": 2}])
    with pytest.raises(Killed):
        killed_before_applying(Runtime(config, spark), 2).run()
    assert last_epoch(config) == 2

    only_a = config_with(tmp_path / "only-a", [both[0]], pipeline_id=config.pipeline_id,
                         recovery_log=config.recovery_log, staging=config.staging)
    with pytest.raises(ConfigError) as info:
        Runtime(only_a, spark).run()
    says = str(info.value)
    assert "binding 'b'" in says and "epoch (2)" in says and "records epoch 1" in says and "Put it back" in says
    assert sorted(table_rows(spark, tmp_path / "tables" / "b", ["id"])) == [(1,)]
    assert sorted(table_rows(spark, tmp_path / "tables" / "a", ["id"])) == [(1,)]  # nothing applied either

    Runtime(config, spark).run()  # back for one run: epoch 2 lands on both tables
    for name in ("a", "b"):
        assert sorted(table_rows(spark, tmp_path / "tables" / name, ["id"])) == [(1,), (2,)]
        assert sorted(delta_rs_rows(tmp_path / "tables" / name, ["id"])) == [(1,), (2,)]
    write_jsonl(tmp_path / "a" / "3.jsonl", [{"id": 3, "v": 3}])
    assert Runtime(only_a, spark).run().last_epoch == 3  # applied, so the binding may go
    assert sorted(table_rows(spark, tmp_path / "tables" / "a", ["id"])) == [(1,), (2,), (3,)]
