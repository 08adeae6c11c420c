"""The transaction loop with real Spark and Delta, in-process on the shared session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.delta import TableRef, history, table_state
from materializer.errors import FencedError, SourceError
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from tests.random_collections import generate, standard_state
from tests.helpers import assert_tables_equal_oracle, binding, table_rows, write_config, write_jsonl

pytestmark = pytest.mark.spark


def make(tmp_path: Path, *, seed: int, documents: int, keys: int, files: int, epoch: int, extra: list[dict[str, Any]] | None = None):  # type: ignore[no-untyped-def]
    docs = generate(tmp_path / "src", seed=seed, documents=documents, keys=keys, files=files)
    # One file per epoch: the documents source takes whole files (``epoch`` documents per file).
    assert -(-documents // files) == epoch
    bindings = [binding("items", tmp_path / "src", tmp_path / "tables" / "items", max_files=1)] + (extra or [])
    config = load_config(write_config(tmp_path, bindings, max_documents=epoch))
    return docs, config


def epochs_in_history(spark: Any, table: Path) -> list[int]:
    return [h["tag"]["epoch"] for h in history(spark, TableRef(str(table))) if h["tag"]]


@pytest.mark.parametrize("seed", [1, 7])
def test_tables_equal_the_oracle_with_one_commit_per_epoch(spark: Any, tmp_path: Path, seed: int) -> None:
    events = ListCollector()
    docs, config = make(
        tmp_path, seed=seed, documents=120, keys=25, files=3, epoch=40,
        extra=[binding("items_log", tmp_path / "src", tmp_path / "tables" / "items_log", mode="delta_updates", max_files=1)],
    )
    summary = Runtime(config, spark, events).run()
    assert summary.last_epoch == 3  # 120 documents in 3 files, one file per epoch
    assert_tables_equal_oracle(spark, config)
    for table in ("items", "items_log"):
        assert epochs_in_history(spark, tmp_path / "tables" / table) == [1, 2, 3]
        assert table_state(spark, TableRef(str(tmp_path / "tables" / table)), config.pipeline_id).txn_version == 3
    # nothing staged is left behind
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []
    assert [e["status"] for e in events.named("applied")] == ["applied"] * 6


def test_a_second_run_reapplies_nothing_and_adds_no_version(spark: Any, tmp_path: Path) -> None:
    docs, config = make(tmp_path, seed=3, documents=40, keys=10, files=2, epoch=20)
    Runtime(config, spark).run()
    table = TableRef(str(tmp_path / "tables" / "items"))
    before = table_state(spark, table, config.pipeline_id)
    again = Runtime(config, spark).run()
    assert again.epochs == []
    assert again.reapplied is not None
    assert [r.status for r in again.reapplied.results] == ["skipped"]
    assert table_state(spark, table, config.pipeline_id).version == before.version


@pytest.mark.slow
def test_reapplying_an_applied_epoch_is_skipped_by_delta(spark: Any, tmp_path: Path) -> None:
    """Even when the staged file is still there, the re-apply makes no Delta commit."""
    from materializer.protocol import Acknowledge
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    docs, config = make(tmp_path, seed=4, documents=30, keys=10, files=1, epoch=30)
    runtime = Runtime(config, spark)
    runtime.run()
    entry = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit
    assert entry is not None and entry.driver_checkpoint is not None
    table = TableRef(str(tmp_path / "tables" / "items"))
    version = table_state(spark, table, config.pipeline_id).version
    # Force the MERGE itself (not our pre-check) to meet the txn id: Delta must skip it.
    staged = entry.driver_checkpoint.staged["items"]
    assert staged is not None
    # On the apply session: the MERGE reads its source as a temp view of that session.
    source = runtime.driver.apply_spark.createDataFrame([(999, "x", "u")], "id long, name string, _op string")
    props = runtime.driver.writer.properties(config.bindings[0].name, entry.epoch)
    with runtime.driver.writer.transaction(props):
        metrics = runtime.driver.writer.write(config.bindings[0], table, props, source, True)
    assert metrics is None
    result = runtime.driver.acknowledge(Acknowledge(epoch=entry.epoch, driver_checkpoint=entry.driver_checkpoint))
    assert [r.status for r in result.results] == ["skipped"]
    assert table_state(spark, table, config.pipeline_id).version == version
    assert (999,) not in table_rows(spark, tmp_path / "tables" / "items", ["id"])


def test_malformed_line_stops_with_file_and_line_and_applies_nothing_of_it(spark: Any, tmp_path: Path) -> None:
    docs, config = make(tmp_path, seed=5, documents=40, keys=10, files=2, epoch=20)
    bad_file = tmp_path / "src" / "part-0001.jsonl"
    lines = bad_file.read_text().splitlines()
    lines[6] = lines[6][:-3] + "}}"
    bad_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(SourceError) as info:
        Runtime(config, spark).run()
    assert f"{bad_file}:7" in str(info.value)
    assert "nothing from this transaction was applied" in str(info.value)
    # epoch 1 (the first file) is in; nothing of the second file's transaction is
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs[:20])
    assert epochs_in_history(spark, tmp_path / "tables" / "items") == [1]
    # fixed input resumes exactly where it stopped
    lines[6] = '{"id": 1, "name": "fixed", "qty": 1, "seq": 26}'
    bad_file.write_text("\n".join(lines) + "\n")
    docs[26] = {"id": 1, "name": "fixed", "qty": 1, "seq": 26}
    Runtime(config, spark).run()
    assert_tables_equal_oracle(spark, config)


def test_a_second_writer_fences_the_first(spark: Any, tmp_path: Path) -> None:
    docs, config = make(tmp_path, seed=6, documents=60, keys=15, files=3, epoch=20)
    calls = {"n": 0}

    def newer_writer_runs_meanwhile() -> bool:
        calls["n"] += 1
        if calls["n"] == 2:  # after the first epoch of the old writer
            Runtime(config, spark).run()
        return False

    with pytest.raises(FencedError, match="fenced"):
        Runtime(config, spark).run(should_stop=newer_writer_runs_meanwhile)
    assert_tables_equal_oracle(spark, config)
    assert epochs_in_history(spark, tmp_path / "tables" / "items") == [1, 2, 3]
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []


@pytest.mark.slow
def test_follow_picks_up_files_that_arrive_later(spark: Any, tmp_path: Path) -> None:
    docs = generate(tmp_path / "src", seed=8, documents=20, keys=8, files=1)
    config = load_config(
        write_config(
            tmp_path,
            [binding("items", tmp_path / "src", tmp_path / "tables" / "items")],
            transaction={"max_documents": 100, "poll_interval_seconds": 0.1},
        )
    )
    later = generate(tmp_path / "later", seed=9, documents=15, keys=8, files=1)
    calls = {"n": 0}

    def arrive_then_stop() -> bool:
        calls["n"] += 1
        if calls["n"] == 2:  # epoch 1 applied, sources drained: a new file lands
            (tmp_path / "later" / "part-0000.jsonl").rename(tmp_path / "src" / "part-0001.jsonl")
        return calls["n"] >= 6

    summary = Runtime(config, spark).run(follow=True, should_stop=arrive_then_stop)
    assert [e.epoch for e in summary.epochs] == [1, 2]
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs + later)


@pytest.mark.slow
def test_a_declared_schema_types_the_table_and_a_value_spark_refuses_names_its_line(spark: Any, tmp_path: Path) -> None:
    import datetime
    import decimal

    write_jsonl(tmp_path / "src" / "a.jsonl", [
        {"id": 1, "price": 12.5, "at": "2024-05-01T10:00:00", "name": "tea"},
        {"id": 2, "price": 3, "at": None, "name": None},
    ])
    schema = "id BIGINT, price DECIMAL(10,2), at TIMESTAMP, name STRING"
    bindings = [binding("items", tmp_path / "src", tmp_path / "tables" / "items")]
    bindings[0]["source"]["schema"] = schema
    config = load_config(write_config(tmp_path, bindings))
    Runtime(config, spark).run()
    table = spark.read.format("delta").load(str(tmp_path / "tables" / "items"))
    assert {f.name: f.dataType.simpleString() for f in table.schema.fields} == {
        "id": "bigint", "price": "decimal(10,2)", "at": "timestamp", "name": "string"
    }
    rows = {r["id"]: r for r in table.collect()}
    assert rows[1]["price"] == decimal.Decimal("12.50") and rows[1]["at"] == datetime.datetime(2024, 5, 1, 10, 0)
    assert rows[2]["price"] == decimal.Decimal("3.00") and rows[2]["at"] is None

    # A timestamp's format is judged per document in Spark; the error names the file and line,
    # before anything of the transaction is committed.
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 3, "price": 1, "at": "2024-05-02 08:00:00"}, {"id": 4, "at": "yesterday"}])
    with pytest.raises(SourceError) as info:
        Runtime(config, spark).run()
    assert f"{tmp_path / 'src' / 'b.jsonl'}:2: a value does not fit source.schema" in str(info.value)
    assert "yesterday" in str(info.value)
    assert sorted(r["id"] for r in spark.read.format("delta").load(str(tmp_path / "tables" / "items")).collect()) == [1, 2]
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file() and "staged" in f.parts] == []


@pytest.mark.slow
def test_epoch_n_is_applied_while_epoch_n_plus_1_is_read_and_prestaged(spark: Any, tmp_path: Path) -> None:
    import threading

    docs, config = make(tmp_path, seed=5, documents=60, keys=20, files=3, epoch=20)
    runtime = Runtime(config, spark)
    read_epochs: list[int] = []
    second_prestaged = threading.Event()
    read = runtime.sources["items"].next_batch
    prestage = runtime.driver.prestage

    def next_batch(spark: Any, checkpoint: Any, max_documents: int, spool_path: str) -> Any:
        batch = read(spark, checkpoint, max_documents, spool_path)
        read_epochs.append(int(spool_path.split("epoch-")[1].split("/")[0]))
        return batch

    def prestage_and_tell(message: Any, epoch: int) -> None:
        prestage(message, epoch)
        if epoch == 2:
            second_prestaged.set()

    acknowledge = runtime.driver.acknowledge
    overlapped = []

    def slow_acknowledge(message: Any) -> Any:
        if message.epoch == 1:
            # Epoch 1's apply cannot finish until epoch 2 has been read: a serial loop would hang here.
            overlapped.append(second_prestaged.wait(timeout=120))
            assert any(f.name.startswith("items-") for f in (tmp_path / "staging" / config.pipeline_id / "staged" / "epoch-000000000002").iterdir())
        return acknowledge(message)

    runtime.sources["items"].next_batch = next_batch  # type: ignore[method-assign]
    runtime.driver.acknowledge = slow_acknowledge  # type: ignore[method-assign]
    runtime.driver.prestage = prestage_and_tell  # type: ignore[method-assign]
    summary = runtime.run()
    assert overlapped == [True]
    assert summary.last_epoch == 3 and read_epochs[:3] == [1, 2, 3]
    assert_tables_equal_oracle(spark, config)
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []


@pytest.mark.slow
def test_a_bad_line_in_epoch_n_plus_1_stops_the_run_after_epoch_n_is_applied(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in range(10)])
    (tmp_path / "src" / "b.jsonl").write_text('{"id": 20, "v": 1}\n{"id": 21, "v": \n')
    config = load_config(write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items", max_files=1)]))
    with pytest.raises(SourceError, match="b.jsonl:2: not valid JSON"):
        Runtime(config, spark).run()
    # Epoch 1 (a.jsonl) was committed before the bad line was met, and its apply finished.
    assert sorted(table_rows(spark, tmp_path / "tables" / "items", ["id"])) == [(i,) for i in range(10)]
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []


@pytest.mark.slow
def test_new_columns_and_struct_sub_fields_evolve_the_table_and_missing_ones_become_null(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "a": 1, "s": {"x": 1}}, {"id": 2, "a": 2, "s": {"x": 2}}])
    # a new column and a new sub-field, by name (a positional cast would put "deep" into x)
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 1, "a": 10, "b": "new", "s": {"y": "deep", "x": 10}}, {"id": 3, "a": 3}])
    # nothing new: the documents lack columns and sub-fields, which whole-row replacement makes NULL
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 2, "s": {"y": "only-y"}}, {"id": 3, "a": 4}])
    config = load_config(write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items", max_files=1)]))
    assert Runtime(config, spark).run().last_epoch == 3
    table = spark.read.format("delta").load(str(tmp_path / "tables" / "items"))
    assert [f.name for f in table.schema.fields] == ["a", "id", "s", "b"]  # inferred: sorted; then new ones
    assert table.schema["s"].dataType.simpleString() == "struct<x:bigint,y:string>"
    rows = {r["id"]: r.asDict(recursive=True) for r in table.collect()}
    assert rows == {
        1: {"a": 10, "id": 1, "s": {"x": 10, "y": "deep"}, "b": "new"},
        2: {"a": None, "id": 2, "s": {"x": None, "y": "only-y"}, "b": None},
        3: {"a": 4, "id": 3, "s": None, "b": None},
    }


@pytest.mark.slow
def test_an_epoch_staged_by_the_previous_layout_is_applied_after_an_upgrade(spark: Any, tmp_path: Path) -> None:
    """Staged files used to sit at <staging>/staged/…; now at <staging>/<pipeline_id>/staged/….
    An entry committed by the old version and not yet applied must still be applied (not read
    as a missing staged file), and its files removed after."""
    from materializer.driver import DeltaDriver
    from materializer.protocol import DriverCheckpoint
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    (tmp_path / "src").mkdir()
    config = load_config(write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")]))
    assert config.staging_root != config.staging
    # The previous version's state, built by hand: staged under <staging>, committed, unapplied.
    legacy = open_store(config.staging)
    rows = spark.createDataFrame([(1, "a", "u"), (2, "b", "u")], "id long, name string, _op string")
    staged = DeltaDriver(spark, config, legacy)._stage("items", 1, rows)
    assert staged is not None and legacy.list(staged.uri)
    log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
    log.open()
    log.commit(1, {}, DriverCheckpoint(epoch=1, staged={"items": staged}))

    summary = Runtime(config, spark).run()
    assert summary.reapplied is not None and [r.status for r in summary.reapplied.results] == ["applied"]
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == {(1,): {"id": 1, "name": "a"}, (2,): {"id": 2, "name": "b"}}
    assert legacy.list(staged.uri) == []
