"""The transaction loop with real Spark and Delta, in-process on the shared session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.delta import TableRef, history, table_state
from materializer.errors import FencedError, SourceError
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from tests.collections import delta_updates_rows, generate, standard_state
from tests.helpers import binding, table_rows, write_config

pytestmark = pytest.mark.spark


def make(tmp_path: Path, *, seed: int, documents: int, keys: int, files: int, epoch: int, extra: list[dict[str, Any]] | None = None):  # type: ignore[no-untyped-def]
    docs = generate(tmp_path / "src", seed=seed, documents=documents, keys=keys, files=files)
    bindings = [binding("items", tmp_path / "src", tmp_path / "tables" / "items")] + (extra or [])
    config = load_config(write_config(tmp_path, bindings, max_documents=epoch))
    return docs, config


def epochs_in_history(spark: Any, table: Path) -> list[int]:
    return [h["tag"]["epoch"] for h in history(spark, TableRef(str(table))) if h["tag"]]


@pytest.mark.parametrize("seed", [1, 7])
def test_tables_equal_the_oracle_with_one_commit_per_epoch(spark: Any, tmp_path: Path, seed: int) -> None:
    events = ListCollector()
    docs, config = make(
        tmp_path, seed=seed, documents=120, keys=25, files=4, epoch=45,
        extra=[binding("items_log", tmp_path / "src", tmp_path / "tables" / "items_log", mode="delta_updates")],
    )
    summary = Runtime(config, spark, events).run()
    assert summary.last_epoch == 3  # 120 documents, 45 per epoch
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs)
    appended = spark.read.format("delta").load(str(tmp_path / "tables" / "items_log")).collect()
    assert sorted(((r["id"], r["seq"], r["_op"]) for r in appended), key=repr) == delta_updates_rows(docs, 45)
    for table in ("items", "items_log"):
        assert epochs_in_history(spark, tmp_path / "tables" / table) == [1, 2, 3]
        assert table_state(spark, TableRef(str(tmp_path / "tables" / table)), config.pipeline_id).txn_version == 3
    # nothing staged is left behind
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []
    assert [e["status"] for e in events.named("applied")] == ["applied"] * 6


def test_a_second_run_reapplies_nothing_and_adds_no_version(spark: Any, tmp_path: Path) -> None:
    docs, config = make(tmp_path, seed=3, documents=40, keys=10, files=2, epoch=20)
    Runtime(config, spark).run()
    table = TableRef(str(tmp_path / "tables" / "items"))
    before = table_state(spark, table, config.pipeline_id)
    again = Runtime(config, spark).run()
    assert again.epochs == []
    assert again.reapplied is not None
    assert [r.status for r in again.reapplied.results] == ["skipped"]
    assert table_state(spark, table, config.pipeline_id).version == before.version


def test_reapplying_an_applied_epoch_is_skipped_by_delta(spark: Any, tmp_path: Path) -> None:
    """Even when the staged file is still there, the re-apply makes no Delta commit."""
    from materializer.protocol import Acknowledge
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    docs, config = make(tmp_path, seed=4, documents=30, keys=10, files=1, epoch=30)
    runtime = Runtime(config, spark)
    runtime.run()
    entry = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit
    assert entry is not None and entry.driver_checkpoint is not None
    table = TableRef(str(tmp_path / "tables" / "items"))
    version = table_state(spark, table, config.pipeline_id).version
    # Force the MERGE itself (not our pre-check) to meet the txn id: Delta must skip it.
    staged = entry.driver_checkpoint.staged["items"]
    assert staged is not None
    source = spark.createDataFrame([(999, "x", "u")], "id long, name string, _op string")
    with runtime.driver._txn(config.bindings[0], entry.epoch):
        metrics = runtime.driver._commit(config.bindings[0], table, entry.epoch, source, True)
    assert metrics is None
    result = runtime.driver.acknowledge(Acknowledge(epoch=entry.epoch, driver_checkpoint=entry.driver_checkpoint))
    assert [r.status for r in result.results] == ["skipped"]
    assert table_state(spark, table, config.pipeline_id).version == version
    assert (999,) not in table_rows(spark, tmp_path / "tables" / "items", ["id"])


def test_malformed_line_stops_with_file_and_line_and_applies_nothing_of_it(spark: Any, tmp_path: Path) -> None:
    docs, config = make(tmp_path, seed=5, documents=40, keys=10, files=2, epoch=20)
    bad_file = tmp_path / "src" / "part-0001.jsonl"
    lines = bad_file.read_text().splitlines()
    lines[6] = lines[6][:-3] + "}}"
    bad_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(SourceError) as info:
        Runtime(config, spark).run()
    assert f"{bad_file}:7" in str(info.value)
    assert "nothing from this transaction was applied" in str(info.value)
    # epoch 1 (the first file) is in; nothing of the second file's transaction is
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs[:20])
    assert epochs_in_history(spark, tmp_path / "tables" / "items") == [1]
    # fixed input resumes exactly where it stopped
    lines[6] = '{"id": 1, "name": "fixed", "qty": 1, "seq": 26}'
    bad_file.write_text("\n".join(lines) + "\n")
    docs[26] = {"id": 1, "name": "fixed", "qty": 1, "seq": 26}
    Runtime(config, spark).run()
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs)


def test_a_second_writer_fences_the_first(spark: Any, tmp_path: Path) -> None:
    docs, config = make(tmp_path, seed=6, documents=60, keys=15, files=3, epoch=20)
    calls = {"n": 0}

    def newer_writer_runs_meanwhile() -> bool:
        calls["n"] += 1
        if calls["n"] == 2:  # after the first epoch of the old writer
            Runtime(config, spark).run()
        return False

    with pytest.raises(FencedError, match="fenced"):
        Runtime(config, spark).run(should_stop=newer_writer_runs_meanwhile)
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs)
    assert epochs_in_history(spark, tmp_path / "tables" / "items") == [1, 2, 3]
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []


def test_follow_picks_up_files_that_arrive_later(spark: Any, tmp_path: Path) -> None:
    docs = generate(tmp_path / "src", seed=8, documents=20, keys=8, files=1)
    config = load_config(
        write_config(
            tmp_path,
            [binding("items", tmp_path / "src", tmp_path / "tables" / "items")],
            transaction={"max_documents": 100, "poll_interval_seconds": 0.1},
        )
    )
    later = generate(tmp_path / "later", seed=9, documents=15, keys=8, files=1)
    calls = {"n": 0}

    def arrive_then_stop() -> bool:
        calls["n"] += 1
        if calls["n"] == 2:  # epoch 1 applied, sources drained: a new file lands
            (tmp_path / "later" / "part-0000.jsonl").rename(tmp_path / "src" / "part-0001.jsonl")
        return calls["n"] >= 6

    summary = Runtime(config, spark).run(follow=True, should_stop=arrive_then_stop)
    assert [e.epoch for e in summary.epochs] == [1, 2]
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == standard_state(docs + later)
