"""Documents with a declared schema are parsed once per epoch: the checks ride along with the
staging job (observed tallies), and nothing of a refused epoch is committed (issue #12's goals)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer import reductions
from materializer.errors import SourceError
from materializer.runtime import Runtime
from materializer.sources import SourceBatch
from materializer.sources.documents.reader import DocumentReader
from tests.helpers import binding, table_rows, write_jsonl
from tests.test_documents import declared, write
from tests.test_holes import config_with, files_under, last_epoch

pytestmark = pytest.mark.spark

SCHEMA = "id BIGINT, amount DOUBLE, note STRING"


def staged_then_verified(batch: SourceBatch, binding: Any, out: Path) -> int:
    """What the runtime does with a deferred batch: stage (the one action), explain a failure of
    that job, then verify."""
    assert batch.verify is not None
    try:
        reductions.combine(batch.documents, binding).write.parquet(str(out))
    except Exception as exc:
        explained = batch.explain(exc) if batch.explain is not None else None
        if explained is not None:
            raise explained from exc
        raise
    return batch.verify()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"id": 1, "amount": 2}{"id": 5}', "more than one JSON value"),
        ('{"amount": 1}', "key field 'id' is missing or null"),
        ('[1, 2]', "a document must be a JSON object"),
        ('{"id": 1, "colour": "red"}', "field 'colour' is not in the binding's source.schema"),
        ('{"id": 1, "amount": "12.5"}', "field 'amount' is a string but source.schema declares a number"),
        ('{"id": 1, "address": {"city": "Oslo", "zip": "0150"}}', "field 'address.zip' is not in"),
        ('{"id": 1, "address": "Oslo"}', "field 'address' is a string but source.schema declares an object"),
        ('{"id": 1, "tags": [1, "two"]}', "field 'tags[]' is a string but source.schema declares a number"),
        ('{"id": "1"}', "field 'id' is a string but source.schema declares a number"),
        ('{"id": 1, "at": "yesterday"}', "a value does not fit source.schema: field 'at' holds \"yesterday\""),
        ('{"id": 1, "address": {"n": 3000000000}}', "a value does not fit source.schema: field 'address.n' holds 3000000000, which is not a valid INT"),
        # Left by the staging job's lean checks to the cast and the epoch's shape: still named alike.
        ('{"id": {"a": 1}, "amount": 2}', "key field 'id' must be a scalar"),
        ('{"id": [1], "amount": 2}', "key field 'id' must be a scalar"),
    ],
)
def test_a_deferred_check_refuses_with_file_and_line_after_the_staging_job(spark: Any, tmp_path: Path, line: str, message: str) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1, "amount": 2}', line, '{"id": 3}'])
    src = declared(tmp_path)
    src.defer_checks = True
    batch = src.next_batch(spark, None, 100, "x")
    assert batch is not None and batch.verify is not None and batch.count == 0  # nothing checked yet
    with pytest.raises(SourceError) as info:
        staged_then_verified(batch, src.binding, tmp_path / "out")
    assert f"{tmp_path / 'src' / 'a.jsonl'}:2: {message}" in str(info.value)


def test_a_deferred_check_counts_and_stages_every_good_document_in_one_parse(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1, "amount": 2}', "", '{"id": 2, "note": {"any": 1}}', '{"id": 1, "_meta": {"op": "d"}}'])
    src = declared(tmp_path)
    src.defer_checks = True

    def no_check_job(*_args: Any) -> Any:
        raise AssertionError("the separate check job ran: the epoch is parsed twice")

    monkeypatch.setattr(DocumentReader, "check", no_check_job)
    batch = src.next_batch(spark, None, 100, "x")
    assert batch is not None
    assert staged_then_verified(batch, src.binding, tmp_path / "out") == 3
    rows = {r["id"]: r for r in spark.read.parquet(str(tmp_path / "out")).collect()}
    assert rows[1]["_op"] == "d" and rows[2]["note"] == '{"any":1}' and len(rows) == 2


@pytest.mark.slow
def test_a_refused_deferred_epoch_commits_nothing_and_leaves_no_staged_file(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "items"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "amount": 1.5}, {"id": 2, "note": "x"}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 3, "amount": 2}, {"id": 4, "colour": "red"}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema=SCHEMA)])
    summary = None
    with pytest.raises(SourceError, match=r"b\.jsonl:2: field 'colour' is not in the binding's source\.schema"):
        summary = Runtime(config, spark).run()
    assert summary is None
    assert last_epoch(config) == 1  # epoch 2 was refused before its log commit
    assert [f for f in files_under(tmp_path / "staging") if "staged" in f.parts] == []
    assert sorted(table_rows(spark, table, ["id"])) == [(1,), (2,)]
    # fixed, the run resumes at b.jsonl and counts its documents
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 3, "amount": 2}, {"id": 4, "note": "red"}])
    summary = Runtime(config, spark).run()
    assert [e.documents for e in summary.epochs] == [{"items": 2}]
    assert sorted(table_rows(spark, table, ["id"])) == [(1,), (2,), (3,), (4,)]


@pytest.mark.slow
def test_the_kafka_reader_still_checks_records_with_the_shared_field_cast(spark: Any) -> None:
    """kafka's reader reuses these checks (its problem() adds the record's own): without a broker,
    records as the connector gives them."""
    from pyspark.sql import functions as F

    from materializer.sources.kafka.source import KafkaReader

    def records(values: list[str]) -> Any:
        rows = [(v, None, "t", 0, i) for i, v in enumerate(values)]
        df = spark.createDataFrame(rows, "value string, key string, topic string, partition int, offset long")
        return df.select("value", "key", F.struct("topic", "partition", "offset").alias("_seq"))

    reader = KafkaReader(spark, "kafka://b/t", ["id"], None, None, "documents")
    parsed = reader.parsed(records(['{"id": 1, "a": 2}', '{"id": 2}']))
    count, schema = reader.check(parsed)
    assert count == 2 and [f.name for f in schema.fields] == ["a", "id"]
    reader = KafkaReader(spark, "kafka://b/t", ["id"], None, None, "documents")
    with pytest.raises(SourceError, match="topic t partition 0 offset 1: key field 'id' is missing or null"):
        reader.check(reader.parsed(records(['{"id": 1}', '{"a": 2}'])))


@pytest.mark.slow
def test_a_key_declared_string_is_still_refused_as_an_object(spark: Any, tmp_path: Path) -> None:
    # STRING takes any JSON as its text, so neither the cast nor the shape refuses an object key:
    # the staging job's lean checks keep the key rule for it.
    from pyspark.sql import types as T

    write(tmp_path / "src" / "a.jsonl", ['{"id": "a"}', '{"id": {"x": 1}}'])
    src = declared(tmp_path)
    src.use_schema(T.StructType([T.StructField("id", T.StringType())]))
    src.defer_checks = True
    batch = src.next_batch(spark, None, 100, "x")
    assert batch is not None and batch.verify is not None
    with pytest.raises(SourceError) as info:
        staged_then_verified(batch, src.binding, tmp_path / "out")
    assert f"{tmp_path / 'src' / 'a.jsonl'}:2: key field 'id' must be a scalar" in str(info.value)
