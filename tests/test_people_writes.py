"""A person's DELETE and UPDATE on a table the pipeline writes (docs/neighbours.md, "People's writes").

By default the pipeline writes on: a person's change stays until the source changes the same key
again, which then lands as usual (a key deleted by hand comes back with its next change: a delete
of source data must happen at the source too). ``others_may_write: false`` stops the run at Open
instead, naming the commit, while maintenance and ALTER's metadata commits do not count.

Each table is read by Spark and by delta-rs and compared with the oracle of its sources, adjusted
for the person's change: the rows as they stood when the person wrote, changed as the person's
SQL changed them, then the later epochs' changes over them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from materializer.errors import TableStateError
from tests.helpers import InProcessCrash, binding, delta_rs_list, write_config, write_jsonl

FIRST = [{"id": i, "v": i, "w": f"w{i}"} for i in range(1, 6)]
SECOND = [{"id": 2, "v": 20, "w": "b"}, {"id": 3, "v": 30, "w": "b"}, {"id": 6, "v": 60, "w": "b"}]
MODES: dict[str, dict[str, Any]] = {
    "standard": {},
    "soft_delete": {"soft_delete": True},
    "delta_updates": {"mode": "delta_updates"},
}


def _config(tmp_path: Path, folder: str, bindings: list[dict[str, Any]], **settings: Any) -> Any:
    from materializer.config import load_config

    (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    return load_config(write_config(
        tmp_path / folder, bindings, recovery_log=str(tmp_path / "log"), staging=str(tmp_path / "staging"), **settings
    ))


def _last_epoch(tmp_path: Path) -> int:
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    return RecoveryLog(open_store(str(tmp_path / "log")), "test-pipeline").read().last_epoch


def _person(spark: Any, table: Path, *statements: str) -> None:
    """A person's SQL on the table, in a session that carries no txn id and no tag of ours."""
    person = spark.newSession()
    for statement in statements:
        person.sql(statement.format(t=f"delta.`{table}`")).collect()


def _edited(expected: Any, edit: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[Any, Counter[str]]:
    """The oracle's rows with a person's change applied: ``edit`` returns the row changed, or None
    for a row deleted."""
    from materializer.tools.oracle import canonical

    out: dict[Any, Counter[str]] = {}
    for key, rows in expected.rows.items():
        for text, n in rows.items():
            row = edit(json.loads(text))
            if row is not None:
                out.setdefault(key, Counter())[canonical(row)] += n
    return out


def _person_edit(row: dict[str, Any]) -> dict[str, Any] | None:
    """What the person's SQL (below) does to a row: keys 2 and 4 deleted, 3 and 5 updated."""
    if row["id"] in (2, 4):
        return None
    if row["id"] == 3:
        return {**row, "v": 99}
    if row["id"] == 5:
        return {**row, "v": 77}
    return row


PERSON = (
    "DELETE FROM {t} WHERE id IN (2, 4)",
    "UPDATE {t} SET v = 99 WHERE id = 3",
    "UPDATE {t} SET v = 77 WHERE id = 5",
)


def _expected_after(mode: str, before: Any, final: Any, later_keys: set[Any]) -> Any:
    """The oracle adjusted: ``before`` (the oracle when the person wrote) edited by the person,
    then what the later epochs changed. One row per key: a key the later epochs changed is theirs;
    delta_updates: the later epochs' rows are appended to the edited ones."""
    edited = _edited(before, _person_edit)
    if mode == "delta_updates":
        rows = {k: Counter(v) for k, v in edited.items()}
        for key, counts in final.rows.items():
            later = counts - before.rows.get(key, Counter())
            if later:
                rows.setdefault(key, Counter()).update(later)
    else:
        rows = {k: v for k, v in edited.items() if k not in later_keys}
        rows.update({k: v for k, v in final.rows.items() if k in later_keys})
    return dataclasses.replace(final, rows=rows)


def _assert_table(spark: Any, table: Path, expected: Any) -> None:
    from materializer.tools import oracle

    for reader, rows in (
        ("spark", [r.asDict(recursive=True) for r in spark.read.format("delta").load(str(table)).collect()]),
        ("delta-rs", delta_rs_list(table)),
    ):
        result = oracle.compare(expected, rows, ["id"])
        assert result.ok, f"{table.name} read by {reader}: lost {result.lost}, duplicated {result.duplicated}, wrong {result.wrong}"


def _expected(config: Any, name: str) -> Any:
    from materializer.tools import oracle

    return oracle.expected(config.binding(name), config.transaction.max_documents)


@pytest.mark.slow
def test_a_persons_delete_and_update_stay_until_the_key_changes_again_in_every_mode(spark: Any, tmp_path: Path) -> None:
    """standard, soft_delete and delta_updates side by side: the person's DELETE and UPDATE are not
    another writer (no txn id, no tag: the run is not stopped), rows the source leaves alone keep
    the person's change, and keys the source changes again land as usual. Key 2, deleted by hand
    (a GDPR erasure done only at the table), comes back with its next change."""
    from materializer.runtime import Runtime

    bindings = [binding(m, tmp_path / "src" / m, tmp_path / "tables" / m, **o) for m, o in MODES.items()]
    for m in MODES:
        write_jsonl(tmp_path / "src" / m / "a.jsonl", FIRST)
    config = _config(tmp_path, "run", bindings)
    Runtime(config, spark).run()
    before = {m: _expected(config, m) for m in MODES}
    for m in MODES:
        _person(spark, tmp_path / "tables" / m, *PERSON)
        write_jsonl(tmp_path / "src" / m / "b.jsonl", SECOND)

    summary = Runtime(config, spark).run()  # adopt_table is off: the person's commits are not foreign
    assert summary.last_epoch == 2
    for m in MODES:
        expected = _expected_after(m, before[m], _expected(config, m), {(2,), (3,), (6,)})
        _assert_table(spark, tmp_path / "tables" / m, expected)
    standard = {r["id"]: r for r in delta_rs_list(tmp_path / "tables" / "standard")}
    assert standard[2]["v"] == 20 and 4 not in standard and standard[5]["v"] == 77  # key 2 came back


def _scd2_versions(rows: list[dict[str, Any]]) -> dict[int, list[tuple[int, bool]]]:
    """Per key, its versions' (v, __current), oldest first."""
    out: dict[int, list[tuple[int, bool]]] = {}
    for row in sorted(rows, key=lambda r: (r["id"], r["__start_at"])):
        out.setdefault(row["id"], []).append((row["v"], bool(row["__current"])))
    return out


@pytest.mark.slow
def test_scd2_a_deleted_history_row_stays_deleted_and_a_deleted_current_one_ends_the_key_until_its_next_change(
    spark: Any, tmp_path: Path
) -> None:
    """In mode scd2 each row is one version. A closed version deleted by hand is gone from the
    history (nothing writes it again); the current version deleted ends the key until its next
    change, which opens a new current version (no version to close); the current version updated
    in place is the version the next change closes."""
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "h"
    config = _config(tmp_path, "run", [binding("h", tmp_path / "src", table, mode="scd2", max_files=1)])
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": i, "v": i} for i in (1, 2, 3)])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": i, "v": 10 * i} for i in (1, 2, 3)])
    Runtime(config, spark).run()
    assert _last_epoch(tmp_path) == 2
    _person(
        spark, table,
        "DELETE FROM {t} WHERE id = 1 AND NOT __current",  # a history row
        "DELETE FROM {t} WHERE id = 2 AND __current",  # the key's current version
        "UPDATE {t} SET v = 99 WHERE id = 3 AND __current",
    )
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": i, "v": 100 * i} for i in (1, 2, 3)])
    Runtime(config, spark).run()
    assert _last_epoch(tmp_path) == 3
    expected = {
        1: [(10, False), (100, True)],
        2: [(2, False), (200, True)],
        3: [(3, False), (99, False), (300, True)],
    }
    assert _scd2_versions([r.asDict() for r in spark.read.format("delta").load(str(table)).collect()]) == expected
    assert _scd2_versions(delta_rs_list(table)) == expected
    # The oracle, less the person's history row and current version, and with the updated one.
    def edit(row: dict[str, Any]) -> dict[str, Any] | None:
        if (row["id"], row["v"]) in ((1, 1), (2, 20)):
            return None
        return {**row, "v": 99} if (row["id"], row["v"]) == (3, 30) else row

    oracle_rows = _edited(_expected(config, "h"), edit)
    got = Counter((r["id"], r["v"]) for r in delta_rs_list(table))
    want = Counter((json.loads(t)["id"], json.loads(t)["v"]) for rows in oracle_rows.values() for t, n in rows.items() for _ in range(n))
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "applied"),
    [
        # The epoch is in the log, not in the table: the restart applies it over the person's change.
        ("after-log-commit", False),
        # The epoch's MERGE committed before the kill (the first of two tables): the restart's
        # re-apply of it is skipped (txn id), so the person's change made after it stays, even on
        # a key of that epoch.
        ("after-apply", True),
    ],
)
def test_a_persons_change_between_a_kill_and_its_restart(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, applied: bool
) -> None:
    from materializer.delta import TableRef, table_state
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(
        tmp_path, "run",
        [binding("b", tmp_path / "src", table, max_files=1), binding("z", tmp_path / "z", tmp_path / "tables" / "z", max_files=1)],
        # One table after the other, b first: after-apply fires between the two.
        transaction={"max_documents": 1000, "pipelined": False, "parallel_bindings": 1},
    )
    for folder in ("src", "z"):
        write_jsonl(tmp_path / folder / "a.jsonl", FIRST)
        write_jsonl(tmp_path / folder / "b.jsonl", SECOND)
    killed = InProcessCrash(monkeypatch, f"{point}:2")
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        assert table_state(spark, TableRef(str(table)), "test-pipeline").txn_version == (2 if applied else 1)
        before = _expected(config, "b")  # both files: the rows epoch 2 brings, by the oracle
        # The person: key 2 (changed by epoch 2) set by hand, key 5 (not in epoch 2) too, key 4 deleted.
        _person(spark, table, "UPDATE {t} SET v = -2 WHERE id = 2", "UPDATE {t} SET v = 77 WHERE id = 5", "DELETE FROM {t} WHERE id = 4")
        killed.disarm()
        summary = Runtime(config, spark).run()
        assert summary.last_epoch == 2
        assert {r.binding: r.status for r in summary.reapplied.results} == {"b": "skipped" if applied else "applied", "z": "applied"}

        def edit(row: dict[str, Any]) -> dict[str, Any] | None:
            if row["id"] == 4:
                return None
            if row["id"] == 5:
                return {**row, "v": 77}
            if row["id"] == 2 and applied:
                return {**row, "v": -2}  # after epoch 2's MERGE: the person's value is the last
            return row

        _assert_table(spark, table, dataclasses.replace(before, rows=_edited(before, edit)))
    finally:
        killed.thaw()
        frozen.join(60)


@pytest.mark.slow
def test_others_may_write_false_stops_at_a_commit_that_changed_rows_not_at_maintenance(spark: Any, tmp_path: Path) -> None:
    """``others_may_write: false``: OPTIMIZE, VACUUM and ALTER's metadata commits pass; a person's
    UPDATE stops the next run at Open (exit 7) naming its version and operation, with nothing
    read, committed or written; set to true the run goes on, and false again checks only the
    commits after the pipeline's last one."""
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    source = tmp_path / "src"

    def config(others: bool) -> Any:
        return _config(tmp_path, f"run-{others}", [binding("b", source, table, others_may_write=others)])

    write_jsonl(source / "a.jsonl", FIRST)
    Runtime(config(False), spark).run()
    _person(
        spark, table,
        "OPTIMIZE {t}",
        "ALTER TABLE {t} SET TBLPROPERTIES ('team' = 'ops')",
        "ALTER TABLE {t} ADD COLUMNS (note STRING)",
        "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (v > 0)",
        "VACUUM {t}",
    )
    write_jsonl(source / "b.jsonl", SECOND)
    assert Runtime(config(False), spark).run().last_epoch == 2

    _person(spark, table, "UPDATE {t} SET v = 99 WHERE id = 1")
    version = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]["version"]
    write_jsonl(source / "c.jsonl", [{"id": 1, "v": 100, "w": "c"}])
    rows_before = sorted(map(str, spark.read.format("delta").load(str(table)).collect()))
    with pytest.raises(TableStateError) as refused:
        Runtime(config(False), spark).run()
    message = str(refused.value)
    assert refused.value.exit_code == 7
    assert f"version {version} (UPDATE at " in message and "'b'" in message and "others_may_write: true" in message, message
    assert _last_epoch(tmp_path) == 2
    assert sorted(map(str, spark.read.format("delta").load(str(table)).collect())) == rows_before

    assert Runtime(config(True), spark).run().last_epoch == 3  # accepted: the change is part of the table
    _person(spark, table, "OPTIMIZE {t}")
    write_jsonl(source / "d.jsonl", [{"id": 2, "v": 200, "w": "d"}])
    assert Runtime(config(False), spark).run().last_epoch == 4  # only the commits after epoch 3's count
    rows = {r["id"]: r for r in delta_rs_list(table)}
    assert rows[1]["v"] == 100 and rows[2]["v"] == 200 and rows[5]["v"] == 5


def test_others_may_write_false_stops_a_pending_epoch_after_a_persons_delete(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a kill and its restart: the restart would apply the committed epoch over the
    person's DELETE. With ``others_may_write: false`` it stops at Open, the epoch still owed."""
    from materializer.delta import TableRef, table_state
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "b"
    config = _config(tmp_path, "run", [binding("b", tmp_path / "src", table, max_files=1, others_may_write=False)])
    write_jsonl(tmp_path / "src" / "a.jsonl", FIRST)
    write_jsonl(tmp_path / "src" / "b.jsonl", SECOND)
    killed = InProcessCrash(monkeypatch, "after-log-commit:2")
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        _person(spark, table, "DELETE FROM {t} WHERE id = 2")
        killed.disarm()
        with pytest.raises(TableStateError, match=r"DELETE at .*others_may_write: false"):
            Runtime(config, spark).run()
        assert table_state(spark, TableRef(str(table)), "test-pipeline").txn_version == 1
        assert 2 not in {r["id"] for r in delta_rs_list(table)}
    finally:
        killed.thaw()
        frozen.join(60)


# --- the check alone (no JVM) ---------------------------------------------------------------------


def _commit(version: int, operation: str, changes: bool, tag: dict[str, Any] | None = None, **params: Any) -> Any:
    from materializer.driver.table_changes import Commit

    return Commit(version, operation, 1_700_000_000_000, "ana", params, changes, tag)


@pytest.mark.parametrize(
    ("commits", "stops"),
    [
        ([_commit(3, "OPTIMIZE", False), _commit(4, "VACUUM END", False)], False),  # maintenance
        ([_commit(3, "ADD COLUMNS", False), _commit(4, "SET TBLPROPERTIES", False)], False),  # ALTER's metadata
        ([_commit(3, "MERGE", True, {"pipeline": "p", "binding": "b", "epoch": 2})], False),  # ours
        ([_commit(3, "DELETE", True)], True),  # a person's
        ([_commit(3, "MERGE", True, {"pipeline": "other", "binding": "b", "epoch": 9})], True),  # another pipeline's
        ([_commit(3, "WRITE", True)], True),
    ],
)
def test_which_commits_count_as_rows_changed(monkeypatch: pytest.MonkeyPatch, commits: list[Any], stops: bool) -> None:
    from materializer.config import parse_config
    from materializer.delta import TableRef, TableWriters
    from materializer.driver import table_changes

    raw = {"name": "b", "source": {"format": "documents", "path": "src"}, "table": "/t", "key": ["id"], "others_may_write": False}
    config = parse_config({"pipeline_id": "p", "recovery_log": "log", "staging": "st", "bindings": [raw]}, "x.yaml")
    monkeypatch.setattr(table_changes, "commits_after", lambda spark, table, version: commits)
    writers = TableWriters(tags={("p", "b"): (0, 2)}, app_ids={"p": 2})
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("id", LongType())])
    call = lambda: table_changes.check(None, config.bindings[0], TableRef("/t"), {}, schema, writers, "p")  # type: ignore[arg-type]  # noqa: E731
    if stops:
        with pytest.raises(TableStateError, match=r"version 3 \(\w+ at 2023-11-14 22:13:20 UTC by ana\)"):
            call()
    else:
        call()


def test_the_option_change_table_lists_the_options_that_shape_no_table() -> None:
    from materializer.option_changes import RECORDED, UNRECORDED
    from tests.helpers import REPO

    table = (REPO / "docs" / "semantics.md").read_text()
    for option in UNRECORDED:
        assert option not in RECORDED
        assert f"| `{option}` | applies" in table, option


@pytest.mark.slow
def test_a_catalog_table_is_checked_through_its_history(spark: Any, tmp_path: Path) -> None:
    """A table named by catalog name: the commits after ours come from DESCRIBE HISTORY (what
    Unity Catalog leaves where path access to a managed table's files is refused). A person's
    UPDATE stops ``others_may_write: false``; after an OPTIMIZE alone the run goes on."""
    from materializer.runtime import Runtime

    name = f"default.people_{tmp_path.name.replace('-', '_').lower()[-20:]}"
    config = _config(tmp_path, "run", [binding("b", tmp_path / "src", name, others_may_write=False)])  # type: ignore[arg-type]
    write_jsonl(tmp_path / "src" / "a.jsonl", FIRST)
    try:
        Runtime(config, spark).run()
        spark.newSession().sql(f"OPTIMIZE {name}").collect()
        write_jsonl(tmp_path / "src" / "b.jsonl", SECOND)
        assert Runtime(config, spark).run().last_epoch == 2
        spark.newSession().sql(f"UPDATE {name} SET v = 99 WHERE id = 1").collect()
        write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 1, "v": 100}])
        with pytest.raises(TableStateError, match=r"\(UPDATE at .*others_may_write: false"):
            Runtime(config, spark).run()
        assert _last_epoch(tmp_path) == 2
        assert spark.table(name).where("id = 1").collect()[0]["v"] == 99
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_with_sequence_by_a_row_deleted_by_hand_takes_even_an_older_change(spark: Any, tmp_path: Path) -> None:
    """The row deleted by hand takes its ``__sequence`` with it: a late change older than the
    deleted row then lands (key 1), where the same late change of a key left alone is ignored
    (key 2): a late change never beats a stored row, but there is none to beat."""
    from materializer.runtime import Runtime

    table = tmp_path / "tables" / "s"
    config = _config(tmp_path, "run", [binding("s", tmp_path / "src", table, sequence_by=["ts"])])
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "ts": 10, "v": "new"}, {"id": 2, "ts": 10, "v": "new"}])
    Runtime(config, spark).run()
    _person(spark, table, "DELETE FROM {t} WHERE id = 1")
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 1, "ts": 5, "v": "late"}, {"id": 2, "ts": 5, "v": "late"}])
    assert Runtime(config, spark).run().last_epoch == 2
    for rows in (delta_rs_list(table), [r.asDict(recursive=True) for r in spark.read.format("delta").load(str(table)).collect()]):
        assert {r["id"]: (r["ts"], r["v"], r["__deleted"]) for r in rows} == {1: (5, "late", False), 2: (10, "new", False)}
