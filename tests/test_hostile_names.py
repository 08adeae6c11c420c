"""Hostile names and forged bounds (issue #66 items 1 and 4): one quoting function for SQL string
literals, and key bounds from the recovery log rendered only from typed values."""

from __future__ import annotations

from typing import Any

import pytest

from materializer.bounds import ForgedBound, bounds_condition
from materializer.delta import literal

HOSTILE = ["x'", "p'||'q", "a\\b", "/**/c", "ü'ñ", "\\'", "'; DROP TABLE t; --", "a\\\\'b"]


def test_a_literal_has_no_unescaped_quote_inside() -> None:
    for text in HOSTILE:
        out = literal(text)
        assert out.startswith("'") and out.endswith("'")
        inner, i = out[1:-1], 0
        while i < len(inner):  # every quote inside is escaped by a backslash that is not itself escaped
            if inner[i] == "\\":
                i += 2
                continue
            assert inner[i] != "'", (text, out)
            i += 1


@pytest.mark.spark
def test_a_literal_reads_back_as_the_same_text_in_spark(spark: Any) -> None:
    for text in HOSTILE:
        assert spark.sql(f"SELECT {literal(text)} AS v").first().v == text
        row = spark.sql(f"SELECT named_struct({literal(text)}, 1) AS s").first()
        assert list(row.s.asDict()) == [text]


@pytest.mark.parametrize("bound", [
    ["integer", "1 OR true", "2"],
    ["integer", "1", "2) OR (true"],
    ["string", "41' OR true OR X'41", "42"],
    ["string", "414", "42"],  # not whole bytes
    ["decimal(10,2)) OR (true", "1.5", "2.5"],
    ["decimal(10,2)", "1.5' OR '1", "2.5"],
    ["date", "1 OR true", "3"],
    ["timestamp", "0", "1;"],
    ["float", "1", "2"],
])
def test_a_forged_bound_is_refused_not_spliced(bound: list[str]) -> None:
    with pytest.raises(ForgedBound, match="recovery log entry"):
        bounds_condition({"id": bound})


def test_true_bounds_render_as_before() -> None:
    got = bounds_condition({"id": ["integer", "-3", "17"], "s": ["string", "4142", "43"], "d": ["decimal(10,2)", "-1.50", "2"]})
    assert got == (
        " AND t.`d` >= CAST('-1.50' AS decimal(10,2)) AND t.`d` <= CAST('2' AS decimal(10,2))"
        " AND t.`id` >= -3 AND t.`id` <= 17"
        " AND t.`s` >= CAST(X'4142' AS STRING) AND t.`s` <= CAST(X'43' AS STRING)"
    )


def _log_with_bounds(tmp_path: Any, bounds: dict[str, Any]) -> Any:
    """A log whose last commit entry was rewritten by hand with ``bounds`` on binding b's staged
    file, its checksum recomputed as an attacker would (encode does exactly that)."""
    from materializer.protocol import DriverCheckpoint, StagedFile
    from materializer.recovery_log import RecoveryLog, encode, entry_path
    from materializer.storage.local import LocalStore

    store = LocalStore(str(tmp_path / "log"))
    log = RecoveryLog(store, "p")
    log.open()
    staged = StagedFile(uri="staged/epoch-000000000001/b-0123456789ab", rows=1, bytes=1, files=1, key_bounds={"id": ["integer", "1", "9"]})
    entry = log.commit(1, {}, DriverCheckpoint(epoch=1, staged={"b": staged}))
    forged = entry.model_copy(update={"driver_checkpoint": DriverCheckpoint(
        epoch=1, staged={"b": staged.model_copy(update={"key_bounds": bounds})})})
    (tmp_path / "log" / entry_path(entry.seq)).write_bytes(encode(forged))
    return store


@pytest.mark.parametrize("bounds, keys, reason", [
    # a column that is not the binding's key: quote() makes it an identifier, but the MERGE would
    # then bound a column the staged rows say nothing about (rows of the table left unmatched)
    ({"name": ["string", "41", "42"]}, {"b": ["id"]}, "'name' is not a key column of the binding"),
    ({"id` OR true OR `x": ["integer", "1", "2"]}, {"b": ["id"]}, "is not a key column"),
    ({"id": ["integer", "1", "9"], "other": ["integer", "1", "9"]}, {"b": ["id"], "old_b": ["id"]}, "'other' is not a key column"),
    # a kind or a value that is not one: refused whether or not the keys are known
    ({"id": ["float", "1", "2"]}, {}, "has kind 'float'"),
    ({"id": ["decimal(10,2)) OR (true", "1.5", "2.5"]}, {"b": ["id"]}, "has kind"),
    ({"id": ["integer", "1 OR true", "2"]}, {}, "is not a value of kind 'integer'"),
    ({"id": ["integer", "1"]}, {}, "is not \\[kind, low, high\\]"),
])
def test_forged_key_bounds_are_refused_where_the_entry_is_read(tmp_path: Any, bounds: dict[str, Any], keys: dict[str, list[str]], reason: str) -> None:
    """Issue #66 item 4: the bounds are checked when the recovery log is read (the run reads it with
    each binding's key), so a damaged entry stops before any SQL is built, naming the entry, the
    field and `materializer recover`, as a forged staged URI does."""
    from materializer.errors import RecoveryLogError
    from materializer.recovery_log import RecoveryLog

    store = _log_with_bounds(tmp_path, bounds)
    with pytest.raises(RecoveryLogError, match=reason) as refused:
        RecoveryLog(store, "p", keys=keys).read()
    message = str(refused.value)
    assert "entries/00000000000000000002.json" in message and "driver_checkpoint.staged.b.key_bounds" in message
    assert "materializer recover" in message and "changed by hand or damaged" in message


def test_true_key_bounds_read_back_with_the_keys(tmp_path: Any) -> None:
    from materializer.recovery_log import RecoveryLog, binding_keys
    from materializer.config import parse_config

    config = parse_config({"pipeline_id": "p", "recovery_log": "/l", "staging": "/s", "bindings": [
        {"name": "b", "previous_names": ["old_b"], "table": "/t", "key": ["id", "k2"], "source": {"format": "documents", "path": "/x"}}]}, "t")
    assert binding_keys(config.bindings) == {"b": ["id", "k2"], "old_b": ["id", "k2"]}
    store = _log_with_bounds(tmp_path, {"id": ["integer", "-3", "17"], "k2": ["decimal(10,2)", "1.50", "2"]})
    last = RecoveryLog(store, "p", keys=binding_keys(config.bindings)).read().last_commit
    assert last is not None and last.driver_checkpoint.staged["b"].key_bounds["k2"] == ["decimal(10,2)", "1.50", "2"]  # type: ignore[union-attr]



def test_bounds_of_the_key_an_epoch_was_staged_with_are_no_damage_after_a_key_change(tmp_path: Any) -> None:
    """The entry records the key its epoch was staged with (``options``): a key changed in the
    configuration since is an option change, which Open applies or refuses saying so, not a
    damaged entry. A bound on a column that is neither is still refused."""
    from materializer.errors import RecoveryLogError
    from materializer.protocol import DriverCheckpoint, StagedFile
    from materializer.recovery_log import RecoveryLog
    from materializer.storage.local import LocalStore

    store = LocalStore(str(tmp_path / "log"))
    log = RecoveryLog(store, "p")
    log.open()
    staged = StagedFile(uri="staged/epoch-000000000001/b-0123456789ab", rows=1, bytes=1, files=1, key_bounds={"id": ["integer", "1", "9"]})
    log.commit(1, {}, DriverCheckpoint(epoch=1, staged={"b": staged}, options={"b": {"key": ["id"]}}))
    last = RecoveryLog(store, "p", keys={"b": ["v"]}).read().last_commit  # the configuration's key is now v
    assert last is not None and last.driver_checkpoint.staged["b"].key_bounds == {"id": ["integer", "1", "9"]}  # type: ignore[union-attr]
    log.commit(2, {}, DriverCheckpoint(epoch=2, staged={"b": staged.model_copy(update={"key_bounds": {"w": ["integer", "1", "2"]}})},
                                       options={"b": {"key": ["id"]}}))
    with pytest.raises(RecoveryLogError, match="'w' is not a key column of the binding \\(its key: id\\)"):
        RecoveryLog(store, "p", keys={"b": ["v"]}).read()


# --- hostile field names through whole runs, on every mode ------------------------------------

FIELDS = ["x'", "p'||'q", "a\\b", "/**/c", "ü'ñ", 'q"', "x?", "$[0]", "--c", "a.b", "\\'"]
"""Field names a document may hold (Delta refuses `` ,;{}()=``, the backtick and line breaks, and
the documents reader refuses them first): quotes, ``||``, comments, backslashes, JSONPath and
Spark's column-path syntax, unicode."""


def _hostile_docs(epoch: int, key: str = "id") -> list[dict[str, Any]]:
    if epoch == 1:
        return [{key: k, "ts": 1, **{f: f"{k}-{i}" for i, f in enumerate(FIELDS)}} for k in (1, 2, 3)]
    # epoch 2: key 1's first field null (ignore_null_updates keeps the stored value), the others
    # changed; key 2 deleted; key 4 new.
    return [
        {key: 1, "ts": 2, FIELDS[0]: None, **{f: f"new-{i}" for i, f in enumerate(FIELDS) if i}},
        {key: 2, "ts": 2, "_meta": {"op": "d"}},
        {key: 4, "ts": 2, **{f: f"4-{i}" for i, f in enumerate(FIELDS)}},
    ]


MODES = {
    "sequence_ignore_nulls": dict(sequence_by=["ts"], ignore_null_updates=True),
    "soft_delete_view": dict(soft_delete=True, view="default"),
    "reductions": dict(reductions={FIELDS[1]: "lastWriteWins"}, except_columns=[FIELDS[2]]),
    "delta_updates": dict(mode="delta_updates"),
    "null_only_epoch": dict(sequence_by=["ts"], null_epoch=True),
    "scd2": dict(mode="scd2", sequence_by=["ts"], track_history=[FIELDS[0], FIELDS[1]], view="default"),
    # The key and the layout are named in config, and reach the MERGE's ON clause, its key bounds
    # and the table's DDL: a hostile key field, partitioned by a hostile field.
    "hostile_key_partitioned": dict(key=["k'||ey\\"], partition_by=[FIELDS[4]], sequence_by=["ts"]),
}


@pytest.mark.spark
@pytest.mark.parametrize("mode", list(MODES))
def test_hostile_field_names_land_as_data_on_every_mode(spark: Any, tmp_path: Any, mode: str) -> None:
    """Each name is a column of the table, read back the same by Spark and by delta-rs, and by the
    live-row view where there is one; the oracle agrees with what landed."""
    import uuid

    from materializer.config import load_config
    from materializer.runtime import Runtime
    from tests.helpers import binding, delta_rs_list, write_config, write_jsonl
    from tests.test_sequence import _check_oracle

    extra: dict[str, Any] = dict(MODES[mode])
    key = extra.get("key", ["id"])[0]
    if extra.get("view") == "default":
        extra["view"] = f"default.hostile_{uuid.uuid4().hex[:8]}"
    src, table = tmp_path / "src", tmp_path / "t"
    null_epoch = extra.pop("null_epoch", False)
    for epoch in (1, 2):
        write_jsonl(src / f"{epoch}.jsonl", _hostile_docs(epoch, key))
    if null_epoch:  # an epoch where every hostile field is null: typed VOID, then the table's type
        write_jsonl(src / "3.jsonl", [{key: 3, "ts": 3, **{f: None for f in FIELDS}}])
    config = load_config(write_config(tmp_path, [binding("b", src, table, max_files=1, **extra)]))
    assert Runtime(config, spark).run().last_epoch == (3 if null_epoch else 2)

    got = spark.read.format("delta").load(str(table))
    shown = [f for f in FIELDS if f not in extra.get("except_columns", [])]
    assert set(shown) <= set(got.columns), sorted(set(shown) - set(got.columns))
    spark_rows = sorted((r.asDict(recursive=True) for r in got.collect()), key=repr)
    rs_rows = sorted(delta_rs_list(table), key=repr)
    assert [{f: r[f] for f in shown + [key]} for r in spark_rows] == [{f: r[f] for f in shown + [key]} for r in rs_rows]
    if mode != "delta_updates":
        _check_oracle(spark, config)
    live = {r[key]: r for r in spark_rows if not r.get("__deleted") and r.get("__current", True)}
    if mode == "delta_updates":
        assert len(spark_rows) == 6  # every change appended, the delete too
    else:
        assert sorted(live) == [1, 3, 4]
        first = "1-0" if mode == "sequence_ignore_nulls" else None
        assert live[1][FIELDS[0]] == first and live[1][FIELDS[3]] == "new-3"
        if null_epoch:
            assert all(live[3][f] is None for f in FIELDS)
    if "view" in extra:
        view_rows = {r[key]: r.asDict(recursive=True) for r in spark.table(extra["view"]).collect()}
        assert {k: {f: r[f] for f in shown} for k, r in view_rows.items()} == {k: {f: r[f] for f in shown} for k, r in live.items()}


@pytest.mark.spark
@pytest.mark.parametrize("names", [FIELDS, ["a`b"]], ids=["hostile", "backtick"])
def test_hostile_field_names_of_cdcv2_statements(spark: Any, tmp_path: Any, names: list[str]) -> None:
    """CDC v2 statements' field names reach the reader's column selection: each lands as data (or,
    a name Delta cannot hold, stops before commit naming it)."""
    import json

    from materializer.config import load_config
    from materializer.errors import MaterializerError
    from materializer.runtime import Runtime
    from tests.helpers import binding, delta_rs_rows, table_rows, write_config

    rows = [{"id": k, **{f: f"{k}-{i}" for i, f in enumerate(names)}} for k in (1, 2)]
    statements = [
        {"updates": [[rows[0], 0, 1], [rows[1], 0, 1]]},
        {"progress": {"lower": [0], "upper": [1], "counts": [[0, 2]]}},
        {"updates": [[rows[1], 1, -1]]},
        {"progress": {"lower": [1], "upper": [2], "counts": [[1, 1]]}},
    ]
    src = tmp_path / "src"
    src.mkdir()
    (src / "0001.json").write_text("".join(json.dumps(s) + "\n" for s in statements))
    config = load_config(write_config(tmp_path, [binding("rows", src, tmp_path / "table", format="cdcv2")]))
    if "a`b" in names:
        with pytest.raises(MaterializerError, match="a`b"):
            Runtime(config, spark).run()
        assert not (tmp_path / "table").exists()
        return
    Runtime(config, spark).run()
    assert table_rows(spark, tmp_path / "table", ["id"]) == {(1,): rows[0]}
    assert delta_rs_rows(tmp_path / "table", ["id"]) == {(1,): rows[0]}


def test_sql_text_is_quoted_by_one_pair_of_functions() -> None:
    """Identifiers and string literals reach SQL text through materializer.sqltypes only (re-exported by materializer.delta): no
    module quotes a name or a text of its own (a second copy is where an escape gets forgotten)."""
    import re

    from tests.helpers import REPO

    own_quoting = re.compile(r"""replace\(\s*["']`["']\s*,\s*["']``["']\s*\)|replace\(\s*["']'["']\s*,""")
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for folder in ("materializer", "cli")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path.relative_to(REPO).as_posix() != "materializer/sqltypes.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if own_quoting.search(line)
    ]
    assert found == [], f"quote with materializer.delta.quote / literal instead: {found}"


@pytest.mark.kafka
@pytest.mark.spark
def test_hostile_debezium_column_names_with_placeholders_and_the_lsn(spark: Any, broker: Any, tmp_path: Any) -> None:
    """Debezium's columns are named by the source database: an unavailable (TOASTed) value of a
    hostile column keeps the stored value through the MERGE's placeholder test, in lsn order."""
    import json

    from materializer.config import load_config
    from materializer.runtime import Runtime
    from tests.helpers import delta_rs_rows, table_rows, write_config
    from tests.test_kafka import kafka_binding

    placeholder = "__debezium_unavailable_value"

    def event(op: str, row: dict[str, Any], lsn: int) -> tuple[None, bytes, int]:
        body = {"before": None, "after": row, "op": op, "source": {"lsn": lsn}, "ts_ms": 0}
        return (None, json.dumps(body).encode(), 0)

    broker.create_topic("hostile-dbz", 1)
    broker.produce("hostile-dbz", [event("c", {"id": k, **{f: f"{k}-{i}" for i, f in enumerate(FIELDS)}}, 10) for k in (1, 2)])
    extra = {"sequence_by": ["_meta.source.lsn"]}
    config = load_config(write_config(tmp_path, [{**kafka_binding(broker, "d", "hostile-dbz", tmp_path / "t", payload="debezium"), **extra}]))
    Runtime(config, spark).run()
    broker.produce("hostile-dbz", [
        event("u", {"id": 1, **{f: placeholder for f in FIELDS}}, 20),  # every hostile column unavailable: all kept
        event("u", {"id": 2, FIELDS[0]: "late", **{f: None for f in FIELDS[1:]}}, 5),  # older lsn: changes nothing
    ])
    Runtime(config, spark).run()
    expected = {k: {"id": k, **{f: f"{k}-{i}" for i, f in enumerate(FIELDS)}} for k in (1, 2)}
    got = {k[0]: {c: v for c, v in r.items() if not c.startswith("__")} for k, r in table_rows(spark, tmp_path / "t", ["id"]).items()}
    assert got == expected
    assert {k: {c: v for c, v in r.items() if not c.startswith("__")} for k, r in delta_rs_rows(tmp_path / "t", ["id"]).items()} == {
        (k,): r for k, r in expected.items()
    }


@pytest.mark.kafka
@pytest.mark.spark
def test_hostile_debezium_bytes_columns_land_decoded(spark: Any, broker: Any, tmp_path: Any) -> None:
    """A Debezium bytes column (the envelope's schema types it, Bits here) is base64 text decoded
    by column: its name is the source database's, so ``a.b`` and quotes must be one column each,
    not a path into a struct (issue #66 item 2)."""
    import base64
    import json

    from materializer.config import load_config
    from materializer.runtime import Runtime
    from tests.helpers import delta_rs_rows, table_rows, write_config
    from tests.test_kafka import kafka_binding

    names = ["a.b", "x'", "p'||'q"]
    bits = {"type": "bytes", "optional": True, "name": "io.debezium.data.Bits", "version": 1, "parameters": {"length": "16"}}
    row = {"type": "struct", "optional": True, "name": "db.inv.items.Value",
           "fields": [{"type": "int32", "optional": False, "field": "id"}, *({**bits, "field": n} for n in names)]}
    schema = {"type": "struct", "name": "db.inv.items.Envelope",
              "fields": [{**row, "field": "before"}, {**row, "field": "after"}, {"type": "string", "field": "op"}]}

    def event(k: int) -> tuple[None, bytes, int]:
        after = {"id": k, **{n: base64.b64encode(bytes([k, i])).decode() for i, n in enumerate(names)}}
        payload = {"before": None, "after": after, "op": "c", "source": {"lsn": k}, "ts_ms": 0}
        return (None, json.dumps({"schema": schema, "payload": payload}).encode(), 0)

    broker.create_topic("hostile-dbz-bytes", 1)
    broker.produce("hostile-dbz-bytes", [event(1), event(2)])
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "b", "hostile-dbz-bytes", tmp_path / "t", payload="debezium")]))
    Runtime(config, spark).run()
    expected = {(k,): {"id": k, **{n: bytes([k, i]) for i, n in enumerate(names)}} for k in (1, 2)}

    def landed(rows: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
        return {k: {c: (bytes(v) if isinstance(v, (bytes, bytearray)) else v) for c, v in r.items() if not c.startswith("__")}
                for k, r in rows.items()}

    assert landed(table_rows(spark, tmp_path / "t", ["id"])) == expected
    assert landed(delta_rs_rows(tmp_path / "t", ["id"])) == expected


@pytest.mark.spark
def test_hostile_names_through_the_tables_row_checks(spark: Any, tmp_path: Any) -> None:
    """A table made beforehand with hostile column names, one NOT NULL, one under a CHECK
    constraint, one of a narrower type: an epoch that keeps them lands; an epoch with a row that
    breaks one is refused before commit naming the column (or the constraint) and the key, and
    nothing of it is committed or applied. The names reach the checks' Spark expressions, not SQL
    text of ours."""
    from materializer.config import load_config
    from materializer.errors import SourceError
    from materializer.recovery_log import RecoveryLog
    from materializer.runtime import Runtime
    from materializer.storage import open_store
    from tests.helpers import binding, delta_rs_list, write_config, write_jsonl

    required, checked, narrow = "x'", "p'||'q", "a\\b"
    src, table = tmp_path / "src", tmp_path / "t"
    spark.sql(
        f"CREATE TABLE delta.`{table}` (id BIGINT, `{required}` STRING NOT NULL, `{checked}` STRING, `{narrow}` INT) USING delta"
    ).collect()
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT `no bad` CHECK (`{checked}` <> 'bad')").collect()
    write_jsonl(src / "1.jsonl", [{"id": 1, required: "r", checked: "ok", narrow: 7}])
    config = load_config(write_config(tmp_path, [binding("b", src, table, max_files=1)]))
    assert Runtime(config, spark).run().last_epoch == 1
    assert delta_rs_list(table) == [{"id": 1, required: "r", checked: "ok", narrow: 7}]

    def last_epoch() -> int:
        return RecoveryLog(open_store(str(tmp_path / "log")), "test-pipeline").read().last_epoch

    for n, (doc, said) in enumerate([
        ({"id": 2, required: None, checked: "ok", narrow: 1}, f"NOT NULL column {required!r} would be NULL"),
        ({"id": 3, required: "r", checked: "bad", narrow: 1}, "CHECK constraint no bad"),
        ({"id": 4, required: "r", checked: "ok", narrow: 2**40}, f"field {narrow!r} (bigint) holds a value that does not fit"),
    ], 2):
        write_jsonl(src / f"{n}.jsonl", [doc])
        with pytest.raises(SourceError) as refused:
            Runtime(config, spark).run()
        assert said in str(refused.value) and f"key id={doc['id']}" in str(refused.value), str(refused.value)
        assert last_epoch() == 1, "the refused epoch was committed"
        assert [r["id"] for r in delta_rs_list(table)] == [1]
        (src / f"{n}.jsonl").unlink()
