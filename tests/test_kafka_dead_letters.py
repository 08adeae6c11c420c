"""``on_invalid: dead_letter`` for the kafka source on a real broker: bad records of the documents
and debezium payloads land once in the dead-letter table with where they were and the record as
read, also when the apply is cut between the table and the dead-letter table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config, parse_config
from materializer.runtime import Runtime
from tests.helpers import Killed, delta_rs_list, kill_before_dead_letters, write_config
from tests.kafka_broker import Broker
from tests.test_kafka import _source, kafka_binding, log_entries
from tests.test_kafka_transactions import delta_rs_rows


def test_dead_letters_are_for_every_payload() -> None:
    for payload in ("documents", "debezium", "cdcv2"):
        data = _source(format="kafka", bootstrap_servers="h", topic="a", payload=payload)
        data["bindings"][0]["on_invalid"] = "dead_letter"
        assert parse_config(data, "x").bindings[0].dead_letters == "t_dead_letters"


def _dead(table: Path) -> list[tuple[Any, ...]]:
    from deltalake import DeltaTable

    assert DeltaTable(str(table)).transaction_version("test-pipeline") is not None
    rows = []
    for r in delta_rs_list(table):
        assert r["timestamp"] is not None and r["source"].startswith("kafka://")
        rows.append((r["binding"], r["epoch"], r["topic"], r["partition"], r["offset"], r["key"], r["reason"], r["value"]))
    return sorted(rows, key=lambda r: (r[1], r[3], r[4]))


def _event(op: str, after: Any) -> bytes:
    return json.dumps({"before": None, "after": after, "op": op, "source": {}}).encode()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("validator", ["variant", "arrow"])
def test_bad_records_land_once_in_the_dead_letter_table_also_when_the_apply_is_cut_short(
    spark: Any, broker: Broker, tmp_path: Path, validator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By either route: with the arrow validator the records it does not find fast are set aside
    in the spool for the checks and the dead letters (document_route.set_aside)."""
    from materializer.sources.documents.route import VALIDATOR_CONF
    from tests.helpers import record_set_asides

    asides = record_set_asides(monkeypatch)
    spark.conf.set(VALIDATOR_CONF, validator)  # (these few records would take the VARIANT route)
    try:
        _bad_records_land_once(spark, broker, tmp_path, f"-{validator}")
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    # The docs binding's three epochs, each with bad records (the killed run's epoch is applied
    # again from its staged file, not read again).
    assert asides == ([True] * 3 if validator == "arrow" else [])


def _bad_records_land_once(spark: Any, broker: Broker, tmp_path: Path, suffix: str) -> None:
    dl, dbz_topic = f"dl{suffix}", f"dl-dbz{suffix}"
    broker.create_topic(dl, 2)
    broker.create_topic(dbz_topic, 1)
    broker.produce(dl, [
        (b"1", b'{"id": 1, "v": 1}', 0), (b"x", b"not json", 0), (b"y", b'{"v": "no key"}', 0),
        (b"2", b'{"id": 2, "v": 2}', 1), (b"3", b'{"id": 3, "_op": "x"}', 1),
        # Found by the declared schema alone (before, they stopped the run: only the epoch's shape showed them).
        (b"8", b'{"id": 8, "v": "12"}', 0), (b"9", b'{"id": 9, "v": 1, "w": {"u": 2}}', 1),
    ])
    broker.produce(dbz_topic, [(b"7", _event("c", {"id": 7, "name": "g"}), 0), (b"8", _event("t", None), 0), (b"9", b"{", 0)])
    tables = tmp_path / "tables"
    config = load_config(write_config(tmp_path, [
        {**kafka_binding(broker, "docs", dl, tables / "docs", schema="id BIGINT, v BIGINT"), "on_invalid": "dead_letter"},
        {**kafka_binding(broker, "dbz", dbz_topic, tables / "dbz", payload="debezium"), "on_invalid": "dead_letter"},
    ]))

    # Killed after the first table's commit, before its dead letters: the re-apply adds them once.
    runtime = Runtime(config, spark)
    kill_before_dead_letters(runtime)
    with pytest.raises(Killed):
        runtime.run()
    assert max(log_entries(config)) == 1 and not (tables / "docs_dead_letters").exists()
    Runtime(config, spark).run()

    assert delta_rs_rows(tables / "docs") == {1: {"id": 1, "v": 1}, 2: {"id": 2, "v": 2}}
    assert delta_rs_rows(tables / "dbz") == {7: {"id": 7, "name": "g"}}
    docs = _dead(tables / "docs_dead_letters")
    assert [r[:6] for r in docs] == [
        ("docs", 1, dl, 0, 1, "x"), ("docs", 1, dl, 0, 2, "y"), ("docs", 1, dl, 0, 3, "8"), ("docs", 1, dl, 1, 1, "3"), ("docs", 1, dl, 1, 2, "9"),
    ]
    assert "not valid JSON" in docs[0][6] and "key field 'id' is missing" in docs[1][6] and "'_op' is reserved" in docs[3][6]
    assert "field 'v' is a string but source.schema declares a number" in docs[2][6] and "field 'w' is not in the binding's source.schema" in docs[4][6]
    assert [r[7] for r in docs] == ["not json", '{"v": "no key"}', '{"id": 8, "v": "12"}', '{"id": 3, "_op": "x"}', '{"id": 9, "v": 1, "w": {"u": 2}}']
    dbz = _dead(tables / "dbz_dead_letters")
    assert [r[:6] for r in dbz] == [("dbz", 1, dbz_topic, 0, 1, "8"), ("dbz", 1, dbz_topic, 0, 2, "9")]
    assert "op 't'" in dbz[0][6] and dbz[1][7] == "{"

    # A later epoch's bad record is appended with its epoch; the first epoch's are not again.
    broker.produce(dl, [(b"4", b'{"id": 4, "v": [1', 0), (b"5", b'{"id": 5, "v": 5}', 1)])
    Runtime(config, spark).run()
    assert [r[1:5] for r in _dead(tables / "docs_dead_letters")] == [(1, dl, 0, 1), (1, dl, 0, 2), (1, dl, 0, 3), (1, dl, 1, 1), (1, dl, 1, 2), (2, dl, 0, 4)]
    assert sorted(delta_rs_rows(tables / "docs")) == [1, 2, 5]

    # An epoch whose every record is a dead letter: no row to stage (no type for the key), its
    # position and its dead letters committed. Before, the staging failed on the missing key column.
    broker.produce(dl, [(b"6", b"not json either", 1)])
    Runtime(config, spark).run()
    assert max(log_entries(config)) == 3
    assert [r[1:5] for r in _dead(tables / "docs_dead_letters")][-1] == (3, dl, 1, 4)
    assert sorted(delta_rs_rows(tables / "docs")) == [1, 2, 5]

    # What a drill's round checks: each table equals the oracle over the topic with the records
    # set aside left out, each of those once in its dead-letter table (the oracle stopped at the
    # first record it could not read before).
    from materializer.tools.drill.verification import verify

    checked = verify(config, spark, reader="deltalake")
    assert checked.verdict == "pass" and [t.binding for t in checked.tables if t.verified] == ["docs", "dbz"], checked.problems


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_a_range_the_validator_finds_all_fast_is_staged_in_one_job_and_the_others_keep_their_dead_letters(
    spark: Any, broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for files (tests/test_dead_letters.py): with the arrow validator, a dead-letter binding's
    range whose every record is fast is checked by its staging job; a range with a bad record or
    a tombstone keeps the dead letters' path, its range read from the broker once."""
    from materializer.sources.documents.route import VALIDATOR_CONF
    from tests.helpers import record_document_paths

    paths = record_document_paths(monkeypatch)
    broker.create_topic("dl-fast", 2)
    tables = tmp_path / "tables"
    config = load_config(write_config(tmp_path, [
        {**kafka_binding(broker, "docs", "dl-fast", tables / "docs", schema="id BIGINT, v BIGINT"), "on_invalid": "dead_letter"},
    ]))
    spark.conf.set(VALIDATOR_CONF, "arrow")  # (these few records would take the VARIANT route)
    try:
        broker.produce("dl-fast", [(b"1", b'{"id": 1, "v": 1}', 0), (b"2", b'{"id": 2, "v": 2}', 1)])
        Runtime(config, spark).run()
        broker.produce("dl-fast", [(b"3", b'{"id": 3, "v": 3}', 0), (b"x", b'{"id": 4, "v": "four"}', 1), (b"1", None, 0)])
        Runtime(config, spark).run()
        broker.produce("dl-fast", [(b"5", b'{"id": 5, "v": 5, "_meta": {"op": "u"}}', 1), (b"2", b'{"id": 2, "_meta": {"op": "d"}}', 0)])
        Runtime(config, spark).run()
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    assert paths == ["staging job", "check job", "staging job"]
    assert delta_rs_rows(tables / "docs") == {1: {"id": 1, "v": 1}, 3: {"id": 3, "v": 3}, 5: {"id": 5, "v": 5}}
    dead = _dead(tables / "docs_dead_letters")
    assert [r[1:6] for r in dead] == [(2, "dl-fast", 0, 2, "1"), (2, "dl-fast", 1, 1, "x")]
    assert "tombstone" in dead[0][6] and "field 'v' holds \"four\", which is not a valid BIGINT" in dead[1][6]
