"""Issue #66 item 2: a document nested deeper than ``json_text.MAX_DEPTH`` is a bad document like
any other (a dead letter, or a refusal naming file, line and depth), never a RecursionError in the
driver nor a StackOverflowError that takes the JVM down; one at exactly the limit lands.

The depth is counted without recursion (brackets outside strings) in Python and in Spark; every
walk of a shape or a declared type is bounded by it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from materializer.errors import ConfigError, SourceError
from materializer.sources.json_text import MAX_DEPTH, nesting_depth, too_deep

# --- documents of any depth, in three shapes ------------------------------------------------------


def arrays(depth: int) -> str:
    """``[[[…1…]]]``: ``depth`` levels."""
    return "[" * depth + "1" + "]" * depth


def objects(depth: int) -> str:
    """``{"a":{"a":…1…}}``: ``depth`` levels."""
    return '{"a":' * depth + "1" + "}" * depth


def mixed(depth: int) -> str:
    """Objects and arrays in turn (``{"a":[{"a":[…]}]}``), with strings holding brackets and
    escaped quotes on the way down: ``depth`` levels."""
    opened = "".join('{"s":"]}\\"[{","a":' if i % 2 == 0 else "[" for i in range(depth))
    closed = "".join("}" if i % 2 == 0 else "]" for i in reversed(range(depth)))
    return opened + "1" + closed


def document(key: int, depth: int, shape: Any = mixed) -> str:
    """A document with key ``key`` whose field ``x`` takes it to ``depth`` levels in all."""
    return json.dumps({"id": key, "v": "ok"})[:-1] + ', "x": ' + shape(depth - 1) + "}"


# --- the count: no JVM --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, depth",
    [
        ("1", 0),
        ('"[[{{"', 0),
        ("{}", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('{"a": "[[[[{{{{"}', 1),  # brackets in a string do not count
        ('{"a": "x\\"[[[", "b": [1]}', 2),  # nor after an escaped quote
        ('{"a": "\\\\", "b": [[1]]}', 3),  # an escaped backslash ends before the quote that closes
        ('{"a": "\\u005b\\u007b"}', 1),  # escaped brackets are characters of the string
        ('[{"a": 1}, {"b": 2}, [3]]', 2),  # siblings are not deeper
        ('{"a": "unterminated [[[', 1),  # invalid JSON is measured too (the string runs to the end)
    ],
)
def test_the_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth


@pytest.mark.parametrize("shape", [arrays, objects, mixed])
@pytest.mark.parametrize("depth", [1, 2, MAX_DEPTH, MAX_DEPTH + 1, 200, 990, 5000, 100_000])
def test_any_depth_is_counted_without_recursion(shape: Any, depth: int) -> None:
    text = document(7, depth, shape)
    assert nesting_depth(text) == depth
    assert too_deep(text) == (depth > MAX_DEPTH)


def test_many_brackets_side_by_side_are_not_deep() -> None:
    wide = '{"id": 1, "items": [' + ", ".join('{"n": [%d]}' % i for i in range(1000)) + "]}"
    assert nesting_depth(wide) == 4 and not too_deep(wide)


def test_shapes_are_parsed_without_recursion_and_no_deeper_than_the_limit() -> None:
    from pyspark.sql import types as T

    from materializer.sources.documents.shapes import inferred_type, shape_problems
    from materializer.sources.documents.variant_shape import parse_shape

    pairs = (MAX_DEPTH - 2) // 2
    at_limit = "OBJECT<a: ARRAY<" + "OBJECT<b: ARRAY<" * pairs + "BIGINT" + ">>" * pairs + ">>"
    shape = parse_shape(at_limit)
    assert shape_problems(shape) == []
    dtype, containers = inferred_type(shape), 0
    while not isinstance(dtype, T.LongType):
        dtype = dtype.fields[0].dataType if isinstance(dtype, T.StructType) else dtype.elementType  # type: ignore[union-attr]
        containers += 1
    assert containers == MAX_DEPTH
    for depth in (MAX_DEPTH + 1, 990, 100_000):
        with pytest.raises(SourceError, match=f"deeper than {MAX_DEPTH} levels"):
            parse_shape("ARRAY<" * depth + "BIGINT" + ">" * depth)
        with pytest.raises(SourceError, match=f"deeper than {MAX_DEPTH} levels"):
            parse_shape("OBJECT<a: " * depth + "BIGINT" + ">" * depth)


def test_a_declared_schema_deeper_than_the_limit_stops_before_spark() -> None:
    from materializer.sources.documents.schema import ddl_depth, parse_schema

    assert ddl_depth("id BIGINT") == 1
    assert ddl_depth("a STRUCT<b: ARRAY<MAP<STRING, INT>>>") == 4
    assert ddl_depth("`a<<` INT, b STRING COMMENT 'x<<\\'<'") == 1  # quoted names and strings do not count
    binding = SimpleNamespace(name="deep", key=["id"])
    for depth in (MAX_DEPTH + 1, 5000, 100_000):
        ddl = "id BIGINT, x " + "ARRAY<" * (depth - 1) + "INT" + ">" * (depth - 1)
        assert ddl_depth(ddl) == depth
        with pytest.raises(ConfigError, match=f"source.schema nests {depth} levels deep.*at most {MAX_DEPTH}"):
            parse_schema(None, ddl, binding)  # type: ignore[arg-type]  # (no Spark: refused before it)


def test_a_deep_line_is_worded_without_parsing_it_in_python() -> None:
    from pyspark.sql import types as T

    from materializer.sources.documents.refusals import why

    declared = T.StructType([T.StructField("id", T.LongType()), T.StructField("x", T.StringType())])
    assert why(document(1, 100_000), ["the problem found"], declared) == "the problem found"


def test_the_arrow_validator_finds_a_deep_document_not_fast_instead_of_failing_the_job() -> None:
    import pyarrow as pa

    from materializer.sources.documents.check import _compile

    schema = json.dumps(
        {"type": "struct", "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "x", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
        ]}
    )
    fast, _suspect, _columns, whole = _compile(schema, ("id",), ())
    good, deep = b'{"id": 1, "x": 1.5}', ('{"id": 2, "x": ' + arrays(100_000) + "}").encode()
    assert fast(good, good.count(b":")) is not None
    assert fast(deep, deep.count(b":")) is None  # msgspec's RecursionError: not fast
    assert whole(pa.array([good.decode(), deep.decode()])) is None  # the batch is judged per document


# --- through a real run ---------------------------------------------------------------------------


def _write(folder: Path, name: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(lines) + "\n")


def _config(tmp_path: Path, **extra: Any) -> Any:
    from tests.helpers import binding
    from tests.test_holes import config_with

    return config_with(tmp_path, [binding("items", tmp_path / "src", tmp_path / "t", **extra)])


@pytest.mark.spark
def test_spark_counts_the_depth_as_python_does(spark: Any) -> None:
    from pyspark.sql import functions as F

    from materializer.sources.cdcv2.statements import statements
    from materializer.sources.json_text import deep_column, depth_column

    texts = [
        "1", "{}", '{"a": "[[[[{{{{"}', '{"a": "x\\"[[[", "b": [1]}', '{"a": "\\\\", "b": [[1]]}', '{"a": "\\u005b"}',
        '{"a": "unterminated [[[', document(1, MAX_DEPTH), document(1, MAX_DEPTH + 1, arrays),
        document(1, 990, objects), document(1, 5000), "[" * 300 + "]" * 300,
    ]
    rows = spark.createDataFrame([(t,) for t in texts], "value string").select(
        depth_column(F.col("value")).alias("depth"), deep_column(F.col("value")).alias("deep")
    ).collect()
    assert [r["depth"] for r in rows] == [nesting_depth(t) for t in texts]
    assert [bool(r["deep"]) for r in rows] == [too_deep(t) for t in texts]
    # A CDC v2 statement is a line too.
    deep = '{"updates": [[' + objects(MAX_DEPTH) + ", 1, 1]]}"
    problem = statements(spark.createDataFrame([(deep,)], "value string"), ["id"]).first()["problem"]
    assert problem.startswith(f"the statement is nested {MAX_DEPTH + 3} levels deep") and f"at most {MAX_DEPTH}" in problem


@pytest.mark.spark
@pytest.mark.parametrize("declared", [None, "id BIGINT, v STRING, x DECIMAL(10, 2)"], ids=["inferred", "declared"])
def test_deep_documents_are_dead_letters_and_the_others_land(spark: Any, tmp_path: Path, declared: str | None) -> None:
    from materializer.runtime import Runtime
    from materializer.sources.documents.route import VALIDATOR_CONF
    from tests.helpers import delta_rs_list, table_rows

    lines = [
        '{"id": 1, "v": "a"}',
        document(2, 200, arrays),
        '{"id": 3, "v": "c", "x": 1.5}',
        document(4, 990, objects),
        document(5, 5000),
        document(6, 100_000, arrays),
        '{"id": 7, "v": "g"}',
    ]
    _write(tmp_path / "src", "a.jsonl", lines)
    extra = {"schema": declared} if declared else {}
    config = _config(tmp_path, on_invalid="dead_letter", **extra)
    spark.conf.set(VALIDATOR_CONF, "arrow" if declared else "variant")
    try:
        Runtime(config, spark).run()
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    assert sorted(table_rows(spark, tmp_path / "t", ["id"])) == [(1,), (3,), (7,)]
    assert sorted(r["id"] for r in delta_rs_list(tmp_path / "t")) == [1, 3, 7]
    dead_table = Path(str(tmp_path / "t") + "_dead_letters")
    for dead in (
        [r.asDict() for r in spark.read.format("delta").load(str(dead_table)).collect()],
        delta_rs_list(dead_table),
    ):
        found = sorted((r["source"].rsplit("/", 1)[-1], r["line"], r["reason"], r["document"]) for r in dead)
        assert [(f, line) for f, line, _r, _d in found] == [("a.jsonl", 2), ("a.jsonl", 4), ("a.jsonl", 5), ("a.jsonl", 6)]
        for (_f, line, reason, text), depth in zip(found, (200, 990, 5000, 100_000)):
            assert reason.startswith(f"the document is nested {depth} levels deep") and f"at most {MAX_DEPTH} levels" in reason
            assert text == lines[line - 1]


@pytest.mark.spark
def test_a_deep_document_refuses_the_run_naming_file_line_and_depth(spark: Any, tmp_path: Path) -> None:
    from materializer.runtime import Runtime
    from tests.helpers import table_rows

    good = ['{"id": 1, "v": "a"}', '{"id": 2, "v": "b"}']
    _write(tmp_path / "src", "b.jsonl", [good[0], "", document(9, 5000), good[1]])
    config = _config(tmp_path)
    with pytest.raises(SourceError) as refused:
        Runtime(config, spark).run()
    message = str(refused.value)
    assert f"{tmp_path / 'src' / 'b.jsonl'}:3: the document is nested 5000 levels deep" in message
    assert f"at most {MAX_DEPTH} levels are supported" in message and "Fix or remove those lines" in message
    assert not (tmp_path / "t").exists()  # nothing applied
    # Fixed, the run resumes: nothing else of the epoch was lost.
    _write(tmp_path / "src", "b.jsonl", [good[0], "", document(9, MAX_DEPTH), good[1]])
    Runtime(config, spark).run()
    assert sorted(table_rows(spark, tmp_path / "t", ["id"])) == [(1,), (2,), (9,)]


def _declared_ddl(depth: int) -> str:
    """The DDL of :func:`mixed` documents of ``depth`` levels (their field ``x``, BIGINT at the bottom)."""
    inner = "BIGINT"
    for i in reversed(range(depth - 1)):
        inner = f"STRUCT<s: STRING, a: {inner}>" if i % 2 == 0 else f"ARRAY<{inner}>"
    return f"id BIGINT, v STRING, x {inner}"


@pytest.mark.spark
@pytest.mark.parametrize("declared", [False, True], ids=["inferred", "declared"])
def test_a_document_at_exactly_the_limit_lands_and_merges(spark: Any, tmp_path: Path, declared: bool) -> None:
    """MAX_DEPTH levels of objects and arrays: typed, staged to Parquet, created, then MERGEd into
    (an update of the same key), and read by Spark and delta-rs alike."""
    from materializer.runtime import Runtime
    from materializer.sources.documents.route import VALIDATOR_CONF
    from tests.helpers import delta_rs_list, table_rows

    def deepest(row: Any) -> Any:
        value = row["x"]
        while not isinstance(value, int):
            value = value["a"] if isinstance(value, dict) else value[0]
        return value

    extra = {"schema": _declared_ddl(MAX_DEPTH)} if declared else {}
    config = _config(tmp_path, **extra)
    _write(tmp_path / "src", "a.jsonl", [document(1, MAX_DEPTH), '{"id": 2, "v": "b"}'])
    _write(tmp_path / "src", "b.jsonl", [document(1, MAX_DEPTH).replace(":1}", ":2}", 1)])
    spark.conf.set(VALIDATOR_CONF, "arrow" if declared else "variant")
    try:
        Runtime(config, spark).run()
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    rows = table_rows(spark, tmp_path / "t", ["id"])
    assert sorted(rows) == [(1,), (2,)] and deepest(rows[(1,)]) == 2
    by_delta_rs = {r["id"]: r for r in delta_rs_list(tmp_path / "t")}
    assert sorted(by_delta_rs) == [1, 2] and deepest(by_delta_rs[1]) == 2


@pytest.mark.kafka
@pytest.mark.spark
def test_a_deep_kafka_value_is_a_dead_letter_naming_topic_partition_and_offset(spark: Any, broker: Any, tmp_path: Path) -> None:
    """A Kafka value nested 990 levels deep (documents and Debezium payloads) is a dead letter with
    the record's topic, partition and offset and the depth, never a crashed driver or JVM; the
    records around it land."""
    from materializer.config import load_config
    from materializer.runtime import Runtime
    from tests.helpers import delta_rs_list, write_config
    from tests.test_kafka import kafka_binding

    deep = document(2, 990, objects)
    dbz_deep = json.dumps({"before": None, "op": "c", "source": {}})[:-1] + ', "after": ' + document(2, 989, objects) + "}"
    broker.create_topic("deep-docs", 1)
    broker.create_topic("deep-dbz", 1)
    broker.produce("deep-docs", [(b"1", b'{"id": 1, "v": "a"}', 0), (b"2", deep.encode(), 0), (b"3", b'{"id": 3, "v": "c"}', 0)])
    dbz = [json.dumps({"before": None, "after": {"id": k, "v": "x"}, "op": "c", "source": {}}) for k in (1, 3)]
    broker.produce("deep-dbz", [(b"1", dbz[0].encode(), 0), (b"2", dbz_deep.encode(), 0), (b"3", dbz[1].encode(), 0)])
    tables = tmp_path / "tables"
    config = load_config(write_config(tmp_path, [
        {**kafka_binding(broker, "docs", "deep-docs", tables / "docs"), "on_invalid": "dead_letter"},
        {**kafka_binding(broker, "dbz", "deep-dbz", tables / "dbz", payload="debezium"), "on_invalid": "dead_letter"},
    ]))
    Runtime(config, spark).run()
    for name, topic, value in (("docs", "deep-docs", deep), ("dbz", "deep-dbz", dbz_deep)):
        assert sorted(r["id"] for r in delta_rs_list(tables / name)) == [1, 3], name
        dead = delta_rs_list(Path(str(tables / name) + "_dead_letters"))
        assert [(r["topic"], r["partition"], r["offset"], r["key"]) for r in dead] == [(topic, 0, 1, "2")], name
        assert "990 levels deep" in dead[0]["reason"] and f"at most {MAX_DEPTH} levels" in dead[0]["reason"], dead[0]["reason"]
        assert dead[0]["value"] == value
