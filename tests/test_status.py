"""``materializer status`` reads path tables with delta-rs: no JVM, well under a second."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.delta import TableRef, read_txn_without_spark, table_state
from materializer.runtime import Runtime
from materializer.tools.status import pipeline_status
from tests.helpers import binding, run_cli, write_config, write_jsonl

pytestmark = pytest.mark.spark


def _no_spark() -> Any:
    raise AssertionError("status started Spark for a path table")


def test_status_of_path_tables_needs_no_spark_and_agrees_with_it(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for n in range(3):  # one file per epoch: three epochs
        write_jsonl(src / f"a-{n}.jsonl", [{"id": i, "v": i * n} for i in range(n, n + 3)])
    config = load_config(
        write_config(
            tmp_path,
            [
                binding("items", src, tmp_path / "tables" / "items", max_files=1),
                binding("never", tmp_path / "empty", tmp_path / "tables" / "never"),
            ],
            pipeline_id="fast-status",
        )
    )
    (tmp_path / "empty").mkdir()
    Runtime(config, spark).run()
    for table in (tmp_path / "tables" / "items", tmp_path / "tables" / "never"):
        ref = TableRef(str(table))
        assert read_txn_without_spark(ref, "fast-status") == table_state(spark, ref, "fast-status")
    assert read_txn_without_spark(TableRef(str(tmp_path / "tables" / "items")), "another-pipeline").txn_version is None
    assert read_txn_without_spark(TableRef("main.sales.orders"), "fast-status") is None  # a catalog name: Spark's

    st = pipeline_status(config, _no_spark)
    assert st.last_epoch == 3 and st.agrees
    items, never = st.tables
    assert (items.exists, items.recorded_epoch, items.note) == (True, 3, "up to date")
    assert (never.exists, never.recorded_epoch) == (False, None)

    # The command, in a process of its own: no JVM, so it answers in well under the JVM's start-up.
    started = time.monotonic()
    result = run_cli("status", "--config", str(tmp_path / "pipeline.yaml"), "--json", timeout=120, jvm=False)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["tables"][0]["recorded_epoch"] == 3
    assert result.stderr == ""
    assert elapsed < 5, elapsed  # about 0.3 s idle; a JVM start alone is 10+ s on this machine


@pytest.mark.spark
def test_a_binding_without_rows_in_an_epoch_gets_no_commit_and_its_table_is_up_to_date(spark: Any, tmp_path: Path) -> None:
    """An epoch commits to the tables of the bindings it has rows for, and to no other (an empty
    commit per idle table per epoch cost a Delta commit each: seconds per binding in a fleet of
    tables). The idle table records its last epoch with rows; status, the progress record and a
    replay after a kill in the next epoch's apply all agree, and delta-rs reads the same rows."""
    from deltalake import DeltaTable

    from materializer.progress import ListCollector
    from tests.helpers import delta_rs_rows
    from tests.test_holes import Killed, config_with

    tables = tmp_path / "tables"
    write_jsonl(tmp_path / "a" / "1.jsonl", [{"id": 1, "v": "a1"}])
    write_jsonl(tmp_path / "b" / "1.jsonl", [{"id": 1, "v": "b1"}])
    config = config_with(tmp_path, [binding(n, tmp_path / n, tables / n) for n in ("a", "b")], pipeline_id="idle")
    Runtime(config, spark).run()
    write_jsonl(tmp_path / "a" / "2.jsonl", [{"id": 2, "v": "a2"}])
    collector = ListCollector()
    Runtime(config, spark, collector).run()
    assert DeltaTable(str(tables / "b")).version() == 0 and DeltaTable(str(tables / "b")).transaction_version("idle") == 1
    assert DeltaTable(str(tables / "a")).transaction_version("idle") == 2
    record = collector.named("progress")[-1]["record"]
    assert [(b.binding, b.status) for b in record.bindings] == [("a", "applied"), ("b", "empty")]
    st = pipeline_status(config, _no_spark)
    assert st.agrees and [t.note for t in st.tables] == ["up to date", "up to date (its last rows: epoch 1)"]

    # Epoch 3 has rows for b only; killed in its apply, then run again: b applied once, a untouched.
    write_jsonl(tmp_path / "b" / "3.jsonl", [{"id": 3, "v": "b3"}])
    runtime = Runtime(config, spark)
    acknowledge = runtime.driver.acknowledge

    def killed(message: Any) -> Any:
        if message.epoch == 3:
            raise Killed("killed before epoch 3's apply")
        return acknowledge(message)

    runtime.driver.acknowledge = killed  # type: ignore[method-assign]
    with pytest.raises(Killed):
        runtime.run()
    st = pipeline_status(config, _no_spark)
    assert [t.note for t in st.tables] == [
        "up to date (its last rows: epoch 2)", "epoch 3 is committed, not yet applied: the next run applies it",
    ]
    Runtime(config, spark).run()
    assert pipeline_status(config, _no_spark).agrees
    assert DeltaTable(str(tables / "a")).version() == 1 and DeltaTable(str(tables / "b")).transaction_version("idle") == 3
    assert delta_rs_rows(tables / "a", ["id"]) == {(1,): {"id": 1, "v": "a1"}, (2,): {"id": 2, "v": "a2"}}
    assert delta_rs_rows(tables / "b", ["id"]) == {(1,): {"id": 1, "v": "b1"}, (3,): {"id": 3, "v": "b3"}}


@pytest.mark.usefixtures("s3_env")
def test_an_s3_table_is_read_with_the_aws_environment(s3_bucket: str) -> None:
    # Written by delta-rs itself (no Spark needed): a table whose one commit carries a txn.
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from materializer.delta import delta_rs_storage_options

    options = delta_rs_storage_options(os.environ)
    assert options["aws_endpoint_url"].startswith("http://127.0.0.1") and options["aws_allow_http"] == "true"
    uri = f"s3://{s3_bucket}/tables/items"
    data = pa.table({"id": [1, 2]})
    write_deltalake(uri, data, storage_options=options)
    write_deltalake(
        uri, data, mode="append", storage_options=options,
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id="s3-pipeline", version=7)]),
    )
    # As a binding names it (s3a://), with the credentials and endpoint from the environment only.
    state = read_txn_without_spark(TableRef(f"s3a://{s3_bucket}/tables/items"), "s3-pipeline")
    assert state is not None and (state.exists, state.version, state.txn_version) == (True, 1, 7)
    missing = read_txn_without_spark(TableRef(f"s3a://{s3_bucket}/tables/none"), "s3-pipeline")
    assert missing is not None and not missing.exists
