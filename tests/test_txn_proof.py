"""Exactly-once rests on Delta recording the txn id of each commit (DESIGN invariant 13): proven
after the first apply of each table in a run, and a session that refuses the confs stops at Open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.delta import TableRef, table_state
from materializer.errors import TxnNotRecordedError
from tests.helpers import binding, table_rows, write_config, write_jsonl


def _config(tmp_path: Path) -> Any:
    write_jsonl(tmp_path / "src" / "a-001.jsonl", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    return load_config(write_config(tmp_path, [binding("b", tmp_path / "src", tmp_path / "t")], pipeline_id="txn-proof"))


def _log_epochs(config: Any) -> int | None:
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    entry = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit
    return None if entry is None else entry.epoch


def test_a_compute_that_ignores_the_txn_confs_stops_after_the_first_apply(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    import materializer.merge.writer as merge  # where the apply's transaction looks the conf names up
    from materializer.runtime import Runtime

    config = _config(tmp_path)
    # As a compute that takes the confs and drops them: Delta never sees a txn id.
    monkeypatch.setattr(merge, "TXN_APP_ID", "spark.materializer.test.ignored.txnAppId")
    monkeypatch.setattr(merge, "TXN_VERSION", "spark.materializer.test.ignored.txnVersion")
    with pytest.raises(TxnNotRecordedError, match="does not record Delta's transaction id") as info:
        Runtime(config, spark).run()
    assert info.value.exit_code == 11
    assert table_state(spark, TableRef(config.bindings[0].table), config.pipeline_id).txn_version is None
    assert sorted(table_rows(spark, config.bindings[0].table, ["id"])) == [(1,), (2,)]

    # On a compute that records them, the next run re-applies epoch 1 (its MERGE is idempotent)
    # and the table records it.
    monkeypatch.undo()
    Runtime(config, spark).run()
    assert table_state(spark, TableRef(config.bindings[0].table), config.pipeline_id).txn_version == 1
    assert sorted(table_rows(spark, config.bindings[0].table, ["id"])) == [(1,), (2,)]


def test_a_session_that_refuses_the_txn_confs_stops_before_anything_is_committed(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from pyspark.sql.conf import RuntimeConfig

    from materializer.delta import TXN_APP_ID
    from materializer.runtime import Runtime

    config = _config(tmp_path)
    original = RuntimeConfig.set

    def refuse(self: Any, key: str, value: Any) -> None:
        if key == TXN_APP_ID:
            raise RuntimeError(f"[CONFIG_NOT_AVAILABLE] Configuration {key} is not available.")
        original(self, key, value)

    monkeypatch.setattr(RuntimeConfig, "set", refuse)
    with pytest.raises(TxnNotRecordedError, match=r"refuses the Spark conf spark\.databricks\.delta\.write\.txnAppId"):
        Runtime(config, spark).run()
    assert _log_epochs(config) is None
    assert not (tmp_path / "t").exists()
