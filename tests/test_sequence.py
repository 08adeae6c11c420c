"""sequence_by, tombstones and column control (issue #16), against the oracle of
materializer/oracle.py (``documents_changes``) and hand-computed tables."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from materializer.tools import oracle
from materializer.config import parse_config
from materializer.errors import ConfigError
from tests.helpers import binding, write_config, write_jsonl


def _config(tmp_path: Path, **extra: Any) -> Any:
    from materializer.config import load_config

    return load_config(write_config(tmp_path, [binding("b", tmp_path / "src", tmp_path / "t", **extra)]))


def _run(spark: Any, config: Any) -> Any:
    from materializer.runtime import Runtime

    return Runtime(config, spark).run()


def _table(spark: Any, path: Path) -> dict[Any, dict[str, Any]]:
    rows = spark.read.format("delta").load(str(path)).collect()
    out = {}
    for row in rows:
        data = row.asDict(recursive=True)
        assert data["id"] not in out
        out[data["id"]] = data
    return out


def _check_oracle(spark: Any, config: Any) -> None:
    b = config.bindings[0]
    exp = oracle.expected(b, config.transaction.max_documents)
    assert exp.verified, exp.reason
    actual = [r.asDict(recursive=True) for r in spark.read.format("delta").load(b.table).collect()]
    result = oracle.compare(exp, actual, b.key)
    assert result.ok, (result.lost[:3], result.wrong[:3], result.duplicated[:3])


# --- configuration (no JVM) ---------------------------------------------------------------------


def _binding(**extra: Any) -> dict[str, Any]:
    return {"name": "b", "source": {"format": "documents", "path": "src"}, "table": "t", "key": ["id"], **extra}


def _parse(**extra: Any) -> Any:
    return parse_config({"pipeline_id": "p", "recovery_log": "log", "staging": "st", "bindings": [_binding(**extra)]}, "x.yaml")


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"sequence_by": ["a b"]}, "not a dotted field path"),
        ({"sequence_by": ["_meta"]}, "name one inside it"),
        ({"sequence_by": ["ts", "ts"]}, "fields repeat"),
        ({"sequence_by": ["ts"], "reductions": {"n": "sum"}}, "do not combine"),
        ({"columns": ["a"], "except_columns": ["b"]}, "not both"),
        ({"except_columns": ["id"]}, "key field"),
        ({"soft_delete": True, "mode": "delta_updates"}, "for mode standard or scd2"),
        ({"track_history": ["a"]}, "for mode scd2"),
    ],
)
def test_refused_combinations(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _parse(**extra)


def test_meta_paths_are_allowed_in_sequence_by() -> None:
    config = _parse(sequence_by=["_meta.source.lsn", "ts"])
    assert config.bindings[0].sequence_by == ["_meta.source.lsn", "ts"]
    assert config.bindings[0].change_controlled
    assert not _parse().bindings[0].change_controlled


# --- sequence_by ---------------------------------------------------------------------------------


@pytest.mark.spark
def test_highest_sequence_wins_within_and_across_epochs_and_deletes_leave_tombstones(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    # Epoch 1: key 1 twice, the first line is the newer; key 2 deleted before it is ever upserted.
    write_jsonl(src / "a.jsonl", [
        {"id": 1, "v": "new", "ts": 5}, {"id": 1, "v": "old", "ts": 3},
        {"id": 2, "ts": 9, "_meta": {"op": "d"}}, {"id": 3, "v": "x", "ts": 1},
    ])
    # Epoch 2: late changes older than what is stored (ignored), an equal sequence (later file wins),
    # a late upsert of the deleted key 2 (must not resurrect it), a newer delete of 3.
    write_jsonl(src / "b.jsonl", [
        {"id": 1, "v": "late", "ts": 4}, {"id": 2, "v": "zombie", "ts": 8},
        {"id": 3, "v": "tie", "ts": 1}, {"id": 4, "v": "y", "ts": 2},
    ])
    # Epoch 3: an older delete of 4 (ignored), a newer delete of 3 after the tie, 2 comes back newer.
    write_jsonl(src / "c.jsonl", [
        {"id": 4, "ts": 1, "_meta": {"op": "d"}}, {"id": 3, "ts": 7, "_meta": {"op": "d"}}, {"id": 2, "v": "back", "ts": 10},
    ])
    config = _config(tmp_path, max_files=1, sequence_by=["ts"])
    assert _run(spark, config).last_epoch == 3
    rows = _table(spark, tmp_path / "t")
    got = {k: (r["v"], r["__deleted"], r["__sequence"]["ts"]) for k, r in rows.items()}
    assert got == {1: ("new", False, 5), 2: ("back", False, 10), 3: (None, True, 7), 4: ("y", False, 2)}
    _check_oracle(spark, config)


@pytest.mark.spark
def test_meta_sequence_orders_and_never_lands(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [
        {"id": 1, "v": "b", "_meta": {"source": {"lsn": 200, "tx": "t2"}}},
        {"id": 1, "v": "a", "_meta": {"source": {"lsn": 100, "tx": "t1"}}},
    ])
    write_jsonl(src / "b.jsonl", [
        {"id": 1, "v": "c", "_meta": {"source": {"lsn": 150}}},  # late: older than 200
        {"id": 5, "v": "d", "_meta": {"source": {"lsn": 12345678901234567890}}},  # beyond a long, exact
    ])
    config = _config(tmp_path, max_files=1, sequence_by=["_meta.source.lsn"])
    _run(spark, config)
    table = spark.read.format("delta").load(str(tmp_path / "t"))
    assert "_meta" not in table.columns
    assert table.schema["__sequence"].dataType.simpleString() == "struct<_meta__source__lsn:decimal(38,9)>"
    rows = _table(spark, tmp_path / "t")
    assert rows[1]["v"] == "b" and rows[5]["__sequence"]["_meta__source__lsn"] == 12345678901234567890
    _check_oracle(spark, config)


@pytest.mark.slow
@pytest.mark.spark
def test_several_sequence_fields_compare_in_order_and_strings_as_text(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [
        {"id": 1, "v": "x", "day": "2024-01-02", "n": 1},
        {"id": 1, "v": "y", "day": "2024-01-01", "n": 9},
    ])
    write_jsonl(src / "b.jsonl", [{"id": 1, "v": "z", "day": "2024-01-02", "n": 0}])  # older second field
    config = _config(tmp_path, max_files=1, sequence_by=["day", "n"])
    _run(spark, config)
    assert _table(spark, tmp_path / "t")[1]["v"] == "x"
    _check_oracle(spark, config)


@pytest.mark.slow
@pytest.mark.spark
def test_a_change_without_its_sequence_stops_the_run_naming_the_line(spark: Any, tmp_path: Path) -> None:
    from materializer.errors import SourceError

    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "ts": 1}, {"id": 2}])
    with pytest.raises(SourceError, match=r"a.jsonl:2: sequence field 'ts' \(sequence_by\) is missing"):
        _run(spark, _config(tmp_path, sequence_by=["ts"]))
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
@pytest.mark.spark
def test_a_reserved_column_name_in_a_document_is_refused(spark: Any, tmp_path: Path) -> None:
    from materializer.errors import SourceError

    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "ts": 1, "__deleted": False}])
    with pytest.raises(SourceError, match="'__deleted' is reserved"):
        _run(spark, _config(tmp_path, sequence_by=["ts"]))


@pytest.mark.slow
@pytest.mark.spark
def test_shuffled_sequences_with_late_deletes_match_the_oracle(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(16)
    changes = []
    for ts in range(1, 121):
        key = rng.randint(1, 12)
        if rng.random() < 0.25:
            changes.append({"id": key, "ts": ts, "_meta": {"op": "d"}})
        else:
            changes.append({"id": key, "ts": ts, "v": rng.randint(0, 5), "w": rng.choice([None, "a", "b"])})
    # Duplicate sequences: a few changes re-sent with the same ts and other values.
    changes += [{**c, "v": 99} for c in rng.sample([c for c in changes if "v" in c], 8)]
    rng.shuffle(changes)
    for i in range(0, len(changes), 16):
        write_jsonl(tmp_path / "src" / f"f{i:04d}.jsonl", changes[i:i + 16])
    config = _config(tmp_path, max_files=2, sequence_by=["ts"])
    _run(spark, config)
    _check_oracle(spark, config)


@pytest.mark.slow
@pytest.mark.spark
def test_sequence_by_added_to_a_binding_whose_table_exists(spark: Any, tmp_path: Path) -> None:
    """It was committed, then failed to apply (a stuck epoch). Rows stored before sequence_by have
    no sequence: any change is newer; every stored row gets ``__deleted = false``."""
    from tests.helpers import delta_rs_rows
    from tests.test_holes import last_epoch

    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": 1, "ts": 7}, {"id": 2, "v": 2, "ts": 7}])
    _run(spark, _config(tmp_path, max_files=1, deletion_vectors=False))
    write_jsonl(src / "b.jsonl", [{"id": 1, "v": 10, "ts": 0}, {"id": 3, "ts": 5, "_meta": {"op": "d"}}, {"id": 4, "v": 4, "ts": 1}])
    write_jsonl(src / "c.jsonl", [{"id": 1, "v": 99, "ts": -1}, {"id": 3, "v": 3, "ts": 4}])  # both older: nothing changes
    config = _config(tmp_path, max_files=1, deletion_vectors=False, sequence_by=["ts"])
    assert _run(spark, config).last_epoch == 3 and last_epoch(config) == 3
    rows = _table(spark, tmp_path / "t")
    got = {k: (r["v"], r["__deleted"], r["__sequence"]["ts"] if r["__sequence"] else None) for k, r in rows.items()}
    assert got == {1: (10, False, 0), 2: (2, False, None), 3: (None, True, 5), 4: (4, False, 1)}
    live = spark.read.format("delta").load(str(tmp_path / "t")).where("NOT __deleted")
    assert sorted(r["id"] for r in live.collect()) == [1, 2, 4]
    rust = delta_rs_rows(tmp_path / "t", ["id"])
    assert {k[0]: (r.get("v"), r["__deleted"]) for k, r in rust.items()} == {k: g[:2] for k, g in got.items()}
