"""Crash tests: the real CLI in a subprocess, SIGKILLed at every failure point, then restarted.

One pipeline, restarted again and again: each run is killed at the next failure point (at a later
epoch each time), so every point is exercised with a handful of JVM start-ups. The final run drains
the sources; the tables must then equal the oracle, each epoch committed exactly once per table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.delta import TableRef, history, table_state
from tests.collections import delta_updates_rows, generate, standard_state
from tests.helpers import binding, run_cli, table_rows, write_config

pytestmark = [pytest.mark.spark, pytest.mark.crash]

EPOCH = 10
# (point, epoch it fires at); each run commits at least one more epoch than the last.
SCHEDULE = [
    ("after-stage", 1),
    ("after-started-commit", 2),
    ("mid-log-commit", 3),
    ("after-log-commit", 3),
    ("mid-apply", 4),
    ("after-apply", 5),
    ("after-ack-before-gc", 6),
    ("mid-apply", 7),
]


def test_killed_at_every_failure_point_and_restarted_ends_exactly_once(spark: Any, tmp_path: Path) -> None:
    # One file of EPOCH documents per epoch: the documents source takes whole files.
    docs = generate(tmp_path / "src", seed=11, documents=90, keys=20, files=90 // EPOCH)
    config = write_config(
        tmp_path,
        [
            binding("items", tmp_path / "src", tmp_path / "tables" / "items", max_files=1),
            binding("items_log", tmp_path / "src", tmp_path / "tables" / "items_log", mode="delta_updates", max_files=1),
        ],
    )
    for point, epoch in SCHEDULE:
        result = run_cli("run", "--config", str(config), env={"MATERIALIZER_CRASH_AT": f"{point}:{epoch}"})
        assert result.returncode == -9, f"{point}:{epoch} did not kill the run:\n{result.stderr[-3000:]}"
    final = run_cli("run", "--config", str(config), "--json")
    assert final.returncode == 0, final.stderr[-3000:]
    summary = json.loads(final.stdout)
    assert summary["last_epoch"] == 9  # 90 documents, 10 per epoch: nothing lost, nothing extra

    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs)
    appended = spark.read.format("delta").load(str(tmp_path / "tables" / "items_log")).collect()
    assert sorted(((r["id"], r["seq"], r["_op"]) for r in appended), key=repr) == delta_updates_rows(docs, EPOCH)
    for table in ("items", "items_log"):
        ref = TableRef(str(tmp_path / "tables" / table))
        epochs = [h["tag"]["epoch"] for h in history(spark, ref) if h["tag"]]
        assert epochs == list(range(1, 10)), f"{table}: {epochs}"
        assert table_state(spark, ref, "test-pipeline").txn_version == 9
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []

    status = run_cli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stdout + status.stderr[-2000:]
    assert json.loads(status.stdout)["agrees"] is True
