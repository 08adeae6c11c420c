"""materializer.tools.oracle, the one oracle every test and the drill compare tables with: unit tests, no JVM.

Each expectation here is worked out by hand from DESIGN.md's semantics (lastWriteWins by file and
position, deletes, per-field reductions, whole-file epochs, seed 000's delta-updates example), so a
change to the oracle that the pipeline tests would follow blindly fails here first.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

from materializer.tools import oracle
from materializer.config import parse_config


def _binding(tmp_path: Path, files: dict[str, list[dict[str, Any]]], **extra: Any) -> Any:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name, docs in files.items():
        (src / name).write_text("".join(json.dumps(d) + "\n" for d in docs))
    raw = {
        "pipeline_id": "p",
        "recovery_log": str(tmp_path / "log"),
        "staging": str(tmp_path / "staging"),
        "bindings": [{"name": "b", "source": {"format": "documents", "path": str(src), **extra.pop("source", {})},
                      "table": str(tmp_path / "t"), "key": ["id"], **extra}],
    }
    return parse_config(raw, "test").bindings[0]


def _rows(expected: oracle.Expected) -> dict[Any, list[dict[str, Any]]]:
    return {k[0]: sorted((json.loads(r) for r in c.elements()), key=repr) for k, c in expected.rows.items()}


def test_standard_last_write_wins_by_file_then_line_and_a_delete_starts_afresh(tmp_path: Path) -> None:
    b = _binding(tmp_path, {
        "a-1.jsonl": [{"id": 1, "x": 1, "y": "a"}, {"id": 2, "x": 5}, {"id": 1, "x": 2}],
        "a-2.jsonl": [{"_meta": {"op": "d"}, "id": 2}, {"id": 3, "x": 7}, {"_meta": {"op": "d"}, "id": 3}, {"id": 3, "z": 1}],
        "_hidden.jsonl": [{"id": 9}],  # not a document file
        "notes.txt": ["ignored"],
    })
    exp = oracle.expected(b, 1000)
    assert exp.verified and exp.unique_keys and exp.documents == 7
    # lastWriteWins: the later document wins whole, a field it lacks is NULL (the MERGE's UPDATE SET *)
    assert _rows(exp) == {1: [{"id": 1, "x": 2}], 3: [{"id": 3, "z": 1}]}
    assert exp.epochs == 1  # max_files defaults to many: both files in one epoch


def test_reductions_fold_across_epochs_and_a_delete_resets_the_sum(tmp_path: Path) -> None:
    b = _binding(tmp_path, {
        "1.jsonl": [{"id": 1, "n": 2, "m": 5, "tags": ["a"]}],
        "2.jsonl": [{"id": 1, "n": 3, "m": 4, "tags": ["b"]}, {"id": 2, "n": 1}],
        "3.jsonl": [{"_meta": {"op": "d"}, "id": 2}, {"id": 2, "n": 10}],
    }, reductions={"n": "sum", "m": "min", "tags": "append"}, source={"max_files": 1})
    exp = oracle.expected(b, 1000)
    assert exp.epochs == 3
    assert _rows(exp) == {1: [{"id": 1, "n": 5, "m": 4, "tags": ["a", "b"]}], 2: [{"id": 2, "n": 10}]}


def test_delta_updates_appends_each_epochs_fold_with_its_op_seed_000(tmp_path: Path) -> None:
    # Seed 000: -1, 3, 2 store 4; then 6, -7, -1 store -2 (sum within the epoch only).
    b = _binding(tmp_path, {
        "1.jsonl": [{"id": "c", "v": -1}, {"id": "c", "v": 3}, {"id": "c", "v": 2}],
        "2.jsonl": [{"id": "c", "v": 6}, {"id": "c", "v": -7}, {"id": "c", "v": -1}, {"id": "d", "v": 1}, {"_meta": {"op": "d"}, "id": "d"}],
    }, mode="delta_updates", reductions={"v": "sum"}, source={"max_files": 1})
    exp = oracle.expected(b, 1000)
    assert not exp.unique_keys and exp.epochs == 2
    assert _rows(exp) == {
        "c": sorted([{"id": "c", "v": 4, "_op": "u"}, {"id": "c", "v": -2, "_op": "u"}], key=repr),
        "d": [{"id": "d", "_op": "d"}],  # the epoch ends on the delete: its reduced field is NULL
    }


def test_epochs_are_runs_of_whole_files_bounded_by_count_and_bytes(tmp_path: Path) -> None:
    files = {f"{n}.jsonl": [{"id": n, "pad": "x" * 40}] for n in range(5)}
    by_count = _binding(tmp_path, files, source={"max_files": 2})
    assert [len(g) for g in oracle.file_epochs(by_count)] == [2, 2, 1]
    size = (tmp_path / "src" / "0.jsonl").stat().st_size
    by_bytes = _binding(tmp_path, files, source={"max_bytes": size * 3 - 1})
    assert [len(g) for g in oracle.file_epochs(by_bytes)] == [2, 2, 1]


def test_values_compare_as_the_table_gives_them_back() -> None:
    assert oracle.normalize({"a": 7.0, "b": None, "c": {"d": None}, "e": [1.0, Decimal("2")], "f": 0.5}) == {
        "a": 7, "e": [1, 2], "f": 0.5
    }
    assert oracle.canonical({"b": 1, "a": 2.0}) == '{"a":2,"b":1}'


def test_compare_names_lost_duplicated_and_wrong_rows() -> None:
    exp = oracle.Expected(binding="b", verified=True, rows={
        (1,): Counter([oracle.canonical({"id": 1, "x": 1})]),
        (2,): Counter([oracle.canonical({"id": 2, "x": 2})]),
    })
    assert oracle.compare(exp, [{"id": 1, "x": 1.0}, {"id": 2, "x": 2, "extra": None}], ["id"]).ok
    bad = oracle.compare(exp, [{"id": 1, "x": 1}, {"id": 1, "x": 1}, {"id": 3, "x": 3}], ["id"])
    assert not bad.ok
    assert bad.counts == {"lost": 1, "duplicated": 1, "wrong": 1}
    assert [r["key"] for r in bad.lost] == [[2]] and [r["key"] for r in bad.wrong] == [[3]]


def test_a_binding_without_an_oracle_is_not_verified_rather_than_passed(tmp_path: Path) -> None:
    b = _binding(tmp_path, {"1.jsonl": []}, mode="delta_updates", source={"format": "cdcv2"})
    exp = oracle.expected(b, 10)
    assert not exp.verified and "no oracle" in exp.reason
    assert not oracle.compare(exp, [], ["id"]).ok
