"""Options changed on a binding whose table exists: each applies by its documented rule, or is
refused before the epoch is committed (the log holds no new epoch; with the old options back the
pipeline runs on). Generated from materializer.option_changes.RULES: every rule has a case here.

One pipeline, one binding per case, so the whole walk is a few in-process runs: epoch 1 under the
old options (all cases at once), one refused run per refused case (only its binding, stopped at
Open or before commit), then epoch 2 with every applied change and every refused case back on its
old options (all at once), checked case by case, with Spark and with delta-rs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from materializer.errors import ConfigError, MaterializerError, SourceError, TableStateError
from materializer.option_changes import RULES
from tests.helpers import binding, delta_rs_rows, table_rows, write_config, write_jsonl

FIRST = [
    {"id": 1, "v": 1, "w": "a", "ts": 10, "s": {"a": 1}},
    {"id": 2, "v": 2, "w": "b", "ts": 10, "s": {"a": 2}},
]
SECOND = [
    {"id": 1, "v": 5, "ts": 20, "s": {"a": 5}},  # w missing
    {"id": 2, "ts": 20, "_meta": {"op": "d"}},
    {"id": 3, "v": 3, "w": "c", "ts": 20, "s": {"a": 3}},
]
SCHEMA = "id BIGINT, v BIGINT, w STRING, ts BIGINT, s STRUCT<a: BIGINT>"
PLAIN = {  # SECOND over FIRST in mode standard, no options
    1: {"id": 1, "v": 5, "ts": 20, "s": {"a": 5}},
    3: {"id": 3, "v": 3, "w": "c", "ts": 20, "s": {"a": 3}},
}


@dataclass(frozen=True)
class Case:
    option: str
    change: str
    before: dict[str, Any]
    after: dict[str, Any]
    expected: dict[int, dict[str, Any]] | None = None
    """Applied: the table after SECOND (NULL fields left out; hidden columns but __deleted too)."""
    refusal: type[MaterializerError] = ConfigError
    """Refused: the error (ConfigError at Open, exit 2; SourceError before commit, exit 3; layout: exit 7)."""
    columns: list[str] | None = None
    """Applied: the table's columns afterwards, when the case is about them."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.option}_{self.change}"


def _without(row: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in names}


CASES = [
    # --- applied ---
    Case("sequence_by", "added", {}, {"sequence_by": ["ts"]}, {
        1: {**PLAIN[1], "__deleted": False}, 2: {"id": 2, "__deleted": True}, 3: {**PLAIN[3], "__deleted": False},
    }),
    Case("soft_delete", "added", {}, {"soft_delete": True}, {
        1: {**PLAIN[1], "__deleted": False}, 2: {**FIRST[1], "__deleted": True}, 3: {**PLAIN[3], "__deleted": False},
    }),
    Case("ignore_null_updates", "added", {}, {"ignore_null_updates": True}, {1: {**PLAIN[1], "w": "a"}, 3: PLAIN[3]}),
    Case("ignore_null_updates", "removed", {"ignore_null_updates": True}, {}, PLAIN),
    Case("delete_when", "added", {}, {"delete_when": "v = 3"}, {1: PLAIN[1]}),
    Case("delete_when", "changed", {"delete_when": "v = 99"}, {"delete_when": "v = 5"}, {3: PLAIN[3]}),
    Case("delete_when", "removed", {"delete_when": "v = 3"}, {}, PLAIN),
    Case("except_columns", "added", {}, {"except_columns": ["w"]}, {1: PLAIN[1], 3: _without(PLAIN[3], "w")},
         columns=["id", "v", "w", "ts", "s"]),
    Case("except_columns", "removed", {"except_columns": ["w"]}, {}, PLAIN, columns=["id", "v", "ts", "s", "w"]),
    Case("except_columns", "changed", {"except_columns": ["w"]}, {"except_columns": ["ts"]},
         {1: _without(PLAIN[1], "ts"), 3: _without(PLAIN[3], "ts")}, columns=["id", "v", "ts", "s", "w"]),
    Case("columns", "added", {}, {"columns": ["v"]}, {1: {"id": 1, "v": 5}, 3: {"id": 3, "v": 3}},
         columns=["id", "v", "w", "ts", "s"]),
    Case("columns", "changed", {"columns": ["v"]}, {"columns": ["v", "w"]}, {1: {"id": 1, "v": 5}, 3: {"id": 3, "v": 3, "w": "c"}},
         columns=["id", "v", "w"]),
    Case("columns", "removed", {"columns": ["v"]}, {}, PLAIN, columns=["id", "v", "ts", "s", "w"]),
    Case("schema", "added", {}, {"schema": SCHEMA}, PLAIN),
    Case("schema", "removed", {"schema": SCHEMA}, {}, PLAIN),
    Case("schema", "changed", {"schema": SCHEMA}, {"schema": "id BIGINT, v INT, w STRING, ts BIGINT, s STRUCT<a: INT>"}, PLAIN),
    Case("properties", "removed", {"properties": {"team": "sales"}}, {}, PLAIN),
    Case("partition_by", "removed", {"partition_by": ["w"]}, {}, PLAIN),
    Case("cluster_by", "removed", {"cluster_by": ["id"]}, {}, PLAIN),
    # --- refused ---
    Case("key", "changed", {}, {"key": ["v"]}),
    Case("mode", "changed", {}, {"mode": "scd2"}),
    Case("mode", "changed", {"mode": "scd2"}, {}, extra={"id": "scd2_to_standard"}),
    Case("mode", "changed", {}, {"mode": "delta_updates"}, extra={"id": "standard_to_delta_updates"}),
    Case("sequence_by", "removed", {"sequence_by": ["ts"]}, {}),
    Case("sequence_by", "changed", {"sequence_by": ["ts"]}, {"sequence_by": ["v"]}),
    Case("sequence_by", "added", {"mode": "scd2"}, {"mode": "scd2", "sequence_by": ["ts"]}, extra={"id": "scd2"}),
    Case("soft_delete", "removed", {"soft_delete": True}, {}),
    *[
        Case(option, change, {"mode": "scd2", **before}, {"mode": "scd2", **after})
        for option, change, before, after in (
            ("track_history", "added", {}, {"track_history": ["v"]}),
            ("track_history", "changed", {"track_history": ["v"]}, {"track_history": ["w"]}),
            ("track_history", "removed", {"track_history": ["v"]}, {}),
            ("track_history_except", "added", {}, {"track_history_except": ["v"]}),
            ("track_history_except", "changed", {"track_history_except": ["v"]}, {"track_history_except": ["w"]}),
            ("track_history_except", "removed", {"track_history_except": ["v"]}, {}),
        )
    ],
    Case("properties", "added", {}, {"properties": {"team": "sales"}}),
    Case("properties", "changed", {"properties": {"team": "sales"}}, {"properties": {"team": "ops"}}),
    Case("deletion_vectors", "changed", {}, {"deletion_vectors": True}),
    Case("partition_by", "added", {}, {"partition_by": ["w"]}, refusal=TableStateError),
    Case("partition_by", "changed", {"partition_by": ["w"]}, {"partition_by": ["v"]}, refusal=TableStateError),
    Case("cluster_by", "added", {}, {"cluster_by": ["id"]}, refusal=TableStateError),
    Case("cluster_by", "changed", {"cluster_by": ["id"]}, {"cluster_by": ["v"]}, refusal=TableStateError),
    # A wider number inside a struct: refused by the epoch's check before commit, not at Open.
    Case("schema", "changed", {"schema": "id BIGINT, v BIGINT, w STRING, ts BIGINT, s STRUCT<a: INT>"}, {"schema": SCHEMA},
         refusal=SourceError, extra={"id": "struct_wider"}),
]
APPLIED = [c for c in CASES if c.expected is not None]
REFUSED = [c for c in CASES if c.expected is None]


def _key(case: Case) -> str:
    """The case's binding (and table). Refused cases leave their table as it was, so those with the
    same old options share one: fewer tables to make, the same refusals."""
    if case.expected is None:
        import re

        return "refused_" + (re.sub(r"[^A-Za-z0-9]+", "_", repr(sorted(case.before.items()))).strip("_") or "defaults")
    return f"{case.name}_{case.extra['id']}" if "id" in case.extra else case.name


def _distinct(cases: list[Case]) -> list[Case]:
    """One case per binding."""
    seen: dict[str, Case] = {}
    for case in cases:
        seen.setdefault(_key(case), case)
    return list(seen.values())


def test_every_rule_has_a_case() -> None:
    """The walk covers the rule table: each (option, change) has a case with the rule's verdict."""
    for rule in RULES:
        matching = [c for c in CASES if (c.option, c.change) == (rule.option, rule.change)]
        assert matching, f"no case for {rule.option} {rule.change}"
        verdicts = {"applies" if c.expected is not None else "refused" for c in matching if "id" not in c.extra}
        assert verdicts <= {rule.verdict}, (rule, verdicts)


def _binding(tmp_path: Path, case: Case, options: dict[str, Any]) -> dict[str, Any]:
    name = _key(case)
    return binding(name, tmp_path / "src" / name, tmp_path / "tables" / name, **{"deletion_vectors": False, **options})


def _config(tmp_path: Path, folder: str, bindings: list[dict[str, Any]]) -> Any:
    from materializer.config import load_config

    (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    return load_config(write_config(
        tmp_path / folder, bindings, recovery_log=str(tmp_path / "log"), staging=str(tmp_path / "staging"),
    ))


def _last_epoch(tmp_path: Path) -> int:
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    return RecoveryLog(open_store(str(tmp_path / "log")), "test-pipeline").read().last_epoch


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not (k.startswith("__") and k != "__deleted")}


@pytest.mark.slow
@pytest.mark.spark
def test_option_changes_apply_by_their_rule_or_are_refused_before_commit(spark: Any, tmp_path: Path) -> None:
    from materializer.runtime import Runtime

    tables = _distinct(CASES)
    for case in tables:
        write_jsonl(tmp_path / "src" / _key(case) / "a.jsonl", FIRST)
    Runtime(_config(tmp_path, "first", [_binding(tmp_path, c, c.before) for c in tables]), spark).run()
    assert _last_epoch(tmp_path) == 1
    for case in tables:
        write_jsonl(tmp_path / "src" / _key(case) / "b.jsonl", SECOND)

    # Each refused change alone: stopped before anything is committed, naming the binding and option.
    for i, case in enumerate(REFUSED):
        config = _config(tmp_path, f"refused-{i}", [_binding(tmp_path, case, case.after)])
        with pytest.raises(case.refusal) as refused:
            Runtime(config, spark).run()
        message = str(refused.value)
        assert _key(case) in message and (case.option in message or "field 's.a'" in message), message
        assert refused.value.exit_code in (2, 3, 7)
        assert _last_epoch(tmp_path) == 1, f"{case}: an epoch was committed"

    # Every applied change, and every refused one back on its old options: the pipeline runs on.
    bindings = [_binding(tmp_path, c, c.after if c.expected is not None else c.before) for c in tables]
    summary = Runtime(_config(tmp_path, "second", bindings), spark).run()
    assert summary.last_epoch == 2 and _last_epoch(tmp_path) == 2
    for case in tables:
        table = tmp_path / "tables" / _key(case)
        key = case.after.get("key", ["id"]) if case.expected is not None else case.before.get("key", ["id"])
        spark_rows = table_rows(spark, table, key) if case.before.get("mode") != "scd2" else None
        if spark_rows is not None:
            # (__deleted_at: a time, which the two readers give with and without its zone)
            assert {k: _without(r, "__deleted_at") for k, r in spark_rows.items()} == {
                k: _without(r, "__deleted_at") for k, r in delta_rs_rows(table, key).items()
            }, _key(case)
        if case.expected is None:
            if case.before.get("mode") == "scd2":
                from deltalake import DeltaTable

                current = spark.read.format("delta").load(str(table)).where("__current").collect()
                assert sorted(r["id"] for r in current) == [1, 3], _key(case)
                rust = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
                assert sorted(r["id"] for r in rust if r["__current"]) == [1, 3], _key(case)
            else:
                live = {k[0]: r for k, r in (spark_rows or {}).items() if not r.get("__deleted")}
                assert sorted(live) == [1, 3] and live[1]["v"] == 5, _key(case)
            continue
        assert spark_rows is not None
        got = {k[0]: _shown(r) for k, r in spark_rows.items()}
        assert got == case.expected, (_key(case), got)
        if case.columns is not None:
            assert sorted(spark.read.format("delta").load(str(table)).columns) == sorted(case.columns), _key(case)


# --- the checks alone (no JVM) -------------------------------------------------------------------


def _parsed(**options: Any) -> Any:
    from materializer.config import parse_config

    raw = {"name": "b", "source": {"format": "documents", "path": "src"}, "table": "t", "key": ["id"], **options}
    return parse_config({"pipeline_id": "p", "recovery_log": "log", "staging": "st", "bindings": [raw]}, "x.yaml").bindings[0]


def _schema(ddl: str) -> Any:
    """A table schema from ``name TYPE, …`` (the few types these cases use; no JVM to parse DDL)."""
    from pyspark.sql import types as T

    simple = {"BIGINT": T.LongType(), "STRING": T.StringType(), "BOOLEAN": T.BooleanType(), "TIMESTAMP": T.TimestampType()}
    fields = []
    for part in ddl.split(", "):
        name, kind = part.split(" ", 1)
        if kind.startswith("STRUCT<"):
            inner = kind[len("STRUCT<"):-1].split(": ")[0]
            dtype: Any = T.StructType([T.StructField(inner, T.DecimalType(38, 9))])
        else:
            dtype = simple[kind]
        fields.append(T.StructField(name, dtype))
    return T.StructType(fields)


@pytest.mark.parametrize(
    "options, table, message",
    [
        # A log written before options were recorded: the table's own columns tell.
        ({}, "id BIGINT, v BIGINT, __start_at BIGINT, __end_at BIGINT, __current BOOLEAN, __deleted BOOLEAN", "written in mode scd2"),
        ({"sequence_by": ["v"]}, "id BIGINT, v BIGINT, __sequence STRUCT<ts: DECIMAL(38,9)>, __deleted BOOLEAN", r"sequenced by \['ts'\]"),
        ({}, "id BIGINT, v BIGINT, __sequence STRUCT<ts: DECIMAL(38,9)>, __deleted BOOLEAN", r"sequenced by \['ts'\]"),
        ({"sequence_by": ["ts"]}, "id BIGINT, v BIGINT, __deleted BOOLEAN, __deleted_at TIMESTAMP", "soft_delete removed"),
        ({}, "id BIGINT, v BIGINT, _op STRING", "written in mode delta_updates"),
    ],
)
def test_without_a_record_the_tables_columns_tell_what_changed(options: dict[str, Any], table: str, message: str) -> None:
    from materializer import option_changes

    with pytest.raises(ConfigError, match=f"binding 'b': .*{message}"):
        option_changes.check(_parsed(**options), None, _schema(table), {}, pending=False)


def test_a_change_that_applies_waits_for_the_last_epoch_to_be_applied() -> None:
    from materializer import option_changes

    recorded = option_changes.table_options(_parsed())
    binding = _parsed(ignore_null_updates=True)
    schema = _schema("id BIGINT, v BIGINT")
    assert [r.option for r in option_changes.check(binding, recorded, schema, {}, pending=False)] == ["ignore_null_updates"]
    with pytest.raises(ConfigError, match="ignore_null_updates changed while the last committed epoch.*--max-epochs 0"):
        option_changes.check(binding, recorded, schema, {}, pending=True)
    assert option_changes.check(_parsed(), recorded, schema, {}, pending=True) == []  # nothing changed: nothing to wait for
