"""What docs/engines.md tells readers, checked with the readers that run here: Spark, delta-rs's
QueryBuilder (deletion vectors applied), and delta-rs's pyarrow path, which refuses a table with
deletion vectors and reads one whose binding turned them off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.runtime import Runtime
from tests.helpers import binding, delta_rs_list, write_config, write_jsonl

pytestmark = pytest.mark.spark


def _pyarrow_ids(table: Path) -> list[int] | str:
    from deltalake import DeltaTable

    try:
        return sorted(r["id"] for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist())
    except Exception as exc:  # noqa: BLE001 - a reader that refuses the table is an answer too
        return f"{type(exc).__name__}: {exc}"


def test_each_reader_reads_what_the_docs_say(spark: Any, tmp_path: Path) -> None:
    docs = [[{"id": i, "v": "a"} for i in range(6)], [{"id": 1, "v": "b"}, {"id": 2, "_meta": {"op": "d"}}]]
    for i, epoch in enumerate(docs):
        write_jsonl(tmp_path / "src" / f"{i}.jsonl", epoch)
    tables = {dv: tmp_path / f"t-{dv}" for dv in (True, False)}
    config = load_config(write_config(tmp_path, [
        binding(f"dv_{str(dv).lower()}", tmp_path / "src", table, max_files=1, deletion_vectors=dv) for dv, table in tables.items()
    ]))
    Runtime(config, spark).run()
    live = [0, 1, 3, 4, 5]
    for dv, table in tables.items():
        assert sorted(r["id"] for r in spark.read.format("delta").load(str(table)).collect()) == live
        assert sorted(r["id"] for r in delta_rs_list(table)) == live  # QueryBuilder
    # Without deletion vectors the MERGE rewrote the files: any reader sees the live rows.
    assert _pyarrow_ids(tables[False]) == live
    # With them, delta-rs's pyarrow path refuses the table (it would otherwise show replaced rows).
    seen = _pyarrow_ids(tables[True])
    assert isinstance(seen, str) and seen.startswith("DeltaProtocolError"), seen


def test_timestamps_far_from_today_read_the_same_in_delta_rs(spark: Any, tmp_path: Path) -> None:
    """Spark writes a TIMESTAMP to Parquet as INT96 by default, which delta-rs (and Arrow) read as
    nanoseconds: a value before 1677 or after 2262 came back silently wrong (0001-01-01 as
    1754-08-30, a held-out run found). The materializer's commits write them as INT64 microseconds
    (``spark.sql.parquet.outputTimestampType``), also on a session it is handed with Spark's
    default, as here."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, QueryBuilder

    utc = datetime.timezone.utc
    values = {
        1: datetime.datetime(1, 1, 1, tzinfo=utc),
        2: datetime.datetime(1500, 6, 30, 12, 0, 0, 250000, tzinfo=utc),
        3: datetime.datetime(2026, 12, 4, 10, 0, 0, 500000, tzinfo=utc),
        4: datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
    }
    write_jsonl(tmp_path / "src" / "0.jsonl", [{"id": i, "at": v.isoformat().replace("+00:00", "Z")} for i, v in values.items()])
    table = tmp_path / "t"
    config = load_config(write_config(tmp_path, [binding("at", tmp_path / "src", table, schema="id BIGINT, at TIMESTAMP")]))
    key = "spark.sql.parquet.outputTimestampType"
    saved = spark.conf.get(key, None)
    spark.conf.unset(key)  # Spark's default: INT96
    try:
        Runtime(config, spark).run()
        assert spark.conf.get(key) == "INT96"  # put back after the commit
    finally:
        if saved is not None:
            spark.conf.set(key, saved)
    read = pa.table(QueryBuilder().register("t", DeltaTable(str(table))).execute("select id, at from t order by id").read_all()).to_pylist()
    assert {r["id"]: r["at"] for r in read} == values
    # (PySpark's collect makes local datetimes, which cannot hold the year 1: compared as microseconds.)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=utc)
    micros = {i: (v - epoch) // datetime.timedelta(microseconds=1) for i, v in values.items()}
    assert {r["id"]: r["us"] for r in spark.read.format("delta").load(str(table)).selectExpr("id", "unix_micros(at) AS us").collect()} == micros
    for data in table.glob("*.parquet"):
        assert pq.ParquetFile(data).schema.column(1).physical_type == "INT64"
