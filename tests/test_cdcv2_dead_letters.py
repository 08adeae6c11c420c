"""``on_invalid: dead_letter`` for CDC v2 statements, from files and from a topic: a malformed
statement lands once in the dead-letter table (file and line, or topic, partition, offset,
timestamp and key), with the rule it broke, also when the apply is cut short; statements that
contradict each other still stop the run (docs: 'The cdcv2 source')."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.errors import SourceError
from materializer.runtime import Runtime
from materializer.tools import oracle
from tests.helpers import InProcessCrash, Killed, binding, delta_rs_list, kill_before_dead_letters, write_config
from tests.kafka_broker import Broker
from tests.test_kafka import kafka_binding, log_entries

A1, A2, B1, C1 = {"id": 1, "v": 1}, {"id": 1, "v": 2}, {"id": 2, "v": 1}, {"id": 3, "v": 1}


def bad(statement: Any) -> str:
    """A malformed statement, as text (the oracle reads the well-formed ones only)."""
    return json.dumps(statement)


def _line(statement: Any) -> str:
    return statement if isinstance(statement, str) else json.dumps(statement)


def _file(folder: Path, name: str, statements: list[Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f".{name}").write_text("".join(_line(s) + "\n" for s in statements))
    (folder / f".{name}").rename(folder / name)  # published whole


def _dead(table: Path, *columns: str) -> list[tuple[Any, ...]]:
    from deltalake import DeltaTable

    assert DeltaTable(str(table)).transaction_version("test-pipeline") is not None
    rows = [tuple(r[c] for c in columns) for r in delta_rs_list(table)]
    return sorted(rows, key=repr)


def _assert_table(binding_config: Any, statements: list[Any]) -> None:
    """The table, read by delta-rs, is the oracle's state of the well-formed statements alone."""
    expected = oracle.cdcv2_state(binding_config, [s for s in statements if isinstance(s, dict)])
    assert expected.verified, expected.reason
    result = oracle.compare(expected, delta_rs_list(binding_config.table), binding_config.key)
    assert result.ok, f"lost {result.lost}, duplicated {result.duplicated}, wrong {result.wrong}"


def _progress(lower: int, upper: int, counts: dict[int, int]) -> dict[str, Any]:
    return {"progress": {"lower": [lower], "upper": [upper], "counts": [[t, n] for t, n in counts.items()]}}


@pytest.mark.spark
def test_malformed_statements_of_files_land_once_with_file_line_and_rule(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, tables = tmp_path / "src", tmp_path / "tables"
    config = load_config(write_config(tmp_path, [
        binding("rows", source, tables / "rows", format="cdcv2", on_invalid="dead_letter")
    ], max_documents=100))
    good: list[Any] = []

    def publish(name: str, statements: list[Any]) -> None:
        good.extend(statements)
        _file(source, name, statements)

    publish("part-000.jsonl", [
        {"updates": [[A1, 0, 1], [B1, 0, 1]]},
        "{oops",                                                  # line 2: not JSON
        _progress(0, 2, {0: 2, 1: 2}),
        bad({"updates": [[{"v": 9}, 1, 1]]}),                     # line 4: no key field
        bad({"progress": {"lower": [2], "upper": "x"}}),          # line 5: malformed progress
        {"updates": [[A1, 1, -1], [A2, 1, 1]]},
        bad({"updates": [[C1, 2, 1], [B1, "later", 1]]}),         # line 7: update #2's time
    ])
    # Killed between the table's commit and its dead letters': the re-apply adds them once.
    runtime = Runtime(config, spark)
    kill_before_dead_letters(runtime)
    with pytest.raises(Killed):
        runtime.run()
    assert max(log_entries(config)) == 1 and not (tables / "rows_dead_letters").exists()
    Runtime(config, spark).run()
    _assert_table(config.bindings[0], good)
    dead = _dead(tables / "rows_dead_letters", "epoch", "source", "line", "reason", "document")
    assert [(e, s.rsplit("/", 1)[-1], n) for e, s, n, _r, _d in dead] == [
        (1, "part-000.jsonl", 2), (1, "part-000.jsonl", 4), (1, "part-000.jsonl", 5), (1, "part-000.jsonl", 7)
    ]
    assert "not valid JSON" in dead[0][3] and dead[0][4] == "{oops"
    assert "update #1 has data without the key field 'id'" in dead[1][3]
    assert dead[2][3].startswith("malformed progress statement") and "upper" in dead[2][3]
    assert "update #2 has a time that is not an integer" in dead[3][3]

    # A later file: time 2 completes without the set-aside statement's C1 (progress counts what
    # arrived again, corrected); the new bad line lands with epoch 2, killed inside its MERGE.
    publish("part-001.jsonl", [{"updates": [[C1, 2, 1]]}, "[1, 2]", _progress(2, 3, {2: 1})])
    crash = InProcessCrash(monkeypatch, "mid-apply:2")
    frozen = crash.run(lambda: Runtime(config, spark).run())
    try:
        crash.disarm()
        assert Runtime(config, spark).run().opened_at_epoch == 2
    finally:
        crash.thaw()
        frozen.join(timeout=120)
    _assert_table(config.bindings[0], good)

    # A file of nothing but a bad statement: an epoch of dead letters only, the frontier stays.
    publish("part-002.jsonl", ['{"updates": 7}'])
    Runtime(config, spark).run()
    Runtime(config, spark).run()  # nothing new: nothing set aside again
    dead = _dead(tables / "rows_dead_letters", "epoch", "source", "line", "reason")
    assert [(e, s.rsplit("/", 1)[-1], n) for e, s, n, _r in dead][4:] == [(2, "part-001.jsonl", 2), (3, "part-002.jsonl", 1)]
    assert len(dead) == 6 and "a statement must be a JSON object" in dead[4][3]
    assert log_entries(config)[3].runtime_checkpoint["rows"] == {
        "frontier": 3, "dead_lettered": ["part-000.jsonl", "part-001.jsonl", "part-002.jsonl"]
    }
    _assert_table(config.bindings[0], good)

    # Statements that contradict each other are not dead letters: two diffs for (C1, 3) stop the run.
    publish("part-003.jsonl", [{"updates": [[C1, 3, 1]]}, {"updates": [[C1, 3, -1]]}, _progress(3, 4, {3: 1})])
    with pytest.raises(SourceError, match="different diffs"):
        Runtime(config, spark).run()


def _record(statement: Any) -> bytes:
    return _line(statement).encode()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_malformed_records_of_the_cdcv2_payload_land_once_with_topic_partition_offset(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    broker.create_topic("cdc-dl", 2)
    tables = tmp_path / "tables"
    config = load_config(write_config(tmp_path, [
        {**kafka_binding(broker, "rows", "cdc-dl", tables / "rows", payload="cdcv2"), "on_invalid": "dead_letter"}
    ]))
    good: list[Any] = []

    def produce(records: list[tuple[bytes, Any, int]]) -> None:
        good.extend(s for _k, s, _p in records)
        broker.produce("cdc-dl", [(k, _record(s), p) for k, s, p in records])

    produce([
        (b"a", {"updates": [[A1, 0, 1]]}, 0),
        (b"w", {"updates": [[C1, 5, 1]]}, 0),            # time 5 waits: every later reading starts here
        (b"x", "nope", 0),                               # p0 offset 2
        (b"b", {"updates": [[B1, 0, 1]]}, 1),
        (b"y", bad({"updates": [[B1, -1, 1]]}), 1),          # p1 offset 1: a negative time
        (b"p", _progress(0, 1, {0: 2}), 1),
    ])
    Runtime(config, spark).run()

    # Killed between the table's commit and its dead letters': the re-apply adds them once; the
    # reading starts again at p0 offset 1 (time 5), so "nope" is read again, and not set aside again.
    produce([(b"z", bad({"updates": [[A1, 1, -1], [A2, 1, 1], "x"]}), 1), (b"a", {"updates": [[A1, 1, -1], [A2, 1, 1]]}, 0),
             (b"q", _progress(1, 2, {1: 2}), 1)])
    runtime = Runtime(config, spark)
    kill_before_dead_letters(runtime, epoch=2)  # (the Open's re-apply of epoch 1 goes through)
    with pytest.raises(Killed):
        runtime.run()
    assert max(log_entries(config)) == 2
    Runtime(config, spark).run()

    _assert_table(config.bindings[0], good)
    dead = _dead(tables / "rows_dead_letters", "epoch", "topic", "partition", "offset", "key", "reason", "value")
    assert [r[:5] for r in dead] == [(1, "cdc-dl", 0, 2, "x"), (1, "cdc-dl", 1, 1, "y"), (2, "cdc-dl", 1, 3, "z")]
    assert "not valid JSON" in dead[0][5] and "negative time" in dead[1][5] and "update #3 is not a" in dead[2][5]
    assert dead[0][6] == "nope"
    assert all(r["timestamp"] is not None and r["source"].startswith("kafka://") for r in delta_rs_list(tables / "rows_dead_letters"))
