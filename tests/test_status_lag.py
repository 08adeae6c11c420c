"""``materializer status`` shows each documents binding's lag (files, bytes, the oldest file's age)
from a listing of its folder after the last committed epoch: in process, no Spark."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from tests.helpers import binding, write_config, write_jsonl


def test_the_lag_after_a_position_is_what_the_next_plan_would_leave_unread(tmp_path: Path) -> None:
    from materializer.sources.documents.source import DocumentsSource

    folder = tmp_path / "in"
    for name, age in (("a.jsonl", 300), ("b.jsonl", 200), ("c.jsonl", 100)):
        write_jsonl(folder / name, [{"id": 1}])
        os.utime(folder / name, (time.time() - age, time.time() - age))
    (folder / "_ignored.jsonl").write_text("{}\n")  # not a document file: not lag
    config = load_config(write_config(tmp_path, [binding("orders", folder, tmp_path / "orders", key=["id"])]))
    source = DocumentsSource(config.bindings[0], None)  # type: ignore[arg-type]
    size = (folder / "a.jsonl").stat().st_size
    everything = source.lag(None)
    assert (everything["files"], everything["bytes"]) == (3, 3 * size) and 299 <= everything["seconds"] <= 310
    after_a = source.lag({"file": "a.jsonl", "before": 0, "sizes": {"a.jsonl": size}})
    assert after_a["files"] == 2 and 199 <= after_a["seconds"] <= 210
    assert source.lag({"file": "c.jsonl"}) == {"files": 0, "bytes": 0, "seconds": 0.0}


@pytest.fixture
def status_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from typer.testing import CliRunner

    from materializer_cli import status as status_module
    from materializer_cli.main import app

    def no_spark(*_args: Any) -> Any:
        raise AssertionError("status started Spark for a path table")

    monkeypatch.setattr(status_module, "_session", no_spark)
    folder = tmp_path / "in"
    write_jsonl(folder / "a.jsonl", [{"id": 1}])
    write_jsonl(folder / "b.jsonl", [{"id": 2}])
    os.utime(folder / "a.jsonl", (time.time() - 120, time.time() - 120))
    config = write_config(tmp_path, [binding("orders", folder, tmp_path / "orders", key=["id"])], pipeline_id="lagging")

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(app, ["status", "--config", str(config), *args], catch_exceptions=False)

    return invoke


def test_status_shows_each_documents_bindings_lag_as_text_and_json(status_cli: Any) -> None:
    result = status_cli("--json")
    assert result.exit_code == 0, result.output
    lag = json.loads(result.stdout)["lag"]["orders"]
    assert lag["files"] == 2 and lag["bytes"] > 0 and 119 <= lag["seconds"] <= 130
    result = status_cli()
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if "lag:" in line]
    assert "2 files" in line and "not read yet, the oldest written 1" in line  # 120-odd seconds
