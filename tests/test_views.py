"""Live-row views (issue #26): a binding's ``view`` shows the rows a reader wants, made with the
table and replaced when the table gains a column; checked against the table read by delta-rs."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.errors import ConfigError
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from tests.helpers import binding, delta_rs_list, write_config, write_jsonl


def _view_name() -> str:
    return f"default.live_{uuid.uuid4().hex[:8]}"


def _live_by_delta_rs(table: Path, *, scd2: bool = False, internal: bool = False) -> list[dict[str, Any]]:
    """The rows the view must show, from the table as delta-rs reads it (deletion vectors applied)."""
    out = []
    for row in delta_rs_list(table):
        if row.get("__deleted") or (scd2 and not row["__current"]):
            continue
        out.append({k: v for k, v in row.items() if internal or not k.startswith("__")})
    return out


def _view_rows(spark: Any, view: str) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in spark.table(view).collect()]


def _key(row: dict[str, Any]) -> str:
    return repr(sorted(row.items(), key=lambda kv: kv[0]))


def _views(events: ListCollector) -> list[int]:
    return [s["epoch"] for s in events.named("span") if s["name"] == "view" and s["ok"]]


@pytest.mark.spark
def test_soft_deletes_and_tombstones_are_left_out_and_a_new_column_reaches_the_view(spark: Any, tmp_path: Path) -> None:
    view = _view_name()
    src, table = tmp_path / "src", tmp_path / "t"
    write_jsonl(src / "1.jsonl", [{"id": 1, "v": "a", "ts": 1}, {"id": 2, "v": "b", "ts": 1}, {"id": 3, "v": "c", "ts": 1}])
    write_jsonl(src / "2.jsonl", [{"id": 2, "ts": 2, "_meta": {"op": "d"}}, {"id": 1, "v": "A", "ts": 3}])
    extra = dict(max_files=1, sequence_by=["ts"], soft_delete=True, view=view)
    events = ListCollector()
    config = load_config(write_config(tmp_path, [binding("b", src, table, **extra)]))
    assert Runtime(config, spark, events).run().last_epoch == 2
    rows = _view_rows(spark, view)
    assert sorted(rows, key=_key) == sorted(_live_by_delta_rs(table), key=_key)
    assert {r["id"]: r["v"] for r in rows} == {1: "A", 3: "c"}
    assert all(not c.startswith("__") for c in spark.table(view).columns)
    assert _views(events) == [1], "made once, with the table; epoch 2 added no column"

    # A later epoch brings a field the table did not have: the view shows it after that apply.
    write_jsonl(src / "3.jsonl", [{"id": 3, "v": "c", "ts": 4, "colour": "red"}, {"id": 2, "v": "back", "ts": 5}])
    events = ListCollector()
    assert Runtime(config, spark, events).run().last_epoch == 3
    assert "colour" in spark.table(view).columns
    assert sorted(_view_rows(spark, view), key=_key) == sorted(_live_by_delta_rs(table), key=_key)
    assert {r["id"]: r["colour"] for r in _view_rows(spark, view)} == {1: None, 2: None, 3: "red"}
    # The run's re-apply of epoch 2 (found recorded) makes it once, the apply that added `colour` again.
    assert _views(events) == [2, 3]


@pytest.mark.slow
@pytest.mark.spark
def test_scd2_shows_the_current_versions_and_internal_columns_when_asked(spark: Any, tmp_path: Path) -> None:
    view = _view_name()
    src, table = tmp_path / "src", tmp_path / "t"
    write_jsonl(src / "1.jsonl", [{"id": 1, "v": "a", "ts": 1}, {"id": 2, "v": "x", "ts": 1}])
    write_jsonl(src / "2.jsonl", [{"id": 1, "v": "b", "ts": 3}, {"id": 2, "ts": 4, "_meta": {"op": "d"}}])
    extra = dict(max_files=1, mode="scd2", sequence_by=["ts"], view=view, view_internal_columns=True)
    config = load_config(write_config(tmp_path, [binding("b", src, table, **extra)]))
    Runtime(config, spark).run()
    rows = _view_rows(spark, view)
    assert sorted(rows, key=_key) == sorted(_live_by_delta_rs(table, scd2=True, internal=True), key=_key)
    assert [(r["id"], r["v"], r["__current"]) for r in rows] == [(1, "b", True)]  # 2's current version is its delete


@pytest.mark.slow
@pytest.mark.spark
def test_a_view_that_cannot_be_made_stops_after_the_apply_and_the_next_run_makes_it(spark: Any, tmp_path: Path) -> None:
    src, table = tmp_path / "src", tmp_path / "t"
    write_jsonl(src / "1.jsonl", [{"id": 1, "v": "a"}])
    bad = load_config(write_config(tmp_path, [binding("b", src, table, view="no_such_schema_x.live")]))
    with pytest.raises(ConfigError, match="live-row view no_such_schema_x.live .* could not be created"):
        Runtime(bad, spark).run()
    view = _view_name()
    good = load_config(write_config(tmp_path, [binding("b", src, table, view=view)]))
    summary = Runtime(good, spark).run()
    assert summary.epochs == [] and [r.status for r in summary.reapplied.results] == ["skipped"]
    assert _view_rows(spark, view) == [{"id": 1, "v": "a"}]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"view": "/tmp/live"}, "is not a catalog name"),
        ({"view": "a.b.c.d"}, "is not a catalog name"),
        ({"view_internal_columns": True}, "view_internal_columns is for a binding with a `view`"),
    ],
)
def test_a_view_that_is_no_catalog_name_is_refused(tmp_path: Path, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(tmp_path, [binding("b", tmp_path / "src", tmp_path / "t", **extra)]))
