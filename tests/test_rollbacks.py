"""A table rolled back below the epochs the log says it holds stops the run at Open, before
anything is written, naming the lost epochs and both ways back (docs/neighbours.md, "Rollbacks").

Delta's RESTORE keeps the table's transaction ids (a table restored from epoch 3 to epoch 1 still
records epoch 3, so the lost epochs' replays would be skipped): the history tells. A CLONE or an
older copy put in the table's place carries fewer transaction ids than the log says: the txn
version tells. Each table is read by Spark and delta-rs and compared with the oracle.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from materializer.driver.rollbacks import _epochs, _rolled_back_to
from materializer.driver.table_changes import Commit
from materializer.errors import TableStateError
from tests.helpers import assert_tables_equal_oracle, binding, write_config, write_jsonl


def _config(tmp_path: Path, bindings: list[dict[str, Any]]) -> Any:
    from materializer.config import load_config

    (tmp_path / "run").mkdir(exist_ok=True)
    return load_config(write_config(tmp_path / "run", bindings, recovery_log=str(tmp_path / "log"), staging=str(tmp_path / "staging")))


def _last_epoch(tmp_path: Path) -> int:
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    return RecoveryLog(open_store(str(tmp_path / "log")), "test-pipeline").read().last_epoch


def _versions_of_epochs(spark: Any, table: Path) -> dict[int, int]:
    """Each epoch's Delta version on the table, from our tags in its history."""
    from materializer.delta import parse_user_metadata

    rows = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "userMetadata").collect()
    tags = [(parse_user_metadata(r["userMetadata"]), int(r["version"])) for r in rows]
    return {tag["epoch"]: version for tag, version in tags if tag is not None}


def _refused(spark: Any, config: Any, table: Path, tmp_path: Path) -> str:
    """The run stops at Open with a TableStateError; nothing was written to the table or the log."""
    from materializer.runtime import Runtime

    version = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").agg({"version": "max"}).first()[0]
    epoch = _last_epoch(tmp_path)
    with pytest.raises(TableStateError) as refused:
        Runtime(config, spark).run()
    assert refused.value.exit_code == 7
    assert spark.sql(f"DESCRIBE HISTORY delta.`{table}`").agg({"version": "max"}).first()[0] == version
    assert _last_epoch(tmp_path) == epoch
    return str(refused.value)


@pytest.mark.slow
def test_a_restore_below_the_last_epochs_stops_until_restored_forward_or_backfilled(spark: Any, tmp_path: Path) -> None:
    from materializer.backfill import backfill
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(tmp_path, [binding("b", tmp_path / "src", table, max_files=1)])
    for n, name in enumerate("abc", 1):
        write_jsonl(tmp_path / "src" / f"{name}.jsonl", [{"id": n, "v": n}, {"id": 1, "v": 10 * n}])
    Runtime(config, spark).run()
    assert _last_epoch(tmp_path) == 3
    at = _versions_of_epochs(spark, table)
    write_jsonl(tmp_path / "src" / "d.jsonl", [{"id": 4, "v": 4}])  # a run must not read it before the table is right

    # A restore to epoch 1's state: epochs 2 and 3 are gone from the rows, not from the txn ids.
    spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {at[1]}").collect()
    message = _refused(spark, config, table, tmp_path)
    assert "lost epochs 2-3" in message and "RESTORE" in message, message
    assert f"TO VERSION AS OF {at[3]}" in message and "backfill" in message and "--binding b --truncate" in message, message

    # Restored forward to the pipeline's last commit: the run goes on, d lands.
    spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {at[3]}").collect()
    assert Runtime(config, spark).run().last_epoch == 4
    assert_tables_equal_oracle(spark, config, bindings=["b"])

    # Restored again, past a restore forward (its target is itself a RESTORE): epochs 3-4 lost;
    # the backfill with --truncate reads the source into the emptied table.
    at = _versions_of_epochs(spark, table)
    spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {at[2]}").collect()
    assert "lost epochs 3-4" in _refused(spark, config, table, tmp_path)
    backfill(config, spark, "b", truncate=True)
    assert_tables_equal_oracle(spark, config, bindings=["b"])


@pytest.mark.slow
def test_a_clone_or_an_older_copy_in_the_tables_place_stops_the_run(spark: Any, tmp_path: Path) -> None:
    """b's last commit is epoch 2 (epoch 3 has rows for z only), so its table must record epoch 2:
    a copy of it taken after epoch 1 records 1, a CLONE of that copy records none."""
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(tmp_path, [
        binding("b", tmp_path / "src", table, max_files=1),
        binding("z", tmp_path / "z", tmp_path / "tables" / "z", max_files=1),
    ])
    for folder, names in (("src", "ab"), ("z", "abc")):
        for n, name in enumerate(names, 1):
            write_jsonl(tmp_path / folder / f"{name}.jsonl", [{"id": n, "v": n}])
    Runtime(config, spark).run(max_epochs=1)
    old = tmp_path / "copy-after-epoch-1"
    shutil.copytree(table, old)
    Runtime(config, spark).run()
    assert _last_epoch(tmp_path) == 3
    kept = tmp_path / "the-real-table"
    table.rename(kept)

    shutil.copytree(old, table)  # an older copy of the folder put in its place
    message = _refused(spark, config, table, tmp_path)
    assert "records epoch 1 of pipeline 'test-pipeline'" in message and "holds epoch 2" in message and "lost epoch 2" in message, message

    shutil.rmtree(table)
    spark.sql(f"CREATE TABLE delta.`{table}` SHALLOW CLONE delta.`{old}`").collect()
    message = _refused(spark, config, table, tmp_path)
    assert "records no epoch" in message and "lost epochs 1-2" in message and "put the table it replaced back" in message, message

    shutil.rmtree(table)
    kept.rename(table)
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 3, "v": 3}])
    assert Runtime(config, spark).run().last_epoch == 4
    assert_tables_equal_oracle(spark, config)


def _c(at: int, operation: str, **parameters: Any) -> Commit:
    return Commit(version=at, operation=operation, timestamp=at * 1000, user=None, parameters=parameters)


@pytest.mark.parametrize(
    ("commits", "lost_to"),
    [
        # maintenance and a person's DELETE after our last commit (3): contents still build on it
        ([_c(3, "MERGE"), _c(4, "OPTIMIZE"), _c(5, "DELETE")], None),
        # restored to before our last commit
        ([_c(3, "MERGE"), _c(4, "RESTORE", version="1")], 1),
        # ... and restored forward to our last commit again
        ([_c(3, "MERGE"), _c(4, "RESTORE", version="1"), _c(5, "RESTORE", version="3")], None),
        # restored "forward" to the first restore: still epoch 1's state
        ([_c(3, "MERGE"), _c(4, "RESTORE", version="1"), _c(5, "OPTIMIZE"), _c(6, "RESTORE", version="5")], 1),
        # a restore undoing a person's DELETE made after our last commit
        ([_c(3, "MERGE"), _c(4, "DELETE"), _c(5, "RESTORE", version="3")], None),
        # replaced in its own log
        ([_c(3, "MERGE"), _c(4, "CREATE OR REPLACE TABLE AS SELECT")], -1),
        # a restore by timestamp: to the time of version 2 (2,000 ms)
        ([_c(2, "MERGE"), _c(3, "MERGE"), _c(4, "RESTORE", timestamp="1970-01-01 00:00:02.5")], 2),
    ],
)
def test_the_history_walk_finds_where_the_contents_come_from(commits: list[Commit], lost_to: int | None) -> None:
    found = _rolled_back_to(commits, 3)
    assert (found[0] if found else None) == lost_to


def test_lost_epochs_are_shown_as_runs() -> None:
    assert _epochs([3]) == "epoch 3"
    assert _epochs([2, 3, 4, 7, 9, 10]) == "epochs 2-4, 7, 9-10"
