"""``materializer drill`` on a kafka pipeline: real SIGKILLs of the real CLI reading a real broker;
the oracle reads the topic with confluent-kafka's consumer, the tables are read with delta-rs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import parse_config
from materializer.tools.oracle_kafka import documents_of
from tests.helpers import write_config
from tests.kafka_broker import Broker
from tests.test_drill import _drill
from tests.test_kafka import _source, kafka_binding, produce, wave


def test_the_oracle_turns_each_payload_into_documents_without_spark() -> None:
    def binding(**source: Any) -> Any:
        return parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="t", **source), "x").bindings[0]

    records = [("t", 0, 0, b"1", b'{"id": 1, "v": 1}'), ("t", 0, 1, b"1", None)]
    assert documents_of(binding(key_from="message"), records) == [
        (("t", 0), {"id": 1, "v": 1}), (("t", 0), {"_meta": {"op": "d"}, "id": 1}),
    ]
    events = [
        ("t", 1, 0, b"2", json.dumps({"schema": {}, "payload": {"op": "c", "before": None, "after": {"id": 2}}}).encode()),
        ("t", 1, 1, b"2", json.dumps({"op": "d", "before": {"id": 2}, "after": None}).encode()),
        ("t", 1, 2, b"2", None),
    ]
    assert documents_of(binding(payload="debezium"), events) == [
        (("t", 1), {"id": 2}), (("t", 1), {"_meta": {"op": "d"}, "id": 2}),
    ]


def _pipeline(broker: Broker, tmp_path: Path, topic: str, partitions: int, count: int) -> Path:
    """A topic with deletes produced in two waves (the second after a partition is added), keys
    each in one partition; the pipeline's own tables under ``prod`` (the drill never touches them)."""
    broker.create_topic(topic, partitions)
    produce(broker, topic, wave(0, count, range(40), seed=1), partitions)
    broker.add_partitions(topic, partitions + 1)
    produce(broker, topic, wave(count, count // 2, range(40), seed=2) + wave(2 * count, 20, range(100, 110), seed=3),
            partitions, pinned={k: partitions for k in range(100, 110)})
    (tmp_path / "prod").mkdir()
    return write_config(tmp_path / "prod", [kafka_binding(broker, "orders", topic, tmp_path / "prod" / "tables" / "orders")])


def _assert_clean(data: dict[str, Any]) -> None:
    assert data["verdict"] == "pass", data
    assert data["rows"] == {"lost": 0, "duplicated": 0, "wrong": 0}
    for rnd in data["rounds"]:
        assert rnd["problems"] == [] and rnd["orphans"] == []
        for table in rnd["tables"]:
            assert table["verified"] and table["epochs_applied_twice"] == [] and table["problems"] == []
            assert table["recorded_epoch"] == rnd["last_epoch"] and table["expected_rows"] > 0


@pytest.mark.kafka
@pytest.mark.drill
def test_a_kill_in_the_merge_of_an_epoch_from_the_topic_and_the_drill_passes(broker: Broker, tmp_path: Path) -> None:
    """The short variant: one kill, the drain, the verification; ~5 min on the shared 2 cores
    (three JVM starts), too long for the kafka tier, hence ``drill``."""
    path = _pipeline(broker, tmp_path, "drill-short", 2, 120)
    result, data = _drill(tmp_path, path, "--points", "mid-apply:2", "--kills", "0", "--max-documents", "60",
                          "--reader", "deltalake", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    _assert_clean(data)
    assert data["kills"] == {"mid-apply:2": 1}, data["kills"]
    assert not (tmp_path / "prod" / "tables").exists()


@pytest.mark.kafka
@pytest.mark.drill
def test_drill_every_point_and_random_kills_on_a_topic(broker: Broker, tmp_path: Path) -> None:
    path = _pipeline(broker, tmp_path, "drill-long", 3, 400)
    result, data = _drill(tmp_path, path, "--kills", "6", "--seed", "3", "--max-documents", "80",
                          "--reader", "deltalake", timeout=5400)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    _assert_clean(data)
    assert sum(n for k, n in data["kills"].items() if k.startswith("random")) >= 5, data["kills"]
