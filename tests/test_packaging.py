"""The package as published: version, licence, typing marker, the config's JSON Schema, entry points."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

import materializer
from tests.helpers import REPO, run_cli

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_distribution_name_and_version() -> None:
    # "materializer" on the public index is another project; ours is published as delta-materializer.
    assert PROJECT["name"] == "delta-materializer" == materializer.DISTRIBUTION
    assert materializer.__version__ == PROJECT["version"]
    assert PROJECT["license"] == "Apache-2.0"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "END OF TERMS AND CONDITIONS" in (REPO / "LICENSE").read_text()


def test_py_typed_ships_with_the_package() -> None:
    assert (REPO / "materializer" / "py.typed").exists()
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["materializer"]


def test_version_flag() -> None:
    result = run_cli("--version", timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"materializer {PROJECT['version']}"


@pytest.fixture(scope="module")
def schema() -> dict:
    result = run_cli("schema", timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("path", sorted(REPO.glob("conf/*.yaml")), ids=lambda p: p.name)
def test_the_shipped_configs_validate_against_the_schema(schema: dict, path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_the_schema_refuses_what_the_loader_refuses(schema: dict) -> None:
    bad = yaml.safe_load((REPO / "conf" / "orders-to-delta.yaml").read_text())
    bad["bindings"][0]["mode"] = "upsert"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = yaml.safe_load((REPO / "conf" / "orders-to-delta.yaml").read_text())
    bad["unknown_setting"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_databricks_entry_point_help_exits_0() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from materializer.databricks import main; import sys; sys.argv=['materializer_job','--help']; main()"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: materializer_job" in result.stdout and "--config" in result.stdout
