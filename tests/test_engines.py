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
