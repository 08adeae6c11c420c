"""``materializer validate``: a config checked as a run checks it, with no JVM and no store opened (CI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHOP = """\
pipeline_id: shop-to-delta
recovery_log: s3a://nowhere/log
staging: s3a://nowhere/staging
bindings:
  - {name: orders, source: {format: documents, path: landing/orders}, table: t/orders, key: [id], mode: scd2}
templates:
  - name: "{schema}_{table}"
    source: {format: kafka, bootstrap_servers: "localhost:1", topic_pattern: 'shop\\.(?P<schema>\\w+)\\.(?P<table>\\w+)', payload: debezium}
    table: "t/{schema}/{table}"
    key: [id]
"""


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from materializer_cli.main import app

    return CliRunner().invoke(app, ["validate", *args])


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "conf").glob("*.yaml")))
def test_the_shipped_examples_are_valid(example: str) -> None:
    result = _invoke("--config", str(REPO / "conf" / example), "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["valid"] and found["bindings"] and all(b["table"] and b["key"] for b in found["bindings"])


def test_bindings_and_templates_are_listed_and_no_store_is_opened(tmp_path: Path) -> None:
    """The recovery log and staging on an S3 that does not exist, a broker nobody listens on:
    validate opens neither, so it answers at once."""
    config = tmp_path / "shop.yaml"
    config.write_text(SHOP)
    result = _invoke("--config", str(config))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"{config}: valid: pipeline shop-to-delta, 1 binding(s), 1 template(s)",
        "  orders: documents landing/orders -> t/orders (key id; scd2)",
        r"  template: kafka shop\.(?P<schema>\w+)\.(?P<table>\w+) -> t/{schema}/{table} (its bindings are made when a run lists the source)",
    ]


def test_an_invalid_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(SHOP.replace("mode: scd2", "mode: scd3"))
    result = _invoke("--config", str(config))
    assert result.exit_code == 2
    assert "bindings[0].mode" in result.output and "scd2" in result.output
