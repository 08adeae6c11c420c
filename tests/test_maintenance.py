"""Maintenance beside the pipeline changes no row and stops no run (docs/neighbours.md,
"Maintenance"): OPTIMIZE, ZORDER, VACUUM (RETAIN 0 HOURS too) and auto compaction, between runs and
between a kill and its restart, at both sides of the MERGE. A compaction racing a MERGE is
tests/test_conflicts.py's; at random beside SIGKILLs, the neighbours drill's (tests/test_drill.py).

Each table is read by Spark and delta-rs and compared with the oracle of its sources, and each
epoch is in its history once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import InProcessCrash, assert_tables_equal_oracle, binding, write_config, write_jsonl

MAINTENANCE = (
    "OPTIMIZE {t}",
    "OPTIMIZE {t} ZORDER BY (v)",
    "VACUUM {t} RETAIN 0 HOURS",
)


def _maintain(spark: Any, table: Path, *statements: str) -> None:
    """A platform team's session: no txn id, no tag of ours, the retention check off for its VACUUM."""
    team = spark.newSession()
    team.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    for statement in statements:
        team.sql(statement.format(t=f"delta.`{table}`")).collect()


def _operations(spark: Any, table: Path) -> Counter[str]:
    return Counter(r["operation"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("operation").collect())


def _assert_exact(spark: Any, config: Any, epochs: int) -> None:
    from materializer.delta import TableRef
    from materializer.delta.reads import history

    assert_tables_equal_oracle(spark, config)  # by Spark and delta-rs
    for b in config.bindings:
        tagged = Counter(c["tag"]["epoch"] for c in history(spark, TableRef(b.table)) if c["tag"] is not None)
        assert tagged == Counter(range(1, epochs + 1)), f"{b.name}: each epoch once in the history, found {tagged}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    [
        # the epoch is in the log, its MERGE not run: the restart applies it over the compacted files
        "after-log-commit",
        # the first table's MERGE committed before the kill: its replay is skipped by the txn id
        "after-apply",
    ],
)
def test_maintenance_between_runs_and_between_a_kill_and_its_restart_changes_no_row(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    from materializer.config import load_config
    from materializer.runtime import Runtime

    tables = {name: tmp_path / "tables" / name for name in ("b", "z")}
    (tmp_path / "run").mkdir()
    config = load_config(write_config(
        tmp_path / "run",
        [binding(name, tmp_path / name, table, max_files=1) for name, table in tables.items()],
        # one table after the other, b first: after-apply fires between the two
        transaction={"max_documents": 1000, "pipelined": False, "parallel_bindings": 1},
    ))
    for name in tables:
        for n in range(1, 5):
            write_jsonl(tmp_path / name / f"{n:02d}.jsonl", [{"id": i, "v": n * 10 + i} for i in range(n, n + 4)])

    # Epochs 1-2, then every kind of maintenance between runs.
    Runtime(config, spark).run(max_epochs=2)
    for table in tables.values():
        _maintain(spark, table, *MAINTENANCE)

    # Epoch 3 killed at the point; maintenance (auto compaction turned on too) before the restart.
    killed = InProcessCrash(monkeypatch, f"{point}:3")
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        for table in tables.values():
            _maintain(spark, table, *MAINTENANCE, "ALTER TABLE {t} SET TBLPROPERTIES ('delta.autoOptimize.autoCompact' = 'true')")
        killed.disarm()
        # (Delta's default waits for 50 small files: 2, so the restart's MERGEs compact)
        spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "2")
        try:
            summary = Runtime(config, spark).run()
        finally:
            spark.conf.unset("spark.databricks.delta.autoCompact.minNumFiles")
        assert summary.last_epoch == 4
        want = {"b": "skipped", "z": "applied"} if point == "after-apply" else {"b": "applied", "z": "applied"}
        assert {r.binding: r.status for r in summary.reapplied.results} == want
        _assert_exact(spark, config, epochs=4)
        for name, table in tables.items():
            done = _operations(spark, table)
            auto = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").where("operationParameters['auto'] = 'true'").count()
            assert done["OPTIMIZE"] >= 4 and done["VACUUM END"] >= 2 and auto >= 1, f"{name}: {done}, {auto} auto compactions"
    finally:
        killed.thaw()
        frozen.join(60)
