"""Issue #18, part 4: ``on_invalid: dead_letter`` sets invalid documents aside, exactly once.

Good rows land; each invalid document lands once in the dead-letter table with its file, line,
reason and epoch, written in the epoch's apply under the same txn id, also when the apply is
cut short between the table and the dead-letter table, or after both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.config import parse_config
from materializer.errors import ConfigError, SourceError
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from tests.helpers import binding, table_rows
from tests.test_holes import Killed, config_with, last_epoch

LINES = [
    '{"id": 1, "v": "a"}',
    "not json at all",
    "",
    '{"id": 2, "v": "b"}',
    '{"v": "no key"}',
    '{"id": 4, "_op": "x"}',
    '{"id": 1, "v": "a2"}',
]


def _source(folder: Path, name: str = "a.jsonl", lines: list[str] = LINES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(lines) + "\n")


def _dead(spark: Any, table: Path) -> list[tuple[Any, ...]]:
    rows = spark.read.format("delta").load(str(table)).collect()
    return sorted((r["binding"], r["epoch"], r["source"].rsplit("/", 1)[-1], r["line"], r["reason"], r["document"]) for r in rows)


def test_dead_letters_are_for_every_file_source_and_have_a_default_table() -> None:
    base = {"pipeline_id": "p", "recovery_log": "/l", "staging": "/s"}
    b = {"name": "b", "table": "/t/orders", "key": ["id"], "on_invalid": "dead_letter"}
    config = parse_config({**base, "bindings": [{**b, "source": {"format": "documents", "path": "/x"}}]}, "f.yaml")
    assert config.bindings[0].dead_letters == "/t/orders_dead_letters"
    cdcv2 = parse_config({**base, "bindings": [{**b, "source": {"format": "cdcv2", "path": "/x"}}]}, "f.yaml")
    assert cdcv2.bindings[0].dead_letters == "/t/orders_dead_letters"
    with pytest.raises(ConfigError, match="dead_letter_table is for on_invalid"):
        parse_config({**base, "bindings": [{**b, "on_invalid": "fail", "dead_letter_table": "/d", "source": {"format": "documents", "path": "/x"}}]}, "f.yaml")


@pytest.mark.spark
def test_bad_lines_land_in_the_dead_letter_table_with_file_line_reason_and_epoch(spark: Any, tmp_path: Path) -> None:
    table, dead = tmp_path / "tables" / "items", tmp_path / "tables" / "rejects"
    _source(tmp_path / "src")
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, on_invalid="dead_letter", dead_letter_table=str(dead))])
    collector = ListCollector()
    Runtime(config, spark, collector).run()
    assert table_rows(spark, table, ["id"]) == {(1,): {"id": 1, "v": "a2"}, (2,): {"id": 2, "v": "b"}}
    found = _dead(spark, dead)
    assert [(b, e, f, line) for b, e, f, line, _r, _d in found] == [("items", 1, "a.jsonl", 2), ("items", 1, "a.jsonl", 5), ("items", 1, "a.jsonl", 6)]
    assert "not valid JSON" in found[0][4] and "key field 'id' is missing" in found[1][4] and "'_op' is reserved" in found[2][4]
    assert [d for *_x, d in found] == [LINES[1], LINES[4], LINES[5]]
    record = collector.named("progress")[-1]["record"]
    assert record.dead_letters == 3 and record.bindings[0].dead_letters == 3 and record.documents == 6
    # Same txn id and version as the table: Delta records the epoch on both.
    from deltalake import DeltaTable

    assert DeltaTable(str(dead)).transaction_version("test-pipeline") == 1

    # A second epoch's bad line: appended with its epoch, the first epoch's not again.
    _source(tmp_path / "src", "b.jsonl", ['{"id": 3, "v": "c"}', "{broken"])
    Runtime(config, spark).run()
    assert [(e, f, line) for _b, e, f, line, _r, _d in _dead(spark, dead)] == [(1, "a.jsonl", 2), (1, "a.jsonl", 5), (1, "a.jsonl", 6), (2, "b.jsonl", 2)]
    assert sorted(table_rows(spark, table, ["id"])) == [(1,), (2,), (3,)]


@pytest.mark.slow
@pytest.mark.spark
def test_a_value_that_does_not_fit_the_declared_schema_is_dead_lettered_and_fail_still_stops(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "tables" / "items"
    _source(tmp_path / "src", lines=['{"id": 1, "n": 5}', '{"id": 2, "n": "five"}', '{"id": 3, "n": 7}'])
    failing = config_with(tmp_path / "f", [binding("items", tmp_path / "src", tmp_path / "f" / "t", schema="id BIGINT, n INT")])
    with pytest.raises(SourceError, match="a.jsonl:2"):
        Runtime(failing, spark).run()
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, n INT", on_invalid="dead_letter")])
    Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == {(1,): {"id": 1, "n": 5}, (3,): {"id": 3, "n": 7}}
    dead = _dead(spark, Path(str(table) + "_dead_letters"))
    assert [(f, line) for _b, _e, f, line, _r, _d in dead] == [("a.jsonl", 2)] and "field 'n'" in dead[0][4]


# What a document shows alone, against "id BIGINT, v STRING, n INT, s STRUCT<a: INT>, ts TIMESTAMP":
# (template, a word of its reason). Each is a dead letter, found by a rule of its own or only by
# the document's shape (undeclared names, kinds the declared type cannot take, at any depth).
BAD_ALONE = [
    ("not json", "not valid JSON"),
    ('{"id": %d, "v": "x"} trailing', "text after"),
    ('{"id": %d, "v": "x", "v": "y"}', "an object holds one key twice"),  # Spark's parser refuses two equal keys
    ('{"v": "no key"}', "key field 'id' is missing"),
    ('{"id": %d, "zz": 1}', "field 'zz' is not in"),
    ('{"id": %d, "s": {"a": 1, "deep": 2}}', "field 's.deep' is not in"),
    ('{"id": %d, "n": "12"}', "field 'n' is a string"),
    ('{"id": %d, "s": 5}', "field 's' is a number"),
    ('{"id": %d, "n": 99999999999}', "not a valid INT"),
    ('{"id": %d, "ts": "2020-13-45T00:00:00"}', "not a valid TIMESTAMP"),
    ('{"id": %d, "_op": "x"}', "'_op' is reserved"),
]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("validator", ["variant", "arrow"])
def test_bad_documents_anywhere_in_split_files_are_dead_letters_with_their_lines(
    spark: Any, tmp_path: Path, validator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad documents of every kind a document shows alone, at random lines of files that Spark
    splits into pieces: each is a dead letter named by its file and line, the good ones land (Spark
    and delta-rs read the same table). Before, a document with an undeclared field or a kind its
    declared type cannot take stopped the epoch with a declared schema and dead letters on: only
    the epoch's merged shape showed it. By either route: the arrow validator's sets the documents
    it does not find fast aside in the spool for the checks and the dead letters (numbered by
    counting every split of the epoch again), and the spool is empty after."""
    import json
    import random

    from materializer.sources.documents.route import VALIDATOR_CONF
    from tests.helpers import delta_rs_rows, record_set_asides

    asides = record_set_asides(monkeypatch)
    rng = random.Random(20261128)
    expected: dict[int, dict[str, Any]] = {}
    bad: list[tuple[str, int, str]] = []
    sizes = (30, 900, 25)
    # Each kind once at a random line of a random file, and more of them at random.
    placed = {}
    for kind in BAD_ALONE:
        f = rng.randrange(len(sizes))
        placed[(f, rng.randrange(1, sizes[f] + 1))] = kind
    for f, count in enumerate(sizes):
        lines = []
        for number in range(1, count + 1):
            if (f, number) in placed or rng.random() < 0.02:
                template, word = placed.get((f, number)) or rng.choice(BAD_ALONE)
                lines.append(template % rng.randrange(400) if "%d" in template else template)
                bad.append((f"part-{f}.jsonl", number, word))
            else:
                doc = {"id": rng.randrange(400), "v": "p" * rng.randrange(40), "n": rng.randrange(1000), "s": {"a": number}, "ts": "2021-01-02T03:04:05Z"}
                expected[doc["id"]] = {k: v for k, v in doc.items() if k != "ts"}
                lines.append(json.dumps(doc))
        _source(tmp_path / "src", f"part-{f}.jsonl", lines)
    table = tmp_path / "tables" / "items"
    schema = "id BIGINT, v STRING, n INT, s STRUCT<a: INT>, ts TIMESTAMP"
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema=schema, on_invalid="dead_letter", max_files=3)])
    spark.conf.set("spark.sql.files.maxPartitionBytes", "16000")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    spark.conf.set(VALIDATOR_CONF, validator)  # (these small files would take the VARIANT route)
    try:
        assert spark.read.text(str(tmp_path / "src" / "part-1.jsonl")).rdd.getNumPartitions() >= 4  # split
        Runtime(config, spark).run()
    finally:
        for conf in ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes", VALIDATOR_CONF):
            spark.conf.unset(conf)
    assert asides == ([True] if validator == "arrow" else [])  # one epoch, with documents set aside
    assert [p for p in Path(config.staging).rglob("*") if p.is_file() and "spool" in p.parts] == []
    dead = _dead(spark, Path(str(table) + "_dead_letters"))
    assert [(f, line) for _b, _e, f, line, _r, _d in dead] == [(f, n) for f, n, _w in bad]
    for (_b, _e, f, line, reason, _d), (_f, _n, word) in zip(dead, bad):
        assert word in reason, (f, line, reason)
    landed = {key: {k: v for k, v in row.items() if k != "ts"} for key, row in delta_rs_rows(table, ["id"]).items()}
    assert landed == {(k,): v for k, v in expected.items()}
    assert {key: {k: v for k, v in row.items() if k != "ts"} for key, row in table_rows(spark, table, ["id"]).items()} == landed


@pytest.mark.slow
@pytest.mark.spark
def test_documents_that_only_together_make_no_table_stop_the_run_beside_dead_letters(spark: Any, tmp_path: Path) -> None:
    """Without a schema a field of two kinds is the epoch's problem, not a document's: the run
    stops naming the line where the second kind appears, also when a dead letter sits before it
    (before, the search for that line met the dead letter's missing shape and failed with a TypeError)."""
    _source(tmp_path / "src", lines=['{"id": 1, "v": "a"}', "not json", '{"id": 2, "v": 5}'])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", tmp_path / "t", on_invalid="dead_letter")])
    with pytest.raises(SourceError, match=r"a\.jsonl:3: field 'v' is a number here but a string"):
        Runtime(config, spark).run()
    assert last_epoch(config) == 0  # nothing committed


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize(
    "cut",
    [
        "before-dead-letters",  # crash here leaves the table applied, its dead letters not
        "after-both",  # crash here leaves both applied and the staged files in place
    ],
)
def test_dead_letters_land_exactly_once_when_the_apply_is_cut_short(spark: Any, tmp_path: Path, cut: str) -> None:
    table = tmp_path / "tables" / "items"
    _source(tmp_path / "src")
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, on_invalid="dead_letter")])
    runtime = Runtime(config, spark)
    if cut == "before-dead-letters":
        def stop(*_args: Any) -> Any:
            raise Killed("killed between the table's commit and the dead-letter table's")

        runtime.driver.writer.append_dead_letters = stop  # type: ignore[method-assign]
    else:
        acknowledge = runtime.driver.acknowledge

        def stop(message: Any) -> Any:
            acknowledge(message)
            raise Killed("killed after the apply, before the run went on")

        runtime.driver.acknowledge = stop  # type: ignore[method-assign]
    with pytest.raises(Killed):
        runtime.run()
    assert last_epoch(config) == 1
    Runtime(config, spark).run()
    dead = _dead(spark, Path(str(table) + "_dead_letters"))
    assert [(e, line) for _b, e, _f, line, _r, _d in dead] == [(1, 2), (1, 5), (1, 6)]
    assert sorted(table_rows(spark, table, ["id"])) == [(1,), (2,)]
    assert not [f for f in (tmp_path / "staging").rglob("*.parquet")]  # applied, then cleaned up


@pytest.mark.crash
def test_a_run_sigkilled_between_the_table_and_its_dead_letters_lands_each_once(spark: Any, tmp_path: Path) -> None:
    from tests.helpers import run_cli, write_config

    table = tmp_path / "tables" / "items"
    _source(tmp_path / "src")
    config = write_config(tmp_path, [binding("items", tmp_path / "src", table, on_invalid="dead_letter")])
    killed = run_cli("run", "--config", str(config), env={"MATERIALIZER_CRASH_AT": "after-apply:1"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert sorted(table_rows(spark, table, ["id"])) == [(1,), (2,)]
    assert not Path(str(table) + "_dead_letters").exists()  # killed before the dead-letter commit
    Runtime(parse_config_file(config), spark).run()
    dead = _dead(spark, Path(str(table) + "_dead_letters"))
    assert [(e, line) for _b, e, _f, line, _r, _d in dead] == [(1, 2), (1, 5), (1, 6)]
    assert sorted(table_rows(spark, table, ["id"])) == [(1,), (2,)]


def parse_config_file(path: Path) -> Any:
    from materializer.config import load_config

    return load_config(path)


@pytest.mark.spark
def test_bindings_sharing_one_dead_letter_table_each_land_their_rejects_once(spark: Any, tmp_path: Path) -> None:
    """One dead-letter table for several bindings (its ``binding`` column tells them apart): the
    epoch's rejects of all of them land, each once, in one commit under the epoch's txn id, also
    when the run is cut short between the tables and the dead letters. (Before, each binding
    appended under the same txn id and version, and Delta skipped the second: its rejects were lost.)"""
    from deltalake import DeltaTable

    from tests.helpers import Killed as KilledThread, delta_rs_list, kill_before_dead_letters

    dead = tmp_path / "tables" / "rejects"
    _source(tmp_path / "a", lines=['{"id": 1}', "broken a"])
    _source(tmp_path / "b", lines=["broken b", '{"id": 2}'])
    bindings = [
        binding(name, tmp_path / name, tmp_path / "tables" / name, on_invalid="dead_letter", dead_letter_table=str(dead))
        for name in ("a", "b")
    ]
    config = config_with(tmp_path, bindings, transaction={"max_documents": 1000, "parallel_bindings": 2})
    runtime = Runtime(config, spark)
    kill_before_dead_letters(runtime, epoch=1)
    with pytest.raises(KilledThread):
        runtime.run()
    assert last_epoch(config) == 1 and not dead.exists()
    Runtime(config, spark).run()
    _source(tmp_path / "a", "a2.jsonl", ["broken a2"])
    _source(tmp_path / "b", "b2.jsonl", ["broken b2"])
    Runtime(config, spark).run()
    expected = [("a", 1, 2, "broken a"), ("a", 2, 1, "broken a2"), ("b", 1, 1, "broken b"), ("b", 2, 1, "broken b2")]
    assert [(b, e, line, d) for b, e, _f, line, _r, d in _dead(spark, dead)] == expected
    assert sorted((r["binding"], r["epoch"], r["line"], r["document"]) for r in delta_rs_list(dead)) == expected
    assert DeltaTable(str(dead)).transaction_version("test-pipeline") == 2
    assert table_rows(spark, tmp_path / "tables" / "a", ["id"]) == {(1,): {"id": 1}}

    # A dead-letter table that is another binding's table is refused before anything is read.
    clash = [bindings[0], {**bindings[1], "dead_letter_table": str(tmp_path / "tables" / "a")}]
    with pytest.raises(ConfigError, match="dead_letter_table .* is the table of binding 'a'"):
        Runtime(config_with(tmp_path / "clash", clash), spark).run()


@pytest.mark.spark
def test_an_epoch_whose_every_document_is_a_dead_letter_commits_its_position_and_writes_no_row(spark: Any, tmp_path: Path) -> None:
    """Nothing valid to stage (no type for the key either): the table is not written (not made,
    on a first epoch), the dead letters land, and the next file goes on from there. Before, the
    staging failed on a key column that the empty epoch's rows did not have."""
    table = tmp_path / "tables" / "items"
    _source(tmp_path / "src", "a.jsonl", ["broken", '{"v": "no key"}'])
    _source(tmp_path / "src", "b.jsonl", ["", "  "])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, on_invalid="dead_letter")])
    Runtime(config, spark).run()
    assert last_epoch(config) == 2 and not table.exists()
    _source(tmp_path / "src", "c.jsonl", ['{"id": 1, "v": "a"}', "broken c"])
    Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == {(1,): {"id": 1, "v": "a"}}
    dead = _dead(spark, Path(str(table) + "_dead_letters"))
    assert [(e, f, line) for _b, e, f, line, _r, _d in dead] == [(1, "a.jsonl", 1), (1, "a.jsonl", 2), (3, "c.jsonl", 2)]


@pytest.mark.spark
def test_dead_letters_committed_before_on_invalid_was_changed_still_land_once(spark: Any, tmp_path: Path) -> None:
    """Epoch 1 is committed with dead letters, the run dies before they are appended, and the
    user then sets on_invalid back to fail: the committed epoch's dead letters still land, in the
    table its log entry names, once; the next epochs follow the new option."""
    from tests.helpers import Killed as KilledThread, kill_before_dead_letters

    table, dead = tmp_path / "tables" / "items", tmp_path / "tables" / "rejects"
    _source(tmp_path / "src", lines=['{"id": 1}', "broken"])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, on_invalid="dead_letter", dead_letter_table=str(dead))])
    runtime = Runtime(config, spark)
    kill_before_dead_letters(runtime, epoch=1)
    with pytest.raises(KilledThread):
        runtime.run()
    assert last_epoch(config) == 1 and not dead.exists()
    failing = config_with(tmp_path, [binding("items", tmp_path / "src", table)])
    Runtime(failing, spark).run()
    assert [(b, e, line) for b, e, _f, line, _r, _d in _dead(spark, dead)] == [("items", 1, 2)]
    _source(tmp_path / "src", "b.jsonl", ["broken again"])
    with pytest.raises(SourceError, match="b.jsonl:1"):
        Runtime(failing, spark).run()


@pytest.mark.spark
def test_an_epoch_the_validator_finds_all_fast_is_staged_in_one_job_and_the_others_keep_their_dead_letters(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a declared schema and the arrow validator, a dead-letter binding's epoch whose every
    document the validator finds fast (none can be a dead letter) is checked by its staging job,
    as ``fail``'s epochs are, instead of a check job of its own first; an epoch with a bad
    document, or a valid one the validator leaves to the VARIANT route, keeps the dead letters'
    path. The tables and dead letters are the same (read by Spark and delta-rs)."""
    from materializer.sources.documents.route import VALIDATOR_CONF
    from tests.helpers import delta_rs_rows, record_document_paths

    paths = record_document_paths(monkeypatch)
    table = tmp_path / "tables" / "items"
    _source(tmp_path / "src", "a.jsonl", ['{"id": 1, "v": "a"}', '{"id": 2, "v": "b", "n": 7}'])
    _source(tmp_path / "src", "b.jsonl", ['{"id": 3, "v": "c"}', '{"id": 4, "n": "seven"}', '{"id": 2, "_meta": {"op": "d"}}'])
    # Valid, but an escaped ':' keeps a document from being fast (the validator counts colons).
    _source(tmp_path / "src", "c.jsonl", ['{"id": 5, "v": "x\\u003ay"}'])
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, v STRING, n INT", on_invalid="dead_letter")])
    spark.conf.set(VALIDATOR_CONF, "arrow")  # (these small files would take the VARIANT route)
    try:
        Runtime(config, spark).run()
    finally:
        spark.conf.unset(VALIDATOR_CONF)
    assert paths == ["staging job", "check job", "check job"]
    expected = {(1,): {"id": 1, "v": "a"}, (3,): {"id": 3, "v": "c"}, (5,): {"id": 5, "v": "x:y"}}
    assert table_rows(spark, table, ["id"]) == expected == delta_rs_rows(table, ["id"])
    dead = _dead(spark, Path(str(table) + "_dead_letters"))
    assert [(e, f, line) for _b, e, f, line, _r, _d in dead] == [(2, "b.jsonl", 2)]
    assert "field 'n' holds \"seven\", which is not a valid INT" in dead[0][4]


@pytest.mark.spark
@pytest.mark.parametrize("on_invalid", ["dead_letter", "fail"])
def test_an_epoch_of_more_shapes_than_the_driver_collects_still_refuses_its_documents_one_by_one(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_invalid: str
) -> None:
    """A held-out run: 12,000 good documents of as many shapes (a STRING field holding objects of
    their own keys) and one with an undeclared field stopped the whole run in dead-letter mode,
    because the shapes the driver collects to judge are capped. Past the cap each document's shape
    is judged on the executors: the bad one is a dead letter at its line (``fail`` names it), the
    good ones land. The cap is lowered here so the epoch needs only a few dozen lines."""
    from materializer.sources.documents import refusals as document_refusals

    monkeypatch.setattr(document_refusals, "MAX_REFUSED_SHAPES", 5)
    lines = ['{"id": %d, "v": {"f%d": 1}}' % (i, i) for i in range(1, 31)]
    lines.insert(12, '{"id": 99, "zz": 1}')  # line 13
    lines.insert(20, '{"id": 98, "v": "x", "s": 1}')  # line 21
    _source(tmp_path / "src", lines=lines)
    table = tmp_path / "tables" / "items"
    config = config_with(tmp_path, [binding("items", tmp_path / "src", table, schema="id BIGINT, v STRING", on_invalid=on_invalid)])
    if on_invalid == "fail":
        with pytest.raises(SourceError, match=r"a.jsonl:13: field 'zz' is not in the binding's source.schema") as refused:
            Runtime(config, spark).run()
        assert "a.jsonl:21" in str(refused.value)
        return
    Runtime(config, spark).run()
    rows = table_rows(spark, table, ["id"])
    assert sorted(rows) == [(i,) for i in range(1, 31)] and rows[(7,)] == {"id": 7, "v": '{"f7":1}'}
    dead = _dead(spark, Path(str(table) + "_dead_letters"))
    assert [(f, line) for _b, _e, f, line, _r, _d in dead] == [("a.jsonl", 13), ("a.jsonl", 21)]
    assert "field 'zz' is not in" in dead[0][4] and "field 's' is not in" in dead[1][4]
