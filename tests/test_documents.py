"""The documents source: the epoch's extent in plain Python; reading and every check in Spark."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.config import BindingConfig
from materializer.errors import ConfigError, SourceError
from materializer.sources.documents.source import DocumentsSource, is_document_file, plan_epoch
from materializer.sources.documents.reader import parse_shape, shape_problems
from materializer.storage import FileInfo
from materializer.storage.local import LocalStore


def make_binding(tmp_path: Path, **source: Any) -> BindingConfig:
    return BindingConfig.model_validate(
        {
            "name": "b",
            "source": {"format": "documents", "path": str(tmp_path / "src"), **source},
            "table": str(tmp_path / "t"),
            "key": ["id"],
        }
    )


def source(tmp_path: Path, **options: Any) -> DocumentsSource:
    (tmp_path / "src").mkdir(parents=True, exist_ok=True)
    return DocumentsSource(make_binding(tmp_path, **options), LocalStore(str(tmp_path / "staging")))


def write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def files(*sizes: tuple[str, int]) -> list[FileInfo]:
    return [FileInfo(name, size) for name, size in sizes]


# --- the extent: no JVM ---------------------------------------------------------------------------


def test_an_epoch_is_whole_files_bounded_by_count_and_bytes_and_at_least_one() -> None:
    listing = files(("a.jsonl", 10), ("b.jsonl", 10), ("c.jsonl", 10), ("d.jsonl", 100))
    plan = plan_epoch(listing, None, 2, 1000, "src")
    assert [f.path for f in plan.files] == ["a.jsonl", "b.jsonl"]
    assert (plan.lag_files, plan.lag_bytes) == (2, 110)
    assert plan.checkpoint() == {"file": "b.jsonl", "before": 1, "sizes": {"a.jsonl": 10, "b.jsonl": 10}}
    plan = plan_epoch(listing, plan.checkpoint(), 10, 50, "src")
    assert [f.path for f in plan.files] == ["c.jsonl"]  # d would pass 50 bytes
    plan = plan_epoch(listing, plan.checkpoint(), 10, 50, "src")
    assert [f.path for f in plan.files] == ["d.jsonl"]  # larger than max_bytes, still taken whole
    assert plan_epoch(listing, plan.checkpoint(), 10, 50, "src").empty


def test_a_re_read_for_recover_takes_exactly_the_committed_extent() -> None:
    listing = files(("a.jsonl", 10), ("b.jsonl", 10), ("c.jsonl", 10))  # c arrived after the epoch
    plan = plan_epoch(listing, None, 1000, 1000, "src", until="b.jsonl")
    assert [f.path for f in plan.files] == ["a.jsonl", "b.jsonl"]


def test_a_late_file_that_sorts_before_the_checkpoint_is_reported() -> None:
    checkpoint = {"file": "b.jsonl", "before": 0, "sizes": {"b.jsonl": 10}}
    with pytest.raises(SourceError, match="1 file\\(s\\) appeared that sort before 'b.jsonl'"):
        plan_epoch(files(("a.jsonl", 5), ("b.jsonl", 10)), checkpoint, 10, 100, "src")


def test_deleting_processed_files_is_fine() -> None:
    checkpoint = {"file": "b.jsonl", "before": 1, "sizes": {"a.jsonl": 5, "b.jsonl": 10}}
    plan = plan_epoch(files(("c.jsonl", 5)), checkpoint, 10, 100, "src")
    assert [f.path for f in plan.files] == ["c.jsonl"]
    assert plan.checkpoint()["before"] == 0


def test_lines_appended_to_a_file_already_read_are_reported() -> None:
    checkpoint = {"file": "b.jsonl", "before": 1, "sizes": {"a.jsonl": 5, "b.jsonl": 10}}
    with pytest.raises(SourceError, match="b.jsonl: the file was 10 bytes when the pipeline read it and is 25 bytes now"):
        plan_epoch(files(("a.jsonl", 5), ("b.jsonl", 25)), checkpoint, 10, 100, "src")


def test_a_previous_versions_checkpoint_finishes_its_file_then_takes_whole_files() -> None:
    listing = files(("a.jsonl", 100), ("b.jsonl", 10))
    old = {"file": "a.jsonl", "line": 4, "offset": 40, "before": 0}
    plan = plan_epoch(listing, old, 10, 1000, "src")
    assert plan.resume == (FileInfo("a.jsonl", 100), 4)
    assert [f.path for f in plan.files] == ["b.jsonl"]
    assert plan.checkpoint()["file"] == "b.jsonl"
    done = {"file": "a.jsonl", "line": 10, "offset": 100, "before": 0}  # the file read to its end
    plan = plan_epoch(listing, done, 10, 1000, "src")
    assert plan.resume is None and [f.path for f in plan.files] == ["b.jsonl"]


def test_sub_folders_hidden_and_underscore_files_are_not_documents() -> None:
    assert is_document_file("orders-001.jsonl")
    for name in ("_temporary/0/part.jsonl", ".inflight/a.jsonl", "_SUCCESS.json", ".a.jsonl", "sub/a.jsonl", "a.txt"):
        assert not is_document_file(name), name


def test_shapes_parse_quoted_names_and_name_problems_are_found() -> None:
    shape = parse_shape("OBJECT<``: BIGINT, `Na me`: BIGINT, ```q`: ARRAY<DECIMAL(2,1)>, id: BIGINT, o: OBJECT<`x=y`: VOID>>")
    assert shape == (
        "object",
        [("", "BIGINT"), ("Na me", "BIGINT"), ("`q", ("array", ("decimal", 2, 1))), ("id", "BIGINT"), ("o", ("object", [("x=y", "VOID")]))],
    )
    problems = " | ".join(shape_problems(shape))
    assert "empty name" in problems and "'Na me'" in problems and "'`q'" in problems and "'o.x=y'" in problems
    assert "differ only in case" in " ".join(shape_problems(parse_shape("OBJECT<Name: BIGINT, id: BIGINT, name: STRING>")))
    assert "different JSON kinds" in " ".join(shape_problems(parse_shape("OBJECT<a: OBJECT<b: VARIANT>>")))


def test_a_fraction_where_a_whole_number_is_declared_is_worded_as_such() -> None:
    """It read "field 'm[]' is a number but source.schema declares a number"."""
    from pyspark.sql import types as T

    from materializer.sources.documents.schema import kinds_of, misfit

    kinds = kinds_of(T.StructType([T.StructField("m", T.MapType(T.StringType(), T.IntegerType())), T.StructField("n", T.LongType())]))
    assert misfit({"m": {"a": 1.5}}, kinds, "").startswith("field 'm[]' is a number with a fraction but source.schema declares a whole number")
    assert misfit({"n": "1"}, kinds, "").startswith("field 'n' is a string but source.schema declares a number")
    assert misfit({"m": {"a": 1}, "n": 2}, kinds, "") is None


def test_a_source_folder_that_does_not_exist_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="source folder .*src does not exist"):
        DocumentsSource(make_binding(tmp_path), LocalStore(str(tmp_path / "staging")))
    (tmp_path / "src").mkdir()
    assert DocumentsSource(make_binding(tmp_path), LocalStore(str(tmp_path / "staging"))).next_batch(None, None, 1, "x") is None  # type: ignore[arg-type]


# --- reading and checking in Spark ----------------------------------------------------------------

DEEP = '{"id": 9, "deep": ' + "[" * 1100 + "]" * 1100 + "}"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": 1, "x": }', "not valid JSON"),
        # Spark's parser reads the first value and ignores the rest: the second document would be lost.
        ('{"id": 4}{"id": 5}', "more than one JSON value, or text after the document's value"),
        ('{"id": 4, "o": {"a": [1]}} {"id": 5}', "more than one JSON value"),
        ('{"id": 4}, {"id": 5}', "more than one JSON value"),
        ('{"id": 4} x', "text after the document's value"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ('{"x": 1}', "key field 'id' is missing"),
        ('{"id": null}', "key field 'id' is missing or null"),
        ('{"id": {"a": 1}}', "key field 'id' must be a scalar"),
        ('{"id": 1, "_op": "u"}', "'_op' is reserved"),
        ('{"id": 1, "_seq": 3}', "'_seq' is reserved"),
        ('{"id": 1, "_meta": null}', "'_meta' is null"),
        ('{"id": 1, "_meta": "d"}', "'_meta' must be an object"),
        ('{"id": 1, "_meta": {"op": 1}}', "'_meta.op' must be a string"),
        ('{"id": 12345678901234567890123456789012345678901}', "more than 38 digits"),
        ('{"id": 1, "n": 1.00000000000000000000000000000000000000001}', "more than 38 digits"),
        # A finite number beyond a double would land as Infinity (a string "Infinity" is text).
        ('{"id": 1, "s": "Infinity", "n": [1, -1.8e308]}', "a number is beyond what its type holds (a DOUBLE about 1.8e308"),
        (DEEP, "the document is nested 1101 levels deep"),
        ('{"id": 1, "n": ' + "1" * 1500 + "}", "beyond what Spark's JSON parser reads"),
        ('{"id": 1, "": 2}', "empty name"),
        ('{"id": 1, "Name": 1, "name": 2}', "differ only in case"),
        ('{"id": 1, "a b": 1}', "field 'a b' has a name Delta refuses"),
        ('{"id": 1, "a`b": 1}', "field 'a`b' has a name Delta refuses"),
        ('{"id": 1, "o": {"x=y": 1}}', "field 'o.x=y' has a name Delta refuses"),
    ],
)
def test_a_bad_document_names_file_and_line(spark: Any, tmp_path: Path, line: str, message: str) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1}', '{"id": 2}', line, '{"id": 3}'])
    with pytest.raises(SourceError) as info:
        source(tmp_path).next_batch(spark, None, 100, "spool/x.jsonl")
    assert f"{tmp_path / 'src' / 'a.jsonl'}:3: " in str(info.value)
    assert message in str(info.value)
    assert info.value.line == 3
    assert not (tmp_path / "staging").exists()  # nothing spooled or staged


@pytest.mark.slow
def test_a_string_beyond_sparks_limit_is_refused_not_dropped(spark: Any, tmp_path: Path) -> None:
    # Spark's JSON parser refuses strings over 20 MB: the previous version's reader dropped the row.
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1}', '{"id": 2, "s": "' + "x" * 21_000_000 + '"}', '{"id": 3}'])
    with pytest.raises(SourceError, match=r"a.jsonl:2: not valid JSON, or beyond what Spark's JSON parser reads"):
        source(tmp_path).next_batch(spark, None, 100, "x")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("lines", "bad", "message"),
    [
        # A struct sub-field that is a number, then a string "12": refused, never coerced.
        (['{"id": 1, "o": {"n": 12}}', '{"id": 2, "o": {"n": "12"}}'], 2, "field 'o.n' is a string here but a number in earlier"),
        (['{"id": 1, "x": {"a": 1}}', '{"id": 2}', '{"id": 3, "x": [1]}'], 3, "field 'x' is an array here but an object"),
        (['{"id": 1, "t": [1, "two"]}'], 1, "field 't[]' holds values of different JSON kinds"),
        (['{"id": 1, "f": true}', '{"id": 2, "f": 0}'], 2, "field 'f' is a number here but a boolean"),
    ],
)
def test_a_field_of_two_kinds_in_one_epoch_names_the_first_line_that_differs(
    spark: Any, tmp_path: Path, lines: list[str], bad: int, message: str
) -> None:
    write(tmp_path / "src" / "a.jsonl", lines)
    with pytest.raises(SourceError) as info:
        source(tmp_path).next_batch(spark, None, 100, "x")
    assert f"a.jsonl:{bad}: {message}" in str(info.value)


def test_types_are_inferred_as_json_inference_did_and_a_null_field_carries_no_type(spark: Any, tmp_path: Path) -> None:
    write(
        tmp_path / "src" / "a.jsonl",
        [
            '{"id": 1, "n": 2, "x": 1.5, "o": {"s": "a", "z": null}, "t": [], "gone": null, "big": 123456789012345678901234}',
            '{"id": 2, "n": 3, "x": 2, "t": [1], "gone": null, "big": 1}',
        ],
    )
    batch = source(tmp_path).next_batch(spark, None, 100, "x")
    assert batch is not None and batch.count == 2
    types = {f.name: f.dataType.simpleString() for f in batch.documents.schema.fields}
    assert types == {
        "big": "decimal(24,0)", "id": "bigint", "n": "bigint", "o": "struct<s:string,z:void>",
        "t": "array<bigint>", "x": "double", "_op": "string",
        "_seq": "struct<file:string,block:bigint,row:bigint>",
    }
    rows = {r["id"]: r for r in batch.documents.collect()}
    assert rows[1]["big"] == 123456789012345678901234 and rows[2]["x"] == 2.0


@pytest.mark.slow
def test_one_value_per_line_keeps_nested_documents_braces_in_strings_and_whitespace(spark: Any, tmp_path: Path) -> None:
    # The check for text after a document's value (materializer.sources.json_text) parses the
    # lines that are not flat objects again: none of these may be refused or altered by it.
    write(
        tmp_path / "src" / "a.jsonl",
        ['{"id": 1, "s": "}{ x, ]"}  ', '{"id": 2, "o": {"a": ["x", "]"]}}\t', '  {"id": 3, "_meta": {"op": "d"}}', '{"id": 4,"s":"{}"}'],
    )
    batch = source(tmp_path).next_batch(spark, None, 100, "x")
    assert batch is not None and batch.count == 4
    rows = {r["id"]: r for r in batch.documents.collect()}
    assert rows[1]["s"] == "}{ x, ]" and rows[2]["o"]["a"] == ["x", "]"] and rows[3]["_op"] == "d" and rows[4]["s"] == "{}"


@pytest.mark.slow
def test_blank_lines_of_any_whitespace_are_skipped_and_still_counted(spark: Any, tmp_path: Path) -> None:
    # A line is blank when it holds only JSON whitespace or \f \v; a line that starts with "{" is
    # never trimmed (the cheap test first). Blank lines are skipped, yet counted in line numbers.
    blanks = ["", "   ", "\t", "\r", " \f ", "\u000b"]
    write(tmp_path / "src" / "a.jsonl", [blanks[0], '{"id": 1}', *blanks[1:], ' {"id": 2}', "\t{\"id\": 3}\r"])
    batch = source(tmp_path).next_batch(spark, None, 100, "x")
    assert batch is not None and batch.count == 3
    assert sorted(r["id"] for r in batch.documents.collect()) == [1, 2, 3]
    write(tmp_path / "src" / "b.jsonl", ["  ", '{"id": 4}', "\f", "{x"])
    with pytest.raises(SourceError, match=r"b.jsonl:4: not valid JSON"):
        source(tmp_path).next_batch(spark, batch.checkpoint, 100, "x")


@pytest.mark.slow
def test_distinct_long_keys_stay_distinct(spark: Any, tmp_path: Path) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 12345678901234567890123456789012345678, "v": 1}', '{"id": 12345678901234567890123456789012345679, "v": 2}'])
    batch = source(tmp_path).next_batch(spark, None, 100, "x")
    assert batch is not None
    assert sorted(int(r["id"]) for r in batch.documents.collect()) == [
        12345678901234567890123456789012345678, 12345678901234567890123456789012345679
    ]


def test_last_write_wins_by_file_and_position_however_spark_splits_and_packs(spark: Any, tmp_path: Path) -> None:
    from materializer import reductions

    # Small files packed together and large ones split: pieces of several files in one partition.
    expected: dict[int, dict[str, Any]] = {}
    for f in range(6):
        lines = []
        for i in range(400 if f % 2 else 7):
            doc: dict[str, Any] = {"id": (i * 7 + f) % 23, "v": f * 1000 + i, "pad": "p" * (i % 13)}
            if i % 17 == 5:
                doc = {"id": doc["id"], "_meta": {"op": "d"}}
                expected.pop(doc["id"], None)
            else:
                expected[doc["id"]] = {"v": doc["v"]}
            lines.append(json.dumps(doc))
        write(tmp_path / "src" / f"part-{f:02d}.jsonl", lines)
    spark.conf.set("spark.sql.files.maxPartitionBytes", "700")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    try:
        batch = source(tmp_path).next_batch(spark, None, 100, "x")
        assert batch is not None
        # Spark did split the large files: several pieces (block starts) of one file.
        assert batch.documents.where("_seq.block > 0").select("_seq.file").distinct().count() == 3
        combined = reductions.combine(batch.documents, make_binding(tmp_path))
        rows = {r["id"]: {"v": r["v"]} for r in combined.collect() if r["_op"] != "d"}
        deleted = {r["id"] for r in combined.collect() if r["_op"] == "d"}
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")
    assert rows == expected
    assert deleted.isdisjoint(expected)


@pytest.mark.slow
def test_the_fold_orders_by_file_and_position_too(spark: Any, tmp_path: Path) -> None:
    from materializer import reductions

    write(tmp_path / "src" / "a.jsonl", [json.dumps({"id": 1, "n": i, "last": i}) for i in range(50)])
    write(tmp_path / "src" / "b.jsonl", [json.dumps({"id": 1, "n": 1000, "last": -1}), json.dumps({"id": 1, "_meta": {"op": "d"}}), json.dumps({"id": 1, "n": 5, "last": 7})])
    binding = BindingConfig.model_validate(
        {"name": "b", "source": {"format": "documents", "path": str(tmp_path / "src")}, "table": str(tmp_path / "t"), "key": ["id"], "mode": "delta_updates", "reductions": {"n": "sum"}}
    )
    spark.conf.set("spark.sql.files.maxPartitionBytes", "300")
    try:
        batch = DocumentsSource(binding, LocalStore(str(tmp_path / "staging"))).next_batch(spark, None, 100, "x")
        assert batch is not None
        rows = reductions.reduce(batch.documents, None, binding).collect()
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert [(r["n"], r["last"], r["_op"]) for r in rows] == [(5, 7, "u")]


@pytest.mark.slow
def test_a_previous_versions_checkpoint_resumes_inside_its_file(spark: Any, tmp_path: Path) -> None:
    lines = [json.dumps({"id": i}) for i in range(5)]
    write(tmp_path / "src" / "a.jsonl", lines[:2] + [""] + lines[2:])
    write(tmp_path / "src" / "b.jsonl", [json.dumps({"id": i}) for i in range(5, 8)])
    # What the previous version's reader committed after 3 documents of a.jsonl (4 lines: one blank).
    read = "".join(line + "\n" for line in (lines[:2] + [""] + lines[2:3]))
    old = {"file": "a.jsonl", "line": 4, "offset": len(read), "before": 0}
    batch = source(tmp_path).next_batch(spark, old, 3, "x")
    assert batch is not None and batch.count == 5
    assert sorted(r["id"] for r in batch.documents.collect()) == [3, 4, 5, 6, 7]
    assert batch.description == "a.jsonl:5-, b.jsonl"
    assert batch.checkpoint["file"] == "b.jsonl"
    assert source(tmp_path).next_batch(spark, batch.checkpoint, 3, "x") is None


@pytest.mark.slow
def test_sub_folders_and_temporary_files_are_not_read_and_lag_is_reported(spark: Any, tmp_path: Path) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1}'])
    write(tmp_path / "src" / "b.jsonl", ['{"id": 2}'])
    write(tmp_path / "src" / "_temporary" / "0" / "a.jsonl", ['not json'])
    write(tmp_path / "src" / ".inflight" / "c.jsonl", ['not json'])
    write(tmp_path / "src" / "_c.jsonl", ['not json'])
    batch = source(tmp_path, max_files=1).next_batch(spark, None, 100, "x")
    assert batch is not None and batch.count == 1
    waited = batch.lag.pop("seconds")  # b.jsonl's age when the epoch was planned
    assert batch.lag == {"files": 1, "bytes": len('{"id": 2}\n')}
    assert 0 <= waited <= time.time() - (tmp_path / "src" / "b.jsonl").stat().st_mtime
    (tmp_path / "src" / "a.jsonl").unlink()  # retention: processed files may go
    again = source(tmp_path, max_files=1).next_batch(spark, batch.checkpoint, 100, "x")
    assert again is not None and [r["id"] for r in again.documents.collect()] == [2]
    assert again.lag == {"files": 0, "bytes": 0, "seconds": 0.0}


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
                T.StructField("address", T.StructType([T.StructField("city", T.StringType()), T.StructField("n", T.IntegerType())])),
                T.StructField("at", T.TimestampType()),
                T.StructField("ratio", T.FloatType()),
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
        ('{"id": 1, "address": {"n": "12"}}', "field 'address.n' is a string but source.schema declares a number"),
        ('{"id": 1, "tags": [1, "two"]}', "field 'tags[]' is a string but source.schema declares a number"),
        # Inside an array too, named at its line (it stopped the staging job, naming no line).
        ('{"id": 1, "tags": [1, 9223372036854775808]}', "a value does not fit source.schema: field 'tags[]' holds 9223372036854775808, which is not a valid BIGINT"),
        ('{"id": "1"}', "field 'id' is a string but source.schema declares a number"),
        ('{"id": 1, "at": "yesterday"}', "a value does not fit source.schema: field 'at' holds \"yesterday\", which is not a valid TIMESTAMP"),
        ('{"id": 1, "address": {"n": 3000000000}}', "a value does not fit source.schema: field 'address.n' holds 3000000000, which is not a valid INT"),
        ('{"id": 1, "amount": 1e309}', "a value does not fit source.schema: field 'amount' holds a number beyond the range of DOUBLE"),
        ('{"id": 1, "ratio": 3.5e38}', "a value does not fit source.schema: field 'ratio' holds a number beyond the range of FLOAT"),
        ('{"id": 1, "note": ["Infinity", -1e309]}', "a number is beyond what its type holds"),  # (a STRING takes JSON)
    ],
)
def test_a_declared_schema_refuses_undeclared_fields_and_other_kinds(spark: Any, tmp_path: Path, line: str, message: str) -> None:
    write(tmp_path / "src" / "a.jsonl", ['{"id": 1, "amount": 2}', line])
    with pytest.raises(SourceError) as info:
        declared(tmp_path).next_batch(spark, None, 100, "spool/x.jsonl")
    assert f"{tmp_path / 'src' / 'a.jsonl'}:2: {message}" in str(info.value)


@pytest.mark.slow
def test_a_declared_schema_takes_nulls_any_json_as_a_string_and_the_delete_marker(spark: Any, tmp_path: Path) -> None:
    write(
        tmp_path / "src" / "a.jsonl",
        [
            '{"id": 1, "amount": 2, "note": {"any": ["json"]}, "tags": [1, 2], "address": {"city": null}, "at": "2024-01-02 03:04:05"}',
            '{"id": 2, "amount": 2.5, "note": "n", "tags": null, "address": null}',
            '{"id": 1, "_meta": {"op": "d"}}',
            # A TIMESTAMP takes text or whole seconds: two kinds across the epoch, each fits alone
            # (the epoch was refused whole, naming no line, for "values of different JSON kinds").
            '{"id": 3, "at": 1704164645}',
        ],
    )
    batch = declared(tmp_path).next_batch(spark, None, 100, "spool/x.jsonl")
    assert batch is not None and batch.count == 4
    assert [f.name for f in batch.documents.schema.fields][:6] == ["id", "amount", "note", "tags", "address", "at"]
    rows = batch.documents.orderBy("_seq").collect()
    assert rows[0]["note"] == '{"any":["json"]}' and rows[0]["amount"] == 2.0 and rows[0]["at"] is not None
    assert [r["_op"] for r in rows] == ["u", "u", "d", "u"]
    assert rows[3]["at"] == rows[0]["at"] == datetime.datetime(2024, 1, 2, 3, 4, 5)


@pytest.mark.slow
def test_a_field_null_in_a_whole_epoch_lands_as_null_in_a_typed_column(spark: Any, tmp_path: Path) -> None:
    from materializer.config import load_config
    from materializer.runtime import Runtime
    from tests.helpers import binding, write_config

    write(tmp_path / "src" / "a.jsonl", ['{"id": 1, "n": 5, "o": {"x": 1}}'])
    write(tmp_path / "src" / "b.jsonl", ['{"id": 2, "n": null, "o": {"x": null}}', '{"id": 1, "n": null}'])
    write(tmp_path / "src" / "c.jsonl", ['{"id": 3, "n": 7, "m": null}'])
    config = load_config(write_config(tmp_path, [binding("b", tmp_path / "src", tmp_path / "t", max_files=1)]))
    assert Runtime(config, spark).run().last_epoch == 3
    table = spark.read.format("delta").load(str(tmp_path / "t"))
    assert {f.name: f.dataType.simpleString() for f in table.schema.fields} == {"id": "bigint", "n": "bigint", "o": "struct<x:bigint>"}
    rows = {r["id"]: r.asDict(recursive=True) for r in table.collect()}
    assert rows == {1: {"id": 1, "n": None, "o": None}, 2: {"id": 2, "n": None, "o": {"x": None}}, 3: {"id": 3, "n": 7, "o": None}}


@pytest.mark.slow
@pytest.mark.parametrize("names", [("a b.jsonl", "a!b.jsonl"), ("x+1.jsonl", "x,1.jsonl"), ("p%1.jsonl", "p-1.jsonl")])
def test_last_write_wins_in_name_order_whatever_the_names_encode_to(spark: Any, tmp_path: Path, names: tuple[str, str]) -> None:
    from materializer import reductions

    first, second = sorted(names)
    write(tmp_path / "src" / first, ['{"id": 1, "v": 1}', '{"id": 2, "v": 1}'])
    write(tmp_path / "src" / second, ['{"id": 1, "v": 2}', '{"id": 2, "bad": }'])
    with pytest.raises(SourceError, match=f"{second}:2: not valid JSON"):
        source(tmp_path).next_batch(spark, None, 100, "x")
    write(tmp_path / "src" / second, ['{"id": 1, "v": 2}'])
    batch = source(tmp_path).next_batch(spark, None, 100, "x")
    assert batch is not None
    rows = {r["id"]: r["v"] for r in reductions.combine(batch.documents, make_binding(tmp_path)).collect()}
    assert rows == {1: 2, 2: 1}


@pytest.mark.parametrize(
    ("text", "one"),
    [
        ('{"id": 1}', True),
        ('  {"id": 1, "o": {"a": [1, 2]}}\t', True),
        ('{"id": 1, "s": "]} {"}', True),
        ('[1, {"a": 2}]', True),  # one value (refused later as not an object)
        ('{"id": 1}{"id": 2}', False),
        ('{"id": 1}, {"id": 2}', False),
        ('{"id": 1, "o": {}}] x', False),  # closes the wrapper's "[" early
        ('{"id": 1, "o": {}} x', False),
        ('{"id": 1} // a comment', False),
        ('{"id": 1, "o": {"s": "' + "__materializer_end_of_value_5c19d2e7__" + '"}}', False),  # the marker itself: refused, not trusted
    ],
)
def test_parse_one_takes_exactly_one_json_value(spark: Any, text: str, one: bool) -> None:
    from pyspark.sql import functions as F

    from materializer.sources.json_text import parse_one

    row = spark.createDataFrame([(text,)], "value string").select(parse_one(F.col("value")).isNotNull().alias("one")).first()
    assert row["one"] is one


TYPED_FROM_TEXT_VALUES = [
    "0", "-0", "-0.0", "1", "-1", "1.0", "1.50", "0.1", "1e2", "2.5E-3", "1E400", "-1e-400", "127", "128", "-129",
    "32768", "2147483647", "2147483648", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
    "12345678901234567890", "1234567890123456.78", "123456789012345678901234567890.5", "1" + "0" * 40,
    "3.14159265358979323846264338327950288", "true", "false", "null", '"5"', '"true"', '"1e2"', '"Infinity"',
    '"NaN"', '" 7 "', "[1]", '{"a": 1}',
]


@pytest.mark.parametrize("ddl", ["bigint", "int", "smallint", "tinyint", "double", "boolean"])
def test_typed_from_text_equals_the_variant_cast(spark: Any, ddl: str) -> None:
    """The rows' fast typing (a number's or boolean's JSON text cast as a string, the VARIANT cast
    where that does not cast) gives the VARIANT cast's value, or fails where it fails, on every
    edge value; and on 2000 random decimals of 15-18 digits (where a double rounding would show)."""
    import random

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from materializer.sources.documents.types import typed

    generator = random.Random(12)
    decimals = []
    for _ in range(2000):
        digits = str(generator.randint(10**14, 10**18 - 1))
        cut = generator.randint(1, len(digits) - 1)
        decimals.append(("-" if generator.random() < 0.5 else "") + digits[:cut] + "." + digits[cut:])
    texts = TYPED_FROM_TEXT_VALUES + decimals
    dtype = T._parse_datatype_string(ddl)
    df = spark.createDataFrame([(t,) for t in texts], "t string").select(
        "t", F.try_variant_get(F.try_parse_json(F.concat(F.lit('{"x": '), "t", F.lit("}"))), "$.x", "variant").alias("x")
    )
    assert df.where(F.col("x").isNull()).count() == 0  # every text is one JSON value
    # Row by row: where the VARIANT cast succeeds, the fast typing gives its value, exactly.
    fits = F.col("x").try_cast(dtype)
    got = df.select("t", fits.alias("want"), typed(F.col("x"), dtype).alias("got")).where(fits.isNotNull() | F.is_variant_null("x"))
    compared = got.collect()
    assert len(compared) >= 5
    # repr: -0.0's sign and NaN (from the string "NaN", as the VARIANT cast reads it) compare too.
    wrong = [(r["t"], r["want"], r["got"]) for r in compared if repr(r["want"]) != repr(r["got"])]
    assert wrong == []
    # Where it fails, the fast typing fails too, with the VARIANT cast's error.
    failing = [r["t"] for r in df.select("t").where(fits.isNull() & ~F.is_variant_null("x")).collect()]
    for text in failing[:3] + failing[-2:]:
        with pytest.raises(Exception, match="INVALID_VARIANT_CAST"):
            df.where(F.col("t") == text).select(typed(F.col("x"), dtype).alias("got")).collect()


@pytest.mark.spark
def test_a_file_of_blank_lines_or_no_bytes_is_an_epoch_of_no_rows_and_the_next_file_goes_on(spark: Any, tmp_path: Path) -> None:
    """A file with no document (blank lines, or empty) holds nothing to type the key by: its epoch
    stages no row and commits its position. Before, staging failed on the missing key column,
    every run again, so the pipeline was stuck on that file."""
    from materializer.runtime import Runtime
    from tests.helpers import binding, delta_rs_rows, table_rows
    from tests.test_holes import config_with, last_epoch

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("\n \n")
    (src / "b.jsonl").write_text("")
    (src / "c.jsonl").write_text('{"id": 1, "v": "x"}\n')
    config = config_with(tmp_path, [binding("items", src, tmp_path / "t")])
    Runtime(config, spark).run()
    assert last_epoch(config) >= 2
    assert table_rows(spark, tmp_path / "t", ["id"]) == delta_rs_rows(tmp_path / "t", ["id"]) == {(1,): {"id": 1, "v": "x"}}
