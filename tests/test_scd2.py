"""mode: scd2 (issue #16): every version with __start_at / __end_at / __current, one MERGE per
epoch, out-of-order changes placed where they belong, track_history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.tools import oracle
from tests.helpers import write_jsonl
from tests.test_sequence import _config, _run

pytestmark = pytest.mark.spark


def _versions(spark: Any, table: Path) -> list[tuple[Any, ...]]:
    rows = spark.read.format("delta").load(str(table)).collect()
    return sorted((
        (r["id"], r["v"], _n(r["__start_at"]), _n(r["__end_at"]), r["__current"], r["__deleted"]) for r in rows
    ), key=repr)


def _n(value: Any) -> Any:
    return None if value is None else oracle.normalize(value)


def _check(spark: Any, config: Any) -> None:
    b = config.bindings[0]
    exp = oracle.expected(b, config.transaction.max_documents)
    assert exp.verified, exp.reason
    actual = [r.asDict(recursive=True) for r in spark.read.format("delta").load(b.table).collect()]
    result = oracle.compare(exp, actual, b.key)
    assert result.ok, (result.lost[:3], result.wrong[:3], result.duplicated[:3])


def test_versions_by_sequence_with_late_changes_and_deletes(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": "a", "ts": 1}, {"id": 1, "v": "c", "ts": 5}, {"id": 2, "v": "x", "ts": 1}])
    # Late: ts 3 goes between 1 and 5; a delete of 2 at 4; a duplicate of ts 5 (later file wins).
    write_jsonl(src / "b.jsonl", [{"id": 1, "v": "b", "ts": 3}, {"id": 2, "ts": 4, "_meta": {"op": "d"}}, {"id": 1, "v": "C", "ts": 5}])
    # Later still: a change of 2 before its delete (ends at the delete), and after it (current).
    write_jsonl(src / "c.jsonl", [{"id": 2, "v": "y", "ts": 2}, {"id": 2, "v": "z", "ts": 9}])
    config = _config(tmp_path, max_files=1, mode="scd2", sequence_by=["ts"])
    assert _run(spark, config).last_epoch == 3
    assert _versions(spark, tmp_path / "t") == sorted([
        (1, "C", 5, None, True, False),
        (1, "a", 1, 3, False, False),
        (1, "b", 3, 5, False, False),
        (2, None, 4, 9, False, True),
        (2, "x", 1, 2, False, False),
        (2, "y", 2, 4, False, False),
        (2, "z", 9, None, True, False),
    ], key=repr)
    _check(spark, config)


@pytest.mark.slow
def test_without_sequence_the_epoch_starts_a_version(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": "a"}, {"id": 1, "v": "b"}])
    write_jsonl(src / "b.jsonl", [{"id": 1, "v": "c"}, {"id": 3, "v": "q"}])
    write_jsonl(src / "c.jsonl", [{"id": 3, "_meta": {"op": "d"}}])
    config = _config(tmp_path, max_files=1, mode="scd2")
    _run(spark, config)
    assert _versions(spark, tmp_path / "t") == sorted([
        (1, "b", 1, 2, False, False), (1, "c", 2, None, True, False),
        (3, None, 3, None, False, True), (3, "q", 2, 3, False, False),
    ], key=repr)
    _check(spark, config)


@pytest.mark.slow
def test_track_history_updates_untracked_fields_in_place(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": "a", "note": "n1", "ts": 1}, {"id": 1, "v": "a", "note": "n2", "ts": 2}])
    write_jsonl(src / "b.jsonl", [{"id": 1, "v": "b", "note": "n3", "ts": 3}, {"id": 1, "v": "b", "note": "n4", "ts": 4}])
    config = _config(tmp_path, max_files=1, mode="scd2", sequence_by=["ts"], track_history_except=["note", "ts"])
    _run(spark, config)
    rows = sorted((
        (r["v"], r["note"], _n(r["__start_at"]), _n(r["__end_at"]))
        for r in spark.read.format("delta").load(str(tmp_path / "t")).collect()
    ), key=repr)
    assert rows == [("a", "n2", 1, 3), ("b", "n4", 3, None)]
    _check(spark, config)


@pytest.mark.slow
@pytest.mark.parametrize("track", [{}, {"track_history": ["v"]}])
def test_shuffled_changes_with_late_deletes_and_duplicates_match_the_oracle(spark: Any, tmp_path: Path, track: dict[str, Any]) -> None:
    from tests.test_sequence_crash import changes

    changes(tmp_path / "src", files=4, per_file=10, keys=5, seed=29)
    config = _config(tmp_path, max_files=1, mode="scd2", sequence_by=["ts"], **track)
    _run(spark, config)
    _check(spark, config)
    # Each key's versions tile its history: every version ends where the next starts.
    rows = spark.read.format("delta").load(str(tmp_path / "t")).collect()
    by_key: dict[Any, list[Any]] = {}
    for r in rows:
        by_key.setdefault(r["id"], []).append((r["__start_at"], r["__end_at"], r["__current"]))
    for versions in by_key.values():
        versions.sort()
        assert [v[1] for v in versions[:-1]] == [v[0] for v in versions[1:]]
        assert versions[-1][1] is None and sum(v[2] for v in versions) <= 1
