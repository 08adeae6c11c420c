"""Column control (issue #16): columns / except_columns, ignore_null_updates, delete_when,
soft_delete; with and without sequence_by, against hand-computed tables and the oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import write_jsonl
from tests.test_sequence import _check_oracle, _config, _run, _table

pytestmark = pytest.mark.spark


def test_columns_and_except_columns_choose_what_lands(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "a": 1, "b": 2, "secret": "s"}])
    config = _config(tmp_path, except_columns=["secret"])
    _run(spark, config)
    assert spark.read.format("delta").load(str(tmp_path / "t")).columns == ["id", "a", "b"]
    _check_oracle(spark, config)

    other = tmp_path / "other"
    write_jsonl(other / "src" / "a.jsonl", [{"id": 1, "a": 1, "b": 2, "secret": "s"}])
    config = _config(other, columns=["b"])
    _run(spark, config)
    assert spark.read.format("delta").load(str(other / "t")).columns == ["id", "b"]
    _check_oracle(spark, config)


@pytest.mark.slow
def test_ignore_null_updates_keeps_stored_values_until_a_delete(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "a": 1, "b": 1}, {"id": 2, "a": 1, "b": 1}, {"id": 3, "a": 1, "b": 1}])
    write_jsonl(src / "b.jsonl", [
        {"id": 1, "a": None, "b": 2},  # a kept
        {"id": 1, "b": None},  # both kept from before (b from this epoch)
        {"id": 2, "_meta": {"op": "d"}}, {"id": 2, "b": 5},  # a delete resets: a is NULL
        {"id": 4, "a": None, "b": 4},
    ])
    config = _config(tmp_path, max_files=1, ignore_null_updates=True)
    _run(spark, config)
    got = {k: (r["a"], r["b"]) for k, r in _table(spark, tmp_path / "t").items()}
    assert got == {1: (1, 2), 2: (None, 5), 3: (1, 1), 4: (None, 4)}
    _check_oracle(spark, config)


@pytest.mark.slow
def test_ignore_null_updates_with_sequence_by_ignores_late_values(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "a": 1, "b": 1, "ts": 10}])
    # ts 5 is late (older than the stored 10): its a changes nothing; ts 20 lacks a: a stays 1.
    write_jsonl(src / "b.jsonl", [{"id": 1, "a": 2, "ts": 5}, {"id": 1, "b": 3, "ts": 20}])
    write_jsonl(src / "c.jsonl", [{"id": 1, "ts": 30, "_meta": {"op": "d"}}, {"id": 1, "b": 4, "ts": 31}])
    config = _config(tmp_path, max_files=1, ignore_null_updates=True, sequence_by=["ts"])
    _run(spark, config)
    row = _table(spark, tmp_path / "t")[1]
    assert (row["a"], row["b"], row["__deleted"]) == (None, 4, False)
    _check_oracle(spark, config)


def test_delete_when_marks_deletes(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "op": "INSERT", "v": 1}, {"id": 2, "op": "INSERT", "v": 2}])
    write_jsonl(src / "b.jsonl", [{"id": 1, "op": "DELETE"}, {"id": 3, "v": 3}])  # 3 lacks op: not a delete
    config = _config(tmp_path, max_files=1, delete_when="op = 'DELETE'", except_columns=["op"])
    _run(spark, config)
    assert {k: r["v"] for k, r in _table(spark, tmp_path / "t").items()} == {2: 2, 3: 3}


def test_soft_delete_marks_rows_and_an_upsert_clears_the_mark(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": 1}, {"id": 2, "v": 2}, {"id": 9, "_meta": {"op": "d"}}])
    write_jsonl(src / "b.jsonl", [{"id": 1, "_meta": {"op": "d"}}, {"id": 2, "_meta": {"op": "d"}}])
    write_jsonl(src / "c.jsonl", [{"id": 2, "v": 22}])
    config = _config(tmp_path, max_files=1, soft_delete=True)
    _run(spark, config)
    rows = _table(spark, tmp_path / "t")
    assert {k: (r["v"], r["__deleted"], r["__deleted_at"] is not None) for k, r in rows.items()} == {
        1: (1, True, True),  # the row stays, with its values, marked
        2: (22, False, False),
    }
    _check_oracle(spark, config)


@pytest.mark.slow
def test_soft_delete_with_sequence_by_keeps_late_upserts_out(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": 1, "ts": 1}, {"id": 2, "ts": 5, "_meta": {"op": "d"}}])
    write_jsonl(src / "b.jsonl", [{"id": 1, "ts": 3, "_meta": {"op": "d"}}, {"id": 2, "v": 9, "ts": 4}])
    config = _config(tmp_path, max_files=1, soft_delete=True, sequence_by=["ts"])
    _run(spark, config)
    rows = _table(spark, tmp_path / "t")
    assert {k: (r["v"], r["__deleted"]) for k, r in rows.items()} == {1: (1, True), 2: (None, True)}
    _check_oracle(spark, config)


@pytest.mark.slow
def test_delete_when_on_fields_an_epoch_lacks_is_no_delete(spark: Any, tmp_path: Path) -> None:
    """A field delete_when names that no document of the epoch carries (at the top, or inside a
    struct that is there, or a whole path) reads as NULL: not a delete, and no stuck epoch."""
    from tests.test_holes import last_epoch

    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": 1}, {"id": 2, "v": 2, "after": {"x": 1}}])  # no is_deleted anywhere
    write_jsonl(src / "b.jsonl", [{"id": 1, "is_deleted": True}, {"id": 3, "v": 3, "is_deleted": False}])
    write_jsonl(src / "c.jsonl", [{"id": 2, "after": {"gone": True}}, {"id": 4, "v": 4, "after": {"x": 2}}])
    config = _config(
        tmp_path, max_files=1, delete_when="is_deleted OR after.gone OR meta.flags.deleted", except_columns=["is_deleted"],
        deletion_vectors=False,  # read by delta-rs below
    )
    assert _run(spark, config).last_epoch == 3 and last_epoch(config) == 3
    assert {k: r["v"] for k, r in _table(spark, tmp_path / "t").items()} == {3: 3, 4: 4}
    from deltalake import DeltaTable

    # Nothing of the NULL fields added to evaluate the condition lands in the table.
    assert sorted(f.name for f in DeltaTable(str(tmp_path / "t")).schema().fields) == ["after", "id", "v"]
    assert sorted(r["id"] for r in DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()) == [3, 4]


@pytest.mark.slow
@pytest.mark.parametrize(
    "doc, condition, message",
    [
        ({"id": 1, "is_deleted": "yes"}, "is_deleted", "binding b: .*is string on this transaction's documents, not a condition"),
        ({"id": 1, "after": 5}, "after.gone", r"binding b: delete_when 'after.gone' cannot be evaluated"),
        # Analysed fine (the text is cast to a number), failing in the staging job: still before commit.
        ({"id": 1, "op": 5}, "op = 'DELETE'", r"or delete_when \"op = 'DELETE'\" compares a field with a value of another type"),
    ],
)
def test_delete_when_that_cannot_be_evaluated_is_refused_before_commit(
    spark: Any, tmp_path: Path, doc: dict[str, Any], condition: str, message: str
) -> None:
    from materializer.errors import SourceError
    from tests.test_holes import last_epoch

    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 2, "v": 2}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [doc])
    config = _config(tmp_path, max_files=1, delete_when=condition)
    with pytest.raises(SourceError, match=message):
        _run(spark, config)
    assert last_epoch(config) == 1  # the first epoch landed, the second was never committed
    assert list(_table(spark, tmp_path / "t")) == [2]
