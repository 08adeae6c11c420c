"""Kafka epochs bounded by bytes (``source.max_bytes``): the cut in plain Python, then a broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config, parse_config
from materializer.errors import ConfigError
from materializer.runtime import Runtime
from materializer.sources.kafka.source import Plan, byte_budgets, cut_by_bytes
from tests.helpers import table_rows, write_config
from tests.kafka_broker import Broker
from tests.test_kafka import _source, kafka_binding, log_entries, oracle, produce


def test_bytes_are_shared_like_records_and_an_epoch_takes_at_least_one_record() -> None:
    plan = Plan(ranges={("t", 0): (10, 40), ("t", 1): (0, 10)}, positions={("t", 0): 40, ("t", 1): 10, ("t", 2): 7}, lag=5)
    assert byte_budgets(plan, 4000) == {("t", 0): 3000, ("t", 1): 1000}
    cut = cut_by_bytes(plan, {("t", 0): 12, ("t", 1): 10})
    assert cut.ranges == {("t", 0): (10, 22), ("t", 1): (0, 10)}
    assert cut.positions == {("t", 0): 22, ("t", 1): 10, ("t", 2): 7} and cut.lag == 5 + 18
    # Nothing fits (one record larger than its share): the first record of the first partition.
    one = cut_by_bytes(plan, {})
    assert one.ranges == {("t", 0): (10, 11)} and one.positions[("t", 1)] == 0 and one.records == 1
    assert cut_by_bytes(plan, {("t", 1): 1}).ranges == {("t", 1): (0, 1)}


def test_max_bytes_is_for_kafka_but_not_its_cdcv2_payload() -> None:
    source = parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", max_bytes=1000), "x").bindings[0].source
    assert source.kafka_max_bytes == 1000
    assert parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a"), "x").bindings[0].source.kafka_max_bytes is None
    with pytest.raises(ConfigError, match="max_bytes for documents and kafka"):
        parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", payload="cdcv2", max_bytes=1000), "x")


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_max_bytes_bounds_each_epoch_and_a_record_larger_than_it_still_passes(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("sized", 2)
    docs: list[dict[str, Any]] = [{"id": i % 9, "v": i, "pad": "x" * 60} for i in range(40)]
    docs.insert(20, {"id": 4, "v": 1000, "pad": "y" * 3000})  # alone larger than max_bytes
    produce(broker, "sized", docs, 2)
    sizes = {(d["id"] % 2, n): len(json.dumps(d)) + len(str(d["id"])) for n, d in enumerate(docs)}
    table = tmp_path / "tables" / "sized"
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "sized", "sized", table, max_bytes=1200)]))
    summary = Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == oracle(docs)
    # Every epoch holds at most max_bytes of keys and values, except the one of the large record alone.
    per_partition = {p: [s for (q, _), s in sorted(sizes.items(), key=lambda i: i[0][1]) if q == p] for p in (0, 1)}
    entries = log_entries(config)
    for epoch in summary.epochs:
        ranges = entries[epoch.epoch].runtime_checkpoint["sized"]["range"]["sized"]
        taken = [per_partition[int(p)][a:b] for p, (a, b) in ranges.items()]
        total = sum(sum(t) for t in taken)
        assert total <= 1200 or [len(t) for t in taken] == [1], (epoch.epoch, ranges, total)
    assert len(summary.epochs) >= 4
