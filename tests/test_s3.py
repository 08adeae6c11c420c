"""A pipeline whose source, staging area, recovery log and Delta table all live on S3.

The S3 server is moto's, over HTTP on loopback (port 0). The CLI runs in a subprocess (its own JVM,
with hadoop-aws from the Ivy cache) and is killed with SIGKILL inside the MERGE of epoch 2; the rerun
must finish the pipeline, and the table must equal the plain-Python oracle, with one Delta commit
per epoch. The table is then copied from S3 to a local folder and read with the shared session
(which has no s3a jars): a Delta table's log names its files relatively, so the copy is the table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.recovery_log import RecoveryLog
from materializer.storage import open_store
from tests.helpers import assert_tables_equal_oracle, binding, run_cli, write_config, write_jsonl
from tests.s3server import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.crash]


def _documents(folder: Path) -> None:
    # 14 documents in 3 files, one file per epoch; updates and deletes cross epoch boundaries.
    write_jsonl(folder / "orders-001.jsonl", [
        {"id": 1, "status": "new", "total": 10},
        {"id": 2, "status": "new", "total": 20},
        {"id": 3, "status": "new", "total": 30},
        {"id": 1, "status": "paid", "total": 11},
        {"id": 4, "status": "new", "total": 40},
        {"id": 2, "_meta": {"op": "d"}},
    ])
    write_jsonl(folder / "orders-002.jsonl", [
        {"id": 5, "status": "new", "total": 50},
        {"id": 3, "status": "shipped", "total": 31},
        {"id": 2, "status": "new again", "total": 21},
        {"id": 6, "status": "new", "total": 60},
        {"id": 4, "_meta": {"op": "d"}},
    ])
    write_jsonl(folder / "orders-003.jsonl", [
        {"id": 1, "status": "shipped", "total": 12},
        {"id": 7, "status": "new", "total": 70},
        {"id": 5, "status": "paid", "total": 51},
    ])


def _download(store_uri: str, folder: Path) -> Path:
    store = open_store(store_uri)
    for info in store.list():
        target = folder / info.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.get(info.path))
    return folder


def _txn_versions(table: Path, app_id: str) -> list[int]:
    """The txn versions of the table's commits for ``app_id``, read from the Delta log itself."""
    found = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action and action["txn"]["appId"] == app_id:
                found.append(int(action["txn"]["version"]))
    return found


@pytest.mark.slow
def test_s3_pipeline_killed_mid_apply_finishes_exactly_once(
    spark: Any, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    bucket = s3_server.create_bucket()
    local_source = tmp_path / "source"
    _documents(local_source)
    source = open_store(f"s3://{bucket}/input/orders")
    for path in sorted(local_source.iterdir()):
        assert source.put_if_absent(path.name, path.read_bytes())

    config = write_config(
        tmp_path,
        # the source as s3://, the table as s3a://: both schemes are accepted
        [binding("orders", f"s3://{bucket}/input/orders", f"s3a://{bucket}/tables/orders", max_files=1)],  # type: ignore[arg-type]
        pipeline_id="orders-s3",
        recovery_log=f"s3://{bucket}/pipelines/orders-s3/log",
        staging=f"s3://{bucket}/pipelines/orders-s3/staging",
    )

    crashed = run_cli("run", "--config", str(config), env={**s3_server.env, "MATERIALIZER_CRASH_AT": "mid-apply:2"})
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    log = RecoveryLog(open_store(f"s3://{bucket}/pipelines/orders-s3/log"), "orders-s3")
    # killed inside epoch 2's MERGE: epoch 2 is committed to the log, the table records epoch 1
    assert log.read().last_epoch == 2
    staging = open_store(f"s3://{bucket}/pipelines/orders-s3/staging/orders-s3")  # the pipeline's own area
    assert staging.list("staged"), "epoch 2's staged file must survive the crash"
    crashed_table = _download(f"s3://{bucket}/tables/orders", tmp_path / "orders-after-crash")
    assert _txn_versions(crashed_table, "orders-s3") == [1]

    rerun = run_cli("run", "--config", str(config), "--json", env=s3_server.env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert summary["opened_at_epoch"] == 2
    assert [r["status"] for r in summary["reapplied"]["results"]] == ["applied"]  # the re-apply after Open
    assert summary["last_epoch"] == 3

    # nothing staged is orphaned, the log ends at epoch 3
    assert staging.list("staged") == []
    assert log.read().last_epoch == 3

    table = _download(f"s3://{bucket}/tables/orders", tmp_path / "orders-copy")
    assert_tables_equal_oracle(spark, config, tables={"orders": table})
    # exactly once: one commit per epoch, in order, none replayed
    assert _txn_versions(table, "orders-s3") == [1, 2, 3]
