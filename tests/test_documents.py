"""The documents source's checks run before Spark is touched (no JVM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from materializer.config import BindingConfig
from materializer.errors import SourceError
from materializer.sources.documents import DocumentsSource
from materializer.storage.local import LocalStore


def source(tmp_path: Path) -> DocumentsSource:
    binding = BindingConfig.model_validate(
        {"name": "b", "source": {"format": "documents", "path": str(tmp_path / "src")}, "table": str(tmp_path / "t"), "key": ["id"]}
    )
    return DocumentsSource(binding, LocalStore(str(tmp_path / "staging")))


def write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": 1, "x": }', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"x": 1}', "key field 'id' is missing"),
        ('{"id": {"a": 1}}', "key field 'id' must be a scalar"),
        ('{"id": 1, "_op": "u"}', "reserved"),
    ],
)
def test_bad_line_names_file_and_line_and_stages_nothing(tmp_path: Path, line: str, message: str) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1}', '{"id": 2}', line, '{"id": 3}'])
    with pytest.raises(SourceError) as info:
        source(tmp_path).next_batch(None, None, 100, "spool/x.jsonl")  # type: ignore[arg-type]
    assert f"{tmp_path / 'src' / 'a.jsonl'}:3" in str(info.value)
    assert message in str(info.value)
    assert info.value.line == 3
    assert not (tmp_path / "staging" / "spool").exists()
    assert list((tmp_path / "staging" / "_tmp").iterdir()) == []


def test_a_late_file_that_sorts_before_the_checkpoint_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "src" / "b.jsonl", ['{"id": 1}'])
    write(tmp_path / "src" / "a.jsonl", ['{"id": 2}'])
    checkpoint = {"file": "b.jsonl", "line": 1, "offset": 10, "before": 0}
    with pytest.raises(SourceError, match="sort before 'b.jsonl'"):
        source(tmp_path).next_batch(None, checkpoint, 100, "spool/x.jsonl")  # type: ignore[arg-type]


def test_checkpoint_resumes_at_line_and_offset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "src" / "a.jsonl", [json.dumps({"id": i}) for i in range(5)])
    write(tmp_path / "src" / "b.jsonl", [json.dumps({"id": i}) for i in range(5, 8)])
    src = source(tmp_path)
    monkeypatch.setattr("materializer.sources.documents._dataframe", lambda spark, uri, schema=None: uri)
    first = src.next_batch(None, None, 4, "spool/1.jsonl")  # type: ignore[arg-type]
    assert first is not None and first.count == 4
    assert first.checkpoint == {"file": "a.jsonl", "line": 4, "offset": len("".join(json.dumps({"id": i}) + "\n" for i in range(4))), "before": 0}
    second = src.next_batch(None, first.checkpoint, 4, "spool/2.jsonl")  # type: ignore[arg-type]
    assert second is not None and second.count == 4
    assert second.description == "a.jsonl:5-5, b.jsonl:1-3"
    spooled = (tmp_path / "staging" / "spool" / "2.jsonl").read_text().splitlines()
    assert [json.loads(line)["d"]["id"] for line in spooled] == [4, 5, 6, 7]
    assert src.next_batch(None, second.checkpoint, 4, "spool/3.jsonl") is None  # type: ignore[arg-type]


def declared(tmp_path: Path) -> DocumentsSource:
    from pyspark.sql import types as T

    src = source(tmp_path)
    src.use_schema(
        T.StructType(
            [
                T.StructField("id", T.LongType()),
                T.StructField("amount", T.DoubleType()),
                T.StructField("note", T.StringType()),
                T.StructField("tags", T.ArrayType(T.LongType())),
                T.StructField("address", T.StructType([T.StructField("city", T.StringType())])),
            ]
        )
    )
    return src


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": 1, "colour": "red"}', "field 'colour' is not in the binding's source.schema"),
        ('{"id": 1, "amount": "12.5"}', "field 'amount' is a string but source.schema declares a number"),
        ('{"id": 1, "amount": true}', "field 'amount' is a boolean but source.schema declares a number"),
        ('{"id": 1, "address": {"city": "Oslo", "zip": "0150"}}', "field 'address.zip' is not in"),
        ('{"id": 1, "address": "Oslo"}', "field 'address' is a string but source.schema declares an object"),
        ('{"id": 1, "tags": [1, "two"]}', "field 'tags[]' is a string but source.schema declares a number"),
        ('{"id": "1"}', "field 'id' is a string but source.schema declares a number"),
    ],
)
def test_a_declared_schema_refuses_undeclared_fields_and_other_kinds(tmp_path: Path, line: str, message: str) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1, "amount": 2}', line])
    with pytest.raises(SourceError) as info:
        declared(tmp_path).next_batch(None, None, 100, "spool/x.jsonl")  # type: ignore[arg-type]
    assert f"{tmp_path / 'src' / 'a.jsonl'}:2: {message}" in str(info.value)
    assert not (tmp_path / "staging" / "spool").exists()


def test_a_declared_schema_takes_nulls_any_json_as_a_string_and_the_delete_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import materializer.sources.documents as documents

    # Spark is not needed to check the lines: stop before the spool is parsed.
    monkeypatch.setattr(documents, "_dataframe", lambda spark, uri, schema=None: (uri, schema))
    write(
        tmp_path / "src" / "a.jsonl",
        [
            '{"id": 1, "amount": 2, "note": {"any": ["json"]}, "tags": [1, 2], "address": {"city": null}}',
            '{"id": 2, "amount": 2.5, "note": null, "tags": null, "address": null}',
            '{"id": 1, "_meta": {"op": "d"}}',
        ],
    )
    batch = declared(tmp_path).next_batch(None, None, 100, "spool/x.jsonl")  # type: ignore[arg-type]
    assert batch is not None and batch.count == 3
    assert batch.documents[1] is not None  # parsed with the declared schema, not inferred
