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
from tests.kafka_broker import Broker
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
    # Change-controlled for its placeholders, not by options: the drill's kafka oracle still models it.
    assert source.bindings[0].change_controlled and not source.bindings[0].options_controlled
    with pytest.raises(ConfigError, match="unavailable_value is for payload debezium"):
        parse_config(_source(format="kafka", bootstrap_servers="h", topic="a", unavailable_value="?"), "x")


@pytest.mark.slow
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


@pytest.mark.slow
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


# --- Debezium's semantic types ----------------------------------------------------------------------


def _b64_int(n: int, size: int) -> str:
    return base64.b64encode(n.to_bytes(size, "big", signed=True)).decode()


FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
    {"type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
     "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}], "field": "big"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "born"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "at"},
    {"type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp", "version": 1, "field": "ms"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.NanoTimestamp", "version": 1, "field": "ns"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "version": 1, "field": "t"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "z"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1, "field": "j"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "version": 1, "field": "u"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1, "parameters": {"allowed": "a,b"}, "field": "e"},
    {"type": "bytes", "optional": True, "name": "io.debezium.data.Bits", "version": 1, "parameters": {"length": "16"}, "field": "bits"},
]


def test_the_docs_say_what_every_debezium_type_lands_as() -> None:
    from materializer.sources.kafka.debezium_types import DECODED, TYPES, landing_type
    from tests.helpers import REPO

    readme = (REPO / "docs" / "sources" / "kafka.md").read_text()
    for names, lands_as in TYPES:
        assert f"| {lands_as} |" in readme, names
        for name in names.split(", "):
            assert name.split(" (")[0] in readme, name
    for name in DECODED:
        landing_type(name, {"scale": "2"})  # every decoded type has a landing type


def _typed_event(op: str, before: Any, after: Any) -> bytes:
    row = {"type": "struct", "fields": FIELDS, "optional": True, "name": "db.inv.items.Value"}
    schema = {
        "type": "struct", "name": "db.inv.items.Envelope",
        "fields": [{**row, "field": "before"}, {**row, "field": "after"}, {"type": "string", "field": "op"}],
    }
    return json.dumps({"schema": schema, "payload": {"before": before, "after": after, "op": op, "source": {"lsn": 1}}}).encode()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_debezium_types_land_typed_from_the_envelope_or_source_schema_and_a_bad_value_is_refused(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    import datetime as dt
    from decimal import Decimal

    from deltalake import DeltaTable

    broker.create_topic("dbz-types", 1)
    full = {
        "id": 1, "price": _b64_int(12345, 3), "big": {"scale": 3, "value": _b64_int(-1234567, 4)}, "born": 18262,
        "at": 1620000000123456, "ms": 1620000000123, "ns": 1620000000123456789, "t": 3723000001,
        "z": "2021-05-03T10:15:30.5+02:00", "j": '{"a": 1}', "u": "0e4b5b8e-3f7e-4b58-9d42-6f6f0a3d0a11", "e": "b", "bits": "AQI=",
    }
    broker.produce("dbz-types", [
        (None, _typed_event("c", None, full), 0),
        (None, _typed_event("c", None, {"id": 2, "price": _b64_int(-1, 1), "born": -1, "at": None}), 0),
        (None, _typed_event("d", {"id": 3}, None), 0),
    ])
    table = tmp_path / "tables" / "items"
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "items", "dbz-types", table, payload="debezium")]))
    Runtime(config, spark).run()
    types = {f.name: f.type.type for f in DeltaTable(str(table)).schema().fields}
    assert types == {
        "id": "long", "price": "decimal(10,2)", "big": "decimal(38,18)", "born": "date", "at": "timestamp_ntz",
        "ms": "timestamp_ntz", "ns": "timestamp_ntz", "t": "timestamp_ntz", "z": "timestamp", "j": "string", "u": "string",
        "e": "string", "bits": "binary",
    }
    rows = delta_rs_rows(table)
    assert rows[1] == {
        "id": 1, "price": Decimal("123.45"), "big": Decimal("-1234.567"), "born": dt.date(2020, 1, 1),
        "at": dt.datetime(2021, 5, 3, 0, 0, 0, 123456), "ms": dt.datetime(2021, 5, 3, 0, 0, 0, 123000),
        "ns": dt.datetime(2021, 5, 3, 0, 0, 0, 123456), "t": dt.datetime(1970, 1, 1, 1, 2, 3, 1),
        "z": dt.datetime(2021, 5, 3, 8, 15, 30, 500000, tzinfo=dt.timezone.utc), "j": '{"a": 1}',
        "u": "0e4b5b8e-3f7e-4b58-9d42-6f6f0a3d0a11", "e": "b", "bits": b"\x01\x02",
    }
    assert rows[2] == {"id": 2, "price": Decimal("-0.01"), "born": dt.date(1969, 12, 31)}
    assert set(rows) == {1, 2}

    # A value that does not decode is refused, naming the record; nothing of it lands.
    broker.produce("dbz-types", [(None, _typed_event("u", None, {"id": 1, "price": "not base64!", "born": 1}), 0)])
    with pytest.raises(SourceError, match="topic dbz-types partition 0 offset 3: field\\(s\\) price \\(org.apache.kafka.connect.data.Decimal\\) do not decode"):
        Runtime(config, spark).run()
    assert delta_rs_rows(table)[1]["price"] == Decimal("123.45")

    # Without the envelope, source.schema declares the types and the same decoding applies.
    broker.create_topic("dbz-declared", 1)
    plain = {"id": 1, "price": _b64_int(12345, 2), "born": 18262, "bits": "AQI=", "at": "2021-05-03T00:00:00"}
    broker.produce("dbz-declared", [(None, _event("c", None, plain), 0)])
    (tmp_path / "declared").mkdir()
    declared = tmp_path / "declared" / "t"
    schema = "id BIGINT, price DECIMAL(10,2), born DATE, bits BINARY, at TIMESTAMP_NTZ"
    config = load_config(write_config(tmp_path / "declared", [
        kafka_binding(broker, "d", "dbz-declared", declared, payload="debezium", schema=schema)
    ]))
    Runtime(config, spark).run()
    assert delta_rs_rows(declared) == {1: {
        "id": 1, "price": Decimal("123.45"), "born": dt.date(2020, 1, 1), "bits": b"\x01\x02", "at": dt.datetime(2021, 5, 3),
    }}
    # A number for a declared timestamp: its unit (ms, µs, ns) is only in the envelope, so refused.
    broker.produce("dbz-declared", [(None, _event("u", None, {**plain, "at": 1620000000000}), 0)])
    with pytest.raises(SourceError, match="offset 1: field\\(s\\) at \\(a declared TIMESTAMP"):
        Runtime(config, spark).run()
