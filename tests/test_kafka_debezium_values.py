"""Debezium's special values on a real broker: placeholders of values it does not have keep the
stored value, and Kafka Connect's ``{"schema": null, "payload": null}`` is a tombstone."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config, parse_config
from materializer.errors import ConfigError, SourceError
from materializer.runtime import Runtime
from tests.helpers import table_rows, write_config
from tests.kafka_broker import Broker, broker  # noqa: F401 - the session fixture
from tests.test_kafka import _source, kafka_binding
from tests.test_kafka_transactions import delta_rs_rows

UNAVAILABLE = "__debezium_unavailable_value"
UNAVAILABLE_BYTES = base64.b64encode(UNAVAILABLE.encode()).decode()


def _event(op: str, before: Any, after: Any, envelope: bool = False) -> bytes:
    body = {"before": before, "after": after, "op": op, "source": {"lsn": 1}, "ts_ms": 0}
    return json.dumps({"schema": {"type": "struct"}, "payload": body} if envelope else body).encode()


def test_the_placeholder_is_configurable_for_the_debezium_payload_only() -> None:
    source = parse_config(_source(format="kafka", bootstrap_servers="h", topic="a", payload="debezium", unavailable_value="?"), "x")
    assert source.bindings[0].source.unavailable_value == "?" and source.bindings[0].placeholders_kept
    with pytest.raises(ConfigError, match="unavailable_value is for payload debezium"):
        parse_config(_source(format="kafka", bootstrap_servers="h", topic="a", unavailable_value="?"), "x")


@pytest.mark.kafka
@pytest.mark.spark
def test_placeholders_keep_the_stored_value_and_a_null_envelope_is_a_tombstone(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("toast", 1)
    broker.create_topic("toast-custom", 1)
    first = [
        _event("c", None, {"id": 1, "name": "a", "doc": "long text", "n": 5, "blob": "AQI="}),
        _event("r", None, {"id": 2, "name": "b", "doc": "t2", "n": 6, "blob": None}, envelope=True),
        _event("c", None, {"id": 5, "name": "e", "doc": "t5", "n": 1, "blob": None}),
    ]
    broker.produce("toast", [(None, v, 0) for v in first])
    broker.produce("toast-custom", [(None, _event("c", None, {"id": 1, "doc": "kept"}), 0)])
    tables = tmp_path / "tables"
    config = load_config(write_config(tmp_path, [
        kafka_binding(broker, "toast", "toast", tables / "toast", payload="debezium"),
        kafka_binding(broker, "custom", "toast-custom", tables / "custom", payload="debezium", unavailable_value="<none>"),
    ]))
    Runtime(config, spark).run()

    second = [
        # Unchanged TOASTed columns: text and bytes placeholders keep what the table holds.
        _event("u", None, {"id": 1, "name": "a2", "doc": UNAVAILABLE, "n": 7, "blob": UNAVAILABLE_BYTES}),
        _event("u", None, {"id": 2, "name": "b2", "doc": UNAVAILABLE, "n": 8, "blob": None}, envelope=True),
        _event("u", None, {"id": 2, "name": "b3", "doc": UNAVAILABLE, "n": 9, "blob": None}),
        # A new key whose value is unavailable: nothing stored to keep, NULL.
        _event("c", None, {"id": 3, "name": "c", "doc": UNAVAILABLE, "n": 1, "blob": None}),
        # A value in the epoch, then a placeholder: the epoch's own value.
        _event("c", None, {"id": 4, "name": "d", "doc": "x", "n": 1, "blob": None}),
        _event("u", None, {"id": 4, "name": "d2", "doc": UNAVAILABLE, "n": 2, "blob": None}),
        # A delete wipes the stored value: a placeholder after it is NULL, not the old value.
        _event("d", {"id": 5}, None),
        b'{"schema": null, "payload": null}',  # Kafka Connect's tombstone after the delete
        _event("c", None, {"id": 5, "name": "e2", "doc": UNAVAILABLE, "n": 2, "blob": None}),
    ]
    broker.produce("toast", [(None, v, 0) for v in second])
    broker.produce("toast-custom", [(None, _event("u", None, {"id": 1, "doc": "<none>"}), 0)])
    summary = Runtime(config, spark).run()
    assert [e.documents for e in summary.epochs] == [{"toast": 8, "custom": 1}]  # the null envelope passed over
    expected = {
        1: {"id": 1, "name": "a2", "doc": "long text", "n": 7, "blob": "AQI="},
        2: {"id": 2, "name": "b3", "doc": "t2", "n": 9},
        3: {"id": 3, "name": "c", "n": 1},
        4: {"id": 4, "name": "d2", "doc": "x", "n": 2},
        5: {"id": 5, "name": "e2", "n": 2},
    }
    assert {k[0]: r for k, r in table_rows(spark, tables / "toast", ["id"]).items()} == expected
    assert delta_rs_rows(tables / "toast") == expected
    assert delta_rs_rows(tables / "custom") == {1: {"id": 1, "doc": "kept"}}
    assert UNAVAILABLE not in json.dumps(list(delta_rs_rows(tables / "toast").values()))
    # Nothing of the materializer's own lands.
    assert sorted(spark.read.format("delta").load(str(tables / "toast")).columns) == ["blob", "doc", "id", "n", "name"]


@pytest.mark.kafka
@pytest.mark.spark
def test_a_placeholder_in_a_key_or_outside_mode_standard_is_refused_naming_the_record(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    broker.create_topic("toast-bad", 1)
    broker.produce("toast-bad", [
        (None, _event("c", None, {"id": 1, "doc": "a"}), 0),
        (None, _event("u", None, {"id": 1, "doc": UNAVAILABLE}), 0),
    ])
    history = {**kafka_binding(broker, "h", "toast-bad", tmp_path / "h", payload="debezium"), "mode": "scd2"}
    config = load_config(write_config(tmp_path, [history]))
    with pytest.raises(SourceError, match="topic toast-bad partition 0 offset 1: Debezium's placeholder .* in field\\(s\\) doc: only mode standard"):
        Runtime(config, spark).run()
    broker.produce("toast-bad", [(None, _event("u", None, {"id": UNAVAILABLE, "doc": "b"}), 0)])
    (tmp_path / "s").mkdir()
    config = load_config(write_config(tmp_path / "s", [kafka_binding(broker, "s", "toast-bad", tmp_path / "s" / "t", payload="debezium")]))
    with pytest.raises(SourceError, match="offset 2: key field\\(s\\) hold Debezium's placeholder"):
        Runtime(config, spark).run()

