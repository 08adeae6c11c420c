"""Transactional producers on a real broker: only committed records land (``read_committed`` by
default), an open transaction holds the epoch at its start, and a range of nothing but aborted
records and transaction markers is an empty epoch, for every payload.

Tables are read with Spark and with delta-rs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config, parse_config
from materializer.delta import TableRef, history
from materializer.errors import ConfigError
from materializer.runtime import Runtime
from materializer.sources.kafka.source import Offsets
from tests.helpers import run_cli, table_rows, write_config
from tests.kafka_broker import Broker
from tests.test_kafka import _source, kafka_binding, log_entries


def delta_rs_rows(table: Path, key: str = "id") -> dict[Any, dict[str, Any]]:
    """The table as delta-rs reads it (an independent reader): {key: row without NULLs}."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    reader = QueryBuilder().register("t", DeltaTable(str(table))).execute("SELECT * FROM t")
    rows = pa.RecordBatchReader.from_stream(reader).read_all().to_pylist()
    out = {r[key]: {k: v for k, v in r.items() if v is not None} for r in rows}
    assert len(out) == len(rows), f"a key appears twice in {table}"
    return out


def _doc(i: int, v: Any, partitions: int = 2) -> tuple[bytes, bytes, int]:
    return str(i).encode(), json.dumps({"id": i, "v": v}).encode(), i % partitions


def test_the_isolation_level_is_read_committed_unless_read_uncommitted_is_asked() -> None:
    from materializer.sources.kafka.source import isolation_level

    assert isolation_level({}) == "read_committed"
    assert isolation_level({"kafka.isolation.level": "READ_UNCOMMITTED"}) == "read_uncommitted"
    parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", options={"kafka.isolation.level": "read_uncommitted"}), "x")
    with pytest.raises(ConfigError, match="is not an isolation level"):
        parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", options={"kafka.isolation.level": "committed"}), "x")


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.crash
def test_aborted_and_open_transactions_never_land_and_a_kill_mid_apply_replays_the_committed_range(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    broker.create_topic("txn", 2)
    broker.transaction("txn", [_doc(1, 1), _doc(2, 1)], "commit")
    broker.transaction("txn", [_doc(1, 44), _doc(3, 44), _doc(4, 44)], "abort")
    broker.produce("txn", [_doc(5, 1)])  # no transaction
    still_open = broker.transaction("txn", [_doc(6, 6), _doc(1, 99)], None)
    broker.produce("txn", [_doc(7, 1)])  # after the open transaction's first record: held with it
    table = tmp_path / "tables" / "t"
    path = write_config(tmp_path, [kafka_binding(broker, "t", "txn", table)])
    config = load_config(path)
    Runtime(config, spark).run()
    expected = {(1,): {"id": 1, "v": 1}, (2,): {"id": 2, "v": 1}, (5,): {"id": 5, "v": 1}}
    assert table_rows(spark, table, ["id"]) == expected
    # The epoch ends at each partition's last stable offset: the open transaction's first record
    # (partition 0: 2, marker, 4, marker, then 6 open; partition 1: 1, marker, 1 and 3 aborted,
    # marker, 5, then 1 open and 7).
    entries = log_entries(config)
    assert entries[max(entries)].runtime_checkpoint["t"]["offsets"] == {"txn": {"0": 4, "1": 6}}
    highs = {p: high for (_, p), (_, high) in Offsets(broker.bootstrap, {}, "test").watermarks(["txn"]).items()}
    assert highs == {0: 5, 1: 8}  # the open records are written, not readable

    # read_uncommitted, asked for explicitly, reads aborted and open records: not exactly once.
    dirty_table = tmp_path / "dirty" / "t"
    (tmp_path / "dirty").mkdir()
    dirty = load_config(write_config(tmp_path / "dirty", [
        kafka_binding(broker, "t", "txn", dirty_table, options={"kafka.isolation.level": "read_uncommitted"})
    ]))
    Runtime(dirty, spark).run()
    assert {k[0]: r["v"] for k, r in table_rows(spark, dirty_table, ["id"]).items()} == {1: 99, 2: 1, 3: 44, 4: 44, 5: 1, 6: 6, 7: 1}

    # The open transaction commits, another aborts after it; the CLI is SIGKILLed in epoch 2's
    # MERGE, and the next run re-applies exactly the committed range.
    still_open.commit_transaction(60)
    broker.transaction("txn", [_doc(2, 45), _doc(8, 45)], "abort")
    broker.produce("txn", [_doc(9, 1)])
    killed = run_cli("run", "--config", str(path), env={"MATERIALIZER_CRASH_AT": "mid-apply:2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    entry = log_entries(config)[2].runtime_checkpoint["t"]
    # To the end of each partition: the commit and abort markers count as read.
    assert entry["range"] == {"txn": {"0": [4, 9], "1": [6, 10]}}
    summary = Runtime(config, spark).run()
    assert summary.reapplied is not None and [r.status for r in summary.reapplied.results] == ["applied"]
    assert summary.epochs == []  # nothing after the markers
    expected = {1: 99, 2: 1, 5: 1, 6: 6, 7: 1, 9: 1}
    assert {k[0]: r["v"] for k, r in table_rows(spark, table, ["id"]).items()} == expected
    assert {k: r["v"] for k, r in delta_rs_rows(table).items()} == expected
    epochs = [h["tag"]["epoch"] for h in history(spark, TableRef(str(table))) if h["tag"]]
    assert epochs == [1, 2]


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_a_range_of_only_aborted_records_and_markers_is_an_empty_epoch_for_every_payload(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    for topic in ("empty-docs", "empty-dbz", "empty-cdc"):
        broker.create_topic(topic, 1)

    def dbz(i: int, name: str) -> tuple[bytes, bytes, int]:
        return str(i).encode(), json.dumps({"before": None, "after": {"id": i, "name": name}, "op": "c", "source": {}}).encode(), 0

    def cdc(i: int, t: int) -> tuple[None, bytes, int]:
        return None, json.dumps({"updates": [[{"id": i, "v": t}, t, 1]]}).encode(), 0

    def progress(lower: int, upper: int, counts: list[list[int]]) -> tuple[None, bytes, int]:
        return None, json.dumps({"progress": {"lower": [lower], "upper": [upper], "counts": counts}}).encode(), 0

    # Five aborted records and their marker: with max_records 2, three epochs of nothing.
    broker.transaction("empty-docs", [_doc(i, 44, 1) for i in range(5)], "abort")
    broker.transaction("empty-dbz", [dbz(1, "aborted")], "abort")
    broker.transaction("empty-cdc", [cdc(1, 0), progress(0, 1, [[0, 1]])], "abort")
    tables = tmp_path / "tables"
    config = load_config(write_config(tmp_path, [
        kafka_binding(broker, "docs", "empty-docs", tables / "docs", max_records=2),
        kafka_binding(broker, "dbz", "empty-dbz", tables / "dbz", payload="debezium"),
        kafka_binding(broker, "cdc", "empty-cdc", tables / "cdc", payload="cdcv2"),
    ]))
    summary = Runtime(config, spark).run()
    assert summary.epochs and all(sum(e.documents.values()) == 0 for e in summary.epochs)
    assert not any((tables / name).exists() for name in ("docs", "dbz", "cdc"))  # nothing applied
    checkpoint = log_entries(config)[summary.last_epoch].runtime_checkpoint
    assert checkpoint["docs"]["offsets"] == {"empty-docs": {"0": 6}}  # past the marker
    assert checkpoint["dbz"]["offsets"] == {"empty-dbz": {"0": 2}}
    # cdcv2's position is its frontier: aborted statements complete no time, so no batch (not an error).
    assert "cdc" not in checkpoint

    # Committed records after them land as usual.
    broker.transaction("empty-docs", [_doc(1, 1, 1)], "commit")
    broker.transaction("empty-dbz", [dbz(2, "b")], "commit")
    # (Kafka Connect's JSON tombstone holds no statement: passed over, as a null value is.)
    broker.transaction("empty-cdc", [cdc(2, 0), (None, b'{"schema": null, "payload": null}', 0), progress(0, 1, [[0, 1]])], "commit")
    Runtime(config, spark).run()
    assert delta_rs_rows(tables / "docs") == {1: {"id": 1, "v": 1}}
    assert delta_rs_rows(tables / "dbz") == {2: {"id": 2, "name": "b"}}
    assert {k: r["v"] for k, r in delta_rs_rows(tables / "cdc").items()} == {2: 0}
