"""The arrow validator (issue #25): documents with a declared schema checked in Arrow batches by
msgspec on the executors, typed by from_json; every other document down the VARIANT route in the
same job. A differential test holds it to the VARIANT route: same tables, same refusals (rule,
file, line)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from materializer.errors import SourceError
from materializer.sources.documents.route import VALIDATOR_CONF
from tests.test_documents import declared, write
from tests.test_documents_one_pass import staged_then_verified

pytestmark = pytest.mark.spark


def _run(spark: Any, tmp_path: Path, validator: str, src: Any = None) -> tuple[str, Any]:
    """One epoch of ``tmp_path/src`` through the deferred path with ``validator``: ("ok", rows by
    _seq, as reprs) or ("refused", the error's text)."""
    spark.conf.set(VALIDATOR_CONF, validator)
    try:
        src = src or declared(tmp_path)
        src.defer_checks = True
        out = tmp_path / f"out-{validator}"
        try:
            batch = src.next_batch(spark, None, 100, "x")
            assert batch is not None and batch.verify is not None
            # Stage the rows as they come (no combine: every document's typing is compared).
            try:
                batch.documents.write.mode("overwrite").parquet(str(out))
            except Exception as exc:
                explained = batch.explain(exc) if batch.explain is not None else None
                if explained is not None:
                    raise explained from exc
                raise
            count = batch.verify()
        except SourceError as exc:
            return "refused", str(exc)
        rows = spark.read.parquet(str(out)).orderBy("_seq").collect()
        return "ok", (count, [repr(r) for r in rows])
    finally:
        spark.conf.unset(VALIDATOR_CONF)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"id": 1, "amount": 2}{"id": 5}', "more than one JSON value"),
        ('{"amount": 1}', "key field 'id' is missing or null"),
        ("[1, 2]", "a document must be a JSON object"),
        ('{"id": 1, "colour": "red"}', "field 'colour' is not in the binding's source.schema"),
        ('{"id": 1, "amount": "12.5"}', "field 'amount' is a string but source.schema declares a number"),
        ('{"id": 1, "address": {"city": "Oslo", "zip": "0150"}}', "field 'address.zip' is not in"),
        ('{"id": 1, "tags": [1, "two"]}', "field 'tags[]' is a string but source.schema declares a number"),
        ('{"id": 1, "at": "yesterday"}', "a value does not fit source.schema: field 'at' holds \"yesterday\""),
        ('{"id": 1, "address": {"n": 3000000000}}', "a value does not fit source.schema: field 'address.n' holds 3000000000, which is not a valid INT"),
        ('{"id": {"a": 1}, "amount": 2}', "key field 'id' must be a scalar"),
        ('{"id": 1, "id": 2}', "not valid JSON"),
        ('{"id": 1, "note": "a:b", "note": "c"}', "not valid JSON"),
        ('{"id": 1, "amount": 1.00000000000000000000000000000000000000001}', "a number has more than 38 digits"),
        ('{"id": 1, "_meta": {"op": 1}}', "'_meta.op' must be a string"),
        ('{"id": 1, "_meta": null}', "'_meta' is null"),
        ('{"id": 1, "_op": "u"}', "field '_op' is reserved"),
        ('\ufeff{"id": 2}', "the line starts with a byte order mark (U+FEFF"),
        # A form feed or vertical tab is not JSON's whitespace: text after the value, flat or not.
        ('{"id": 2}\f', "more than one JSON value, or text after the document's value"),
        ('{"id": 2, "tags": [1]}\u000b', "more than one JSON value, or text after the document's value"),
    ],
)
def test_the_arrow_validator_refuses_with_the_variant_routes_text(spark: Any, tmp_path: Path, line: str, message: str) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1, "amount": 2}', line, '{"id": 3}'])
    arrow = _run(spark, tmp_path, "arrow")
    assert arrow[0] == "refused" and f"{tmp_path / 'src' / 'a.jsonl'}:2: {message}" in arrow[1]
    assert arrow == _run(spark, tmp_path, "variant")


@pytest.mark.parametrize("bad", [b"\xff", b"\xed\xa0\x80", b"\xc3", b"\xe2\x82"])
def test_a_line_that_is_not_utf8_is_refused_not_landed_with_replacement_characters(spark: Any, tmp_path: Path, bad: bytes) -> None:
    """Spark reads a line's bytes as they are and its JSON parser turns bytes that are not UTF-8
    into U+FFFD: such a document would land with its text changed. Both routes refuse it."""
    path = tmp_path / "src" / "a.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"id": 1, "amount": 2}\n{"id": 2, "note": "caf' + bad + b'"}\n{"id": 3}\n')
    arrow = _run(spark, tmp_path, "arrow")
    assert arrow[0] == "refused" and f"{path}:2: the line is not valid UTF-8" in arrow[1], arrow
    assert arrow == _run(spark, tmp_path, "variant")


def test_fast_documents_are_typed_by_from_json_and_the_others_by_the_variant_route(spark: Any, tmp_path: Path) -> None:
    lines = [
        '{"id": 1, "amount": 2, "note": "a:b", "tags": [1, null], "address": {"city": "Oslo", "n": 7}}',  # fast
        '{"id": 2, "note": {"any": ["json"]}}',  # a STRING field holding an object: the VARIANT route's text
        '{"id": 3, "at": "2024-01-02 03:04:05"}',  # a timestamp: the VARIANT route
        '{"id": 1, "_meta": {"op": "d"}}',  # fast
        '{"id": 4, "amount": -0.0}',  # not fast
    ]
    write(tmp_path / "src" / "a.jsonl", lines)
    src = declared(tmp_path)
    arrow = _run(spark, tmp_path, "arrow", src)
    assert src is not None
    variant = _run(spark, tmp_path, "variant")
    assert arrow == variant and arrow[0] == "ok" and arrow[1][0] == 5


@pytest.mark.slow
def test_an_executor_without_msgspec_stops_with_one_paragraph(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from materializer.sources.documents import check as document_check

    write(tmp_path / "src" / "a.jsonl", ['{"id": 1}'])
    original = document_check.check_batches

    def without_msgspec(*args: Any, **kwargs: Any) -> Any:
        inner = original(*args, **kwargs)

        def run(batches: Any) -> Any:
            import builtins

            real = builtins.__import__

            def refuse(name: str, *rest: Any, **kw: Any) -> Any:
                if name == "msgspec":
                    raise ImportError("No module named 'msgspec'")
                return real(name, *rest, **kw)

            builtins.__import__ = refuse
            try:
                yield from inner(batches)
            finally:
                builtins.__import__ = real

        return run

    monkeypatch.setattr(document_check, "check_batches", without_msgspec)
    status, text = _run(spark, tmp_path, "arrow")
    assert status == "refused" and text == document_check.MISSING
    # With dead letters the epoch's first job asks the validator whether every document is fast:
    # it stops as plainly.
    src = declared(tmp_path)
    src.binding = src.binding.model_copy(update={"on_invalid": "dead_letter"})
    status, text = _run(spark, tmp_path, "arrow", src)
    assert status == "refused" and text == document_check.MISSING


# --- the differential test: the arrow validator against the VARIANT route ------------------------

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.test_documents import TYPED_FROM_TEXT_VALUES  # noqa: E402

DIFF_SCHEMA = (
    "id BIGINT, i INT, s SMALLINT, t TINYINT, d DOUBLE, b BOOLEAN, note STRING, tags ARRAY<BIGINT>, "
    "address STRUCT<city: STRING, n: INT, deep: STRUCT<x: DOUBLE, day: DATE>>, "
    "items ARRAY<STRUCT<k: STRING, v: BIGINT, at: TIMESTAMP, p: DECIMAL(10,2)>>, "
    "at TIMESTAMP, day DATE, price DECIMAL(10,2), f FLOAT"
)
FIELDS = ["id", "i", "s", "t", "d", "b", "note", "tags", "address", "items", "at", "day", "price", "f"]
FLAT_SCHEMA = "id BIGINT, i INT, s SMALLINT, t TINYINT, d DOUBLE, b BOOLEAN, note STRING"
"""Top-level scalars only: the validator types every field and drops the fast documents' text."""
FLAT_FIELDS = FIELDS[:7]
EDGE_TEXTS = TYPED_FROM_TEXT_VALUES + [
    '"a:b"', '"::"', '"\\u003a"', '"quote \\" and : colon"', '"\\u00e9t\\u00e9"', '"\\ud83d\\ude00"', '""',
    '"2024-01-02 03:04:05"', '"2024-01-02T03:04:05Z"', '"2024-02-30"', '"2024-01-02"', "1700000000", "-0.5",
    "1.005", "12345678.995", "3.4e39", "-1.5e-50", "[]", "{}", "[null]", '{"city": "Oslo", "n": 1}',
    '{"city": null, "deep": {"x": -0.0}}', '{"city": "x", "city": "y"}', '[{"k": "a", "v": 1}, null]',
    '[{"k": "a", "v": 1.5}]', '{"op": "d"}', "[1, 2, 3]", "[9223372036854775808]",
]
NAMES = FIELDS + ["_meta", "_op", "x", "ID", "Note", "a b", "", "op", "k", "v", "city", "n", "deep"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(NAMES), inner, max_size=3),
    max_leaves=6,
).map(lambda v: json.dumps(v, ensure_ascii=False))
values = st.sampled_from(EDGE_TEXTS) | json_values | st.integers(-(2**31), 2**31).map(str)
separators = st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : "), (",\t", ":")])


def _dump(value: Any, ascii_only: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


def _ints(bits: int) -> Any:
    low, high = -(1 << bits), (1 << bits) - 1
    return st.integers(low, high).map(str) | st.sampled_from([str(low), str(high), str(low - 1), str(high + 1), "-0", "0", "1.0", "1e2"])


texts = st.builds(_dump, st.text(max_size=8), st.booleans()) | st.sampled_from(['"a:b"', '"::"', '"\\u003a"', '"q\\":"', '"\\ud83d\\ude00"', '""'])
doubles = st.floats(allow_nan=False, allow_infinity=False).map(_dump) | st.integers(-(2**70), 2**70).map(str) | st.sampled_from(EDGE_TEXTS[:27])
nullable = lambda inner: st.just("null") | inner  # noqa: E731
# Strings only: the VARIANT route refuses a TIMESTAMP field holding numbers and strings in one
# epoch ("holds values of different JSON kinds"), which would refuse most corpora (random
# values still bring numbers now and then).
# The validator types RFC 3339 texts with a zone, ISO dates and plain numbers within a
# decimal's digits itself (document_check.CONVERTERS); the others are the VARIANT route's.
# (Not the first days of year 1: collect's Python datetime cannot hold them in every zone.)
stamps = st.sampled_from([
    "null", '"2024-01-02 03:04:05"', '"2024-01-02T03:04:05Z"', '"yesterday"', '"2024-01-02T03:04:05.123456+05:30"',
    '"2024-01-02T03:04:05.5-08:00"', '"2024-01-02T03:04:05+18:00"', '"2024-01-02T03:04:05-18:00"', '"2024-01-02T03:04:05.1234567Z"',
    '"0001-01-03T00:00:00Z"', '"0001-01-03T00:30:00+01:00"', '"9999-12-30T23:59:59.999999Z"', '"9999-12-30T23:30:00-01:00"',
    '"2024-02-29T23:59:59Z"', '"2023-02-29T00:00:00Z"', '"2024-01-02T03:04:60Z"', '"2024-01-02T03:04:05"', '"2024-01-02T03:04:05+00:00"',
])
days = st.sampled_from(["null", '"2024-01-02"', '"2024-02-30"', '"0001-01-03"', '"9999-12-30"', '"1969-12-31"', '"2024-1-2"', '"2024-01-02T00:00:00Z"'])
prices = st.sampled_from([
    "null", "1.005", "12.5", "123456789.5", "7", "-0.00", "-0", "0", "99999999.99", "-99999999.99", "100000000", "0.01", "1.50",
    "1e1", "12.50e0", "00.5", "-12.34",
])
TYPED = {
    "id": _ints(63),
    "i": nullable(_ints(31)),
    "s": nullable(_ints(15)),
    "t": nullable(_ints(7)),
    "d": nullable(doubles),
    "b": st.sampled_from(["true", "false", "null"]),
    "note": nullable(texts),
    "tags": nullable(st.lists(nullable(_ints(63)), max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")),
    "address": nullable(
        st.fixed_dictionaries({}, optional={"city": nullable(texts), "n": nullable(_ints(31)), "deep": nullable(st.fixed_dictionaries({}, optional={"x": nullable(doubles), "day": days}).map(lambda d: "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}"))})
        .map(lambda d: "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}")
    ),
    "items": nullable(
        st.lists(nullable(st.fixed_dictionaries({}, optional={"k": nullable(texts), "v": nullable(_ints(63)), "at": stamps, "p": prices}).map(lambda d: "{" + ",".join(f'"{k}":{v}' for k, v in d.items()) + "}")), max_size=3)
        .map(lambda xs: "[" + ", ".join(xs) + "]")
    ),
    "at": stamps,
    "day": days,
    "price": prices,
    "f": st.sampled_from(["null", "1.5", "3.4e39", "-0.0"]),
}


@st.composite
def documents(draw: Any, fields: list[str] = FIELDS) -> str:
    """One line: mostly an object of declared fields with values of their type (edges included),
    sometimes random JSON, duplicates, undeclared names, ``_meta``; sometimes a line that is not
    a document."""
    if draw(st.integers(0, 29)) == 0:
        return draw(st.sampled_from(["{not json", '{"id": 1} x', '{"id": 1}{"id": 2}', "[1]", '"s"', "   ", "", "null", '{"id": 1,}']))
    pairs: list[tuple[str, str]] = []
    if draw(st.integers(0, 19)):
        pairs.append(("id", draw(TYPED["id"])))
    for name in draw(st.lists(st.sampled_from(fields[1:]), max_size=8, unique=True)):
        pairs.append((name, draw(TYPED[name] if draw(st.integers(0, 9)) else values)))
    if not draw(st.integers(0, 9)):
        pairs.append((draw(st.sampled_from(NAMES)), draw(values)))  # undeclared, a duplicate, a case-only twin
    if not draw(st.integers(0, 4)):
        pairs.append(("_meta", draw(st.sampled_from(['{"op": "d"}', '{"op": "u"}', '{"op": null}', "{}", "null", '"d"', '{"op": 1}', '{"op": "d", "x": 1}']))))
    if len(pairs) > 1 and draw(st.booleans()):
        pairs = draw(st.permutations(pairs))
    comma, colon = draw(separators)
    return "{" + comma.join(f"{json.dumps(k)}{colon}{v}" for k, v in pairs) + "}" + draw(st.sampled_from(["", " ", "\r"]))


def _variant_verdicts(spark: Any, tmp_path: Path, ddl: str) -> dict[int, bool]:
    """Per line of src/a.jsonl: whether the VARIANT route takes the document as it is (its per
    document checks, its shape against source.schema, and the cast of its rows, which fails on
    a value inside an array that does not fit); blank lines are left out."""
    from pyspark.sql import functions as F

    from materializer.sources.documents.types import cast_type
    from materializer.sources.documents.reader import DocumentReader, parse_shape
    from materializer.storage import open_store

    src = _diff_source(spark, tmp_path, ddl)
    reader = DocumentReader(spark, open_store(str(tmp_path / "src")), ["id"], src.declared_schema(spark), None)
    lines = reader.checked(reader._with_variant(reader.numbered("a.jsonl")))
    casts = F.col("__v").try_cast(cast_type(reader.declared)).isNotNull()
    found = lines.select("line", "__problem", F.schema_of_variant("__v").alias("shape"), casts.alias("casts")).collect()
    return {
        r["line"]: r["__problem"] is None and r["casts"] and not reader.single_problems(parse_shape(r["shape"])) for r in found
    }


def _diff_source(spark: Any, tmp_path: Path, ddl: str = DIFF_SCHEMA) -> Any:
    from tests.test_documents import make_binding
    from materializer.sources.documents.source import DocumentsSource
    from materializer.storage.local import LocalStore

    src = DocumentsSource(make_binding(tmp_path), LocalStore(str(tmp_path / "staging")))
    src.use_schema(spark.createDataFrame([], ddl).schema)
    return src


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(), min_size=20, max_size=120))
def test_the_arrow_validator_and_the_variant_route_agree(spark: Any, tmp_path_factory: Any, corpus: list[str]) -> None:
    """Generated documents (the edge values of test_typed_from_text_equals_the_variant_cast,
    random nested JSON, duplicates, undeclared names, bad lines), with nested and other declared
    types (typed by from_json) beside the scalars the validator types:

    1. a document the validator finds fast is one the VARIANT route takes as it is;
    2. the documents the VARIANT route takes land with identical values by either route;
    3. the whole corpus is refused by both with the same text (rule, file, line), or taken by
       both with identical rows."""
    _routes_agree(spark, tmp_path_factory.mktemp("diff"), corpus, DIFF_SCHEMA)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(FLAT_FIELDS), min_size=20, max_size=120))
def test_the_arrow_validator_and_the_variant_route_agree_on_scalars(spark: Any, tmp_path_factory: Any, corpus: list[str]) -> None:
    """As above with top-level scalars only, where the validator types every field of a fast
    document and its text does not go back to Spark."""
    _routes_agree(spark, tmp_path_factory.mktemp("diff"), corpus, FLAT_SCHEMA)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(), min_size=20, max_size=120), flat=st.booleans())
def test_dead_letters_are_the_same_by_either_route(spark: Any, tmp_path_factory: Any, corpus: list[str], flat: bool) -> None:
    """With ``on_invalid: dead_letter`` an epoch the validator does not find all fast is checked
    on the documents it marks (the fast ones skip the VARIANT parse and checks): the epoch's
    count, its rows and its dead letters (file, line, reason, text), or the error that stops it,
    are those of the VARIANT route checking every document."""
    tmp_path = tmp_path_factory.mktemp("dead")
    fields = FLAT_FIELDS if flat else FIELDS
    if flat:
        corpus = [line for line in corpus if not any(f'"{name}"' in line for name in FIELDS[7:])] or corpus[:1]
    write(tmp_path / "src" / "a.jsonl", corpus)
    ddl = FLAT_SCHEMA if flat else DIFF_SCHEMA
    from materializer.sources.documents.check import _compile

    fast, suspect, _columns, _whole = _compile(spark.createDataFrame([], ddl).schema.json(), ("id",), ())
    marked = sum(1 for line in corpus if not re.search(suspect, line) and fast(line.encode(), line.count(":")) is not None)
    event(f"documents the validator finds fast: {'none' if not marked else 'some' if marked < 10 else 'ten or more'}")
    variant = _dead_letter_run(spark, tmp_path, "variant", ddl)
    arrow = _dead_letter_run(spark, tmp_path, "arrow", ddl)
    assert arrow == variant
    event(f"dead letters: {'refused' if variant[0] == 'refused' else 'none' if not variant[3] else 'some'} ({len(fields)} fields)")


def _dead_letter_run(spark: Any, tmp_path: Path, validator: str, ddl: str) -> tuple[Any, ...]:
    """One dead-letter epoch of src/a.jsonl with ``validator``: its count, rows (by _seq, as
    reprs) and dead letters, or ("refused", the error's text)."""
    spark.conf.set(VALIDATOR_CONF, validator)
    try:
        src = _diff_source(spark, tmp_path, ddl)
        src.binding = src.binding.model_copy(update={"on_invalid": "dead_letter"})
        src.defer_checks = True
        try:
            batch = src.next_batch(spark, None, 100, "x")
            assert batch is not None
            out = tmp_path / f"dead-{validator}"
            try:
                # Staged as the runtime stages them: the first action on the rows is their write.
                if batch.documents is not None:
                    batch.documents.write.mode("overwrite").parquet(str(out))
                rows = [] if batch.documents is None else [repr(r) for r in spark.read.parquet(str(out)).orderBy("_seq").collect()]
            except Exception as exc:  # the staging job failed (a value the cast cannot take): as the runtime words it
                explained = batch.explain(exc) if batch.explain is not None else None
                if explained is None:
                    raise
                raise explained from exc
            # (An epoch the validator finds all fast is counted by its staging job's checks.)
            count = batch.verify() if batch.verify is not None else batch.count
            dead = [] if batch.rejected is None else sorted(tuple(r) for r in batch.rejected.collect())
        except SourceError as exc:
            return "refused", str(exc)
        return count, rows, batch.rejected_count, dead
    finally:
        spark.conf.unset(VALIDATOR_CONF)


def _routes_agree(spark: Any, tmp_path: Path, corpus: list[str], ddl: str) -> None:
    from materializer.sources.documents.check import _compile

    write(tmp_path / "src" / "a.jsonl", corpus)
    verdicts = _variant_verdicts(spark, tmp_path, ddl)
    schema = spark.createDataFrame([], ddl).schema
    fast, suspect, _columns, _whole = _compile(schema.json(), ("id",), ())
    found = 0
    for number, line in enumerate(corpus, start=1):
        if number in verdicts and not re.search(suspect, line) and fast(line.encode(), line.count(":")) is not None:
            assert verdicts[number], f"fast but refused by the VARIANT route: {line}"
            found += 1
    event(f"fast documents: {'none' if not found else 'some' if found < 10 else 'ten or more'}")
    # 2: the documents the VARIANT route takes, alone in an epoch.
    taken = [line for number, line in enumerate(corpus, start=1) if verdicts.get(number)]
    if taken:
        write(tmp_path / "src" / "a.jsonl", taken)
        variant = _run(spark, tmp_path, "variant", _diff_source(spark, tmp_path, ddl))
        arrow = _run(spark, tmp_path, "arrow", _diff_source(spark, tmp_path, ddl))
        assert arrow == variant
        event(f"the documents the VARIANT route takes: {variant[0]}")
    # 3: the whole corpus.
    write(tmp_path / "src" / "a.jsonl", corpus)
    variant = _run(spark, tmp_path, "variant", _diff_source(spark, tmp_path, ddl))
    arrow = _run(spark, tmp_path, "arrow", _diff_source(spark, tmp_path, ddl))
    assert arrow == variant
    event(f"the corpus: {variant[0]}")


@pytest.mark.slow
@pytest.mark.connect
def test_the_arrow_validator_runs_on_spark_connect(connect_spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """mapInArrow and from_json through a Connect server (as Databricks serverless runs them):
    the fast documents land, a refused one is named by file and line, nothing of its epoch lands."""
    from materializer.runtime import Runtime
    from materializer.sources.documents import route as document_route
    from tests.helpers import binding, table_rows, write_jsonl
    from tests.test_holes import config_with

    spark = connect_spark
    routes: list[str] = []
    original = document_route.deferred
    monkeypatch.setattr(document_route, "deferred", lambda reader, parsed: (routes.append("arrow"), original(reader, parsed))[1])
    table = tmp_path / "tables" / "items"
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "amount": 1.5}, {"id": 2, "note": "a:b"}, {"id": 5, "note": {"any": 1}}, {"id": 1, "_meta": {"op": "d"}}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 3, "amount": 2}, {"id": 4, "colour": "red"}])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, amount DOUBLE, note STRING", max_files=1)])
    spark.conf.set(VALIDATOR_CONF, "arrow")
    try:
        with pytest.raises(SourceError, match=r"b\.jsonl:2: field 'colour' is not in the binding's source\.schema"):
            Runtime(config, spark).run()
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    assert routes == ["arrow", "arrow"]
    rows = table_rows(spark, table, ["id"])
    assert {key[0]: row.get("note") for key, row in rows.items()} == {2: "a:b", 5: '{"any":1}'}

    # With dead letters: the refused epoch's bad document is a dead letter (the validator's pass
    # sets it aside in the spool, where the checks and the dead letters' rows read it); an epoch
    # of fast documents only is staged on the arrow route, as fail's.
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 6, "amount": 6.5}])
    lenient = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, amount DOUBLE, note STRING", max_files=1, on_invalid="dead_letter")])
    spark.conf.set(VALIDATOR_CONF, "arrow")
    try:
        Runtime(lenient, spark).run()
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    assert routes == ["arrow", "arrow", "arrow"]
    assert sorted(key[0] for key in table_rows(spark, table, ["id"])) == [2, 3, 5, 6]
    dead = spark.read.format("delta").load(f"{table}_dead_letters").collect()
    assert [(r["epoch"], r["source"].rsplit("/", 1)[-1], r["line"]) for r in dead] == [(2, "b.jsonl", 2)]
    # What Connect wrote, read by another Delta reader too (delta-rs).
    from tests.helpers import delta_rs_list, delta_rs_rows

    assert delta_rs_rows(table, ["id"]) == table_rows(spark, table, ["id"])
    assert [(r["epoch"], r["line"]) for r in delta_rs_list(f"{table}_dead_letters")] == [(2, 2)]


def test_timestamps_dates_and_decimals_the_validator_types_land_exactly_over_spark_connect(connect_spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """The validator's own typing of top-level TIMESTAMPs, DATEs and DECIMALs
    (document_values), and its checks of those inside structs and arrays (from_json types them),
    through a Connect server: delta-rs reads the documents' own instants, days and digits, and the
    table is the one the VARIANT route writes from the same files, values in other forms (the
    VARIANT route's to type) included."""
    import datetime as dt
    from decimal import Decimal

    from materializer.runtime import Runtime
    from materializer.sources.documents import check as document_check
    from materializer.sources.documents import route as document_route
    from tests.helpers import binding, delta_rs_rows, write_jsonl
    from tests.test_holes import config_with

    spark = connect_spark
    typed: list[list[str]] = []
    original = document_check.check_batches
    monkeypatch.setattr(document_check, "check_batches", lambda *a, **k: (typed.append(list(k.get("typed") or [])), original(*a, **k))[1])
    fast: list[int] = []
    deferred = document_route.deferred

    def counted(reader: Any, parsed: Any, **kwargs: Any) -> Any:
        rows, verify = deferred(reader, parsed, **kwargs)
        return rows, lambda: (verify(), fast.append(reader.fast))[0]

    monkeypatch.setattr(document_route, "deferred", counted)
    stamps = [{"at": "2026-11-29T08:00:00.5+01:00", "p": 12.5}, None, {"at": None, "p": 7}, {"at": "1900-01-01T00:30:00+01:00"}]
    write_jsonl(tmp_path / "src" / "a.jsonl", [
        {"id": 1, "at": "2026-11-29T08:00:00.5+01:00", "day": "2026-11-29", "price": 12.5, "lines": stamps, "ship": {"day": "2026-11-30"}},
        {"id": 2, "at": "1969-12-31T23:59:59.999999Z", "day": "1969-12-31", "price": -0.01, "lines": [{"p": -0.01}]},
        {"id": 3, "price": 7, "at": None, "ship": {"day": None}},
        {"id": 5, "at": "2026-11-29T08:00:00-18:00", "day": "0001-01-03"},
    ])  # every document fast: the batch is typed whole, by Arrow's casts
    write_jsonl(tmp_path / "src" / "b.jsonl", [
        {"id": 4, "at": "2026-11-29T08:00:00.1234567Z", "price": 99999999.99},  # nanoseconds: the VARIANT route's
        {"id": 6, "at": "2026-11-29T08:00:00Z", "day": "2026-11-29", "price": 0.5},  # typed alone, by Python's
        {"id": 7, "lines": [{"at": "2026-11-29T08:00:00+01:00"}, {"at": "2026-11-29T08:00:00"}]},  # no zone inside: the VARIANT route's
        {"id": 8, "lines": [{"p": 1.25}], "ship": {"day": "2026-12-01"}},  # fast
    ])
    schema = "id BIGINT, at TIMESTAMP, day DATE, price DECIMAL(10,2), lines ARRAY<STRUCT<at: TIMESTAMP, p: DECIMAL(10,2)>>, ship STRUCT<day: DATE>"
    tables = {}
    for validator in ("arrow", "variant"):
        tables[validator] = tmp_path / validator / "table"
        config = config_with(tmp_path / validator, [binding("items", tmp_path / "src", tables[validator], schema=schema)])
        spark.conf.set(VALIDATOR_CONF, validator)
        try:
            Runtime(config, spark).run()
        finally:
            spark.conf.unset(VALIDATOR_CONF)
    assert typed and typed[0] == ["id", "at", "day", "price"]  # the arrow run typed them in the validator
    assert fast == [4, 2]  # an epoch a file: every document but 4 and 7
    rows = delta_rs_rows(tables["arrow"], ["id"])
    assert rows == delta_rs_rows(tables["variant"], ["id"])
    # (delta-rs gives a TIMESTAMP as a UTC datetime without its zone.)
    assert rows[(1,)] == {
        "id": 1, "at": dt.datetime(2026, 11, 29, 7, 0, 0, 500000), "day": dt.date(2026, 11, 29), "price": Decimal("12.50"),
        "lines": [
            {"at": dt.datetime(2026, 11, 29, 7, 0, 0, 500000), "p": Decimal("12.50")}, None, {"at": None, "p": Decimal("7.00")},
            {"at": dt.datetime(1899, 12, 31, 23, 30), "p": None},
        ],
        "ship": {"day": dt.date(2026, 11, 30)},
    }
    assert rows[(2,)] == {
        "id": 2, "at": dt.datetime(1969, 12, 31, 23, 59, 59, 999999), "day": dt.date(1969, 12, 31), "price": Decimal("-0.01"),
        "lines": [{"at": None, "p": Decimal("-0.01")}],
    }
    assert rows[(3,)] == {"id": 3, "price": Decimal("7.00"), "ship": {"day": None}}
    assert rows[(5,)]["at"] == dt.datetime(2026, 11, 30, 2, 0) and rows[(5,)]["day"] == dt.date(1, 1, 3)
    assert rows[(4,)]["price"] == Decimal("99999999.99")
    assert rows[(6,)] == {"id": 6, "at": dt.datetime(2026, 11, 29, 8, 0), "day": dt.date(2026, 11, 29), "price": Decimal("0.50")}
    assert rows[(7,)]["lines"][0] == {"at": dt.datetime(2026, 11, 29, 7, 0), "p": None}
    assert rows[(8,)] == {"id": 8, "lines": [{"at": None, "p": Decimal("1.25")}], "ship": {"day": dt.date(2026, 12, 1)}}


@pytest.mark.slow
def test_a_value_from_json_cannot_read_is_refused_never_a_null(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """Spark's verdict is final: were the validator to pass a value from_json cannot read (here
    every document is made fast), the staging job fails (FAILFAST) and the error path names the
    document; nothing lands as NULL."""
    from materializer.sources.documents import check as document_check

    original = document_check.check_batches

    def all_fast(*args: Any, **kwargs: Any) -> Any:
        inner = original(*args, **kwargs)

        def run(batches: Any) -> Any:
            import pyarrow as pa

            for batch in inner(batches):
                columns = [pa.array([True] * batch.num_rows) if name == "__ok" else column for name, column in zip(batch.schema.names, batch.columns)]
                yield pa.RecordBatch.from_arrays(columns, names=batch.schema.names)

        return run

    monkeypatch.setattr(document_check, "check_batches", all_fast)
    # A FLOAT is typed by from_json (a top-level TIMESTAMP is the validator's own, from its text).
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1, "amount": 2}', '{"id": 2, "ratio": "much"}'])
    status, text = _run(spark, tmp_path, "arrow")
    assert status == "refused"
    assert f"{tmp_path / 'src' / 'a.jsonl'}:2: a value does not fit source.schema: field 'ratio' holds \"much\"" in text, text


def test_a_small_epoch_takes_the_variant_route_unless_the_conf_picks_one(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """With the conf unset, an epoch under SMALL_EPOCH_BYTES of documents is checked in Spark
    expressions (no Python worker to start, which Spark stops after a minute idle), a bigger one
    by the arrow validator; the conf, when set, decides alone. Both land the same rows."""
    from materializer.runtime import Runtime
    from materializer.sources.documents import route as document_route
    from tests.helpers import binding, delta_rs_rows, table_rows, write_jsonl
    from tests.test_holes import config_with

    from materializer.sources.documents.reader import DocumentReader

    routes: list[str] = []
    original = DocumentReader.deferred
    monkeypatch.setattr(DocumentReader, "deferred", lambda reader, parsed: (routes.append(reader.validator), original(reader, parsed))[1])
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "amount": 1.5}])  # 27 bytes
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": i, "amount": i / 2, "note": "x" * 40} for i in range(2, 12)])  # 600-odd
    table = tmp_path / "tables" / "items"
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, amount DOUBLE, note STRING", max_files=1)])
    monkeypatch.setattr(document_route, "SMALL_EPOCH_BYTES", 100)
    Runtime(config, spark).run()
    assert routes == ["variant", "arrow"]
    rows = table_rows(spark, table, ["id"])
    assert rows == delta_rs_rows(table, ["id"]) and sorted(k[0] for k in rows) == list(range(1, 12))
    assert rows[(11,)]["amount"] == 5.5 and rows[(1,)] == {"id": 1, "amount": 1.5}  # (NULL fields dropped)

    spark.conf.set(VALIDATOR_CONF, "arrow")
    try:
        assert document_route.validator(spark, small=True) == "arrow"
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    assert document_route.validator(spark, small=True) == "variant" and document_route.validator(spark) == "arrow"

    # A schema with a field whose values the validator never finds fast (a FLOAT, a map, a
    # TIMESTAMP_NTZ inside a struct): the VARIANT route, unless the conf picks the validator.
    from pyspark.sql import types as T

    plain = T.StructType([T.StructField("id", T.LongType()), T.StructField("tags", T.ArrayType(T.StringType()))])
    never = (T.FloatType(), T.MapType(T.StringType(), T.LongType()), T.StructType([T.StructField("t", T.TimestampNTZType())]))
    for extra in never:
        stamped = T.StructType([*plain.fields, T.StructField("x", extra)])
        assert document_route.validator(spark, declared=stamped) == "variant", extra
        spark.conf.set(VALIDATOR_CONF, "arrow")
        try:
            assert document_route.validator(spark, declared=stamped) == "arrow"
        finally:
            spark.conf.unset(VALIDATOR_CONF)
    assert document_route.validator(spark, declared=plain) == "arrow"
    stamped = T.StructType([*plain.fields, T.StructField("t", T.TimestampType()), T.StructField("d", T.DateType()), T.StructField("p", T.DecimalType(10, 2))])
    assert document_route.validator(spark, declared=stamped) == "arrow"  # top-level ones the validator types
    deep = T.StructType([*plain.fields, T.StructField("s", T.StructType([T.StructField("t", T.TimestampType())])), T.StructField("a", T.ArrayType(T.StructType([T.StructField("d", T.DecimalType(10, 2))])))])
    assert document_route.validator(spark, declared=deep) == "arrow"  # deeper ones it checks (from_json types them)


def test_a_bigger_epochs_error_path_says_it_reads_the_epoch_again(spark: Any, tmp_path: Path, monkeypatch: Any, caplog: Any) -> None:
    """Naming a refused document reads the epoch again (the full checks, then its lines
    numbered): on a big file that is as long as the staging job was, so the run says so first,
    found by the staging job's checks or by its failed cast alike. A small epoch's error comes
    as fast as that line would: nothing more is said. Either way the error path parses only the
    documents the validator does not find fast: the full checks and the bad file's numbered lines
    get the validator's marks (``__ok``), not a VARIANT parse of every line."""
    import logging

    from materializer.sources.documents import route as document_route
    from materializer.sources.documents.reader import DocumentReader

    monkeypatch.setattr(document_route, "SMALL_EPOCH_BYTES", 200)
    judged: list[tuple[str, bool]] = []
    check, located = DocumentReader.check, DocumentReader._located

    def spied_check(self: Any, parsed: Any) -> Any:
        judged.append(("check", "__ok" in parsed.columns))
        return check(self, parsed)

    def spied_located(self: Any, *args: Any, **kwargs: Any) -> Any:
        judged.append(("lines", self.judged_for_errors is not None))
        return located(self, *args, **kwargs)

    monkeypatch.setattr(DocumentReader, "check", spied_check)
    monkeypatch.setattr(DocumentReader, "_located", spied_located)
    cast = '{"id": 9, "address": {"n": 3000000000}}'  # fails the staging job's cast
    undeclared = '{"id": 9, "colour": "red"}'  # found by its checks
    for folder, count, bad, said in (("big-cast", 8, cast, True), ("big", 8, undeclared, True), ("small", 0, undeclared, False)):
        write(tmp_path / folder / "src" / "a.jsonl", ['{"id": 1, "amount": 2.5, "note": "fine"}'] * count + [bad])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="materializer"):
            status, text = _run(spark, tmp_path / folder, "arrow")
        assert status == "refused" and f"a.jsonl:{count + 1}: " in text, text
        rereads = [r.getMessage() for r in caplog.records if "reading the epoch again" in r.getMessage()]
        expected = f"{tmp_path / folder / 'src'}: the staging job found documents to check more closely; reading the epoch again to name any refused (file and line)"
        assert rereads == ([expected] if said else []), (folder, rereads)
        assert judged and all(marked for _what, marked in judged) and judged[-1][0] == "lines", (folder, judged)
        judged.clear()
