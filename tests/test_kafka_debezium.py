"""Debezium events keep their ``source`` block as ``_meta.source`` (for ``sequence_by``), never landed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.runtime import Runtime
from materializer.sources.kafka.source import KafkaSource, KafkaReader
from materializer.storage import open_store
from tests.helpers import table_rows, write_config
from tests.kafka_broker import Broker
from tests.test_kafka import kafka_binding


def _event(op: str, before: Any, after: Any, source: Any, envelope: bool = False) -> bytes:
    body = {"before": before, "after": after, "op": op, "source": source, "ts_ms": 0}
    return json.dumps({"schema": {"type": "struct"}, "payload": body} if envelope else body).encode()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_the_source_block_is_under_meta_source_and_the_table_and_its_order_are_unchanged(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    broker.create_topic("dbz-src", 2)
    postgres = {"connector": "postgresql", "lsn": 2000, "txId": 7}
    mysql = {"connector": "mysql", "file": "binlog.000003", "pos": 154}
    messages = [
        (b"1", _event("c", None, {"id": 1, "name": "a"}, postgres), 0),
        (b"2", _event("r", None, {"id": 2, "name": "b"}, mysql, envelope=True), 1),
        # A later offset with a lower lsn: without sequence_by, (partition, offset) order decides.
        (b"1", _event("u", {"id": 1, "name": "a"}, {"id": 1, "name": "a2"}, {**postgres, "lsn": 1000}), 0),
        (b"2", _event("d", {"id": 2, "name": "b"}, None, {**mysql, "pos": 300}), 1),
        (b"3", _event("c", None, {"id": 3, "name": "c"}, None), 1),  # no source block: no _meta
    ]
    broker.produce("dbz-src", messages)
    table = tmp_path / "tables" / "d"
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "d", "dbz-src", table, payload="debezium")]))
    binding = config.bindings[0]

    # What the documents' checks see: the event's source block under _meta.source.
    source = KafkaSource(binding, open_store(config.staging))
    plan = source.plan(None, 100)
    reader = KafkaReader(spark, source.where, binding.key, source.declared_schema(spark), None, "debezium")
    parsed = reader.parsed(source.records(spark, plan))
    seen = {
        (r["p"], r["o"]): (r["source"], r["op"], r["id"])
        for r in parsed.select(
            F.col("_seq.partition").alias("p"), F.col("_seq.offset").alias("o"),
            F.to_json(F.try_variant_get("__v", "$._meta.source", "variant")).alias("source"),
            F.try_variant_get("__v", "$._meta.op", "string").alias("op"),
            F.try_variant_get("__v", "$.id", "bigint").alias("id"),
        ).collect()
    }
    assert {k: (json.loads(v[0]) if v[0] else None, v[1], v[2]) for k, v in seen.items()} == {
        (0, 0): (postgres, None, 1),
        (0, 1): ({**postgres, "lsn": 1000}, None, 1),
        (1, 0): (mysql, None, 2),
        (1, 1): ({**mysql, "pos": 300}, "d", 2),
        (1, 2): (None, None, 3),
    }

    Runtime(config, spark).run()
    # _meta is read, never landed; the later offset wins whatever its lsn.
    assert table_rows(spark, table, ["id"]) == {(1,): {"id": 1, "name": "a2"}, (3,): {"id": 3, "name": "c"}}
    assert sorted(spark.read.format("delta").load(str(table)).columns) == ["id", "name"]


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_sequence_by_the_lsn_orders_debezium_changes_across_partitions_and_epochs(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """``sequence_by: [_meta.source.lsn]``: the highest LSN wins within an epoch whatever the
    offsets, and a late, older change (an update or a delete) in a later epoch changes nothing."""
    broker.create_topic("dbz-seq", 2)
    pg = {"connector": "postgresql"}
    first = [
        # Key 1 in both partitions (a re-partitioned topic): the higher LSN is at the lower offset.
        (b"1", _event("u", None, {"id": 1, "name": "new"}, {**pg, "lsn": 3000}), 0),
        (b"1", _event("u", None, {"id": 1, "name": "old"}, {**pg, "lsn": 2000}), 1),
        (b"2", _event("c", None, {"id": 2, "name": "b"}, {**pg, "lsn": 2500}), 1),
    ]
    broker.produce("dbz-seq", first)
    table = tmp_path / "tables" / "s"
    binding = {**kafka_binding(broker, "s", "dbz-seq", table, payload="debezium"), "sequence_by": ["_meta.source.lsn"]}
    config = load_config(write_config(tmp_path, [binding]))
    Runtime(config, spark).run()
    assert {k: v["name"] for k, v in _live(spark, table).items()} == {1: "new", 2: "b"}

    late = [
        (b"1", _event("u", None, {"id": 1, "name": "stale"}, {**pg, "lsn": 1000}), 1),
        (b"2", _event("d", {"id": 2, "name": "b"}, None, {**pg, "lsn": 100}), 0),  # older than the row
        (b"3", _event("c", None, {"id": 3, "name": "c"}, {**pg, "lsn": 4000}), 0),
    ]
    broker.produce("dbz-seq", late)
    Runtime(config, spark).run()
    assert {k: v["name"] for k, v in _live(spark, table).items()} == {1: "new", 2: "b", 3: "c"}
    # _meta never lands; the table keeps the sequence it compares with.
    columns = spark.read.format("delta").load(str(table)).columns
    assert "_meta" not in columns and "__sequence" in columns


def _live(spark: Any, table: Path) -> dict[int, dict[str, Any]]:
    rows = spark.read.format("delta").load(str(table)).where("NOT coalesce(__deleted, false)").collect()
    return {r["id"]: r.asDict() for r in rows}
