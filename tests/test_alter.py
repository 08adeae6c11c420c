"""ALTER TABLE between runs (docs/neighbours.md, "Schema and feature changes"): each change either
applies (the pipeline writes on, by the rules of changing options on a table that exists) or is
refused before anything of the epoch is committed, naming the table and what to do.

One pipeline, one binding per change: epoch 1 of every table, the ALTERs, each refused change
alone (stopped at Open or before commit, the log unchanged), then epoch 2 of every table with the
refused ones put right, each table read by Spark and by delta-rs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.errors import ApplyError, SourceError, TableStateError
from tests.helpers import InProcessCrash, assert_tables_equal_oracle, binding, delta_rs_list, write_config, write_jsonl

FIRST = [{"id": i, "v": i, "w": f"w{i}", "z": f"z{i}"} for i in (1, 2, 3)]
SECOND = [{"id": 1, "v": 10, "w": "b", "z": "b", "extra": 7}, {"id": 4, "v": 40, "w": "b", "z": "b", "extra": 8}]

ALTERS: dict[str, tuple[str, ...]] = {
    # A column the source never sends, and one it sends from now on; a person fills the first.
    "added": ("ALTER TABLE {t} ADD COLUMNS (note STRING, extra BIGINT)", "UPDATE {t} SET note = 'n' WHERE id IN (1, 3)"),
    "kept": ("ALTER TABLE {t} ADD COLUMNS (note STRING, extra BIGINT)", "UPDATE {t} SET note = 'n' WHERE id IN (1, 3)"),
    "renamed": (
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')",
        "ALTER TABLE {t} RENAME COLUMN w TO w2",
        "ALTER TABLE {t} DROP COLUMN z",
    ),
    "checked": ("ALTER TABLE {t} ADD CONSTRAINT positive CHECK (v > 0)",),
    "clustered": ("ALTER TABLE {t} CLUSTER BY (v)",),
    "unclustered": ("ALTER TABLE {t} CLUSTER BY (v)",),
    "features": (
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableRowTracking' = 'true')",
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
        "ALTER TABLE {t} ADD COLUMNS (d BIGINT)",
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.feature.allowColumnDefaults' = 'supported')",
        "ALTER TABLE {t} ALTER COLUMN d SET DEFAULT 5",
    ),
}
OPTIONS: dict[str, dict[str, Any]] = {
    "kept": {"ignore_null_updates": True},
    "clustered": {"cluster_by": ["id"]},
    "features": {"deletion_vectors": False},
}


def _config(tmp_path: Path, folder: str, bindings: list[dict[str, Any]], **settings: Any) -> Any:
    from materializer.config import load_config

    (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    return load_config(write_config(
        tmp_path / folder, bindings, recovery_log=str(tmp_path / "log"), staging=str(tmp_path / "staging"), **settings
    ))


def _binding(tmp_path: Path, name: str, **extra: Any) -> dict[str, Any]:
    return binding(name, tmp_path / "src" / name, tmp_path / "tables" / name, **{**OPTIONS.get(name, {}), **extra})


def _last_epoch(tmp_path: Path) -> int:
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    return RecoveryLog(open_store(str(tmp_path / "log")), "test-pipeline").read().last_epoch


def _sql(spark: Any, table: Path, *statements: str) -> None:
    person = spark.newSession()
    for statement in statements:
        person.sql(statement.format(t=f"delta.`{table}`")).collect()


def _rows(spark: Any, table: Path, *, delta_rs: bool = True) -> dict[int, dict[str, Any]]:
    """The table by Spark, checked equal to delta-rs' read: {id: row}, NULLs left out."""
    by_spark = {r["id"]: {k: v for k, v in r.asDict().items() if v is not None} for r in spark.read.format("delta").load(str(table)).collect()}
    if not delta_rs:
        return by_spark
    by_rust = {r["id"]: {k: v for k, v in r.items() if v is not None} for r in delta_rs_list(table)}
    assert by_spark == by_rust, table.name
    return by_spark


@pytest.mark.slow
def test_alter_between_runs_applies_or_is_refused_before_commit(spark: Any, tmp_path: Path) -> None:
    from materializer.runtime import Runtime

    for name in ALTERS:
        write_jsonl(tmp_path / "src" / name / "a.jsonl", FIRST)
    Runtime(_config(tmp_path, "first", [_binding(tmp_path, n) for n in ALTERS]), spark).run()
    assert _last_epoch(tmp_path) == 1
    for name, statements in ALTERS.items():
        _sql(spark, tmp_path / "tables" / name, *statements)
        docs = [*SECOND, {"id": 5, "v": -1}] if name == "checked" else SECOND
        write_jsonl(tmp_path / "src" / name / "b.jsonl", docs)

    # Delta itself refuses these: nothing for the pipeline to meet.
    with pytest.raises(Exception, match="NOT NULL in ALTER TABLE ADD COLUMNS"):
        _sql(spark, tmp_path / "tables" / "added", "ALTER TABLE {t} ADD COLUMNS (required BIGINT NOT NULL)")
    with pytest.raises(Exception, match="DEFAULT values are not supported when adding new"):
        _sql(spark, tmp_path / "tables" / "added", "ALTER TABLE {t} ADD COLUMNS (defaulted BIGINT DEFAULT 1)")
    with pytest.raises(Exception, match="Cannot change nullable column to non-nullable"):
        _sql(spark, tmp_path / "tables" / "added", "ALTER TABLE {t} ALTER COLUMN v SET NOT NULL")

    # --- refused, each alone: at Open (exit 7) or before commit (exit 3); the log stays at epoch 1 ---
    refusals = {
        "renamed": (TableStateError, ["column 'w' was renamed to 'w2'", "column 'z' was dropped", "except_columns: [w, z]"]),
        "checked": (SourceError, ["key id=5", "CHECK constraint positive"]),
        "clustered": (TableStateError, ["clustered by", "'clustered'"]),
    }
    for name, (error, words) in refusals.items():
        with pytest.raises(error) as refused:
            Runtime(_config(tmp_path, f"refused-{name}", [_binding(tmp_path, name)]), spark).run()
        message = str(refused.value)
        assert all(w in message for w in words), message
        assert _last_epoch(tmp_path) == 1, name

    # --- put right: the old names no longer land; the documents fixed; the clustering back ---
    write_jsonl(tmp_path / "src" / "checked" / "b.jsonl", [*SECOND, {"id": 5, "v": 1}])
    _sql(spark, tmp_path / "tables" / "clustered", "ALTER TABLE {t} CLUSTER BY (id)")
    write_jsonl(tmp_path / "src" / "renamed" / "c.jsonl", [{"id": 2, "v": 20, "w2": "sent by its new name"}])
    bindings = [
        _binding(tmp_path, n, **({"except_columns": ["w", "z"]} if n == "renamed" else {})) for n in ALTERS
    ]
    assert Runtime(_config(tmp_path, "second", bindings), spark).run().last_epoch >= 2

    added = _rows(spark, tmp_path / "tables" / "added")
    # The row is the latest document: a column it lacks is NULL after the key's change (note of 1);
    # a row not changed keeps it (3); a column the source sends from now on lands (extra).
    assert added[1] == {"id": 1, "v": 10, "w": "b", "z": "b", "extra": 7}
    assert added[3]["note"] == "n" and added[4]["extra"] == 8
    kept = _rows(spark, tmp_path / "tables" / "kept")
    assert kept[1]["note"] == "n" and kept[1]["extra"] == 7  # ignore_null_updates keeps it

    renamed_table = tmp_path / "tables" / "renamed"
    # Neither w nor z came back as a new column; w2 holds what the source sends by the new name.
    assert spark.read.format("delta").load(str(renamed_table)).columns == ["id", "v", "w2", "extra"]
    renamed = _rows(spark, renamed_table)
    assert renamed[1] == {"id": 1, "v": 10, "extra": 7} and renamed[3] == {"id": 3, "v": 3, "w2": "w3"}
    assert renamed[2] == {"id": 2, "v": 20, "w2": "sent by its new name"} and renamed[4] == {"id": 4, "v": 40, "extra": 8}

    assert _rows(spark, tmp_path / "tables" / "checked")[5] == {"id": 5, "v": 1}
    for name in ("clustered", "unclustered"):
        assert _rows(spark, tmp_path / "tables" / name)[4]["v"] == 40
    unclustered = spark.sql(f"DESCRIBE DETAIL delta.`{tmp_path / 'tables' / 'unclustered'}`").collect()[0]
    assert list(unclustered["clusteringColumns"]) == ["v"]  # the table keeps the clustering it was given

    features_table = tmp_path / "tables" / "features"
    features = _rows(spark, features_table, delta_rs=False)
    # Type widening, once enabled, is a reader feature delta-rs does not read (yet).
    with pytest.raises(Exception, match="TypeWidening"):
        delta_rs_list(features_table)
    assert features[1]["v"] == 10 and features[4]["v"] == 40
    # A new key's row carries every column the MERGE writes: NULL for d, not its DEFAULT.
    assert "d" not in features[4]
    changes = spark.sql(f"SELECT id, _change_type FROM table_changes_by_path('{features_table}', 2)").collect()
    assert {(r["id"], r["_change_type"]) for r in changes} >= {(1, "update_postimage"), (4, "insert")}


def test_a_constraint_added_while_an_epoch_is_owed_stops_its_apply_and_the_epoch_stays_appliable(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after epoch 2 is in the log: a CHECK constraint added then, which the epoch's rows
    break, cannot be seen before commit (the epoch is committed already). The restart's apply
    stops with Delta's refusal named, nothing of the epoch applied; with the constraint dropped
    the next run applies it, and the table equals the oracle."""
    from materializer.delta import TableRef, table_state
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(tmp_path, "run", [binding("b", tmp_path / "src", table, max_files=1)])
    write_jsonl(tmp_path / "src" / "a.jsonl", FIRST)
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 1, "v": -10}])
    killed = InProcessCrash(monkeypatch, "after-log-commit:2")
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        _sql(spark, table, "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (v > 0)")
        killed.disarm()
        with pytest.raises(ApplyError, match=r"epoch 2, binding b: Delta refused .*positive.*stays committed"):
            Runtime(config, spark).run()
        assert table_state(spark, TableRef(str(table)), "test-pipeline").txn_version == 1
        _sql(spark, table, "ALTER TABLE {t} DROP CONSTRAINT positive")
        assert Runtime(config, spark).run().last_epoch == 2
        assert_tables_equal_oracle(spark, config)
    finally:
        killed.thaw()
        frozen.join(60)


def test_coordinated_commits_are_refused_at_open_until_the_feature_is_dropped(spark: Any, tmp_path: Path) -> None:
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(tmp_path, "run", [binding("b", tmp_path / "src", table)])
    write_jsonl(tmp_path / "src" / "a.jsonl", FIRST)
    Runtime(config, spark).run()
    _sql(spark, table, "ALTER TABLE {t} SET TBLPROPERTIES ('delta.feature.coordinatedCommits-preview' = 'supported')")
    write_jsonl(tmp_path / "src" / "b.jsonl", SECOND)
    with pytest.raises(TableStateError, match=r"coordinated commits \(table feature coordinatedCommits-preview\)") as refused:
        Runtime(config, spark).run()
    assert "DROP FEATURE" in str(refused.value) and _last_epoch(tmp_path) == 1
    _sql(spark, table, "ALTER TABLE {t} DROP FEATURE `coordinatedCommits-preview`")
    assert Runtime(config, spark).run().last_epoch == 2
    from materializer.tools import oracle

    rows = [r.asDict() for r in spark.read.format("delta").load(str(table)).collect()]
    result = oracle.compare(oracle.expected(config.bindings[0], 1000), rows, ["id"])
    assert result.ok, result
    # The feature leaves vacuumProtocolCheck behind (a reader feature), which delta-rs cannot read.
    with pytest.raises(Exception, match="VacuumProtocolCheck|vacuumProtocolCheck"):
        delta_rs_list(table)


# --- the checks alone (no JVM) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "properties", "refused"),
    [
        ("/data/t", {"delta.feature.catalogManaged": "supported"}, "catalog-managed"),
        ("/data/t", {"delta.feature.catalogOwned-preview": "supported"}, "catalog-managed"),
        ("main.sales.t", {"delta.feature.catalogManaged": "supported"}, None),  # by its catalog name
        ("main.sales.t", {"delta.coordinatedCommits.commitCoordinator-preview": "dynamodb"}, "coordinated commits"),
        ("/data/t", {"delta.feature.deletionVectors": "supported", "delta.feature.rowTracking": "supported"}, None),
    ],
)
def test_table_features_it_cannot_write_idempotently_are_refused(table: str, properties: dict[str, str], refused: str | None) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from materializer.config import parse_config
    from materializer.delta import TableRef, TableWriters
    from materializer.driver import table_changes

    raw = {"name": "b", "source": {"format": "documents", "path": "src"}, "table": table, "key": ["id"]}
    config = parse_config({"pipeline_id": "p", "recovery_log": "log", "staging": "st", "bindings": [raw]}, "x.yaml")
    schema = StructType([StructField("id", LongType())])
    writers = TableWriters(tags={}, app_ids={})  # nothing of ours yet: the history is not read
    call = lambda: table_changes.check(None, config.bindings[0], TableRef(table), properties, schema, writers, "p")  # type: ignore[arg-type]  # noqa: E731
    if refused is None:
        call()
    else:
        with pytest.raises(TableStateError, match=refused):
            call()


@pytest.mark.parametrize(
    ("options", "commits", "refused"),
    [
        ({}, [("RENAME COLUMN", {"oldColumnPath": "w", "newColumnPath": "w2"})], "'w' was renamed to 'w2'"),
        ({"except_columns": ["w"]}, [("RENAME COLUMN", {"oldColumnPath": "w", "newColumnPath": "w2"})], None),
        ({"columns": ["v"]}, [("DROP COLUMNS", {"columns": '["w"]'})], None),  # w does not land
        ({}, [("DROP COLUMNS", {"columns": '["w"]'})], "'w' was dropped"),
        # Renamed and renamed back: the table has the column again.
        ({}, [("RENAME COLUMN", {"oldColumnPath": "v", "newColumnPath": "x"}), ("RENAME COLUMN", {"oldColumnPath": "x", "newColumnPath": "v"})], None),
        ({}, [("RENAME COLUMN", {"oldColumnPath": "s.a", "newColumnPath": "s.b"})], "'s.a' was renamed"),  # a struct's field
    ],
)
def test_a_renamed_or_dropped_column_is_refused_while_its_old_name_lands(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], commits: list[tuple[str, dict[str, Any]]], refused: str | None
) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from materializer.config import parse_config
    from materializer.delta import TableRef, TableWriters
    from materializer.driver import table_changes

    raw = {"name": "b", "source": {"format": "documents", "path": "src"}, "table": "/t", "key": ["id"], **options}
    config = parse_config({"pipeline_id": "p", "recovery_log": "log", "staging": "st", "bindings": [raw]}, "x.yaml")
    found = [table_changes.Commit(3 + i, op, None, None, params, False) for i, (op, params) in enumerate(commits)]
    monkeypatch.setattr(table_changes, "commits_after", lambda spark, table, version: found)
    schema = StructType([StructField("id", LongType()), StructField("v", LongType()), StructField("s", StructType([StructField("b", LongType())]))])
    properties = {"delta.columnMapping.mode": "name"}
    writers = TableWriters(tags={("p", "b"): (0, 2)}, app_ids={"p": 2})
    call = lambda: table_changes.check(None, config.bindings[0], TableRef("/t"), properties, schema, writers, "p")  # type: ignore[arg-type]  # noqa: E731
    if refused is None:
        call()
    else:
        with pytest.raises(TableStateError, match=refused):
            call()


def test_a_catalog_managed_table_named_by_path_is_refused_at_open(spark: Any, tmp_path: Path) -> None:
    """No catalog runs here, so the table is made catalog-managed by a protocol commit written by
    hand (as Unity Catalog's would read): delta-spark then blocks its path, and Open says what to
    do instead of a JVM stack. Nothing is written."""
    import json

    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(tmp_path, "run", [binding("b", tmp_path / "src", table)])
    write_jsonl(tmp_path / "src" / "a.jsonl", FIRST)
    Runtime(config, spark).run()
    _sql(spark, table, "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true', "
         "'delta.feature.vacuumProtocolCheck' = 'supported')")
    log = table / "_delta_log"
    version = max(int(p.name.split(".")[0]) for p in log.glob("*.json")) + 1
    features = ["catalogManaged", "deletionVectors", "vacuumProtocolCheck"]
    (log / f"{version:020d}.json").write_text(
        json.dumps({"commitInfo": {"timestamp": 1765000000000, "inCommitTimestamp": 1765000000000, "operation": "UPGRADE PROTOCOL"}})
        + "\n" + json.dumps({"protocol": {
            "minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features,
            "writerFeatures": [*features, "inCommitTimestamp", "invariants", "appendOnly"],
        }}) + "\n"
    )
    write_jsonl(tmp_path / "src" / "b.jsonl", SECOND)
    with pytest.raises(TableStateError, match=r"is catalog-managed, and Delta refuses access to it by path .*catalog name"):
        Runtime(config, spark).run()
    assert _last_epoch(tmp_path) == 1 and len(list(log.glob("*.json"))) == version + 1


def test_a_rename_while_an_epoch_is_owed_is_refused_until_it_is_undone(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after epoch 2 is in the log: its rows were staged with the old name. A rename then
    stops the restart at Open (excluding the old name now would change the options of an epoch
    already staged, which is refused too); renamed back, the restart applies the epoch."""
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(tmp_path, "run", [binding("b", tmp_path / "src", table, max_files=1, properties={"delta.columnMapping.mode": "name"})])
    write_jsonl(tmp_path / "src" / "a.jsonl", FIRST)
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 1, "v": 10, "w": "b", "z": "b"}])
    killed = InProcessCrash(monkeypatch, "after-log-commit:2")
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        _sql(spark, table, "ALTER TABLE {t} RENAME COLUMN w TO w2")
        killed.disarm()
        with pytest.raises(TableStateError, match=r"column 'w' was renamed to 'w2'.*--max-epochs 0"):
            Runtime(config, spark).run()
        _sql(spark, table, "ALTER TABLE {t} RENAME COLUMN w2 TO w")
        assert Runtime(config, spark).run().last_epoch == 2
        assert spark.read.format("delta").load(str(table)).columns == ["id", "v", "w", "z"]
        assert_tables_equal_oracle(spark, config)
    finally:
        killed.thaw()
        frozen.join(60)
