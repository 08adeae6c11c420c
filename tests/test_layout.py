"""Issue #18, part 1: the table's layout at creation, read back with an independent reader (delta-rs).

The first epoch's tagged commit creates the table (CREATE TABLE … AS SELECT) with the binding's
partitioning or clustering, its properties and deletion vectors; a table that exists is never
appended to blindly; a txn retention that would let a replay apply twice is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import parse_config
from materializer.errors import ConfigError, TableStateError
from materializer.runtime import Runtime
from tests.helpers import binding, table_rows, write_jsonl
from tests.test_holes import Killed, config_with, killed_before_applying, last_epoch


def _config(**extra: Any) -> dict[str, Any]:
    return {
        "pipeline_id": "p",
        "recovery_log": "/tmp/log",
        "staging": "/tmp/staging",
        "bindings": [{"name": "b", "source": {"format": "documents", "path": "/tmp/src"}, "table": "/tmp/t", "key": ["id"], **extra}],
    }


def test_layout_options_are_checked_before_spark_starts() -> None:
    with pytest.raises(ConfigError, match="partition_by and cluster_by cannot both"):
        parse_config(_config(partition_by=["a"], cluster_by=["b"]), "f.yaml")
    with pytest.raises(ConfigError, match="setTransactionRetentionDuration.*written twice"):
        parse_config(_config(properties={"delta.setTransactionRetentionDuration": "interval 1 days"}), "f.yaml")
    with pytest.raises(ConfigError, match="deletion_vectors"):
        parse_config(_config(properties={"delta.enableDeletionVectors": False}), "f.yaml")
    config = parse_config(_config(properties={"delta.enableChangeDataFeed": True, "delta.logRetentionDuration": "interval 60 days", "n": 5}), "f.yaml")
    assert config.bindings[0].properties == {"delta.enableChangeDataFeed": "true", "delta.logRetentionDuration": "interval 60 days", "n": "5"}


def test_create_table_sql_quotes_names_and_values() -> None:
    from materializer.config import BindingConfig
    from materializer.layout import create_table_sql

    b = BindingConfig.model_validate({**_config()["bindings"][0], "partition_by": ["a`b"], "properties": {"x": "it's"}})
    sql = create_table_sql("delta.`/t`", "v", b, ["id", "a`b"])
    assert "PARTITIONED BY (`a``b`)" in sql and "'x' = 'it\\'s'" in sql and "'delta.enableDeletionVectors' = 'true'" in sql
    assert "IF NOT EXISTS" not in sql and "REPLACE" not in sql


def _log_actions(table: Path, version: int) -> list[dict[str, Any]]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.spark
def test_partition_by_and_properties_are_set_by_the_first_epochs_tagged_commit(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = tmp_path / "tables" / "orders"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "region": "eu", "qty": 1}, {"id": 2, "region": "us", "qty": 2}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 1, "region": "eu", "qty": 5}, {"id": 3, "region": "us", "qty": 3}])
    config = config_with(
        tmp_path,
        [binding("orders", tmp_path / "src", table, partition_by=["region"], properties={"delta.enableChangeDataFeed": True, "team": "sales"})],
    )
    Runtime(config, spark).run()
    dt = DeltaTable(str(table))
    assert dt.metadata().partition_columns == ["region"]
    assert dt.metadata().configuration == {"delta.enableChangeDataFeed": "true", "team": "sales", "delta.enableDeletionVectors": "true"}
    assert "deletionVectors" in (dt.protocol().reader_features or [])
    # One commit created the table with its rows and the epoch's txn id and tag: nothing before it.
    first = _log_actions(table, 0)
    assert {"appId": "test-pipeline", "version": 1} == {k: v for k, v in next(a["txn"] for a in first if "txn" in a).items() if k != "lastUpdated"}
    assert json.loads(next(a["commitInfo"] for a in first if "commitInfo" in a)["userMetadata"])["materializer"]["epoch"] == 1
    assert dt.transaction_version("test-pipeline") == 2
    # (delta-rs reads the metadata, not yet the rows of a table with deletion vectors: Spark does)
    assert {k[0]: r["qty"] for k, r in table_rows(spark, table, ["id"]).items()} == {1: 5, 2: 2, 3: 3}


@pytest.mark.slow
@pytest.mark.spark
def test_auto_compaction_set_by_the_user_leaves_each_epoch_tagged_once_in_the_history(spark: Any, tmp_path: Path) -> None:
    # Delta runs the compaction inside the MERGE that reaches the threshold (here 4 small files, 50
    # by default; on Databricks it is always on for MERGE), so its OPTIMIZE commit carries the
    # epoch's tag, copied from the session. The history the drill and the txn fallback read must not
    # take it for a second commit of that epoch.
    from deltalake import DeltaTable

    from materializer.delta.reads import history
    from materializer.tables import TableRef
    from tests.helpers import delta_rs_list

    table = tmp_path / "tables" / "orders"
    for e in range(8):
        write_jsonl(tmp_path / "src" / f"{e:02d}.jsonl", [{"id": e, "qty": e * 10}])  # an insert: a new small file each
    config = config_with(
        tmp_path, [binding("orders", tmp_path / "src", table, max_files=1, properties={"delta.autoOptimize.autoCompact": True})]
    )
    runtime = Runtime(config, spark)
    runtime.driver.apply_spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "4")
    assert runtime.run().last_epoch == 8
    dt = DeltaTable(str(table))
    compactions = [h for h in dt.history() if h["operation"] == "OPTIMIZE"]
    assert compactions, "no auto compaction ran"
    assert all("materializer" in (h.get("userMetadata") or "") for h in compactions)  # Delta copied the tag
    read = history(spark, TableRef(str(table)))
    assert sorted(h["tag"]["epoch"] for h in read if h["tag"]) == list(range(1, 9))
    assert all(h["tag"] is None for h in read if h["operation"] == "OPTIMIZE")
    assert dt.transaction_version("test-pipeline") == 8
    expected = {e: e * 10 for e in range(8)}
    assert {r["id"]: r["qty"] for r in delta_rs_list(table)} == expected
    assert {k[0]: r["qty"] for k, r in table_rows(spark, table, ["id"]).items()} == expected
    # The next run's Open reads the table's writers: a compaction carries no txn id of another writer.
    write_jsonl(tmp_path / "src" / "08.jsonl", [{"id": 8, "qty": 80}])
    assert Runtime(config, spark).run().last_epoch == 9
    assert {r["id"]: r["qty"] for r in delta_rs_list(table)} == {**expected, 8: 80}


@pytest.mark.slow
@pytest.mark.spark
def test_cluster_by_creates_a_liquid_clustered_table_and_deletion_vectors_can_be_turned_off(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = tmp_path / "tables" / "events"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "at": 10}, {"id": 2, "at": 20}])
    config = config_with(tmp_path, [binding("events", tmp_path / "src", table, cluster_by=["at", "id"], deletion_vectors=False)])
    Runtime(config, spark).run()
    dt = DeltaTable(str(table))
    assert "clustering" in (dt.protocol().writer_features or [])
    assert dt.metadata().configuration.get("delta.enableDeletionVectors") == "false"
    domains = [a["domainMetadata"] for a in _log_actions(table, 0) if "domainMetadata" in a]
    clustering = next(json.loads(d["configuration"]) for d in domains if d["domain"] == "delta.clustering")
    assert clustering["clusteringColumns"] == [["at"], ["id"]]
    assert spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]["clusteringColumns"] == ["at", "id"]


@pytest.mark.slow
@pytest.mark.spark
def test_a_layout_column_the_first_epoch_lacks_is_refused_before_commit(spark: Any, tmp_path: Path) -> None:
    from materializer.errors import SourceError

    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "qty": 1}])
    config = config_with(tmp_path, [binding("orders", tmp_path / "src", tmp_path / "t", partition_by=["region"])])
    with pytest.raises(SourceError, match="partition_by names 'region'"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 0 and not (tmp_path / "t").exists()


@pytest.mark.spark
def test_a_table_with_a_txn_retention_or_another_layout_is_refused_before_anything_is_written(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "orders"
    spark.sql(
        f"CREATE TABLE delta.`{table}` (id BIGINT, qty BIGINT) USING delta "
        "TBLPROPERTIES ('delta.setTransactionRetentionDuration' = 'interval 1 days')"
    )
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "qty": 1}])
    config = config_with(tmp_path, [binding("orders", tmp_path / "src", table)])
    with pytest.raises(TableStateError, match="setTransactionRetentionDuration.*written twice"):
        Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == {}
    spark.sql(f"ALTER TABLE delta.`{table}` UNSET TBLPROPERTIES ('delta.setTransactionRetentionDuration')")
    config = config_with(tmp_path, [binding("orders", tmp_path / "src", table, partition_by=["qty"])])
    with pytest.raises(TableStateError, match="exists partitioned by nothing"):
        Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == {}


@pytest.mark.slow
@pytest.mark.spark
def test_a_session_default_txn_retention_is_refused(spark: Any, tmp_path: Path) -> None:
    from materializer.tables import RETENTION_DEFAULT_CONF

    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1}])
    config = config_with(tmp_path, [binding("orders", tmp_path / "src", tmp_path / "t")])
    spark.conf.set(RETENTION_DEFAULT_CONF, "interval 1 days")
    try:
        with pytest.raises(ConfigError, match="new tables inherit"):
            Runtime(config, spark).run()
    finally:
        spark.conf.unset(RETENTION_DEFAULT_CONF)


@pytest.mark.slow
@pytest.mark.spark
def test_a_table_created_by_another_writer_during_the_first_apply_is_not_appended_to(spark: Any, tmp_path: Path) -> None:
    """The apply looked (no table), then someone created it: the CREATE fails, nothing is appended."""
    from materializer.delta import TableState
    from materializer.merge import writer as driver_module  # where the apply looks table_state up

    table = tmp_path / "tables" / "log"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}])
    config = config_with(tmp_path, [binding("log", tmp_path / "src", table, mode="delta_updates")])
    runtime = Runtime(config, spark)
    real = driver_module.table_state
    looks = []

    def stale_then_real(spark_: Any, ref: Any, app_id: str, **kw: Any) -> Any:
        looks.append(1)
        if len(looks) == 1:
            # What the apply saw just before another writer's CREATE TABLE committed.
            spark.createDataFrame([(9, 9)], "id bigint, v bigint").write.format("delta").save(str(table))
            return TableState(False, None, None)
        return real(spark_, ref, app_id, **kw)

    driver_module.table_state = stale_then_real
    try:
        with pytest.raises(TableStateError, match="created meanwhile by another writer"):
            runtime.run()
    finally:
        driver_module.table_state = real
    assert table_rows(spark, table, ["id"]) == {(9,): {"id": 9, "v": 9}}


@pytest.mark.slow
@pytest.mark.spark
def test_a_first_epoch_created_by_a_racing_run_of_the_same_pipeline_is_found_applied(spark: Any, tmp_path: Path) -> None:
    """Two runs of one first epoch (a zombie and its successor): the second CREATE loses and skips."""
    from materializer.delta import TableState
    from materializer.merge import writer as driver_module  # where the apply looks table_state up

    table = tmp_path / "tables" / "orders"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}, {"id": 2, "v": 2}])
    config = config_with(tmp_path, [binding("orders", tmp_path / "src", table, partition_by=["v"])])
    # crash here: the epoch is committed to the log, the table not created yet
    with pytest.raises(Killed):
        killed_before_applying(Runtime(config, spark), 1).run()
    assert not table.exists()
    runtime = Runtime(config, spark)
    real = driver_module.table_state
    racing = {"done": False}

    def racer_wins(spark_: Any, ref: Any, app_id: str, **kw: Any) -> Any:
        if not racing["done"]:
            racing["done"] = True
            # The zombie's apply of epoch 1 creates the table first (its clean-up is fenced).
            staged = runtime.log.read().last_commit.driver_checkpoint.staged["orders"]
            assert Runtime(config, spark).driver.writer.apply(config.bindings[0], 1, staged).status == "applied"
            return TableState(False, None, None)
        return real(spark_, ref, app_id, **kw)

    driver_module.table_state = racer_wins
    try:
        summary = runtime.run()
    finally:
        driver_module.table_state = real
    assert table_rows(spark, table, ["id"]) == {(1,): {"id": 1, "v": 1}, (2,): {"id": 2, "v": 2}}
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert [h["operation"] for h in history] == ["CREATE TABLE AS SELECT"]
    assert summary.last_epoch == 1


@pytest.mark.slow
@pytest.mark.spark
def test_a_create_killed_before_its_commit_does_not_block_the_first_epoch(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a SIGKILL inside the first epoch's CREATE leaves (a data file, an empty _delta_log):
    Spark calls the table existing, so every later CREATE failed and the run waited for a commit
    that never came. After the creation wait the location is created over, in the tagged commit."""
    import materializer.merge.writer as driver  # where creation_wait_seconds looks it up

    monkeypatch.setattr(driver, "CREATION_WAIT_SECONDS", 1)
    table = tmp_path / "tables" / "t"
    (table / "_delta_log" / "_staged_commits").mkdir(parents=True)
    (table / "part-00000-killed-c000.snappy.parquet").write_bytes(b"")
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    config = config_with(tmp_path / "cfg", [binding("b", tmp_path / "src", table)])
    Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == {(1,): {"id": 1, "v": "a"}, (2,): {"id": 2, "v": "b"}}
    # Commit 0 is the epoch's, tagged: a replay of epoch 1 is skipped by Delta.
    assert any(a.get("txn") == {"appId": config.pipeline_id, "version": 1, **{k: v for k, v in a["txn"].items() if k == "lastUpdated"}}
               for a in _log_actions(table, 0) if "txn" in a)
