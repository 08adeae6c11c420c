"""Issue #18, part 3: a table that enables Delta's type widening takes the widenings Delta allows.

Without it (or for a change Delta does not widen) the epoch is refused before commit, as before.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from materializer.errors import SourceError
from materializer.runtime import Runtime
from materializer.widening import widened
from tests.helpers import binding, table_rows, write_jsonl
from tests.test_holes import config_with, last_epoch


def test_the_widenings_delta_applies_automatically_and_no_others() -> None:
    from pyspark.sql.types import (
        ByteType, DateType, DecimalType, DoubleType, FloatType, IntegerType, LongType, StringType, TimestampNTZType,
    )

    assert widened(LongType(), IntegerType()) == LongType()
    assert widened(IntegerType(), ByteType()) == IntegerType()
    assert widened(IntegerType(), LongType()) is None  # fits already
    assert widened(DoubleType(), FloatType()) == DoubleType()
    assert widened(DecimalType(12, 2), DecimalType(10, 2)) == DecimalType(12, 2)
    assert widened(DecimalType(10, 4), DecimalType(10, 2)) == DecimalType(12, 4)  # keeps 8 integer digits
    assert widened(DecimalType(38, 0), DecimalType(38, 10)) is None  # would need 48 digits
    assert widened(TimestampNTZType(), DateType()) == TimestampNTZType()
    assert widened(LongType(), DoubleType()) is None and widened(StringType(), IntegerType()) is None
    assert widened(DoubleType(), IntegerType()) is None  # across families: not automatic in Delta


SCHEMA = "id BIGINT, n BIGINT, f DOUBLE, d DECIMAL(14,4)"


def _table(spark: Any, path: Path, widening: bool) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, n INT, f FLOAT, d DECIMAL(10,2)) USING delta"
        + (" TBLPROPERTIES ('delta.enableTypeWidening' = 'true')" if widening else "")
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 1, 0.5, 1.25)")


@pytest.mark.spark
def test_wider_types_widen_the_columns_of_a_table_that_enables_type_widening(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = tmp_path / "tables" / "items"
    _table(spark, table, widening=True)
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 2, "n": 2**40, "f": 0.1, "d": 12345678.1234}, {"id": 1, "n": 5, "f": 2.5, "d": 1}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema=SCHEMA)])
    Runtime(config, spark).run()
    # Read back by delta-rs from the log: the columns were widened, not the values cast down.
    types = {f.name: f.type.type for f in DeltaTable(str(table)).schema().fields}
    assert types == {"id": "long", "n": "long", "f": "double", "d": "decimal(14,4)"}
    rows = table_rows(spark, table, ["id"])
    assert rows[(2,)] == {"id": 2, "n": 2**40, "f": 0.1, "d": Decimal("12345678.1234")}
    assert rows[(1,)]["n"] == 5

    # A change Delta does not widen is still refused before commit.
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 3, "n": "x"}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, n STRING")])
    with pytest.raises(SourceError, match="field 'n' arrives as string"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 1


@pytest.mark.slow
@pytest.mark.spark
def test_without_type_widening_a_value_too_wide_is_refused_before_commit_as_before(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "items"
    _table(spark, table, widening=False)
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 2, "n": 2**40, "f": 0.5, "d": 1}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema=SCHEMA)])
    with pytest.raises(SourceError, match="arrives as double but the table holds float"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 0 and sorted(table_rows(spark, table, ["id"])) == [(1,)]


@pytest.mark.slow
@pytest.mark.spark
def test_delta_updates_appends_widen_too(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "log"
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, n INT, _op STRING) USING delta TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 2, "n": 2**40}])
    config = config_with(tmp_path, [binding("log", tmp_path / "src", table, mode="delta_updates", schema="id BIGINT, n BIGINT")])
    Runtime(config, spark).run()
    assert spark.read.format("delta").load(str(table)).schema["n"].dataType.simpleString() == "bigint"
    assert [r["n"] for r in spark.read.format("delta").load(str(table)).collect()] == [2**40]


@pytest.mark.slow
@pytest.mark.spark
def test_a_wider_type_inside_a_struct_is_refused_before_commit_naming_the_field(spark: Any, tmp_path: Path) -> None:
    """Declared ``s STRUCT<a: INT>``, then ``STRUCT<a: BIGINT>``, on a table with type widening:
    refused before the epoch is committed (it was committed, then failed to apply); the narrower
    declaration again runs on, and a narrower declared type than the table's lands."""
    table = tmp_path / "tables" / "items"
    props = {"properties": {"delta.enableTypeWidening": "true"}, "deletion_vectors": False}
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "s": {"a": 1}, "l": [1]}])
    narrow = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, s STRUCT<a: INT>, l ARRAY<INT>", **props)])
    Runtime(narrow, spark).run()

    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "s": {"a": 2**40}, "l": [2]}])
    wide = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, s STRUCT<a: BIGINT>, l ARRAY<INT>", **props)])
    with pytest.raises(SourceError, match=r"binding items: .*field 's\.a' arrives as bigint but the table holds int"):
        Runtime(wide, spark).run()
    assert last_epoch(wide) == 1
    (tmp_path / "src" / "b.jsonl").write_text('{"id": 2, "s": {"a": 2}, "l": [2]}\n')  # fits INT: only the list is wider
    wide_list = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, s STRUCT<a: INT>, l ARRAY<BIGINT>", **props)])
    with pytest.raises(SourceError, match=r"field 'l' holds array<bigint>"):
        Runtime(wide_list, spark).run()
    assert last_epoch(wide_list) == 1

    # With the narrower declaration restored, the pipeline runs on.
    Runtime(narrow, spark).run()
    # Narrower than the table (SMALLINT into INT) fits: it lands.
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 3, "s": {"a": 3}, "l": [3]}])
    smaller = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, s STRUCT<a: SMALLINT>, l ARRAY<INT>", **props)])
    Runtime(smaller, spark).run()
    assert last_epoch(smaller) == 3
    rows = table_rows(spark, table, ["id"])
    assert {k[0]: r["s"]["a"] for k, r in rows.items()} == {1: 1, 2: 2, 3: 3}
    # delta-rs reads the log and schema (not the rows: it lacks the typeWidening reader feature).
    from deltalake import DeltaTable

    types = {f.name: f.type for f in DeltaTable(str(table)).schema().fields}
    assert types["s"].fields[0].type.type == "integer" and types["l"].element_type.type == "integer"
