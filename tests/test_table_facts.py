"""Issue #12, lever (a): the table facts StartCommit needs (schema, constraints, column mapping,
type widening) come from the Delta snapshot's metadata, not from DESCRIBE DETAIL, whose file
statistics cost Spark jobs after every MERGE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.delta import TableRef, detail, schema_and_properties
from tests.helpers import binding, write_jsonl
from tests.test_holes import config_with

pytestmark = pytest.mark.spark


@pytest.mark.slow
def test_schema_and_properties_finds_what_detail_finds_and_no_table_where_it_finds_none(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "killed" / "_delta_log").mkdir(parents=True)  # what a CREATE killed before its commit leaves
    spark.range(2).write.parquet(str(tmp_path / "killed" / "data"))
    spark.range(2).write.parquet(str(tmp_path / "parquet"))
    delta = tmp_path / "delta"
    spark.range(2).selectExpr("id", "'x' AS `a b`").write.format("delta").option("delta.columnMapping.mode", "name").save(str(delta))
    spark.sql(f"ALTER TABLE delta.`{delta}` ADD CONSTRAINT positive CHECK (id >= 0)")
    spark.sql("DROP TABLE IF EXISTS facts_parquet")
    spark.sql("DROP TABLE IF EXISTS facts_delta")
    spark.range(2).write.format("parquet").saveAsTable("facts_parquet")
    spark.range(2).write.format("delta").saveAsTable("facts_delta")
    try:
        for spec in [tmp_path / "missing", tmp_path / "empty", tmp_path / "killed", tmp_path / "parquet", "facts_parquet", "facts_nowhere"]:
            table = TableRef(str(spec))
            assert detail(spark, table) is None and schema_and_properties(spark, table) is None, spec
        for spec in [str(delta), "facts_delta"]:
            table = TableRef(spec)
            found = schema_and_properties(spark, table)
            assert found is not None, spec
            schema, properties = found
            assert schema == spark.read.format("delta").load(spec).schema if spec == str(delta) else spark.read.table(spec).schema
            # Every property DESCRIBE DETAIL gives is there, with its value (SHOW TBLPROPERTIES adds the protocol).
            assert dict(detail(spark, table)["properties"]).items() <= properties.items(), spec
        _schema, properties = schema_and_properties(spark, TableRef(str(delta)))
        assert properties["delta.constraints.positive"] == "id >= 0"
        assert properties["delta.columnMapping.mode"] == "name"
    finally:
        spark.sql("DROP TABLE IF EXISTS facts_parquet")
        spark.sql("DROP TABLE IF EXISTS facts_delta")


def test_start_commit_reads_the_table_facts_without_a_spark_job_after_a_merge(spark: Any, tmp_path: Path) -> None:
    """DESCRIBE DETAIL ran 3 Spark jobs here (file count and size of the snapshot the MERGE made)."""
    from materializer.driver import DeltaDriver
    from materializer.runtime import Runtime
    from materializer.storage import open_store
    from materializer.tools.bench import next_job_id

    table = tmp_path / "tables" / "items"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in range(50)])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, v BIGINT")])
    assert Runtime(config, spark).run().last_epoch == 1
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT small CHECK (v < 1000)")
    spark.sql(f"MERGE INTO delta.`{table}` t USING (SELECT 7L AS id, 8L AS v) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *")

    driver = DeltaDriver(spark, config, open_store(config.staging))
    first = next_job_id(spark)
    if first is None:
        pytest.skip("no status tracker to count Spark jobs (Spark Connect)")
    facts = driver.table_fit.facts(config.bindings[0])
    assert next_job_id(spark) == first, "the table facts ran a Spark job"
    assert facts is not None
    assert facts.schema == spark.read.format("delta").load(str(table)).schema
    assert facts.constraints == {"small": "v < 1000"}
    assert not facts.column_mapping and not facts.type_widening
    # The same table through DESCRIBE DETAIL: the file statistics cost jobs (why it is not used).
    spark.sql(f"MERGE INTO delta.`{table}` t USING (SELECT 9L AS id, 9L AS v) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *")
    before = next_job_id(spark)
    assert detail(spark, TableRef(str(table))) is not None
    assert next_job_id(spark) > before


def test_the_table_facts_are_kept_while_the_metadata_stands_and_a_constraint_added_meanwhile_is_seen(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read once, not every epoch (issue 32: a smaller fixed cost per epoch): the next epoch's
    check reuses them while the table's Delta metadata and protocol are unchanged (an epoch's own
    MERGE that adds no column leaves them), and reads them again after a commit that changes them,
    another writer's ALTER included, so a constraint added between two epochs of one running
    driver still refuses the rows that break it before they are committed."""
    from materializer import driver as driver_module
    from materializer.driver import table_fit  # where the facts are read: the patches reach them there
    from materializer.errors import SourceError
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "items"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in range(5)])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 7, "v": 7}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, v BIGINT", max_files=1)])
    runtime = Runtime(config, spark)
    assert runtime.run().last_epoch == 2  # epoch 2's check read the facts of the table epoch 1 made

    reads: list[str] = []  # the facts read for an epoch's check (Open's own checks aside)
    real = table_fit.schema_and_properties
    monkeypatch.setattr(table_fit, "schema_and_properties", lambda s, t: real(s, t))
    driver = runtime.driver
    assert isinstance(driver, driver_module.DeltaDriver)
    start_commit = driver.start_commit

    def counted_start_commit(message: Any) -> Any:
        monkeypatch.setattr(table_fit, "schema_and_properties", lambda s, t: reads.append(t.location) or real(s, t))
        try:
            return start_commit(message)
        finally:
            monkeypatch.setattr(table_fit, "schema_and_properties", lambda s, t: real(s, t))

    monkeypatch.setattr(driver, "start_commit", counted_start_commit)
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 8, "v": 8}])
    assert runtime.run().last_epoch == 3
    assert reads == []  # epoch 3 after epoch 2's MERGE (rows only): the facts were kept
    monkeypatch.setattr(table_fit, "schema_and_properties", lambda s, t: reads.append(t.location) or real(s, t))
    kept = driver.table_fit.facts(config.bindings[0])
    assert kept is not None and kept.constraints == {} and reads == []

    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT small CHECK (v < 1000)")  # another writer's commit
    after = driver.table_fit.facts(config.bindings[0])
    assert len(reads) == 1 and after is not None and after.constraints == {"small": "v < 1000"}

    # The whole path, in the same driver: the next epoch's rows that break it are refused before
    # commit (had the facts been kept past the ALTER, Delta would refuse the committed epoch's MERGE).
    write_jsonl(tmp_path / "src" / "d.jsonl", [{"id": 9, "v": 5000}])
    with pytest.raises(SourceError, match=r"key id=9.*CHECK constraint small"):
        runtime.run()
