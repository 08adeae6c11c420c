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
    facts = driver._table_facts(config.bindings[0])
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
