"""Kafka's ``documents`` payload with ``source.schema``: checked by the job that stages the rows (one
read of the offset range and one parse per epoch, not two), by msgspec on the executors (the arrow
validator) or the VARIANT route, with the same rows and the same refusals, named by topic,
partition and offset (issue #25). Unlike lines of a file, no record is skipped: a blank value and a
tombstone are refused on both routes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from materializer.config import load_config
from materializer.errors import SourceError
from materializer.runtime import Runtime
from materializer.sources.kafka.source import KafkaSource
from materializer.storage import open_store
from tests.helpers import delta_rs_rows, table_rows, write_config
from tests.kafka_broker import Broker
from tests.test_documents_arrow import FLAT_FIELDS, FLAT_SCHEMA, _run, documents
from tests.test_kafka import kafka_binding, oracle, produce, wave

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

DDL = "id BIGINT, amount DOUBLE, note STRING, tags ARRAY<BIGINT>, address STRUCT<city: STRING, n: INT>, at TIMESTAMP"

_topics = iter(range(1_000_000))


def _source(broker: Broker, tmp_path: Path, records: list[tuple[Any, Any]], ddl: str = DDL, **extra: Any) -> KafkaSource:
    """A fresh one-partition topic holding ``records`` (key, value), and the deferring source of a
    binding reading it with ``ddl`` declared."""
    topic = f"declared-{next(_topics)}-{tmp_path.name[:40]}".replace("[", "-").replace("]", "-")
    broker.create_topic(topic, 1)
    broker.produce(topic, [(key, value, 0) for key, value in records])
    folder = tmp_path / topic
    folder.mkdir()
    config = load_config(write_config(folder, [kafka_binding(broker, "k", topic, folder / "table", schema=ddl, **extra)]))
    source = KafkaSource(config.bindings[0], open_store(config.staging))
    source.defer_checks = True  # as the runtime's stager sets it
    return source


def _both(spark: Any, source: KafkaSource, tmp_path: Path) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """One epoch of the topic through each route (tests/test_documents_arrow.py's ``_run``: staged,
    explained if the job fails, verified)."""
    return _run(spark, tmp_path, "arrow", source), _run(spark, tmp_path, "variant", source)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),  # a blank value: refused, never skipped as a blank line of a file is
        (None, "the record's value is null (a tombstone)"),
        (b'{"id": 1, "colour": "red"}', "field 'colour' is not in the binding's source.schema"),
        (b'{"id": 1, "at": "yesterday"}', "a value does not fit source.schema: field 'at' holds \"yesterday\""),
        (b'{"id": 1, "note": "a:b", "note": "c"}', "not valid JSON"),
        # (the other rules are the files' own, tests/test_documents_arrow.py)
    ],
)
def test_a_bad_record_is_refused_by_both_routes_with_its_offset(
    spark: Any, broker: Broker, tmp_path: Path, value: Any, message: str
) -> None:
    source = _source(broker, tmp_path, [(b"1", b'{"id": 1, "amount": 2}'), (b"2", value), (b"3", b'{"id": 3}')])
    arrow, variant = _both(spark, source, tmp_path)
    assert arrow[0] == "refused" and f"topic {source.topics[0]} partition 0 offset 1: {message}" in arrow[1], arrow
    assert arrow == variant


def test_a_key_in_the_message_that_the_value_contradicts_is_refused_on_the_arrow_route(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    # The value alone is a valid document (the validator would call it fast): the record's own
    # problem must still refuse it.
    source = _source(
        broker, tmp_path, [(b'{"id": 1}', b'{"amount": 1}'), (b'{"id": 5}', b'{"id": 6, "amount": 5}')], key_from="message"
    )
    arrow, variant = _both(spark, source, tmp_path)
    assert arrow[0] == "refused" and "offset 1: key field 'id' in the value differs from the record's key" in arrow[1], arrow
    assert arrow == variant


def test_keys_from_the_message_and_tombstones_land_the_same_on_both_routes(spark: Any, broker: Broker, tmp_path: Path) -> None:
    source = _source(
        broker,
        tmp_path,
        [
            (b'{"id": 1}', b'{"amount": 1.5, "note": "x:y"}'),
            (b"2", b'{"tags": [1, 2], "address": {"city": "Oslo", "n": 3}}'),
            (b'{"id": 3}', b'{"id": 3, "at": "2024-01-02 03:04:05"}'),
            (b'{"id": 1}', None),  # a tombstone deletes key 1
        ],
        key_from="message",
    )
    arrow, variant = _both(spark, source, tmp_path)
    assert arrow == variant and arrow[0] == "ok" and arrow[1][0] == 4, arrow


def test_a_declared_topic_lands_exactly_over_epochs_read_by_delta_rs(spark: Any, broker: Broker, tmp_path: Path, monkeypatch: Any) -> None:
    """Epochs of up to 60 records; with the small-epoch threshold at 50 records, the full epochs
    are checked by the arrow validator and the smaller ones in Spark expressions (the conf unset),
    and the table is exact either way."""
    from materializer.sources.documents import route as document_route

    routes: list[str] = []
    chosen = document_route.validator
    monkeypatch.setattr(document_route, "validator", lambda spark, small=False, declared=None: routes.append(chosen(spark, small=small, declared=declared)) or routes[-1])
    monkeypatch.setattr(document_route, "SMALL_EPOCH_RECORDS", 50)
    spark.conf.unset(document_route.VALIDATOR_CONF)
    broker.create_topic("declared-e2e", 2)
    table = tmp_path / "tables" / "d"
    config = load_config(write_config(tmp_path, [
        kafka_binding(broker, "d", "declared-e2e", table, schema="id BIGINT, v BIGINT, name STRING", max_records=60),
    ]))
    docs = wave(0, 150, range(40), 3)
    produce(broker, "declared-e2e", docs, 2)
    summary = Runtime(config, spark).run()
    assert summary.last_epoch is not None and summary.last_epoch >= 3  # several epochs, each checked in its staging job
    assert sum(e.documents["d"] for e in summary.epochs) == len(docs)  # counted by the staging job's checks
    assert routes[:2] == ["arrow", "arrow"] and routes[-1] == "variant", routes  # 60, 60, then the rest
    expected = oracle(docs)
    assert table_rows(spark, table, ["id"]) == expected
    assert delta_rs_rows(table, ["id"]) == expected

    more = wave(150, 40, range(30, 60), 5)
    produce(broker, "declared-e2e", more, 2)
    routes.clear()
    Runtime(config, spark).run()
    assert routes == ["variant"]  # 40 records
    expected = oracle(docs + more)
    assert table_rows(spark, table, ["id"]) == expected
    assert delta_rs_rows(table, ["id"]) == expected


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(FLAT_FIELDS), min_size=10, max_size=60))
def test_the_routes_agree_on_a_topic_of_generated_records(spark: Any, broker: Broker, tmp_path_factory: Any, corpus: list[str]) -> None:
    """The differential test of tests/test_documents_arrow.py, on a topic: the same rows, or the
    same refusals (rule, partition, offset)."""
    tmp_path = tmp_path_factory.mktemp("kafka-diff")
    source = _source(broker, tmp_path, [(b"k", line.encode()) for line in corpus], FLAT_SCHEMA)
    arrow, variant = _both(spark, source, tmp_path)
    assert arrow == variant
    event(f"the corpus: {variant[0]}")


def test_a_refused_epoch_commits_nothing_and_leaves_no_staged_file(spark: Any, broker: Broker, tmp_path: Path) -> None:
    from tests.test_holes import files_under, last_epoch

    broker.create_topic("declared-refused", 1)
    table = tmp_path / "tables" / "r"
    config = load_config(write_config(tmp_path, [
        kafka_binding(broker, "r", "declared-refused", table, schema="id BIGINT, v BIGINT", max_records=3),
    ]))
    broker.produce("declared-refused", [
        (b"1", b'{"id": 1, "v": 1}', 0), (b"2", b'{"id": 2, "v": 2}', 0), (b"3", b'{"id": 3}', 0),
        (b"4", b'{"id": 4, "v": 4}', 0), (b"5", b'{"id": 5, "v": "five"}', 0), (b"6", b'{"id": 6}', 0),
    ])
    with pytest.raises(SourceError, match="partition 0 offset 4: a value does not fit source.schema: field 'v' holds \"five\""):
        Runtime(config, spark).run()
    assert last_epoch(config) == 1  # the second range was refused before its log commit
    assert [f for f in files_under(tmp_path / "staging") if "staged" in f.parts] == []
    assert delta_rs_rows(table, ["id"]) == {(1,): {"id": 1, "v": 1}, (2,): {"id": 2, "v": 2}, (3,): {"id": 3}}


def test_without_a_schema_the_range_is_read_from_the_broker_once(spark: Any, broker: Broker, tmp_path: Path) -> None:
    """The checks' job reads the range and keeps it: the staging job reads no broker. Shown by
    deleting the records between the two jobs (a second read would fail, failOnDataLoss)."""
    broker.create_topic("held", 1)
    broker.produce("held", [(b"1", b'{"id": 1, "v": 1}', 0), (b"2", b'{"id": 2, "v": 2}', 0), (b"1", b'{"id": 1, "v": 3}', 0)])
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "h", "held", tmp_path / "table")]))
    source = KafkaSource(config.bindings[0], open_store(config.staging))
    source.defer_checks = True  # no schema: the checks still run in a job of their own
    batch = source.next_batch(spark, None, 100, "x")
    assert batch is not None and batch.verify is None and batch.count == 3
    broker.delete_records("held", 0, 3)
    rows = sorted((r["id"], r["v"], r["_seq"]["offset"]) for r in batch.documents.collect())
    assert rows == [(1, 1, 0), (1, 3, 2), (2, 2, 1)]
    assert source.next_batch(spark, {"offsets": {"held": {"0": 3}}}, 100, "x") is None  # and lets go of them
    assert source._held is None
