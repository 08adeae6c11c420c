"""Configuration errors stop before Spark starts, naming the field and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from materializer.config import load_config, parse_config
from materializer.errors import ConfigError
from tests.helpers import REPO, run_cli

GOOD = {
    "pipeline_id": "orders-to-delta",
    "recovery_log": ".materializer/orders-to-delta/log",
    "staging": ".materializer/orders-to-delta/staging",
    "bindings": [
        {
            "name": "orders",
            "source": {"format": "documents", "path": "examples/orders"},
            "table": ".materializer/tables/orders",
            "key": ["order_id"],
            "mode": "standard",
        }
    ],
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_issue_example_config_is_valid(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.bindings[0].key == ["order_id"]
    assert config.bindings[0].needs_loads is False
    assert config.transaction.max_documents > 0


def test_shipped_default_config_is_valid() -> None:
    config = load_config(REPO / "conf" / "orders-to-delta.yaml")
    assert config.pipeline_id == "orders-to-delta"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # a key is required
        (lambda d: d["bindings"][0].update(key=[]), "bindings[0].key"),
        # modes are a closed set
        (lambda d: d["bindings"][0].update(mode="upsert"), "bindings[0].mode"),
        # unknown source formats are refused
        (lambda d: d["bindings"][0]["source"].update(format="csv"), "bindings[0].source.format"),
        # typos in keys are errors, not silently ignored
        (lambda d: d.update(pipline_id="x"), "pipline_id"),
        # pipeline ids become Delta txnAppIds and folder names
        (lambda d: d.update(pipeline_id="has space"), "pipeline_id"),
        # two bindings may not write one table
        (lambda d: d["bindings"].append(dict(d["bindings"][0], name="other")), "share the table"),
        # a key field cannot have a reduction
        (lambda d: d["bindings"][0].update(reductions={"order_id": "sum"}), "key field"),
        # unknown strategies are refused
        (lambda d: d["bindings"][0].update(reductions={"n": "avg"}), "bindings[0].reductions.n"),
        # a transaction takes at least one document
        (lambda d: d.update(transaction={"max_documents": 0}), "transaction.max_documents"),
    ],
)
def test_bad_config_names_field(tmp_path: Path, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    import copy

    data = copy.deepcopy(GOOD)
    change(data)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, data))
    assert expected in str(info.value)
    assert "p.yaml" in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline_id: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_cli_reports_config_error_without_traceback_and_before_spark(tmp_path: Path) -> None:
    data = dict(GOOD, bindings=[dict(GOOD["bindings"][0], key=[])])
    result = run_cli("run", "--config", str(write(tmp_path, data)), timeout=60, jvm=False)
    assert result.returncode == 2
    assert "bindings[0].key" in result.stderr
    assert "Traceback" not in result.stderr
    assert "SparkContext" not in result.stderr and "ivy" not in result.stderr.lower()


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # one place, spelled five ways: the second MERGE would carry the same txn id and be skipped
        ("tables/t", "./tables/t"),
        ("tables/t", "tables/t/"),
        ("tables/t", "{cwd}/tables/t"),
        ("tables/t", "tables/x/../t"),
        ("s3a://bucket/t", "s3://bucket//t/"),
        ("file:{cwd}/tables/t", "tables/t"),
        # catalog names are compared case-insensitively here, resolved at Open otherwise
        ("db.Orders", "db.orders"),
    ],
)
def test_two_spellings_of_one_table_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str) -> None:
    import os

    monkeypatch.chdir(tmp_path)
    cwd = os.getcwd()
    data = dict(GOOD, bindings=[
        dict(GOOD["bindings"][0], table=first.format(cwd=cwd)),
        dict(GOOD["bindings"][0], name="other", table=second.format(cwd=cwd)),
    ])
    with pytest.raises(ConfigError, match="share the table"):
        load_config(write(tmp_path, data))


def test_distinct_tables_with_similar_spellings_pass(tmp_path: Path) -> None:
    data = dict(GOOD, bindings=[
        dict(GOOD["bindings"][0], table="tables/t"),
        dict(GOOD["bindings"][0], name="other", table="tables/t2"),
        dict(GOOD["bindings"][0], name="third", table="s3a://bucket/t"),
    ])
    assert len(load_config(write(tmp_path, data)).bindings) == 3


def test_a_config_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(yaml.safe_dump(GOOD).encode() + "# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "not UTF-8" in str(info.value)


def test_previous_names_and_adopt_table(tmp_path: Path) -> None:
    data = dict(GOOD, bindings=[dict(GOOD["bindings"][0], name="orders_v2", previous_names=["orders"], adopt_table=True)])
    binding = load_config(write(tmp_path, data)).bindings[0]
    assert binding.previous_names == ["orders"] and binding.adopt_table
    # an old name may not be another binding's current name
    data["bindings"].append(dict(GOOD["bindings"][0], name="orders", table="tables/other"))
    with pytest.raises(ConfigError, match="share the name 'orders'"):
        load_config(write(tmp_path, data))
    data = dict(GOOD, bindings=[dict(GOOD["bindings"][0], previous_names=["has-dash"])])
    with pytest.raises(ConfigError, match="previous_names"):
        load_config(write(tmp_path, data))


def test_each_pipeline_stages_in_its_own_area(tmp_path: Path) -> None:
    one = load_config(write(tmp_path, dict(GOOD, staging="shared/")))
    other = load_config(write(tmp_path, dict(GOOD, staging="shared", pipeline_id="other")))
    assert one.staging_root == "shared/orders-to-delta" and other.staging_root == "shared/other"


def test_a_kafka_binding_has_no_path_to_check_for_its_store_scheme() -> None:
    """The store-scheme check (issue #13) looked at every binding's source.path; a kafka source has none."""
    config = parse_config(
        {
            "pipeline_id": "p", "recovery_log": "log", "staging": "staging",
            "bindings": [{"name": "orders", "table": "t", "key": ["id"],
                          "source": {"format": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "orders"}}],
        },
        "test",
    )
    assert config.bindings[0].source.path is None
