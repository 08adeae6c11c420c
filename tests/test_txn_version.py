"""The txn version read from the Delta log agrees with Delta's own skipping, on both session kinds.

Delta skips a write whose txnVersion is <= what the snapshot records for the app id. The reader
(:func:`materializer.delta.txn_version`) must give exactly that number: across checkpoints
(``delta.checkpointInterval=2``), after log clean-up removed the commits that set it, and with a
stale ``_last_checkpoint`` hint. The same suite runs on the classic session and on Spark Connect.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.delta import (
    TableRef, read_txn_without_spark, table_state, table_version, txn_version, user_metadata, writers_without_spark,
)
from materializer.delta.txn_log import _complete_checkpoint
from materializer.delta.writers import _writers_from_log

pytestmark = pytest.mark.spark


@pytest.fixture(params=["classic", pytest.param("connect", marks=pytest.mark.connect)])
def session(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("spark" if request.param == "classic" else "connect_spark")


def _write(spark: Any, table: Path, app: str, version: int) -> None:
    (
        spark.createDataFrame([(version, app)], "id BIGINT, app STRING")
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app)
        .option("txnVersion", str(version))
        .option("userMetadata", user_metadata(app, f"binding-{version % 2}", version))  # the tags Open reads
        .save(str(table))
    )


def _check(spark: Any, table: Path, model: dict[str, int]) -> None:
    ref = TableRef(str(table))
    for app in list(model) + ["never-wrote"]:
        assert txn_version(spark, ref, app) == model.get(app), app
        _agree(spark, ref, app)
    # Open's writers check reads the log's tags and txn ids in Python where it can: the same as Spark's reader.
    log = str(table / "_delta_log")
    spark_read, python_read = _writers_from_log(spark, log), writers_without_spark(log)
    assert python_read == spark_read
    assert set(python_read.app_ids) == set(model), python_read
    # Delta's own answer: a write at the recorded version is skipped (no new table version).
    for app, recorded in model.items():
        before = table_version(spark, ref)
        _write(spark, table, app, recorded)
        assert table_version(spark, ref) == before, f"Delta applied {app}@{recorded}: the reader's answer is wrong"


def test_txn_version_is_what_delta_skips_across_checkpoints_and_log_clean_up(session: Any, tmp_path: Path) -> None:
    table = tmp_path / "t"
    log = table / "_delta_log"
    session.sql(
        f"CREATE TABLE delta.`{table}` (id BIGINT, app STRING) USING delta "
        "TBLPROPERTIES ('delta.checkpointInterval' = '2', 'delta.logRetentionDuration' = 'interval 1 days', 'delta.deletedFileRetentionDuration' = 'interval 1 days')"
    )
    model: dict[str, int] = {}
    for app, version in [("a", 1), ("b", 5), ("a", 3), ("c", 2), ("a", 4)]:
        _write(session, table, app, version)
        model[app] = version
    assert list(log.glob("*.checkpoint.parquet")), "no checkpoint was written"
    _check(session, table, model)

    # Log clean-up: make every log file older than the retention, then commit past a checkpoint;
    # Delta deletes the commits before the last expired checkpoint (b's and c's included).
    old = time.time() - 5 * 86400
    for f in log.iterdir():
        if f.is_file():
            os.utime(f, (old, old))
    for version in (6, 7, 8):
        _write(session, table, "a", version)
        model["a"] = version
    assert not (log / f"{0:020d}.json").exists(), "the log was not cleaned up"
    assert not (log / f"{2:020d}.json").exists()
    _check(session, table, model)

    # A stale hint: _last_checkpoint names a checkpoint whose later commits are gone.
    (log / "_last_checkpoint").write_text(json.dumps({"version": 2, "size": 1}))
    assert txn_version(session, TableRef(str(table)), "b") == 5
    assert txn_version(session, TableRef(str(table)), "a") == 8
    state = table_state(session, TableRef(str(table)), "c")
    assert (state.exists, state.txn_version) == (True, 2)


def _agree(spark: Any, ref: TableRef, app: str, *, must_answer: bool = False) -> None:
    """delta-rs (the per-apply fast path) and the Spark log reader give the same state, or delta-rs
    declines (None) and Spark answers; never a different number."""
    slow = table_state(spark, ref, app, spark_only=True)
    fast = read_txn_without_spark(ref, app)
    if must_answer:
        assert fast is not None, "delta-rs could not read a plain local table"
    if fast is not None:
        assert (fast.exists, fast.version, fast.txn_version) == (slow.exists, slow.version, slow.txn_version), app
    both = table_state(spark, ref, app)
    assert (both.exists, both.version, both.txn_version) == (slow.exists, slow.version, slow.txn_version), app


@pytest.mark.slow
def test_delta_rs_and_the_spark_log_reader_agree_across_checkpoints(spark: Any, tmp_path: Path) -> None:
    """The per-apply pre-check reads path tables with delta-rs first; it must read the same txn
    actions as the Spark reader: from the checkpoint's ``txn`` column and the commits after it."""
    table = tmp_path / "t"
    spark.sql(
        f"CREATE TABLE delta.`{table}` (id BIGINT, app STRING) USING delta TBLPROPERTIES ('delta.checkpointInterval' = '2')"
    )
    ref = TableRef(str(table))
    for app, version in [("a", 1), ("b", 5), ("a", 3), ("c", 2), ("a", 4), ("b", 9), ("a", 7)]:
        _write(spark, table, app, version)
        for name in ("a", "b", "c", "never-wrote"):
            _agree(spark, ref, name, must_answer=True)
    assert list((table / "_delta_log").glob("*.checkpoint.parquet")), "no checkpoint was written"
    state = read_txn_without_spark(ref, "b")
    assert state is not None and (state.exists, state.version, state.txn_version) == (True, 7, 9)


def test_no_table_records_nothing(session: Any, tmp_path: Path) -> None:
    state = table_state(session, TableRef(str(tmp_path / "none")), "p")
    assert (state.exists, state.version, state.txn_version) == (False, None, None)


def test_the_newest_complete_checkpoint_is_found_by_its_file_names() -> None:
    """Spark cannot read ``_last_checkpoint`` (its file sources skip names starting with "_"), so
    the reader lists the checkpoints: a multi-part one missing a part is passed over (still being
    written), a V2 one is named so its JSON can be read, none past the version asked for."""
    v = lambda n: f"{n:020d}"  # noqa: E731
    names = [
        f"{v(10)}.checkpoint.parquet",
        f"{v(20)}.checkpoint.0000000001.0000000002.parquet",
        f"{v(20)}.checkpoint.0000000002.0000000002.parquet",
        f"{v(30)}.checkpoint.0000000001.0000000003.parquet",  # 2 of 3 parts missing
        f"{v(25)}.json",
        "_last_checkpoint",
    ]
    assert _complete_checkpoint(names, 40) == (20, None)
    assert _complete_checkpoint(names, 19) == (10, None)
    assert _complete_checkpoint(names, 9) is None
    uuid_json = f"{v(40)}.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json"
    assert _complete_checkpoint(names + [uuid_json], 40) == (40, uuid_json)
    assert _complete_checkpoint(names + [uuid_json], 39) == (20, None)
