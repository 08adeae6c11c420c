"""Issue #18, part 5: ``backfill`` reads one binding's source again into its table, exactly once.

The position change (and the truncate) is an epoch of its own; the re-read rows come in later
epochs with new txn versions. Other bindings keep their positions; a backfill cut short anywhere
is finished by the next run, with every row exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.backfill import backfill, resolve_position, start_backfill
from materializer.errors import ConfigError
from materializer.recovery_log import RecoveryLog
from materializer.runtime import Runtime
from materializer.storage import open_store
from tests.helpers import binding, table_rows, write_jsonl
from tests.test_holes import Killed, config_with, killed_before_applying, last_epoch

pytestmark = pytest.mark.spark


def _sources(tmp_path: Path) -> None:
    for i in range(3):
        write_jsonl(tmp_path / "log_src" / f"f{i}.jsonl", [{"id": 10 * i + j, "v": i} for j in range(3)])
    write_jsonl(tmp_path / "items_src" / "a.jsonl", [{"id": 1, "v": "x"}, {"id": 2, "v": "y"}])


def _config(tmp_path: Path) -> Any:
    return config_with(
        tmp_path,
        [
            binding("items", tmp_path / "items_src", tmp_path / "tables" / "items"),
            binding("events", tmp_path / "log_src", tmp_path / "tables" / "events", mode="delta_updates"),
        ],
    )


def _events(spark: Any, tmp_path: Path) -> list[int]:
    return sorted(r["id"] for r in spark.read.format("delta").load(str(tmp_path / "tables" / "events")).collect())


ALL_EVENTS = [0, 1, 2, 10, 11, 12, 20, 21, 22]


def _history(spark: Any, table: Path) -> list[Any]:
    return spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()


@pytest.mark.slow
def test_a_truncating_backfill_rewrites_one_binding_once_and_leaves_the_other_alone(spark: Any, tmp_path: Path) -> None:
    _sources(tmp_path)
    config = _config(tmp_path)
    Runtime(config, spark).run()
    assert _events(spark, tmp_path) == ALL_EVENTS and last_epoch(config) == 3
    items_before = table_rows(spark, tmp_path / "tables" / "items", ["id"])
    summary = backfill(config, spark, "events", truncate=True)
    assert summary.reset_epoch == 4 and summary.epochs == [5, 6, 7]
    assert _events(spark, tmp_path) == ALL_EVENTS  # once each: truncated, then read again
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == items_before
    # items' source was not read again: its table got only empty commits after epoch 1.
    items = _history(spark, tmp_path / "tables" / "items")
    assert all(int((h["operationMetrics"] or {}).get("numOutputRows", "0")) == 0 for h in items[1:])
    # Without --truncate a delta_updates backfill appends again (the documented decision).
    backfill(config, spark, "events")
    assert _events(spark, tmp_path) == sorted(ALL_EVENTS * 2)


def test_a_standard_backfill_repairs_rows_lost_from_the_table(spark: Any, tmp_path: Path) -> None:
    _sources(tmp_path)
    config = _config(tmp_path)
    Runtime(config, spark).run()
    items = tmp_path / "tables" / "items"
    spark.sql(f"DELETE FROM delta.`{items}` WHERE id = 1")
    backfill(config, spark, "items")
    assert table_rows(spark, items, ["id"]) == {(1,): {"id": 1, "v": "x"}, (2,): {"id": 2, "v": "y"}}
    assert _events(spark, tmp_path) == ALL_EVENTS


@pytest.mark.slow
def test_backfill_from_a_file_reads_that_file_and_the_later_ones(spark: Any, tmp_path: Path) -> None:
    _sources(tmp_path)
    config = _config(tmp_path)
    assert resolve_position(config, "events", "f1.jsonl") == {"file": "f0.jsonl"}
    assert resolve_position(config, "events", "f0.jsonl") is None
    with pytest.raises(ConfigError, match="no such binding"):
        start_backfill(config, spark, "nope")
    Runtime(config, spark).run()
    backfill(config, spark, "events", position="f1.jsonl")
    assert _events(spark, tmp_path) == sorted(ALL_EVENTS + [10, 11, 12, 20, 21, 22])


@pytest.mark.parametrize(
    "cut",
    [
        "before-truncate",  # crash here leaves the reset epoch committed, nothing applied
        "after-truncate",  # crash here leaves the table truncated, nothing read again yet
        "mid-reread",  # crash here leaves one re-read epoch committed but not applied
    ],
)
def test_a_backfill_cut_short_is_finished_by_the_next_run_exactly_once(spark: Any, tmp_path: Path, cut: str) -> None:
    _sources(tmp_path)
    config = _config(tmp_path)
    Runtime(config, spark).run()
    start_backfill(config, spark, "events", truncate=True)  # epoch 4: the reset, committed
    runtime = Runtime(config, spark)
    if cut == "before-truncate":
        killed_before_applying(runtime, 4)
    elif cut == "after-truncate":
        acknowledge = runtime.driver.acknowledge

        def stop(message: Any) -> Any:
            acknowledge(message)
            raise Killed("killed after the truncate")

        runtime.driver.acknowledge = stop  # type: ignore[method-assign]
    else:
        killed_before_applying(runtime, 6)
    with pytest.raises(Killed):
        runtime.run()
    if cut == "mid-reread":
        assert _events(spark, tmp_path) == [0, 1, 2]  # epoch 5 applied, 6 committed only
    Runtime(config, spark).run()
    assert _events(spark, tmp_path) == ALL_EVENTS
    assert last_epoch(config) == 7
    assert sorted(table_rows(spark, tmp_path / "tables" / "items", ["id"])) == [(1,), (2,)]
    entry = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit
    assert entry is not None and entry.runtime_checkpoint["events"]["file"] == "f2.jsonl"


@pytest.mark.drill  # a CLI run and its JVM; in the default run: the cut-short test above (in process) and
@pytest.mark.crash  # the SIGKILLs inside a MERGE of test_s3, test_connect and test_drill
def test_a_backfill_sigkilled_inside_a_reread_merge_is_finished_by_the_next_run(spark: Any, tmp_path: Path) -> None:
    from tests.helpers import run_cli

    _sources(tmp_path)
    config = _config(tmp_path)
    Runtime(config, spark).run()
    killed = run_cli(
        "backfill", "--config", str(tmp_path / "pipeline.yaml"), "--binding", "events", "--truncate",
        env={"MATERIALIZER_CRASH_AT": "mid-apply:6"},
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert last_epoch(config) >= 6 and _events(spark, tmp_path) == [0, 1, 2]  # truncated, epoch 5 re-read
    Runtime(config, spark).run()
    assert _events(spark, tmp_path) == ALL_EVENTS and last_epoch(config) == 7
    assert sorted(table_rows(spark, tmp_path / "tables" / "items", ["id"])) == [(1,), (2,)]
